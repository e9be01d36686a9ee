//! Reads before writes: a read fault in memory the program goes on to write is
//! served as a write fault would be, so that its writes fault no more. Natively, and here
//! before, a read maps the zero page, and each later write is a copy-on-write fault the kernel
//! serves alone, 4 KiB at a time, with no huge page ever, while recycled pages sit unused in the
//! pool (docs/DESIGN.md, "Figures that left the code comments").
//!
//! The pages themselves tell whether the program writes what it reads. Each read window keeps
//! two sample pages on the zero page: the last two of its part in the fault's PMD, which holds
//! 4 KiB pages whatever happens (the kernel gave it a page table before it asked us); in a
//! window served as a write they are mapped to the zero page first, and the window's pages go
//! in around them, the part after them first. When the same thread's next read fault in the
//! range comes past them, one `PAGEMAP_SCAN` says whether each is still the zero page (read,
//! never written: `PAGE_IS_PFNZERO`) or a page of its own (the kernel copied the zero page on
//! a write). A page table walk never faults a page in, so the look is safe on memory this
//! handler serves. Written: the range's read windows are served as writes from then on; still
//! zero: its reads map the zero page again. The verdict is taken afresh at every look, so a
//! program that turns from filling to scanning goes back to the zero page one window later.
//! Each thread's samples are its own (up to [`READ_SLOTS`] threads a range): a thread filling
//! its part of an array looks at its own samples, never at another's it has not reached.
//!
//! Served as a write means what a write fault gets: pool pages, whole huge pages for whole
//! PMDs, a window ahead, and pages made or copied when the pool is short, each cheaper than
//! the copy-on-write faults they save (docs/DESIGN.md, "Reads before writes", has the
//! costs). A zero page when the pool is short would also never
//! ask the scrub for pages: such a program would stay on copy-on-write for good. Only where
//! a move is refused (a read-only mapping: `UFFDIO_MOVE` wants the same protection on both
//! sides) or the pool is paused (`mlockall`) does the rest of the window map the zero page.
//!
//! A read window maps the zero page, as natively, while nothing was looked at yet (a range's
//! first read window), while its samples stayed the zero page, without /proc to look, and
//! where the program advised random access (`MADV_RANDOM`, [`crate::Engine::set_random`]).
//!
//! Memory: a program that only reads gets no pool page. One that reads and writes, then only
//! reads, keeps at most what was served before the look that caught it: its window, and for a
//! confirmed stream the window ahead (up to `2^ahead_order` pages). docs/DESIGN.md, "Reads
//! before writes".

use super::{Handler, Kernel, PageState};
use crate::memory::region::{Range, ReadSamples, ReadVerdict, READ_SLOTS};
use crate::page::{pmd_start, PAGE_SIZE, PMD_SIZE};
use crate::stats::Stats;
use std::sync::atomic::Ordering::Relaxed;

impl<K: Kernel> Handler<'_, K> {
    /// Whether the read fault at `page_addr` of `range` by thread `tid` is served as a write.
    /// Looks first at that thread's samples if the fault came past them.
    ///
    /// # Context
    /// A handler thread, for a read fault, before the window is located.
    pub(crate) fn read_takes_pool(&mut self, range: &Range, page_addr: usize, tid: u32) -> bool {
        if !self.opts.read_pool || !self.can_move || range.pmds.is_random(page_addr) {
            return false;
        }
        let mut reads = range.reads.lock().unwrap_or_else(|e| e.into_inner());
        let slot = reads
            .slots
            .iter_mut()
            .find(|s| s.tid == tid && s.first != 0 && s.first + s.pages * PAGE_SIZE <= page_addr)
            .map(std::mem::take);
        if let Some(s) = slot {
            let mut states = [PageState::Absent; 2];
            let ok = self.kernel.page_states(s.first, &mut states[..s.pages]);
            let written = states.iter().filter(|&&p| p == PageState::Own).count() as u64;
            let zero = states.iter().filter(|&&p| p == PageState::ZeroPage).count() as u64;
            if s.pool {
                Stats::add(&self.stats().read_samples_written, written);
                Stats::add(&self.stats().read_samples_unwritten, zero);
            }
            reads.verdict = match () {
                // Nothing can be known (a sandbox without /proc): the zero page, as natively.
                _ if !ok => ReadVerdict::Unknown,
                _ if written > 0 => ReadVerdict::Writes,
                _ if zero > 0 => ReadVerdict::OnlyReads,
                // Both discarded since: no news.
                _ => reads.verdict,
            };
        }
        reads.verdict == ReadVerdict::Writes && !self.shared.pool_paused.load(Relaxed)
    }

    /// The sample pages of a read window ending at page `end` of `range` for the fault at
    /// `page_addr`: the last two pages of the window's part in the fault's PMD, after the
    /// fault's page. A zero-page window shorter than that samples the fault's page (it maps the
    /// zero page anyway); a window served as a write then has none (the fault's page would be
    /// mapped, and its thread woken, before the window is in).
    ///
    /// # Context
    /// A handler; arithmetic only.
    pub(crate) fn read_samples(range: &Range, page_addr: usize, end: u64, as_write: bool) -> [usize; 2] {
        let end_addr = range.addr_of(end).min(pmd_start(page_addr) + PMD_SIZE);
        match () {
            _ if end_addr >= page_addr + 3 * PAGE_SIZE => [end_addr - 2 * PAGE_SIZE, end_addr - PAGE_SIZE],
            _ if !as_write => [page_addr, 0],
            _ => [0; 2],
        }
    }

    /// Maps the zero page at the samples of a read window served as a write (`runs`: the
    /// window's claimed runs, `(first page, pages)`), before the window's pages go in, and cuts
    /// them out of the runs, so that the part after them goes in first ("last run first");
    /// returns the samples that went in (a page found present is not one).
    ///
    /// # Context
    /// A handler thread, serving a read as a write (`self.reading`).
    pub(crate) fn place_samples(
        &mut self,
        range: &Range,
        samples: [usize; 2],
        runs: &mut Vec<(u64, u64)>,
    ) -> [usize; 2] {
        let mut placed = [0; 2];
        for (slot, &s) in placed.iter_mut().zip(&samples) {
            if s == 0 {
                continue;
            }
            let page = range.page_of(s);
            let Some(i) = runs.iter().position(|&(f, n)| f <= page && page < f + n) else {
                continue;
            };
            let p = self.kernel.zeropage(s, PAGE_SIZE);
            let p = self.note(p);
            if p.done != PAGE_SIZE {
                continue;
            }
            Stats::add(&self.stats().pages_zero_mapped, 1);
            *slot = s;
            let (f, n) = runs[i];
            runs.remove(i);
            // The run without the sample, in address order.
            let pieces = [(f, page - f), (page + 1, f + n - page - 1)];
            for (k, &(a, m)) in pieces.iter().filter(|&&(_, m)| m > 0).enumerate() {
                runs.insert(i + k, (a, m));
            }
        }
        placed
    }

    /// Keeps `samples` as thread `tid`'s in `range`, for its next read fault past them.
    ///
    /// # Context
    /// A handler; takes the range's `reads` lock.
    pub(crate) fn keep_samples(range: &Range, samples: [usize; 2], pool: bool, tid: u32) {
        let (first, pages) = match samples {
            [0, 0] => return,
            [0, b] => (b, 1),
            [a, 0] => (a, 1),
            [a, b] => {
                debug_assert_eq!(b, a + PAGE_SIZE);
                (a, 2)
            }
        };
        let mut reads = range.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.clock += 1;
        let stamp = reads.clock;
        // The thread's own slot, else an empty one, else the oldest.
        let i = (0..READ_SLOTS)
            .find(|&i| reads.slots[i].tid == tid)
            .or_else(|| (0..READ_SLOTS).find(|&i| reads.slots[i].first == 0))
            .unwrap_or_else(|| (0..READ_SLOTS).min_by_key(|&i| reads.slots[i].stamp).unwrap_or(0));
        reads.slots[i] = ReadSamples {
            tid,
            first,
            pages,
            pool,
            stamp,
        };
    }
}
