//! What a program does to its own process must come out as natively under the shim: dropping
//! root, `NO_NEW_PRIVS`, user namespaces, a seccomp filter (after the engine started, and before
//! its first large request), a userfaultfd of its own, futex operations on fresh memory, advice
//! on a block it frees, a core dump and a debugger (shared/repro/round2, found at 3ea8211).
//! crates/zerofault-preload/tests/c/rights.c does each and prints what it saw; each test runs it
//! natively, checks what it printed there, and wants the same under `zerofault run`, with the
//! engine having served (or, where it must step aside, having stepped aside).

mod common;

use common::{both, cc, counter, program_stderr, run, stderr, stdout, temp_dir, zerofault};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

fn rights(dir: &Path) -> PathBuf {
    cc("rights", dir, false)
}

/// Runs `rights MODE` natively and under the shim; asserts the native output is `expected` and
/// the shim's the same; returns the shim's run.
fn same(mode: &str, expected: &str) -> Output {
    let dir = temp_dir(&format!("rights-{mode}"));
    let prog = rights(&dir);
    let (plain, shim) = both(prog.to_str().unwrap(), &[mode], &dir);
    assert_eq!(
        (plain.status.code(), stdout(&plain).as_str()),
        (Some(0), expected),
        "natively: {}",
        stderr(&plain)
    );
    assert_eq!(
        (shim.status.code(), stdout(&shim)),
        (Some(0), stdout(&plain)),
        "under the shim; its stderr:\n{}",
        stderr(&shim)
    );
    std::fs::remove_dir_all(&dir).unwrap();
    shim
}

/// The engine served the block written before the call, and its threads (a handler and a
/// scrub at least) were back after it, with the caller's new state (rights.c checked every
/// thread's), the engine still active.
fn served_before_and_after(shim: &Output) {
    assert!(
        counter(shim, "fault_events") > 0,
        "the engine served nothing: {}",
        stderr(shim)
    );
    assert!(
        engine_threads(shim) >= 2,
        "the engine's threads were not back after the call:\n{}",
        stderr(shim)
    );
    assert_eq!(counter(shim, "steps_aside"), 0, "{}", stderr(shim));
}

/// The threads besides its own that rights.c counted after the call.
fn engine_threads(o: &Output) -> u32 {
    program_stderr(o)
        .lines()
        .find_map(|l| l.strip_prefix("engine threads ")?.parse().ok())
        .unwrap_or_else(|| panic!("no 'engine threads' line:\n{}", stderr(o)))
}

#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn dropping_root_drops_it_on_the_engine_threads_too() {
    let shim = same(
        "setuid",
        "setgroups 0 setgid 0 setuid 0\nevery thread: uid 65534 1, no capability 1\nfresh memory ok\n",
    );
    served_before_and_after(&shim);
}

/// glibc's setuid signals every other thread and waits for each; it installs that signal's
/// handler at the program's first pthread_create, only while it still counts one thread. The
/// engine, started before that, said otherwise: the setuid killed the program (signal 33).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn setuid_beside_a_thread_made_after_the_engine_started() {
    let shim = same("setuid-thread", "setuid 20 times beside a second thread, 0 failed\n");
    assert!(
        counter(&shim, "fault_events") > 0,
        "the engine served nothing: {}",
        stderr(&shim)
    );
}

/// A thread discarding served memory while main calls setuid: the discard waits for the
/// engine, glibc's setuid for the thread. With the engine stopped around the call (the first
/// version of this) both waited for ever.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn setuid_beside_a_thread_waiting_for_the_engine() {
    let shim = same("setuid-busy", "setuid 20 times beside a discarding thread, 0 failed\n");
    assert!(
        counter(&shim, "fault_events") > 0,
        "the engine served nothing: {}",
        stderr(&shim)
    );
}

/// Each change of rights stops and restarts the engine's threads; a program that changes them
/// all the time gets the kernel instead, after 64.
#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn a_program_switching_its_rights_all_the_time_gets_the_kernel() {
    let shim = same("switcher", "switched 100 times, 0 failed\nfresh memory ok\n");
    assert_eq!(counter(&shim, "steps_aside"), 1, "{}", stderr(&shim));
    assert_eq!(engine_threads(&shim), 0, "{}", stderr(&shim));
}

#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn dropping_root_with_raw_system_calls_through_syscall() {
    let shim = same(
        "raw-setuid",
        "raw setgroups 0 setresgid 0 setresuid 0\nevery thread: uid 65534 1\nfresh memory ok\n",
    );
    served_before_and_after(&shim);
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn no_new_privs_reaches_the_engine_threads() {
    let shim = same("nnp", "prctl 0\nevery thread no_new_privs 1\nfresh memory ok\n");
    served_before_and_after(&shim);
}

#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn unshare_of_a_user_namespace_after_the_engine_started() {
    let shim = same("userns", "unshare(CLONE_NEWUSER) 0 \nfresh memory ok\n");
    served_before_and_after(&shim);
}

#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn setns_into_a_user_namespace_after_the_engine_started() {
    let shim = same("setns", "setns(user) 0 \nfresh memory ok\n");
    served_before_and_after(&shim);
}

/// A filter installed after the engine started: every thread left in the process is confined
/// (the engine's are gone: it stepped aside for good), and the kernel serves what follows.
fn confined(mode: &str) {
    let shim = same(
        mode,
        "confine 0\nevery thread: seccomp filter 1, no_new_privs 1\nfresh memory ok\n",
    );
    assert_eq!(counter(&shim, "steps_aside"), 1, "{}", stderr(&shim));
    assert!(
        counter(&shim, "fault_events") > 0,
        "the engine served nothing: {}",
        stderr(&shim)
    );
    assert_eq!(engine_threads(&shim), 0, "{}", stderr(&shim));
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_seccomp_filter_after_the_engine_started_confines_every_thread() {
    confined("seccomp");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_seccomp_filter_through_syscall_confines_every_thread() {
    confined("seccomp-syscall");
}

/// An allowlist (no openat, no userfaultfd, no clone) installed before the first large request:
/// the shim proper is never loaded, and the program runs as natively, under `zerofault run`
/// (which loads the shim at start) and under a bare LD_PRELOAD (which would load it then).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_sandbox_made_before_the_first_large_request_stays_native() {
    let shim = same("sandbox", "allowlist 0\nsum 196608\n");
    assert_eq!(common::served(&shim).unwrap_or(0), 0, "{}", stderr(&shim));
    let dir = temp_dir("rights-sandbox-preload");
    let prog = rights(&dir);
    let o = run(
        Command::new(&prog).arg("sandbox").env("LD_PRELOAD", common::shim()),
        Duration::from_secs(60),
    );
    assert_eq!(
        (o.status.code(), stdout(&o).as_str()),
        (Some(0), "allowlist 0\nsum 196608\n"),
        "{}",
        stderr(&o)
    );
    let v = run(
        zerofault().args(["run", "--verbose", "--"]).arg(&prog).arg("sandbox"),
        Duration::from_secs(60),
    );
    assert!(
        stderr(&v).contains("the program installs a seccomp filter"),
        "--verbose says why: {}",
        stderr(&v)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_programs_own_userfaultfd_on_a_mapping() {
    same("own-mmap", "registered; pages 16384, wrong 0\n");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_programs_own_userfaultfd_registered_through_syscall() {
    same("own-syscall", "registered; pages 16384, wrong 0\n");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_programs_own_userfaultfd_on_a_malloc_block() {
    same("own-malloc", "registered; pages 16384, wrong 0\n");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_programs_own_write_protect_userfaultfd() {
    same("own-wp", "api 0 register 0 writeprotect 0\n");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn futex_operations_on_words_never_touched() {
    same(
        "futex",
        "LOCK_PI 0, owner is me 1\nTRYLOCK_PI 0\nWAKE_OP 0, second word 5\nCMP_REQUEUE_PI 0\n\
         LOCK_PI on a bad address -1 Bad address\n",
    );
}

/// `MADV_NOHUGEPAGE` on a mapping, `prctl(PR_SET_THP_DISABLE)` before a malloc block, or no
/// advice under THP `madvise`: the engine moves no huge page there, as the kernel makes none, and its pool holds none either
/// (the process's AnonHugePages: 18 MiB of the pool's before `Shared::huge_wanted`).
fn no_huge(mode: &str) {
    let shim = same(mode, "advice 0; huge pages 0 kB\nin the process 0 kB\n");
    assert!(
        counter(&shim, "fault_events") > 0,
        "the engine served nothing: {}",
        stderr(&shim)
    );
    // What smaps shows of a THP-disabled process is not the whole story: the engine's own count.
    assert_eq!(counter(&shim, "huge_moves"), 0, "{}", stderr(&shim));
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn madv_nohugepage_gets_no_huge_page_of_the_engines() {
    no_huge("nohugepage");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn pr_set_thp_disable_gets_no_huge_page_of_the_engines() {
    no_huge("thp-disable");
}

/// Catches huge pages of the engine's in a mapping the program gave no advice, under THP
/// `madvise` (the kernel makes none there: round 2's `t_thp plain` got 40-192 MiB of them).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn no_advice_under_thp_madvise_gets_no_huge_page_of_the_engines() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    assert!(
        thp.contains("[madvise]"),
        "this test checks THP's madvise mode, not {:?}: set /sys/kernel/mm/transparent_hugepage/enabled \
         to madvise",
        thp.trim()
    );
    no_huge("no-advice");
}

/// `huge_kb=N` of rights.c's stderr.
fn huge_kb(o: &Output) -> u64 {
    let e = stderr(o);
    let v = e.lines().find_map(|l| l.strip_prefix("huge_kb="));
    v.and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no huge_kb= line: {e}"))
}

/// Catches advice lost when an mremap moves served memory (the engine forgot the range and
/// took it back without the program's `MADV_HUGEPAGE`), and the moved range taken as holding
/// page tables in every PMD: the writes after the move got 2 MiB of huge pages of 128 where
/// natively they got 128.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn huge_page_advice_moves_with_the_mapping() {
    let dir = temp_dir("rights-huge-moved");
    let prog = rights(&dir);
    let (plain, shim) = both(prog.to_str().unwrap(), &["huge-moved"], &dir);
    assert_eq!(stdout(&plain), "advice 0; moved 1\n", "natively: {}", stderr(&plain));
    assert_eq!(stdout(&shim), stdout(&plain), "under the shim: {}", stderr(&shim));
    let (native, shimmed) = (huge_kb(&plain), huge_kb(&shim));
    assert!(
        native > 0,
        "no huge page natively (THP unavailable or memory fragmented): {}",
        stderr(&plain)
    );
    assert!(
        shimmed >= native / 2,
        "{shimmed} kB of huge pages under the shim, {native} kB natively: {}",
        stderr(&shim)
    );
    assert!(
        counter(&shim, "fault_events") > 0,
        "the engine served nothing: {}",
        stderr(&shim)
    );
    let (plain, shim) = both(prog.to_str().unwrap(), &["nohuge-moved"], &dir);
    assert_eq!(
        (huge_kb(&plain), huge_kb(&shim)),
        (0, 0),
        "MADV_NOHUGEPAGE moved: {}",
        stderr(&shim)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Advice set on a block, the block freed and handed out again at the same address (the shim's
/// arena; natively a fresh mapping), then a fork: the child sees the block as natively.
fn advice_forgotten(mode: &str) {
    let shim = same(mode, "madvise 0; child saw the data\n");
    assert!(
        program_stderr(&shim).contains("reused 1"),
        "the block was not handed out again at its address: the test did not test reuse\n{}",
        stderr(&shim)
    );
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn dontfork_on_a_freed_block_is_gone_when_it_is_handed_out_again() {
    advice_forgotten("dontfork");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn wipeonfork_on_a_freed_block_is_gone_when_it_is_handed_out_again() {
    advice_forgotten("wipeonfork");
}

// ---------------------------------------------------------------------------------------------
// Debuggers and core dumps

/// `rights remote` (a block with page 0 written) read and written through /proc/PID/mem by a
/// tracer, as a debugger does: the tracer (this test, with PTRACE_SEIZE, which leaves the
/// program running) makes the engine step aside, and the block's fresh pages then read zero
/// and take a write, as natively. Returns what the program printed and its stderr.
fn poke_through_proc_mem(cmd: &mut Command) -> (String, String) {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::fs::FileExt;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let block = usize::from_str_radix(line.trim().trim_start_matches("block 0x"), 16)
        .unwrap_or_else(|_| panic!("no block address: {line:?}"));
    // SAFETY: PTRACE_SEIZE of our own child; it keeps running.
    let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) };
    assert_eq!(seized, 0, "PTRACE_SEIZE: {}", std::io::Error::last_os_error());
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .unwrap();
    // The engine looks for a tracer every 100 ms, on the scrub thread: on a busy machine that
    // may take a while.
    let t0 = std::time::Instant::now();
    let mut byte = [9u8];
    let read = loop {
        match mem.read_at(&mut byte, (block + (1 << 20)) as u64) {
            Ok(1) => break Ok(byte[0]),
            r if t0.elapsed() > Duration::from_secs(20) => break Err(format!("{r:?}")),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let wrote = mem.write_at(&[7], (block + (1 << 20)) as u64);
    child.stdin.take().unwrap().write_all(b"x").unwrap();
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(
        read,
        Ok(0),
        "reading a fresh page through /proc/{pid}/mem; stderr:\n{err}"
    );
    assert_eq!(wrote.ok(), Some(1), "writing it; stderr:\n{err}");
    assert_eq!(status.code(), Some(0), "{err}");
    (rest, err)
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_tracer_reads_and_writes_fresh_memory_through_proc_mem() {
    let dir = temp_dir("rights-remote");
    let prog = rights(&dir);
    let (native, _) = poke_through_proc_mem(Command::new(&prog).arg("remote"));
    assert_eq!(native, "bytes 7 0\n");
    let (shim, err) = poke_through_proc_mem(zerofault().args(["run", "--stats", "--"]).arg(&prog).arg("remote"));
    assert_eq!(shim, native, "{err}");
    let steps = err
        .lines()
        .find_map(|l| l.strip_prefix("zerofault: steps_aside")?.trim().parse::<u64>().ok());
    assert_eq!(steps, Some(1), "the engine did not step aside for the tracer:\n{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `gdb -batch` running `prog debugged` (under `zerofault run` when `shim`): at the program's
/// trap it prints a fresh byte, sets it, prints it again and writes a core with gcore's
/// command. Returns gdb's output and the core's size.
fn under_gdb(prog: &Path, dir: &Path, shim: bool) -> (String, u64) {
    let core = dir.join(if shim { "gcore.shim" } else { "gcore.native" });
    let byte = "(*(unsigned char **)&fresh_block)[1048576]";
    let mut c = Command::new("gdb");
    c.args(["-nx", "-batch", "-ex", "run"])
        .args(["-ex", &format!("print {byte}")])
        .args(["-ex", &format!("set var {byte} = 7")])
        .args(["-ex", &format!("print {byte}")])
        .args(["-ex", &format!("generate-core-file {}", core.display())])
        .args(["-ex", "continue", "--args"]);
    if shim {
        c.arg(env!("CARGO_BIN_EXE_zerofault")).args(["run", "--verbose", "--"]);
    }
    c.arg(prog).arg("debugged");
    let o = run(&mut c, Duration::from_secs(120));
    let text = format!("{}{}", stdout(&o), stderr(&o));
    let size = std::fs::metadata(&core)
        .unwrap_or_else(|e| panic!("no core {}: {e}\n{text}", core.display()))
        .len();
    (text, size)
}

#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_no_gdb), ignore = "needs userfaultfd and gdb")]
fn gdb_prints_and_sets_fresh_memory_and_gcore_is_native_size() {
    let dir = temp_dir("rights-gdb");
    let prog = rights(&dir);
    let (native, native_core) = under_gdb(&prog, &dir, false);
    let (shim, shim_core) = under_gdb(&prog, &dir, true);
    for text in [&native, &shim] {
        assert!(text.contains("$1 = 0 '\\000'"), "{text}");
        assert!(text.contains("$2 = 7 '\\a'"), "{text}");
        assert!(text.contains("byte 7"), "{text}");
    }
    assert!(
        shim.contains("the process is being traced"),
        "--verbose says why the engine stayed out: {shim}"
    );
    let ratio = shim_core as f64 / native_core as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "gcore: {shim_core} bytes under the shim, {native_core} natively"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Puts /proc/sys/kernel/core_pattern back as it was when dropped.
struct CorePattern(String);

impl CorePattern {
    /// Cores named `core.PID` in the crashing process's directory, until dropped.
    fn set() -> CorePattern {
        let path = "/proc/sys/kernel/core_pattern";
        let old = std::fs::read_to_string(path).unwrap();
        std::fs::write(path, "core.%p").unwrap();
        CorePattern(old)
    }
}

impl Drop for CorePattern {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/core_pattern", self.0.trim_end());
    }
}

/// `rights core` crashes with RLIMIT_CORE unlimited, in `dir`, named `name`: its core's path.
fn crash(cmd: &mut Command, dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit in the child before exec; async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let l = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &l);
            Ok(())
        })
    };
    let o = run(cmd.current_dir(dir), Duration::from_secs(60));
    assert_eq!(o.status.signal(), Some(libc::SIGABRT), "{}", stderr(&o));
    let core = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("core."))
        .unwrap_or_else(|| panic!("no core in {}", dir.display()))
        .path();
    let to = dir.join(name);
    std::fs::rename(core, &to).unwrap();
    to
}

/// Times the secret's 32 bytes appear in the core at `path`.
fn secrets(path: &Path) -> usize {
    let core = std::fs::read(path).unwrap();
    let secret: Vec<u8> = (0..32u32).map(|i| ((i * 7 + 13) ^ 0x5a) as u8).collect();
    core.windows(32).filter(|w| *w == secret.as_slice()).count()
}

#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn a_core_dump_holds_no_freed_block_and_is_native_size() {
    let _pattern = CorePattern::set();
    let dir = temp_dir("rights-core");
    let prog = rights(&dir);
    let native = crash(Command::new(&prog).arg("core"), &dir, "native.core");
    let shim = crash(
        zerofault().args(["run", "--"]).arg(&prog).arg("core"),
        &dir,
        "shim.core",
    );
    let (n, s) = (native.metadata().unwrap().len(), shim.metadata().unwrap().len());
    let ratio = s as f64 / n as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "core: {s} bytes under the shim, {n} natively"
    );
    assert_eq!(
        secrets(&shim),
        secrets(&native),
        "the freed secret is in the shim's core"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
