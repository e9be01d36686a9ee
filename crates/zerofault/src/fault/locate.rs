//! Locating a fault: its range, whether its page is claimed already, its window, and the claim.

use super::handler::EVENT_RETRIES;
use super::{Handler, Kernel};
use crate::options::AheadMode;
use crate::page::{page_start, pages, pmd_start, PAGE_SIZE, PMD_PAGES, PMD_SIZE};
use crate::predict::{Fault, Outcome};
use crate::region::Range;
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
    /// A page of `[first, end)` left out: a new stream's probe (see predict.rs).
    pub(crate) probe: Option<u64>,
}

impl<K: Kernel> Handler<'_, K> {
    /// One page fault, from its message to the wake.
    pub(crate) fn fault(&mut self, addr: usize, write: bool, tid: u32) {
        let page_addr = page_start(addr);
        if self.shared.is_doorbell(page_addr) {
            // Engine::drop rang one of the doorbells (one per handler, read one after the
            // other): answer it, and stop. (Anyone else touching it, a debugger
            // reading /proc/pid/mem, say, is answered and changes nothing.) Stop only once the
            // page is really there: a zero page refused with EAGAIN (an event pending: the
            // scrub discarding a pool ring, a munmap of the program's) would wake a reader that
            // faults again with no handler left to answer it (seen: Engine::drop hung in CI).
            let mut p = self.k.zeropage(page_addr, PAGE_SIZE);
            let mut retries = 0;
            while p.errno == Some(Errno(libc::EAGAIN)) && retries < EVENT_RETRIES {
                retries += 1;
                self.drain_events(retries);
                p = self.k.zeropage(page_addr, PAGE_SIZE);
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
        if range.map.is_claimed(page) {
            Stats::add(&stats.already_present, 1);
            self.wait_for_other_install(range.id, page, page_addr);
            self.install_one(page_addr, write);
            return None;
        }

        // With huge pages, big windows end on PMD boundaries (in the address space).
        let phase = self.stage.is_some().then_some(pages(range.start) % PMD_PAGES);
        let (tuning, opts, ahead_mode) = (self.tuning, self.opts, self.ahead);
        let ready = self.ready_pages();
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
        let (mut first, mut end) = (w.first, w.first + w.pages);
        if huge_fault {
            // The whole PMDs the window touches, from the one of the fault.
            let pmd = |p: u64| range.page_of(pmd_start(range.addr_of(p)));
            first = first.min(pmd(page));
            end = (pmd(end - 1) + PMD_PAGES).min(range.pages);
            predictor.installed_to(end);
        }
        let mut ahead = None;
        let confirmed = w.outcome == Outcome::Hit && w.order >= tuning.max_order;
        if confirmed && ahead_mode != AheadMode::Off {
            // A writer's windows ahead are whole PMDs, huge pages where the program lets them
            // be: the huge ring is worth filling.
            let next_pmd = pmd_start(page_addr) + PMD_SIZE;
            let huge_ahead = next_pmd < range.end() && !range.pmds.no_huge(next_pmd);
            if write && huge_ahead && !self.shared.thp_disabled.load(Relaxed) {
                self.want_huge();
            }
            // A confirmed stream: a window ahead of as many pages as it has written so far
            // (at least its window, at most 2^ahead_order), in whole PMDs of the address
            // space (see ahead.rs).
            let want = w
                .streak
                .clamp(1 << tuning.max_order, 1 << opts.ahead_order.max(tuning.max_order));
            if ahead_mode == AheadMode::Fault {
                // Part of this window, installed before the thread is woken; but only as far
                // as the pool's ready huge pages (or, without a huge ring, 4 KiB pages) reach:
                // making each huge page here, 0.2-4 ms, would hold every other thread's fault
                // behind this one.
                let target = (page + want).min(page + ready).min(range.pages);
                let cut = pmd_start(range.addr_of(target));
                let to = if target == range.pages {
                    target
                } else if cut > range.addr_of(end) {
                    range.page_of(cut)
                } else {
                    end
                };
                if to > end {
                    Stats::add(&stats.ahead_windows, 1);
                    Stats::add(&stats.ahead_pages, to - end);
                    end = to;
                }
            } else {
                // After the wake: the thread waits only for the pages up to the end of its PMD,
                // and the next PMD if fewer than half a PMD's are left in its own, so that it
                // has work while the handler starts on the window ahead (woken with one page
                // to write, it overtook the handler at once); a huge fault's window is whole
                // PMDs already.
                if !huge_fault {
                    end = end.min(range.page_of(pmd_start(page_addr + PMD_SIZE / 2) + PMD_SIZE));
                }
                let (from, to) = (
                    range.addr_of(end),
                    pmd_start(range.addr_of((end + want).min(range.pages))),
                );
                if from % PMD_SIZE == 0 && to > from {
                    ahead = Some((end, range.page_of(to)));
                }
            }
            predictor.installed_until(ahead.map_or(end, |(_, a1)| a1));
        }
        let clock = predictor.clock();
        drop(entry);
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
        let dense = w.outcome == Outcome::Probe || (w.outcome == Outcome::Hit && w.order > tuning.start_order);
        if dense && shared.sparse_run.load(Relaxed) != 0 {
            // A dense stream: the program's mappings are worth taking again.
            shared.sparse_run.store(0, Relaxed);
        }
        let handing_back = self.opts.handback_misses > 0;
        if w.outcome == Outcome::Sparse && handing_back && self.hand_back_sparse(range, page, w.stride) {
            // The stream's way ahead, the faulting page with it, went back to the kernel.
            self.wake(page_addr);
            return None;
        }
        let handback = range.misses.lock().unwrap_or_else(|e| e.into_inner()).record(
            w.outcome,
            page,
            self.opts.handback_misses,
            tid,
        );
        if let Some(misses) = handback {
            if self
                .hand_back(range, misses)
                .is_some_and(|(a, b)| (a..b).contains(&page))
            {
                // The faulting page went back to the kernel with the rest: let it fault natively.
                self.wake(page_addr);
                return None;
            }
        }
        // Starved, with as many threads faulting as the kernel would serve faster: the range
        // goes to the kernel (see handback.rs), and this fault with it. Only windows that go
        // on into a PMD with no page table count: there the engine wants a huge page, and the
        // kernel would make one; a PMD with a table (memory discarded after a loan, say) takes
        // 4 KiB pages from either.
        let next_pmd = pmd_start(page_addr) + PMD_SIZE;
        let huge_pool = self.can_move && self.stage.is_some() && self.home_pool().is_some_and(|p| p.huge.is_some());
        // Counted for every write window (in a row means in a row); lent only where the
        // kernel would take huge pages, and makes them fast now.
        if write
            && huge_pool
            && self.shared.lending.starved(range, end - first, ready)
            && next_pmd < range.end()
            && !range.pmds.has_table(next_pmd)
            && self.kernel_makes_huge_pages_fast()
            && self.lend(range, page_addr)
        {
            self.wake(page_addr);
            return None;
        }
        Stats::add(&stats.window_order[w.order as usize], 1);
        Some(Located {
            first,
            end,
            write,
            outcome: w.outcome,
            ahead,
            clock,
            probe: w.probe.filter(|p| (first..end).contains(p)),
        })
    }
}
