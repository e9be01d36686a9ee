//! The shim's state in this process: the options read at load, the engine and the arena once
//! started. Nothing here starts anything: the engine's start is
//! start.rs, the shim's initialisation init.rs, its exit exit.rs; a hook reaches the engine
//! through its scope (hook.rs).
//!
//! Load costs only the symbol lookups and the options: a process that never makes a large
//! request starts no thread, opens no descriptor and reserves nothing.

use crate::arena::Arena;
use engine::os::raw;
use engine::Stats;
use engine::{Engine, Options};
use libc::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// Before the constructor ran.
pub(crate) const UNINIT: u8 = 0;
/// Loaded; the engine starts on the first large request.
pub(crate) const IDLE: u8 = 1;
/// One thread is starting the engine; the others wait for it (at most start.rs's `START_WAIT`).
pub(crate) const STARTING: u8 = 2;
pub(crate) const READY: u8 = 3;
/// Disabled, refused options, or the engine could not start: every hook passes through.
pub(crate) const OFF: u8 = 4;

pub(crate) static STATE: AtomicU8 = AtomicU8::new(UNINIT);
pub(crate) static ENGINE: AtomicPtr<Engine> = AtomicPtr::new(std::ptr::null_mut());
pub(crate) static ARENA: AtomicPtr<Arena> = AtomicPtr::new(std::ptr::null_mut());
/// The process whose engine `ENGINE` is (a vfork child shares our memory but must not use it).
pub(crate) static ENGINE_PID: AtomicI32 = AtomicI32::new(0);
/// The process that may start an engine: the one that loaded the shim, or a fork child (the
/// fork handler says so). A vfork child runs no fork handler and never starts one.
pub(crate) static OWNER_PID: AtomicI32 = AtomicI32::new(0);
/// The process that loaded the shim (it prints the stats).
pub(crate) static ROOT_PID: AtomicI32 = AtomicI32::new(0);
/// Whether this process says at exit, when verbose, that it never started the engine (see
/// `init_options`).
pub(crate) static SAY_UNUSED: AtomicBool = AtomicBool::new(false);
pub(crate) static THRESHOLD: AtomicUsize = AtomicUsize::new(usize::MAX);
pub(crate) static OPTIONS: OnceLock<Options> = OnceLock::new();
/// Counters shared by this process's engine and its forked children's (MAP_SHARED), when
/// `ZEROFAULT_STATS` asks for the text report (`on`). With `json` or a file each process
/// reports its engine's own counters: no block.
pub(crate) static STATS: AtomicPtr<Stats> = AtomicPtr::new(std::ptr::null_mut());
/// The system's THP setting is `always` (read when the engine starts): new mappings want huge
/// pages.
pub(crate) static THP_ALWAYS: AtomicBool = AtomicBool::new(false);
/// The program asked `mlockall(MCL_FUTURE)`: new arena blocks are locked, as a native mapping
/// would be.
static LOCK_FUTURE: AtomicBool = AtomicBool::new(false);

/// The process installed a seccomp filter (or started under one): no engine starts in it or
/// in its fork children, which inherit the filter (see `rights.rs`).
pub(crate) static SANDBOXED: AtomicBool = AtomicBool::new(false);

/// Bytes of the large requests made while the engine was not started (`start_after`).
pub(crate) static ASKED: AtomicUsize = AtomicUsize::new(0);

pub fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and no side effect.
    unsafe { raw::syscall(libc::SYS_getpid, [0; 6]) as i32 }
}

/// Writes one line to stderr without buffering; errno is kept.
pub fn say(line: &str) {
    let s = format!("{line}\n");
    crate::report::write_quietly(2, s.as_bytes());
}

/// A pointer the program handed to `free` or `realloc` that no live block starts at: one line
/// naming it, then abort, as glibc does.
pub fn abort_invalid(call: &str, p: *mut c_void) -> ! {
    say(&format!(
        "zerofault: {call}(): invalid pointer {p:p} (a double free, or not a block the allocator returned)"
    ));
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

/// Requests of at least this many bytes are large.
pub fn threshold() -> usize {
    THRESHOLD.load(Relaxed)
}

pub fn thp_always() -> bool {
    THP_ALWAYS.load(Relaxed)
}

pub fn lock_future() -> bool {
    LOCK_FUTURE.load(Relaxed)
}

pub fn set_lock_future(on: bool) {
    LOCK_FUTURE.store(on, Relaxed);
}

fn in_this_process() -> bool {
    ENGINE_PID.load(Acquire) == getpid()
}

/// Whether the engine is off for good in this process (refused at its start, or switched off):
/// no hook reaches it any more.
///
/// # Context
/// Any thread; one atomic load.
pub fn is_off() -> bool {
    STATE.load(Acquire) == OFF
}

/// The engine, if it runs in this process and the caller may use it; never starts it.
pub fn running() -> Option<&'static Engine> {
    if engine::in_engine_thread() || STATE.load(Acquire) != READY || !in_this_process() {
        return None;
    }
    let e = ENGINE.load(Acquire);
    // SAFETY: ENGINE points to a leaked Box<Engine> that is never freed while READY.
    let e = (!e.is_null()).then(|| unsafe { &*e })?;
    e.tidy();
    Some(e)
}

/// Whether the knobs ask for a line on what the shim does (`ZEROFAULT_VERBOSE`).
pub fn verbose() -> bool {
    OPTIONS.get().is_some_and(|o| o.verbose)
}

/// From now on no engine starts in this process or its fork children: returns this process's
/// engine, if it runs, for the caller to stop.
pub fn switch_off() -> Option<&'static Engine> {
    if OWNER_PID.load(Acquire) != getpid() {
        return None; // a vfork child: the state is its parent's
    }
    SANDBOXED.store(true, Release);
    let _ = STATE.compare_exchange(IDLE, OFF, AcqRel, Acquire);
    running()
}

/// The arena, once the engine made it.
pub fn arena() -> Option<&'static Arena> {
    let a = ARENA.load(Acquire);
    // SAFETY: ARENA points to a leaked Box<Arena>, never freed.
    (!a.is_null()).then(|| unsafe { &*a })
}

/// The counters this process reports (shared with its children when stats are on).
pub fn stats_block() -> Option<&'static Stats> {
    let s = STATS.load(Acquire);
    // SAFETY: see start.rs: a live MAP_SHARED Stats block.
    (!s.is_null()).then(|| unsafe { &*s })
}
