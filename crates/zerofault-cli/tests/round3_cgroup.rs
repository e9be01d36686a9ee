//! Processes sharing one memory cgroup (DESIGN.md, "The pool's memory budget"): the pools of
//! all the engines in it together stay within its headroom, and give their pages back when the
//! programs' own faults bring it near its limit. crates/zerofault-preload/tests/c/forkbomb.c
//! forks 16 children that each write 32 MiB and wait, then 16 more that do the same: 1 GiB of
//! blocks in a 1100 MiB cgroup. Natively none is killed; with each engine budgeting against
//! the cgroup's limit as if it were alone, the first sixteen's pools filled the headroom and
//! the cgroup's OOM killer killed late children (1 to 4 of 32, every run).

mod common;

use common::{cc, counter, stderr, stdout, temp_dir, zerofault, Cgroup};
use std::process::Command;

const ARGS: [&str; 4] = ["16", "16", "32", "300"];
const OK: &str = "children 32: ok 32, killed 0 (last signal 0), other 0\n";

#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn processes_sharing_a_memory_cgroup_fit_it_under_the_shim_as_natively() {
    let dir = temp_dir("round3-cgroup");
    let prog = cc("forkbomb", &dir, false);
    let cg = Cgroup::new("zerofault-test-forkbomb", 1100 << 20);
    let native = cg.run(Command::new(&prog).args(ARGS));
    assert_eq!(
        (native.status.code(), stdout(&native).as_str(), cg.oom_kills()),
        (Some(0), OK, 0),
        "natively, the children must fit the cgroup (peak {} MiB): {}",
        cg.peak_mib(),
        stderr(&native)
    );
    for round in 0..3 {
        let shim = cg.run(zerofault().args(["run", "--stats", "--"]).arg(&prog).args(ARGS));
        assert_eq!(
            (shim.status.code(), stdout(&shim).as_str(), cg.oom_kills()),
            (Some(0), OK, 0),
            "round {round}: a child OOM-killed under the shim (peak {} MiB): {}",
            cg.peak_mib(),
            stderr(&shim)
        );
        // The engines served the children, and their pools filled: the ledger was at work.
        for c in ["fault_events", "pool_pages_filled"] {
            assert!(counter(&shim, c) > 0, "round {round}: {c} 0: {}", stderr(&shim));
        }
    }
    drop(cg);
    std::fs::remove_dir_all(&dir).unwrap();
}
