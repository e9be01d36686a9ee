//! The randomized stress of a program's own memory calls (crates/zerofault-preload/tests/c/
//! mmstress.c): threads streaming through chunks of one region while others mmap, munmap,
//! mremap in every form, madvise with every advice, mprotect, mlock, fork, under a 1 kHz signal,
//! every byte checked. It runs a few seconds natively (the program must hold there: a failure
//! then is the program's, not the shim's), then under `zerofault run --stats` for
//! `ZEROFAULT_STRESS_SECS` seconds (20 by default). The long run by hand:
//!
//! ```sh
//! ZEROFAULT_STRESS_SECS=600 cargo test --release -p zerofault-cli --test stress -- --nocapture
//! ```
//!
//! which prints the program's counts and the engine's counters at the end.

mod common;

use common::{cc, measured, pages_served, stderr, stdout, temp_dir, zerofault, Running};
use std::process::{Command, Output};
use std::time::Duration;

/// How long the native run lasts: a sanity check of the program itself.
const NATIVE_SECS: u64 = 3;

/// How long the run under the shim lasts unless `ZEROFAULT_STRESS_SECS` says otherwise.
const DEFAULT_SECS: u64 = 20;

/// The memory cap of a run: the program maps 256 MiB of chunks and a few MiB more; the engine's
/// pool is 256 MiB at most.
const RSS_CAP: u64 = 4 << 30;

fn secs() -> u64 {
    match std::env::var("ZEROFAULT_STRESS_SECS") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("ZEROFAULT_STRESS_SECS={v:?}: a whole number of seconds")),
        Err(_) => DEFAULT_SECS,
    }
}

/// The time limit of a run of `secs` seconds: the run, then the threads' last operations and
/// the final check of every chunk, with a wide margin for a loaded machine. A hang fails.
fn limit(secs: u64) -> Duration {
    Duration::from_secs(secs + 60 + secs / 10)
}

fn go(cmd: &mut Command, secs: u64) -> Output {
    Running::start(cmd, limit(secs))
        .rss_cap(RSS_CAP)
        .finish()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Exit 0, "mmstress: ok" and `fails=0`, or a panic showing the failure lines.
fn assert_clean(o: &Output, how: &str) {
    assert!(
        o.status.success() && stdout(o) == "mmstress: ok\n" && measured(o, "fails") == 0,
        "{how}: {} ({})\n{}",
        stdout(o).trim(),
        o.status,
        stderr(o)
    );
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn mmstress_natively_then_under_the_shim() {
    let dir = temp_dir("mmstress");
    let prog = cc("mmstress", &dir, false);

    let native = go(Command::new(&prog).arg(NATIVE_SECS.to_string()), NATIVE_SECS);
    assert_clean(&native, "natively (the program itself is wrong)");

    let secs = secs();
    let shim = go(
        zerofault()
            .args(["run", "--stats", "--"])
            .arg(&prog)
            .arg(secs.to_string()),
        secs,
    );
    assert_clean(&shim, "under the shim");
    let served = pages_served(&shim);
    assert!(served > 0, "the engine served no page:\n{}", stderr(&shim));
    eprintln!("mmstress, {secs} s under the shim:\n{}", stderr(&shim));
    std::fs::remove_dir_all(&dir).unwrap();
}
