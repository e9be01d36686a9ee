//! Every way a process under the shim ends, with faults in flight: two threads fault fresh
//! memory without a pause (mmap/munmap of 8 MiB, calloc/free of 4 MiB, every page checked to
//! read zero first) while the main thread returns from main, calls exit or _exit, takes a
//! fatal signal, execs, or forks a child that does the same. Each ends with the status it has
//! natively, no page read anything but zero, and none hangs (issue 28's exit; DESIGN.md,
//! "Exit": the shim's destructor leaves the handlers serving until exit_group).

mod common;

use common::{cc, run, served, stderr, temp_dir, zerofault};
use std::time::Duration;

/// Runs of each way to end: each ends within milliseconds natively.
const RUNS: usize = 5;

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_process_ends_every_way_with_faults_in_flight_as_natively() {
    let dir = temp_dir("exits-during");
    let prog = cc("exits", &dir, false);
    // How, the status natively, and whether the process prints the shim's report (it does
    // only where its destructors run: return, exit, and the forking parent's return).
    let ways = [
        ("return", Some(0), true),
        ("exit", Some(0), true),
        ("_exit", Some(0), false),
        ("signal", None, false),
        ("exec", Some(0), false),
        ("fork", Some(0), true),
    ];
    for (how, code, reports) in ways {
        let native = run(
            std::process::Command::new(&prog).args(["during", how]),
            Duration::from_secs(30),
        );
        assert_eq!(native.status.code(), code, "natively, {how}: {native:?}");
        for i in 0..RUNS {
            let o = run(
                zerofault()
                    .args(["run", "--stats", "--"])
                    .arg(&prog)
                    .args(["during", how]),
                Duration::from_secs(30),
            );
            let err = stderr(&o);
            assert!(
                !err.contains("bad"),
                "{how}, run {i}: a fresh page did not read zero:\n{err}"
            );
            assert_eq!(o.status.code(), code, "{how}, run {i}: {o:?}");
            if code.is_none() {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(o.status.signal(), Some(libc::SIGTERM), "{how}, run {i}: {o:?}");
            }
            if reports {
                // The engine served the threads' memory: this is a test of it, not of the kernel.
                assert!(
                    served(&o).is_some_and(|n| n > 0),
                    "{how}, run {i}: nothing served:\n{err}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
