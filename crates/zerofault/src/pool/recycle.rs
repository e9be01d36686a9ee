//! Recycling (seeds 002/003): the pages a program gives up come back to it through the scrub
//! thread, zeroed, instead of going back to the kernel to be allocated and zeroed again.
//!
//! ## The life of a freed page
//! 1. **Out.** [`Shared::recycle`] (behind `Engine::recycle`, `Region::recycle`, the shim's
//!    `free` and `munmap`) moves the pages the engine installed in the range out with
//!    `UFFDIO_MOVE`: a whole PMD-mapped huge page with one PMD move into the huge dirty ring,
//!    4 KiB pages in runs into the small dirty ring. Then `MADV_DONTNEED` over the whole range
//!    discards whatever stayed (pages the engine did not install, moves refused after a fork
//!    (EBUSY) or for an mlocked range (EINVAL), rings full): the range reads zero afterwards,
//!    as after `MADV_DONTNEED`, and its next touch is served by the engine. A recycle is a
//!    discard: it cannot be undone. The kernel does not refuse `UFFDIO_MOVE` out of a sealed
//!    (`mseal(2)`) writable range, nor its `MADV_DONTNEED`; where the program's call is one the
//!    kernel may refuse (a munmap, the free of an arena block), the shim asks the kernel first
//!    and recycles only when the call will go through (preload `mmap.rs`, `arena::sealed`).
//!    Where the discard itself is refused (an mlocked range, a sealed read-only one), no page
//!    was moved: the kernel refuses those moves too (the source must have the dirty ring's
//!    protection and no lock).
//! 2. **Dirty.** A [`DirtyRing`] holds the program's bytes. Its pages are never handed out:
//!    the fault handler takes pages from the clean rings only ([`crate::pool::Ring`]), and
//!    nothing but the scrub moves pages from a dirty ring to a clean one.
//! 3. **Zeroed and clean.** The scrub thread zeroes a dirty batch (at most 2 MiB, one fence)
//!    and moves it to the tail of the matching clean ring, which publishes it
//!    ([`crate::pool::Ring::fill_with`]). Hot or cold (seed 003): a batch freed moments ago
//!    while the dirty backlog fits in the last-level cache is zeroed with temporal stores
//!    (its lines are likely cached); the rest with the cold method (`zero_method`).
//! 4. **Or gone.** A dirty batch that finds its clean ring full waits; after `purge_delay` it
//!    goes back to the kernel (`MADV_DONTNEED`), and so do clean pages above `scrub_stop` that
//!    nobody took for `purge_delay` (see `scrub.rs`).
//!
//! ## A dirty ring
//! Like a clean ring, two monotonic page counters over one registered area: `tail` (pages moved
//! in, advanced by recyclers one at a time under `lock`) and `head` (pages the scrub zeroed and
//! moved on or purged, advanced by the scrub alone). Slots `[tail, head + pages)` are empty:
//! the scrub advances `head` only past slots it emptied. A recycler that still finds a page in
//! a slot (never expected) counts the slot as dirty: whatever it holds is zeroed before it goes
//! anywhere. The rings are registered with the engine's userfaultfd in write-protect mode only
//! (`Uffd::register_as_destination`), because UFFDIO_MOVE wants its destination registered.

use crate::memory::region::{Range, Recycled};
use crate::page::{pages, PMD_PAGES, PMD_SIZE};
use crate::pool::Pool;
use crate::stats::Stats;
use crate::sys::mman;
use crate::sys::raw::Errno;
use crate::sys::uffd::{Progress, Uffd};
use crate::Shared;
use std::io;
use std::sync::atomic::Ordering::*;

pub(crate) use super::dirty::{Batch, DirtyRing};

/// Source pages a recycle call skips after EBUSY (pages shared with a forked child) before
/// it leaves the rest of the range to `MADV_DONTNEED`.
const BUSY_SKIPS: u32 = 16;

impl Shared {
    /// Discards `[addr, addr + len)` (page aligned) like `MADV_DONTNEED`, keeping the pages the
    /// engine installed there for the pool (see the module's docs). The range reads zero
    /// afterwards. `Err` is `MADV_DONTNEED`'s (an mlocked range, say); the pages moved out
    /// before it stay recycled.
    ///
    /// # Context
    /// A program thread, in the shim's free or munmap hook or `Engine::recycle`. Takes the
    /// descriptor's read lock, the range table's read lock and the dirty rings' put locks; the
    /// moves may sleep on the mmap lock, and a pending event is waited out (at most `AGAIN_WAIT`).
    pub(crate) fn recycle(&self, addr: usize, len: usize) -> io::Result<Recycled> {
        let mut done = Recycled::default();
        let end = addr.saturating_add(len);
        self.budget.note_release(pages(len));
        let recycles = self.pools.first().is_some_and(Pool::recycles)
            && !self.pool_paused.load(Acquire)
            && !self.failed.load(Acquire)
            // Past the shim's destructor no scrub empties the dirty rings: discard, as natively.
            && !self.exiting.load(Acquire)
            && self.pool_held() < self.budget.pages();
        if recycles {
            self.end_loans(addr, end);
            let held = self.uffd_here();
            let uffd = held.as_deref().and_then(Option::as_ref);
            if let Some(u) = uffd.as_ref() {
                for r in self.ranges.overlapping(addr, end) {
                    let (a, b) = (addr.max(r.start), end.min(r.end()));
                    let span = recycle_span(u, self, &r, a, b);
                    done.pages += span.pages;
                    done.huge_pages += span.huge_pages;
                    done.discarded += span.discarded;
                }
            }
        }
        let stats = &*self.stats;
        Stats::add(&stats.recycle_calls, 1);
        Stats::add(&stats.pages_recycled, done.pages);
        Stats::add(&stats.huge_recycled, done.huge_pages / PMD_PAGES);
        Stats::add(&stats.recycle_discarded, done.discarded);
        if done.pages > 0 {
            // The scrubs of the pools that got pages.
            for p in self.pools.iter().filter(|p| p.dirty() > 0) {
                p.scrub.kick();
            }
        }
        // SAFETY: the caller asked for the range to be discarded; what was moved out is a hole
        // already, and the rest goes as MADV_DONTNEED would take it.
        unsafe { mman::madvise(addr, len, mman::MADV_DONTNEED) }?;
        // Probed by the scrub at start, never here: the probe would cost a short program's
        // free more than the free itself (DESIGN.md, "A short program").
        if mman::pt_reclaim_known() == Some(true) {
            // Its whole PMDs hold no page table now: huge pages may go there again (else a
            // PMD that once took 4 KiB pages would take them for good).
            for r in self.ranges.overlapping(addr, end) {
                r.pmds.clear_tables(addr.max(r.start), end.min(r.end()));
            }
        }
        Ok(done)
    }
}

/// Pages whose node one `move_pages` query asks for, on the recycling program thread's stack.
const NODE_QUERY: usize = 64;

/// Which pool recycled pages go to: the only one, or with a pool per node, the pool of the
/// node the pages are on (`move_pages` query), so that a pool hands out only its node's pages.
/// `None`: a page whose node is unknown or has no pool, which is discarded instead.
struct PoolByNode<'a> {
    shared: &'a Shared,
    /// Several pools: each page's node is asked for.
    per_node: bool,
}

impl<'a> PoolByNode<'a> {
    fn of_node(&self, node: i32) -> Option<(usize, &'a Pool)> {
        if !self.per_node {
            return self.shared.pools.first().map(|p| (0, p));
        }
        let n = self.shared.numa.as_ref()?;
        let ix = n.pool_of(u32::try_from(node).ok()?)?;
        Some((ix, &self.shared.pools[ix]))
    }

    /// The nodes of `addrs` into `out` (every entry 0 with one pool: nothing is asked). An
    /// entry that is not a node (the query failed, a hole) is negative.
    fn nodes(&self, addrs: &[usize], out: &mut [i32]) {
        out.fill(0);
        if self.per_node && crate::sys::numa::nodes_of(addrs, out).is_err() {
            out.fill(-1);
        }
    }
}

/// Recycles the pages the engine installed in `[a, b)` of `range`, PMD by PMD, each into the
/// pool of its node ([`PoolByNode`]). Pages it claimed that are not there (a window still being
/// installed when the program gave the range up) count nowhere.
fn recycle_span(u: &Uffd, shared: &Shared, range: &Range, a: usize, b: usize) -> Recycled {
    let homes = PoolByNode {
        shared,
        per_node: shared.numa.is_some() && shared.pools.len() > 1,
    };
    let mut done = Recycled::default();
    let mut mv = |d: usize, s: usize, l: usize| {
        // SAFETY: `s` lies in a range the caller of `recycle` gives up (its bytes may go
        // anywhere: into a dirty ring, to be zeroed before anyone sees them), and `d` is an
        // empty slot of a dirty ring, which no one else writes (see `DirtyRing::put`).
        unsafe { u.move_pages(d, s, l) }
    };
    // Pools whose small or huge dirty ring stopped taking pages (full, or a refusal that
    // would repeat), by `tried_bit`.
    let (mut small_closed, mut huge_closed, mut busy) = (0u64, 0u64, 0u32);
    let mut runs = Vec::new();
    let mut at = a;
    while at < b {
        let pmd_end = ((at / PMD_SIZE) + 1) * PMD_SIZE;
        let seg_end = pmd_end.min(b);
        let first = range.page_of(at);
        let n = pages(seg_end - at);
        let claimed = range.map.count_range(first, n);
        if claimed == 0 {
            at = seg_end;
            continue;
        }
        // A whole PMD the engine filled with a huge page (no page table: see fault/huge.rs).
        let whole = at % PMD_SIZE == 0 && seg_end == pmd_end && claimed == PMD_PAGES && !range.pmds.has_table(at);
        if whole {
            recycle_huge(&homes, at, &mut huge_closed, &mut mv, &mut done);
            range.map.clear(first, n);
            at = seg_end;
            continue;
        }
        runs.clear();
        range.map.claimed_runs(first, n, &mut runs);
        for &(p0, np) in &runs {
            let mut small = Small {
                closed: &mut small_closed,
                busy: &mut busy,
            };
            if !homes.per_node {
                // One pool: the whole run at once.
                small.stretch(homes.of_node(0)).put(range, p0, np, &mut mv, &mut done);
                continue;
            }
            recycle_run_by_node(&homes, range, (p0, np), &mut small, &mut mv, &mut done);
        }
        range.map.clear(first, n);
        at = seg_end;
    }
    debug_assert!(
        done.pages + done.discarded <= pages(b - a),
        "{done:?} of {}",
        pages(b - a)
    );
    done
}

/// A whole PMD the engine filled with a huge page, at `at`: moved whole into the huge dirty
/// ring of its node's pool, unless that ring stopped taking pages (`huge_closed`, by
/// `tried_bit`) or has no room; else discarded with the caller's `MADV_DONTNEED`.
///
/// # Context
/// The thread that gives the memory up (a program thread in `free` or `munmap`, or a
/// Region's drop); takes the ring's lock.
fn recycle_huge(
    homes: &PoolByNode<'_>,
    at: usize,
    huge_closed: &mut u64,
    mv: &mut dyn FnMut(usize, usize, usize) -> Progress,
    done: &mut Recycled,
) {
    let bit = super::tried_bit;
    let mut node = [0i32];
    homes.nodes(&[at], &mut node);
    let home = homes.of_node(node[0]);
    match home.and_then(|(ix, pool)| {
        let ring = pool.dirty_huge.as_ref()?;
        (*huge_closed & bit(ix) == 0 && pool.room() >= PMD_PAGES).then_some((ix, ring))
    }) {
        Some((ix, ring)) => {
            let p = ring.put(at, PMD_PAGES, mv);
            done.pages += p.moved;
            done.huge_pages += p.moved;
            if p.refused.is_some() || p.full {
                done.discarded += PMD_PAGES - p.consumed;
            }
            // A refusal is this huge page's (shared after a fork, a window still being
            // installed there): the next one may move. A full ring or a range that moves
            // nothing at all (EINVAL: mlocked, other protection) ends it.
            if p.full || p.refused == Some(Errno(libc::EINVAL)) {
                *huge_closed |= bit(ix);
            }
        }
        // Moving a huge page out in 4 KiB pieces would split it (most of a millisecond): it
        // goes with the MADV_DONTNEED. So does one whose node has no pool.
        None => done.discarded += PMD_PAGES,
    }
}

/// Run `(p0, np)` of `range`'s 4 KiB pages with several node pools: the nodes of its pages,
/// [`NODE_QUERY`] at a time, then each stretch on one node into that node's pool. Stops when
/// events keep coming; the rest of the run is then counted discarded.
///
/// # Context
/// As [`recycle_huge`].
fn recycle_run_by_node(
    homes: &PoolByNode<'_>,
    range: &Range,
    (p0, np): (u64, u64),
    small: &mut Small<'_>,
    mv: &mut dyn FnMut(usize, usize, usize) -> Progress,
    done: &mut Recycled,
) {
    let mut q = 0;
    while q < np {
        // The nodes of the next pages of the run, then each stretch on one node.
        let k = usize::try_from(np - q).map_or(NODE_QUERY, |r| r.min(NODE_QUERY));
        let mut addrs = [0usize; NODE_QUERY];
        let mut nodes = [0i32; NODE_QUERY];
        for (i, a) in addrs[..k].iter_mut().enumerate() {
            *a = range.addr_of(p0 + q + i as u64);
        }
        homes.nodes(&addrs[..k], &mut nodes[..k]);
        // A page not there (negative) goes with its neighbours: the move skips holes.
        let mut last = nodes[..k].iter().copied().find(|&n| n >= 0).unwrap_or(-1);
        for v in nodes[..k].iter_mut() {
            if *v < 0 {
                *v = last;
            }
            last = *v;
        }
        let mut i = 0;
        while i < k {
            let node = nodes[i];
            let len = nodes[i..k].iter().take_while(|&&n| n == node).count();
            let start = p0 + q + i as u64;
            if !small
                .stretch(homes.of_node(node))
                .put(range, start, len as u64, mv, done)
            {
                // Events kept coming: the rest of the run goes with the discard too.
                done.discarded += np - (q + (i + len) as u64);
                return;
            }
            i += len;
        }
        q += k as u64;
    }
}

/// What the 4 KiB pages of one recycle share across its stretches: the pools whose small
/// dirty ring stopped taking pages (by `tried_bit`), and the moves refused busy so far.
struct Small<'s> {
    closed: &'s mut u64,
    busy: &'s mut u32,
}

impl Small<'_> {
    /// A stretch of pages bound for `home`'s pool.
    fn stretch<'b, 'a>(&'b mut self, home: Option<(usize, &'a Pool)>) -> NodeRun<'b, 'a> {
        NodeRun {
            home,
            closed: self.closed,
            busy: self.busy,
        }
    }
}

/// Pages of one node, on their way into its pool's small dirty ring.
struct NodeRun<'s, 'a> {
    home: Option<(usize, &'a Pool)>,
    closed: &'s mut u64,
    busy: &'s mut u32,
}

impl NodeRun<'_, '_> {
    /// Moves pages `[p0, p0 + np)` of `range` into the ring while it takes them; the rest is
    /// counted discarded (it goes with the caller's `MADV_DONTNEED`). False when events kept
    /// coming (EAGAIN after the wait): the caller gives up the rest of its run too.
    fn put(
        &mut self,
        range: &Range,
        p0: u64,
        np: u64,
        mv: &mut dyn FnMut(usize, usize, usize) -> Progress,
        done: &mut Recycled,
    ) -> bool {
        let bit = |ix: usize| super::tried_bit(ix);
        let mut off = 0;
        while off < np {
            let Some((ix, room, ring)) = self
                .home
                .and_then(|(ix, pool)| Some((ix, pool.room(), pool.dirty_small.as_ref()?)))
                .filter(|&(ix, room, _)| *self.closed & bit(ix) == 0 && room > 0)
            else {
                done.discarded += np - off;
                return true;
            };
            let p = ring.put(range.addr_of(p0 + off), (np - off).min(room), mv);
            done.pages += p.moved;
            off += p.consumed;
            match p.refused {
                // Shared with a forked child: skip the page, a few times.
                Some(Errno(libc::EBUSY)) if *self.busy < BUSY_SKIPS => {
                    *self.busy += 1;
                    off += 1;
                    done.discarded += 1;
                }
                // Events kept coming (mmap_changing): this run goes with the discard.
                Some(Errno(libc::EAGAIN)) => {
                    done.discarded += np - off;
                    return false;
                }
                Some(_) => *self.closed |= bit(ix),
                None if p.full => *self.closed |= bit(ix),
                None => {}
            }
        }
        true
    }
}
