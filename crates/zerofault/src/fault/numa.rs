//! A handler's choice of pool for a fault's pages: the faulting thread's node, the kernel's
//! order of nodes for the range's policy ([`crate::memory::nodes`]), and the zonelist cache.

use super::{Handler, Kernel};
use crate::memory::nodes::{Avail, RingKind};
use crate::pool::{tried_bit, Pool, Ring};
use crate::stats::Stats;
use crate::Shared;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

/// Faulting threads whose node a handler keeps (see `Handler::choose_nodes`).
pub(super) const THREAD_NODES: usize = 64;
/// How long a thread's node is taken as known: a thread that moves to another node meanwhile
/// gets a window or two from the old one.
const NODE_TTL: Duration = Duration::from_millis(10);

/// Where an install takes pool pages from (see [`Handler::pool_for`]).
pub(crate) struct Source<'a> {
    /// The pool's index in `Shared::pools`.
    pub(crate) ix: usize,
    pub(crate) pool: &'a Pool,
    /// The index of the pool of the node the fault wanted first (`None` on one node).
    pub(crate) wanted: Option<usize>,
    /// The wanted node was picked by interleaving.
    pub(crate) interleaved: bool,
}

impl<'a, K: Kernel> Handler<'a, K> {
    /// With several NUMA nodes, works out where the pages of the fault at `addr` by thread
    /// `tid` come from, in the kernel's order (`memory/nodes.rs`): the policy of the mapping
    /// (`get_mempolicy` on the address, cheap: read on every fault, so that a policy
    /// set by any means, a raw `mbind` system call too, is seen at once), else the policy the
    /// handler inherited from the thread that started the engine; and for the local policy the
    /// node of the CPU the thread faulted on. The first node becomes this handler's preferred
    /// one, so that the pages the kernel allocates for this fault's installs (copies, a
    /// populate of the staging area) come from there too (the mapping's own policy, when it has
    /// one, still comes first: the kernel applies it). One node: nothing is done.
    ///
    /// # Context
    /// A handler; may ask the kernel for the range's and the thread's policy (`get_mempolicy`); no
    /// lock.
    pub(crate) fn choose_nodes(&mut self, tid: u32, addr: usize) {
        let Some(n) = self.shared.numa.as_ref() else { return };
        // Reading the thread's CPU (open, read, close of its stat file) costs a good part of a
        // fault's round trip (docs/DESIGN.md, "NUMA nodes"): a thread's node is kept for
        // NODE_TTL.
        let now = Instant::now();
        let slot = &mut self.thread_nodes[tid as usize % THREAD_NODES];
        let local = match *slot {
            Some((id, node, at)) if id == tid && now.duration_since(at) < NODE_TTL => node,
            _ => {
                let node = crate::sys::numa::cpu_of_thread(tid).and_then(|c| n.topology.node_of_cpu(c));
                *slot = Some((tid, node, now));
                node
            }
        };
        // A thread whose CPU cannot be read: the first pool's node.
        let local = local.or_else(|| n.pool_nodes().next()).unwrap_or(0);
        let policy = match crate::sys::numa::policy_of(addr) {
            Ok((crate::sys::numa::MPOL_DEFAULT, _)) | Err(_) => n.policy,
            Ok((mode, mask)) => crate::memory::nodes::Policy::from_mode(mode, mask).unwrap_or(n.policy),
        };
        n.order_into(policy, local, &mut self.order);
        self.interleave = None;
        let first = match policy {
            crate::memory::nodes::Policy::Interleave(m) if !m.is_empty() => {
                self.interleave = Some(m);
                crate::memory::nodes::interleave_node(&m, addr, 9)
            }
            _ => self.order.first().copied(),
        };
        self.home = first.and_then(|f| n.pool_of(f));
        self.prefer_node(first);
    }

    /// Makes `node` this handler thread's preferred node, where it may steer. A node the
    /// kernel refuses (outside the cpuset) leaves the policy as it was; it is asked again on
    /// the next fault that wants it.
    ///
    /// # Context
    /// A handler; sets its own thread's memory policy (`set_mempolicy`).
    pub(crate) fn prefer_node(&mut self, node: Option<u32>) {
        if !self.may_steer || node == self.preferred {
            return;
        }
        if crate::sys::numa::prefer(node).is_ok() {
            self.preferred = node;
            if node.is_some() {
                Stats::add(&self.stats().numa_steers, 1);
            }
        }
    }

    /// The first node wanted for a page at `addr` of ring `kind`, and the nodes to try after
    /// it: the fault's order, or under interleave the page's (huge page's) own node and its
    /// fallbacks.
    fn order_for(&self, kind: RingKind, addr: usize) -> (&[u32], bool) {
        let n = self.shared.numa.as_ref().expect("several nodes");
        match self.interleave {
            Some(m) => {
                let order = if kind == RingKind::Huge { 9 } else { 0 };
                match crate::memory::nodes::interleave_node(&m, addr, order) {
                    Some(first) => (n.near(first), true),
                    None => (&self.order, false),
                }
            }
            None => (&self.order, false),
        }
    }

    /// The pool to take pages for `addr` from (ring `kind`), skipping the pools whose bit is
    /// set in `tried` (found empty by this install already): one node, the pool unless tried;
    /// several, the first node of the order whose ring has pages, skipping nodes marked full
    /// in the last second (seed 001), marking those found full, and stopping (`None`: the
    /// handler makes the pages itself, on the wanted node) at an empty ring whose node still
    /// has memory.
    ///
    /// # Context
    /// A handler; atomics only.
    pub(crate) fn pool_for(&self, kind: RingKind, addr: usize, tried: u64) -> Option<Source<'a>> {
        let shared: &'a Shared = self.shared;
        let pools = &shared.pools;
        let Some(n) = shared.numa.as_ref().filter(|_| pools.len() > 1) else {
            return pools.first().filter(|_| tried & 1 == 0).map(|pool| Source {
                ix: 0,
                pool,
                wanted: None,
                interleaved: false,
            });
        };
        let (order, interleaved) = self.order_for(kind, addr);
        let pick = n.zlc.pick(kind, order, |node| {
            let Some(p) = n.pool_of(node).map(|i| (i, &pools[i])) else {
                return Avail::Full;
            };
            let ring = match kind {
                RingKind::Small => Some(&p.1.small),
                RingKind::Huge => p.1.huge.as_ref(),
            };
            if tried & tried_bit(p.0) == 0 && ring.is_some_and(|r| r.available() > 0) {
                Avail::Pages
            } else if ring.is_some_and(Ring::node_full) {
                Avail::Full
            } else {
                Avail::Empty
            }
        });
        let stats = self.stats();
        Stats::add(&stats.zlc_skips, u64::from(pick.skipped));
        Stats::add(&stats.zlc_marks, u64::from(pick.found_empty));
        let ix = n.pool_of(pick.node?)?;
        Some(Source {
            ix,
            pool: &pools[ix],
            wanted: order.first().and_then(|&f| n.pool_of(f)),
            interleaved,
        })
    }

    /// The pool of the node this fault wants first (the only pool on one node): the one whose
    /// scrub is asked to refill, and whose level says how far a window ahead may reach.
    ///
    /// # Context
    /// A handler; atomics only.
    pub(crate) fn home_pool(&self) -> Option<&'a Pool> {
        let shared: &'a Shared = self.shared;
        self.home
            .and_then(|i| shared.pools.get(i))
            .or_else(|| shared.pools.first())
    }

    /// Counts `pages` taken from `src` (several nodes only), as the kernel counts a node's
    /// allocations.
    ///
    /// # Context
    /// A handler; atomics only.
    pub(crate) fn count_taken(&self, src: &Source<'a>, pages: u64) {
        let Some(wanted) = src.wanted.filter(|_| pages > 0) else {
            return;
        };
        let stats = self.stats();
        let c = &src.pool.counts;
        if wanted == src.ix {
            c.hit.fetch_add(pages, Relaxed);
            Stats::add(&stats.numa_hit, pages);
            if src.interleaved {
                c.interleave_hit.fetch_add(pages, Relaxed);
                Stats::add(&stats.interleave_hit, pages);
            }
        } else {
            c.miss.fetch_add(pages, Relaxed);
            self.shared.pools[wanted].counts.foreign.fetch_add(pages, Relaxed);
            Stats::add(&stats.numa_miss, pages);
        }
    }
}
