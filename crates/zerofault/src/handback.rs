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

use crate::fault::{Handler, Kernel};
use crate::page::{bytes, pages, PMD_PAGES};
use crate::predict::Outcome;
use crate::region::Range;
use crate::stats::Stats;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Pages per miss above which a second hand-back from one range returns all of it.
const SPARSE_PAGES_PER_MISS: u64 = 64 * PMD_PAGES;

/// Unpredicted faults in a row in one region, and where they fell.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MissRun {
    count: u64,
    lo: u64,
    hi: u64,
}

impl MissRun {
    /// Records one fault's outcome on `page`. After `limit` misses in a row (limit 0: never)
    /// returns the pages `[lo, hi]` they spanned, inclusive, and starts counting afresh.
    pub(crate) fn record(&mut self, outcome: Outcome, page: u64, limit: u64) -> Option<(u64, u64)> {
        match outcome {
            Outcome::Hit => self.count = 0,
            Outcome::Start => {}
            Outcome::Miss => {
                if self.count == 0 {
                    (self.lo, self.hi) = (page, page);
                }
                self.count += 1;
                self.lo = self.lo.min(page);
                self.hi = self.hi.max(page);
                if limit > 0 && self.count >= limit {
                    self.count = 0;
                    return Some((self.lo, self.hi));
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
pub(crate) fn handback_span(lo: u64, hi: u64, pages: u64, phase: u64) -> (u64, u64) {
    if (hi - lo + 1) * 2 >= pages {
        return (0, pages);
    }
    let phase = phase % PMD_PAGES;
    (
        ((lo + phase) / PMD_PAGES * PMD_PAGES).saturating_sub(phase),
        (((hi + phase) / PMD_PAGES + 1) * PMD_PAGES - phase).min(pages),
    )
}

impl<K: Kernel> Handler<'_, K> {
    /// Unregisters the span of `range` that misses `[lo, hi]` call for (see [`handback_span`]):
    /// the kernel serves it natively from now on.
    ///
    /// The span leaves the table (its pieces keep their page states), so that the engine keeps
    /// nothing for memory it no longer serves. A second hand-back from one range (or its
    /// pieces) for misses at least [`SPARSE_PAGES_PER_MISS`] apart on average gives back the
    /// whole range: one page touched per GiB of a 16 TiB reservation would otherwise cost a
    /// round trip per page for ever. Returns the span, in pages of `range`.
    pub(crate) fn hand_back(&mut self, range: &Arc<Range>, lo: u64, hi: u64) -> Option<(u64, u64)> {
        let sparse = (hi - lo) / self.opts.handback_misses.max(1) >= SPARSE_PAGES_PER_MISS;
        let (first, end) = match range.handbacks.load(Relaxed) {
            n if n > 0 && sparse => (0, range.pages),
            _ => handback_span(lo, hi, range.pages, pages(range.start)),
        };
        let (addr, len) = (range.addr_of(first), bytes(end - first));
        let shared = self.shared;
        let _reg = shared.reg_lock();
        // A range released, cut or replaced since the fault is not handed back: its span may
        // be another range's now.
        if shared.ranges.find(range.start).is_none_or(|r| r.id != range.id) {
            Stats::add(&self.stats().handbacks_stale, 1);
            return None;
        }
        if let Err(e) = self.k.unregister(addr, len) {
            self.note_errno(e);
            return None;
        }
        range.handbacks.fetch_add(1, Relaxed);
        shared.ranges.drop_span(addr, addr + len);
        Stats::add(&self.stats().handbacks, 1);
        Stats::add(&self.stats().pages_handed_back, end - first);
        Some((first, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::{Predictor, Tuning};
    use crate::testing::Lcg;

    const T: Tuning = crate::testing::TUNING;

    #[test]
    fn miss_run_hands_back_the_span_after_limit_misses_in_a_row() {
        let mut r = MissRun::default();
        assert_eq!(r.record(Outcome::Start, 50, 3), None);
        assert_eq!(r.record(Outcome::Miss, 70, 3), None);
        assert_eq!(r.record(Outcome::Miss, 20, 3), None);
        assert_eq!(r.record(Outcome::Hit, 21, 3), None); // a hit resets the run
        assert_eq!(r.record(Outcome::Miss, 900, 3), None);
        assert_eq!(r.record(Outcome::Start, 10, 3), None); // neutral
        assert_eq!(r.record(Outcome::Miss, 300, 3), None);
        assert_eq!(r.record(Outcome::Miss, 500, 3), Some((300, 900)));
        assert_eq!(r.record(Outcome::Miss, 1, 3), None); // counting starts afresh
        assert_eq!(r.record(Outcome::Miss, 1, 0), None);
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
    fn random_faults_trip_the_miss_run_quickly() {
        // A pseudo-random single-thread walk over a region: misses every time after the start.
        let mut p = Predictor::new();
        let mut r = MissRun::default();
        let mut g = Lcg(12345);
        let mut tripped_at = None;
        for i in 0..100 {
            let page = g.below(262_144);
            let w = p.on_fault(page, 262_144, &T);
            if r.record(w.outcome, page, 8).is_some() {
                tripped_at = Some(i);
                break;
            }
        }
        assert_eq!(tripped_at, Some(8));
    }
}
