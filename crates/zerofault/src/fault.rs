//! The fault handler: one thread reading the userfaultfd and answering each message.
//!
//! For a page fault:
//! 1. Find the range. A fault outside every known range (a race with munmap/mmap, see
//!    region.rs) is served one page at a time and woken: never left blocked.
//! 2. If the page's state bit is already set, another thread's window installed it (or is about
//!    to), or the map is stale: try a one-page install (EEXIST proves it present) and wake.
//! 3. Ask the thread's [`Predictor`] for the window; feed the outcome to the range's
//!    [`crate::predict::MissRun`]; on a run of misses hand that span back to the kernel.
//! 4. Claim the window in the page map; the newly claimed runs are the pages to install.
//! 5. Writes: whole PMDs whose table bit is clear ([`crate::region::Range::tables`]) get huge
//!    pages, moved whole from the pool's huge ring, or prepared here when it is empty; the rest
//!    UFFDIO_MOVE from the small ring, one ioctl per contiguous run of pool pages, and whatever
//!    the pool cannot give is copied from the zero source (UFFDIO_COPY). Pieces and runs go in
//!    last to first, so the thread is woken once its window is complete. Reads:
//!    UFFDIO_ZEROPAGE, no pool page spent (the seed maps the zero page on read faults too).
//! 6. Wake the faulting page if no successful ioctl covered it.
//!
//! Partial progress (sys/uffd.rs): EEXIST skips one present destination page; ENOENT on a move
//! skips one source hole (checked with mincore, so that a vanished destination is not mistaken
//! for a hole); EAGAIN with progress retries from where it stopped; EAGAIN without progress
//! means a munmap/madvise/mremap event is pending (`mmap_changing`), so pending messages are read
//! and their events applied before retrying. Anything else ends the install; the bits of pages
//! not installed are released and the thread, woken, faults again if it still needs to.
//!
//! Fail open: if this thread panics or stops on an error, [`FailOpen`] closes the userfaultfd.
//! The kernel then wakes every blocked fault and serves all later ones natively.

use crate::options::Options;
use crate::pool::Ring;
use crate::predict::{handback_span, Outcome, Predictor, Tuning, PMD_PAGES};
use crate::region::Range;
use crate::stats::Stats;
use crate::sys::mman::{self, Mapping, PAGE_SIZE, PMD_SIZE};
use crate::sys::thread::ThreadClock;
use crate::sys::uffd::{Msg, Progress, RawMsg, Uffd};
use crate::zero::ZeroSource;
use crate::Shared;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages read per read(2).
const BATCH: usize = 64;
/// Times an install is retried after draining events before giving up on it.
const EVENT_RETRIES: u32 = 8;
/// A staging populate slower than this (a huge page normally takes ~0.4-1 ms here) means the
/// kernel had to compact memory for it, or fell back to 4 KiB pages: the handler then copies
/// instead for [`STAGE_REST`]. The scrub thread, off the faulting path, keeps trying.
const STAGE_SLOW: Duration = Duration::from_millis(4);
const STAGE_REST: Duration = Duration::from_secs(1);
/// Pages per miss above which a second hand-back from one range returns all of it.
const SPARSE_PAGES_PER_MISS: u64 = 64 * PMD_PAGES;
/// Predictor entries kept before the table is reset (threads and ranges come and go).
const MAX_PREDICTORS: usize = 4096;

/// Closes the userfaultfd when the handler thread ends other than by an orderly stop (the
/// doorbell rung by [`crate::Engine`]'s drop).
struct FailOpen<'a> {
    shared: &'a Shared,
    orderly: bool,
}

impl Drop for FailOpen<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            Stats::add(&self.shared.stats.handler_panics, 1);
        }
        if !self.orderly {
            self.shared.fail_open();
        }
    }
}

/// The thread's body.
pub(crate) fn run(shared: Arc<Shared>) {
    let mut fail_open = FailOpen {
        shared: &shared,
        orderly: false,
    };
    let guard = shared.uffd.read().unwrap_or_else(|e| e.into_inner());
    let Some(uffd) = guard.as_ref() else { return };
    let mut h = Handler::new(&shared, uffd);
    let mut buf = [RawMsg::default(); BATCH];
    let clock = ThreadClock::current();
    let (mut counted, mut last_count) = (Duration::ZERO, Instant::now());
    // Until the doorbell rings: a stop is only orderly once every fault queued before it was
    // answered.
    while !h.rung && h.fatal.is_none() {
        if let Some(m) = h.queue.pop_front() {
            h.handle_counted(m);
            continue;
        }
        h.seq = shared.ranges.seq();
        let n = match uffd.read(&mut buf) {
            Ok(n) => n,
            Err(_) => break, // the descriptor is unusable: fail open
        };
        if n == 0 {
            if last_count.elapsed() > Duration::from_millis(1) {
                let now = clock.read();
                Stats::add(&shared.stats.handler_cpu_ns, (now - counted).as_nanos() as u64);
                (counted, last_count) = (now, Instant::now());
            }
            if uffd.wait().is_err() || !uffd.still_ours() {
                break; // closed or replaced behind our back: fail open
            }
            continue;
        }
        for m in &buf[..n] {
            h.handle_counted(m.decode());
        }
    }
    if let Some(e) = h.fatal {
        Stats::add(&shared.stats.fail_opens, 1);
        Stats::add(&shared.stats.fail_open_errno, e as u64);
    }
    let now = clock.read();
    Stats::add(
        &shared.stats.handler_cpu_ns,
        now.saturating_sub(counted).as_nanos() as u64,
    );
    fail_open.orderly = h.rung;
}

/// How an install of one run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Done {
    /// Every page installed (or found present).
    All,
    /// Stopped early at this byte offset; the rest was not installed.
    Stopped(usize),
}

struct Handler<'a> {
    shared: &'a Shared,
    uffd: &'a Uffd,
    opts: &'a Options,
    tuning: Tuning,
    zero: &'a ZeroSource,
    can_move: bool,
    /// [`Shared::stage`], when `can_move`.
    stage: Option<&'a Mapping>,
    /// EEXIST skips so far (tells a clean move from one that found pages present).
    partials: u64,
    /// After a slow staging populate, no staging until then (see [`STAGE_SLOW`]).
    stage_rests_until: Option<Instant>,
    /// Scratch for [`Handler::install_write`]: (address, bytes, huge) of each piece.
    pieces: Vec<(usize, usize, bool)>,
    predictors: HashMap<(u64, u32), Predictor>,
    runs: Vec<(u64, u64)>,
    /// Messages read while draining for events, handled next.
    queue: VecDeque<Msg>,
    /// Table sequence noted before the last read: events apply to ranges registered by then.
    seq: u64,
    events: u64,
    /// The doorbell rang: the engine is being dropped.
    rung: bool,
    /// An errno no install expects (EPERM under a seccomp filter, EBADF, ...): the handler stops
    /// and fails open.
    fatal: Option<i32>,
    /// The errno that stopped the last install that stopped early.
    stopped_by: i32,
}

impl<'a> Handler<'a> {
    fn new(shared: &'a Shared, uffd: &'a Uffd) -> Handler<'a> {
        let opts = &shared.opts;
        let can_move = opts.pool && shared.pool.is_some() && uffd.features().has(crate::sys::uffd::Features::MOVE);
        let stage = shared.stage.as_ref().filter(|_| can_move);
        Handler {
            shared,
            uffd,
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
            pieces: Vec::new(),
            predictors: HashMap::new(),
            runs: Vec::new(),
            queue: VecDeque::new(),
            seq: 0,
            events: 0,
            rung: false,
            fatal: None,
            stopped_by: 0,
        }
    }

    fn stats(&self) -> &'a Stats {
        &self.shared.stats
    }

    /// Checks an ioctl's errno: the ones an install can meet in a healthy engine (see
    /// [`benign`]) are the caller's to handle; any other stops the handler, which then fails
    /// open: closing the userfaultfd wakes every blocked fault, and the kernel serves them.
    fn note_errno(&mut self, e: i32) {
        if !benign(e) && self.fatal.is_none() {
            self.fatal = Some(e);
        }
    }

    /// [`Self::note_errno`] for an install's progress, passed through.
    fn note(&mut self, p: Progress) -> Progress {
        if let Some(e) = p.errno {
            self.note_errno(e);
        }
        p
    }

    /// Wakes the thread faulting at `page_addr`. A wake cannot fail in a healthy engine: if it
    /// does, the thread would sleep for ever, so the handler fails open.
    fn wake(&mut self, page_addr: usize) {
        if let Err(e) = self.uffd.wake(page_addr, PAGE_SIZE) {
            self.fatal.get_or_insert(e.0);
        }
    }

    /// [`Self::handle`] inside the `handling` bracket that [`crate::Engine::stats`] waits on.
    fn handle_counted(&mut self, m: Msg) {
        self.shared.handling.fetch_add(1, SeqCst);
        self.handle(m);
        self.shared.handling.fetch_add(1, SeqCst);
    }

    fn handle(&mut self, m: Msg) {
        if self.fatal.is_some() {
            return; // failing open: the kernel answers everything from here
        }
        let seq = self.seq;
        let stats = self.stats();
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

    fn fault(&mut self, addr: usize, write: bool, tid: u32) {
        let page_addr = addr & !(PAGE_SIZE - 1);
        if page_addr == self.shared.doorbell {
            // Engine::drop rang: answer it, and stop. (Anyone else touching it, a debugger
            // reading /proc/pid/mem, say, is answered and changes nothing.)
            let p = self.uffd.zeropage(page_addr, PAGE_SIZE);
            self.note(p);
            self.wake(page_addr);
            self.rung = self.shared.stopping.load(Acquire);
            return;
        }
        let stats = self.stats();
        Stats::add(&stats.fault_events, 1);
        Stats::add(if write { &stats.write_faults } else { &stats.read_faults }, 1);
        self.events += 1;
        if self.opts.panic_after != 0 && self.events == self.opts.panic_after {
            panic!(
                "zerofault: ZEROFAULT_PANIC_AFTER={} reached (testing fail-open)",
                self.opts.panic_after
            );
        }
        let Some(range) = self.shared.ranges.find(page_addr) else {
            Stats::add(&stats.unknown_faults, 1);
            self.install_one(page_addr, write);
            return;
        };
        // Where the program asked for huge pages, the kernel tried one and asked us with the
        // PMD still empty: the fault takes a whole huge page, as a write would natively. A read
        // takes one too: natively it maps the huge zero page and the first write a huge page,
        // and 4 KiB zero pages here would leave that PMD 4 KiB pages for good.
        // Elsewhere the kernel gave the faulting PMD a page table before it queued the message.
        let huge_fault = self.stage.is_some() && range.huge_fault(page_addr);
        let write = write || huge_fault;
        if !huge_fault {
            range.mark_tables(page_addr, PAGE_SIZE);
        }
        let page = range.page_of(page_addr);
        if range.map.is_claimed(page) {
            Stats::add(&stats.already_present, 1);
            self.install_one(page_addr, write);
            return;
        }

        // With huge pages, big windows end on PMD boundaries (in the address space).
        let phase = self
            .stage
            .is_some()
            .then_some((range.start / PAGE_SIZE) as u64 % PMD_PAGES);
        if self.predictors.len() >= MAX_PREDICTORS {
            self.predictors.clear();
        }
        let predictor = self.predictors.entry((range.id, tid)).or_default();
        let w = predictor.on_fault_aligned(page, range.pages, phase, &self.tuning);
        let (mut first, mut end) = (w.first, w.first + w.pages);
        if huge_fault {
            // The whole PMDs the window touches, from the one of the fault.
            let pmd = |p: u64| range.page_of(range.addr_of(p) / PMD_SIZE * PMD_SIZE);
            first = first.min(pmd(page));
            end = (pmd(end - 1) + PMD_PAGES).min(range.pages);
            predictor.installed_to(end);
        }
        Stats::add(
            match w.outcome {
                Outcome::Start => &stats.predict_starts,
                Outcome::Hit => &stats.predict_hits,
                Outcome::Miss => &stats.predict_misses,
            },
            1,
        );
        let handback =
            range
                .misses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(w.outcome, page, self.opts.handback_misses);
        if let Some((lo, hi)) = handback {
            if self
                .hand_back(&range, lo, hi)
                .is_some_and(|(a, b)| (a..b).contains(&page))
            {
                // The faulting page went back to the kernel with the rest: let it fault natively.
                self.wake(page_addr);
                return;
            }
        }
        Stats::add(&stats.window_order[w.order as usize], 1);

        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        range.map.claim(first, end - first, &mut runs);
        let mut woken = false;
        // Last run first, for the reason install_write gives.
        for &(first, n) in runs.iter().rev() {
            let dst = range.addr_of(first);
            let len = n as usize * PAGE_SIZE;
            let done = self.install_run(dst, len, write, &range);
            let stop = match done {
                Done::All => dst + len,
                Done::Stopped(off) => dst + off,
            };
            // A window that runs past the end of the mapping (into a PROT_NONE or unmapped
            // neighbour: memory committed with mprotect piece by piece) is refused whole.
            // The part from the fault on is then installed in pieces that fit.
            let (from, to) = if stop <= page_addr && page_addr < dst + len && self.refused_whole() {
                (page_addr, self.install_to_boundary(page_addr, dst + len, write, &range))
            } else {
                (stop, stop)
            };
            // Release what was not installed, so that a later window tries it again.
            for (a, b) in [(stop, from), (to, dst + len)] {
                if a < b {
                    range.map.clear(range.page_of(a), ((b - a) / PAGE_SIZE) as u64);
                }
            }
            woken |= page_addr >= dst && (page_addr < stop || page_addr < to);
        }
        self.runs = runs;
        if !woken {
            self.wake(page_addr);
        }
        if w.outcome == Outcome::Hit && write {
            self.want_pool();
        }
    }

    /// One run of a window: zero pages for a write, zero-page mappings for a read. If it stops
    /// early, `stopped_by` says why.
    fn install_run(&mut self, dst: usize, len: usize, write: bool, range: &Range) -> Done {
        self.stopped_by = 0;
        if write {
            self.install_write(dst, len, Some(range))
        } else {
            range.mark_tables(dst, len);
            self.install_read(dst, len)
        }
    }

    /// Installs `[from, end)` up to the end of the mapping: a piece the kernel refuses as
    /// crossing it (ENOENT, EINVAL) is halved, and nothing past the refused piece's last page is
    /// tried again, so that the memory beyond (`PROT_NONE`, not yet committed by the program)
    /// is not populated. Stops at a refused one-page piece or any other stop. Returns where
    /// the installed part from `from` ends (`from`: nothing).
    fn install_to_boundary(&mut self, from: usize, mut end: usize, write: bool, range: &Range) -> usize {
        let mut at = from;
        let mut piece = ((end - from) / 2).next_multiple_of(PAGE_SIZE);
        while at < end {
            let len = piece.min(end - at);
            match self.install_run(at, len, write, range) {
                Done::All => at += len,
                Done::Stopped(off) => {
                    // If refused, the end of the mapping lies inside this piece.
                    let last = at + len - PAGE_SIZE;
                    at += off;
                    if !self.refused_whole() || len == PAGE_SIZE {
                        break;
                    }
                    end = last;
                    piece = (len / 2).next_multiple_of(PAGE_SIZE);
                }
            }
        }
        Stats::add(&self.stats().windows_clipped, 1);
        at
    }

    /// The last install stopped because the kernel refused its range as a whole (ENOENT,
    /// EINVAL): it runs past the end of the mapping, or the mapping is gone.
    fn refused_whole(&self) -> bool {
        matches!(self.stopped_by, libc::ENOENT | libc::EINVAL)
    }

    /// A sequential writer is proven: keep the pool between its watermarks from now on. Random
    /// or read-only faults never start the scrub thread, so a program that does not stream
    /// through fresh memory pays for no pool at all.
    fn want_pool(&self) {
        let Some(pool) = self.shared.pool.as_ref() else { return };
        if self.shared.pool_paused.load(Relaxed) {
            return;
        }
        if !self.shared.active.load(Relaxed) {
            self.shared.active.store(true, Release);
        }
        if pool.available() < (self.opts.scrub_start / PAGE_SIZE) as u64 {
            self.shared.scrub.kick();
        }
    }

    /// Unregisters the span of `range` that misses `[lo, hi]` call for (see
    /// [`crate::predict::handback_span`]): the kernel serves it natively from now on.
    ///
    /// The span leaves the table (its pieces keep their page states), so that the engine keeps
    /// nothing for memory it no longer serves. A second hand-back from one range (or its
    /// pieces) for misses at least [`SPARSE_PAGES_PER_MISS`] apart on average gives back the
    /// whole range: one page touched per GiB of a 16 TiB reservation would otherwise cost a
    /// round trip per page for ever. Returns the span, in pages of `range`.
    fn hand_back(&mut self, range: &Arc<Range>, lo: u64, hi: u64) -> Option<(u64, u64)> {
        // Misses a 128 MiB or more apart, again: a sparse stride through a huge reservation.
        let sparse = (hi - lo) / self.opts.handback_misses.max(1) >= SPARSE_PAGES_PER_MISS;
        let (first, end) = match range.handbacks.load(Relaxed) {
            n if n > 0 && sparse => (0, range.pages),
            _ => handback_span(lo, hi, range.pages, (range.start / PAGE_SIZE) as u64),
        };
        let (addr, len) = (range.addr_of(first), (end - first) as usize * PAGE_SIZE);
        let shared = self.shared;
        let _reg = shared.reg_lock();
        // A range released, cut or replaced since the fault is not handed back: its span may
        // be another range's now.
        if shared.ranges.find(range.start).is_none_or(|r| r.id != range.id) {
            Stats::add(&self.stats().handbacks_stale, 1);
            return None;
        }
        if let Err(e) = self.uffd.unregister(addr, len) {
            self.note_errno(e.0);
            return None;
        }
        range.handbacks.fetch_add(1, Relaxed);
        self.shared.ranges.drop_span(addr, addr + len);
        Stats::add(&self.stats().handbacks, 1);
        Stats::add(&self.stats().pages_handed_back, end - first);
        Some((first, end))
    }

    /// Serves one page outside the window logic (already-claimed or unknown pages) and wakes it.
    fn install_one(&mut self, page_addr: usize, write: bool) {
        self.stopped_by = 0;
        let p = if write {
            self.install_write(page_addr, PAGE_SIZE, None)
        } else {
            self.install_read(page_addr, PAGE_SIZE)
        };
        if p != Done::All {
            // The thread is woken either way and faults again if it still needs the page.
            let stats = self.stats();
            Stats::add(
                match self.stopped_by {
                    // The memory was unmapped, moved, unregistered or changed since the fault.
                    libc::ENOENT | libc::EINVAL | libc::EFAULT | libc::ESRCH => &stats.installs_raced_unmap,
                    // Mappings kept changing (munmap/madvise/mremap events each time).
                    libc::EAGAIN => &stats.installs_raced_events,
                    _ => &stats.install_errors,
                },
                1,
            );
        }
        self.wake(page_addr);
    }

    /// Reads pending messages: events are applied now, faults queued. Called when an install
    /// got EAGAIN without progress, i.e. an event is waiting to be read.
    fn drain_events(&mut self) {
        Stats::add(&self.stats().drained_for_events, 1);
        let mut buf = [RawMsg::default(); BATCH];
        // The events read here are applied as of now; the rest of a batch read earlier (the
        // caller may be in the middle of one) keeps the older mark, or its unmaps would cut
        // ranges registered since.
        let outer = std::mem::replace(&mut self.seq, self.shared.ranges.seq());
        let n = match self.uffd.read(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                self.note_errno(e.0);
                0
            }
        };
        for m in &buf[..n] {
            match m.decode() {
                f @ Msg::PageFault { .. } => self.queue.push_back(f),
                e => self.handle(e),
            }
        }
        self.seq = outer;
        if n == 0 {
            std::thread::yield_now();
        }
    }

    /// The shared loop of every install: calls `op(offset, len)` until `[dst, dst + len)` is
    /// done, skipping present pages. `op` returns the ioctl's progress; `on_hole` is asked what to
    /// do on ENOENT (true: a source page was a hole and was skipped, retry).
    fn install_loop(
        &mut self,
        len: usize,
        mut op: impl FnMut(&mut Self, usize, usize) -> Progress,
        mut on_enoent: impl FnMut(&mut Self, usize) -> bool,
    ) -> Done {
        let mut off = 0;
        let mut retries = 0;
        while off < len {
            let p = op(self, off, len - off);
            off += p.done;
            match p.errno {
                None => {}
                Some(libc::EEXIST) => {
                    Stats::add(&self.stats().partial_installs, 1);
                    self.partials += 1;
                    off += PAGE_SIZE;
                }
                Some(libc::EAGAIN) if p.done > 0 => {}
                Some(libc::EAGAIN) => {
                    retries += 1;
                    if retries > EVENT_RETRIES {
                        self.stopped_by = libc::EAGAIN;
                        return Done::Stopped(off);
                    }
                    self.drain_events();
                }
                Some(libc::ENOENT) if on_enoent(self, off) => {}
                Some(e) => {
                    self.stopped_by = e;
                    return Done::Stopped(off);
                }
            }
        }
        Done::All
    }

    /// Installs zero pages for a write. The whole PMDs of the span whose table bit is clear get
    /// huge pages ([`Self::install_huge`]); everything else gets 4 KiB pages
    /// ([`Self::install_small`]), and its PMDs are marked as holding a page table.
    ///
    /// The pieces go in from the last to the first. The faulting page is in the first one, and
    /// an install wakes the thread waiting there: woken early, it would run on into the pieces
    /// not yet installed and fault there, and its fault gives that PMD a page table, which
    /// splits the huge page moved into it next (~1 ms). If a piece stops, the whole span is
    /// reported stopped at its start: pages already installed only leave stale bits behind,
    /// which cost an EEXIST later, never a hang.
    fn install_write(&mut self, dst: usize, len: usize, range: Option<&Range>) -> Done {
        if self.shared.pool_paused.load(Relaxed) {
            if let Some(r) = range {
                r.mark_tables(dst, len);
            }
            return self.copy(dst, len, CopyWhy::NoMove);
        }
        let mut pieces = std::mem::take(&mut self.pieces);
        pieces.clear();
        let mut off = 0;
        while off < len {
            let at = dst + off;
            let rest = len - off;
            let (n, huge) = match range.filter(|_| self.stage.is_some()) {
                Some(r) => match clear_pmds(r, at, rest) {
                    // 4 KiB pages up to the next PMD boundary, where huge pages may start.
                    0 => (((at / PMD_SIZE + 1) * PMD_SIZE - at).min(rest), false),
                    k => (k * PMD_SIZE, true),
                },
                None => (rest, false),
            };
            pieces.push((at, n, huge));
            off += n;
        }
        let mut done = Done::All;
        for &(at, n, huge) in pieces.iter().rev() {
            let d = match (range, huge) {
                (Some(r), true) => self.install_huge(at, n, r),
                (r, _) => {
                    if let Some(r) = r {
                        r.mark_tables(at, n);
                    }
                    self.install_small(at, n)
                }
            };
            if d != Done::All {
                done = Done::Stopped(0);
                break;
            }
        }
        self.pieces = pieces;
        done
    }

    /// 4 KiB pages: moved from the small ring while it has pages, else copied.
    fn install_small(&mut self, dst: usize, len: usize) -> Done {
        if !self.can_move {
            return self.copy(dst, len, CopyWhy::NoMove);
        }
        let pool = self.shared.pool.as_ref().expect("can_move implies a pool");
        let (end, _) = self.move_from(&pool.small, dst, len);
        let (off, why) = match end {
            MoveEnd::All => return Done::All,
            MoveEnd::Empty(o) => {
                Stats::add(&self.stats().pool_empty, 1);
                (o, CopyWhy::PoolEmpty)
            }
            MoveEnd::Refused(o) => (o, CopyWhy::MoveRefused),
        };
        match self.copy(dst + off, len - off, why) {
            Done::All => Done::All,
            Done::Stopped(o) => Done::Stopped(off + o),
        }
    }

    /// Whole PMDs `[dst, dst + len)` whose table bits are clear: huge pages moved from the huge
    /// ring, or made by this thread when the ring is empty. Anything irregular (a page already
    /// there, a refused move, no huge page to be had) marks the PMDs and ends in 4 KiB pages.
    fn install_huge(&mut self, dst: usize, len: usize, range: &Range) -> Done {
        let pool = self.shared.pool.as_ref().expect("huge pages imply a pool");
        let ring = pool.huge.as_ref().expect("huge pages imply a huge ring");
        let (end, clean) = self.move_from(ring, dst, len);
        let mut off = match end {
            MoveEnd::All if clean => {
                Stats::add(&self.stats().huge_moves, (len / PMD_SIZE) as u64);
                return Done::All;
            }
            MoveEnd::Empty(o) if clean => o,
            MoveEnd::All => return self.huge_fallback(dst, len, len, range),
            MoveEnd::Empty(o) | MoveEnd::Refused(o) => return self.huge_fallback(dst, len, o, range),
        };
        Stats::add(&self.stats().huge_moves, (off / PMD_SIZE) as u64);
        // The ring ran dry: prepare each remaining huge page here, as the kernel's own THP
        // fault would, while the scrub refills the ring on the other CPU.
        while off < len {
            let advised = range.huge.is_claimed(range.pmd_of(dst + off));
            let p = self.make_huge(dst + off, advised);
            if p.errno.is_some() || p.done < PMD_SIZE {
                return self.huge_fallback(dst, len, off + p.done, range);
            }
            off += PMD_SIZE;
        }
        Done::All
    }

    /// Populates the staging PMD (one transparent huge page, zeroed by the kernel) and moves it
    /// to `dst`. Returns the move's progress; an error before the move reports `done` 0.
    /// `advised`: the program asked for huge pages there, so the kernel would have spent the
    /// time to make one: no rest after a slow one (see [`STAGE_SLOW`]).
    fn make_huge(&mut self, dst: usize, advised: bool) -> Progress {
        let Some(stage) = self.stage.as_ref() else {
            return Progress {
                done: 0,
                errno: Some(libc::ENOSYS),
            };
        };
        if !advised && self.stage_rests_until.is_some_and(|t| Instant::now() < t) {
            return Progress {
                done: 0,
                errno: Some(libc::EBUSY),
            };
        }
        let addr = stage.as_ptr() as usize;
        let t0 = Instant::now();
        let populated = stage.populate();
        if t0.elapsed() > STAGE_SLOW {
            // Memory is fragmented (the kernel compacted to find a huge page, or gave up and
            // populated 4 KiB pages): copying is cheaper on the faulting path for a while.
            self.stage_rests_until = Some(Instant::now() + STAGE_REST);
        }
        if let Err(e) = populated {
            return Progress {
                done: 0,
                errno: Some(e.raw_os_error().unwrap_or(libc::ENOMEM)),
            };
        }
        let mut p = self.note(self.uffd.move_pages(dst, addr, PMD_SIZE));
        // EAGAIN without progress: an event is pending (mmap_changing); apply it and retry.
        let mut retries = 0;
        while p.done == 0 && p.errno == Some(libc::EAGAIN) && retries < EVENT_RETRIES {
            retries += 1;
            self.drain_events();
            p = self.note(self.uffd.move_pages(dst, addr, PMD_SIZE));
        }
        Stats::add(&self.stats().pages_moved, (p.done / PAGE_SIZE) as u64);
        if p.errno.is_none() && p.done == PMD_SIZE {
            Stats::add(&self.stats().huge_made, 1);
        } else {
            // Whatever stayed behind goes, so the next populate starts from an empty PMD.
            let _ = mman::madvise(addr, PMD_SIZE, mman::MADV_DONTNEED);
        }
        p
    }

    /// A whole-PMD install went irregular at byte `off` of `[dst, dst + len)`: mark its PMDs
    /// and install the rest with 4 KiB pages.
    fn huge_fallback(&mut self, dst: usize, len: usize, off: usize, range: &Range) -> Done {
        Stats::add(&self.stats().huge_fallbacks, 1);
        range.mark_tables(dst, len);
        if off >= len {
            return Done::All;
        }
        match self.install_small(dst + off, len - off) {
            Done::All => Done::All,
            Done::Stopped(o) => Done::Stopped(off + o),
        }
    }

    /// Moves ready pages of `ring` into `[dst, dst + len)`, one ioctl per contiguous run, until
    /// done or the ring is empty. Also returns whether it went cleanly: no page found present,
    /// no source hole (a huge page moves whole only then).
    fn move_from(&mut self, ring: &Ring, dst: usize, len: usize) -> (MoveEnd, bool) {
        let mut off = 0;
        let mut clean = true;
        while off < len {
            let want = ((len - off) / PAGE_SIZE) as u64;
            let Some(run) = ring.take(want) else {
                return (MoveEnd::Empty(off), clean);
            };
            // Pages of the run consumed so far (moved out, or found to be holes).
            let used = std::cell::Cell::new(0usize);
            let run_len = run.pages as usize * PAGE_SIZE;
            let seg_start = off;
            let seg_len = (len - off).min(run_len);
            let mut moved = 0u64;
            let partial_before = self.partials;
            let done = self.install_loop(
                seg_len,
                |h, o, rest| {
                    // `o` destination bytes are done; skipped destination pages did not use
                    // source pages, so the source offset is tracked separately.
                    let src_left = run_len - used.get();
                    if src_left == 0 {
                        return Progress {
                            done: 0,
                            errno: Some(libc::ENOSPC),
                        };
                    }
                    let n = rest.min(src_left);
                    let p = h.note(h.uffd.move_pages(dst + seg_start + o, run.addr + used.get(), n));
                    used.set(used.get() + p.done);
                    moved += (p.done / PAGE_SIZE) as u64;
                    p
                },
                |_, _| {
                    // A source hole, or a destination gone? mincore on the source page tells.
                    if used.get() < run_len && !ring.is_populated(run.addr + used.get()) {
                        used.set(used.get() + PAGE_SIZE);
                        clean = false;
                        true
                    } else {
                        false
                    }
                },
            );
            clean &= self.partials == partial_before;
            Stats::add(&self.stats().pages_moved, moved);
            let stopped_at = match done {
                Done::All => seg_len,
                Done::Stopped(o) => o,
            };
            let used = used.get();
            ring.untake(run, ((run_len - used) / PAGE_SIZE) as u64);
            off = seg_start + stopped_at;
            if let Done::Stopped(_) = done {
                if used == run_len && stopped_at < seg_len {
                    // The run ran out of source pages (holes): take more.
                    continue;
                }
                // The move was refused, or the destination is gone (then a copy stops too).
                return (MoveEnd::Refused(off), false);
            }
        }
        (MoveEnd::All, clean)
    }

    /// UFFDIO_COPY from the zero source, in chunks of its size.
    fn copy(&mut self, dst: usize, len: usize, why: CopyWhy) -> Done {
        let zero = self.zero.addr();
        let mut copied = 0u64;
        let done = self.install_loop(
            len,
            |h, o, rest| {
                let p = h.note(h.uffd.copy(dst + o, zero, rest.min(ZeroSource::LEN)));
                copied += (p.done / PAGE_SIZE) as u64;
                p
            },
            |_, _| false,
        );
        let stats = self.stats();
        Stats::add(&stats.pages_copied, copied);
        Stats::add(
            match why {
                CopyWhy::NoMove => &stats.copy_no_move,
                CopyWhy::PoolEmpty => &stats.copy_pool_empty,
                CopyWhy::MoveRefused => &stats.copy_move_refused,
            },
            copied,
        );
        done
    }

    /// Maps the zero page for a read.
    fn install_read(&mut self, dst: usize, len: usize) -> Done {
        let mut mapped = 0u64;
        let done = self.install_loop(
            len,
            |h, o, rest| {
                let p = h.note(h.uffd.zeropage(dst + o, rest));
                mapped += (p.done / PAGE_SIZE) as u64;
                p
            },
            |_, _| false,
        );
        Stats::add(&self.stats().pages_zero_mapped, mapped);
        done
    }
}

/// Whether an install ioctl's errno is one a healthy engine meets: a page already present
/// (EEXIST), a pending event or a race (EAGAIN), a hole or a destination gone with its mapping
/// (ENOENT), a range unregistered or changed under us, or a move the kernel refuses between
/// these two mappings (EINVAL: protection, mlock or registration differ), pages shared after a
/// fork (EBUSY), the process exiting (ESRCH, EINTR), memory short (ENOMEM), a source it cannot
/// move (EFAULT). Anything else (EPERM from a seccomp filter, EBADF, ENOTTY, ...) means the
/// descriptor is no longer usable as ours.
fn benign(e: i32) -> bool {
    matches!(
        e,
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

/// How [`Handler::move_from`] ended, with the byte offset reached.
#[derive(Clone, Copy, Debug)]
enum MoveEnd {
    All,
    /// The ring had no more pages.
    Empty(usize),
    /// A move failed other than on a present page or a hole: refused (EBUSY after fork,
    /// EINVAL), or the destination is gone (then the caller's copy stops too).
    Refused(usize),
}

/// Whole PMDs from `at` that may take huge pages: `at` on a PMD boundary, each PMD inside
/// `len` bytes and its table bit clear.
fn clear_pmds(r: &Range, at: usize, len: usize) -> usize {
    if at % PMD_SIZE != 0 {
        return 0;
    }
    (0..len / PMD_SIZE)
        .take_while(|i| r.pmd_is_clear(at + i * PMD_SIZE))
        .count()
}

#[derive(Clone, Copy)]
enum CopyWhy {
    NoMove,
    PoolEmpty,
    MoveRefused,
}
