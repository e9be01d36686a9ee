//! Reads before writes (issue 29): a read fault in memory the program goes on to write takes
//! pool pages, as a write fault would, so that its writes fault no more. Natively, and here
//! before, a read maps the zero page, and each later write is a copy-on-write fault the kernel
//! serves alone, 4 KiB at a time, with no huge page ever (`maploop 256 10 rw`: 1,310,720 zero
//! pages mapped, not one pool page used, while 1,310,720 recycled pages sat in the pool).
//!
//! The pages themselves tell whether the program writes what it reads. Each read window keeps
//! two sample pages on the zero page (the last two of its first PMD's 4 KiB part; in a window
//! served from the pool they are mapped to the zero page before the pool pages go in around
//! them). When the range's next read fault comes past them, one `PAGEMAP_SCAN` says whether
//! each is still the zero page (read, never written: `PAGE_IS_PFNZERO`) or a page of its own
//! (the kernel copied the zero page on a write). A page table walk never faults a page in, so
//! the look is safe on memory this handler serves. Written: the range's read windows take pool
//! pages from then on; still zero: its reads map the zero page again. The verdict is taken
//! afresh at every read fault past the samples, so a program that turns from filling to
//! scanning goes back to the zero page one window later.
//!
//! A read window takes the zero page instead, as natively, while:
//! - nothing was looked at yet (a range's first read window is always the zero page);
//! - its samples stayed the zero page (memory only read: its RSS stays the native one);
//! - the pool holds less than 2 MiB ready (no page is made or copied for a read);
//! - a move is refused (a read-only mapping: `UFFDIO_MOVE` wants the same protection on both
//!   sides) or the ring runs dry in the middle: the rest of the window is the zero page.
//!
//! Memory: a program that only reads gets no pool page. One that reads and writes, then only
//! reads, keeps at most the window (and window ahead) served before the look that caught it:
//! 8 MiB, or up to `2^ahead_order` pages for a confirmed stream. docs/DESIGN.md, "Reads
//! before writes".

use super::{Handler, Kernel, PageState};
use crate::page::{pmd_start, PAGE_SIZE, PMD_SIZE};
use crate::region::{Range, ReadVerdict};
use crate::stats::Stats;
use std::sync::atomic::Ordering::Relaxed;

impl<K: Kernel> Handler<'_, K> {
    /// Whether the read fault at `page_addr` of `range` takes pool pages. Looks first at the
    /// range's samples if the fault came past them.
    ///
    /// # Context
    /// A handler thread, for a read fault, before the window is located.
    pub(crate) fn read_takes_pool(&mut self, range: &Range, page_addr: usize) -> bool {
        if !self.opts.read_pool || !self.can_move {
            return false;
        }
        let mut reads = range.reads.lock().unwrap_or_else(|e| e.into_inner());
        let samples = reads.samples;
        let first = samples[0];
        if first != 0 && samples.iter().all(|&s| s < page_addr) {
            reads.samples = [0; 2];
            let n = if samples[1] == first + PAGE_SIZE { 2 } else { 1 };
            let mut states = [PageState::Absent; 2];
            let mut ok = self.k.page_states(first, &mut states[..n]);
            if n == 1 && samples[1] != 0 {
                ok &= self.k.page_states(samples[1], &mut states[1..]);
            }
            let written = states.iter().filter(|&&s| s == PageState::Own).count() as u64;
            let zero = states.iter().filter(|&&s| s == PageState::ZeroPage).count() as u64;
            if reads.pool {
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

    /// The sample pages of a read window `[first, end)` (pages of `range`) for the fault at
    /// `page_addr`: the last two pages of the window's part in the fault's PMD (its 4 KiB
    /// pages), or the fault's page alone when that part is shorter than three pages.
    pub(crate) fn read_samples(range: &Range, page_addr: usize, end: u64) -> [usize; 2] {
        let end_addr = range.addr_of(end).min(pmd_start(page_addr) + PMD_SIZE);
        if end_addr >= page_addr + 3 * PAGE_SIZE {
            [end_addr - 2 * PAGE_SIZE, end_addr - PAGE_SIZE]
        } else {
            [page_addr, 0]
        }
    }

    /// Maps the zero page at the samples of a read window served from the pool (`runs`: the
    /// window's claimed runs, as `(first page, pages)`), before the pool pages go in around
    /// them; returns the samples that went in.
    ///
    /// # Context
    /// A handler thread, serving a read fault with pool pages (`self.reading`).
    pub(crate) fn place_samples(&mut self, range: &Range, samples: [usize; 2], runs: &[(u64, u64)]) -> [usize; 2] {
        let mut placed = [0; 2];
        for (slot, &s) in placed.iter_mut().zip(&samples) {
            let page = range.page_of(s);
            let claimed = runs.iter().any(|&(f, n)| f <= page && page < f + n);
            if s != 0 && claimed && self.fill_zeropage(s, PAGE_SIZE).is_ok() {
                *slot = s;
            }
        }
        placed
    }

    /// Keeps `samples` as the range's samples, for its next read fault past them.
    pub(crate) fn keep_samples(range: &Range, samples: [usize; 2], pool: bool) {
        if samples[0] == 0 && samples[1] == 0 {
            return;
        }
        let mut reads = range.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.samples = if samples[0] == 0 { [samples[1], 0] } else { samples };
        reads.pool = pool;
    }
}
