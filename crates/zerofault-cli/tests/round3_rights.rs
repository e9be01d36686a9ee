//! The engine is part of the process, never more: the files it writes are opened with the
//! rights the process holds when it writes them (no descriptor outlives a drop of root, a
//! symlink or another user's file in /tmp is refused), its threads follow a Landlock domain and
//! the CPUs the program allows itself, and a real-time thread's faults are left to the kernel.
//! The C programs of crates/zerofault-preload/tests/c (statsdrop.c, landlock.c, affinity.c,
//! fifo.c) each print what they saw; each test runs one natively, checks what it printed there,
//! and wants the same under `zerofault run`.

mod common;

use common::{cc, counter, program_stderr, stderr, stdout, temp_dir, zerofault, Running};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// How long one run may last.
const LIMIT: Duration = Duration::from_secs(120);
/// Resident memory one run may reach (the programs write at most 256 MiB at a time).
const RSS_CAP: u64 = 1 << 30;

/// One test at a time: the timed one must not share the CPU with the others' programs.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `cmd` within [`LIMIT`] and [`RSS_CAP`]; a hang or a runaway fails the test.
fn capped(cmd: &mut Command) -> Output {
    Running::start(cmd, LIMIT)
        .rss_cap(RSS_CAP)
        .finish()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `prefix.. program args` natively, then `prefix.. zerofault run [--stats] -- program args`,
/// both with `env`, in `dir`.
fn pair(
    prefix: &[&str],
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stats: bool,
    dir: &Path,
) -> (Output, Output) {
    let command = |under: bool| {
        let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        if under {
            argv.push(zerofault().get_program().to_string_lossy().into_owned());
            argv.push("run".into());
            if stats {
                argv.push("--stats".into());
            }
            argv.push("--".into());
        }
        argv.push(program.to_string_lossy().into_owned());
        argv.extend(args.iter().map(|s| s.to_string()));
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]).current_dir(dir).envs(env.iter().copied());
        c
    };
    (capped(&mut command(false)), capped(&mut command(true)))
}

/// The native run printed `expected` and exited 0; the shim's run printed the same.
fn same_as_native(plain: &Output, shim: &Output, expected: &str) {
    assert_eq!(
        (plain.status.code(), stdout(plain).as_str()),
        (Some(0), expected),
        "natively: {}",
        stderr(plain)
    );
    assert_eq!(
        (shim.status.code(), stdout(shim)),
        (Some(0), stdout(plain)),
        "under the shim; its stderr:\n{}",
        stderr(shim)
    );
}

/// A `NAME N` line the program printed to stderr.
fn program_number(o: &Output, name: &str) -> u64 {
    program_stderr(o)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{name}' line:\n{}", stderr(o)))
}

/// The shim's lines on stderr that say a report was not written.
fn not_written(o: &Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter(|l| l.starts_with("zerofault: ZEROFAULT_STATS=") && l.contains("are not written"))
        .map(str::to_string)
        .collect()
}

fn program(name: &str) -> (PathBuf, PathBuf) {
    let dir = temp_dir(&format!("r3-{name}"));
    let prog = cc(name, &dir, false);
    (dir, prog)
}

// ---------------------------------------------------------------------------------------------
// The files the engine writes

/// A root service started with ZEROFAULT_STATS=<a root-only file> drops to nobody after
/// start-up: as nobody it can no longer open the file, and must hold no descriptor of it
/// either (the shim kept the one it opened as root: nobody appended to the root-only file).
/// The report, opened at exit with nobody's rights, is not written: one line says so.
#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn no_descriptor_of_the_stats_file_outlives_a_drop_of_root() {
    let _serial = one_at_a_time();
    let (dir, prog) = program("statsdrop");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.join("stats.jsonl");
    std::fs::write(&file, "").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let path = file.to_str().unwrap();
    let (plain, shim) = pair(&[], &prog, &["drop", path], &[("ZEROFAULT_STATS", path)], false, &dir);
    same_as_native(
        &plain,
        &shim,
        "uid 65534: open: Permission denied\ndescriptors naming the file: 0\ndone\n",
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "",
        "the root-only file was written"
    );
    assert_eq!(not_written(&shim).len(), 1, "{}", stderr(&shim));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The report is opened when it is written: by the parent and by a fork child, each at its
/// exit (one line each); and after a chroot, where the path names nothing, one line on stderr
/// says the report is not written, and the program ends as natively.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_stats_file_is_opened_at_exit_in_forks_and_after_a_chroot() {
    let _serial = one_at_a_time();
    let (dir, prog) = program("statsdrop");
    let file = dir.join("stats.jsonl");
    let path = file.to_str().unwrap();
    let (plain, shim) = pair(&[], &prog, &["fork"], &[("ZEROFAULT_STATS", path)], false, &dir);
    same_as_native(&plain, &shim, "child ok\ndone\n");
    let text = std::fs::read_to_string(&file).unwrap();
    let pids: std::collections::BTreeSet<&str> = text.lines().map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(
        (text.lines().count(), pids.len()),
        (2, 2),
        "one line per process:\n{text}"
    );
    assert!(not_written(&shim).is_empty(), "{}", stderr(&shim));

    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let other = dir.join("chroot.jsonl");
    let other = other.to_str().unwrap();
    let (plain, shim) = pair(
        &[],
        &prog,
        &["chroot", empty.to_str().unwrap()],
        &[("ZEROFAULT_STATS", other)],
        false,
        &dir,
    );
    same_as_native(&plain, &shim, "chroot 0, chdir 0\ndone\n");
    assert_eq!(not_written(&shim).len(), 1, "{}", stderr(&shim));
    assert_eq!(
        std::fs::read_to_string(other).unwrap(),
        "",
        "created at start-up, not written"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fs.protected_symlinks` and `fs.protected_regular` at 0 for the test (the kernel then
/// follows a symlink and opens another user's file in a sticky directory, as on machines
/// where they are off), restored after, even on failure.
struct Unprotected(Vec<(&'static str, String)>);

impl Unprotected {
    fn take() -> Unprotected {
        let mut saved = Vec::new();
        for knob in ["/proc/sys/fs/protected_symlinks", "/proc/sys/fs/protected_regular"] {
            saved.push((knob, std::fs::read_to_string(knob).unwrap().trim().to_string()));
            std::fs::write(knob, "0").unwrap();
        }
        Unprotected(saved)
    }
}

impl Drop for Unprotected {
    fn drop(&mut self) {
        for (knob, value) in &self.0 {
            let _ = std::fs::write(knob, value);
        }
    }
}

/// Paths in /tmp, removed after the test, even on failure.
struct InTmp(Vec<PathBuf>);

impl Drop for InTmp {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Another user (nobody, 65534) plants, in /tmp, a symlink at the stats path to a root-only
/// file, or a file of its own there: root's report is written into neither (O_NOFOLLOW, and
/// the owner of a file in a sticky directory others may write to), and one line says so.
#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn a_symlink_or_another_users_file_in_tmp_is_refused() {
    let _serial = one_at_a_time();
    let (dir, prog) = program("statsdrop");
    let victim = dir.join("victim");
    std::fs::write(&victim, "root-only content\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = PathBuf::from(format!("/tmp/zf-r3-link-{}.jsonl", std::process::id()));
    let theirs = PathBuf::from(format!("/tmp/zf-r3-theirs-{}.jsonl", std::process::id()));
    let _clean = InTmp(vec![link.clone(), theirs.clone()]);
    let _unprotected = Unprotected::take();
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    std::fs::write(&theirs, "").unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    for (path, said) in [(&link, "cannot open it"), (&theirs, "another user's file")] {
        let path = path.to_str().unwrap();
        let (plain, shim) = pair(&[], &prog, &["touch"], &[("ZEROFAULT_STATS", path)], false, &dir);
        same_as_native(&plain, &shim, "done\n");
        // The kernel itself refuses another user's symlink in a sticky directory to an
        // O_CREAT|O_NOFOLLOW open (EACCES); followed, it would have opened the victim.
        let err = stderr(&shim);
        assert!(
            err.contains(said) && err.contains("no stats are written"),
            "{path}: {err}"
        );
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root-only content\n");
    assert_eq!(
        std::fs::read_to_string(&theirs).unwrap(),
        "",
        "written into nobody's file"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Landlock

/// The program confines itself with Landlock after the engine started (through libc's
/// syscall()): the engine's threads, started again from the calling thread, are in its domain
/// (a child inside the domain may read memory through each of them), and serve on.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_engine_threads_enter_the_programs_landlock_domain() {
    let _serial = one_at_a_time();
    let (dir, prog) = program("landlock");
    let (plain, shim) = pair(&[], &prog, &[], &[], true, &dir);
    same_as_native(
        &plain,
        &shim,
        "ruleset made, no_new_privs 0, landlock_restrict_self 0\nopen(/proc/self/status): Permission denied\n\
         pages read wrong: 0\nthreads outside the domain: 0\n",
    );
    assert!(
        program_number(&shim, "other threads") >= 2,
        "the engine's threads were not back after the call:\n{}",
        stderr(&shim)
    );
    assert!(counter(&shim, "fault_events") > 0, "{}", stderr(&shim));
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// CPUs and priority

/// The program narrows itself to CPU 0 (sched_setaffinity, pthread_setaffinity_np, or
/// `taskset -p` from outside): the engine's threads follow, none may run on another CPU.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_engine_threads_run_only_where_the_program_may() {
    let _serial = one_at_a_time();
    let (dir, prog) = program("affinity");
    for mode in ["self", "pthread", "outside"] {
        let (plain, shim) = pair(&[], &prog, &[mode], &[], true, &dir);
        same_as_native(
            &plain,
            &shim,
            &format!("{mode}: 0\nthreads that may run outside CPU 0: 0\n"),
        );
        assert!(
            program_number(&shim, "threads") >= 3,
            "{mode}: the engine's threads are not there:\n{}",
            stderr(&shim)
        );
        assert_eq!(counter(&shim, "steps_aside"), 0, "{mode}: {}", stderr(&shim));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A thread made real-time (an explicit attribute at pthread_create, sched_setattr through
/// syscall(), `chrt -p` from outside): the engine stops for good, the kernel serves the
/// faults, the data is right.
#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn a_real_time_thread_stops_the_engine() {
    let _serial = one_at_a_time();
    let (dir, prog) = program("fifo");
    for (mode, expected) in [
        ("thread", "pthread_create: 0\npolicy now 0; pages read wrong: 0\n"),
        ("setattr", "sched_setattr: 0\npolicy now 2; pages read wrong: 0\n"),
        ("outside", "chrt: 0\npolicy now 1; pages read wrong: 0\n"),
    ] {
        let (plain, shim) = pair(&[], &prog, &[mode], &[], true, &dir);
        same_as_native(&plain, &shim, expected);
        assert_eq!(counter(&shim, "steps_aside"), 1, "{mode}: {}", stderr(&shim));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `taskset -c 0`: a SCHED_FIFO main thread writes 256 MiB while a SCHED_FIFO thread of equal
/// priority waits to spin for 1 s. Natively the write takes a tenth of a second; a fault that
/// waited for a SCHED_OTHER handler would wait for the spinner's whole second. The best of
/// three runs each way, within 1.2 times native (and a little noise).
#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn a_real_time_threads_fault_does_not_wait_behind_its_equals() {
    let _serial = one_at_a_time();
    let (dir, prog) = program("fifo");
    let expected = "sched_setscheduler: 0\npthread_create: 0\npolicy now 1; pages read wrong: 0\n";
    let write_s = |o: &Output| -> f64 {
        program_stderr(o)
            .lines()
            .find_map(|l| l.strip_prefix("write_s=")?.parse().ok())
            .unwrap_or_else(|| panic!("no write_s line:\n{}", stderr(o)))
    };
    let (mut native, mut shim) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        let (p, s) = pair(&["taskset", "-c", "0"], &prog, &["main"], &[], true, &dir);
        same_as_native(&p, &s, expected);
        assert_eq!(counter(&s, "steps_aside"), 1, "{}", stderr(&s));
        native = native.min(write_s(&p));
        shim = shim.min(write_s(&s));
    }
    println!("256 MiB written by a SCHED_FIFO thread: natively {native:.3} s, under the shim {shim:.3} s");
    assert!(
        shim <= native * 1.2 + 0.03,
        "natively {native:.3} s, under the shim {shim:.3} s"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
