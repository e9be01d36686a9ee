//! Lending starved ranges to the kernel (never slower than the kernel).
//!
//! When the pool cannot keep up, every page of a stream is made while its thread waits, at
//! more CPU than the kernel's own huge-page fault spends on it (a populate, a move, a round
//! trip; docs/SCALING.md has the ratio the `auto` rule uses). With
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

use crate::fault::{Handler, Kernel};
use crate::memory::region::Range;
use crate::page::{pages, pmd_start, PMD_PAGES, PMD_SIZE};
use crate::stats::{nanos, Stats};
use crate::sync;
use crate::sys::mman;
use crate::Shared;
use std::sync::atomic::Ordering::{AcqRel, Relaxed};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    ///
    /// # Context
    /// A handler, on each fault; atomics only.
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
    ///
    /// # Context
    /// A handler; atomics only.
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
    /// # Context
    /// The program thread starting the engine.
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
    ///
    /// # Context
    /// A handler; atomics and the range's own counters.
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
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn any(&self) -> bool {
        self.outstanding.load(Relaxed) > 0
    }

    /// The program's huge-page advice for `[a, b)` changed (`Engine::set_huge`): a loan there
    /// gives it back with that advice, not the advice it had when lent.
    ///
    /// # Context
    /// A program thread, in the shim's madvise hook; takes the loans lock.
    pub(crate) fn advise(&self, a: usize, b: usize, on: bool) {
        if !self.any() {
            return;
        }
        let mut loans = self.loans();
        for l in loans.iter_mut().filter(|l| l.start < b && a < l.start + l.len) {
            // Whole PMDs of both, as the engine's record of advice keeps them.
            let (x, y) = (
                a.max(l.start).next_multiple_of(PMD_SIZE),
                pmd_start(b.min(l.start + l.len)),
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
    /// under `Shared::registration`.
    ///
    /// # Context
    /// A program thread, a Region's drop, holding the registration lock; takes the loans lock.
    pub(crate) fn forget(&self, owner: u64, stats: &Stats) {
        let mut loans = self.loans();
        let before = loans.len();
        loans.retain(|l| l.owner != Some(owner));
        Stats::add(&stats.retakes_dropped, (before - loans.len()) as u64);
        self.loans_changed(&loans);
    }
}

impl<K: Kernel> Handler<'_, K> {
    /// Whether the kernel makes huge pages fast right now: this handler's last staging
    /// populate, within the last second, took at most `lend_populate_max`. No recent
    /// populate: nothing known, no loan.
    ///
    /// # Context
    /// A handler; no lock.
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
    ///
    /// # Context
    /// A handler. Takes the registration lock, then the loans lock; the unregister and the advice
    /// may sleep on the mmap lock.
    pub(crate) fn lend(&mut self, range: &Arc<Range>, page_addr: usize) -> bool {
        let own_advice = range.own_advice.load(Relaxed);
        if self.stage.is_none() || !(range.pmds.wants_huge(page_addr) || own_advice) {
            return false;
        }
        let (start, end) = Self::lend_span(range, page_addr, own_advice);
        let len = end - start;
        let shared = self.shared;
        let _reg = shared.registration_lock();
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
        if let Err(e) = self.kernel.unregister(start, len) {
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
    ///
    /// # Context
    /// A handler, when idle. Takes the registration lock, then the loans lock inside it, and for
    /// each loan taken back the range table's write lock; registering again (and the advice put
    /// back) may sleep on the mmap lock, and the take-back reads `/proc/self/maps` and
    /// `/proc/self/pagemap`.
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
        let _reg = shared.registration_lock();
        let mut loans = lending.loans();
        let mut i = 0;
        while i < loans.len() {
            if !loans[i].due(now) {
                i += 1;
                continue;
            }
            let loan = loans.swap_remove(i);
            let back = take_back(shared, self.kernel, &loan).unwrap_or_else(|e| {
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
    ///
    /// # Context
    /// A program thread recycling memory (`Engine::recycle`, the shim's free). While a loan is
    /// out: takes the registration lock, then the loans lock and the descriptor's read lock
    /// inside it; each loan it ends is taken back as in [`Handler::retake`] (the range table's
    /// write lock; may sleep on the mmap lock).
    pub(crate) fn end_loans(&self, addr: usize, end: usize) {
        if !self.lending.any() {
            return;
        }
        let _reg = self.registration_lock();
        let mut loans = self.lending.loans();
        let held = self.uffd_here();
        let uffd = held.as_deref().and_then(Option::as_ref);
        let mut i = 0;
        while i < loans.len() {
            if loans[i].start >= end || loans[i].start + loans[i].len <= addr {
                i += 1;
                continue;
            }
            let l = loans.swap_remove(i);
            let back = uffd.is_some_and(|u| take_back(self, u, &l).unwrap_or(false));
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

/// Registers a loan again through `kernel`, under `Shared::registration` (which Region::drop takes to forget
/// its loans): only if nothing else was registered there meanwhile and it is still anonymous
/// private memory. `Ok(false)`: dropped; `Err`: the registration was refused.
fn take_back(shared: &Shared, kernel: &impl Kernel, loan: &Loan) -> Result<bool, crate::sys::raw::Errno> {
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
    if let Err(e) = unsafe { kernel.register(start, len) } {
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
        let table = crate::memory::ranges::RangeTable::default();
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
}

/// Loom model of the recent-faulters table (`RUSTFLAGS="--cfg loom"`, see `.ci/run`): two
/// threads whose ids hash to one slot note their faults at once.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::{Faulters, FAULTER_SLOTS};
    use crate::sync::loom_model as model;
    use loom::sync::Arc;
    use loom::thread;
    use std::sync::atomic::Ordering::Relaxed;

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
