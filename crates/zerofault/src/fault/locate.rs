//! Locating a fault: its range, whether its page is claimed already, its window, and the claim.

use super::events::EVENT_RETRIES;
use super::{Handler, Kernel};
use crate::fault::window::{Fault, Outcome, Window};
use crate::memory::region::Range;
use crate::options::AheadMode;
use crate::page::{page_start, pages, pmd_start, PAGE_SIZE, PMD_PAGES, PMD_SIZE};
use crate::stats::Stats;
use crate::sys::raw::Errno;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;

/// A located fault: the window to install, in pages of its range.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Located {
    pub(crate) first: u64,
    pub(crate) end: u64,
    /// Install writable pages (a write fault, or a fault that takes a whole huge page).
    pub(crate) write: bool,
    pub(crate) outcome: Outcome,
    /// The window ahead, `[first, end)` in pages of the range: whole PMDs installed after the
    /// thread is woken (see [`super::ahead`]).
    pub(crate) ahead: Option<(u64, u64)>,
    /// The predictor's clock after this window was predicted (see `Predictor::clock`).
    pub(crate) clock: u64,
    /// A page of `[first, end)` left out: a new stream's probe (see fault/window.rs).
    pub(crate) probe: Option<u64>,
}

impl<K: Kernel> Handler<'_, K> {
    /// One page fault, from its message to the wake.
    ///
    /// # Context
    /// A handler, for each page-fault message (read, or deferred while events were read).
    pub(crate) fn fault(&mut self, addr: usize, write: bool, tid: u32) {
        let page_addr = page_start(addr);
        if self.shared.is_doorbell(page_addr) {
            // Engine::drop rang one of the doorbells (one per handler, read one after the
            // other): answer it, and stop. (Anyone else touching it, a debugger
            // reading /proc/pid/mem, say, is answered and changes nothing.) Stop only once the
            // page is really there: a zero page refused with EAGAIN (an event pending: the
            // scrub discarding a pool ring, a munmap of the program's) would wake a reader that
            // faults again with no handler left to answer it (seen: Engine::drop hung in CI).
            let mut p = self.kernel.zeropage(page_addr, PAGE_SIZE);
            let mut retries = 0;
            while p.errno == Some(Errno(libc::EAGAIN)) && retries < EVENT_RETRIES {
                retries += 1;
                self.drain_events(retries);
                p = self.kernel.zeropage(page_addr, PAGE_SIZE);
            }
            let mapped = matches!(p.errno, None | Some(Errno(libc::EEXIST)));
            self.note(p);
            self.wake(page_addr);
            self.rung = mapped && self.shared.stopping.load(Acquire);
            return;
        }
        let stats = self.stats();
        Stats::add(&stats.fault_events, 1);
        if self.index > 0 {
            Stats::add(&stats.faults_on_other_handlers, 1);
        }
        Stats::add(if write { &stats.write_faults } else { &stats.read_faults }, 1);
        self.faults_seen += 1;
        if write {
            // Threads writing fresh memory: what lending weighs against the producers.
            self.shared.lending.faulters.note(tid);
        }
        if self.opts.panic_after != 0 && self.faults_seen == self.opts.panic_after && self.index == 0 {
            panic!(
                "zerofault: ZEROFAULT_PANIC_AFTER={} reached (testing fail-open)",
                self.opts.panic_after
            );
        }
        self.choose_nodes(tid, page_addr);
        let Some(range) = self.shared.ranges.find(page_addr) else {
            Stats::add(&stats.unknown_faults, 1);
            self.install_one(page_addr, write);
            return;
        };
        // A read in memory the program writes is served as a write (reads.rs); set before
        // `locate`, whose already-claimed path installs too.
        let take = !write && self.read_takes_pool(&range, page_addr, tid);
        self.reading = take;
        self.serve_located(&range, page_addr, write, tid);
        self.reading = false;
    }

    /// [`Self::fault`] once the fault's range is known: locate, install, and the window ahead.
    fn serve_located(&mut self, range: &Arc<Range>, page_addr: usize, write: bool, tid: u32) {
        let (take, stats) = (self.reading, self.stats());
        // Before `locate` marks the fault's PMD: a huge fault takes a whole huge page, no sample.
        let huge_fault = self.stage.is_some() && range.huge_fault(page_addr);
        if let Some(w) = self.locate(range, page_addr, write || take, tid) {
            // A read window of 4 KiB pages keeps samples.
            let sampled = !write && !huge_fault && (take || !w.write);
            self.samples = match sampled {
                true => Self::read_samples(range, page_addr, w.end, take),
                false => [0; 2],
            };
            if take {
                Stats::add(&stats.read_windows_pool, 1);
                Stats::add(&stats.read_pages_pool, w.end - w.first);
            }
            self.installing(Some((range.id, w.first, w.end)));
            let cut = self.install_window(range, page_addr, w);
            self.installing(None);
            if sampled {
                Self::keep_samples(range, self.samples, take, tid);
            }
            if let Some(p) = cut {
                // Part of the window was left out (an install gave up: events kept coming, or
                // memory was short): the thread faults there next, and that fault is the
                // stream going on, not a miss (repeated misses would hand the range back).
                // Unless another handler predicted that fault already (the thread was woken
                // by the install): then the stream moved on, and is left alone.
                let mut entry = self.shared.predictors.lock(range.id, tid);
                let predictor = entry.get();
                if predictor.clock() == w.clock {
                    predictor.installed_until(p);
                }
                drop(entry);
                Stats::add(&self.stats().windows_cut, 1);
                return;
            }
            if let Some((first, end)) = w.ahead {
                self.installing(Some((range.id, first, end)));
                let got = self.install_ahead(range, first, end, w.write);
                self.installing(None);
                if got < end {
                    self.shared.predictors.lock(range.id, tid).get().installed_until(got);
                }
            }
        }
    }

    /// The window for a fault at `page_addr` of `range`, or `None` when the fault was answered
    /// here: its page is claimed already (one page tried, and woken), or it went back to the
    /// kernel with a hand-back (woken, it faults natively).
    fn locate(&mut self, range: &Arc<Range>, page_addr: usize, write: bool, tid: u32) -> Option<Located> {
        let stats = self.stats();
        // Where the program asked for huge pages, the kernel tried one and asked us with the
        // PMD still empty: the fault takes a whole huge page, as a write would natively. A read
        // takes one too: natively it maps the huge zero page and the first write a huge page,
        // and 4 KiB zero pages here would leave that PMD 4 KiB pages for good.
        // Elsewhere the kernel gave the faulting PMD a page table before it queued the message.
        let huge_fault = self.stage.is_some() && range.huge_fault(page_addr);
        let write = write || huge_fault;
        if !huge_fault {
            range.pmds.mark_tables(page_addr, PAGE_SIZE);
        }
        let page = range.page_of(page_addr);
        if self.answer_claimed(range, page, page_addr, write) {
            return None;
        }
        let ready = self.ready_pages();
        let p = self.predict(range, (page, page_addr), write, huge_fault, ready, tid);
        let w = p.w;
        self.count_outcome(&w);
        if self.handed_back(range, page, &w, tid) {
            // The faulting page went back to the kernel: let it fault natively.
            self.wake(page_addr);
            return None;
        }
        if self.lent(range, page_addr, write, p.end - p.first, ready) {
            self.wake(page_addr);
            return None;
        }
        Stats::add(&stats.window_order[w.order as usize], 1);
        Some(Located {
            first: p.first,
            end: p.end,
            write,
            outcome: w.outcome,
            ahead: p.ahead,
            clock: p.clock,
            probe: w.probe.filter(|q| (p.first..p.end).contains(q)),
        })
    }

    /// A fault on page `page` (at `page_addr`) of `range` that another window claimed already:
    /// waits for that install if another handler has it in flight, installs the one page
    /// (`write`: writable), and says so (true: the fault is answered).
    ///
    /// # Context
    /// A handler thread, from [`Self::locate`], with no lock held; may sleep (at most
    /// `INFLIGHT_WAIT`, in [`Self::wait_for_other_install`]).
    #[inline]
    fn answer_claimed(&mut self, range: &Range, page: u64, page_addr: usize, write: bool) -> bool {
        if !range.map.is_claimed(page) {
            return false;
        }
        Stats::add(&self.stats().already_present, 1);
        self.wait_for_other_install(range.id, page, page_addr);
        self.install_one(page_addr, write);
        true
    }

    /// The predictor's window for the fault at `page_addr` (page `page`) of `range`, widened to whole PMDs
    /// for a huge fault, with its window ahead (`ready`: the pages one may take at once, see
    /// [`Self::ready_pages`]); the stream is updated to the end of both.
    ///
    /// # Context
    /// A handler thread, from [`Self::locate`]: takes and releases the stream's predictor lock
    /// (`Shared::predictors`), held until the window and its window ahead are decided; does not
    /// sleep.
    #[inline]
    fn predict(
        &self,
        range: &Range,
        (page, page_addr): (u64, usize),
        write: bool,
        huge_fault: bool,
        ready: u64,
        tid: u32,
    ) -> Predicted {
        // With huge pages, big windows end on PMD boundaries (in the address space).
        let phase = self.stage.is_some().then_some(pages(range.start) % PMD_PAGES);
        let (tuning, opts) = (self.tuning, self.opts);
        // Locked until the window and its window ahead are decided: any handler may read this
        // stream's next fault.
        let shared = self.shared;
        let mut entry = shared.predictors.lock(range.id, tid);
        let predictor = entry.get();
        let installed = |p: u64| range.map.is_claimed(p);
        let fault = Fault {
            page,
            end: range.pages,
            phase,
            probing: opts.probe && !huge_fault,
            installed: &installed,
        };
        let w = predictor.on_fault_at(fault, &tuning);
        let mut p = Predicted {
            w,
            first: w.first,
            end: w.first + w.pages,
            ahead: None,
            clock: 0,
        };
        if huge_fault {
            (p.first, p.end) = Self::whole_pmds(range, page, p.first, p.end);
            predictor.installed_to(p.end);
        }
        let confirmed = w.outcome == Outcome::Hit && w.order >= tuning.max_order;
        if confirmed && self.ahead != AheadMode::Off {
            self.plan_ahead(range, page_addr, write, huge_fault, ready, &mut p);
            predictor.installed_until(p.ahead.map_or(p.end, |(_, a1)| a1));
        }
        p.clock = predictor.clock();
        drop(entry);
        p
    }

    /// A huge fault's window `[first, end)` on page `page` of `range`: the whole PMDs the
    /// window touches, from the one of the fault.
    ///
    /// # Context
    /// A handler thread, from [`Self::predict`], with the stream's predictor lock held; takes
    /// no lock, does not sleep.
    #[inline]
    fn whole_pmds(range: &Range, page: u64, first: u64, end: u64) -> (u64, u64) {
        let pmd = |p: u64| range.page_of(pmd_start(range.addr_of(p)));
        (first.min(pmd(page)), (pmd(end - 1) + PMD_PAGES).min(range.pages))
    }

    /// A confirmed stream's window ahead, for the fault at `page_addr` of `range` and its
    /// window `p` (`ready`: see [`Self::ready_pages`]): with `ahead=fault` the window's end
    /// moves on, with `ahead=wake` `p.ahead` is set where a whole PMD is left ahead.
    ///
    /// # Context
    /// A handler thread, from [`Self::predict`], with the stream's predictor lock held; does
    /// not sleep.
    #[inline]
    fn plan_ahead(
        &self,
        range: &Range,
        page_addr: usize,
        write: bool,
        huge_fault: bool,
        ready: u64,
        p: &mut Predicted,
    ) {
        let (tuning, opts) = (self.tuning, self.opts);
        // A writer's windows ahead are whole PMDs, huge pages where the program lets them
        // be: the huge ring is worth filling.
        let next_pmd = pmd_start(page_addr) + PMD_SIZE;
        let huge_ahead = next_pmd < range.end() && range.may_take_huge(next_pmd, self.shared.thp_always);
        if write && huge_ahead && !self.shared.thp_disabled.load(Relaxed) {
            self.want_huge();
        }
        // A confirmed stream: a window ahead of as many pages as it has written so far
        // (at least its window, at most 2^ahead_order), in whole PMDs of the address
        // space (see ahead.rs).
        let want =
            p.w.streak
                .clamp(1 << tuning.max_order, 1 << opts.ahead_order.max(tuning.max_order));
        if self.ahead == AheadMode::Fault {
            p.end = self.ahead_in_fault(range, range.page_of(page_addr), want, ready, p.end);
        } else {
            p.ahead = Self::ahead_after_wake(range, page_addr, huge_fault, want, &mut p.end);
        }
    }

    /// `ahead=fault`: the window `[.., end)` of the fault on page `page` of `range` grown by
    /// part of a window ahead of `want` pages, installed before the thread is woken; returns
    /// its new end.
    ///
    /// # Context
    /// A handler thread, from [`Self::plan_ahead`], with the stream's predictor lock held;
    /// takes no lock, does not sleep.
    #[inline]
    fn ahead_in_fault(&self, range: &Range, page: u64, want: u64, ready: u64, end: u64) -> u64 {
        // Part of this window, installed before the thread is woken; but only as far
        // as the pool's ready huge pages (or, without a huge ring, 4 KiB pages) reach:
        // making each huge page here (a populate each) would hold every other thread's
        // fault behind this one.
        let target = (page + want).min(page + ready).min(range.pages);
        let cut = pmd_start(range.addr_of(target));
        let to = if target == range.pages {
            target
        } else if cut > range.addr_of(end) {
            range.page_of(cut)
        } else {
            end
        };
        if to <= end {
            return end;
        }
        let stats = self.stats();
        Stats::add(&stats.ahead_windows, 1);
        Stats::add(&stats.ahead_pages, to - end);
        to
    }

    /// `ahead=wake`: the window ahead of `want` pages, installed after the thread is woken,
    /// for the fault at `page_addr` of `range`; `end`, the window's, is cut to what the thread
    /// waits for.
    ///
    /// # Context
    /// A handler thread, from [`Self::plan_ahead`], with the stream's predictor lock held;
    /// takes no lock, does not sleep.
    #[inline]
    fn ahead_after_wake(
        range: &Range,
        page_addr: usize,
        huge_fault: bool,
        want: u64,
        end: &mut u64,
    ) -> Option<(u64, u64)> {
        // After the wake: the thread waits only for the pages up to the end of its PMD,
        // and the next PMD if fewer than half a PMD's are left in its own, so that it
        // has work while the handler starts on the window ahead (woken with one page
        // to write, it overtook the handler at once); a huge fault's window is whole
        // PMDs already.
        if !huge_fault {
            *end = (*end).min(range.page_of(pmd_start(page_addr + PMD_SIZE / 2) + PMD_SIZE));
        }
        let (from, to) = (
            range.addr_of(*end),
            pmd_start(range.addr_of((*end + want).min(range.pages))),
        );
        (from % PMD_SIZE == 0 && to > from).then(|| (*end, range.page_of(to)))
    }

    /// Counts window `w`'s outcome; a dense stream makes the program's mappings worth taking
    /// again (`Shared::sparse_run`).
    ///
    /// # Context
    /// A handler thread, from [`Self::locate`], with no lock held; takes none, does not sleep.
    #[inline]
    fn count_outcome(&self, w: &Window) {
        let stats = self.stats();
        Stats::add(
            match w.outcome {
                Outcome::Start => &stats.predict_starts,
                Outcome::Hit => &stats.predict_hits,
                Outcome::Miss => &stats.predict_misses,
                Outcome::Probe => &stats.predict_probes,
                Outcome::Sparse => &stats.sparse_streams,
            },
            1,
        );
        // Dense: a probe's fault, or a stream's second hit in a row (a hit with a probe of its
        // own went past its first probe; a stack's frames hit now and then on their way down).
        let dense = w.outcome == Outcome::Probe || (w.outcome == Outcome::Hit && w.order > self.tuning.start_order);
        if dense && self.shared.sparse_run.load(Relaxed) != 0 {
            // A dense stream: the program's mappings are worth taking again.
            self.shared.sparse_run.store(0, Relaxed);
        }
    }

    /// Hands back what window `w` of thread `tid`'s fault on page `page` of `range` calls for:
    /// a sparse stream's way ahead, or the span of a run of misses (see fault/handback.rs). True
    /// when the faulting page went back to the kernel with it.
    ///
    /// # Context
    /// A handler thread, from [`Self::locate`]: takes the range's misses lock, released before
    /// a hand-back, which takes the registration lock and the range table's; a hand-back's
    /// unregister may sleep on the mmap lock.
    #[inline]
    fn handed_back(&mut self, range: &Arc<Range>, page: u64, w: &Window, tid: u32) -> bool {
        let handing_back = self.opts.handback_misses > 0;
        if w.outcome == Outcome::Sparse && handing_back && self.hand_back_sparse(range, page, w.stride) {
            // The stream's way ahead, the faulting page with it, went back to the kernel.
            return true;
        }
        let handback = range.misses.lock().unwrap_or_else(|e| e.into_inner()).record(
            w.outcome,
            page,
            self.opts.handback_misses,
            tid,
        );
        // The faulting page went back to the kernel with the rest: let it fault natively.
        handback.is_some_and(|misses| {
            self.hand_back(range, misses)
                .is_some_and(|(a, b)| (a..b).contains(&page))
        })
    }

    /// Lends `range` to the kernel for a write window of `window` pages at `page_addr` that
    /// found `ready` pages (see [`Self::lend`]); true when it went, and the fault with it.
    ///
    /// # Context
    /// A handler thread, from [`Self::locate`], with no lock held; a loan takes the
    /// registration lock, the range table's and the loans lock; its advice and unregister may
    /// sleep on the mmap lock.
    #[inline]
    fn lent(&mut self, range: &Arc<Range>, page_addr: usize, write: bool, window: u64, ready: u64) -> bool {
        // Starved, with as many threads faulting as the kernel would serve faster: the range
        // goes to the kernel (see fault/handback.rs), and this fault with it. Only windows that go
        // on into a PMD with no page table count: there the engine wants a huge page, and the
        // kernel would make one; a PMD with a table (memory discarded after a loan, say) takes
        // 4 KiB pages from either.
        let next_pmd = pmd_start(page_addr) + PMD_SIZE;
        let huge_pool = self.can_move && self.stage.is_some() && self.home_pool().is_some_and(|p| p.huge.is_some());
        // Counted for every write window (in a row means in a row); lent only where the
        // kernel would take huge pages, and makes them fast now.
        write
            && huge_pool
            && self.shared.lending.starved(range, window, ready)
            && next_pmd < range.end()
            && !range.pmds.has_table(next_pmd)
            && self.kernel_makes_huge_pages_fast()
            && self.lend(range, page_addr)
    }
}

/// What [`Handler::locate`] takes from the predictor: its window, widened and stretched to
/// `[first, end)`, the window ahead, and the predictor's clock after it.
struct Predicted {
    w: Window,
    first: u64,
    end: u64,
    ahead: Option<(u64, u64)>,
    clock: u64,
}
