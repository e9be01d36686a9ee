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
//! Where more than one node has memory, the engine keeps one pool per such node ([`Nodes`]):
//! its rings bound to the node, its scrub thread on the node's CPUs. A fault's pages come from
//! the pool of the first node of its [`Choice`]; when that ring is empty and the node is full
//! (its scrub's last populate got another node's pages: the kernel fell back, its zones below
//! their watermarks), from the next node's, as the kernel falls back. A ring that is empty while its node still has memory
//! is no reason to go remote: the kernel would allocate there, and so does the handler (a copy,
//! or a huge page of its own, with its thread policy preferring that node).
//!
//! # Context
//! The handlers choose (`Nodes::order_into`, `pool_of`, `ZoneCache::pick`, which marks); a
//! program thread recycling pages asks `pool_of`. Everything here is built once at the engine's
//! start and read after without a lock: the marks are atomics, nothing sleeps or allocates on
//! those paths.

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
    ///
    /// # Context
    /// Any thread; arithmetic only.
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
///
/// # Context
/// Any thread; arithmetic only.
pub(crate) fn interleave_index(addr: usize, order: u32, vm_start: usize, pgoff: u64) -> u64 {
    (pgoff + ((addr - vm_start) >> 12) as u64) >> order
}

/// The node an interleave over `mask` gives the page (`order` 0) or huge page (`order` 9) at
/// `addr`, for a mapping that was never moved: its offset is its address in pages, so the
/// index is the address's ([`interleave_index`] from 0). A mapping moved by `mremap` keeps the
/// offset of where it was, which the handler does not read (it would take `/proc/self/maps`):
/// there pool pages alternate from a different start than the kernel's would.
///
/// # Context
/// Any thread; arithmetic only.
pub(crate) fn interleave_node(mask: &NodeMask, addr: usize, order: u32) -> Option<u32> {
    mask.nth(interleave_index(addr, order, 0, 0) % u64::from(mask.weight().max(1)))
}

/// The nodes to take a fault's pages from, in the order to try them: the whole order as the
/// tests check it (the handler fills its own buffer with [`Nodes::order_into`], and takes an
/// interleave's per page with [`interleave_node`]).
#[cfg(test)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Choice {
    /// The node the kernel would allocate on, then its fallbacks.
    pub(crate) order: Vec<u32>,
    /// The first node was picked by interleaving (for the `interleave_hit` counter).
    pub(crate) interleaved: bool,
}

#[cfg(test)]
impl Choice {
    /// The order for `policy`, a fault by a thread on node `local`, with interleave index
    /// `ilx` (see [`interleave_index`]; unused by other policies).
    ///
    /// # Context
    /// A handler; arithmetic only.
    pub(crate) fn of(t: &Topology, policy: Policy, local: u32, ilx: u64) -> Choice {
        let nodes = Nodes::new(t.clone(), Policy::Local);
        let near = |from: u32| t.by_distance(from);
        let (order, interleaved) = match policy {
            Policy::Interleave(m) => {
                let w = u64::from(m.weight());
                match m.nth(ilx % w.max(1)) {
                    // The interleave node first, then its fallbacks (the kernel's interleave
                    // allocation falls back through that node's zonelist).
                    Some(n) => (near(n), true),
                    None => (near(local), false),
                }
            }
            p => {
                let mut v = Vec::new();
                nodes.order_into(p, local, &mut v);
                (v, false)
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

/// A node's ring, as a scan finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Avail {
    /// Pages are ready: take them.
    Pages,
    /// Empty, but the node has memory: the kernel would allocate there, so the scan stops and
    /// the caller makes the pages on this node itself. Not marked.
    Empty,
    /// Empty, and the node is short of memory (seed 001's full zone): marked, and the scan goes
    /// on to the next node.
    Full,
}

/// What a scan found: the node to take pages from (`None`: every node tried was marked or
/// full, or the scan stopped at an empty one), the nodes skipped for their marks, and the
/// nodes found full (and marked) on the way.
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
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
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
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn is_marked(&self, kind: RingKind, node: u32) -> bool {
        self.maybe_zap();
        self.word(kind, node)
            .is_some_and(|w| w.load(Acquire) & (1 << (node % 64)) != 0)
    }

    /// Marks `node`'s ring of `kind` empty.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn mark(&self, kind: RingKind, node: u32) {
        if let Some(w) = self.word(kind, node) {
            w.fetch_or(1 << (node % 64), AcqRel);
        }
    }

    /// Scans `order` for a node whose ring of `kind` has pages (`avail`), skipping nodes
    /// marked full, marking those found full, and stopping at one found empty.
    ///
    /// # Context
    /// A handler, choosing the pool of a window's pages; no lock, no sleep.
    pub(crate) fn pick(&self, kind: RingKind, order: &[u32], avail: impl Fn(u32) -> Avail) -> Pick {
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
            match avail(n) {
                Avail::Pages => {
                    p.node = Some(n);
                    return p;
                }
                Avail::Empty => return p,
                Avail::Full => {
                    self.mark(kind, n);
                    p.found_empty += 1;
                }
            }
        }
        p
    }
}

/// The NUMA view of an engine on a machine where more than one node has memory.
#[derive(Debug)]
pub(crate) struct Nodes {
    pub(crate) topology: Topology,
    /// By node id: the nodes with memory, nearest first ([`Topology::by_distance`]).
    near: Vec<Vec<u32>>,
    /// By node id: its pool's index in `Shared::pools` (nodes with memory have one).
    pool_of: Vec<Option<usize>>,
    /// Nodes whose rings were recently found full, per ring kind.
    pub(crate) zlc: ZoneCache,
    /// The policy of the program thread that started the engine, which its handler threads
    /// inherited: what the kernel applies to a fault in a mapping with no policy of its own
    /// (`numactl --membind`, `--interleave`). A thread that later sets its own policy is not
    /// seen (only it can read it).
    pub(crate) policy: Policy,
}

impl Nodes {
    /// The view of `topology`, with `policy` the starting thread's.
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn new(topology: Topology, policy: Policy) -> Nodes {
        let top = topology.nodes.iter().map(|n| n.id as usize + 1).max().unwrap_or(1);
        let mut near = vec![Vec::new(); top];
        let mut pool_of = vec![None; top];
        for n in &topology.nodes {
            near[n.id as usize] = topology.by_distance(n.id);
        }
        for (i, id) in topology
            .nodes
            .iter()
            .filter(|n| n.mem_total > 0)
            .map(|n| n.id)
            .enumerate()
        {
            pool_of[id as usize] = Some(i);
        }
        Nodes {
            zlc: ZoneCache::new(top, Monotonic),
            topology,
            near,
            pool_of,
            policy,
        }
    }

    /// The nodes that get a pool, in pool order.
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn pool_nodes(&self) -> impl Iterator<Item = u32> + '_ {
        self.topology.nodes.iter().filter(|n| n.mem_total > 0).map(|n| n.id)
    }

    /// The index of node `id`'s pool.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn pool_of(&self, id: u32) -> Option<usize> {
        self.pool_of.get(id as usize).copied().flatten()
    }

    /// The nodes to try for `policy` (an interleave's are per page: [`interleave_node`], then
    /// [`Nodes::near`] of that node) for a thread on node `local`, into `out`, in the kernel's
    /// order: the nearest node first, ties by id. No allocation once `out` has room for every
    /// node (the handler's buffer, on its serving path).
    ///
    /// # Context
    /// A handler, on a fault of a range with a policy it has not seen; no lock, no sleep.
    pub(crate) fn order_into(&self, policy: Policy, local: u32, out: &mut Vec<u32>) {
        out.clear();
        let near = self.near(local);
        match policy {
            Policy::Local | Policy::Interleave(_) => out.extend_from_slice(near),
            Policy::Preferred(n) => out.extend_from_slice(self.near(n)),
            Policy::PreferredMany(m) => {
                out.extend(near.iter().filter(|n| m.contains(**n)));
                out.extend(near.iter().filter(|n| !m.contains(**n)));
            }
            Policy::Bind(m) => out.extend(near.iter().filter(|n| m.contains(**n))),
        }
    }

    /// The nodes with memory nearest to `id` first (empty for an unknown id).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn near(&self, id: u32) -> &[u32] {
        self.near.get(id as usize).map_or(&[], Vec::as_slice)
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
        // The node: per page over nodes {1, 3}, per huge page likewise.
        let m = NodeMask::of([1, 3]);
        let per_page: Vec<_> = (0..4).map(|i| interleave_node(&m, base + i * 4096, 0)).collect();
        assert_eq!(per_page, [Some(1), Some(3), Some(1), Some(3)]);
        assert_eq!(interleave_node(&m, base + 4096, 9), interleave_node(&m, base, 9));
        assert_ne!(interleave_node(&m, base + (2 << 20), 9), interleave_node(&m, base, 9));
        assert_eq!(interleave_node(&NodeMask::default(), base, 0), None);
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
        let has = |n: u32| {
            if empty.take_and(|v| v.contains(&n)) {
                Avail::Full
            } else {
                Avail::Pages
            }
        };
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
        let p = z.pick(RingKind::Small, &[129, 3, 64], |_| Avail::Full);
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

    #[test]
    fn an_empty_ring_on_a_node_with_memory_stops_the_scan_unmarked() {
        let z = ZoneCache::new(4, FakeClock::default());
        // Node 0 full, node 1 empty but with memory: node 0 marked, the scan stops at 1.
        let avail = |n: u32| if n == 0 { Avail::Full } else { Avail::Empty };
        assert_eq!(
            z.pick(RingKind::Small, &[0, 1, 2], avail),
            Pick {
                node: None,
                skipped: 0,
                found_empty: 1
            }
        );
        assert!(z.is_marked(RingKind::Small, 0) && !z.is_marked(RingKind::Small, 1));
    }

    #[test]
    fn the_engine_view_keeps_a_pool_per_node_with_memory_and_each_nodes_fallbacks() {
        let n = Nodes::new(four_nodes("view"), Policy::Local);
        assert_eq!(n.pool_nodes().collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!((n.pool_of(3), n.pool_of(4), n.pool_of(77)), (Some(3), None, None));
        assert_eq!(n.near(2), [2, 3, 0, 1]);
        assert_eq!(n.near(4), [0, 1, 2, 3], "the CPU-only node falls back by distance");
        assert!(n.near(77).is_empty());
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
