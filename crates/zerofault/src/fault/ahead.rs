//! Windows ahead (seed 000 carried on): a confirmed stream stops faulting once per window.
//!
//! A confirmed sequential stream (its window at max_order) faults once per window: one round
//! trip and, outside `MADV_HUGEPAGE` memory, one PMD of 4 KiB pages, because the
//! kernel gives the faulting PMD a page table before it asks us. So its faults also install a
//! window ahead: the whole PMDs after the window, as many pages as the stream has written so
//! far (at least one max_order window, at most 2^ahead_order: a stream that stops leaves at
//! most as much unused as it used), all of them huge pages but the fault's own PMD. The next
//! fault comes at its end: a warm writer faults once per 2^ahead_order pages (128 MiB by
//! default) instead of once per 8 MiB. Two ways, the `ahead` knob:
//!
//! - `fault` (default): [`super::locate`] widens the fault's window over the window ahead, and
//!   it all goes in before the thread is woken, last to first like any window. The thread
//!   waits a little longer per huge page, and every move is cheap: with the writer asleep, its
//!   CPU needs no TLB flush. It reaches only as far as the pool's ready huge pages: making them
//!   here (a populate each) would hold every other thread's fault behind this one
//!   (docs/DESIGN.md, "Windows ahead").
//! - `wake`: [`super::locate`] cuts the fault's window at the end of the fault's PMD (or the
//!   next one, so that the woken thread has a PMD to write before it reaches the handler), and
//!   [`Handler::install_ahead`] installs the window ahead after the wake, in address order,
//!   while the thread writes behind it. This is the design the issue asked for, and it is the
//!   slower one here: each huge page moved while the writer runs flushes the pool's PMD from
//!   the writer's CPU too, an interrupt that costs a virtual machine an exit, and the handler
//!   fell behind the writer (docs/DESIGN.md, "Windows ahead"). It is kept for machines where
//!   interrupts are cheap. It never delays a fault: it stops, releasing the rest of its claim,
//!   as soon as any fault is waiting, where a PMD holds a page table or pages are claimed by
//!   someone else, where the mapping ends, and where no huge page is ready (the ring is empty
//!   and the handler's own staging rests after a slow one): it moves no 4 KiB page, each of
//!   which would cost a flush. The predictor then expects the stream's next fault where it
//!   stopped. Reads map the zero page ahead (no flush: the entries were empty).
//!
//! Pages installed ahead are the program's, as any window's: a stream that stops leaves at
//! most its window ahead unused, freed with the rest of the program's memory.

use super::{Handler, Kernel};
use crate::memory::region::Range;
use crate::page::{bytes, PMD_PAGES, PMD_SIZE};
use crate::stats::Stats;
use std::sync::atomic::Ordering::Relaxed;

impl<K: Kernel> Handler<'_, K> {
    /// `ahead=wake`: installs the window ahead `[first, end)` (pages of `range`, whole PMDs)
    /// after the fault that asked for it was answered; returns where it stopped (`end`: all).
    ///
    /// # Context
    /// A handler, with the fault's window or right after waking the thread (`ahead=wake`). Its
    /// ioctls (`UFFDIO_MOVE`, `COPY`, `ZEROPAGE`) may sleep on the mmap lock and on page
    /// allocation; it takes no lock of the engine's, ring slots lock-free.
    pub(crate) fn install_ahead(&mut self, range: &Range, first: u64, end: u64, write: bool) -> u64 {
        Stats::add(&self.stats().ahead_windows, 1);
        let mapping_end = self.mapping_end();
        let mut at = first;
        while at < end && self.fatal.is_none() {
            let addr = range.addr_of(at);
            let n = PMD_PAGES.min(end - at);
            // locate gives whole PMDs of the address space.
            debug_assert!(addr % PMD_SIZE == 0 && n == PMD_PAGES, "{addr:#x} {n}");
            if addr + bytes(n) > mapping_end
                || (write
                    && (range.pmds.has_table(addr)
                        || !range.may_take_huge(addr, self.shared.thp_always)
                        || self.shared.thp_disabled.load(Relaxed)
                        || !self.huge_ready()))
                || self.fault_waiting()
            {
                break;
            }
            let mut runs = std::mem::take(&mut self.runs);
            runs.clear();
            range.map.claim(at, n, &mut runs);
            let whole = runs.as_slice() == [(at, n)];
            if !whole {
                for &(f, k) in &runs {
                    range.map.clear(f, k);
                }
            }
            self.runs = runs;
            if !whole {
                break;
            }
            let done = if write {
                self.install_huge(addr, PMD_SIZE, range)
            } else {
                range.pmds.mark_tables(addr, bytes(n));
                self.fill_zeropage(addr, bytes(n))
            };
            if let Err(s) = done {
                // What went in stays (its bits set); the rest is released for a later fault.
                let from = range.page_of(addr + s.at);
                range.map.clear(from, at + n - from);
                at = from;
                break;
            }
            Stats::add(&self.stats().ahead_pages, n);
            at += n;
        }
        if at < end {
            Stats::add(&self.stats().ahead_stops, 1);
        }
        at
    }

    /// A fault is waiting: later in the batch being handled, or pending on the descriptor (read
    /// now: events applied, faults deferred).
    fn fault_waiting(&mut self) -> bool {
        if self.batch_left > 0 || !self.deferred.is_empty() {
            return true;
        }
        if self.shared.handlers() > 1 {
            // Another handler serves what is pending: reading it here would take it from them.
            return false;
        }
        self.read_pending();
        !self.deferred.is_empty()
    }

    /// Pages a window ahead may take at once (`ahead=fault`): the ready huge pages (the ready
    /// 4 KiB pages without a huge ring), none without a pool to move from.
    ///
    /// # Context
    /// A handler; atomics only, never sleeps.
    pub(crate) fn ready_pages(&self) -> u64 {
        let Some(pool) = self.home_pool().filter(|_| self.can_move) else {
            return 0;
        };
        match (&pool.huge, self.stage) {
            (Some(h), Some(_)) => h.available(),
            _ => pool.small.available(),
        }
    }

    /// A huge page can be had without waiting long: one is ready in the huge ring, or the
    /// handler may make its own (its staging is not resting after a slow one).
    fn huge_ready(&self) -> bool {
        let Some(ring) = self.home_pool().and_then(|p| p.huge.as_ref()) else {
            return false;
        };
        self.stage.is_some()
            && (ring.available() > 0 || self.stage_rests_until.is_none_or(|t| std::time::Instant::now() >= t))
    }
}
