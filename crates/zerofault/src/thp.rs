//! Whole-PMD placement: where a transparent huge page may go, and putting it there.
//!
//! A huge page is moved (`UFFDIO_MOVE`, one PMD update) only into a PMD that holds no page
//! table: into a page table it would be split (most of a millisecond, docs/DESIGN.md, "Huge
//! pages"). User space cannot see page tables, so
//! each range keeps a [`PmdMap`]: one bit per PMD it overlaps that is set once the PMD *may*
//! hold a table (4 KiB pages went in, a `MADV_DONTNEED` cut through it, the kernel moved pages
//! in with `mremap`), and one bit per PMD where the program asked for huge pages
//! (`MADV_HUGEPAGE`, or THP `always`), where the kernel tries a huge page at each fault before
//! it asks us, with the PMD still empty.
//!
//! A write window's whole PMDs whose table bit is clear get huge pages: moved from the pool's
//! huge ring, or, when it is empty, made here in a 2 MiB staging area (`MADV_POPULATE_WRITE`
//! of one THP, then one move), as the kernel's own THP fault would. A staging populate that is
//! slow means memory is fragmented: the handler then copies for a while instead.

use crate::fault::{tried_bit, Filled, Handler, Kernel, Stop, Stopped, EVENT_RETRIES};
use crate::nodes::RingKind;
use crate::page::{bytes, pages, PMD_SIZE};
use crate::pagemap::PageMap;
use crate::region::Range;
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

/// Three bits per PMD a range overlaps (see the module doc), indexed from the range's first
/// PMD.
#[derive(Debug)]
pub(crate) struct PmdMap {
    /// The first PMD's index in the address space (`start / PMD_SIZE`).
    base: usize,
    /// Set: the PMD may hold a page table. Cleared only for whole PMDs a recycle emptied with
    /// MADV_DONTNEED, on kernels that free an emptied table then (`mman::pt_reclaim`, probed).
    tables: PageMap,
    /// Set: the program asked for huge pages there.
    huge: PageMap,
    /// Set: the program asked for none there (`MADV_NOHUGEPAGE`): 4 KiB pages only.
    never: PageMap,
    /// Set: the program advised random access there (`MADV_RANDOM`): its reads map the zero
    /// page (fault/reads.rs).
    random: PageMap,
}

/// PMDs overlapped by `pages` pages from `start`.
pub(crate) fn pmds_overlapped(start: usize, pages: u64) -> u64 {
    let end = start + bytes(pages.max(1));
    ((end - 1) / PMD_SIZE - start / PMD_SIZE + 1) as u64
}

impl PmdMap {
    /// No table, no advice, for the PMDs of `pages` pages from `start`.
    pub(crate) fn new(start: usize, pages: u64) -> PmdMap {
        let n = pmds_overlapped(start, pages);
        PmdMap {
            base: start / PMD_SIZE,
            tables: PageMap::new(n),
            huge: PageMap::new(n),
            never: PageMap::new(n),
            random: PageMap::new(n),
        }
    }

    /// Index of the PMD holding `addr`.
    fn index(&self, addr: usize) -> u64 {
        (addr / PMD_SIZE - self.base) as u64
    }

    /// PMDs covered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.tables.pages()
    }

    /// The part for a piece of the range starting at `start` of `pages` pages; the huge-page
    /// advice goes along, and the table bits too unless `tables` says otherwise.
    pub(crate) fn slice(&self, start: usize, pages: u64) -> PmdMap {
        let (first, n) = (self.index(start), pmds_overlapped(start, pages));
        PmdMap {
            base: start / PMD_SIZE,
            tables: self.tables.slice(first, n),
            huge: self.huge.slice(first, n),
            never: self.never.slice(first, n),
            random: self.random.slice(first, n),
        }
    }

    /// For pages the kernel moved in (`mremap`): the advice of the piece at `start` of this
    /// map, and a table assumed in every PMD at the destination `to`.
    pub(crate) fn moved(&self, start: usize, pages: u64, to: usize) -> PmdMap {
        let tables = PageMap::new(pmds_overlapped(to, pages));
        tables.set(0, tables.pages());
        let (first, n) = (self.index(start), pmds_overlapped(start, pages));
        PmdMap {
            base: to / PMD_SIZE,
            tables,
            huge: self.huge.slice(first, n),
            never: self.never.slice(first, n),
            random: self.random.slice(first, n),
        }
    }

    /// Notes that 4 KiB pages went into `[addr, addr + len)`: its PMDs may hold page tables.
    pub(crate) fn mark_tables(&self, addr: usize, len: usize) {
        if len > 0 {
            let (a, b) = (self.index(addr), self.index(addr + len - 1));
            self.tables.set(a, b - a + 1);
        }
    }

    /// The whole PMDs of `[a, b)` hold no page table any more (their pages were discarded
    /// whole on a kernel that frees emptied tables: see `tables`).
    pub(crate) fn clear_tables(&self, a: usize, b: usize) {
        let (a, b) = (a.next_multiple_of(PMD_SIZE), b / PMD_SIZE * PMD_SIZE);
        if a < b {
            self.tables.clear(self.index(a), ((b - a) / PMD_SIZE) as u64);
        }
    }

    /// Whether the PMD at `addr` may hold a page table.
    pub(crate) fn has_table(&self, addr: usize) -> bool {
        self.tables.is_claimed(self.index(addr))
    }

    /// Whether the program asked for huge pages in the PMD at `addr`.
    pub(crate) fn wants_huge(&self, addr: usize) -> bool {
        self.huge.is_claimed(self.index(addr))
    }

    /// Sets or clears the advice of the whole PMDs `[a, b)` (PMD aligned, `a < b`).
    pub(crate) fn set_huge(&self, a: usize, b: usize, on: bool) {
        let (first, n) = (self.index(a), ((b - a) / PMD_SIZE) as u64);
        if on {
            self.huge.set(first, n);
        } else {
            self.huge.clear(first, n);
        }
    }

    /// Sets or clears `MADV_NOHUGEPAGE` on every PMD that `[a, b)` (`a < b`) touches.
    pub(crate) fn set_never(&self, a: usize, b: usize, on: bool) {
        let (first, last) = (self.index(a), self.index(b - 1));
        if on {
            self.never.set(first, last - first + 1);
        } else {
            self.never.clear(first, last - first + 1);
        }
    }

    /// Sets or clears `MADV_RANDOM` on every PMD that `[a, b)` (`a < b`) touches.
    pub(crate) fn set_random(&self, a: usize, b: usize, on: bool) {
        let (first, last) = (self.index(a), self.index(b - 1));
        if on {
            self.random.set(first, last - first + 1);
        } else {
            self.random.clear(first, last - first + 1);
        }
    }

    /// Whether the program advised random access in the PMD at `addr`.
    pub(crate) fn is_random(&self, addr: usize) -> bool {
        self.random.is_claimed(self.index(addr))
    }

    /// Whether the program asked for no huge page in the PMD at `addr`.
    pub(crate) fn no_huge(&self, addr: usize) -> bool {
        self.never.is_claimed(self.index(addr))
    }

    /// Whole PMDs from `at` that may take huge pages: `at` on a PMD boundary, each PMD inside
    /// `len` bytes, holding no table and not advised against huge pages.
    pub(crate) fn clear_run(&self, at: usize, len: usize) -> usize {
        if at % PMD_SIZE != 0 {
            return 0;
        }
        (0..len / PMD_SIZE)
            .take_while(|i| !self.has_table(at + i * PMD_SIZE) && !self.no_huge(at + i * PMD_SIZE))
            .count()
    }

    /// PMDs marked as possibly holding a table.
    #[cfg(test)]
    pub(crate) fn tables_count(&self) -> u64 {
        self.tables.count()
    }

    /// Whether the map covers exactly the PMDs of `pages` pages from `start` (see
    /// [`Range::is_valid`]).
    pub(crate) fn covers(&self, start: usize, pages: u64) -> bool {
        let n = pmds_overlapped(start, pages);
        self.base == start / PMD_SIZE
            && self.tables.pages() == n
            && self.huge.pages() == n
            && self.never.pages() == n
            && self.random.pages() == n
    }

    /// Bytes of metadata mapped for the bits.
    pub(crate) fn metadata_bytes(&self) -> usize {
        self.tables.metadata_bytes()
            + self.huge.metadata_bytes()
            + self.never.metadata_bytes()
            + self.random.metadata_bytes()
    }
}

impl<K: Kernel> Handler<'_, K> {
    /// Whole PMDs `[dst, dst + len)` whose table bits are clear: huge pages moved from the huge
    /// ring, or made by this thread when the ring is empty. Anything irregular (a page already
    /// there, a refused move, no huge page to be had) marks the PMDs and ends in 4 KiB pages.
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
            self.prefer_node(crate::nodes::interleave_node(&m, dst, 9));
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
        let mut p = self.note(unsafe { self.k.move_pages(dst, addr, PMD_SIZE) });
        // EAGAIN without progress: an event is pending (mmap_changing); apply it and retry.
        let mut retries = 0;
        while p.done == 0 && p.errno == Some(Errno(libc::EAGAIN)) && retries < EVENT_RETRIES {
            retries += 1;
            self.drain_events(retries);
            // SAFETY: as above.
            p = self.note(unsafe { self.k.move_pages(dst, addr, PMD_SIZE) });
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
