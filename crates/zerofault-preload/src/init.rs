//! The shim's initialisation: `zerofault_shim_init`, which the front calls once it has
//! loaded this library, reads the knobs straight from `environ`, sets up the exit report and
//! the fork handlers, and leaves the shim `IDLE` (or `OFF`).

use crate::front::FrontApi;
use crate::state::{
    getpid, say, set_lock_future, IDLE, OFF, OPTIONS, OWNER_PID, ROOT_PID, SAY_UNUSED, STATE, STATS, THRESHOLD, UNINIT,
};
use crate::{next, start};
use engine::os::mman::PAGE_SIZE;
use engine::os::raw;
use engine::{Options, Stats, StatsOut};
use libc::c_char;
use std::ffi::CStr;
use std::sync::atomic::Ordering::*;

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

/// The shim's initialisation. This library has no constructor: the front (front/front.c, the
/// file in LD_PRELOAD) dlopen()s it and calls this, with the thread's `in_hook` flag set and
/// every signal blocked. (Preloaded by itself, it initialises nothing, and its hooks pass every
/// call through.) 0: the front passes every call here from now on (the shim may
/// still be off, for a refused knob: then its hooks pass them through).
///
/// # Safety
/// `api` points to the front's description of itself.
///
/// # Context
/// The program thread whose large request made the front load the shim, once per process
/// (the front's `LOADING` state), its `in_hook` flag set and every signal blocked; takes the
/// dynamic loader's lock (dlsym) and no lock of the engine's; does not sleep.
#[no_mangle]
pub unsafe extern "C" fn zerofault_shim_init(api: *const FrontApi) -> libc::c_int {
    // SAFETY: the caller's pointer; its first two words say what it holds.
    let api = unsafe { &*api };
    if !api.accept() {
        return -1;
    }
    if STATE.load(Acquire) != UNINIT {
        return 0;
    }
    set_lock_future(api.lock_future());
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
    let fixed = crate::glibc::fixed_threshold(|name| environ_lookup(name.as_bytes()).map(str::to_owned));
    crate::malloc::FIXED_THRESHOLD.store(fixed, Relaxed);
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
    // Their opens of /proc never take a number the program's `open` expects; a failed
    // engine's copy in the program's table is closed by the next hook (`Engine::tidy`).
    engine::os::thread::own_tables();
    engine::os::thread::prepare();
    open_report(&opts.stats);
    THRESHOLD.store(opts.preload_threshold.max(PAGE_SIZE), Release);
    let _ = OPTIONS.set(opts);
    start::handle_forks();
    crate::mmap::listen_to_malloc_hooks();
    STATE.store(IDLE, Release);
}

/// Where the exit report goes, set up at start-up (`ZEROFAULT_STATS`): a copy of stderr (`on`,
/// `json`) on a descriptor of 512 or more, or the file's path (a path: checked now, opened when
/// the report is written; report.rs); for `on`, the counters' block shared with fork children.
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
