//! Choosing the node a fault's pages come from, and the zonelist cache (seed 001).
//!
//! The kernel allocates a fault's page by the memory policy of the faulting address (the
//! mapping's own, set with `mbind`), else by the faulting thread's (`set_mempolicy`), else on
//! the node of the CPU the thread runs on; when that node has no free page it falls back to the
//! other nodes in distance order. [`Choice`] is that order, worked out from a [`Policy`]: the
//! nodes to try, first the one the kernel would pick.
//!
//! Seed 001 (Paul Jackson's zonelist cache, 2006) adds a memory of the fallback scan: a zone
//! found full is marked, the next scans skip it, and the marks are cleared once a second (the
//! "zap"). The kernel removed it in 4.4, partly because one failed huge-page allocation marked
//! a zone full for small allocations too; here the marks are kept per ring size
//! ([`RingKind`]), so an empty huge ring never hides a node's 4 KiB pages. [`ZoneCache`]
//! reads its time from a [`Clock`], so tests drive the zap.
//!
//! Not wired into the pools yet (issue 11): the engine still has one pool. The order of
//! [`Choice`] and the marks of [`ZoneCache`] are what per-node pools will use.

use crate::sys::numa::{NodeMask, Topology};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// How long a node found empty is skipped (seed 001's one second).
pub(crate) const ZAP_NS: u64 = 1_000_000_000;

/// A memory policy, as `get_mempolicy` reports it (flags aside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// No policy (`MPOL_DEFAULT`) or `MPOL_LOCAL`: the faulting CPU's node.
    Local,
    /// `MPOL_PREFERRED`: that node first, then the others by distance from it.
    Preferred(u32),
    /// `MPOL_PREFERRED_MANY`: the nearest node of the mask first, then the rest of the mask,
    /// then every other node.
    PreferredMany(NodeMask),
    /// `MPOL_BIND`: only the mask's nodes, nearest to the faulting CPU's node first.
    Bind(NodeMask),
    /// `MPOL_INTERLEAVE` (and `MPOL_WEIGHTED_INTERLEAVE`, taken as equal weights): one node of
    /// the mask per page, or per huge page.
    Interleave(NodeMask),
}

impl Policy {
    /// The policy of a `get_mempolicy` answer (mode with its flags masked off); `None` for a
    /// mode this engine does not know (the kernel serves such ranges: see the caller).
    pub(crate) fn from_mode(mode: i32, mask: NodeMask) -> Option<Policy> {
        use crate::sys::numa::*;
        Some(match mode {
            MPOL_DEFAULT | MPOL_LOCAL => Policy::Local,
            // An empty preferred mask is the old spelling of local.
            MPOL_PREFERRED => mask.nth(0).map_or(Policy::Local, Policy::Preferred),
            MPOL_PREFERRED_MANY => Policy::PreferredMany(mask),
            MPOL_BIND => Policy::Bind(mask),
            MPOL_INTERLEAVE | MPOL_WEIGHTED_INTERLEAVE => Policy::Interleave(mask),
            _ => return None,
        })
    }
}

/// The interleave index of a fault, as the kernel computes it for a mapping's policy: the
/// page's offset in units of the allocation (`order` 0 for a 4 KiB page, 9 for a 2 MiB huge
/// page). For anonymous memory the mapping's page offset is its address in pages, so the index
/// is the address's: a mapping moved by `mremap` keeps the offset it had, given as `pgoff`
/// (the mapping's `vm_pgoff`) with its start.
pub(crate) fn interleave_index(addr: usize, order: u32, vm_start: usize, pgoff: u64) -> u64 {
    (pgoff + ((addr - vm_start) >> 12) as u64) >> order
}

/// The nodes to take a fault's pages from, in the order to try them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Choice {
    /// The node the kernel would allocate on, then its fallbacks.
    pub(crate) order: Vec<u32>,
    /// The first node was picked by interleaving (for the `interleave_hit` counter).
    pub(crate) interleaved: bool,
}

impl Choice {
    /// The order for `policy`, a fault by a thread on node `local`, with interleave index
    /// `ilx` (see [`interleave_index`]; unused by other policies).
    pub(crate) fn of(t: &Topology, policy: Policy, local: u32, ilx: u64) -> Choice {
        let near = |from: u32| t.by_distance(from);
        let (order, interleaved) = match policy {
            Policy::Local => (near(local), false),
            Policy::Preferred(n) => (near(n), false),
            Policy::PreferredMany(m) => {
                let mut v: Vec<u32> = near(local).into_iter().filter(|n| m.contains(*n)).collect();
                v.extend(near(local).into_iter().filter(|n| !m.contains(*n)));
                (v, false)
            }
            Policy::Bind(m) => (near(local).into_iter().filter(|n| m.contains(*n)).collect(), false),
            Policy::Interleave(m) => {
                let w = u64::from(m.weight());
                match m.nth(ilx % w.max(1)) {
                    // The interleave node first, then its fallbacks (the kernel's interleave
                    // allocation falls back through that node's zonelist).
                    Some(n) => (near(n), true),
                    None => (near(local), false),
                }
            }
        };
        Choice { order, interleaved }
    }
}

/// Which ring a mark is for: an empty huge ring says nothing about the 4 KiB pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RingKind {
    Small = 0,
    Huge = 1,
}

/// Where the zonelist cache reads the time.
pub(crate) trait Clock {
    /// Nanoseconds from an arbitrary start, never going back.
    fn now_ns(&self) -> u64;
}

/// The monotonic clock.
#[derive(Debug, Default)]
pub(crate) struct Monotonic;

impl Clock for Monotonic {
    fn now_ns(&self) -> u64 {
        use std::sync::OnceLock;
        static START: OnceLock<std::time::Instant> = OnceLock::new();
        u64::try_from(START.get_or_init(std::time::Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// What a scan found: the node to take pages from (`None`: every node tried was empty or
/// marked), the nodes skipped for their marks, and the nodes found empty (and marked) on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pick {
    pub(crate) node: Option<u32>,
    pub(crate) skipped: u32,
    pub(crate) found_empty: u32,
}

/// Seed 001's zonelist cache: nodes recently found empty, per ring kind, forgotten once a
/// second. Lock-free: a mark is a bit set with `fetch_or`, the zap a store; a scan racing a
/// zap sees the marks before or after it, either a valid state.
#[derive(Debug)]
pub(crate) struct ZoneCache<C: Clock = Monotonic> {
    /// Bit n: node n found empty since the last zap; one word per 64 nodes, per ring kind.
    marks: [Box<[AtomicU64]>; 2],
    /// When the marks were last cleared.
    zapped_at: AtomicU64,
    clock: C,
}

impl<C: Clock> ZoneCache<C> {
    /// A cache for node ids below `nodes`.
    pub(crate) fn new(nodes: usize, clock: C) -> ZoneCache<C> {
        let words = nodes.div_ceil(64).max(1);
        let row = || (0..words).map(|_| AtomicU64::new(0)).collect::<Box<[_]>>();
        let now = clock.now_ns();
        ZoneCache {
            marks: [row(), row()],
            zapped_at: AtomicU64::new(now),
            clock,
        }
    }

    /// Clears every mark if the last zap is a second old (seed 001's `zlc_setup`).
    fn maybe_zap(&self) {
        let now = self.clock.now_ns();
        let last = self.zapped_at.load(Acquire);
        if now.saturating_sub(last) >= ZAP_NS && self.zapped_at.compare_exchange(last, now, AcqRel, Relaxed).is_ok() {
            for row in &self.marks {
                for w in row.iter() {
                    w.store(0, Release);
                }
            }
        }
    }

    fn word(&self, kind: RingKind, node: u32) -> Option<&AtomicU64> {
        self.marks[kind as usize].get(node as usize / 64)
    }

    /// Whether `node`'s ring of `kind` was found empty within the last second.
    pub(crate) fn is_marked(&self, kind: RingKind, node: u32) -> bool {
        self.maybe_zap();
        self.word(kind, node)
            .is_some_and(|w| w.load(Acquire) & (1 << (node % 64)) != 0)
    }

    /// Marks `node`'s ring of `kind` empty.
    pub(crate) fn mark(&self, kind: RingKind, node: u32) {
        if let Some(w) = self.word(kind, node) {
            w.fetch_or(1 << (node % 64), AcqRel);
        }
    }

    /// Scans `order` for a node whose ring of `kind` has pages (`has_pages`), skipping nodes
    /// marked empty and marking those found empty.
    pub(crate) fn pick(&self, kind: RingKind, order: &[u32], has_pages: impl Fn(u32) -> bool) -> Pick {
        let mut p = Pick {
            node: None,
            skipped: 0,
            found_empty: 0,
        };
        for &n in order {
            if self.is_marked(kind, n) {
                p.skipped += 1;
                continue;
            }
            if has_pages(n) {
                p.node = Some(n);
                return p;
            }
            self.mark(kind, n);
            p.found_empty += 1;
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::numa::tests::fake_tree;
    use crate::sys::numa::{MPOL_BIND, MPOL_DEFAULT, MPOL_INTERLEAVE, MPOL_PREFERRED};
    use std::cell::Cell;

    /// Two sockets of two nodes each: 0-1 close (12), 2-3 close, across 20; node 4 without
    /// memory.
    fn four_nodes(name: &str) -> Topology {
        let root = fake_tree(
            name,
            "0-4",
            &[
                (0, "0-3", 1 << 20, "10 12 20 20 20"),
                (1, "4-7", 1 << 20, "12 10 20 20 20"),
                (2, "8-11", 1 << 20, "20 20 10 12 20"),
                (3, "12-15", 1 << 20, "20 20 12 10 20"),
                (4, "16", 0, "20 20 20 20 10"),
            ],
        );
        let t = Topology::read(&root).unwrap();
        std::fs::remove_dir_all(root).unwrap();
        t
    }

    #[test]
    fn every_policy_picks_the_node_the_kernel_would_and_falls_back_by_distance() {
        let t = four_nodes("policies");
        let order = |p: Policy, local: u32, ilx: u64| Choice::of(&t, p, local, ilx).order;
        // Local: the thread's node, its socket neighbour, then the other socket by id.
        assert_eq!(order(Policy::Local, 0, 0), [0, 1, 2, 3]);
        assert_eq!(order(Policy::Local, 3, 0), [3, 2, 0, 1]);
        // A thread on the memory-less node falls back from there.
        assert_eq!(order(Policy::Local, 4, 0), [0, 1, 2, 3]);
        // Preferred: from the preferred node, wherever the thread runs.
        assert_eq!(order(Policy::Preferred(2), 0, 0), [2, 3, 0, 1]);
        // Bind: only the mask, nearest to the thread first.
        assert_eq!(order(Policy::Bind(NodeMask::of([1, 3])), 0, 0), [1, 3]);
        assert_eq!(order(Policy::Bind(NodeMask::of([1, 3])), 2, 0), [3, 1]);
        // Preferred-many: the mask nearest first, then everything else.
        assert_eq!(order(Policy::PreferredMany(NodeMask::of([2, 3])), 0, 0), [2, 3, 0, 1]);
        // Interleave: the ilx-th node of the mask first, then its fallbacks.
        let il = Policy::Interleave(NodeMask::of([0, 2, 3]));
        let firsts: Vec<u32> = (0..6).map(|i| order(il, 1, i)[0]).collect();
        assert_eq!(firsts, [0, 2, 3, 0, 2, 3]);
        assert_eq!(order(il, 1, 4), [2, 3, 0, 1]);
        assert!(Choice::of(&t, il, 1, 4).interleaved);
        assert!(!Choice::of(&t, Policy::Local, 1, 4).interleaved);
    }

    #[test]
    fn policies_come_from_get_mempolicy_modes() {
        let m = NodeMask::of([1]);
        assert_eq!(
            Policy::from_mode(MPOL_DEFAULT, NodeMask::default()),
            Some(Policy::Local)
        );
        assert_eq!(Policy::from_mode(MPOL_PREFERRED, m), Some(Policy::Preferred(1)));
        assert_eq!(
            Policy::from_mode(MPOL_PREFERRED, NodeMask::default()),
            Some(Policy::Local)
        );
        assert_eq!(Policy::from_mode(MPOL_BIND, m), Some(Policy::Bind(m)));
        assert_eq!(Policy::from_mode(MPOL_INTERLEAVE, m), Some(Policy::Interleave(m)));
        assert_eq!(Policy::from_mode(99, m), None);
    }

    #[test]
    fn interleave_goes_per_page_or_per_huge_page_from_the_mapping_offset() {
        let base = 0x7f00_0000_0000usize;
        let pgoff = (base >> 12) as u64;
        let pages: Vec<u64> = (0..4)
            .map(|i| interleave_index(base + i * 4096, 0, base, pgoff))
            .collect();
        assert_eq!(pages.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>(), [1, 1, 1]);
        // Huge pages: one index per 2 MiB; 4 KiB pages inside one share it.
        let h = |a: usize| interleave_index(a, 9, base, pgoff);
        assert_eq!(h(base), h(base + (2 << 20) - 4096));
        assert_eq!(h(base + (2 << 20)), h(base) + 1);
        // A mapping moved by mremap keeps its offset: the same page, the same index.
        let moved = 0x5500_0000_0000usize;
        assert_eq!(interleave_index(moved + 4096, 0, moved, pgoff), pages[1]);
    }

    /// A clock the test moves.
    #[derive(Default)]
    struct FakeClock(Cell<u64>);
    impl Clock for FakeClock {
        fn now_ns(&self) -> u64 {
            self.0.get()
        }
    }

    #[test]
    fn a_node_found_empty_is_skipped_per_ring_size_until_the_zap() {
        let z = ZoneCache::new(4, FakeClock::default());
        let empty = Cell::new(vec![0u32]); // node 0's huge ring is empty
        let has = |n: u32| !empty.take_and(|v| v.contains(&n));
        // First scan: node 0 tried, found empty and marked; node 1 gives the pages.
        let p = z.pick(RingKind::Huge, &[0, 1, 2], has);
        assert_eq!(
            p,
            Pick {
                node: Some(1),
                skipped: 0,
                found_empty: 1
            }
        );
        // Node 0 has pages again, but is skipped for the huge ring until the zap...
        empty.set(vec![]);
        let p = z.pick(RingKind::Huge, &[0, 1, 2], has);
        assert_eq!(
            p,
            Pick {
                node: Some(1),
                skipped: 1,
                found_empty: 0
            }
        );
        // ...and never for the 4 KiB ring, which nobody found empty.
        assert_eq!(z.pick(RingKind::Small, &[0, 1], has).node, Some(0));
        // 0.999 s later: still skipped. At one second: zapped, node 0 again.
        z.clock.0.set(ZAP_NS - 1);
        assert_eq!(z.pick(RingKind::Huge, &[0, 1], has).skipped, 1);
        z.clock.0.set(ZAP_NS);
        assert_eq!(
            z.pick(RingKind::Huge, &[0, 1], has),
            Pick {
                node: Some(0),
                skipped: 0,
                found_empty: 0
            }
        );
    }

    #[test]
    fn every_node_empty_leaves_the_choice_to_the_caller_and_marks_them_all() {
        let z = ZoneCache::new(130, FakeClock::default());
        let p = z.pick(RingKind::Small, &[129, 3, 64], |_| false);
        assert_eq!(
            p,
            Pick {
                node: None,
                skipped: 0,
                found_empty: 3
            }
        );
        assert!(z.is_marked(RingKind::Small, 129) && z.is_marked(RingKind::Small, 64));
        assert!(!z.is_marked(RingKind::Huge, 129));
        // Ids past the cache are never marked (and never skipped).
        z.mark(RingKind::Small, 999);
        assert!(!z.is_marked(RingKind::Small, 999));
    }

    /// `Cell<Vec>` helper: reads the vector through `f` and puts it back.
    trait TakeAnd<T> {
        fn take_and<R>(&self, f: impl FnOnce(&T) -> R) -> R;
    }
    impl<T: Default> TakeAnd<T> for Cell<T> {
        fn take_and<R>(&self, f: impl FnOnce(&T) -> R) -> R {
            let v = self.take();
            let r = f(&v);
            self.set(v);
            r
        }
    }
}
