//! Whole-PMD placement: where a transparent huge page may go, and putting it there.
//!
//! A huge page is moved (`UFFDIO_MOVE`, one PMD update) only into a PMD that holds no page
//! table: into a page table it would be split (most of a millisecond, docs/DESIGN.md, "Huge
//! pages"). User space cannot see page tables, so
//! each range keeps a [`PmdMap`](crate::memory::pmds::PmdMap) (`memory/pmds.rs`): one bit per PMD it overlaps that is set once the PMD *may*
//! hold a table (4 KiB pages went in, a `MADV_DONTNEED` cut through it, the kernel moved pages
//! in with `mremap`), and one bit per PMD where the program asked for huge pages
//! (`MADV_HUGEPAGE`, or THP `always`), where the kernel tries a huge page at each fault before
//! it asks us, with the PMD still empty.
//!
//! A write window's whole PMDs whose table bit is clear get huge pages: moved from the pool's
//! huge ring, or, when it is empty, made here in a 2 MiB staging area (`MADV_POPULATE_WRITE`
//! of one THP, then one move), as the kernel's own THP fault would. A staging populate that is
//! slow means memory is fragmented: the handler then copies for a while instead.

use crate::fault::{Filled, Handler, Kernel, Stop, Stopped, EVENT_RETRIES};
use crate::memory::nodes::RingKind;
use crate::memory::region::Range;
use crate::page::{pages, PMD_SIZE};
use crate::pool::tried_bit;
use crate::stats::Stats;
use crate::sys::mman;
use crate::sys::raw::Errno;
use std::time::{Duration, Instant};

/// A staging populate slower than this (a huge page normally takes well under it, see
/// docs/DESIGN.md, "Huge pages") means the
/// kernel had to compact memory for it, or fell back to 4 KiB pages: the handler then copies
/// instead for [`STAGE_REST`]. The scrub thread, off the faulting path, keeps trying.
pub(crate) const STAGE_SLOW: Duration = Duration::from_millis(4);
/// See [`STAGE_SLOW`].
pub(crate) const STAGE_REST: Duration = Duration::from_secs(1);

impl<K: Kernel> Handler<'_, K> {
    /// Whole PMDs `[dst, dst + len)` whose table bits are clear: huge pages moved from the huge
    /// ring, or made by this thread when the ring is empty. Anything irregular (a page already
    /// there, a refused move, no huge page to be had) marks the PMDs and ends in 4 KiB pages.
    ///
    /// # Context
    /// A handler. Takes huge-ring slots lock-free; populating its staging area and the move may
    /// sleep (page allocation, the mmap lock).
    pub(crate) fn install_huge(&mut self, dst: usize, len: usize, range: &Range) -> Filled {
        self.want_huge();
        // With a pool per node, from the huge rings `pool_for` picks as they run dry; under an
        // interleave policy one huge page at a time, each from its own node's ring.
        let per_pmd = self.interleave.is_some();
        let (mut off, mut tried) = (0, 0u64);
        while off < len {
            let at = dst + off;
            let Some(src) = self.pool_for(RingKind::Huge, at, tried) else {
                break;
            };
            let ring = src
                .pool
                .huge
                .as_ref()
                .expect("pool_for gives a pool with pages in the ring");
            let n = if per_pmd { PMD_SIZE } else { len - off };
            let (filled, clean) = self.fill_move(ring, at, n);
            let moved = match filled {
                Ok(()) if clean => n,
                Err(Stopped {
                    at,
                    why: Stop::RingEmpty,
                }) if clean => {
                    tried |= tried_bit(src.ix);
                    at
                }
                // The PMDs moved in whole before `off` keep no table.
                Ok(()) => return self.huge_fallback(at, len - off, n, range).map_err(|s| s.offset(off)),
                Err(s) => {
                    return self
                        .huge_fallback(at, len - off, s.at, range)
                        .map_err(|s| s.offset(off))
                }
            };
            self.count_taken(&src, pages(moved));
            Stats::add(&self.stats().huge_moves, (moved / PMD_SIZE) as u64);
            off += moved;
            if moved == n {
                tried = 0;
            }
        }
        if off >= len {
            return Ok(());
        }
        // Tell the scrub what the ring lacked: it may trade recycled 4 KiB pages for huge ones.
        if let Some(home) = self.home_pool() {
            home.note_huge_missed(((len - off) / PMD_SIZE) as u64);
        }
        // The ring ran dry: prepare each remaining huge page here, as the kernel's own THP
        // fault would, while the scrub refills the ring on the other CPU.
        while off < len {
            let advised = range.pmds.wants_huge(dst + off);
            if let Err(s) = self.make_huge(dst + off, advised) {
                // The huge pages before `off` went in whole: their PMDs hold no table.
                return self
                    .huge_fallback(dst + off, len - off, s.at, range)
                    .map_err(|s| s.offset(off));
            }
            off += PMD_SIZE;
        }
        Ok(())
    }

    /// Populates the staging PMD (one transparent huge page, zeroed by the kernel) and moves it
    /// to `dst`. A stop's offset is the bytes moved. `advised`: the program asked for huge
    /// pages there, so the kernel would have spent the time to make one: no rest after a slow
    /// one (see [`STAGE_SLOW`]).
    fn make_huge(&mut self, dst: usize, advised: bool) -> Filled {
        let none = Err(Stopped {
            at: 0,
            why: Stop::NoHugePage,
        });
        let Some(stage) = self.stage else { return none };
        if !advised && self.stage_rests_until.is_some_and(|t| Instant::now() < t) {
            return none;
        }
        let addr = stage.as_ptr() as usize;
        // Under an interleave policy each huge page has its own node: the staging populate
        // follows the handler's preferred node.
        if let Some(m) = self.interleave {
            self.prefer_node(crate::memory::nodes::interleave_node(&m, dst, 9));
        }
        let (t0, delay0) = (Instant::now(), crate::sys::thread::run_delay());
        let populated = stage.populate();
        // Wall time less the time spent runnable but not running: preempted on a busy machine,
        // a fast populate would read as slow and send the handler to 4 KiB copies for a whole
        // rest (docs/DESIGN.md, "Huge pages"). Time asleep in reclaim or compaction, or a guest
        // stalled on its host, counts.
        let took = match (delay0, crate::sys::thread::run_delay()) {
            (Some(a), Some(b)) => t0.elapsed().saturating_sub(Duration::from_nanos(b.saturating_sub(a))),
            _ => t0.elapsed(),
        };
        // Lending weighs the kernel's huge pages: a populate that fell back to 4 KiB pages
        // (fast, with defrag off) says nothing of them.
        if populated.is_ok() && mman::huge_mapped(addr).unwrap_or(false) {
            self.last_populate = Some((Instant::now(), took));
        }
        if took > STAGE_SLOW {
            // Memory is fragmented (the kernel compacted to find a huge page, or gave up and
            // populated 4 KiB pages), or comes from the host: copying is cheaper on the
            // faulting path for a while.
            self.stage_rests_until = Some(Instant::now() + STAGE_REST);
        }
        if populated.is_err() {
            return none;
        }
        // SAFETY: the staging area is the handler's own: nothing else reads or writes it, and
        // its pages are zeroes the kernel just populated.
        let mut p = self.note(unsafe { self.kernel.move_pages(dst, addr, PMD_SIZE) });
        // EAGAIN without progress: an event is pending (mmap_changing); apply it and retry.
        let mut retries = 0;
        while p.done == 0 && p.errno == Some(Errno(libc::EAGAIN)) && retries < EVENT_RETRIES {
            retries += 1;
            self.drain_events(retries);
            // SAFETY: as above.
            p = self.note(unsafe { self.kernel.move_pages(dst, addr, PMD_SIZE) });
        }
        Stats::add(&self.stats().pages_moved, pages(p.done));
        if p.errno.is_none() && p.done == PMD_SIZE {
            Stats::add(&self.stats().huge_made, 1);
            return Ok(());
        }
        // Whatever stayed behind goes, so the next populate starts from an empty PMD.
        // SAFETY: the staging area is the handler's own.
        let _ = unsafe { mman::madvise(addr, PMD_SIZE, mman::MADV_DONTNEED) };
        Err(Stopped {
            at: p.done,
            why: p.errno.map_or(Stop::NoHugePage, Stop::Kernel),
        })
    }

    /// A whole-PMD install went irregular at byte `off` of `[dst, dst + len)`: mark its PMDs
    /// and install the rest with 4 KiB pages.
    fn huge_fallback(&mut self, dst: usize, len: usize, off: usize, range: &Range) -> Filled {
        Stats::add(&self.stats().huge_fallbacks, 1);
        range.pmds.mark_tables(dst, len);
        if off >= len {
            return Ok(());
        }
        self.install_small(dst + off, len - off).map_err(|s| s.offset(off))
    }
}
