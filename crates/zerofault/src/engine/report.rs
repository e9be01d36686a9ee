//! What the engine reports: its pools' levels, per node, its metadata, its counters, the
//! options and features it runs with.

use super::Engine;
use crate::options::Options;
use crate::pool::Pool;
use crate::stats::Snapshot;
use crate::sys::uffd::Features;
use std::sync::atomic::Ordering::*;

/// One node's pool, as [`Engine::node_pools`] reports it. Counts are pages, as the kernel's
/// per-node `numastat` counts allocations (pool pages only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodePool {
    /// The node's id.
    pub node: u32,
    /// Pages ready now.
    pub ready_pages: u64,
    /// Pages given to faults that wanted this node.
    pub hit: u64,
    /// Pages given to faults that wanted another node (it was full).
    pub miss: u64,
    /// Pages faults wanted from this node and got from another's pool.
    pub foreign: u64,
    /// Of the hits, pages an interleave policy sent here.
    pub interleave_hit: u64,
    /// A populate of this pool found the node full within the last second (either ring): the
    /// faults that want this node take the next node's pool when its ring is empty.
    pub low: bool,
}

impl Engine {
    /// Pages ready in the pool (every node's).
    ///
    /// # Context
    /// Any thread; atomics only.
    pub fn pool_pages(&self) -> u64 {
        self.shared.pools.iter().map(Pool::available).sum()
    }

    /// Pages the pools hold: ready, and recycled but not zeroed yet (every node's). At most
    /// the memory budget once the scrub looked (DESIGN.md, "The pool's memory budget").
    ///
    /// # Context
    /// Any thread; atomics only.
    pub fn pool_held_pages(&self) -> u64 {
        self.shared.pool_held()
    }

    /// Each node's pool, where there is one per node (empty on a one-node machine): its level
    /// and what it gave, for `zerofault bench`'s per-node line.
    ///
    /// # Context
    /// Any thread; atomics only.
    pub fn node_pools(&self) -> Vec<NodePool> {
        self.shared
            .pools
            .iter()
            .filter_map(|p| {
                Some(NodePool {
                    node: p.node?,
                    ready_pages: p.available(),
                    hit: p.counts.hit.load(Relaxed),
                    miss: p.counts.miss.load(Relaxed),
                    foreign: p.counts.foreign.load(Relaxed),
                    interleave_hit: p.counts.interleave_hit.load(Relaxed),
                    low: p.node_full(),
                })
            })
            .collect()
    }

    /// Bytes mapped for the page-state maps of the registered ranges (directories and leaves,
    /// see `memory/pagemap.rs`): proportional to what was touched, not to what was registered.
    ///
    /// # Context
    /// Any thread; takes the range table's read lock.
    pub fn metadata_bytes(&self) -> usize {
        let ranges = self.shared.ranges.ranges();
        ranges
            .iter()
            .map(|r| r.map.metadata_bytes() + r.pmds.metadata_bytes())
            .sum()
    }

    /// A snapshot of the counters. It includes every install that woke a thread before this
    /// call: an install wakes the faulting thread before the handler has counted it, so a
    /// snapshot taken while the handler is inside a message waits (at most 50 ms) for it.
    ///
    /// # Context
    /// Any thread but a handler; yields, at most 50 ms, while a handler is inside a message.
    pub fn stats(&self) -> Snapshot {
        let t0 = std::time::Instant::now();
        for bracket in self.shared.message_seq.iter() {
            let g = bracket.load(SeqCst);
            if g % 2 == 1 {
                while bracket.load(SeqCst) == g
                    && !self.shared.failed.load(Acquire)
                    && t0.elapsed() < std::time::Duration::from_millis(50)
                {
                    std::thread::yield_now();
                }
            }
        }
        self.shared.stats.snapshot()
    }

    /// The options the engine runs with.
    ///
    /// # Context
    /// Any thread.
    pub fn options(&self) -> &Options {
        &self.shared.opts
    }

    /// Whether the machine-wide state is shared with this user's other processes, or why not
    /// (`crate::pool::machine`).
    ///
    /// # Context
    /// Any thread; no lock.
    pub fn machine_state(&self) -> Result<(), String> {
        match &self.shared.machine_refused {
            None if self.shared.machine.is_shared() => Ok(()),
            None => Err("not opened".into()),
            Some(why) => Err(why.clone()),
        }
    }

    /// The userfaultfd features in use.
    ///
    /// # Context
    /// Any thread.
    pub fn features(&self) -> Features {
        self.shared.features
    }
}
