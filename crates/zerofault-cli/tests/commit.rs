//! Strict overcommit (`vm.overcommit_memory` 2), set for the one test of this file (its own
//! binary: nothing else runs while the machine's commit is strict) and put back when it ends.
//! The C program is crates/zerofault-preload/tests/c/commit.c.

mod common;

use common::{both, cc, counter, measured, stderr, stdout, temp_dir};

/// `vm.overcommit_memory`, set for a test and put back when it ends, even by a panic.
struct Overcommit(String);

impl Overcommit {
    const PATH: &'static str = "/proc/sys/vm/overcommit_memory";

    fn set(mode: &str) -> Option<Overcommit> {
        let old = std::fs::read_to_string(Self::PATH).ok()?;
        std::fs::write(Self::PATH, mode).ok()?;
        Some(Overcommit(old))
    }
}

impl Drop for Overcommit {
    fn drop(&mut self) {
        std::fs::write(Self::PATH, self.0.trim()).expect("vm.overcommit_memory restored");
    }
}

/// Catches an engine whose start charges the machine's commit with its pools' reservations
/// (read-write, charged whole in mode 2 even with `MAP_NORESERVE`): 8.4 GB at each start, so
/// that a mapping of most of the commit left, which natively succeeds, failed with ENOMEM.
/// The engine may be charged at most 64 MiB more than the program natively (its writable
/// private mappings). Killed outright (SIGKILL), the test leaves the machine in mode 2: the
/// restore is a drop.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn under_strict_overcommit_the_engine_leaves_the_commit_to_the_program() {
    let dir = temp_dir("commit");
    let prog = cc("commit", &dir, false);
    let Some(_strict) = Overcommit::set("2") else {
        panic!("vm.overcommit_memory cannot be set (the test needs root)");
    };
    let (plain, shim) = both(prog.to_str().unwrap(), &[], &dir);
    let expected = "first block ok, mmap ok, malloc ok\n";
    assert_eq!(stdout(&plain), expected, "natively: {}", stderr(&plain));
    assert_eq!(stdout(&shim), expected, "under the shim: {}", stderr(&shim));
    assert!(
        counter(&shim, "fault_events") > 0,
        "the engine served nothing: {}",
        stderr(&shim)
    );
    let (n, s) = (measured(&plain, "charged_kb"), measured(&shim, "charged_kb"));
    assert!(
        s <= n + 64 * 1024,
        "{s} kB of writable private mappings under the shim, {n} kB natively"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
