//! Descriptors and mappings the shim must leave to the program: under a tight RLIMIT_NOFILE the
//! engine does not start (the program gets every descriptor it gets natively), elsewhere it
//! holds one descriptor (its userfaultfd) and no other, and makes no open in the program's
//! table (`close(0); open()` gets 0); a program that closes it loses nothing; at
//! `vm.max_map_count` the engine's own metadata takes no more mappings than a few, and nothing the engine allocates there aborts
//! the program. The program is fds.c of crates/zerofault-preload/tests/c; every run has a time
//! limit (a hang fails the test) and a memory cap.

mod common;

use common::{cc, measured, stderr, stdout, temp_dir, zerofault, Running};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// The time limit of one run: each ends in a second or two natively.
const LIMIT: Duration = Duration::from_secs(60);

/// The memory cap of one run (the map-count run maps its regions without touching most).
const RSS_CAP: u64 = 2 << 30;

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

/// `zerofault run [--stats] -- prog args`.
fn shimmed(prog: &Path, stats: bool, args: &[&str]) -> Command {
    let mut c = zerofault();
    c.arg("run");
    if stats {
        c.arg("--stats");
    }
    c.arg("--").arg(prog).args(args);
    c
}

/// "opened N descriptors" of `fds nofile`.
fn opened(o: &Output) -> u32 {
    let out = stdout(o);
    out.strip_prefix("opened ")
        .and_then(|s| s.strip_suffix(" descriptors\n"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{}: {out}{}", o.status, stderr(o)))
}

/// Catches the engine taking a descriptor from a program under a tight RLIMIT_NOFILE (set
/// before the engine starts): under 64 it must not start, so the program gets as many
/// descriptors as natively (13 under 16, 1 under 4, not 12 and 0); at 100 the engine runs and
/// holds one (exactly one fewer: the engine started).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_tight_descriptor_limit_keeps_every_descriptor_for_the_program() {
    let dir = temp_dir("r3-nofile");
    let prog = cc("fds", &dir, false);
    let mut failures = vec![];
    for (limit, may_take) in [("4", 0), ("16", 0), ("63", 0), ("100", 1)] {
        let native = go(&mut plain(&prog, &["nofile", limit]));
        assert!(native.status.success(), "natively: {}", stderr(&native));
        let n = opened(&native);
        // Without --stats: the program closes every descriptor above 2, the report's too.
        let shim = go(&mut shimmed(&prog, false, &["nofile", limit]));
        let s = opened(&shim);
        if !shim.status.success() || s + may_take != n {
            failures.push(format!(
                "RLIMIT_NOFILE {limit}: {s} descriptors under the shim, {n} natively ({may_take} fewer \
                 expected), {}",
                shim.status
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches the engine's descriptor counting against a `RLIMIT_NOFILE` the program lowers after
/// the engine started: the descriptor sits above the new limit (`open` only gives numbers
/// below it), so the program gets as many descriptors as natively, 13 under 16 and 1 under 4.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_descriptor_limit_lowered_after_the_start_keeps_every_descriptor_for_the_program() {
    let dir = temp_dir("r3-nofile-late");
    let prog = cc("fds", &dir, false);
    for limit in ["4", "16", "100"] {
        let native = go(&mut plain(&prog, &["nofile-late", limit]));
        assert!(native.status.success(), "natively: {}", stderr(&native));
        let shim = go(&mut shimmed(&prog, false, &["nofile-late", limit]));
        assert!(shim.status.success(), "{}", stderr(&shim));
        assert_eq!(
            opened(&shim),
            opened(&native),
            "RLIMIT_NOFILE {limit} set after the start"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches a descriptor of the engine's beyond its one userfaultfd (without `--stats`, whose
/// output descriptor is the stats knob's own).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_engine_holds_one_descriptor() {
    let dir = temp_dir("r3-fdlist");
    let prog = cc("fds", &dir, false);
    let native = go(&mut plain(&prog, &["list"]));
    assert_eq!(stdout(&native), "new descriptors: 0\n", "natively: {}", stderr(&native));
    assert_eq!(measured(&native, "uffd_fds"), 0);
    let shim = go(&mut shimmed(&prog, false, &["list"]));
    assert!(shim.status.success(), "{}", stderr(&shim));
    assert_eq!(
        (stdout(&shim).as_str(), measured(&shim, "uffd_fds")),
        ("new descriptors: 1\n", 1),
        "one descriptor, the userfaultfd: {}",
        stderr(&shim)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches a short-lived open of an engine thread in the program's descriptor table: a daemon's
/// `close(0); open("/dev/null")` must get 0, the lowest free number, while the engine works
/// beside it (an open of /proc by the scrub or a handler took 0 for a moment: 17-29 of
/// 1.5 million opens got 4). Engine threads keep their files in tables of their own.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn close_then_open_gets_the_lowest_number_while_the_engine_works() {
    let dir = temp_dir("r3-lowfd");
    let prog = cc("fds", &dir, false);
    let native = go(&mut plain(&prog, &["lowfd", "2"]));
    assert!(
        stdout(&native).starts_with("wrong descriptor 0 of "),
        "natively: {}",
        stdout(&native)
    );
    let shim = go(&mut shimmed(&prog, false, &["lowfd", "6"]));
    assert!(shim.status.success(), "{}", stderr(&shim));
    assert_eq!(measured(&shim, "uffd_fds"), 1, "the engine ran: {}", stderr(&shim));
    assert!(
        stdout(&shim).starts_with("wrong descriptor 0 of "),
        "an engine thread held the lowest free number: {}",
        stdout(&shim)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches a hang or lost data when the program closes every descriptor it does not know
/// (`close_range(3, ~0)`, as daemons do), the engine's userfaultfd among them: its engine
/// threads hold copies of their own, so the engine must notice and hand every range back
/// (then leave: one thread, as natively), while the program's writes, reads and
/// `MADV_DONTNEED`s go on.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_program_closing_the_engines_descriptor_loses_nothing() {
    let dir = temp_dir("r3-closeall");
    let prog = cc("fds", &dir, false);
    let native = go(&mut plain(&prog, &["closeall"]));
    assert_eq!(
        stdout(&native),
        "after closing: bad 0\n",
        "natively: {}",
        stderr(&native)
    );
    assert_eq!(measured(&native, "threads"), 1);
    for _ in 0..3 {
        let shim = go(&mut shimmed(&prog, false, &["closeall"]));
        assert!(shim.status.success(), "{}", stderr(&shim));
        assert_eq!(stdout(&shim), "after closing: bad 0\n", "{}", stderr(&shim));
        assert_eq!(
            measured(&shim, "threads"),
            1,
            "the engine's threads left: {}",
            stderr(&shim)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `vm.max_map_count`, set for a test and put back when it ends, even by a panic. One test at
/// a time holds it: two overlapping would each read the other's value as the one to put back,
/// and the machine kept 20,000.
struct MapCount(String, #[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl MapCount {
    const PATH: &'static str = "/proc/sys/vm/max_map_count";

    /// Panics where the limit cannot be set (the test needs root).
    fn set(n: u32) -> MapCount {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let set =
            std::fs::read_to_string(Self::PATH).and_then(|old| std::fs::write(Self::PATH, n.to_string()).map(|()| old));
        match set {
            Ok(old) => MapCount(old, one),
            Err(e) => panic!("vm.max_map_count cannot be set (the test needs root): {e}"),
        }
    }
}

impl Drop for MapCount {
    fn drop(&mut self) {
        std::fs::write(Self::PATH, self.0.trim()).expect("vm.max_map_count restored");
    }
}

/// Mappings that stay the shim's at the limit, once the engine gave back its own (pool rings,
/// doorbells, thread stacks: `Engine::give_back`): the shim's two libraries with their data (8), the front's
/// private heap (2), the engine allocator's reservation (2), the arena holding the program's
/// 64 MiB block (2), and a few pages of metadata (at this limit, 20,000).
/// The program may make this many fewer before the limit, no more: 19-20 here, 28 when the
/// engine kept its mappings.
const ENGINE_MAPS: i64 = 24;

/// Catches an engine that keeps its own mappings when the program's call is refused at the
/// limit, the engine's metadata taking a mapping per allocator chunk (hundreds at tens of
/// thousands of regions, so that the program made that many fewer) and its allocator failing
/// at the limit, which with `--stats` aborted the process ("memory allocation of 416 bytes
/// failed"), and the C library's heap, first made at the limit under the shim (its first
/// large request never reached the C library, whose first call sets its heap up), so that
/// malloc(1000) and fopen failed there. The limit is lowered to 20000 for the test (restored
/// after).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn at_the_map_count_limit_the_program_keeps_its_mappings() {
    let dir = temp_dir("r3-maps");
    let prog = cc("fds", &dir, false);
    let _limit = MapCount::set(20000);
    let native = go(&mut plain(&prog, &["maps"]));
    assert_eq!(
        stdout(&native),
        "at the limit: malloc ok, fopen ok\n",
        "natively: {}",
        stderr(&native)
    );
    let n = measured(&native, "maps");
    let mut failures = vec![];
    for stats in [false, true] {
        let shim = go(&mut shimmed(&prog, stats, &["maps"]));
        let ok = shim.status.success() && stdout(&shim) == "at the limit: malloc ok, fopen ok\n";
        let s = if ok { measured(&shim, "maps") } else { 0 };
        if !ok || s + ENGINE_MAPS < n {
            failures.push(format!(
                "stats {stats}: {}, {s} mappings under the shim, {n} natively (at most {ENGINE_MAPS} \
                 fewer): {}{}",
                shim.status,
                stdout(&shim),
                stderr(&shim)
                    .lines()
                    .filter(|l| !l.starts_with("zerofault: "))
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches the front repeating a call that returned NULL without failing: the mappings made
/// by raw system calls up to the limit leave ENOMEM in errno, and glibc's realloc(p, 0) frees p,
/// returns NULL and leaves errno alone, so a front that took the NULL for a refusal gave the
/// engine's mappings back and freed p a second time (glibc: "double free detected", SIGABRT).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_stale_enomem_at_the_map_count_limit_repeats_no_call() {
    let dir = temp_dir("r3-maps-raw");
    let prog = cc("fds", &dir, false);
    let _limit = MapCount::set(20000);
    let expected = "at the limit: realloc(p, 0) NULL, malloc ok, fopen ok\n";
    let native = go(&mut plain(&prog, &["maps-raw"]));
    assert_eq!(stdout(&native), expected, "natively: {}", stderr(&native));
    let shim = go(&mut shimmed(&prog, false, &["maps-raw"]));
    assert!(
        shim.status.success() && stdout(&shim) == expected,
        "under the shim: {}, {}{}",
        shim.status,
        stdout(&shim),
        stderr(&shim)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches an engine that no longer sees a tracer once the program lost /proc (chroot into an
/// empty directory; /proc unmounted in a mount namespace of its own): it never stepped aside,
/// and the debugger's read of a word the program never touched failed with EIO for good
/// instead of reading 0. The engine must step aside once it cannot look.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_tracer_reads_memory_after_the_program_lost_proc() {
    let dir = temp_dir("r3-chroot");
    let prog = cc("fds", &dir, false);
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let empty = empty.to_str().unwrap();
    let mut failures = vec![];
    for args in [&["chroot", empty][..], &["umount"]] {
        let native = go(&mut plain(&prog, args));
        assert_eq!(
            (native.status.code(), stdout(&native).as_str()),
            (Some(0), "tracer read: 0 errno 0\n"),
            "natively {args:?}: {}",
            stderr(&native)
        );
        let shim = go(&mut shimmed(&prog, true, args));
        let steps_aside = common::counter(&shim, "steps_aside");
        if !shim.status.success() || stdout(&shim) != stdout(&native) || steps_aside != 1 {
            failures.push(format!(
                "{args:?}: {}, {}steps_aside {steps_aside}",
                shim.status,
                stdout(&shim)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}
