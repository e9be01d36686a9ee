//! Giving random access back to the kernel (the `mmap_miss` idea of mm/filemap.c, at region
//! granularity).
//!
//! A uffd round trip costs about ten native faults, so serving sparse faults one window each
//! only costs time and inflates memory. [`MissRun`] counts unpredicted faults in a row in one
//! range (any hit resets it, the first fault of a thread is neutral) and remembers the lowest
//! and highest page they fell on. After `handback_misses` in a row, that span, widened to whole
//! PMDs ([`handback_span`]), is unregistered: the kernel serves it natively from then on, while
//! a sequential part of the same arena elsewhere keeps its windows. Misses spread over half the
//! range or more hand back the whole range at once, and so does a second hand-back from one
//! range whose misses lie far apart (a sparse stride through a huge reservation). The
//! measurements behind the thresholds are in docs/DESIGN.md.
//!
//! Lending, the other way a range goes to the kernel, is `lend.rs`.

use crate::fault::window::{Outcome, STREAMS};
use crate::fault::{Handler, Kernel};
use crate::memory::region::MissRun;
use crate::memory::region::Range;
use crate::page::{bytes, pages, PMD_PAGES};
use crate::stats::Stats;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Pages per miss above which a second hand-back from one range returns all of it.
const SPARSE_PAGES_PER_MISS: u64 = 64 * PMD_PAGES;

/// How far past a sparse stream's fault its way goes back to the kernel, at least: 256 MiB,
/// or [`SPARSE_STRIDES`] strides. Finding a stream sparse again past it costs three to six
/// round trips and a hand-back: a reach of 64 MiB lost a strided writer a sixth of its time
/// to native, 256 MiB a twenty-fifth (docs/DESIGN.md, "Sparse streams").
pub(crate) const SPARSE_REACH: u64 = 128 * PMD_PAGES;
/// Strides of a sparse stream given back at once, at least: given back 1024 strides at a time,
/// a stream touching one page in 64 or fewer lost a seventh of its time to native, at 4096 a
/// sixteenth (docs/DESIGN.md, "Sparse streams").
const SPARSE_STRIDES: u64 = 4096;

/// Misses this far apart, each from the one before, are scattered ones (see [`MissRun`]). A
/// sequential writer that stumbles (a stride change, another thread's window in its way) may
/// miss farther than this, but its next fault hits, and a hit ends the run. 4 PMDs: random
/// faults over a 1 GiB region land this far apart 98% of the time.
const SCATTER_PAGES: u64 = 4 * PMD_PAGES;

/// A run of misses to hand back: the pages `[lo, hi]` they spanned, inclusive, and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Misses {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    pub(crate) count: u64,
    /// Each miss fell [`SCATTER_PAGES`] or more from the one before.
    pub(crate) scattered: bool,
}

/// Counting unpredicted faults in a row in one region ([`MissRun`], a record of the range's),
/// and where they fell.
///
/// After `limit` misses in a row the span they fell in goes back to the kernel; after half as
/// many, and more than the predictor's [`STREAMS`] per thread, when one thread made them all
/// and each fell [`SCATTER_PAGES`] or more from the one before it. Each fault before the
/// hand-back costs a round trip (tens of kernel faults: docs/DESIGN.md, "Handing random access
/// back"), so random access spread over a region is handed back after 6 faults instead of 9
/// (the stream's start and 5 misses; docs/DESIGN.md). Misses close together, the
/// way a sequential writer stumbles, still get the whole `limit`, and so do:
/// - a thread opening its streams: a column store writing its columns round-robin misses once
///   per stream before the first hit (4 columns of 64 MiB lost their region to an early trip
///   at 4);
/// - threads each writing their own part of one region: each misses where its part starts
///   again after a discard (`verify`'s recycle-threads pattern lost its region that way before
///   the rule asked for one thread);
/// - faults of a thread the kernel does not name (tid 0, no `UFFD_FEATURE_THREAD_ID`).
impl MissRun {
    /// Records the outcome of thread `tid`'s fault on `page`. After `limit` misses in a row
    /// (limit 0: never), or half as many scattered ones, returns the run and starts counting
    /// afresh.
    ///
    /// # Context
    /// A handler, under the range's `misses` lock.
    pub(crate) fn record(&mut self, outcome: Outcome, page: u64, limit: u64, tid: u32) -> Option<Misses> {
        match outcome {
            Outcome::Hit | Outcome::Probe => self.count = 0,
            Outcome::Start => {}
            Outcome::Miss | Outcome::Sparse => {
                if self.count == 0 {
                    (self.lo, self.hi, self.tid, self.scattered) = (page, page, tid, tid != 0);
                } else {
                    self.scattered &= tid == self.tid && page.abs_diff(self.last) >= SCATTER_PAGES;
                }
                self.count += 1;
                self.last = page;
                self.lo = self.lo.min(page);
                self.hi = self.hi.max(page);
                let early = self.scattered && self.count >= limit.div_ceil(2).max(STREAMS as u64 + 1);
                if limit > 0 && (self.count >= limit || early) {
                    let run = Misses {
                        lo: self.lo,
                        hi: self.hi,
                        count: self.count,
                        scattered: self.scattered,
                    };
                    self.count = 0;
                    return Some(run);
                }
            }
        }
        None
    }
}

/// The pages `[first, end)` to hand back for misses that spanned pages `[lo, hi]` of a range of
/// `pages` pages whose first page is `phase` pages into a PMD: widened to whole PMDs of the
/// address space (a hand-back splits the program's VMA there, and a split on a PMD boundary is
/// one a huge page would make anyway), and to the whole range when they spanned half of it or
/// more (misses spread over a whole region mean the region is random: handing back a part
/// would only make the next misses fall outside it).
///
/// # Context
/// Any thread; arithmetic only.
pub(crate) fn handback_span(lo: u64, hi: u64, pages: u64, phase: u64) -> (u64, u64) {
    if (hi - lo + 1) * 2 >= pages {
        return (0, pages);
    }
    pmd_span(lo, hi, pages, phase)
}

/// Pages `[lo, hi]` widened to whole PMDs of the address space (the range's first page is
/// `phase` pages into one), within the range's `pages`.
fn pmd_span(lo: u64, hi: u64, pages: u64, phase: u64) -> (u64, u64) {
    let phase = phase % PMD_PAGES;
    (
        ((lo + phase) / PMD_PAGES * PMD_PAGES).saturating_sub(phase),
        (((hi + phase) / PMD_PAGES + 1) * PMD_PAGES - phase).min(pages),
    )
}

/// Write windows of a PMD or more in a row that the huge ring could not fill, after which a
/// range may be lent: 16-64 MiB streamed starved (a stream's first windows are small and
/// count for nothing either way, so that threads starting together on an engine just started,
/// its pool still empty, are not taken for starved ones).
impl<K: Kernel> Handler<'_, K> {
    /// Unregisters the span of `range` that misses `[lo, hi]` call for (see [`handback_span`]):
    /// the kernel serves it natively from now on.
    ///
    /// The span leaves the table (its pieces keep their page states), so that the engine keeps
    /// nothing for memory it no longer serves. A second hand-back from one range (or its
    /// pieces) for misses at least [`SPARSE_PAGES_PER_MISS`] apart on average gives back the
    /// whole range: one page touched per GiB of a 16 TiB reservation would otherwise cost a
    /// round trip per page for ever. Returns the span, in pages of `range`.
    ///
    /// # Context
    /// A handler. Takes the registration lock; the unregister ioctl may sleep on the mmap lock.
    pub(crate) fn hand_back(&mut self, range: &Arc<Range>, misses: Misses) -> Option<(u64, u64)> {
        let Misses {
            lo,
            hi,
            count,
            scattered,
        } = misses;
        let sparse = (hi - lo) / count.max(1) >= SPARSE_PAGES_PER_MISS;
        // Scattered misses over a quarter of a Region or more: random access over it (5
        // random faults span a quarter of it 98% of the time). A part handed back would leave
        // the rest to fault again, each fault a round trip, and a piece left over is a new
        // range whose misses count afresh (docs/DESIGN.md, "Figures that left the code
        // comments"). Only a Region's range, which is one allocation: a
        // shim arena holds many, and only misses over half of it give it all back.
        let spread = scattered && range.owner.is_some() && (hi - lo + 1) * 4 >= range.pages;
        let (first, end) = match range.handbacks.load(Relaxed) {
            _ if spread => (0, range.pages),
            n if n > 0 && sparse => (0, range.pages),
            _ => handback_span(lo, hi, range.pages, pages(range.start)),
        };
        self.give_back(range, first, end, true)
    }

    /// A sparse stream at `page` of `range`, going `stride` pages a fault (see fault/window.rs):
    /// the next [`SPARSE_REACH`] pages its way (or [`SPARSE_STRIDES`], if more), in whole PMDs from
    /// the fault's, go back to the kernel. True when the faulting page went with them.
    ///
    /// Not the whole range: a shim arena holds many blocks, and the stream's own ends nobody
    /// knows where. A stream that goes on past the span starts afresh in the range left over,
    /// and is found sparse again within three to six faults.
    ///
    /// # Context
    /// A handler. Takes the registration lock; the unregister ioctl may sleep on the mmap lock.
    pub(crate) fn hand_back_sparse(&mut self, range: &Arc<Range>, page: u64, stride: i64) -> bool {
        let reach = SPARSE_REACH.max(stride.unsigned_abs().saturating_mul(SPARSE_STRIDES));
        let (lo, hi) = if stride >= 0 {
            (page, page.saturating_add(reach).min(range.pages) - 1)
        } else {
            (page.saturating_sub(reach), page)
        };
        // Not widened to the whole range past half of it, as misses are: other threads' streams
        // may be writing the rest.
        let (mut first, mut end) = pmd_span(lo, hi, range.pages, pages(range.start));
        // Nor past the accessible mappings around the fault: in the shim's arena, free space
        // is PROT_NONE, and the blocks made there later would be the kernel's for good.
        if let Some((m0, m1)) = self.mapping_around(range.addr_of(page)) {
            first = first.max(range.page_of(m0.max(range.start)));
            end = end.min(range.page_of(m1.min(range.end())));
        }
        if first >= end {
            return false;
        }
        let Some((a, b)) = self.give_back(range, first, end, false) else {
            return false;
        };
        // Sparse to the range's end its way (a stack gone down to its bottom, a mapping
        // strided to its end): one more mapping not worth registering (`Engine::leaves_mapping`).
        if (stride >= 0 && b == range.pages) || (stride < 0 && a == 0) {
            self.shared.sparse_run.fetch_add(1, Relaxed);
        }
        (a..b).contains(&page)
    }

    /// Unregisters pages `[first, end)` of `range` (see [`Self::hand_back`]); `count`: as one
    /// of the range's hand-backs of misses (`Range::handbacks`: a second one of sparse misses
    /// gives back the rest), which a sparse stream's is not.
    fn give_back(&mut self, range: &Arc<Range>, first: u64, end: u64, count: bool) -> Option<(u64, u64)> {
        let (addr, len) = (range.addr_of(first), bytes(end - first));
        let shared = self.shared;
        let _reg = shared.registration_lock();
        // A range released, cut or replaced since the fault is not handed back: its span may
        // be another range's now.
        if shared.ranges.find(range.start).is_none_or(|r| r.id != range.id) {
            Stats::add(&self.stats().handbacks_stale, 1);
            return None;
        }
        if let Err(e) = self.kernel.unregister(addr, len) {
            self.note_errno(e);
            return None;
        }
        if count {
            range.handbacks.fetch_add(1, Relaxed);
        }
        shared.ranges.drop_span(addr, addr + len);
        Stats::add(&self.stats().handbacks, 1);
        Stats::add(&self.stats().pages_handed_back, end - first);
        Some((first, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::window::{Predictor, Tuning};
    use crate::sys::mman;
    use crate::testing::Lcg;

    const T: Tuning = crate::testing::TUNING;

    /// The run `record` returns for misses `[lo, hi]`, `count` of them.
    fn misses(lo: u64, hi: u64, count: u64, scattered: bool) -> Option<Misses> {
        Some(Misses {
            lo,
            hi,
            count,
            scattered,
        })
    }

    /// A run of misses not all far apart.
    fn near(lo: u64, hi: u64, count: u64) -> Option<Misses> {
        misses(lo, hi, count, false)
    }

    #[test]
    fn miss_run_hands_back_the_span_after_limit_misses_in_a_row() {
        let mut r = MissRun::default();
        assert_eq!(r.record(Outcome::Start, 50, 3, 7), None);
        assert_eq!(r.record(Outcome::Miss, 70, 3, 7), None);
        assert_eq!(r.record(Outcome::Miss, 20, 3, 7), None);
        assert_eq!(r.record(Outcome::Hit, 21, 3, 7), None); // a hit resets the run
        assert_eq!(r.record(Outcome::Miss, 900, 3, 7), None);
        assert_eq!(r.record(Outcome::Start, 10, 3, 7), None); // neutral
        assert_eq!(r.record(Outcome::Miss, 300, 3, 7), None);
        assert_eq!(r.record(Outcome::Miss, 500, 3, 7), near(300, 900, 3));
        assert_eq!(r.record(Outcome::Miss, 1, 3, 7), None); // counting starts afresh
        assert_eq!(r.record(Outcome::Miss, 1, 0, 7), None);
    }

    #[test]
    fn scattered_misses_hand_back_after_half_as_many() {
        let far = SCATTER_PAGES;
        let run = |lo, hi, count| misses(lo, hi, count, true);
        // Each miss 4 PMDs or more from the one before: half of a limit of 8, and more than the
        // predictor's streams per thread: 5.
        let mut r = MissRun::default();
        assert_eq!(r.record(Outcome::Start, 0, 8, 7), None);
        for (i, page) in [10 * far, 2 * far, 7 * far, 12 * far].into_iter().enumerate() {
            assert_eq!(r.record(Outcome::Miss, page, 8, 7), None, "miss {i}");
        }
        assert_eq!(r.record(Outcome::Miss, 3 * far, 8, 7), run(2 * far, 12 * far, 5));
        // The same from a thread the kernel did not name (no UFFD_FEATURE_THREAD_ID): 0 is
        // every thread, so nothing is scattered.
        let mut r = MissRun::default();
        for page in [10 * far, 2 * far, 7 * far, 12 * far, 3 * far, 20 * far, 30 * far] {
            assert_eq!(r.record(Outcome::Miss, page, 8, 0), None, "{page}");
        }
        assert_eq!(r.record(Outcome::Miss, 40 * far, 8, 0), near(2 * far, 40 * far, 8));
        // One miss close to the one before: the run needs the whole limit.
        let mut r = MissRun::default();
        for page in [
            10 * far,
            2 * far,
            2 * far + far - 1,
            7 * far,
            20 * far,
            30 * far,
            40 * far,
        ] {
            assert_eq!(r.record(Outcome::Miss, page, 8, 7), None, "{page}");
        }
        assert_eq!(r.record(Outcome::Miss, 50 * far, 8, 7), near(2 * far, 50 * far, 8));
        // A stumbling sequential writer, misses a few pages apart: the whole limit.
        let mut r = MissRun::default();
        for k in 0..7 {
            assert_eq!(r.record(Outcome::Miss, 1000 + k * 40, 8, 7), None);
        }
        assert!(r.record(Outcome::Miss, 1280, 8, 7).is_some());
        // Four threads, each starting its own part of one region again (far apart, as above):
        // not one thread's random access, so the whole limit.
        let mut r = MissRun::default();
        let pages = [0, 10 * far, 20 * far, 30 * far, 5, 10 * far + 5, 20 * far + 5];
        for (page, tid) in pages.into_iter().zip([100, 101, 102, 103].into_iter().cycle()) {
            assert_eq!(r.record(Outcome::Miss, page, 8, tid), None, "{page}");
        }
        assert_eq!(r.record(Outcome::Miss, 30 * far + 5, 8, 103), near(0, 30 * far + 5, 8));
        // Small limits trip at the limit, never sooner.
        let mut r = MissRun::default();
        assert_eq!(r.record(Outcome::Miss, 0, 3, 7), None);
        assert_eq!(r.record(Outcome::Miss, far, 3, 7), None);
        assert_eq!(r.record(Outcome::Miss, 2 * far, 3, 7), run(0, 2 * far, 3));
        assert_eq!(
            r.record(Outcome::Miss, 5, 1, 7),
            run(5, 5, 1),
            "one miss is trivially scattered"
        );
    }

    #[test]
    fn handback_spans_are_whole_pmds_or_the_whole_range() {
        assert_eq!(handback_span(600, 700, 10_000, 0), (512, 1024));
        assert_eq!(handback_span(0, 0, 10_000, 0), (0, 512));
        assert_eq!(handback_span(9_990, 9_995, 10_000, 0), (9_728, 10_000));
        assert_eq!(handback_span(1_000, 6_000, 10_000, 0), (0, 10_000));
        assert_eq!(handback_span(3, 5, 8, 0), (0, 8));
        // A range that starts 256 pages into a PMD: spans end on the address space's PMDs.
        assert_eq!(handback_span(600, 700, 10_000, 256), (256, 768));
        assert_eq!(handback_span(100, 200, 10_000, 256), (0, 256));
        assert_eq!(handback_span(600, 700, 10_000, 512 + 256), (256, 768), "modulo a PMD");
    }

    #[test]
    fn populated_pmds_are_those_holding_a_page() {
        let pmd = crate::page::PMD_SIZE;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let a = mman::map_aligned(8 * pmd, pmd, rw, false).unwrap();
        // 4 KiB pages whatever the machine's THP setting (under `always` a touch would map a
        // whole huge page, and the runs would be PMDs).
        // SAFETY: our fresh mapping; advice changes no content.
        unsafe { mman::madvise(a, 8 * pmd, mman::MADV_NOHUGEPAGE) }.unwrap();
        for at in [a + pmd + 5 * crate::page::PAGE_SIZE, a + 3 * pmd, a + 8 * pmd - 1] {
            // SAFETY: inside our fresh mapping.
            unsafe { (at as *mut u8).write_volatile(1) };
        }
        let mut seen = vec![];
        mman::populated_pmds(a, 8 * pmd, |x, n| seen.push((x - a, n))).unwrap();
        assert_eq!(seen, [(pmd, pmd), (3 * pmd, pmd), (7 * pmd, pmd)]);
        // The kernel's PAGEMAP_SCAN (Linux 6.7; this project needs 6.8) gives the page runs.
        let f = std::fs::File::open("/proc/self/pagemap").unwrap();
        let mut runs = vec![];
        mman::pagemap_scan(&f, a, a + 8 * pmd, &mut |x, y| runs.push((x - a, y - a))).unwrap();
        let page = crate::page::PAGE_SIZE;
        assert_eq!(
            runs,
            [
                (pmd + 5 * page, pmd + 6 * page),
                (3 * pmd, 3 * pmd + page),
                (8 * pmd - page, 8 * pmd)
            ]
        );
        // A span starting and ending inside PMDs is clipped to itself.
        seen.clear();
        let from = a + pmd + pmd / 2;
        mman::populated_pmds(from, 2 * pmd, |x, n| seen.push((x - a, n))).unwrap();
        assert_eq!(seen, [(3 * pmd, pmd / 2)]);
        seen.clear();
        mman::populated_pmds(a + pmd, pmd / 2, |x, n| seen.push((x - a, n))).unwrap();
        assert_eq!(seen, [(pmd, pmd / 2)]);
        // SAFETY: the test's own mapping.
        unsafe { mman::unmap(a, 8 * pmd) }.unwrap();
    }

    #[test]
    fn one_thread_writing_four_columns_round_robin_keeps_its_region() {
        // A column store: one trailer page written first, then 4 columns of 64 MiB filled
        // a page at a time, round-robin, by one thread (a review's case: the predictor's 4
        // streams each miss once before their first hit, far apart). No hand-back at all.
        let pages = 65_536; // 256 MiB
        let col = pages / 4;
        let mut p = Predictor::new();
        let mut r = MissRun::default();
        let mut installed = std::collections::BTreeSet::new();
        let mut touch = |page: u64, p: &mut Predictor, r: &mut MissRun| {
            if installed.contains(&page) {
                return;
            }
            // Probing, as the handler does (the probe left out is the next page written).
            let w = p.on_fault_probing(page, pages, &|q| installed.contains(&q), &T);
            assert_ne!(w.outcome, Outcome::Sparse, "taken for a sparse stream at page {page}");
            installed.extend((w.first..w.first + w.pages).filter(|&q| Some(q) != w.probe));
            assert_eq!(r.record(w.outcome, page, 8, 9), None, "handed back at page {page}");
        };
        touch(pages - 1, &mut p, &mut r);
        for i in 0..col {
            for c in 0..4 {
                touch(c * col + i, &mut p, &mut r);
            }
        }
    }

    #[test]
    fn random_faults_trip_the_miss_run_quickly() {
        // A pseudo-random single-thread walk over a region: misses every time after the start.
        let mut p = Predictor::new();
        let mut r = MissRun::default();
        let mut g = Lcg(12345);
        let mut tripped_at = None;
        for i in 0..100 {
            let page = g.below(262_144);
            let w = p.on_fault(page, 262_144, &T);
            if r.record(w.outcome, page, 8, 7).is_some() {
                tripped_at = Some(i);
                break;
            }
        }
        // The start, then 5 misses scattered over the region (see MissRun).
        assert_eq!(tripped_at, Some(5));
    }
}
