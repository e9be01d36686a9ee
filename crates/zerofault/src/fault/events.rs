//! Events and installs in flight: the faults deferred while a handler reads the kernel's
//! events in order, and the window each handler is installing, which another handler's fault
//! on it waits for.

use super::{Handler, Kernel, BATCH};
use crate::stats::Stats;
use crate::sync::AtomicU64;
use crate::sys::uffd::Msg;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

/// Times an install is retried after draining events before giving up on it.
pub(crate) const EVENT_RETRIES: u32 = 8;

/// The window one handler is installing, published for the others: a fault read by another
/// handler inside it (its thread was woken by the first huge page moved and ran on into the
/// next) waits for it instead of installing a 4 KiB page there, which would give a PMD about
/// to take a huge page a page table, and cost the range its huge pages there (docs/DESIGN.md,
/// "Figures that left the code comments").
///
/// Its three words are written apart, so a reader may see a torn window; the worst it does
/// with one is install the page at once or wait for nothing (bounded by [`INFLIGHT_WAIT`]),
/// both safe: an install never overwrites a present page. A reader that sees a range id sees
/// the bounds stored with it or later ones (Release/Acquire on `range`), never older ones.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Inflight {
    /// The range's id; 0 when the handler installs nothing.
    range: AtomicU64,
    first: AtomicU64,
    end: AtomicU64,
}

/// How long a handler waits for another's window to go in before serving the fault itself.
pub(crate) const INFLIGHT_WAIT: Duration = Duration::from_millis(50);

impl Inflight {
    /// # Context
    /// The handler that owns this slot; atomics only.
    pub(crate) fn set(&self, range: u64, first: u64, end: u64) {
        self.first.store(first, Relaxed);
        self.end.store(end, Relaxed);
        self.range.store(range, Release);
    }

    /// # Context
    /// The handler that owns this slot; atomics only.
    pub(crate) fn clear(&self) {
        self.range.store(0, Release);
    }

    fn covers(&self, range: u64, page: u64) -> bool {
        self.range.load(Acquire) == range && (self.first.load(Relaxed)..self.end.load(Relaxed)).contains(&page)
    }
}

impl<'a, K: Kernel> Handler<'a, K> {
    /// The window this handler is installing is `[first, end)` of range `range` (see
    /// [`Inflight`]); `None`: none.
    ///
    /// # Context
    /// A handler, before and after it installs a window; atomics only.
    pub(crate) fn installing(&self, window: Option<(u64, u64, u64)>) {
        if self.shared.inflight.len() > 1 {
            let me = &self.shared.inflight[self.index];
            match window {
                Some((range, first, end)) => me.set(range, first, end),
                None => me.clear(),
            }
        }
    }

    /// A fault on a claimed page: while another handler's window in flight covers it and the
    /// page is not there yet, wait (at most [`INFLIGHT_WAIT`]) for that install, which wakes
    /// the thread.
    ///
    /// # Context
    /// A handler; no lock. While another handler installs the window holding the page it yields,
    /// then sleeps a little at a time, for at most [`INFLIGHT_WAIT`].
    pub(crate) fn wait_for_other_install(&self, range: u64, page: u64, page_addr: usize) {
        let others = || {
            self.shared
                .inflight
                .iter()
                .enumerate()
                .any(|(i, w)| i != self.index && w.covers(range, page))
        };
        if self.shared.inflight.len() < 2 || !others() {
            return;
        }
        Stats::add(&self.stats().faults_in_other_windows, 1);
        let t0 = Instant::now();
        let mut spins = 0u32;
        while others() && !crate::sys::mman::is_resident(page_addr) && t0.elapsed() < INFLIGHT_WAIT {
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Reads pending messages: events are applied now, faults deferred. Called when an install
    /// got EAGAIN without progress, i.e. an event is waiting to be read.
    ///
    /// `attempt` counts the retries of one install so far (from 1). The kernel keeps refusing
    /// until the program thread that the event held (its munmap, madvise or mremap) runs again,
    /// which on a busy machine takes a time slice: the first retries only yield, later ones
    /// sleep, so that the thread gets the CPU. (Eight retries in a row within microseconds
    /// gave up on installs while 4 threads unmapped and discarded: the thread faulted on the
    /// same page again and again, each a miss, and the range was handed back.)
    ///
    /// # Context
    /// A handler, after an install met `EAGAIN`; reads the messages pending on the userfaultfd
    /// (the read never blocks; with several handlers, under the event-order lock) and handles
    /// the events among them. With nothing read it yields, then sleeps a little longer at each
    /// attempt, so that the program thread whose event is pending runs.
    pub(crate) fn drain_events(&mut self, attempt: u32) {
        Stats::add(&self.stats().drained_for_events, 1);
        let read = if self.shared.handlers() > 1 {
            self.read_ordered()
        } else {
            self.read_pending()
        };
        // Having read an event, retry at once; with nothing to read, the event's thread has
        // still to run.
        if read == 0 {
            if attempt <= 2 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50 << (attempt - 3).min(4)));
            }
        }
    }

    /// With several handlers: reads messages one at a time, in turn with the others, until an
    /// event was read and applied (returns 1) or none is pending (0); faults read meanwhile
    /// are deferred. Events are applied in the order the kernel queued them: each under the
    /// lock it was read under, so that one handler's REMAP(X to Y) is never applied after
    /// another's later UNMAP(Y).
    ///
    /// # Context
    /// A handler, with several of them; takes the event-order lock for each read and the event
    /// it read (and what that event takes); the read does not block.
    pub(crate) fn read_ordered(&mut self) -> usize {
        let outer = self.seq;
        let mut buf = [Msg::Fork; 1];
        let events = loop {
            let order = self.shared.event_order.lock().unwrap_or_else(|e| e.into_inner());
            self.seq = self.shared.ranges.seq();
            match self.kernel.read(&mut buf) {
                Ok(1) => match buf[0] {
                    f @ Msg::PageFault { .. } => self.deferred.push_back(f),
                    e => {
                        self.handle(e);
                        drop(order);
                        break 1;
                    }
                },
                Ok(_) => break 0,
                Err(e) => {
                    self.note_errno(e);
                    break 0;
                }
            }
        };
        self.seq = outer;
        events
    }

    /// Reads the pending messages without blocking: events are applied now, faults deferred
    /// (handled next). Returns how many were read.
    ///
    /// # Context
    /// A handler, the only one; a non-blocking read of the userfaultfd, then the events it read
    /// (each takes what [`Self::handle`] says).
    pub(crate) fn read_pending(&mut self) -> usize {
        let mut buf = [Msg::Fork; BATCH];
        // The events read here are applied as of now; the rest of a batch read earlier (the
        // caller may be in the middle of one) keeps the older mark, or its unmaps would cut
        // ranges registered since.
        let outer = std::mem::replace(&mut self.seq, self.shared.ranges.seq());
        let n = match self.kernel.read(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                self.note_errno(e);
                0
            }
        };
        for &m in &buf[..n] {
            match m {
                f @ Msg::PageFault { .. } => self.deferred.push_back(f),
                e => self.handle(e),
            }
        }
        self.seq = outer;
        n
    }
}

/// Loom model of a handler's window in flight (`RUSTFLAGS="--cfg loom"`, see `.ci/run`): one
/// handler moves on to its next window while another reads it.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::Inflight;
    use crate::sync::loom_model as model;
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn loom_a_reader_that_sees_a_range_id_sees_its_bounds_or_later_ones() {
        model(|| {
            let w = Arc::new(Inflight::default());
            w.set(1, 0, 10);
            let installer = {
                let w = w.clone();
                thread::spawn(move || {
                    w.set(2, 100, 110);
                    w.clear();
                })
            };
            // Page 5 is in range 1's window, never in range 2's: range 2 with the bounds of 1
            // would make a fault wait for an install that nobody makes.
            // (The other way, range 1 with 2's bounds, is the documented torn read: safe.)
            let mixed = w.covers(2, 5);
            installer.join().unwrap();
            assert!(!mixed, "range 2 seen with the bounds of range 1");
            assert!(!w.covers(2, 105) && !w.covers(1, 5), "cleared: covers nothing");
        });
    }
}
