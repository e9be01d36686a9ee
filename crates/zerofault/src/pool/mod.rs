//! The pre-zeroed page pool (seeds 002/003): pages allocated and zeroed ahead of need, handed to
//! the fault handler in contiguous runs and moved (not copied) into the faulting region.
//!
//! ## Shape
//! Two rings ([`Ring`]), each over one reserved anonymous area (2 MiB aligned, `MADV_DONTFORK`):
//! - **small**: 4 KiB pages (`MADV_NOHUGEPAGE`), for the parts of windows that do not cover a
//!   whole 2 MiB-aligned PMD (a stream's first small windows, the edges, single-page misses).
//!   Moving a 4 KiB page out of a PMD-mapped huge page would split it (most of a
//!   millisecond), so these are never huge.
//! - **huge** (`pool_thp`, where the system's THP is not `never`): 2 MiB chunks populated under
//!   `MADV_HUGEPAGE`, so each is one transparent huge page. A chunk is moved whole into an
//!   empty, PMD-aligned destination: one ioctl re-points one PMD instead of 512 PTEs, and the
//!   kernel prepares one huge page faster than 512 small ones (docs/DESIGN.md has the
//!   figures). Runs from this ring are whole chunks.
//!
//! The small ring is a quarter of `pool_max` ([`small_bytes`]); the huge ring has the rest.
//! Watermarks count both; the scrub fills whichever ring is emptier for its size.
//!
//! Where several NUMA nodes have memory there is one pool per node ([`Pool::node`]), its rings
//! bound to it and every populate checked to have landed there ([`Ring::fill_step`]); see
//! `memory/nodes.rs` for which pool a fault takes from.
//!
//! ## A ring
//! Two monotonic counters index it, in pages:
//! - `tail`: pages populated so far. Only the producer (the scrub thread, or a prefill, one at a
//!   time under `fill_lock`) advances it, after `MADV_POPULATE_WRITE` has made the pages
//!   present and zero.
//! - `head`: pages handed out so far. Consumers (fault handlers) advance it with a CAS.
//!
//! `tail - head` pages are ready. A consumer takes a run `[head, head + n)`, never crossing the
//! ring's end, so a run is contiguous in memory and moves with one ioctl. The pages it moves
//! leave holes behind; the producer populates the holes again when `tail` comes round. In the
//! huge ring both counters move by whole chunks (512 pages).
//!
//! ## Registered, for moves only
//! Every ring is registered with the engine's userfaultfd in write-protect mode, which reports
//! no fault (the engine write-protects nothing): the scrub's populate and its writes are the
//! kernel's as before, and UFFDIO_MOVE, which wants its destination registered, may move pages
//! into the rings: recycled pages into the dirty rings, zeroed ones from there into the clean
//! rings (`recycle.rs`). Missing-page mode would send the scrub's own populate to the handler.
//!
//! `MADV_DONTFORK`: a child would share the pool pages copy-on-write, and shared pages cannot be
//! moved (EBUSY) until written again; the child does not need the pool at all.
//!
//! ## Orderings
//! `tail` is stored with Release after the populate syscall returned, and loaded with Acquire
//! by consumers, so a consumer that sees a page as ready runs its move after the populate.
//! `head` moves by CAS (AcqRel): the producer loads it with Acquire before reusing ring slots,
//! so it never repopulates a slot before its consumer took it. Took, not finished with: a
//! consumer still moving a run out when the producer comes round to it (a whole ring later)
//! overlaps the populate, which changes nothing on a present page; a page moved out after it
//! leaves a hole, which the next taker skips (ENOENT, told from a gone destination by
//! mincore). The loom models (`loom_tests`) check one round of the ring: pages
//! populated before they are taken, each taken once, given back only where nobody took after;
//! and a give-back racing a producer that came round (see `RingIndex::untake`).

pub(crate) mod budget;
mod dirty;
pub(crate) mod machine;
pub(crate) mod recycle;
mod ring;
pub(crate) mod scrub;
mod share;
pub(crate) mod zero;

use crate::page::{bytes, pages, pmd_start, PMD_PAGES, PMD_SIZE};
use crate::pool::recycle::{Batch, DirtyRing};
use crate::stats::Stats;
use crate::sync::AtomicU64;
use crate::sys::uffd::Uffd;
use std::io;
use std::sync::atomic::Ordering::*;
use std::sync::Mutex;

use ring::fill_loop;
pub(crate) use ring::FillError;
pub(crate) use ring::{map_ring, Ring};

/// The bit of pool `ix` in a mask of pools (an install's pools found empty, a recycle's
/// rings closed) (pools from the 64th on share the last bit: one of them found empty makes the install skip them all).
///
/// # Context
/// Any thread; arithmetic only.
pub(crate) fn tried_bit(ix: usize) -> u64 {
    1 << ix.min(63)
}

/// The small ring's share of `pool_max`: a quarter, at least 2 MiB (never more than
/// `pool_max`). A full window of 2048 pages covers four PMDs, and the one its fault landed in
/// holds a page table already (the kernel made it before queueing the fault), so a quarter of
/// a sequential writer's pages are 4 KiB pages.
///
/// # Context
/// Any thread; arithmetic only.
pub(crate) fn small_bytes(pool_max: usize) -> usize {
    pmd_start(pool_max / 4).max(PMD_SIZE).min(pool_max.max(PMD_SIZE))
}

/// What a node's pool gave, in pages, as the kernel counts its allocations per node
/// (`/sys/devices/system/node/node<N>/numastat`): pool pages only (a copy's or a staged huge
/// page's node is the kernel's to count).
#[derive(Debug, Default)]
pub(crate) struct NodeCounts {
    /// Pages from this node's pool for a fault that wanted this node.
    pub(crate) hit: std::sync::atomic::AtomicU64,
    /// Pages from this node's pool for a fault that wanted another node (that node was full).
    pub(crate) miss: std::sync::atomic::AtomicU64,
    /// Pages a fault wanted from this node and took from another's pool.
    pub(crate) foreign: std::sync::atomic::AtomicU64,
    /// Of the hits, pages an interleave policy sent here.
    pub(crate) interleave_hit: std::sync::atomic::AtomicU64,
}

/// The two rings, and the pool-wide view the scrub thread and the watermarks use; with
/// recycling, a dirty ring beside each (`recycle.rs`). One per node with memory where there are
/// several (`memory/nodes.rs`), else one for the machine.
#[derive(Debug)]
pub(crate) struct Pool {
    /// The node whose memory the rings are bound to (`mbind`, preferred), and whose CPUs its
    /// scrub thread runs on; `None` on a one-node machine (nothing is bound).
    pub node: Option<u32>,
    /// How the handlers and the engine wake this pool's scrub thread.
    pub(crate) scrub: crate::pool::scrub::ScrubCtl,
    pub(crate) counts: NodeCounts,
    pub small: Ring,
    pub huge: Option<Ring>,
    /// Recycled 4 KiB pages waiting to be zeroed into `small`.
    pub dirty_small: Option<DirtyRing>,
    /// Recycled huge pages waiting to be zeroed into `huge`.
    pub dirty_huge: Option<DirtyRing>,
    /// `pool_max` in pages: the most the pool holds, ready and dirty.
    limit: u64,
    /// The small ring's share of `limit` ([`small_bytes`]), in pages: what the scrub's refill
    /// and the purge aim at for it; the huge ring's share is the rest.
    small_share: u64,
    /// Held by the scrub for each step that touches ring memory (a dirty batch zeroed and
    /// moved, a purge), and by whoever changes the rings under it ([`Pool::release_all`], the
    /// protection around the program's mlockall), so that neither runs in the middle of the
    /// other: a dirty batch released while the scrub zeroes it would be refilled by a
    /// recycler and moved on unzeroed. Taken before a ring's own locks.
    pub(crate) work: Mutex<()>,
    /// The rings are `PROT_NONE` (the program's mlockall): the scrub leaves them alone.
    pub(crate) protected: std::sync::atomic::AtomicBool,
    /// Huge pages the handler wanted from the huge ring and found it empty for, not yet made
    /// up by the scrub (capped at the huge ring's share): the demand that lets the scrub
    /// trade recycled 4 KiB pages for huge ones (`scrub.rs`, step 1).
    huge_missed: AtomicU64,
}

impl Pool {
    /// A pool of `bytes` in all: the small ring's share ([`small_bytes`]) and, with `huge`,
    /// the rest as the huge ring (when there is a rest of at least one chunk). With `recycle`,
    /// every ring, and a dirty ring beside each, can hold all of `bytes` (address space only,
    /// until pages come): what comes back from the program is 4 KiB or huge pages in whatever
    /// mix it freed; the pool-wide limit stays `bytes`.
    /// `node`: bind the clean rings to it ([`Ring::bind`]).
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn new(bytes: usize, huge: bool, recycle: bool, node: Option<u32>) -> io::Result<Pool> {
        let bytes = bytes.max(PMD_SIZE).next_multiple_of(PMD_SIZE);
        let small = if huge { small_bytes(bytes) } else { bytes };
        let has_huge = huge && bytes > small;
        let ring_bytes = |share: usize| if recycle { bytes } else { share };
        let huge_ring = if has_huge {
            Some(Ring::new(ring_bytes(bytes - small), true)?)
        } else {
            None
        };
        let dirty = |r: &Ring| DirtyRing::new(bytes_of(r), r.index.unit > 1);
        let mut small_ring = Ring::new(ring_bytes(small), false)?;
        let mut huge_ring = huge_ring;
        if let Some(n) = node {
            small_ring.bind(n)?;
            if let Some(h) = huge_ring.as_mut() {
                h.bind(n)?;
            }
        }
        Ok(Pool {
            node,
            scrub: crate::pool::scrub::ScrubCtl::default(),
            counts: NodeCounts::default(),
            dirty_small: recycle.then(|| dirty(&small_ring)).transpose()?,
            dirty_huge: huge_ring.as_ref().filter(|_| recycle).map(dirty).transpose()?,
            small: small_ring,
            huge: huge_ring,
            limit: pages(bytes),
            small_share: if has_huge { pages(small) } else { pages(bytes) },
            work: Mutex::new(()),
            protected: std::sync::atomic::AtomicBool::new(false),
            huge_missed: AtomicU64::new(0),
        })
    }

    /// The scrub's permission for one step (see [`Pool::work`]): `None` while the rings are
    /// protected or `paused` says the pool is paused.
    ///
    /// # Context
    /// The scrub thread. Takes the pool's work lock for one step (zeroing, filling, purging), which
    /// a pause or drop waits for.
    pub(crate) fn step(&self, paused: &std::sync::atomic::AtomicBool) -> Option<std::sync::MutexGuard<'_, ()>> {
        let g = self.work.lock().unwrap_or_else(|e| e.into_inner());
        (!self.protected.load(Acquire) && !paused.load(Acquire)).then_some(g)
    }

    /// Undoes [`Pool::register`] (every ring; unregistering a range that is not registered
    /// is harmless): before the rings are unmapped while the descriptor is open with no
    /// handler to read the UNMAP events their munmap would wait for.
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`), on its failure path; takes no
    /// lock; the unregister ioctl takes the kernel's mmap lock.
    pub(crate) fn unregister(&self, uffd: &Uffd) {
        for (a, l) in self.areas() {
            let _ = uffd.unregister(a, l);
        }
    }

    /// The share of `limit` the scrub's refill and the purge aim at for `ring` (one of ours).
    ///
    /// # Context
    /// The scrub thread.
    pub(crate) fn share(&self, ring: &Ring) -> u64 {
        if std::ptr::eq(ring, &self.small) {
            self.small_share
        } else {
            self.limit - self.small_share
        }
    }

    /// How full `ring` is for its share (0 empty, 1 at its share): refills and the scrub's
    /// zeroing serve the emptier ring first.
    fn fullness(&self, ring: &Ring) -> f64 {
        ring.available() as f64 / self.share(ring).max(1) as f64
    }

    /// Pages the pool may still take in, ready or dirty, before it holds `pool_max`.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn room(&self) -> u64 {
        self.limit.saturating_sub(self.available() + self.dirty())
    }

    /// Every ring's area, clean and dirty, as (address, length).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn areas(&self) -> Vec<(usize, usize)> {
        let mut v: Vec<_> = Some(&self.small)
            .into_iter()
            .chain(&self.huge)
            .filter(|r| !r.is_gone())
            .map(Ring::area)
            .collect();
        v.extend(
            [&self.dirty_small, &self.dirty_huge]
                .into_iter()
                .flatten()
                .filter(|d| !d.is_gone())
                .map(DirtyRing::area),
        );
        v
    }

    /// Registers every ring with `uffd` as a move destination (see the module's docs).
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn register(&self, uffd: &Uffd) -> io::Result<()> {
        for (a, l) in self.areas() {
            uffd.register_as_destination(a, l)?;
        }
        Ok(())
    }

    /// Whether freed pages can come back through this pool.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn recycles(&self) -> bool {
        self.dirty_small.is_some()
    }

    /// The handler found the huge ring empty for `n` huge pages it wanted: demand, in huge
    /// pages (at most the huge ring's share), until a trade or a recycled huge page meets it.
    ///
    /// # Context
    /// A handler; atomics only.
    pub(crate) fn note_huge_missed(&self, n: u64) {
        let cap = (self.limit - self.small_share) / PMD_PAGES;
        let _ = self
            .huge_missed
            .fetch_update(Relaxed, Relaxed, |m| Some(m.saturating_add(n).min(cap)));
    }

    /// `n` recycled huge pages reached the clean ring: they meet as much of the demand.
    ///
    /// # Context
    /// The scrub thread. Atomics only.
    pub(crate) fn huge_demand_met(&self, n: u64) {
        let _ = self
            .huge_missed
            .fetch_update(Relaxed, Relaxed, |m| Some(m.saturating_sub(n)));
    }

    /// The demand that huge pages already on their way back (recycled, waiting in the dirty
    /// huge ring) will not meet. A miss they will meet means the scrub is behind, not that the
    /// pool lacks huge pages, and trading 4 KiB pages for more would populate (and later purge)
    /// what comes back anyway (seed 003's loop spent more CPU in runs with such trades:
    /// docs/DESIGN.md, "Recycling freed pages"). The backlog is set against the demand as a whole, not against each
    /// miss: many small misses add up.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn unmet_huge_demand(&self) -> u64 {
        let coming = self.dirty_huge.as_ref().map_or(0, |d| d.pending() / PMD_PAGES);
        self.huge_missed.load(Relaxed).saturating_sub(coming)
    }

    /// Takes one unit of the huge-page demand [`Pool::note_huge_missed`] counted: whether
    /// there was any.
    ///
    /// # Context
    /// The scrub thread. Atomics only.
    pub(crate) fn take_huge_missed(&self) -> bool {
        self.huge_missed
            .fetch_update(Relaxed, Relaxed, |m| m.checked_sub(1))
            .is_ok()
    }

    /// Forgets the huge-page demand (the scrub could not make huge pages).
    ///
    /// # Context
    /// The scrub thread. Atomics only.
    pub(crate) fn clear_huge_missed(&self) {
        self.huge_missed.store(0, Relaxed);
    }

    /// Whether a dirty 4 KiB batch is better traded for a huge page than zeroed into the small
    /// ring: the handler went without huge pages, the huge ring is below its share, and the
    /// small ring holds its share already, and `margin` pages more (one largest window: a
    /// window's edges are 4 KiB pages beyond a quarter of it).
    ///
    /// # Context
    /// The scrub thread. Atomics only.
    pub(crate) fn wants_trade(&self, margin: u64) -> bool {
        let Some(huge) = &self.huge else { return false };
        self.unmet_huge_demand() > 0
            && huge.available() + PMD_PAGES <= self.share(huge)
            && self.small.available() >= self.small_share + margin
    }

    /// The scrub's next dirty batch: of the (dirty, clean) ring pairs (0: huge, 1: small) not
    /// `done` this round and with a batch waiting, the one whose clean ring is emptiest for its
    /// share (ties: huge first), as (pair, dirty ring, clean ring, batch). A program that frees
    /// and at once allocates again wants both sizes from the start: zeroing every huge page
    /// before any 4 KiB one left the small ring empty for the first tens of milliseconds of
    /// each round of seed 003's loop, and its 4 KiB faults were copies (docs/DESIGN.md,
    /// "Recycling freed pages").
    ///
    /// # Context
    /// The scrub thread. Lock-free.
    pub(crate) fn next_dirty(&self, done: [bool; 2]) -> Option<(usize, &DirtyRing, &Ring, Batch)> {
        let pairs = [
            self.dirty_huge.as_ref().zip(self.huge.as_ref()),
            self.dirty_small.as_ref().zip(Some(&self.small)),
        ];
        pairs
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !done[*i])
            .filter_map(|(i, p)| p.and_then(|(d, c)| Some((i, d, c, d.peek()?))))
            .min_by(|x, y| self.fullness(x.2).total_cmp(&self.fullness(y.2)))
    }

    /// Recycled pages waiting to be zeroed.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn dirty(&self) -> u64 {
        self.dirty_small.as_ref().map_or(0, DirtyRing::pending) + self.dirty_huge.as_ref().map_or(0, DirtyRing::pending)
    }

    /// Pages handed out so far from both rings (a monotonic count but for give-backs): the
    /// scrub's sign that nobody took pages for a while.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn taken(&self) -> u64 {
        self.small.index.head.0.load(Relaxed) + self.huge.as_ref().map_or(0, |h| h.index.head.0.load(Relaxed))
    }

    /// Pages ready in both rings.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn available(&self) -> u64 {
        self.small.available() + self.huge.as_ref().map_or(0, Ring::available)
    }

    /// Pages the pool holds at most (`pool_max`).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn capacity(&self) -> u64 {
        self.limit
    }

    /// Producer step: one chunk into the ring that is emptier for its share (the small one on a
    /// tie), or into the other when that one is full. Returns the pages added; 0 when both are
    /// full (or `max_pages` is under a huge chunk and the small ring is full). Without
    /// `huge_too`, the small ring only (see `Shared::huge_wanted`).
    ///
    /// # Context
    /// The scrub thread, or a program thread's prefill. Takes the ring's fill lock (one producer at
    /// a time); the populate allocates pages and may sleep (reclaim, the mmap lock).
    pub(crate) fn fill_step(&self, max_pages: u64, huge_too: bool, stats: &Stats) -> Result<u64, FillError> {
        if self.room() == 0 {
            return Ok(0);
        }
        let Some(huge) = self.huge.as_ref().filter(|_| huge_too) else {
            return self.small.fill_step(max_pages, stats);
        };
        let (first, second) = if self.fullness(&self.small) <= self.fullness(huge) {
            (&self.small, huge)
        } else {
            (huge, &self.small)
        };
        match first.fill_step(max_pages, stats) {
            Ok(0) => second.fill_step(max_pages, stats),
            // A node found full for one ring (no huge page there, say) may have pages for the
            // other.
            Err(FillError::NodeFull) if self.node.is_some() => match second.fill_step(max_pages, stats) {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(FillError::NodeFull),
            },
            r => r,
        }
    }

    /// Whether either ring's node was found full lately ([`Ring::node_full`]).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn node_full(&self) -> bool {
        self.small.node_full() || self.huge.as_ref().is_some_and(Ring::node_full)
    }

    /// Populates until `target` pages are ready in all (capped at capacity), on the calling
    /// thread.
    ///
    /// # Context
    /// A program thread (`Engine::prefill`), as [`Pool::fill_step`].
    pub(crate) fn fill_to(&self, target: u64, stats: &Stats, stop: impl Fn() -> bool) -> Result<(), FillError> {
        fill_loop(
            target.min(self.capacity()),
            stop,
            || self.available(),
            |n| self.fill_step(n, true, stats),
        )
    }

    /// Frees every pool page, clean and dirty, between two steps of the scrub.
    ///
    /// # Context
    /// Any thread (pause, drop, `mlockall`, stepping aside); takes the pool's work lock, then each
    /// ring's fill or put lock.
    pub(crate) fn release_all(&self) {
        let _work = self.work.lock().unwrap_or_else(|e| e.into_inner());
        if self.small.is_gone() {
            return;
        }
        self.small.release_all();
        if let Some(h) = &self.huge {
            h.release_all();
        }
        for d in [&self.dirty_small, &self.dirty_huge].into_iter().flatten() {
            d.release_all();
        }
    }

    /// Unmaps every ring for good, its pages with it ([`Ring::retire`]): the engine gives its
    /// mappings back (`Engine::give_back`). The pool is empty from then on and
    /// [`Pool::areas`] names nothing.
    ///
    /// # Context
    /// A program thread, with the engine's threads stopped and the descriptor closed (no move
    /// into a ring can start); takes the pool's work lock, then each ring's lock.
    pub(crate) fn retire(&self) {
        let _work = self.work.lock().unwrap_or_else(|e| e.into_inner());
        for d in [&self.dirty_small, &self.dirty_huge].into_iter().flatten() {
            d.retire();
        }
        if let Some(h) = &self.huge {
            h.retire();
        }
        // The small ring last: `areas` and `release_all` read it as the pool's.
        self.small.retire();
    }
}

/// A ring's capacity in bytes.
fn bytes_of(r: &Ring) -> usize {
    bytes(r.capacity())
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "test data patterns"
)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_fills_the_emptier_ring_and_counts_both() {
        let stats = Stats::default();
        let p = Pool::new(64 << 20, true, false, None).unwrap();
        let huge = p.huge.as_ref().unwrap();
        assert_eq!(p.small.capacity(), 4096, "a quarter of 64 MiB");
        assert_eq!(huge.capacity(), 12288);
        assert_eq!(p.capacity(), 16384);
        // 2 MiB steps: small (tie), huge (small is 1/8 full, huge 0), huge (1/24 < 1/8), ...
        p.fill_to(4 * 512, &stats, || false).unwrap();
        assert_eq!((p.small.available(), huge.available()), (512, 1536));
        p.fill_to(p.capacity(), &stats, || false).unwrap();
        assert_eq!((p.small.available(), huge.available()), (4096, 12288));
        assert_eq!(p.available(), 16384);
        p.release_all();
        assert_eq!(p.available(), 0);

        assert!(Pool::new(64 << 20, false, false, None).unwrap().huge.is_none());
        let tiny = Pool::new(PMD_SIZE, true, false, None).unwrap();
        assert!(tiny.huge.is_none(), "no room for a huge ring");
        assert_eq!(small_bytes(1 << 30), 256 << 20);
        assert_eq!(small_bytes(4 << 20), 2 << 20);
        assert_eq!(small_bytes(10 << 20), 2 << 20, "whole chunks");
    }

    /// Recycles `n` pages (one huge page in the huge ring) into `d` as if the program gave them back (a fake move: nothing is
    /// mapped; the rings only count slots).
    fn put_dirty(d: &DirtyRing, n: u64) {
        let p = d.put(1 << 40, n, &mut |_, _, l| crate::sys::uffd::Progress {
            done: l,
            errno: None,
        });
        assert_eq!(p.moved, n);
    }

    /// Publishes `n` slots of `r` as ready without populating them (nothing reads them here).
    fn pretend_filled(r: &Ring, n: u64) {
        let mut got = 0;
        while got < n {
            got += r.fill_with(n - got, |_, n| Ok::<u64, FillError>(n)).unwrap();
        }
    }

    /// Catches a retired pool that still names its rings (an `mlockall` would then unlock, a
    /// drop unmap, memory the program mapped there since) or whose rings stay mapped.
    #[test]
    fn a_retired_pool_unmaps_its_rings_and_names_none() {
        let stats = Stats::default();
        let p = Pool::new(16 << 20, true, true, None).unwrap();
        p.fill_to(512, &stats, || false).unwrap();
        let areas = p.areas();
        assert_eq!(areas.len(), 4, "clean and dirty, small and huge");
        p.retire();
        assert!(p.areas().is_empty());
        assert_eq!(p.available(), 0);
        for (a, l) in areas {
            assert_eq!(
                crate::sys::mman::resident_pages(a, l).map_err(|e| e.raw_os_error()),
                Err(Some(libc::ENOMEM))
            );
        }
        assert!(
            matches!(p.small.fill_step(512, &stats), Ok(0)),
            "a retired ring takes no page"
        );
        p.release_all();
        p.retire();
    }

    #[test]
    fn huge_pages_on_their_way_back_meet_the_demand_the_handler_notes() {
        let p = Pool::new(16 << 20, true, true, None).unwrap(); // huge share: 6 chunks
        let dh = p.dirty_huge.as_ref().unwrap();
        p.note_huge_missed(2);
        assert_eq!(p.unmet_huge_demand(), 2);
        assert!(p.take_huge_missed() && p.take_huge_missed() && !p.take_huge_missed());
        // Two recycled huge pages wait to be zeroed: a miss of one is met by them.
        put_dirty(dh, PMD_PAGES);
        put_dirty(dh, PMD_PAGES);
        p.note_huge_missed(1);
        assert_eq!(p.unmet_huge_demand(), 0, "the scrub is behind, not short of huge pages");
        // Small misses add up against the backlog as a whole: three of one are one short.
        p.note_huge_missed(1);
        p.note_huge_missed(1);
        assert_eq!(p.unmet_huge_demand(), 1);
        // The scrub brings the two back into the clean ring: they met two of the three.
        dh.consume(2 * PMD_PAGES);
        p.huge_demand_met(2);
        assert_eq!(p.unmet_huge_demand(), 1);
        assert!(p.take_huge_missed() && !p.take_huge_missed());
        p.note_huge_missed(100);
        let mut n = 0;
        while p.take_huge_missed() {
            n += 1;
        }
        assert_eq!(n, 6, "capped at the huge share");
    }

    #[test]
    fn the_scrub_zeroes_first_for_the_emptier_clean_ring() {
        let p = Pool::new(16 << 20, true, true, None).unwrap(); // small share 1024, huge 3072
        let (small, huge) = (&p.small, p.huge.as_ref().unwrap());
        let (ds, dh) = (p.dirty_small.as_ref().unwrap(), p.dirty_huge.as_ref().unwrap());
        assert!(p.next_dirty([false; 2]).is_none(), "nothing dirty");
        put_dirty(ds, 512);
        put_dirty(dh, PMD_PAGES); // one huge page a put
        put_dirty(dh, PMD_PAGES);
        let pick = |done| {
            p.next_dirty(done)
                .map(|(i, d, c, b)| (i, d.is_huge(), c.is_huge_ring(), b.pages))
        };
        // Both clean rings empty: a tie, the huge one first.
        assert_eq!(pick([false; 2]), Some((0, true, true, PMD_PAGES)));
        // The huge ring a third full, the small one empty: small.
        pretend_filled(huge, 1024);
        assert_eq!(pick([false; 2]), Some((1, false, false, 512)));
        // The small ring half full: huge again (1/3 < 1/2).
        pretend_filled(small, 512);
        assert_eq!(pick([false; 2]), Some((0, true, true, PMD_PAGES)));
        // A pair whose clean ring took nothing more this round is skipped.
        assert_eq!(pick([true, false]), Some((1, false, false, 512)));
        assert_eq!(pick([true, true]), None);
        // A pair with nothing dirty is not picked, however empty its clean ring.
        ds.consume(512);
        let _ = small.take(512);
        assert_eq!(pick([false; 2]), Some((0, true, true, PMD_PAGES)));
    }
}
