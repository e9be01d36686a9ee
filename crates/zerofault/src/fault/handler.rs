//! The handler thread's loop, the dispatch of each message, and the faults deferred while
//! events are drained.

use super::numa::THREAD_NODES;
use super::{Kernel, BATCH};
use crate::fault::window::Tuning;
use crate::options::{AheadMode, Options};
use crate::page::{pages, PAGE_SIZE};
use crate::pool::zero::source::ZeroSource;
use crate::stats::{nanos, Stats};
use crate::sys::mman::Mapping;
use crate::sys::raw::Errno;
use crate::sys::sched;
use crate::sys::thread::ThreadClock;
use crate::sys::uffd::{Msg, Progress, Uffd};
use crate::Shared;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Fails the engine open when the handler thread ends other than by an orderly stop (the
/// doorbell rung by [`crate::Engine`]'s drop): see [`Shared::handler_left`]. Dropped after
/// the thread's read guard on the descriptor.
struct FailOpen<'a> {
    shared: &'a Shared,
    index: usize,
    orderly: bool,
}

impl Drop for FailOpen<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            Stats::add(&self.shared.stats.handler_panics, 1);
        }
        // A panic mid-install leaves no window for the others to wait on.
        if let Some(w) = self.shared.inflight.get(self.index) {
            w.clear();
        }
        self.shared.handler_left(!self.orderly);
    }
}

/// How long a handler waits for a message before it looks whether another one failed open,
/// when there are several: each holds a read guard on the descriptor while it waits, and the
/// fail-open takes the write lock, so the others must notice and leave (the blocked faults then
/// wait this long at most, once).
const FAILED_POLL: Duration = Duration::from_millis(50);

/// The body of handler thread `index` (of `Options::handler_count`).
///
/// # Context
/// The handler thread, for its whole life (spawned by `Engine::start` or `Engine::resume`, every
/// signal blocked). Holds a read guard on the descriptor while it serves; sleeps in `poll(2)` when
/// idle, and on the event-order lock.
pub(crate) fn run(shared: Arc<Shared>, index: usize) {
    shared.live_handlers.fetch_add(1, AcqRel);
    // A fault waits for this thread to wake: on a busy CPU, not a slice behind the thread
    // running there (DESIGN.md, "A busy machine").
    crate::sys::thread::short_slice();
    // Only where the program's threads may run (DESIGN.md, "The program's rights").
    let mut cpus = sched::Placement::start(None);
    let mut fail_open = FailOpen {
        shared: &shared,
        index,
        orderly: false,
    };
    let guard = shared.uffd.read().unwrap_or_else(|e| e.into_inner());
    let Some(uffd) = guard.as_ref() else { return };
    let mut h = Handler::nth(&shared, uffd, index);
    let several = shared.handlers() > 1;
    // One handler reads every pending message at once. Several read one each: a batch read by
    // one would be served one after the other while the others find nothing to read (docs/
    // DESIGN.md, "Figures that left the code comments").
    let batch = if several { 1 } else { BATCH };
    let mut buf = [Msg::Fork; BATCH];
    let mut idle = Idle {
        clock: ThreadClock::current(),
        counted: Duration::ZERO,
        last_count: Instant::now(),
        from: None,
        last: Duration::MAX,
        cpus: crate::sys::thread::allowed_cpus(),
        timeout: several.then_some(FAILED_POLL),
    };
    // Until the doorbell rings: a stop is only orderly once every fault queued before it was
    // answered.
    while !h.rung && h.fatal.is_none() && !shared.failed.load(Acquire) {
        cpus.follow();
        if let Some(m) = h.deferred.pop_front() {
            h.handle_counted(m);
            continue;
        }
        // The bracket is odd from before the read: a program thread whose munmap or madvise
        // returned because its event was read sees the event counted by Engine::stats.
        let bracket = &shared.message_seq[index];
        bracket.fetch_add(1, SeqCst);
        let n = match read_batch(&mut h, uffd, &shared, &mut buf[..batch], several) {
            Ok(Some(n)) => n,
            Ok(None) => {
                bracket.fetch_add(1, SeqCst);
                continue;
            }
            Err(_) => {
                bracket.fetch_add(1, SeqCst);
                break; // the descriptor is unusable: fail open
            }
        };
        if n == 0 {
            bracket.fetch_add(1, SeqCst);
            if !idle.wait(&mut h, uffd, &shared) {
                break; // closed or replaced behind our back: fail open
            }
            continue;
        }
        idle.ends();
        for (i, &m) in buf[..n].iter().enumerate() {
            h.batch_left = n - i - 1;
            h.handle(m);
        }
        h.batch_left = 0;
        bracket.fetch_add(1, SeqCst);
    }
    if let Some(e) = h.fatal {
        Stats::add(&shared.stats.fail_opens, 1);
        Stats::set_once(&shared.stats.fail_open_errno, u64::from(e.0.unsigned_abs()));
    }
    let now = idle.clock.read();
    Stats::add(&shared.stats.handler_cpu_ns, nanos(now.saturating_sub(idle.counted)));
    fail_open.orderly = h.rung;
}

/// Reads up to `buf.len()` messages. Several handlers read in turn, and apply the events they
/// read before the next read (see `Handler::read_ordered`): an event read alone is handled
/// here, under the order, and `Ok(None)` returned; one handler reads and handles as before.
/// `Ok(Some(n))`: `n` messages in `buf` to handle (0: nothing pending).
///
/// # Context
/// A handler thread; with several handlers, takes `event_order` for the read (and the event's
/// handling); the read does not block.
fn read_batch(
    h: &mut Handler<'_, Uffd>,
    uffd: &Uffd,
    shared: &Shared,
    buf: &mut [Msg],
    several: bool,
) -> Result<Option<usize>, Errno> {
    let order = several.then(|| shared.event_order.lock().unwrap_or_else(|e| e.into_inner()));
    h.seq = shared.ranges.seq();
    let read = Kernel::read(uffd, buf);
    match (read, order) {
        (Ok(1), Some(order)) if !matches!(buf[0], Msg::PageFault { .. }) => {
            h.handle(buf[0]);
            drop(order);
            Ok(None)
        }
        (read, _) => read.map(Some),
    }
}

/// A handler's time between messages: the CPU time it counted, its idle spells, and how it
/// waits for the next message.
struct Idle {
    clock: ThreadClock,
    /// The thread's CPU time when last added to `handler_cpu_ns`, and when that was.
    counted: Duration,
    last_count: Instant,
    /// When the current idle spell began (None: messages are being read), and how long the
    /// last one lasted: a poll (`handler_spin`) begins a spell only when the last was short.
    from: Option<Instant>,
    last: Duration,
    /// The CPUs the process may run on, when the handler started.
    cpus: usize,
    /// The wait's bound: with several handlers, each looks now and then whether another
    /// failed open.
    timeout: Option<Duration>,
}

impl Idle {
    /// Nothing was pending: counts the CPU time spent, lets a loan end, then polls (after a
    /// short spell) or waits for the next message. False when the descriptor was closed or
    /// replaced behind the engine's back (the handler fails open).
    ///
    /// # Context
    /// A handler thread, between messages; takes no lock; sleeps in the wait.
    fn wait(&mut self, h: &mut Handler<'_, Uffd>, uffd: &Uffd, shared: &Shared) -> bool {
        if self.last_count.elapsed() > Duration::from_millis(1) {
            let now = self.clock.read();
            Stats::add(&shared.stats.handler_cpu_ns, nanos(now - self.counted));
            (self.counted, self.last_count) = (now, Instant::now());
        }
        // Nothing pending: a loan may end now. While any is out, the wait is bounded, so
        // that an idle handler still looks (the program may fault only where it lent).
        h.retake();
        if self.from.is_none() {
            self.from = Some(Instant::now());
            let spin_for = h.opts.handler_spin;
            if self.last <= spin_for.saturating_mul(SPIN_AFTER) && spin(uffd, shared, spin_for, self.cpus) {
                return uffd.still_ours();
            }
        }
        let timeout = match self.timeout {
            None if shared.lending.any() => Some(crate::fault::lend::RETAKE_AFTER),
            t => t,
        };
        uffd.wait(timeout).is_ok() && uffd.still_ours()
    }

    /// Messages came: the idle spell, if one was on, is over.
    fn ends(&mut self) {
        if let Some(t) = self.from.take() {
            self.last = t.elapsed();
        }
    }
}

/// A handler polls after a burst only if the idle spell before it lasted at most this many
/// times `handler_spin`: faults coming close together (the spell before includes both
/// wake-ups), not a sequential stream's faults a window apart, where each poll would be CPU
/// taken from the program for nothing (a warm stream ran slower when every burst was
/// followed by a poll: docs/DESIGN.md, "A short poll").
const SPIN_AFTER: u32 = 4;

/// Polls `uffd` for a message for at most `spin`, unless the threads writing fresh memory
/// (within the last 10 ms, `Faulters`), the handlers and the scrub threads at work would then
/// be more than the CPUs the process may run on (`cpus`, its affinity when the handler
/// started; never with one): the poll would take a CPU from one of them (a scrub starved of
/// CPU while a pool fills leaves windows short of huge pages, and its dirty pages are traded
/// away instead of zeroed). True when a message is pending, or the descriptor
/// reports an error (the read that follows finds out).
///
/// Other processes' threads are weighed through the machine-wide state (`crate::pool::machine`): the
/// scrubs stepping and handlers polling of this user's other processes under the shim, with
/// `busy`, must leave a CPU beside the poll. Other programs' threads are not weighed (that
/// would take a /proc read); the kernel's scheduler shares a CPU with the poll as with any
/// thread, and the poll lasts `spin` at most after a burst.
///
/// A handler that sleeps on an idle virtual CPU is woken by an interrupt the hypervisor
/// delivers (without halt polling, a VM exit and entry); the faulting thread's wake-up pays the
/// same on its side. Faults that come close together (random first touches before their
/// hand-back, a cold stream's windows) save one of the two by this poll (docs/DESIGN.md, "A
/// short poll").
fn spin(uffd: &Uffd, shared: &Shared, spin: Duration, cpus: usize) -> bool {
    let busy =
        shared.lending.faulters.active() + shared.live_handlers.load(Relaxed) + shared.scrubs_working.load(Relaxed);
    if spin.is_zero() || cpus <= 1 || busy > cpus {
        return false;
    }
    if !shared.machine.handler_may_poll(u32::try_from(busy).unwrap_or(u32::MAX)) {
        Stats::add(&shared.stats.poll_machine_skips, 1);
        return false;
    }
    Stats::add(&shared.stats.handler_spins, 1);
    shared.machine.handler_polling(true);
    let t = Instant::now();
    let mut ready = false;
    while t.elapsed() < spin && !shared.failed.load(Acquire) {
        match uffd.ready() {
            Ok(false) => std::hint::spin_loop(),
            Ok(true) => {
                Stats::add(&shared.stats.handler_spin_hits, 1);
                ready = true;
                break;
            }
            Err(_) => {
                ready = true;
                break;
            }
        }
    }
    shared.machine.handler_polling(false);
    ready
}

/// Runs a window's claim returns at most, in practice (a probe splits one in two, samples
/// each cut one more): the capacity of [`Handler::runs`].
const RUNS: usize = 16;

/// The handler's state: what it needs of the engine, and what it keeps between messages.
pub(crate) struct Handler<'a, K: Kernel> {
    pub(crate) shared: &'a Shared,
    pub(crate) kernel: &'a K,
    pub(crate) opts: &'a Options,
    pub(crate) tuning: Tuning,
    pub(crate) zero: &'a ZeroSource,
    /// Pool pages can be moved in (a pool, and `UFFDIO_MOVE`).
    pub(crate) can_move: bool,
    /// [`Shared::stage`], when `can_move`: whole PMDs get huge pages.
    pub(crate) stage: Option<&'a Mapping>,
    /// EEXIST skips so far (tells a clean move from one that found pages present).
    pub(crate) partials: u64,
    /// After a slow staging populate, no staging until then (see [`crate::fault::huge::STAGE_SLOW`]).
    pub(crate) stage_rests_until: Option<Instant>,
    /// When this handler last populated its staging PMD with a huge page, and how long the
    /// kernel took to make it (timed in `make_huge`, fault/huge.rs): the kernel's own huge-page
    /// fault costs the same right now (lending weighs it, see fault/lend.rs).
    pub(crate) last_populate: Option<(Instant, Duration)>,
    /// Scratch for [`Handler::install_write`]: (address, bytes, huge) of each piece.
    pub(crate) pieces: Vec<(usize, usize, bool)>,
    /// The page of the fault being served: an install never refuses the span holding it.
    pub(crate) fault_page: usize,
    /// The accessible mappings around a recent faulting page, `[lo, hi)` (see
    /// `Handler::mapping_end`); forgotten on every event, this handler's or another's
    /// (`Shared::events` moved past `mapping_events`).
    pub(crate) mapping: Option<(usize, usize)>,
    /// `Shared::events` when `mapping` was read.
    pub(crate) mapping_events: u64,
    /// This handler's number: its staging area, doorbell and `message_seq` bracket.
    pub(crate) index: usize,
    /// The node this handler thread prefers now (`set_mempolicy`), with several nodes: the
    /// first node of the last fault's choice (see [`Handler::choose_nodes`]).
    pub(crate) preferred: Option<u32>,
    /// With several nodes, the nodes the fault being served takes pool pages from, in order
    /// ([`crate::memory::nodes::Nodes::order_into`]); under an interleave policy each page's own order
    /// is taken instead (`Handler::order_for`).
    pub(crate) order: Vec<u32>,
    /// The interleave policy's nodes, when the fault being served is under one: each page (or
    /// huge page) has its own first node.
    pub(crate) interleave: Option<crate::sys::numa::NodeMask>,
    /// With several nodes, the pool of the node the fault being served wants first (under
    /// interleave, its huge page's node); `None`: the first pool.
    pub(crate) home: Option<usize>,
    /// Several nodes, and the handler started with the default policy. Handler threads inherit
    /// the policy of the program thread that started the engine (`numactl --membind`, say),
    /// which the kernel then applies to their copies as it would to the program's own faults:
    /// such a policy is kept, not steered over.
    pub(crate) may_steer: bool,
    /// Faulting threads' nodes as last read, by thread id modulo the length: (tid, node, when).
    pub(crate) thread_nodes: [Option<(u32, Option<u32>, Instant)>; THREAD_NODES],
    /// `Options::ahead`, except that with several handlers `wake` works as `fault`: the
    /// thread's next fault may reach another handler while this one still installs the window
    /// ahead, and would be predicted against a stream not yet updated.
    pub(crate) ahead: AheadMode,
    /// Scratch for the runs a window's claim returns.
    pub(crate) runs: Vec<(u64, u64)>,
    /// Faults read while draining for events, handled next.
    pub(crate) deferred: VecDeque<Msg>,
    /// Messages after the one being handled in the batch read last.
    pub(crate) batch_left: usize,
    /// Table sequence noted before the last read: events apply to ranges registered by then.
    pub(crate) seq: u64,
    /// Page faults handled (for `panic_after`).
    pub(crate) faults_seen: u64,
    /// The doorbell rang: the engine is being dropped.
    pub(crate) rung: bool,
    /// An errno no install expects (EPERM under a seccomp filter, EBADF, ...): the handler
    /// stops and fails open.
    pub(crate) fatal: Option<Errno>,
    /// The fault being served is a read served as a write (reads.rs): where moving is
    /// refused, or the pool paused, the zero page instead of a copy.
    pub(crate) reading: bool,
    /// The sample pages of the read window being served (reads.rs; 0: none).
    pub(crate) samples: [usize; 2],
}

impl<'a, K: Kernel> Handler<'a, K> {
    /// The first handler (the tests' only one).
    ///
    /// # Context
    /// A handler at its start, or a unit test.
    #[cfg(test)]
    pub(crate) fn new(shared: &'a Shared, kernel: &'a K) -> Handler<'a, K> {
        Handler::nth(shared, kernel, 0)
    }

    /// Handler `index`.
    ///
    /// # Context
    /// A handler at its start.
    pub(crate) fn nth(shared: &'a Shared, kernel: &'a K, index: usize) -> Handler<'a, K> {
        let opts = &shared.opts;
        let can_move = opts.pool && !shared.pools.is_empty() && shared.features.has(crate::Features::MOVE);
        let stage = shared.stage.get(index).filter(|_| can_move);
        Handler {
            shared,
            kernel,
            opts,
            tuning: Tuning {
                start_order: opts.start_order,
                order_step: opts.order_step,
                max_order: opts.max_order,
            },
            zero: &shared.zero,
            can_move,
            stage,
            partials: 0,
            stage_rests_until: None,
            last_populate: None,
            pieces: Vec::new(),
            fault_page: 0,
            mapping: None,
            mapping_events: 0,
            index,
            preferred: None,
            order: Vec::with_capacity(shared.numa.as_ref().map_or(0, |n| n.topology.nodes.len())),
            interleave: None,
            home: None,
            may_steer: shared.numa.is_some()
                && crate::sys::numa::thread_policy().map(|p| p.0) == Ok(crate::sys::numa::MPOL_DEFAULT),
            thread_nodes: [None; THREAD_NODES],
            ahead: match opts.ahead {
                AheadMode::Wake if shared.handlers() > 1 => AheadMode::Fault,
                a => a,
            },
            // Made here, before the program can mlockall: a window's runs (and the pieces its
            // samples cut them into, reads.rs) never grow it, so no chunk of the engine's
            // allocator is mapped, and locked, later.
            runs: Vec::with_capacity(RUNS),
            deferred: VecDeque::new(),
            batch_left: 0,
            seq: 0,
            faults_seen: 0,
            rung: false,
            fatal: None,
            reading: false,
            samples: [0; 2],
        }
    }

    /// # Context
    /// A handler; no lock.
    pub(crate) fn stats(&self) -> &'a Stats {
        &self.shared.stats
    }

    /// Checks an ioctl's errno: the ones an install can meet in a healthy engine (see
    /// [`benign`]) are the caller's to handle; any other stops the handler, which then fails
    /// open: closing the userfaultfd wakes every blocked fault, and the kernel serves them.
    ///
    /// # Context
    /// A handler; no lock.
    pub(crate) fn note_errno(&mut self, e: Errno) {
        if !benign(e) && self.fatal.is_none() {
            self.fatal = Some(e);
        }
    }

    /// [`Self::note_errno`] for an install's progress, passed through.
    ///
    /// # Context
    /// A handler; no lock.
    pub(crate) fn note(&mut self, p: Progress) -> Progress {
        if let Some(e) = p.errno {
            self.note_errno(e);
        }
        p
    }

    /// Wakes the thread faulting at `page_addr`. A wake cannot fail in a healthy engine: if it
    /// does, the thread would sleep for ever, so the handler fails open.
    ///
    /// # Context
    /// A handler; the wake ioctl, which does not sleep.
    pub(crate) fn wake(&mut self, page_addr: usize) {
        if let Err(e) = self.kernel.wake(page_addr, PAGE_SIZE) {
            self.fatal.get_or_insert(e);
        }
    }

    /// [`Self::handle`] inside this handler's `message_seq` bracket, which
    /// [`crate::Engine::stats`] waits on.
    ///
    /// # Context
    /// A handler, for each message read; brackets it in the handler's `message_seq` count.
    pub(crate) fn handle_counted(&mut self, m: Msg) {
        let bracket = &self.shared.message_seq[self.index];
        bracket.fetch_add(1, SeqCst);
        self.handle(m);
        bracket.fetch_add(1, SeqCst);
    }

    /// # Context
    /// A handler, for each message read. A fault takes what [`Self::fault`] takes; an event takes
    /// the range table's lock (read for REMOVE, written for UNMAP and REMAP). With several
    /// handlers its caller holds the event-order lock for an event (`read_batch`,
    /// `read_ordered`); this takes none.
    pub(crate) fn handle(&mut self, m: Msg) {
        if self.fatal.is_some() {
            return; // failing open: the kernel answers everything from here
        }
        let seq = self.seq;
        let stats = self.stats();
        if !matches!(m, Msg::PageFault { .. }) {
            self.mapping = None;
            self.shared.events.fetch_add(1, AcqRel);
        }
        match m {
            Msg::PageFault { addr, write, tid } => self.fault(addr, write, tid),
            Msg::Remove { start, end } => {
                Stats::add(&stats.events_remove, 1);
                Stats::add(&stats.pages_forgotten, self.shared.ranges.forget(start, end, seq));
            }
            Msg::Unmap { start, end } => {
                Stats::add(&stats.events_unmap, 1);
                Stats::add(&stats.pages_forgotten, self.shared.ranges.unmap(start, end, seq));
            }
            Msg::Remap { from, to, len } => {
                Stats::add(&stats.events_remap, 1);
                self.shared.ranges.remap(from, to, len, seq);
            }
            Msg::Fork | Msg::Unknown(_) => {}
        }
    }

    /// A sequential writer is proven: keep the pool between its watermarks from now on. Random
    /// or read-only faults never start the scrub thread, so a program that does not stream
    /// through fresh memory pays for no pool at all.
    /// The program's memory takes huge pages (a window has whole PMDs for them, or a stream
    /// wants windows ahead): from now on the scrub fills the huge ring too
    /// (`Shared::huge_wanted`), and is asked to at once.
    ///
    /// # Context
    /// A handler; atomics, and the first time a kick of the scrub ([`ScrubCtl::kick`](crate::pool::scrub::ScrubCtl::kick): its wake
    /// lock, for a moment).
    pub(crate) fn want_huge(&self) {
        if self.shared.huge_wanted.load(Relaxed) {
            return;
        }
        self.shared.huge_wanted.store(true, Relaxed);
        if let Some(pool) = self.home_pool().filter(|p| p.huge.is_some()) {
            pool.scrub.kick();
        }
    }

    /// # Context
    /// A handler; atomics only, and a kick of the scrub.
    pub(crate) fn want_pool(&self) {
        let Some(pool) = self.home_pool() else { return };
        if self.shared.pool_paused.load(Relaxed) {
            return;
        }
        if !self.shared.pool_may_fill.load(Relaxed) {
            self.shared.pool_may_fill.store(true, Release);
        }
        if pool.available() < pages(self.opts.scrub_start) {
            pool.scrub.kick();
        }
    }
}

/// Whether an install ioctl's errno is one a healthy engine meets: a page already present
/// (EEXIST), a pending event or a race (EAGAIN), a hole or a destination gone with its mapping
/// (ENOENT), a range unregistered or changed under us, or a move the kernel refuses between
/// these two mappings (EINVAL: protection, mlock or registration differ), pages shared after a
/// fork (EBUSY), the process exiting (ESRCH, EINTR), memory short (ENOMEM), a source it cannot
/// move (EFAULT). Anything else (EPERM from a seccomp filter, EBADF, ENOTTY, ...) means the
/// descriptor is no longer usable as ours.
///
/// # Context
/// Any thread; arithmetic only.
pub(crate) fn benign(e: Errno) -> bool {
    matches!(
        e.0,
        libc::EEXIST
            | libc::EAGAIN
            | libc::ENOENT
            | libc::EINVAL
            | libc::EBUSY
            | libc::ESRCH
            | libc::EINTR
            | libc::ENOMEM
            | libc::EFAULT
    )
}
