//! The engine's start, once per process: the state machine `IDLE` -> `STARTING` -> `READY`
//! (or `OFF`) of state.rs, run by the first large request; the wait of the requests made while
//! another thread starts it; and the fork handlers, which take a fork child back to `IDLE`.
//! Why the front (front/front.c) has a machine of its own for loading the shim:
//! docs/DESIGN.md, "The engine's layout".

use crate::arena::Arena;
use crate::state::{
    arena, getpid, lock_future, running, say, ARENA, ASKED, ENGINE, ENGINE_PID, IDLE, OFF, OPTIONS, OWNER_PID, READY,
    SANDBOXED, STARTING, STATE, STATS, THP_ALWAYS,
};
use engine::os::mman::PMD_SIZE;
use engine::{Engine, Options, StatsOut};
use std::sync::atomic::{AtomicBool, Ordering::*};

/// How long a large request made while another thread starts the engine waits for it (many
/// times a start's own length) before it passes through, as every such request did before:
/// threads making their first large request at once got one block served and the others not
/// (docs/DESIGN.md, "Figures that left the code comments"). Bounded, because the request may
/// come with a lock the starting thread needs.
const START_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// Set once a wait for the start ran out (see [`engine`]).
static START_WAIT_GAVE_UP: AtomicBool = AtomicBool::new(false);

/// The engine for a large request of `len` bytes: [`engine`], once the large requests made so
/// far, this one included, add up to the `start_after` knob; `None` before (the request goes to
/// the system untouched: below that the engine's start and exit cost more than it saves).
///
/// # Context
/// Any program thread, inside the hook scope, quiet ([`crate::hook::Hook::engine_for`]); as
/// [`engine`].
pub fn engine_for(len: usize) -> Option<&'static Engine> {
    if STATE.load(Acquire) == IDLE {
        let after = OPTIONS.get().map_or(0, |o| o.start_after);
        if ASKED.fetch_add(len, Relaxed).saturating_add(len) < after {
            return None;
        }
    }
    engine()
}

/// The engine, started now if this is the first large request (or waited for, at most
/// [`START_WAIT`], if another thread is starting it). `None` on engine threads, in vfork
/// children, and when it is off.
///
/// # Context
/// Any program thread, inside the hook scope, quiet ([`crate::hook::Hook::engine`]). The
/// thread that wins the start runs [`start`]; one that finds another starting yields in a loop
/// for at most [`START_WAIT`]. Takes no lock of the shim's.
pub fn engine() -> Option<&'static Engine> {
    let mine = || !engine::in_engine_thread() && OWNER_PID.load(Acquire) == getpid();
    if STATE.load(Acquire) == IDLE && mine() {
        start(); // returns at once if another thread won the start
    }
    if STATE.load(Acquire) == STARTING && mine() && !START_WAIT_GAVE_UP.load(Relaxed) {
        let t0 = std::time::Instant::now();
        while STATE.load(Acquire) == STARTING {
            if t0.elapsed() >= START_WAIT {
                // The start is stuck (on a lock this thread holds, say): later requests pass
                // through at once instead of waiting the bound again each time.
                START_WAIT_GAVE_UP.store(true, Relaxed);
                break;
            }
            std::thread::yield_now();
        }
    }
    running()
}

/// Starts the engine. Under a finite soft `RLIMIT_AS` / `RLIMIT_DATA` (whichever is lower)
/// the engine reserves no arena and a pool of a thirty-second of it at most (shared by the
/// nodes' pools), so that what the program may map stays what it would be without the shim,
/// within that.
///
/// # Context
/// A program thread, from [`engine`], inside the hook scope, quiet; the only one with `STATE`
/// at `STARTING`. Takes the engine's locks while the engine starts (it spawns the engine's
/// threads and maps its memory); does not wait for another thread.
fn start() {
    if SANDBOXED.load(Acquire) || STATE.compare_exchange(IDLE, STARTING, AcqRel, Acquire).is_err() {
        return;
    }
    let Some(mut opts) = OPTIONS.get().cloned() else {
        STATE.store(OFF, Release);
        return;
    };
    if let Some(why) = refused() {
        if opts.verbose {
            say(&format!(
                "zerofault: engine not started in pid {}: {why}; running on plain memory",
                getpid()
            ));
        }
        STATE.store(OFF, Release);
        return;
    }
    let limit = engine::os::mman::address_limit();
    if let Some(l) = limit {
        within_address_limit(&mut opts, l);
    }
    let stats = STATS.load(Acquire);
    let started = if stats.is_null() {
        Engine::new(opts.clone())
    } else {
        // SAFETY: STATS points to a MAP_SHARED block of size_of::<Stats>() zeroed bytes (all
        // zero is a valid Stats of atomics), mapped for the life of the process.
        Engine::with_stats(opts.clone(), unsafe { &*stats })
    };
    let e = match started {
        Ok(e) => e,
        Err(why) => {
            if opts.stats == StatsOut::Text || opts.verbose {
                say(&format!(
                    "zerofault: engine not started in pid {}: {why}; running on plain memory",
                    getpid()
                ));
            }
            STATE.store(OFF, Release);
            return;
        }
    };
    if opts.verbose {
        say_started(&e);
    }
    adopt_arena(&e, &opts, limit.is_none());
    if lock_future() {
        e.pause_pool(true);
    }
    THP_ALWAYS.store(engine::os::mman::thp_always(), Release);
    ENGINE.store(Box::into_raw(Box::new(e)), Release);
    ENGINE_PID.store(getpid(), Release);
    STATE.store(READY, Release);
}

/// Why the engine must not start in this process, if it must not: a seccomp filter may
/// refuse (or kill the process for) what the engine calls, which also switches the shim off
/// for good (`SANDBOXED`); a tracer reads memory it cannot wait for the engine to fill
/// (rights.rs); a descriptor limit too tight to spare one ([`MIN_NOFILE`]).
///
/// # Context
/// A program thread, from [`start`] (`STATE` at `STARTING`); takes no lock, does not sleep.
fn refused() -> Option<&'static str> {
    if engine::os::thread::seccomp_filtered() {
        SANDBOXED.store(true, Release);
        Some("the process runs under a seccomp filter")
    } else if engine::os::thread::traced() {
        Some("the process is being traced (a debugger reads memory the engine cannot fill for it)")
    } else if nofile_limit().is_some_and(|n| n < MIN_NOFILE) {
        Some("the soft RLIMIT_NOFILE is below 64: too tight to spare the descriptor the engine holds")
    } else {
        None
    }
}

/// The smallest soft `RLIMIT_NOFILE` under which the engine starts. The engine holds one
/// descriptor in the program's table for the process's life (its userfaultfd, which the
/// hooks' registrations need), so a program opening until EMFILE gets one descriptor fewer
/// than natively. Under 64 that is more than one in sixty-four: such a limit is set on purpose
/// by a program (or a sandbox around it) that counts its descriptors, and the one the engine
/// holds may be one it needs (under a limit of 4, the only one it has past stdio). At 64 and
/// above (1024 by default) the one descriptor is the README's visible difference.
const MIN_NOFILE: u64 = 64;

/// The soft `RLIMIT_NOFILE`, read with a raw system call; None if it cannot be read.
///
/// # Context
/// A program thread, from [`refused`]; takes no lock, does not sleep.
fn nofile_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64(0, RLIMIT_NOFILE, NULL, &lim) reads our own limit into `lim`.
    let r = unsafe {
        engine::os::raw::call(
            libc::SYS_prlimit64,
            [
                0,
                libc::RLIMIT_NOFILE as usize,
                0,
                &mut lim as *mut libc::rlimit as usize,
                0,
                0,
            ],
        )
    };
    r.ok().map(|_| lim.rlim_cur)
}

/// `opts` under a finite address-space limit of `limit` bytes: a pool of a thirty-second of it
/// at most (none under two huge pages), the scrub's watermarks within the pool.
///
/// # Context
/// A program thread, from [`start`] (`STATE` at `STARTING`); takes no lock, does not sleep.
fn within_address_limit(opts: &mut Options, limit: usize) {
    let pool = engine::page::pmd_start(limit / 32);
    opts.pool_max = opts.pool_max.min(pool);
    if opts.pool_max < 2 * PMD_SIZE {
        opts.pool = false;
        opts.pool_max = PMD_SIZE;
    }
    opts.scrub_stop = opts.scrub_stop.min(opts.pool_max);
    opts.scrub_start = opts.scrub_start.min(opts.scrub_stop);
}

/// The verbose line on engine `e` just started: its userfaultfd, pool and machine state.
///
/// # Context
/// A program thread, from [`start`] (`STATE` at `STARTING`); takes no lock, does not sleep.
fn say_started(e: &Engine) {
    let f = e.features();
    let machine = match e.machine_state() {
        Ok(()) => "shared with this user's other processes".to_string(),
        Err(why) => format!("alone ({why})"),
    };
    say(&format!(
        "zerofault: engine started in pid {}: userfaultfd{}, pool {} MiB, machine state {machine}",
        getpid(),
        if f.has(engine::Features::MOVE) {
            " with UFFDIO_MOVE"
        } else {
            " without UFFDIO_MOVE (pages are copied)"
        },
        e.options().pool_max >> 20
    ));
}

/// The arena, served by engine `e`: made once (a forked child keeps its parent's and registers
/// it again), never under a memory limit (`unlimited` false); where `e` cannot take it, it is
/// forgotten and large mallocs pass through.
///
/// # Context
/// A program thread, from [`start`] (`STATE` at `STARTING`); takes the engine's registration
/// lock (in `Engine::adopt`); does not sleep.
fn adopt_arena(e: &Engine, opts: &Options, unlimited: bool) {
    let mut made_now = false;
    if ARENA.load(Acquire).is_null() && opts.preload_arena > 0 && unlimited {
        if let Ok(a) = Arena::new(opts.preload_arena) {
            ARENA.store(Box::into_raw(Box::new(a)), Release);
            made_now = true;
        }
    }
    if let Some(a) = arena() {
        let (base, len) = a.area();
        // SAFETY: the arena is our own anonymous private reservation, mapped for the life of
        // the process and registered with no other userfaultfd (a fork child's registration was
        // dropped by the kernel). Made just now, it holds no page and no page table, so whole
        // PMDs of its blocks may take huge pages (and go back whole when freed); inherited by
        // a fork child, its blocks already handed out may hold pages.
        if unsafe { e.adopt(base, len, made_now) }.is_err() {
            ARENA.store(std::ptr::null_mut(), Release); // large mallocs pass through
        }
    }
}

/// Installs the fork handlers below.
///
/// # Context
/// The thread that runs `zerofault_shim_init` (init.rs), once.
pub fn handle_forks() {
    // SAFETY: the handlers are plain extern "C" functions that take and release spin locks,
    // store atomics and close one descriptor.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
}

/// Before a fork: the engine's allocator and the arena locked, so that the child finds them
/// whole.
///
/// # Context
/// The program thread that calls fork(), from glibc's fork; spins on the allocator's and the
/// arena's locks until they are free.
extern "C" fn fork_prepare() {
    engine::os::alloc::fork_prepare();
    if let Some(a) = arena() {
        a.lock().lock();
    }
}

/// After a fork, in the parent: the locks [`fork_prepare`] took are released.
///
/// # Context
/// The program thread that called fork(), in the parent; takes no lock, does not sleep.
extern "C" fn fork_parent() {
    if let Some(a) = arena() {
        a.lock().unlock();
    }
    engine::os::alloc::fork_parent();
}

/// The child of a fork: the engine is the parent's (its threads are not here, its
/// userfaultfd serves the parent). Close our copy of the descriptor now, so that the parent
/// failing open is never held up by it, forget the engine, and start afresh on the first large
/// request. Only atomics and close(2): async-signal-safe, as a fork child requires.
///
/// # Context
/// The child's only thread, right after fork(); releases the locks [`fork_prepare`] took,
/// takes none, does not sleep.
extern "C" fn fork_child() {
    if let Some(a) = arena() {
        a.lock().unlock();
    }
    engine::os::alloc::fork_child();
    engine::os::thread::forget_engine_threads_after_fork();
    OWNER_PID.store(getpid(), Release);
    // A start in progress in another thread of the parent never ends here (that thread is not
    // in the child): the child runs without the engine, its large requests passing through at
    // once instead of waiting for it.
    let _ = STATE.compare_exchange(STARTING, OFF, AcqRel, Relaxed);
    if STATE.load(Acquire) != READY {
        return;
    }
    if SANDBOXED.load(Acquire) {
        // The filter is the child's too: its engine never starts (the parent's is leaked below
        // all the same, its descriptor closed).
        let old = ENGINE.swap(std::ptr::null_mut(), AcqRel);
        if !old.is_null() {
            // SAFETY: as below.
            unsafe { &*old }.close_after_fork();
        }
        STATE.store(OFF, Release);
        return;
    }
    let old = ENGINE.swap(std::ptr::null_mut(), AcqRel);
    if !old.is_null() {
        // SAFETY: a leaked Box<Engine>, never freed; only its descriptor is closed here.
        unsafe { &*old }.close_after_fork();
    }
    STATE.store(IDLE, Release);
}
