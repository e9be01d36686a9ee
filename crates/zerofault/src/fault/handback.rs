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
//! **Lending** (never slower than the kernel). When the pool cannot keep up, every
//! page of a stream is made while its thread waits, at about 1.6 times the CPU the kernel's
//! own huge-page fault spends on it (a populate, a move, a round trip; docs/SCALING.md). With
//! idle CPUs the engine still wins: its producers (the scrub, the handlers) make pages on
//! them. With as many threads faulting as the producers' CPUs are worth, the kernel making a
//! page on each faulting thread's CPU is faster, so the range being faulted is lent to it:
//! unregistered whole ([`Handler::lend`]), where the kernel's fault takes huge pages (the
//! program's advice, or an `Engine::map` region, advised `MADV_HUGEPAGE` for the loan). The
//! signal ([`Lending::starved`]): the last [`STARVED_WINDOWS`] write windows of a PMD or more found the huge ring
//! short of their pages, while at least `Options::lend_at` threads faulted within
//! [`ACTIVE_WITHIN`]. The loan ends ([`Handler::retake`]) once the pool holds half of
//! `scrub_stop` again and the loan has lasted [`RETAKE_AFTER`] (doubled for each loan of the
//! same place, up to [`RETAKE_MAX`]): registered again if it is still anonymous private memory
//! that nothing else registered meanwhile. Pages the kernel made stay; the engine serves the
//! holes again, in 4 KiB windows (any PMD may hold a page table now).

use crate::fault::window::{Outcome, STREAMS};
use crate::fault::{Handler, Kernel};
use crate::memory::region::MissRun;
use crate::memory::region::Range;
use crate::page::{bytes, pages, pmd_start, PMD_PAGES, PMD_SIZE};
use crate::stats::{nanos, Stats};
use crate::sync;
use crate::sys::mman;
use crate::Shared;
use std::sync::atomic::Ordering::{AcqRel, Relaxed};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
pub(crate) const STARVED_WINDOWS: u32 = 8;
/// A thread counts as faulting for this long after its last fault (longer than a cold window
/// of 8 MiB takes to make: docs/SCALING.md).
pub(crate) const ACTIVE_WITHIN: Duration = Duration::from_millis(10);
/// How recent the staging populate that lending weighs (`lend_populate_max`) must be.
pub(crate) const LEND_POPULATE_WITHIN: Duration = Duration::from_secs(1);
/// The shortest loan; each later loan of the same place lasts twice as long as the last.
pub(crate) const RETAKE_AFTER: Duration = Duration::from_millis(100);
/// The longest loan before the engine looks again.
pub(crate) const RETAKE_MAX: Duration = Duration::from_secs(10);
/// The most of a program's mapping (no Region to take it back) lent at once, from the fault on.
const LEND_FOR_GOOD_MAX: usize = 1 << 30;
/// Loans outstanding at once; a starved range finds no room beyond them and stays served.
const LOANS: usize = 16;
/// Slots of the recent-faulters table: distinct threads counted at most.
const FAULTER_SLOTS: usize = 64;
/// Slots a thread may take, from the one its id hashes to.
const PROBES: usize = 4;

/// The threads that faulted recently: one slot per thread id (hashed, a few probes), holding
/// when it last faulted. Lock-free and approximate: a thread whose slots are all taken by
/// others goes uncounted, which errs towards serving, never towards lending.
#[derive(Debug)]
pub(crate) struct Faulters {
    epoch: Instant,
    tids: [sync::AtomicU32; FAULTER_SLOTS],
    /// Nanoseconds since `epoch`, plus one (0: never).
    at: [sync::AtomicU64; FAULTER_SLOTS],
}

impl Default for Faulters {
    fn default() -> Faulters {
        Faulters {
            epoch: Instant::now(),
            tids: std::array::from_fn(|_| sync::AtomicU32::new(0)),
            at: std::array::from_fn(|_| sync::AtomicU64::new(0)),
        }
    }
}

impl Faulters {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Thread `tid` faults now.
    pub(crate) fn note(&self, tid: u32) {
        self.note_at(tid, self.now());
    }

    fn note_at(&self, tid: u32, now: u64) {
        let stale = now.saturating_sub(nanos(ACTIVE_WITHIN));
        let home = (tid as usize).wrapping_mul(0x9E37_79B9) % FAULTER_SLOTS;
        let slot = |probe: usize| (home + probe) % FAULTER_SLOTS;
        // Its own slot first, wherever it is among the probes: a thread that took a later
        // probe while its first was another's must not take the first too when that goes
        // stale (it would count twice, which errs towards lending).
        if let Some(i) = (0..PROBES).map(slot).find(|&i| self.tids[i].load(Relaxed) == tid) {
            self.at[i].store(now, Relaxed);
            return;
        }
        for i in (0..PROBES).map(slot) {
            let at = &self.at[i];
            let seen = at.load(Relaxed);
            if seen <= stale && at.compare_exchange(seen, now, AcqRel, Relaxed).is_ok() {
                self.tids[i].store(tid, Relaxed);
                return;
            }
        }
    }

    /// Distinct threads that faulted within the last [`ACTIVE_WITHIN`].
    pub(crate) fn active(&self) -> usize {
        self.active_at(self.now())
    }

    /// Distinct threads that faulted within [`ACTIVE_WITHIN`] of `now` (see `now`).
    fn active_at(&self, now: u64) -> usize {
        let since = now.saturating_sub(nanos(ACTIVE_WITHIN));
        self.at.iter().filter(|a| a.load(Relaxed) > since).count()
    }
}

/// A range lent to the kernel.
#[derive(Clone, Debug)]
struct Loan {
    start: usize,
    len: usize,
    owner: Option<u64>,
    own_advice: bool,
    /// The spans the program advised huge (`MADV_HUGEPAGE`, seen by the engine): their
    /// advice, and the engine's record of it, come back with the memory.
    huge: Vec<(usize, usize)>,
    /// Earlier loans of this place (the duration doubles with each).
    times: u32,
    since: Instant,
}

impl Loan {
    fn due(&self, now: Instant) -> bool {
        now.duration_since(self.since) >= loan_length(self.times)
    }
}

/// How long the `times`-th later loan of one place lasts at least.
fn loan_length(times: u32) -> Duration {
    RETAKE_AFTER.saturating_mul(1 << times.min(7)).min(RETAKE_MAX)
}

/// Lending's shared state (see the module doc).
#[derive(Debug)]
pub(crate) struct Lending {
    pub(crate) faulters: Faulters,
    /// Threads faulting at once from which a starved range is lent; `None`: never.
    at: Option<usize>,
    loans: Mutex<Vec<Loan>>,
    /// `loans.len()`, read without the lock.
    outstanding: AtomicUsize,
    /// When the first loan is due, in `faulters`' nanoseconds (`u64::MAX`: none): an idle
    /// handler looks without taking a lock.
    next_due: AtomicU64,
}

impl Lending {
    pub(crate) fn new(at: Option<usize>) -> Lending {
        Lending {
            faulters: Faulters::default(),
            at,
            loans: Mutex::new(Vec::with_capacity(LOANS)),
            outstanding: AtomicUsize::new(0),
            next_due: AtomicU64::new(u64::MAX),
        }
    }

    /// A write window of `window` pages of `range` found `ready` pages in the huge ring:
    /// whether the range is starved now (its last [`STARVED_WINDOWS`] windows of a PMD or more
    /// were short, with at least the lending threshold of threads faulting). Counted per
    /// range: windows of other ranges, fed or not, say nothing of this one.
    pub(crate) fn starved(&self, range: &Range, window: u64, ready: u64) -> bool {
        self.starved_at(range, window, ready, self.faulters.now())
    }

    fn starved_at(&self, range: &Range, window: u64, ready: u64, now: u64) -> bool {
        let Some(at) = self.at else { return false };
        if window < PMD_PAGES {
            return false;
        }
        if ready >= window {
            range.starved.store(0, Relaxed);
            return false;
        }
        let n = range.starved.fetch_add(1, Relaxed).saturating_add(1);
        n >= STARVED_WINDOWS && self.faulters.active_at(now) >= at
    }

    /// Whether any range is on loan.
    pub(crate) fn any(&self) -> bool {
        self.outstanding.load(Relaxed) > 0
    }

    /// The program's huge-page advice for `[a, b)` changed (`Engine::set_huge`): a loan there
    /// gives it back with that advice, not the advice it had when lent.
    pub(crate) fn advise(&self, a: usize, b: usize, on: bool) {
        if !self.any() {
            return;
        }
        let mut loans = self.loans();
        for l in loans.iter_mut().filter(|l| l.start < b && a < l.start + l.len) {
            // Whole PMDs of both, as the engine's record of advice keeps them.
            let (x, y) = (
                a.max(l.start).next_multiple_of(PMD_SIZE),
                b.min(l.start + l.len) / PMD_SIZE * PMD_SIZE,
            );
            if x >= y {
                continue;
            }
            let mut runs = Vec::with_capacity(l.huge.len() + 2);
            for &(p, q) in &l.huge {
                if p < x {
                    runs.push((p, q.min(x)));
                }
                if q > y {
                    runs.push((p.max(y), q));
                }
            }
            if on {
                runs.push((x, y));
            }
            runs.sort_unstable();
            l.huge = runs;
        }
    }

    /// When `loan` is due, in `faulters`' nanoseconds.
    fn due_ns(&self, loan: &Loan) -> u64 {
        let at = loan.since.saturating_duration_since(self.faulters.epoch) + loan_length(loan.times);
        u64::try_from(at.as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    /// `loans` changed: the next due time, and the count.
    fn loans_changed(&self, loans: &[Loan]) {
        let next = loans.iter().map(|l| self.due_ns(l)).min().unwrap_or(u64::MAX);
        self.next_due.store(next, Relaxed);
        self.outstanding.store(loans.len(), Relaxed);
    }

    fn loans(&self) -> std::sync::MutexGuard<'_, Vec<Loan>> {
        self.loans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The loans of Region `owner` end (it is dropped), counted as not taken back. Called
    /// under `Shared::reg`.
    pub(crate) fn forget(&self, owner: u64, stats: &Stats) {
        let mut loans = self.loans();
        let before = loans.len();
        loans.retain(|l| l.owner != Some(owner));
        Stats::add(&stats.retakes_dropped, (before - loans.len()) as u64);
        self.loans_changed(&loans);
    }
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
        // range whose misses count afresh (measured: 15 faults and 3 hand-backs for a random
        // 5% of 1 GiB, against 6 and 1). Only a Region's range, which is one allocation: a
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
        if count {
            range.handbacks.fetch_add(1, Relaxed);
        }
        shared.ranges.drop_span(addr, addr + len);
        Stats::add(&self.stats().handbacks, 1);
        Stats::add(&self.stats().pages_handed_back, end - first);
        Some((first, end))
    }

    /// Whether the kernel makes huge pages fast right now: this handler's last staging
    /// populate, within the last second, took at most `lend_populate_max`. No recent
    /// populate: nothing known, no loan.
    pub(crate) fn kernel_makes_huge_pages_fast(&self) -> bool {
        self.last_populate
            .is_some_and(|(at, took)| at.elapsed() <= LEND_POPULATE_WITHIN && took <= self.opts.lend_populate_max)
    }

    /// Lends `range` to the kernel, the engine being starved (see the module doc); true when
    /// it went: the thread faulting at `page_addr`, woken, faults natively.
    ///
    /// Only where the kernel's own fault takes huge pages: the program advised them at the
    /// fault (or THP is `always` there), or the advice is the engine's own (an `Engine::map`
    /// region, advised `MADV_HUGEPAGE` for the loan). Elsewhere the kernel would fault 4 KiB
    /// pages, slower than the engine starved (docs/SCALING.md, "The hand-back rule for T >= N:
    /// lending").
    ///
    /// A range with an owner (a Region) is taken back later ([`Self::retake`]); one without
    /// (the shim's, the program's own mappings) stays the kernel's, as after a hand-back:
    /// without a Region's lifetime nothing tells whether its addresses still hold the same
    /// mapping (a raw munmap raises no event once unregistered).
    pub(crate) fn lend(&mut self, range: &Arc<Range>, page_addr: usize) -> bool {
        let own_advice = range.own_advice.load(Relaxed);
        if self.stage.is_none() || !(range.pmds.wants_huge(page_addr) || own_advice) {
            return false;
        }
        let (start, end) = Self::lend_span(range, page_addr, own_advice);
        let len = end - start;
        let shared = self.shared;
        let _reg = shared.reg_lock();
        if shared.ranges.find(range.start).is_none_or(|r| r.id != range.id) {
            return false;
        }
        let lending = &shared.lending;
        let mut loans = lending.loans();
        if range.owner.is_some() && loans.len() >= LOANS {
            return false;
        }
        // The program's own huge-page advice in the span, put back when the loan ends.
        let mut huge = Vec::new();
        if range.owner.is_some() {
            let mut at = start;
            while at < end {
                let next = (pmd_start(at) + PMD_SIZE).min(end);
                if range.pmds.wants_huge(at) {
                    match huge.last_mut() {
                        Some((_, e)) if *e == at => *e = next,
                        _ => huge.push((at, next)),
                    }
                }
                at = next;
            }
        }
        // SAFETY: huge-page advice changes no content; the range is registered here, so the
        // mapping is the one the engine serves (its advice was the engine's to give).
        if own_advice && unsafe { mman::madvise(start, len, mman::MADV_HUGEPAGE) }.is_err() {
            return false;
        }
        if let Err(e) = self.k.unregister(start, len) {
            if own_advice {
                restore_advice(start, len, &huge);
            }
            self.note_errno(e);
            return false;
        }
        shared.ranges.drop_span(start, end);
        if range.owner.is_some() {
            loans.push(Loan {
                start,
                len,
                owner: range.owner,
                own_advice,
                huge,
                times: range.loans.load(Relaxed),
                since: Instant::now(),
            });
            lending.loans_changed(&loans);
        }
        range.starved.store(0, Relaxed);
        Stats::add(&self.stats().lends, 1);
        Stats::add(&self.stats().pages_lent, pages(len));
        true
    }

    /// The span of `range` that [`Self::lend`] lends for a fault at `page_addr`, `[start,
    /// end)` in bytes; `own_advice`: the range's huge-page advice is the engine's.
    ///
    /// # Context
    /// A handler thread, from [`Self::lend`], with no lock held yet; takes none, does not
    /// sleep.
    fn lend_span(range: &Range, page_addr: usize, own_advice: bool) -> (usize, usize) {
        // An Engine::map region goes whole (its advice is the engine's, and it comes back);
        // elsewhere only the run of PMDs the program advised huge around the fault: a shim
        // arena holding many blocks, one of them advised, lends that block alone.
        if own_advice {
            return (range.start, range.end());
        }
        let mut lo = pmd_start(page_addr);
        while lo >= range.start + PMD_SIZE && range.pmds.wants_huge(lo - PMD_SIZE) {
            lo -= PMD_SIZE;
        }
        // Lent for good (no owner) goes at most a GiB past the fault: under THP `always`
        // the shim takes a whole reservation for advised.
        let cap = if range.owner.is_some() {
            usize::MAX
        } else {
            pmd_start(page_addr) + LEND_FOR_GOOD_MAX
        };
        let mut hi = pmd_start(page_addr) + PMD_SIZE;
        while hi < range.end().min(cap) && range.pmds.wants_huge(hi) {
            hi += PMD_SIZE;
        }
        (lo.max(range.start), hi.min(range.end()))
    }

    /// Ends the loans that are due, once the pool holds half of `scrub_stop` again: the engine
    /// can win there again (see the module doc).
    pub(crate) fn retake(&mut self) {
        let shared = self.shared;
        let lending = &shared.lending;
        if !lending.any()
            || lending.faulters.now() < lending.next_due.load(Relaxed)
            || self.ready_pages() < pages(self.opts.scrub_stop) / 2
        {
            return;
        }
        let now = Instant::now();
        let _reg = shared.reg_lock();
        let mut loans = lending.loans();
        let mut i = 0;
        while i < loans.len() {
            if !loans[i].due(now) {
                i += 1;
                continue;
            }
            let loan = loans.swap_remove(i);
            let back = take_back(shared, self.k, &loan).unwrap_or_else(|e| {
                self.note_errno(e);
                false
            });
            Stats::add(
                if back {
                    &self.stats().retakes
                } else {
                    &self.stats().retakes_dropped
                },
                1,
            );
        }
        lending.loans_changed(&loans);
    }
}

impl Shared {
    /// The program recycles memory in `[addr, end)` (`Engine::recycle`): the loans there end
    /// now, whatever the pool holds, since recycled pages are the cheapest the engine makes
    /// (a thread that streamed fresh memory starved and then frees and touches it again in
    /// rounds would otherwise lose the recycling to the loan). On the program's thread.
    pub(crate) fn end_loans(&self, addr: usize, end: usize) {
        if !self.lending.any() {
            return;
        }
        let _reg = self.reg_lock();
        let mut loans = self.lending.loans();
        let uffd = self.uffd.read().unwrap_or_else(|e| e.into_inner());
        let mut i = 0;
        while i < loans.len() {
            if loans[i].start >= end || loans[i].start + loans[i].len <= addr {
                i += 1;
                continue;
            }
            let l = loans.swap_remove(i);
            let back = uffd.as_ref().is_some_and(|u| take_back(self, u, &l).unwrap_or(false));
            Stats::add(
                if back {
                    &self.stats.retakes
                } else {
                    &self.stats.retakes_dropped
                },
                1,
            );
        }
        self.lending.loans_changed(&loans);
    }
}

/// The advice of an `Engine::map` region's span after a loan: the engine's `MADV_NOHUGEPAGE`,
/// and the program's `MADV_HUGEPAGE` on the spans it advised.
fn restore_advice(start: usize, len: usize, huge: &[(usize, usize)]) {
    // SAFETY: the Region's own memory (its loan is not forgotten, so it lives); advice changes
    // no content.
    unsafe {
        let _ = mman::madvise(start, len, mman::MADV_NOHUGEPAGE);
        for &(a, b) in huge {
            let _ = mman::madvise(a, b - a, mman::MADV_HUGEPAGE);
        }
    }
}

/// Registers a loan again through `k`, under `Shared::reg` (which Region::drop takes to forget
/// its loans): only if nothing else was registered there meanwhile and it is still anonymous
/// private memory. `Ok(false)`: dropped; `Err`: the registration was refused.
fn take_back(shared: &Shared, k: &impl Kernel, loan: &Loan) -> Result<bool, crate::sys::raw::Errno> {
    let (start, len) = (loan.start, loan.len);
    if shared.ranges.any(start, start + len) || !mman::anonymous_private(start, len) {
        return Ok(false);
    }
    if loan.own_advice {
        restore_advice(start, len, &loan.huge);
    }
    let r = shared.ranges.insert(start, pages(len), loan.owner);
    for &(a, b) in &loan.huge {
        r.set_huge(a, b, true);
    }
    // The PMDs where the kernel put pages hold a page table or a huge page; the others take
    // whole huge pages again. Unreadable pagemap: any PMD may hold a table.
    if mman::populated_pmds(start, len, |a, n| r.pmds.mark_tables(a, n)).is_err() {
        r.pmds.mark_tables(start, len);
    }
    r.own_advice.store(loan.own_advice, Relaxed);
    r.loans.store(loan.times.saturating_add(1), Relaxed);
    // SAFETY: anonymous private memory of a live Region (checked just now, under the
    // registration lock), the engine's to serve until the loan: its missing pages read zero,
    // as the engine fills them.
    if let Err(e) = unsafe { k.register(start, len) } {
        // Still the kernel's, and still the Region's: back in `left` for its drop, with the
        // advice of the loan (the kernel's faults there take huge pages as they did).
        shared.ranges.remove(&r);
        if let Some(owner) = loan.owner {
            shared.ranges.leave(owner, start, start + len);
        }
        if loan.own_advice {
            // SAFETY: as in `restore_advice`.
            let _ = unsafe { mman::madvise(start, len, mman::MADV_HUGEPAGE) };
        }
        return Err(e);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::window::{Predictor, Tuning};
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
    fn faulters_count_distinct_threads_within_the_last_10_ms() {
        let f = Faulters::default();
        let ms = |n: u64| n * 1_000_000 + 1;
        assert_eq!(f.active_at(ms(0)), 0);
        f.note_at(100, ms(0));
        f.note_at(100, ms(1));
        assert_eq!(f.active_at(ms(1)), 1, "one thread however often it faults");
        f.note_at(200, ms(2));
        f.note_at(300, ms(3));
        assert_eq!(f.active_at(ms(3)), 3);
        // Counted for 10 ms after their last fault: at 12 ms only 300 (3 ms) is.
        assert_eq!(f.active_at(ms(11)), 2);
        assert_eq!(f.active_at(ms(12)), 1);
        assert_eq!(f.active_at(ms(14)), 0);
        // Slots of threads gone quiet are reused: many threads over time, the recent ones count.
        for (i, tid) in (1000..1200).enumerate() {
            f.note_at(tid, ms(20 + i as u64 * 20));
        }
        assert_eq!(f.active_at(ms(20 + 199 * 20)), 1);
        // 64 threads at once (the table's size) are all counted but for collisions past the
        // probes, which only ever count fewer.
        for tid in 5000..5064 {
            f.note_at(tid, ms(10_000));
        }
        let n = f.active_at(ms(10_000));
        assert!((48..=64).contains(&n), "{n}");
    }

    #[test]
    fn starved_needs_8_short_windows_of_a_pmd_in_a_row_in_one_range_and_enough_threads() {
        let table = crate::memory::region::RangeTable::default();
        let (r, other) = (
            table.insert(1 << 30, 1 << 18, None),
            table.insert(1 << 31, 1 << 18, None),
        );
        let now = 1_000_000_000;
        let l = Lending::new(Some(2));
        l.faulters.note_at(1, now);
        l.faulters.note_at(2, now);
        let starved = |range: &Range, window, ready| l.starved_at(range, window, ready, now);
        for _ in 0..7 {
            assert!(!starved(&r, 2048, 100));
        }
        assert!(!starved(&r, 256, 0), "a small window counts for nothing");
        assert!(
            !starved(&other, 2048, 0),
            "another range's window says nothing of this one"
        );
        assert!(!starved(&other, 2048, 4096), "nor does another range fed");
        assert!(starved(&r, 2048, 100), "the 8th short window in a row");
        assert!(!starved(&r, 2048, 2048), "a window filled resets the count");
        for _ in 0..7 {
            assert!(!starved(&r, 512, 0));
        }
        assert!(starved(&r, 512, 0));
        // The threads went quiet 10 ms ago: not starved, however short the windows.
        assert!(!l.starved_at(&r, 512, 0, now + 10_000_000));
        // One thread faulting: never starved (the producers outrun it).
        let one = Lending::new(Some(2));
        one.faulters.note_at(1, now);
        let r1 = table.insert(1 << 32, 1 << 18, None);
        assert!((0..20).all(|_| !one.starved_at(&r1, 2048, 0, now)));
        // Lending off.
        let off = Lending::new(None);
        off.faulters.note_at(1, now);
        off.faulters.note_at(2, now);
        let r2 = table.insert(1 << 33, 1 << 18, None);
        assert!((0..20).all(|_| !off.starved_at(&r2, 2048, 0, now)));
    }

    #[test]
    fn a_thread_is_counted_once_even_after_the_slot_it_hashes_to_frees() {
        let f = Faulters::default();
        let ms = |n: u64| n * 1_000_000 + 1;
        // Find two threads hashing to one slot: the second takes the next probe.
        let home = |tid: u32| (tid as usize).wrapping_mul(0x9E37_79B9) % FAULTER_SLOTS;
        let a = 7u32;
        let b = (8..100_000u32).find(|&t| home(t) == home(a)).unwrap();
        f.note_at(a, ms(0));
        f.note_at(b, ms(5));
        // a goes stale at 10 ms; b faults again at 12 ms and must keep its own slot.
        f.note_at(b, ms(12));
        assert_eq!(f.active_at(ms(12)), 1);
    }

    #[test]
    fn advice_the_program_gives_during_a_loan_comes_back_with_it() {
        let pmd = PMD_SIZE;
        let l = Lending::new(Some(2));
        let loan = |start, len, huge| Loan {
            start,
            len,
            owner: Some(1),
            own_advice: true,
            huge,
            times: 0,
            since: Instant::now(),
        };
        {
            let mut loans = l.loans();
            loans.push(loan(16 * pmd, 8 * pmd, vec![(17 * pmd, 19 * pmd)]));
            loans.push(loan(64 * pmd, 4 * pmd, vec![]));
            l.loans_changed(&loans);
        }
        // MADV_HUGEPAGE over the end of the first loan and past it, from mid-PMD: whole PMDs.
        l.advise(21 * pmd + 4096, 30 * pmd, true);
        // MADV_NOHUGEPAGE over part of the advised run.
        l.advise(18 * pmd, 19 * pmd, false);
        // Advice elsewhere touches no loan.
        l.advise(40 * pmd, 50 * pmd, true);
        let loans = l.loans();
        assert_eq!(loans[0].huge, [(17 * pmd, 18 * pmd), (22 * pmd, 24 * pmd)]);
        assert!(loans[1].huge.is_empty());
    }

    #[test]
    fn a_huge_page_is_told_from_4_kib_pages() {
        let pmd = PMD_SIZE;
        for (thp, huge) in [(mman::Thp::Always, true), (mman::Thp::Never, false)] {
            let m = mman::Mapping::new(pmd, thp).unwrap();
            m.populate().unwrap();
            // Under THP `never` (or memory too fragmented) no huge page: the answer is false.
            let never = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                .is_ok_and(|s| s.contains("[never]"));
            assert_eq!(
                mman::huge_mapped(m.as_ptr() as usize).unwrap(),
                huge && !never,
                "{thp:?}"
            );
        }
    }

    #[test]
    fn each_loan_of_a_place_lasts_twice_the_last_up_to_10_s() {
        assert_eq!(loan_length(0), Duration::from_millis(100));
        assert_eq!(loan_length(1), Duration::from_millis(200));
        assert_eq!(loan_length(3), Duration::from_millis(800));
        assert_eq!(loan_length(7), Duration::from_secs(10));
        assert_eq!(loan_length(u32::MAX), Duration::from_secs(10));
        let l = Loan {
            start: 0,
            len: 0,
            owner: Some(1),
            own_advice: true,
            huge: Vec::new(),
            times: 1,
            since: Instant::now(),
        };
        assert!(!l.due(l.since + Duration::from_millis(199)));
        assert!(l.due(l.since + Duration::from_millis(200)));
    }

    #[test]
    fn the_lending_threshold_follows_the_producers_the_cpus_and_the_knob() {
        let o = |v: &str| {
            let mut o = crate::Options::default();
            o.set("lend_threads", v).unwrap();
            o
        };
        // auto: ceil(min(producers, cpus) * 5 / 8).
        assert_eq!(o("auto").lend_at(2, 2), Some(2), "this machine: one handler, one scrub");
        assert_eq!(o("auto").lend_at(3, 2), Some(2));
        assert_eq!(o("auto").lend_at(2, 1), Some(1));
        assert_eq!(o("auto").lend_at(9, 64), Some(6), "8 handlers and a scrub on 64 CPUs");
        assert_eq!(o("auto").lend_at(16, 64), Some(10));
        assert_eq!(o("off").lend_at(2, 2), None);
        assert_eq!(o("3").lend_at(2, 2), Some(3));
        let mut x = crate::Options::default();
        for bad in ["0", "4097", "-1", "some"] {
            let e = x.set("lend_threads", bad).unwrap_err().to_string();
            assert!(e.contains("ZEROFAULT_LEND_THREADS") && e.contains("auto, off"), "{e}");
        }
    }

    #[test]
    fn anonymous_private_memory_is_told_from_files_shared_memory_and_holes() {
        let len = 8 * crate::page::PMD_SIZE;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let a = mman::map_aligned(len, crate::page::PMD_SIZE, rw, false).unwrap();
        assert!(mman::anonymous_private(a, len));
        // SAFETY: our fresh mapping; protection and a hole change what the test reads.
        unsafe {
            assert_eq!(
                libc::mprotect((a + len / 2) as *mut libc::c_void, len / 4, libc::PROT_READ),
                0
            );
        }
        assert!(mman::anonymous_private(a, len), "several VMAs, one kind");
        // SAFETY: as above.
        unsafe { mman::unmap(a + len / 4, crate::page::PAGE_SIZE) }.unwrap();
        assert!(!mman::anonymous_private(a, len), "a hole");
        assert!(mman::anonymous_private(a + len / 2, len / 2));
        // SAFETY: shared anonymous memory of the test's own, unmapped below.
        let shared = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                rw,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        assert!(!mman::anonymous_private(shared, len), "MAP_SHARED");
        let exe = std::fs::File::open("/proc/self/exe").unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a private read-only map of our own executable, unmapped below.
        let file = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                exe.as_raw_fd(),
                0,
            )
        } as usize;
        assert!(!mman::anonymous_private(file, 4096), "a file");
        // SAFETY: the test's own mappings.
        unsafe {
            mman::unmap(a, len).unwrap();
            mman::unmap(shared, len).unwrap();
            mman::unmap(file, 4096).unwrap();
        }
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

/// Loom model of the recent-faulters table (`RUSTFLAGS="--cfg loom"`, see `.ci/run`): two
/// threads whose ids hash to one slot note their faults at once.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::{Faulters, FAULTER_SLOTS};
    use loom::sync::Arc;
    use loom::thread;
    use std::sync::atomic::Ordering::Relaxed;

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    #[test]
    fn loom_threads_racing_for_a_slot_take_it_once_and_are_each_counted_once() {
        let home = |tid: u32| (tid as usize).wrapping_mul(0x9E37_79B9) % FAULTER_SLOTS;
        let a = 7u32;
        let b = (8..100_000u32).find(|&t| home(t) == home(a)).unwrap();
        let now = 1_000_000_000;
        model(move || {
            let f = Arc::new(Faulters::default());
            // `a` faults twice (its second fault must find its own slot), `b` once.
            let ta = {
                let f = f.clone();
                thread::spawn(move || {
                    f.note_at(a, now);
                    f.note_at(a, now + 1);
                })
            };
            let tb = {
                let f = f.clone();
                thread::spawn(move || f.note_at(b, now))
            };
            ta.join().unwrap();
            tb.join().unwrap();
            assert_eq!(f.active_at(now + 1), 2, "a thread counted twice, or a slot taken twice");
            let mut held: Vec<u32> = (0..FAULTER_SLOTS)
                .filter(|&i| f.at[i].load(Relaxed) > 0)
                .map(|i| f.tids[i].load(Relaxed))
                .collect();
            held.sort_unstable();
            assert_eq!(held, [a, b], "each thread in a slot of its own");
        });
    }
}
