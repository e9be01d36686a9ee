//! Programs the shim must not break: the ways it was seen to fail real programs, each made a C
//! program of crates/zerofault-preload/tests/c that checks its own memory. Each test runs the
//! program without the shim, checks that it behaves there as the test says, then runs it under
//! the shim and states what must be the same. Every run has a time limit, so that a hang fails
//! the test (the program is killed and its output shown), and a memory cap, so that a program
//! that goes wrong cannot take the machine's memory.

mod common;

use common::{
    assert_same, cc, counter, measured, pages_served, program_stderr, served, shim, stderr, stdout, temp_dir,
    zerofault, Running,
};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The time limit of one run: every program here ends in seconds natively.
const LIMIT: Duration = Duration::from_secs(60);

/// The memory cap of one run: far above what any of these programs needs (about 1.3 GiB at
/// most, under the shim), far below the machine's.
const RSS_CAP: u64 = 4 << 30;

/// 1 MiB in kB, the unit of /proc/self/status and of the programs' measurements.
const MIB_KB: i64 = 1 << 10;

/// Runs `cmd` within [`LIMIT`] and [`RSS_CAP`]; panics with its output if it overruns either.
fn go(cmd: &mut Command) -> Output {
    Running::start(cmd, LIMIT)
        .rss_cap(RSS_CAP)
        .finish()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn plain(prog: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(prog);
    c.args(args);
    c
}

/// `zerofault run --stats [KNOBS] -- prog args`.
fn shimmed(prog: &Path, knobs: &[&str], args: &[&str]) -> Command {
    let mut c = zerofault();
    c.args(["run", "--stats"]).args(knobs).arg("--").arg(prog).args(args);
    c
}

/// Asserts that a native run exited 0 and printed `expected`.
fn assert_native(o: &Output, expected: &str) {
    assert_eq!(
        (o.status.code(), stdout(o).as_str()),
        (Some(0), expected),
        "natively: {}",
        stderr(o)
    );
}

/// The same exit status and stdout (stderr holds measurements that differ from run to run).
fn assert_same_stdout(native: &Output, shim: &Output) {
    assert_eq!(
        (native.status, stdout(native)),
        (shim.status, stdout(shim)),
        "natively (left) and under the shim (right); the program's stderr under the shim:\n{}",
        program_stderr(shim)
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Other allocators

/// How long allocs.c runs; it prints the same lines however much it did.
const ALLOCS_SECS: &str = "20";

fn system_lib(name: &str) -> PathBuf {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ]
    .iter()
    .map(|d| Path::new(d).join(name))
    .find(|p| p.is_file())
    .unwrap_or_else(|| {
        panic!(
            "{name} is not installed: these tests need the Debian packages libjemalloc2, \
                 libtcmalloc-minimal4 and libmimalloc2.0"
        )
    })
}

/// allocs.c with `lib` as its malloc: natively, then under the shim in each order of
/// LD_PRELOAD. Catches the shim deadlocking inside the program's allocator (its mmap hook
/// calling back into a malloc that holds its own lock: killed at the limit), wrong contents,
/// and an engine that serves nothing (pages_served 0). All three orders run and are reported
/// together.
fn allocator_in_every_order(lib: &str) {
    let alloc = system_lib(lib);
    let dir = temp_dir(&format!("allocs-{lib}"));
    let prog = cc("allocs", &dir, false);
    let expected = "thread 0: ok\nthread 1: ok\nthread 2: ok\nthread 3: ok\nerrors: 0\n";
    let native = go(plain(&prog, &[ALLOCS_SECS]).env("LD_PRELOAD", &alloc));
    assert_native(&native, expected);

    let (shim, alloc) = (shim().display().to_string(), alloc.display().to_string());
    let mut by_run = zerofault();
    by_run
        .args(["run", "--stats", "--"])
        .arg(&prog)
        .arg(ALLOCS_SECS)
        .env("LD_PRELOAD", &alloc);
    let mut shim_first = plain(&prog, &[ALLOCS_SECS]);
    shim_first
        .env("LD_PRELOAD", format!("{shim}:{alloc}"))
        .env("ZEROFAULT_STATS", "1");
    let mut alloc_first = plain(&prog, &[ALLOCS_SECS]);
    alloc_first
        .env("LD_PRELOAD", format!("{alloc}:{shim}"))
        .env("ZEROFAULT_STATS", "1");
    let mut failures = vec![];
    for (order, mut cmd) in [
        (format!("LD_PRELOAD={lib} zerofault run --stats"), by_run),
        (format!("LD_PRELOAD=libzerofault.so:{lib}"), shim_first),
        (format!("LD_PRELOAD={lib}:libzerofault.so"), alloc_first),
    ] {
        let o = match Running::start(&mut cmd, LIMIT).rss_cap(RSS_CAP).finish() {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{order}: {e}"));
                continue;
            }
        };
        let pages = served(&o);
        if o.status.code() != Some(0) || stdout(&o) != expected || pages.unwrap_or(0) == 0 {
            failures.push(format!(
                "{order}: {}, pages_served {pages:?}\n--- stdout:\n{}--- stderr:\n{}",
                o.status,
                stdout(&o),
                stderr(&o)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{lib}: {} of 3 orders failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn jemalloc_in_every_preload_order() {
    allocator_in_every_order("libjemalloc.so.2");
}

/// tcmalloc defines mmap, mmap64, munmap, mremap and sbrk itself (as raw system calls, for its
/// MallocHook): put before the shim, it shadows every hook the shim has. The shim then learns
/// of tcmalloc's memory through the MallocHook API, and must still serve it.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn tcmalloc_in_every_preload_order() {
    allocator_in_every_order("libtcmalloc_minimal.so.4");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn mimalloc_in_every_preload_order() {
    allocator_in_every_order("libmimalloc.so.2");
}

// ---------------------------------------------------------------------------------------------
// 2, 3. Signals

/// Catches a process-directed signal delivered to an engine thread whose handler then faults on
/// memory only that thread could serve: the process hangs (killed at the limit).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn sigprof_at_1_khz_with_a_handler_writing_fresh_memory() {
    let dir = temp_dir("sigprof");
    let prog = cc("sigprof", &dir, false);
    let native = go(&mut plain(&prog, &["4"]));
    assert_native(&native, "done: bad=0, samples taken: yes\n");
    let shim = go(&mut shimmed(&prog, &[], &["4"]));
    assert_same_stdout(&native, &shim);
    assert!(pages_served(&shim) > 0, "{}", stderr(&shim));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// signalfd.c waiting for 20 SIGTERMs sent by this test (kill(pid)), one after each "waiting"
/// line: its output.
fn sigterm_from_outside(cmd: &mut Command) -> Output {
    let mut r = Running::start(cmd, LIMIT).rss_cap(RSS_CAP);
    for k in 1..=20 {
        r.wait_for_stdout(&format!("waiting for SIGTERM {k}\n"))
            .unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: kill(2) of our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(r.pid(), libc::SIGTERM) }, 0);
    }
    r.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// Catches threads of the shim that do not block SIGTERM: they take the signal the program
/// blocked in its own threads to read it from a signalfd, and the process dies of it (143).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn sigterm_blocked_and_read_from_a_signalfd() {
    let dir = temp_dir("signalfd");
    let prog = cc("signalfd", &dir, false);
    let waits: String = (1..=20).map(|k| format!("waiting for SIGTERM {k}\n")).collect();
    let done = "got 20 SIGTERMs through the signalfd, bad=0\n";
    let native = sigterm_from_outside(&mut plain(&prog, &[]));
    assert_native(&native, &format!("{waits}{done}"));
    let shim = sigterm_from_outside(&mut shimmed(&prog, &[], &[]));
    assert_same_stdout(&native, &shim);
    assert!(pages_served(&shim) > 0, "{}", stderr(&shim));

    let native = go(&mut plain(&prog, &["self"]));
    assert_native(&native, done);
    let shim = go(&mut shimmed(&prog, &[], &["self"]));
    assert_same_stdout(&native, &shim);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 4. seccomp

/// Catches an engine that does not fail open when a seccomp filter makes its ioctls fail with
/// EPERM (its faulting threads wait forever: killed at the limit), and one that does not run
/// the program normally when it cannot start at all.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_seccomp_filter_refusing_ioctl_and_userfaultfd() {
    let dir = temp_dir("seccomp");
    let prog = cc("seccomp", &dir, false);
    let native = go(&mut plain(&prog, &["after", "256"]));
    assert_native(
        &native,
        "filter installed on every thread\n\
         wrote 256 MiB mapped before the filter and 256 MiB malloc'ed after it: bad=0\n",
    );
    let shim = go(&mut shimmed(&prog, &[], &["after", "256"]));
    assert_same_stdout(&native, &shim);
    assert!(pages_served(&shim) > 0, "{}", stderr(&shim));

    let eat = cc("eatmem", &dir, false);
    let args = ["exec", eat.to_str().unwrap(), "200"];
    let native = go(&mut plain(&prog, &args));
    assert_native(&native, "malloc(200 MiB): ok\nwrote 200 MiB: bad=0\n");
    let shim = go(&mut shimmed(&prog, &[], &args));
    assert_same(&native, &shim);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 5, 6. mlock

/// Catches calloc skipping its memset on a reused block that still holds the old contents
/// (the shim drops freed pages with MADV_DONTNEED, which fails on locked memory).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn calloc_after_free_of_an_mlocked_block_reads_zero() {
    let dir = temp_dir("mlock-calloc");
    let prog = cc("mlock_calloc", &dir, false);
    let native = go(&mut plain(&prog, &[]));
    let lines: String = [8, 16, 32]
        .iter()
        .enumerate()
        .map(|(i, m)| format!("round {i}: calloc({m} MiB) after free of a locked block: 0 bytes not zero\n"))
        .collect();
    assert_native(&native, &lines);
    let shim = go(&mut shimmed(&prog, &[], &[]));
    assert_same_stdout(&native, &shim);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What mlockall.c may lock and hold beyond the native run: the stacks of the shim's own
/// threads (locked whole by MCL_CURRENT) and its bookkeeping. Never a pool or a reservation:
/// under MCL_FUTURE every new mapping is populated when it is made, so the engine has nothing
/// to serve, and pages populated ahead would be locked memory the program never asked for.
const MLOCK_SLACK_KB: i64 = 16 * MIB_KB;

/// The memory cap of mlockall.c: a correct run holds ~130 MiB. A shim whose 64 GiB reservation
/// is locked would populate all of it (and the machine's memory with it) without this cap.
const MLOCK_RSS_CAP: u64 = 1 << 30;

fn mlockall_as_natively(mode: &str, expected: &str) {
    let dir = temp_dir(&format!("mlockall-{mode}"));
    let prog = cc("mlockall", &dir, false);
    let capped = |cmd: &mut Command| {
        Running::start(cmd, LIMIT)
            .rss_cap(MLOCK_RSS_CAP)
            .finish()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let native = capped(&mut plain(&prog, &[mode]));
    assert_native(&native, expected);
    let shim = capped(&mut shimmed(&prog, &[], &[mode]));
    assert_same_stdout(&native, &shim);
    for key in ["vmlck_kb", "vmrss_kb"] {
        let (n, s) = (measured(&native, key), measured(&shim, key));
        assert!(
            s <= n + MLOCK_SLACK_KB,
            "{key}: {s} kB under the shim, {n} kB natively: nothing unused may be locked or populated"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches mlockall(MCL_CURRENT) locking (and so populating) the shim's reservations and pool.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn mlockall_at_start_locks_no_more_than_natively() {
    mlockall_as_natively("first", "mlockall: ok\nwrote 64 MiB: bad=0\n");
}

/// The same with a large block in use (the engine running) before mlockall.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn mlockall_after_a_large_block_locks_no_more_than_natively() {
    mlockall_as_natively("later", "wrote 64 MiB: bad=0\nmlockall: ok\nwrote 64 MiB: bad=0\n");
}

// ---------------------------------------------------------------------------------------------
// 7. Resource limits

/// Catches the shim's reservations counting against RLIMIT_AS: malloc(200 MiB) returns NULL
/// under a 400 MiB limit that the program fits in natively.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn malloc_under_rlimit_as_of_400_mib() {
    let dir = temp_dir("rlimit-as");
    let eat = cc("eatmem", &dir, false);
    let script = format!("ulimit -v 409600; exec {} 200", eat.display());
    let native = go(Command::new("sh").args(["-c", &script]));
    assert_native(&native, "malloc(200 MiB): ok\nwrote 200 MiB: bad=0\n");
    let shim = go(zerofault().args(["run", "--stats", "--", "sh", "-c", &script]));
    assert_same(&native, &shim);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// "opened N descriptors before EMFILE" of nofile.c, and its userfaultfd count.
fn descriptors(o: &Output) -> (u32, i64) {
    let out = stdout(o);
    let n = out
        .strip_prefix("opened ")
        .and_then(|s| s.strip_suffix(" descriptors before EMFILE\n"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{}: {out}{}", o.status, stderr(o)));
    (n, measured(o, "uffd_fds"))
}

/// Catches descriptors the shim takes from the program under a small RLIMIT_NOFILE: none
/// without a large allocation, at most one (the userfaultfd) with one.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn descriptors_under_rlimit_nofile_of_32() {
    let dir = temp_dir("rlimit-nofile");
    let prog = cc("nofile", &dir, false);
    let mut failures = vec![];
    for (mode, may_take) in [("small", 0), ("large", 1)] {
        let native = go(&mut plain(&prog, &[mode]));
        assert!(native.status.success(), "{}", stderr(&native));
        let (n, uffd) = descriptors(&native);
        assert!(
            n > 4 && uffd == 0,
            "natively {mode}: {n} descriptors, {uffd} userfaultfd"
        );
        let shim = go(&mut shimmed(&prog, &[], &[mode]));
        let (s, uffd) = descriptors(&shim);
        if !shim.status.success() || s + may_take < n || uffd > 1 {
            failures.push(format!(
                "{mode}: {s} descriptors under the shim ({n} natively, at most {may_take} fewer \
                 allowed), {uffd} userfaultfd descriptors (at most 1), {}",
                shim.status
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 8. mremap

/// Catches mremap failing with EFAULT on a mapping the program made in pieces (under the shim
/// the registered and unregistered pieces stay separate VMAs, which mremap cannot move as one),
/// and data not where mremap put it.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn mremap_moves_a_mapping_made_in_pieces() {
    let dir = temp_dir("mremap");
    let prog = cc("mremap", &dir, false);
    let mut failures = vec![];
    for args in [&["fixed"][..], &["dontunmap"], &["dontunmap", "2", "1"]] {
        let native = go(&mut plain(&prog, args));
        assert!(native.status.success(), "{args:?} natively: {}", stderr(&native));
        assert!(stdout(&native).contains(") -> ok\n"), "{}", stdout(&native));
        let shim = go(&mut shimmed(&prog, &[], args));
        if (shim.status, stdout(&shim)) != (native.status, stdout(&native)) {
            failures.push(format!(
                "{args:?}: {} under the shim, printing\n{}natively:\n{}",
                shim.status,
                stdout(&shim),
                stdout(&native)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches the part of a mapping grown with mremap being served one page per fault, as
/// faults outside every region the engine knows (today: 114,688 of them, every page).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn memory_grown_with_mremap_is_served_in_windows() {
    let dir = temp_dir("mremap-grow");
    let prog = cc("mremap", &dir, false);
    let native = go(&mut plain(&prog, &["grow"]));
    assert_native(&native, "grew 64 MiB to 512 MiB and wrote the new part: bad=0\n");
    let shim = go(&mut shimmed(&prog, &[], &["grow"]));
    assert_same_stdout(&native, &shim);
    let unknown = counter(&shim, "unknown_faults");
    assert!(unknown < 1_000, "unknown_faults {unknown}:\n{}", stderr(&shim));
    // At most the grown part's first PMD was filled in the mremap (whole PMDs are the
    // windows'), and it read zero first (bad=0).
    let filled = counter(&shim, "grow_pages");
    assert!(filled <= 512, "{}", stderr(&shim));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches a mapping grown with mremap in 64 KiB steps taking a fault round trip per step, or
/// left to the kernel's faults: each step's new part must be filled in the mremap that made
/// it, with next to no fault, read zero before the program writes it, and the data stay.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn mremap_growth_in_64_kib_steps_fills_each_new_part_in_the_call() {
    let dir = temp_dir("mremap-steps");
    let prog = cc("mremap", &dir, false);
    let native = go(&mut plain(&prog, &["steps"]));
    assert_native(&native, "grew 32 MiB to 256 MiB in 3584 steps of 64 KiB: bad=0\n");
    let shim = go(&mut shimmed(&prog, &[], &["steps"]));
    assert_same_stdout(&native, &shim);
    let (fills, faults) = (counter(&shim, "grow_fills"), counter(&shim, "fault_events"));
    assert!(
        fills >= 3500 && faults < 100,
        "grow_fills {fills}, fault_events {faults}:\n{}",
        stderr(&shim)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 9. A huge reservation

/// The pool the shim may keep in bigmap.c's runs: small, so that the RSS bounds below measure
/// the engine's own memory rather than pre-zeroed pages (64 MiB by default).
const BIGMAP_POOL: [&str; 3] = ["--pool_max=8M", "--scrub_start=4M", "--scrub_stop=8M"];
const BIGMAP_POOL_KB: i64 = 8 * MIB_KB;

/// Catches per-page bookkeeping of a 16 TiB NORESERVE mapping that takes hundreds of MiB of
/// resident memory and keeps it after munmap (today: +523 MiB, 520 MiB left after munmap).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_16_tib_noreserve_mapping_costs_what_it_costs_natively() {
    let dir = temp_dir("bigmap");
    let prog = cc("bigmap", &dir, false);
    let native = go(&mut plain(&prog, &[]));
    assert_native(
        &native,
        "16 TiB MAP_NORESERVE: wrote 256 MiB in order and one byte per GiB, bad=0, unmapped\n",
    );
    let shim = go(&mut shimmed(&prog, &BIGMAP_POOL, &[]));
    assert_same_stdout(&native, &shim);
    let growth = |o: &Output| measured(o, "rss_after_kb") - measured(o, "rss_before_kb");
    let (n, s) = (growth(&native), growth(&shim));
    assert!(
        s <= n + 16 * MIB_KB,
        "RSS grew {s} kB under the shim, {n} kB natively (at most 16 MiB more allowed)"
    );
    let left = measured(&shim, "rss_unmapped_kb") - measured(&shim, "rss_before_kb");
    assert!(
        left <= BIGMAP_POOL_KB + 4 * MIB_KB,
        "after munmap RSS is {left} kB above where it started (at most the pool + 4 MiB)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 10. Bad frees

/// badfree.c: natively glibc kills it inside free; under the shim it must die of SIGABRT after
/// one line on stderr naming free and the pointer. Catches a bad free silently accepted (which
/// lets two later mallocs share a block).
fn bad_free_aborts(mode: &str) {
    let dir = temp_dir(&format!("badfree-{mode}"));
    let prog = cc("badfree", &dir, false);
    let native = go(&mut plain(&prog, &[mode]));
    assert!(
        matches!(native.status.signal(), Some(libc::SIGABRT | libc::SIGSEGV)),
        "natively glibc kills it: {}\n{}{}",
        native.status,
        stdout(&native),
        stderr(&native)
    );
    let shim = go(zerofault().args(["run", "--"]).arg(&prog).arg(mode));
    let out = stdout(&shim);
    let ptr = out
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("freeing "))
        .unwrap_or_else(|| panic!("{out}"));
    let err = stderr(&shim);
    assert_eq!(
        (shim.status.signal(), out.contains("returned")),
        (Some(libc::SIGABRT), false),
        "under the shim: {}\n{out}{err}",
        shim.status
    );
    assert!(
        err.lines().count() == 1 && err.contains("free") && err.contains(ptr),
        "one line naming free and {ptr}:\n{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_double_free_of_a_large_block_aborts() {
    bad_free_aborts("double");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn freeing_a_pointer_inside_a_large_block_aborts() {
    bad_free_aborts("inner");
}

// ---------------------------------------------------------------------------------------------
// 11. No engine where none is used

/// Catches an engine started eagerly: threads and a userfaultfd in every program the shim is
/// loaded in (and a stats report from one that never used it).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_program_without_large_blocks_gets_no_engine() {
    let dir = temp_dir("small");
    let prog = cc("small", &dir, false);
    let native = go(&mut plain(&prog, &[]));
    assert_native(&native, "threads: 1\nuserfaultfd: no\n");
    let shim = go(zerofault().args(["run", "--"]).arg(&prog));
    assert_same(&native, &shim);
    // Without a knob set, the front alone is loaded: the shim proper waits for a large request.
    let loaded = |cmd: &mut Command| {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ZEROFAULT_") {
                cmd.env_remove(k);
            }
        }
        stdout(&go(cmd.arg("loaded")))
    };
    let not_loaded = "threads: 1\nuserfaultfd: no\nshim proper: not loaded\n";
    assert_eq!(loaded(&mut plain(&prog, &[])), not_loaded);
    assert_eq!(loaded(zerofault().args(["run", "--"]).arg(&prog)), not_loaded);
    assert_eq!(
        loaded(
            plain(&prog, &[])
                .env("LD_PRELOAD", common::shim())
                .env("ZEROFAULT_REQUIRE_UFFD", "1")
        ),
        not_loaded,
        "ZEROFAULT_REQUIRE_UFFD is the test suite's, not a knob: it loads nothing"
    );
    let shim = go(&mut shimmed(&prog, &[], &[]));
    assert_same_stdout(&native, &shim);
    assert!(
        shim.stderr.is_empty(),
        "ZEROFAULT_STATS=1 and nothing served: nothing printed, but:\n{}",
        stderr(&shim)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The front loads the shim proper on the first large request (or at start, when the
/// process's malloc or mmap is another's: loading from inside that allocator's mmap would have
/// the loader allocate through it under its own lock), and the engine then serves the program
/// as usual. Catches an engine that never starts without a knob set, a shim loaded up front, a
/// deadlock inside jemalloc, tcmalloc or mimalloc (killed at the limit), wrong bytes, and any
/// program thread on which glibc allocated the shim's thread-local storage (with the program's
/// malloc, from inside a hook). No knob is set in any run.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_shim_is_loaded_on_the_first_large_request() {
    let dir = temp_dir("lazy");
    let prog = cc("lazy", &dir, false);
    let quiet = |mut c: Command| {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ZEROFAULT_") {
                c.env_remove(k);
            }
        }
        c
    };
    let after = |loaded: &str, engine: &str| {
        format!("after: shim {loaded}, engine {engine}, shim TLS on 0 of 5 program threads, bad bytes 0\n")
    };
    let native = go(&mut quiet(plain(&prog, &[])));
    assert_native(
        &native,
        &format!("before: shim not loaded\n{}", after("not loaded", "not running")),
    );
    let lazily = format!("before: shim not loaded\n{}", after("loaded", "running"));
    let at_start = format!("before: shim loaded\n{}", after("loaded", "running"));
    let front = shim().display().to_string();
    let mut by_run = quiet(zerofault());
    by_run.args(["run", "--"]).arg(&prog);
    let mut runs = vec![("zerofault run".to_string(), by_run, lazily.clone())];
    for lib in ["libjemalloc.so.2", "libtcmalloc_minimal.so.4", "libmimalloc.so.2"] {
        let alloc = system_lib(lib).display().to_string();
        let mut first = quiet(plain(&prog, &[]));
        first.env("LD_PRELOAD", format!("{front}:{alloc}"));
        runs.push((format!("LD_PRELOAD=libzerofault.so:{lib}"), first, lazily.clone()));
        let mut second = quiet(plain(&prog, &[]));
        second.env("LD_PRELOAD", format!("{alloc}:{front}"));
        runs.push((format!("LD_PRELOAD={lib}:libzerofault.so"), second, at_start.clone()));
    }
    let mut failures = vec![];
    for (what, mut cmd, expected) in runs {
        match Running::start(&mut cmd, LIMIT).rss_cap(RSS_CAP).finish() {
            Ok(o) if o.status.code() == Some(0) && stdout(&o) == expected => {}
            Ok(o) => failures.push(format!(
                "{what}: {}, expected:\n{expected}--- stdout:\n{}--- stderr:\n{}",
                o.status,
                stdout(&o),
                stderr(&o)
            )),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 12. Knobs

/// Catches a knob value the shim takes in silently, or that kills the program (an overflow
/// of the arena's size panics in the constructor, SIGABRT): each must be one line on stderr
/// naming the variable, and the program runs with its own output and status, through
/// `zerofault run` and with the shim loaded by hand.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn odd_knob_values_are_one_line_each() {
    let dir = temp_dir("knobs");
    let eat = cc("eatmem", &dir, false);
    let native = go(&mut plain(&eat, &["64"]));
    assert_native(&native, "malloc(64 MiB): ok\nwrote 64 MiB: bad=0\n");
    let mut failures = vec![];
    for (var, value) in [
        ("ZEROFAULT_PRELOAD_ARENA", "18446744073709551615"),
        ("ZEROFAULT_POOL_MAX", "99999999999999999999G"),
        ("ZEROFAULT_POOL_MAX", " 64M"),
    ] {
        let mut by_run = zerofault();
        by_run.args(["run", "--"]).arg(&eat).arg("64");
        let mut by_hand = plain(&eat, &["64"]);
        by_hand.env("LD_PRELOAD", shim());
        for (how, mut cmd) in [("zerofault run", by_run), ("LD_PRELOAD", by_hand)] {
            let o = go(cmd.env(var, value));
            let err = stderr(&o);
            if (o.status, stdout(&o)) != (native.status, stdout(&native))
                || err.lines().count() != 1
                || !err.contains(var)
            {
                failures.push(format!(
                    "{var}={value:?} through {how}: {}\n--- stdout:\n{}--- stderr:\n{err}",
                    o.status,
                    stdout(&o)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 13. Transparent huge pages

/// The pool's default cap (`ZEROFAULT_POOL_MAX`): what the shim may hold beyond native.
const POOL_MAX_KB: i64 = 256 * MIB_KB;

/// Catches a region the program marked MADV_HUGEPAGE being served with 4 KiB pages (today:
/// no huge pages at all), and the memory that costs.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn madv_hugepage_memory_gets_huge_pages_under_the_shim() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    assert!(
        thp.contains("[always]") || thp.contains("[madvise]"),
        "transparent huge pages are off here ({:?}): this test compares huge pages with and \
         without the shim and cannot run; set /sys/kernel/mm/transparent_hugepage/enabled to \
         madvise",
        thp.trim()
    );
    let dir = temp_dir("thp");
    let prog = cc("thp", &dir, false);
    let native = go(&mut plain(&prog, &[]));
    assert_native(&native, "wrote 1 GiB with MADV_HUGEPAGE: bad=0\n");
    let huge = measured(&native, "anon_huge_kb");
    assert!(
        huge >= 512 * MIB_KB,
        "natively only {huge} kB of the 1 GiB are huge pages: memory too fragmented for this \
         test to tell anything"
    );
    let shim = go(&mut shimmed(&prog, &[], &[]));
    assert_same_stdout(&native, &shim);
    let s = measured(&shim, "anon_huge_kb");
    assert!(
        s * 10 >= huge * 9,
        "AnonHugePages {s} kB under the shim, {huge} kB natively (at least 90% wanted)"
    );
    let (n, s) = (measured(&native, "rss_kb"), measured(&shim, "rss_kb"));
    assert!(
        s <= n + POOL_MAX_KB,
        "VmRSS {s} kB under the shim, {n} kB natively (at most the pool's 256 MiB more)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 14. realloc

/// A block grown in 64 KiB steps (realloc from nothing, or from a malloc'd or calloc'd 4 MiB
/// block) has each new part filled inside the realloc that made it (`Engine::fill_grown`):
/// the program's writes there fault no more, where they cost a round trip per step (5,800
/// faults, 5x native). Same output as natively; a realloc that copies at every step
/// (quadratic: over 300 s) is killed at the time limit.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn realloc_growth_in_64_kib_steps_fills_each_new_part_in_the_call() {
    let dir = temp_dir("regrow");
    let prog = cc("regrow", &dir, false);
    for first in ["realloc", "malloc", "calloc"] {
        let native = go(&mut plain(&prog, &[first]));
        assert!(native.status.success(), "{first}: {}", stderr(&native));
        let steps = if first == "realloc" { 4096 } else { 4032 };
        assert!(
            stdout(&native).starts_with(&format!("grew to 268435456 bytes in {steps} reallocs: checksum "))
                && stdout(&native).ends_with(", errors 0\n"),
            "{first}: {}",
            stdout(&native)
        );
        let shim = go(&mut shimmed(&prog, &[], &[first]));
        assert_same(&native, &shim);
        assert!(program_stderr(&shim).is_empty(), "{first}: {}", program_stderr(&shim));
        let (fills, faults) = (counter(&shim, "grow_fills"), counter(&shim, "fault_events"));
        assert!(
            fills >= 4000 && faults < 100,
            "{first}: grow_fills {fills}, fault_events {faults}:\n{}",
            stderr(&shim)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The runner itself

/// The time limit and the memory cap that every test above relies on: a hang and a memory hog
/// are failures, with what the program printed, and what they started dies with them.
#[test]
fn the_runner_kills_a_hang_and_a_memory_hog() {
    let e = Running::start(
        Command::new("sh").args(["-c", "echo started; sleep 30 & sleep 30"]),
        Duration::from_secs(1),
    )
    .finish()
    .unwrap_err();
    assert!(e.contains("still running after 1s") && e.contains("started"), "{e}");
    let e = Running::start(
        Command::new("python3").args(["-c", "b = bytearray(300 << 20); import time; time.sleep(30)"]),
        Duration::from_secs(20),
    )
    .rss_cap(100 << 20)
    .finish()
    .unwrap_err();
    assert!(e.contains("above the test's cap of 100 MiB"), "{e}");
    // A program that leaves a child behind holding its output still ends when it does.
    let o = Running::start(
        Command::new("sh").args(["-c", "sleep 30 & echo done"]),
        Duration::from_secs(10),
    )
    .finish()
    .unwrap();
    assert_eq!((o.status.code(), stdout(&o).as_str()), (Some(0), "done\n"));
}
