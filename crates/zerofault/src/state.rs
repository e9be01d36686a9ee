//! The state the engine's threads, its handle and its regions share ([`Shared`]), built by one
//! constructor ([`Shared::new`]) for the engine's start and for tests; the subsystems meet
//! here, not through each other's types (docs/DESIGN.md, "The engine's layout").

use crate::fault;
use crate::fault::window::Predictors;
use crate::memory::ranges::RangeTable;
use crate::options::Options;
use crate::page::pages;
use crate::pool::zero::source::ZeroSource;
use crate::pool::Pool;
use crate::stats::{Stats, StatsHome};
use crate::sys::mman::{self, PAGE_SIZE};
use crate::sys::uffd::{FdIdentity, Features, Uffd};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard, RwLock};

/// State shared by the engine handle, its threads and its regions.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) opts: Options,
    /// `None` once the engine failed open or was dropped: the kernel serves every fault.
    pub(crate) uffd: RwLock<Option<Uffd>>,
    pub(crate) features: Features,
    pub(crate) ranges: RangeTable,
    /// The pools: none (no pool, or no `UFFDIO_MOVE`), one for the machine, or one per node
    /// with memory where there are several (in [`crate::memory::nodes::Nodes::pool_nodes`] order).
    pub(crate) pools: Vec<Pool>,
    /// One 2 MiB `MADV_HUGEPAGE` area per handler, where it prepares a huge page when the huge
    /// ring is empty (handlers prepare them in parallel). Empty unless whole PMDs get huge
    /// pages.
    pub(crate) stage: Vec<mman::Mapping>,
    pub(crate) zero: ZeroSource,
    pub(crate) stats: StatsHome,
    /// Set by Engine::drop before it wakes the threads.
    pub(crate) stopping: AtomicBool,
    /// Set when the engine failed open.
    pub(crate) failed: AtomicBool,
    /// Set when the engine gave its own mappings back (`Engine::give_back`): the pool rings
    /// and the doorbells are unmapped, and their addresses may be the program's.
    pub(crate) given_back: AtomicBool,
    /// Set by the handler on the first sequential write fault: the scrub thread fills nothing
    /// before.
    pub(crate) pool_may_fill: AtomicBool,
    /// `prctl(PR_SET_THP_DISABLE)`: no huge page goes into the program's memory.
    pub(crate) thp_disabled: AtomicBool,
    /// The system's THP mode was `always` at the start: a PMD of the program's with no advice
    /// may take huge pages (see `Range::may_take_huge`).
    pub(crate) thp_always: bool,
    /// Set once a write window took a huge page (or made one): from then on the scrub fills
    /// the huge ring too. Until then the small ring only, so that a program whose memory takes
    /// no huge page (`MADV_NOHUGEPAGE`, the THP prctl, windows that never cover a whole PMD)
    /// holds none in its pool either (`shared/repro/round2/t_thp.c nohuge`: 18 MiB of the
    /// pool's huge pages in its AnonHugePages, none natively). A prefill fills both.
    pub(crate) huge_wanted: AtomicBool,
    /// Ranges in a row given back to their end as sparse streams, and the program's mappings left to
    /// the kernel since (see [`Engine::leaves_mapping`]); a dense stream resets the first.
    pub(crate) sparse_run: AtomicU32,
    pub(crate) left_alone: AtomicU32,
    /// The pool is emptied and not refilled, and faults are served by copies (see
    /// [`Engine::pause_pool`]).
    pub(crate) pool_paused: AtomicBool,
    /// Tests only ([`Engine::park_scrub`]): each scrub thread stops in its next step, holding
    /// its pool's work lock, until cleared; `scrubs_parked` counts those stopped.
    pub(crate) scrub_parked: AtomicBool,
    pub(crate) scrubs_parked: AtomicU32,
    /// Set by [`Engine::stop_at_exit`]: the scrub threads leave at their next look; the
    /// handlers serve on until the process is gone.
    pub(crate) exiting: AtomicBool,
    /// The machine-wide state shared with this user's other processes (alone if refused).
    pub(crate) machine: crate::pool::machine::Machine,
    /// Why the machine-wide state was not shared, if it was not (for `--verbose`).
    pub(crate) machine_refused: Option<String>,
    /// One registered page per handler, outside every range, from this address on:
    /// [`Engine`]'s drop reads them one after the other, and each fault wakes one handler to
    /// see `stopping` and leave after answering it (the engine holds no descriptor but the
    /// userfaultfd). `PROT_NONE` until then, so that nothing else faults on them
    /// (`mlockall(MCL_CURRENT)` populates every accessible mapping).
    pub(crate) doorbell: usize,
    /// One bracket per handler: odd while that handler is inside one message (bumped on entry
    /// and on exit), so that [`Engine::stats`] can wait for the counts of the install that
    /// woke its caller. Its length is the number of handlers.
    pub(crate) message_seq: Box<[crate::sync::AtomicU64]>,
    /// Events (REMOVE, UNMAP, REMAP) read so far by any handler: a handler's cached view of
    /// the mappings is stale once this moved.
    pub(crate) events: AtomicU64,
    /// The window predictors of every (range, thread), shared by the handlers.
    pub(crate) predictors: Predictors,
    /// The window each handler is installing (see [`fault::Inflight`]).
    pub(crate) inflight: Box<[fault::Inflight]>,
    /// With several handlers, held across each read and the applying of the event it read, so
    /// that events are applied in the order the kernel queued them (see
    /// `Handler::read_ordered`). Engine threads only.
    pub(crate) event_order: Mutex<()>,
    /// Handler threads running (see [`Shared::handler_left`]).
    pub(crate) live_handlers: AtomicUsize,
    /// Scrub threads at work now (awake between two waits): a handler's poll
    /// (`handler_spin`) leaves their CPUs to them.
    pub(crate) scrubs_working: AtomicUsize,
    /// Scrub threads alive (each holds a copy of the descriptor in its own table).
    pub(crate) live_scrubs: AtomicUsize,
    /// The program's table still holds the descriptor, as far as the engine knows: engine
    /// threads hold copies in tables of their own (`sys::file::own_descriptor_table`), so a
    /// close by one of them does not hand the ranges back; see [`Shared::drain_then_close`].
    pub(crate) program_copy: AtomicBool,
    /// The NUMA view, where more than one node has memory (`None` on one node: nothing NUMA is
    /// done at all). See `memory/nodes.rs` and `Handler::choose_nodes`.
    pub(crate) numa: Option<crate::memory::nodes::Nodes>,
    /// How many pages the pools may hold ([`crate::pool::budget`]).
    pub(crate) budget: crate::pool::budget::Budget,
    /// Lending starved ranges to the kernel, and taking them back ([`crate::fault::handback`]).
    pub(crate) lending: crate::fault::lend::Lending,
    /// The descriptor's number and identity, for a forked child to close its copy without the
    /// lock around it (see [`Engine::close_after_fork`]).
    pub(crate) uffd_identity: Option<FdIdentity>,
    pub(crate) next_region: AtomicU64,
    /// Held across every change of both the table and the kernel's registration (a range
    /// registered, released, or handed back), so that the two agree: a hand-back of a range
    /// that a program thread replaced meanwhile would otherwise unregister the new one in the
    /// kernel, or cut it from the table while the kernel keeps it registered (a fault the table
    /// does not know, and an mremap refused for a registration nobody releases). Program
    /// threads take it inside hooks with signals blocked; nothing is done under it that waits
    /// for the handler.
    pub(crate) registration: Mutex<()>,
}

/// The parts of [`Shared`] that differ between an engine's ([`Engine::start`]) and a detached
/// state's (`Shared::detached`, for tests); the rest of [`Shared::new`] starts empty.
pub(crate) struct SharedParts {
    pub(crate) stage: Vec<mman::Mapping>,
    pub(crate) uffd: Option<Uffd>,
    pub(crate) features: Features,
    pub(crate) pools: Vec<Pool>,
    pub(crate) zero: ZeroSource,
    pub(crate) stats: StatsHome,
    pub(crate) machine: crate::pool::machine::Machine,
    pub(crate) machine_refused: Option<String>,
    pub(crate) thp_disabled: bool,
    pub(crate) doorbell: usize,
    /// Handler threads: a doorbell, a `message_seq` bracket and an `inflight` window each.
    pub(crate) handlers: usize,
    pub(crate) uffd_identity: Option<FdIdentity>,
    pub(crate) lending: crate::fault::lend::Lending,
    pub(crate) budget: crate::pool::budget::Budget,
    pub(crate) numa: Option<crate::memory::nodes::Nodes>,
    pub(crate) opts: Options,
}

impl Shared {
    /// The one constructor of the shared state, for [`Engine::start`] and the tests'
    /// `Shared::detached`: `p`, with every flag down, every count zero and the tables empty.
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`), or a test.
    pub(crate) fn new(p: SharedParts) -> Shared {
        Shared {
            stage: p.stage,
            uffd: RwLock::new(p.uffd),
            features: p.features,
            ranges: RangeTable::default(),
            pools: p.pools,
            zero: p.zero,
            stats: p.stats,
            stopping: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            given_back: AtomicBool::new(false),
            pool_may_fill: AtomicBool::new(false),
            pool_paused: AtomicBool::new(false),
            scrub_parked: AtomicBool::new(false),
            scrubs_parked: AtomicU32::new(0),
            exiting: AtomicBool::new(false),
            machine: p.machine,
            machine_refused: p.machine_refused,
            thp_disabled: AtomicBool::new(p.thp_disabled),
            thp_always: mman::thp_always(),
            huge_wanted: AtomicBool::new(false),
            sparse_run: AtomicU32::new(0),
            left_alone: AtomicU32::new(0),
            doorbell: p.doorbell,
            message_seq: (0..p.handlers).map(|_| crate::sync::AtomicU64::new(0)).collect(),
            events: AtomicU64::new(0),
            predictors: Predictors::default(),
            inflight: (0..p.handlers).map(|_| fault::Inflight::default()).collect(),
            event_order: Mutex::new(()),
            live_handlers: AtomicUsize::new(0),
            scrubs_working: AtomicUsize::new(0),
            live_scrubs: AtomicUsize::new(0),
            program_copy: AtomicBool::new(p.uffd_identity.is_some()),
            uffd_identity: p.uffd_identity,
            lending: p.lending,
            budget: p.budget,
            numa: p.numa,
            next_region: AtomicU64::new(1),
            registration: Mutex::new(()),
            opts: p.opts,
        }
    }
}

impl Shared {
    /// Wakes every pool's scrub thread (to refill, or to see the engine stopping or failed).
    ///
    /// # Context
    /// Any thread: a program thread (pause, resume, drop, recycling), a handler (a failure, an
    /// empty ring), a scrub (stepping aside). Takes no lock; never sleeps.
    pub(crate) fn kick_scrubs(&self) {
        for p in &self.pools {
            p.scrub.kick();
        }
    }

    /// The handler threads the engine runs (each has a doorbell, a `message_seq` bracket and an
    /// `inflight` window).
    ///
    /// # Context
    /// Any thread.
    pub(crate) fn handlers(&self) -> usize {
        self.message_seq.len()
    }

    /// Whether `page_addr` is one of the handlers' doorbell pages.
    ///
    /// # Context
    /// A handler, on each fault address. Takes no lock.
    pub(crate) fn is_doorbell(&self, page_addr: usize) -> bool {
        page_addr.wrapping_sub(self.doorbell) < self.handlers() * PAGE_SIZE
    }

    /// A handler thread leaves, with its read guard on the descriptor dropped; `failed`: other
    /// than by an orderly stop. The engine fails open: `failed` is set at once (the other
    /// handlers see it within their poll timeout and leave too), and the last handler to leave
    /// hands every range back and closes the descriptor; with descriptor tables of their own
    /// (the shim), it reads what is still queued until its copy is the last instead
    /// ([`Shared::drain_then_close`]). Not the first: its write lock would wait for
    /// the others' read guards, and std's RwLock then holds back new readers, so a program
    /// thread holding `reg` on its way to a read guard, and a handler waiting for `reg` in a
    /// hand-back, would never let go.
    ///
    /// # Context
    /// A handler, on its way out (its guard's drop). The last one takes the descriptor's
    /// write lock, which waits for no handler (they all left) but may wait for a program
    /// thread's read guard.
    pub(crate) fn handler_left(&self, failed: bool) {
        if failed {
            self.failed.store(true, Release);
            self.kick_scrubs();
        }
        if self.live_handlers.fetch_sub(1, AcqRel) == 1 && self.failed.load(Acquire) {
            if crate::sys::thread::tables_own() {
                self.drain_then_close();
            } else {
                // The program's table is this thread's: its close is the program's.
                self.close_uffd();
            }
        }
    }

    /// The last handler of a failed engine: every range is unregistered (which wakes every
    /// fault waiting there; the kernel serves them and all later ones), then the descriptor is
    /// taken from the others and read until this thread's copy is the last one: the program's
    /// copy closed (by its next hook, [`Shared::tidy`], or by a stop) and every scrub gone. A
    /// `MADV_DONTNEED` or `munmap` that raised an event just before the unregister waits until
    /// the event is read or the descriptor released; engine threads' copies live in tables of
    /// their own, so this thread's close alone would release nothing. A stop (`stopping`) ends
    /// the reading once no scrub is left: its caller closes the program's copy right after.
    ///
    /// # Context
    /// The last handler thread, on its way out; takes the descriptor's write lock (as
    /// [`Shared::close_uffd`]); sleeps in polls of 100 ms.
    pub(crate) fn drain_then_close(&self) {
        let taken = {
            let mut uffd = self.uffd.write().unwrap_or_else(|e| e.into_inner());
            if let Some(u) = uffd.as_ref() {
                self.unregister_all(u);
            }
            uffd.take()
        };
        let Some(u) = taken else { return };
        let mut raw = [crate::sys::uffd::RawMsg::default(); 16];
        // A scrub's discard waits for its event to be read whatever a stop says: the stop
        // itself waits for the scrub.
        while self.live_scrubs.load(Acquire) > 0 || (!self.stopping.load(Acquire) && self.program_copy.load(Acquire)) {
            let Ok(n) = u
                .wait(Some(std::time::Duration::from_millis(100)))
                .and_then(|()| u.read(&mut raw))
            else {
                break;
            };
            // A fault read here was raised before the unregister, or in memory registered that
            // the table did not know: its page is unregistered (else it would fault again at
            // once), and the thread woken, for the kernel to serve.
            for m in &raw[..n] {
                if let crate::sys::uffd::Msg::PageFault { addr, .. } = m.decode() {
                    let page = addr & !(PAGE_SIZE - 1);
                    let _ = u.unregister(page, PAGE_SIZE);
                    let _ = u.wake(page, PAGE_SIZE);
                }
            }
        }
        drop(u);
    }

    /// Closes the userfaultfd, every range the engine registered unregistered first, and the
    /// program's copy with it when a failed handler took the descriptor ([`Shared::drain_then_close`]).
    /// `UFFDIO_UNREGISTER` wakes every fault waiting in the range, which the kernel then
    /// serves; the unregister, not the close, hands the ranges back: a process that shares the
    /// memory (`clone(CLONE_VM)` without `CLONE_THREAD`) or an engine thread may hold a copy.
    ///
    /// # Context
    /// A program thread with every engine thread stopped (fail open, stop for good, the
    /// engine's drop), or the last handler leaving, where engine threads share the program's
    /// descriptor table. Takes the descriptor's write lock, then the range table's read lock;
    /// the ioctls sleep on the mmap lock.
    pub(crate) fn close_uffd(&self) {
        let mut uffd = self.uffd.write().unwrap_or_else(|e| e.into_inner());
        // Not through a number the program took back (it closed the engine's copy): with
        // every engine thread gone, the last copy closed releases the ranges anyway.
        if let Some(u) = uffd.as_ref().filter(|u| u.still_ours()) {
            self.unregister_all(u);
        }
        drop(uffd.take());
        drop(uffd);
        self.close_program_copy();
    }

    /// The program's copy of the descriptor, closed if its number still names the engine's
    /// file (once).
    ///
    /// # Context
    /// A program thread, or an engine thread sharing the program's table (never one with a
    /// table of its own).
    fn close_program_copy(&self) {
        if self.program_copy.swap(false, AcqRel) {
            if let Some(id) = self.uffd_identity {
                // SAFETY: the engine no longer uses the program's copy: the descriptor was
                // taken from `uffd` (by a failed handler, or by `close_uffd` above).
                unsafe { id.close_if_same() };
            }
        }
    }

    /// On a program thread's way into the engine (each hook): once a failed handler took the
    /// descriptor, the program's copy is closed here, and the handler reading what is still
    /// queued may leave. One atomic load otherwise.
    ///
    /// # Context
    /// A program thread, inside a hook; may take the descriptor's read lock (never waits on it).
    pub(crate) fn tidy(&self) {
        if !self.failed.load(Acquire) || !self.program_copy.load(Acquire) {
            return;
        }
        let taken = self.uffd.try_read().is_ok_and(|u| u.is_none());
        if taken {
            self.close_program_copy();
        }
    }

    /// The descriptor for a program thread's ioctl: `None` once the program closed its copy
    /// (`closefrom`, `close_range`), whose number may name a file of the program's now. The
    /// engine then fails open: its handlers, which hold copies of their own, hand every range
    /// back. Engine threads get the descriptor as it is (their tables hold it).
    ///
    /// # Context
    /// Any thread; takes the descriptor's read lock; one fstat on a program thread.
    pub(crate) fn uffd_here(&self) -> Option<std::sync::RwLockReadGuard<'_, Option<Uffd>>> {
        let program = !crate::sys::thread::is_engine_thread();
        if program {
            self.tidy();
        }
        let guard = self.uffd.read().unwrap_or_else(|e| e.into_inner());
        let lost = guard.is_some() && program && self.uffd_identity.is_some_and(|id| !id.present());
        if lost {
            self.program_copy.store(false, Release);
            self.failed.store(true, Release);
            self.kick_scrubs();
            return None;
        }
        Some(guard)
    }

    /// Unregisters every range of the table (the program's memory), and the engine's own
    /// registered mappings (pool rings, doorbells). Errors are ignored: a range the program
    /// unmapped meanwhile has nothing left to wake.
    ///
    /// # Context
    /// As [`Shared::close_uffd`], or the exiting thread ([`crate::Engine::stop_at_exit`]);
    /// takes the range table's read lock; the ioctls sleep on the mmap lock.
    pub(crate) fn unregister_all(&self, u: &Uffd) {
        // A walk by address, not a list: nothing is allocated here (see `next_span`).
        let mut at = 0;
        while let Some((start, end)) = self.ranges.next_span(at) {
            let _ = u.unregister(start, end - start);
            at = end;
        }
        let _ = u.unregister(self.doorbell, self.handlers() * PAGE_SIZE);
        for p in &self.pools {
            for (a, l) in p.areas() {
                let _ = u.unregister(a, l);
            }
        }
    }

    /// Pages the pools hold: ready, and recycled but not zeroed yet (see [`crate::pool::budget`]).
    ///
    /// # Context
    /// Any thread; takes no lock.
    pub(crate) fn pool_held(&self) -> u64 {
        self.pools.iter().map(|p| p.available() + p.dirty()).sum()
    }

    /// Hands every fault to the kernel for good, from an engine thread (the scrub, on seeing
    /// a tracer): `failed` is set, and every handler is woken by its doorbell to see it and
    /// leave; the last to leave closes the descriptor. DESIGN.md, "The program's rights".
    ///
    /// # Context
    /// A scrub thread; takes no lock.
    pub(crate) fn step_aside(&self) {
        if self.failed.swap(true, AcqRel) {
            return;
        }
        Stats::add(&self.stats.steps_aside, 1);
        self.kick_scrubs();
        ring_doorbells(self, self.handlers());
    }

    /// See [`Shared::registration`].
    ///
    /// # Context
    /// A program thread (map, adopt, release, a region's drop) or a handler (hand-back, lend,
    /// take back). Sleeps while another holds it; never held across a wait for a handler.
    pub(crate) fn registration_lock(&self) -> MutexGuard<'_, ()> {
        self.registration.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `[addr, addr + len)` in the table, then registers it. With the engine failed,
    /// only records it (so that an owning Region still unmaps it). `fresh`: no page of it was
    /// ever touched; otherwise every PMD of it may hold a page table (no huge page is moved
    /// there).
    ///
    /// # Safety
    /// As [`Uffd::register`]: anonymous private memory whose missing pages this engine serves
    /// from now on.
    ///
    /// # Context
    /// A program thread (`Engine::map`, `register`, `adopt`, a region's re-register). Takes
    /// the registration lock, then the descriptor's read lock; the register ioctl may sleep on
    /// the mmap lock.
    pub(crate) unsafe fn register_range(
        &self,
        addr: usize,
        len: usize,
        owner: Option<u64>,
        fresh: bool,
    ) -> io::Result<()> {
        let _reg = self.registration_lock();
        let r = self.ranges.insert(addr, pages(len), owner);
        if !fresh {
            r.pmds.mark_tables(addr, len);
        }
        let held = self.uffd_here();
        let uffd = held.as_deref().and_then(Option::as_ref);
        if let Some(u) = uffd.as_ref() {
            // SAFETY: this function's contract.
            if let Err(e) = unsafe { u.register(addr, len) } {
                self.ranges.remove(&r);
                return Err(e.into());
            }
        }
        Ok(())
    }
}

/// Rings the first `n` doorbells: each read's fault is answered by one handler, which then sees
/// `stopping` and leaves; so one read per handler started stops them all, one after the other
/// (one more would wait for ever: no handler left, and the descriptor still open). A handler
/// that left early failed open: the descriptor is closed, and the kernel answers the reads.
/// The doorbells are `PROT_NONE` again afterwards.
///
/// # Context
/// A program thread (`Engine::pause`, drop) or a scrub (stepping aside). Each read waits for a
/// handler's answer (a fault on the doorbell), or for the kernel once the descriptor is closed.
pub(crate) fn ring_doorbells(shared: &Shared, n: usize) {
    if n == 0 {
        return;
    }
    let bells = shared.handlers() * PAGE_SIZE;
    // SAFETY: the doorbells are the engine's own pages, read only below.
    let _ = unsafe { mman::protect(shared.doorbell, bells, libc::PROT_READ) };
    for i in 0..n {
        // SAFETY: our own mapped pages, readable now; reading one maps the zero page.
        unsafe { std::ptr::read_volatile((shared.doorbell + i * PAGE_SIZE) as *const u8) };
    }
    // SAFETY: as above.
    let _ = unsafe { mman::protect(shared.doorbell, bells, libc::PROT_NONE) };
}

#[cfg(test)]
impl Shared {
    /// [`Shared::detached`] on the nodes of `topology` (a fake tree): a 4 KiB pool of
    /// `opts.pool_max` per node with memory, not bound (the nodes need not exist here), and
    /// the NUMA view with `policy` as the process's.
    pub(crate) fn detached_nodes(
        opts: Options,
        topology: crate::sys::numa::Topology,
        policy: crate::memory::nodes::Policy,
    ) -> Shared {
        let numa = crate::memory::nodes::Nodes::new(topology, policy);
        let pools = numa
            .pool_nodes()
            .map(|n| {
                let mut p = Pool::new(opts.pool_max, false, false, None).expect("pool");
                p.node = Some(n);
                p
            })
            .collect();
        Shared {
            pools,
            numa: Some(numa),
            ..Shared::detached(
                Options {
                    pool: false,
                    ..opts.clone()
                },
                false,
            )
        }
        .with_pool_option(opts.pool)
    }

    fn with_pool_option(mut self, pool: bool) -> Shared {
        self.opts.pool = pool;
        self
    }

    /// State with no userfaultfd and no threads, for driving the handler against a fake
    /// kernel: a pool of `opts.pool_max` (real memory; with a huge ring and a staging area
    /// when `huge`), nothing filled.
    pub(crate) fn detached(opts: Options, huge: bool) -> Shared {
        let pools: Vec<Pool> = opts
            .pool
            .then(|| Pool::new(opts.pool_max, huge, false, None).expect("pool"))
            .into_iter()
            .collect();
        let stage = pools
            .first()
            .filter(|p| p.huge.is_some())
            .map(|_| mman::Mapping::new(crate::page::PMD_SIZE, mman::Thp::Always).expect("staging area"))
            .into_iter()
            .collect();
        Shared::new(SharedParts {
            stage,
            uffd: None,
            features: Features(Features::WANTED),
            pools,
            zero: ZeroSource::new().expect("zero source"),
            stats: StatsHome::Own(Box::default()),
            machine: crate::pool::machine::Machine::alone(),
            machine_refused: None,
            thp_disabled: false,
            doorbell: 0,
            handlers: 1,
            uffd_identity: None,
            // As on this project's machine: one handler and one scrub on two CPUs.
            lending: crate::fault::lend::Lending::new(opts.lend_at(2, 2)),
            budget: crate::pool::budget::Budget::new(opts.pool_max, None),
            numa: None,
            opts,
        })
        .thp_mode_always()
    }

    /// A detached state models a machine whose THP mode is `always`: a test's range takes huge
    /// pages without advice (`Range::may_take_huge`; its own test sets `thp_always` back).
    fn thp_mode_always(mut self) -> Shared {
        self.thp_always = true;
        self
    }
}
