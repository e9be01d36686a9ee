//! The shim's state: options read at load, the engine and the arena started on the first
//! large request, fork handlers, the exit report.
//!
//! Load costs only the symbol lookups and the options: a process that never makes a large
//! request starts no thread, opens no descriptor and reserves nothing.

use crate::arena::Arena;
use crate::next;
use engine::os::mman::{PAGE_SIZE, PMD_SIZE};
use engine::os::raw;
use engine::Stats;
use engine::{Engine, Options, StatsOut};
use libc::{c_char, c_void};
use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// Before the constructor ran.
const UNINIT: u8 = 0;
/// Loaded; the engine starts on the first large request.
const IDLE: u8 = 1;
/// One thread is starting the engine; the others wait for it (at most `START_WAIT`).
const STARTING: u8 = 2;
const READY: u8 = 3;
/// Disabled, refused options, or the engine could not start: every hook passes through.
const OFF: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static ENGINE: AtomicPtr<Engine> = AtomicPtr::new(std::ptr::null_mut());
static ARENA: AtomicPtr<Arena> = AtomicPtr::new(std::ptr::null_mut());
/// The process whose engine `ENGINE` is (a vfork child shares our memory but must not use it).
static ENGINE_PID: AtomicI32 = AtomicI32::new(0);
/// The process that may start an engine: the one that loaded the shim, or a fork child (the
/// fork handler says so). A vfork child runs no fork handler and never starts one.
static OWNER_PID: AtomicI32 = AtomicI32::new(0);
/// The process that loaded the shim (it prints the stats).
static ROOT_PID: AtomicI32 = AtomicI32::new(0);
/// Whether this process says at exit, when verbose, that it never started the engine (see
/// `init_options`).
static SAY_UNUSED: AtomicBool = AtomicBool::new(false);
static THRESHOLD: AtomicUsize = AtomicUsize::new(usize::MAX);
static OPTIONS: OnceLock<Options> = OnceLock::new();
/// Counters shared by this process's engine and its forked children's (MAP_SHARED), when
/// `ZEROFAULT_STATS` asks for the text report (`on`). With `json` or a file each process
/// reports its engine's own counters: no block.
static STATS: AtomicPtr<Stats> = AtomicPtr::new(std::ptr::null_mut());
/// The system's THP setting is `always` (read when the engine starts): new mappings want huge
/// pages.
static THP_ALWAYS: AtomicBool = AtomicBool::new(false);
/// The program asked `mlockall(MCL_FUTURE)`: new arena blocks are locked, as a native mapping
/// would be.
static LOCK_FUTURE: AtomicBool = AtomicBool::new(false);

/// The process installed a seccomp filter (or started under one): no engine starts in it or
/// in its fork children, which inherit the filter (see `rights.rs`).
static SANDBOXED: AtomicBool = AtomicBool::new(false);

/// A thread's flags (C `struct zf_flags` in front/front.c).
#[repr(C)]
#[derive(Default)]
pub struct Flags {
    /// Inside a hook (or zerofault_shim_init): nested calls pass straight through.
    pub in_hook: Cell<i32>,
    /// Inside [`crate::next::resolve`].
    pub resolving: Cell<i32>,
}

/// What the front (front/front.c) hands the shim when it has loaded it (C `struct
/// zf_front_api`).
#[repr(C)]
pub struct FrontApi {
    version: u32,
    size: u32,
    flags: extern "C" fn() -> *mut Flags,
    next: extern "C" fn(*const c_char) -> *mut c_void,
    lock_future: i32,
}

const FRONT_VERSION: u32 = 1;

/// The front's `flags` (an `extern "C" fn() -> *mut Flags`), or 0 when the shim was preloaded
/// itself.
static FRONT_FLAGS: AtomicUsize = AtomicUsize::new(0);
/// The front's `next`, likewise.
static FRONT_NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The flags when there is no front (this library preloaded by itself, uninitialised: its
    /// hooks pass every call through): then its TLS is static, set up by the loader at start,
    /// and touching it allocates nothing.
    static OWN_FLAGS: Flags = const { Flags { in_hook: Cell::new(0), resolving: Cell::new(0) } };
}

/// The calling thread's flags. Under the front they are the front's: this library is
/// dlopen()ed there, so its own thread-locals are dynamic TLS, which glibc allocates, on a
/// thread's first touch, with the process's malloc (possibly from inside that malloc's own
/// mmap, under its lock). No hook touches a thread-local of this library then.
pub fn flags() -> &'static Flags {
    let f = FRONT_FLAGS.load(Acquire);
    if f != 0 {
        // SAFETY: the front's `flags`, set once by zerofault_shim_init: it returns the calling
        // thread's flags, in the front's static TLS, live as long as the thread.
        let f: extern "C" fn() -> *mut Flags = unsafe { std::mem::transmute(f) };
        // SAFETY: as above; used by this thread only (the reference does not leave it).
        return unsafe { &*f() };
    }
    // SAFETY: this thread's own flags, live as long as the thread; the reference does not
    // leave it.
    OWN_FLAGS.with(|f| unsafe { &*(f as *const Flags) })
}

/// The front's lookup of the next definition of `name`, when there is a front.
pub fn front_next(name: &std::ffi::CStr) -> Option<*mut c_void> {
    let f = FRONT_NEXT.load(Acquire);
    // SAFETY: the front's `next`, set once by zerofault_shim_init; takes a C string.
    (f != 0)
        .then(|| unsafe { std::mem::transmute::<usize, extern "C" fn(*const c_char) -> *mut c_void>(f)(name.as_ptr()) })
}

/// Marks the thread as inside the shim until dropped.
pub struct Guard(&'static Flags);

/// `None` if the thread already is inside the shim.
pub fn enter() -> Option<Guard> {
    let f = flags();
    if f.in_hook.get() != 0 {
        None
    } else {
        f.in_hook.set(1);
        Some(Guard(f))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.in_hook.set(0);
    }
}

/// While the engine works on a program thread from a hook: `errno` is put back as it was,
/// and every signal is blocked, so that a signal handler that maps memory cannot find the
/// engine's locks held by the very thread it interrupted.
pub struct Quiet {
    errno: i32,
    _signals: engine::os::thread::Blocked,
}

impl Quiet {
    pub fn new() -> Quiet {
        Quiet {
            errno: errno(),
            _signals: engine::os::thread::Blocked::all(),
        }
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        // The signal mask is put back right after, by the field's own drop.
        set_errno(self.errno);
    }
}

pub fn errno() -> i32 {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: i32) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

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

/// The engine, if it runs in this process and the caller may use it; never starts it.
pub fn running() -> Option<&'static Engine> {
    if engine::in_engine_thread() || STATE.load(Acquire) != READY || !in_this_process() {
        return None;
    }
    let e = ENGINE.load(Acquire);
    // SAFETY: ENGINE points to a leaked Box<Engine> that is never freed while READY.
    (!e.is_null()).then(|| unsafe { &*e })
}

/// How long a large request made while another thread starts the engine waits for it (a
/// start takes about a millisecond) before it passes through, as every such request did
/// before: threads making their first large request at once got one block served and the
/// others not (all four served in 2 runs of 10). Bounded, because the request may come with a
/// lock the starting thread needs.
const START_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// Set once a wait for the start ran out (see [`engine`]).
static START_WAIT_GAVE_UP: AtomicBool = AtomicBool::new(false);

/// Bytes of the large requests made while the engine was not started (`start_after`).
static ASKED: AtomicUsize = AtomicUsize::new(0);

/// The engine for a large request of `len` bytes: [`engine`], once the large requests made so
/// far, this one included, add up to the `start_after` knob; `None` before (the request goes to
/// the system untouched: below that the engine's start and exit cost more than it saves).
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

/// Starts the engine. Under a finite soft `RLIMIT_AS` / `RLIMIT_DATA` (whichever is lower)
/// the engine reserves no arena and a pool of a thirty-second of it at most (shared by the
/// nodes' pools), so that what the program may map stays what it would be without the shim,
/// within that.
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
/// (rights.rs).
///
/// # Context
/// A program thread, from [`start`] (`STATE` at `STARTING`); takes no lock, does not sleep.
fn refused() -> Option<&'static str> {
    if engine::os::thread::seccomp_filtered() {
        SANDBOXED.store(true, Release);
        Some("the process runs under a seccomp filter")
    } else if engine::os::thread::traced() {
        Some("the process is being traced (a debugger reads memory the engine cannot fill for it)")
    } else {
        None
    }
}

/// `opts` under a finite address-space limit of `limit` bytes: a pool of a thirty-second of it
/// at most (none under two huge pages), the scrub's watermarks within the pool.
///
/// # Context
/// A program thread, from [`start`] (`STATE` at `STARTING`); takes no lock, does not sleep.
fn within_address_limit(opts: &mut Options, limit: usize) {
    let pool = (limit / 32) / PMD_SIZE * PMD_SIZE;
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

/// The value of the first `environ` entry for which `value_at` gives the offset of its value,
/// read straight from `environ` (no std::env: it may not be set up yet), borrowed: nothing is
/// allocated at load.
fn environ_find(value_at: impl Fn(&[u8]) -> Option<usize>) -> Option<&'static [u8]> {
    extern "C" {
        static environ: *const *const c_char;
    }
    // SAFETY: environ is the process's NULL-terminated array of NUL-terminated strings; it is
    // read in the constructor, before the program's main can change it, and its strings live
    // for the whole process (we keep only what the options parse needs, during the parse).
    unsafe {
        let mut p = environ;
        if p.is_null() {
            return None;
        }
        while !(*p).is_null() {
            let kv = CStr::from_ptr(*p).to_bytes();
            if let Some(at) = value_at(kv) {
                return Some(&kv[at..]);
            }
            p = p.add(1);
        }
    }
    None
}

/// The value of the environment variable `name` (in the constructor, as [`env_lookup`]).
fn environ_lookup(name: &[u8]) -> Option<&'static str> {
    environ_find(|kv| {
        (kv.len() > name.len() && kv.starts_with(name) && kv[name.len()] == b'=').then_some(name.len() + 1)
    })
    .and_then(|v| std::str::from_utf8(v).ok())
}

/// What a knob's value that is not UTF-8 reads as: a value every knob refuses (no `/`, not a
/// number, a switch or a name), so that the refusal is the knob's one line, naming it.
const NOT_UTF8: &str = "(not UTF-8)";

/// The value of knob `knob`'s variable (`ZEROFAULT_<KNOB>`, the name in any case).
fn env_lookup(knob: &str) -> Option<&'static str> {
    const PREFIX: &[u8] = b"ZEROFAULT_";
    let end = PREFIX.len() + knob.len();
    environ_find(|kv| {
        let name = kv.get(PREFIX.len()..end);
        (kv.starts_with(PREFIX)
            && name.is_some_and(|n| n.eq_ignore_ascii_case(knob.as_bytes()))
            && kv.get(end) == Some(&b'='))
        .then_some(end + 1)
    })
    .map(|v| std::str::from_utf8(v).unwrap_or(NOT_UTF8))
}

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

/// The shim's initialisation. This library has no constructor: the front (front/front.c, the
/// file in LD_PRELOAD) dlopen()s it and calls this, with the thread's `in_hook` flag set and
/// every signal blocked. (Preloaded by itself, it initialises nothing, and its hooks pass every
/// call through.) 0: the front passes every call here from now on (the shim may
/// still be off, for a refused knob: then its hooks pass them through).
///
/// # Safety
/// `api` points to the front's description of itself.
#[no_mangle]
pub unsafe extern "C" fn zerofault_shim_init(api: *const FrontApi) -> libc::c_int {
    // SAFETY: the caller's pointer; its first two words say what it holds.
    let api = unsafe { &*api };
    if api.version != FRONT_VERSION || (api.size as usize) < std::mem::size_of::<FrontApi>() {
        return -1;
    }
    FRONT_NEXT.store(api.next as usize, Release);
    FRONT_FLAGS.store(api.flags as usize, Release);
    if STATE.load(Acquire) != UNINIT {
        return 0;
    }
    set_lock_future(api.lock_future != 0);
    next::resolve();
    init_options();
    0
}

fn init_options() {
    let opts = match Options::from_knobs(env_lookup) {
        Ok(o) => o,
        Err(e) => {
            say(&format!("zerofault: {e}; running without the engine"));
            STATE.store(OFF, Release);
            return;
        }
    };
    ROOT_PID.store(getpid(), Release);
    OWNER_PID.store(getpid(), Release);
    // Read here, where nothing changes the environment under us; the engine starts later,
    // inside a hook.
    engine::os::machine::set_runtime_dir(environ_lookup(b"XDG_RUNTIME_DIR"));
    // `zerofault run --verbose` names the process it runs: only that one says at exit that it
    // never needed the engine (the helpers a wrapper script runs first would say it too).
    let run_pid = env_lookup("run_pid").and_then(|p| p.parse::<i32>().ok());
    SAY_UNUSED.store(run_pid.is_none_or(|p| p == getpid()), Release);
    if opts.disable {
        if opts.verbose {
            say(&format!(
                "zerofault: engine not started in pid {}: disabled (ZEROFAULT_DISABLE)",
                getpid()
            ));
        }
        STATE.store(OFF, Release);
        return;
    }
    // Engine threads are made with clone(2) on TLS of their own; what they copy is read here,
    // where the dynamic loader's lock is safe to take.
    // The engine's threads here allocate from the engine's own memory (lib.rs's global
    // allocator), never with glibc's malloc.
    engine::os::thread::own_allocator();
    if let Err(why) = engine::os::thread::prepare() {
        if opts.stats == StatsOut::Text || opts.verbose {
            say(&format!("zerofault: {why}; running without the engine"));
        }
        STATE.store(OFF, Release);
        return;
    }
    open_report(&opts.stats);
    THRESHOLD.store(opts.preload_threshold.max(PAGE_SIZE), Release);
    let _ = OPTIONS.set(opts);
    // SAFETY: the handlers are plain extern "C" functions that take and release spin locks,
    // store atomics and close one descriptor.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    crate::mmap::listen_to_malloc_hooks();
    STATE.store(IDLE, Release);
}

/// Where the exit report goes, set up at start-up (`ZEROFAULT_STATS`): a copy of stderr (`on`,
/// `json`) or the file (a path), on a descriptor of [`REPORT_FD_MIN`] or more; for `on`, the
/// counters' block shared with fork children.
fn open_report(out: &StatsOut) {
    match out {
        StatsOut::Off => return,
        StatsOut::Text | StatsOut::Json => crate::report::open(None),
        StatsOut::File(path) => crate::report::open(Some(path)),
    }
    if *out != StatsOut::Text {
        return;
    }
    let len = std::mem::size_of::<Stats>().next_multiple_of(PAGE_SIZE);
    // SAFETY: a fresh shared anonymous mapping; checked below.
    let s = unsafe {
        raw::call(
            libc::SYS_mmap,
            [
                0,
                len,
                (libc::PROT_READ | libc::PROT_WRITE) as usize,
                (libc::MAP_SHARED | libc::MAP_ANONYMOUS) as usize,
                usize::MAX,
                0,
            ],
        )
    };
    if let Ok(s) = s {
        STATS.store(s as *mut Stats, Release);
    }
}

extern "C" fn fork_prepare() {
    engine::os::alloc::fork_prepare();
    if let Some(a) = arena() {
        a.lock().lock();
    }
}

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

extern "C" fn fini() {
    if STATE.load(Acquire) == UNINIT {
        return; // never initialised (see zerofault_shim_init)
    }
    let Some(_g) = enter() else { return };
    if let Some(e) = running() {
        // The process is exiting: the scrub fills nothing more and nothing waits for it;
        // the handlers serve later destructors' faults until exit_group ends every thread.
        let _q = Quiet::new();
        e.stop_at_exit();
    }
    let Some(o) = OPTIONS.get() else { return };
    // The process that read the knobs, not a fork child of it (which shares its state).
    if o.verbose && SAY_UNUSED.load(Acquire) && STATE.load(Acquire) == IDLE && getpid() == ROOT_PID.load(Acquire) {
        let show = |t: usize| {
            if t % (1 << 20) == 0 {
                format!("{} MiB", t >> 20)
            } else {
                format!("{t} bytes")
            }
        };
        let asked = ASKED.load(Acquire);
        let why = if asked == 0 {
            format!(
                "the program made no request of {} or more (preload_threshold)",
                show(o.preload_threshold)
            )
        } else {
            format!(
                "the program's large requests added up to {}, under {} (start_after)",
                show(asked),
                show(o.start_after)
            )
        };
        say(&format!("zerofault: engine not started in pid {}: {why}", getpid()));
    }
    match o.stats {
        StatsOut::Off => {}
        StatsOut::Text => text_report(),
        StatsOut::Json | StatsOut::File(_) => json_report(),
    }
}

/// `ZEROFAULT_STATS=on`: the counters of this process and the children it forked, as text, from
/// the process that loaded the shim, if they served anything.
fn text_report() {
    if getpid() != ROOT_PID.load(Acquire) {
        return;
    }
    let s = STATS.load(Acquire);
    if s.is_null() {
        return;
    }
    // The handlers still run (stop_at_exit leaves them): let one in the middle of a message
    // count it first (Engine::stats waits for that, 50 ms at most). The CPU-time counters
    // may miss the last millisecond.
    if let Some(e) = running() {
        let _ = e.stats();
    }
    // SAFETY: see start: a live MAP_SHARED Stats block.
    let snap = unsafe { &*s }.snapshot();
    if snap.pages_served() == 0 && snap.fault_events == 0 {
        return; // served nothing: nothing to say
    }
    let mut out = format!(
        "zerofault: stats of pid {} and the children it forked\nzerofault: pages_served {}\n",
        ROOT_PID.load(Acquire),
        snap.pages_served()
    );
    for line in snap.to_text().lines() {
        out += &format!("zerofault: {line}\n");
    }
    crate::report::write_report(&out);
}

/// `ZEROFAULT_STATS=json` or a path: this process's own engine's counters as one JSON line,
/// from every process that started an engine, served it anything or not (a fork child's
/// engine is its own: no counter is counted twice).
fn json_report() {
    let Some(e) = running() else { return };
    // Engine::stats waits for a handler in the middle of a message, as in text_report.
    let line = e.stats().process_json(getpid(), &program_name());
    crate::report::write_report(&line);
}

/// The process's name (its comm, as `ps` shows it).
fn program_name() -> String {
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into the buffer.
    let _ = unsafe {
        raw::call(
            libc::SYS_prctl,
            [libc::PR_GET_NAME as usize, name.as_mut_ptr() as usize, 0, 0, 0, 0],
        )
    };
    let len = name.iter().position(|&b| b == 0).unwrap_or(16);
    String::from_utf8_lossy(&name[..len]).into_owned()
}

/// The counters this process reports (shared with its children when stats are on).
pub fn stats_block() -> Option<&'static Stats> {
    let s = STATS.load(Acquire);
    // SAFETY: see start: a live MAP_SHARED Stats block.
    (!s.is_null()).then(|| unsafe { &*s })
}
