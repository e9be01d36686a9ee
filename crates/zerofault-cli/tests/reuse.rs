//! Large blocks freed and malloc'd again, as glibc would reuse them (round 3's `t_reuse`,
//! `t_loop4m`): the C program is crates/zerofault-preload/tests/c/reuse.c.

mod common;

use common::{both, cc, counter, measured, pages_served, stderr, stdout, temp_dir};

/// Catches blocks of 2-16 MiB served from the arena at every round: each round's pages were
/// discarded at the free and faulted in again (zeroed) at the next malloc, 25-150x native's
/// time, where glibc, having raised its mmap threshold at the first free, reuses its heap
/// with the pages in place. Shown without a clock: the engine serves the first round's pages
/// and no more (it served every round's), and the loop's own minor faults (the program
/// thread's) stay within a round of native's, about two rounds' worth for the whole loop. The
/// calloc after the loop still reads zero.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_block_freed_and_malloced_again_keeps_its_pages_as_in_glibcs_heap() {
    let dir = temp_dir("reuse");
    let prog = cc("reuse", &dir, false);
    let rounds = 100;
    let mut failures = vec![];
    for mib in [2u64, 4, 8, 16] {
        let (plain, shim) = both(prog.to_str().unwrap(), &[&mib.to_string(), &rounds.to_string()], &dir);
        for o in [&plain, &shim] {
            assert!(o.status.success() && stdout(o) == "done\n", "{}", stderr(o));
            assert_eq!(measured(o, "bad"), 0, "calloc read nonzero: {}", stderr(o));
        }
        // The first block is the arena's: the engine started and served it.
        assert!(
            counter(&shim, "fault_events") > 0,
            "the engine served nothing: {}",
            stderr(&shim)
        );
        let round = (mib << 20) as i64 / 4096;
        let (n, s) = (measured(&plain, "minflt"), measured(&shim, "minflt"));
        // One round more than natively: the arena's block, before the next allocator takes over
        // (and a few hundred of the shim's own: its hooks' first touches of its memory).
        if s > n + round + 1024 {
            failures.push(format!(
                "{mib} MiB: {s} minor faults under the shim, {n} natively (one round: {round})"
            ));
        }
        let served = pages_served(&shim) as i64;
        if served > 2 * round {
            failures.push(format!("{mib} MiB: the engine served {served} pages, {round} a round"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}
