//! Calls the kernel refuses change nothing, and nobody waits on a fault nobody will serve.
//! Each test runs its C program (crates/zerofault-preload/tests/c) natively, checks what it
//! prints there, then runs it under the shim and asserts the same output, with the engine
//! having served memory (so that a run without userfaultfd fails instead of passing plainly).
//! Every run has a time limit (a hang fails the test) and a memory cap.

mod common;

use common::{cc, pages_served, served, stderr, stdout, temp_dir, zerofault, Running};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// The time limit of one run: every program here ends in seconds natively (clonevm gives its
/// child 20 s before it reports it stuck).
const LIMIT: Duration = Duration::from_secs(90);

/// The memory cap of one run: far above what these programs need (under 1 GiB).
const RSS_CAP: u64 = 3 << 30;

fn go(cmd: &mut Command) -> Output {
    Running::start(cmd, LIMIT)
        .rss_cap(RSS_CAP)
        .finish()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `prog mode` natively, which must exit 0 and print `native`, then under `zerofault run
/// --stats`, which must print the same, exit 0, and have had the engine serve memory.
fn same_as_native(prog: &Path, mode: &str, native: &str) {
    let shim = same_output(prog, mode, native);
    assert!(pages_served(&shim) > 0, "the engine served nothing: {}", stderr(&shim));
}

/// [`same_as_native`] without the check that the engine served memory; returns the run under
/// the shim.
fn same_output(prog: &Path, mode: &str, native: &str) -> Output {
    let plain = go(Command::new(prog).arg(mode));
    assert_eq!(
        (plain.status.code(), stdout(&plain).as_str()),
        (Some(0), native),
        "natively: {}",
        stderr(&plain)
    );
    let shim = go(zerofault().args(["run", "--stats", "--"]).arg(prog).arg(mode));
    assert_eq!(
        (shim.status.code(), stdout(&shim)),
        (Some(0), stdout(&plain)),
        "{mode} under the shim: {}",
        stderr(&shim)
    );
    shim
}

/// munmap, mremap, mprotect and madvise refused on sealed memory leave its bytes as they were
/// (the shim used to recycle the pages of a munmap before the kernel refused it).
#[test]
fn calls_refused_on_sealed_memory_change_nothing() {
    let dir = temp_dir("r3-mseal-map");
    let prog = cc("mseal", &dir, false);
    same_as_native(
        &prog,
        "map",
        "munmap whole: -1 Operation not permitted, changed 0\n\
         munmap middle: -1 Operation not permitted, changed 0\n\
         mremap: Operation not permitted, changed 0\n\
         mprotect: -1 Operation not permitted, changed 0\n\
         madvise DONTNEED read-only: -1 Operation not permitted, changed 0\n\
         madvise DONTNEED writable: 0 ok, not zero 0\n\
         munmap half written: -1 Operation not permitted, changed 0 + 0\n",
    );
}

/// A malloc'd block the program sealed in part, freed: natively glibc's munmap is refused and
/// the block stays, bytes and all; the next calloc is zero and elsewhere.
#[test]
fn a_sealed_block_freed_keeps_its_bytes() {
    let dir = temp_dir("r3-mseal-free");
    let prog = cc("mseal", &dir, false);
    same_as_native(
        &prog,
        "free",
        "free: sealed part changed 0\ncalloc: ok, not zero 0\nafter writing it: sealed part changed 0\n",
    );
}

/// A sealed block that realloc moves: natively glibc's mremap is refused and realloc copies,
/// the old block staying as it was; here the pages are copied, not moved, and the old block
/// stays too.
#[test]
fn a_sealed_block_moved_by_realloc_keeps_its_bytes() {
    let dir = temp_dir("r3-mseal-realloc");
    let prog = cc("mseal", &dir, false);
    same_as_native(
        &prog,
        "realloc",
        "realloc: ok, kept 0 of 8192 changed\nsealed part changed 0\n",
    );
}

/// A clone(CLONE_VM) child outlives its parent however the parent ends, and its faults are
/// served (it used to wait for ever in handle_userfault, holding a copy of the descriptor).
#[test]
fn a_process_sharing_the_memory_outlives_its_parent() {
    let dir = temp_dir("r3-clonevm");
    let prog = cc("clonevm", &dir, false);
    let wrote = "child: wrote 128 MiB, bad 0\n";
    same_as_native(
        &prog,
        "wait",
        &format!("{wrote}parent: child status 0\nscenario: exit 0\n"),
    );
    for mode in ["exit", "_exit", "files"] {
        same_as_native(&prog, mode, &format!("{wrote}scenario: exit 0\n"));
    }
    same_as_native(&prog, "kill", &format!("{wrote}scenario: killed by signal 9\n"));
    // Cloned with CLONE_FILES before the engine started: it never starts (its descriptor
    // would be in the table the child shares).
    let shim = same_output(&prog, "files-first", &format!("{wrote}scenario: exit 0\n"));
    assert_eq!(served(&shim), None, "an engine started: {}", stderr(&shim));
}

/// A munmap that would split a served mapping at `vm.max_map_count` is refused (ENOMEM) with
/// the bytes intact: the shim recycles only a munmap that splits no VMA.
#[test]
fn a_munmap_refused_at_the_map_count_limit_changes_nothing() {
    let dir = temp_dir("r3-split");
    let prog = cc("mseal", &dir, false);
    same_as_native(
        &prog,
        "split",
        "munmap that splits, at the limit: -1 Cannot allocate memory, changed 0\n",
    );
}
