//! The interposed symbols, the shim's state, and the C API.

use crate::arena::{self, Header, Locked, HEADER, MAGIC};
use engine::stats::Stats;
use engine::sys::mman::{PAGE_SIZE, PMD_SIZE};
use engine::{Engine, Options};
use libc::{c_char, c_int, c_void, off_t, size_t};
use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

// ---------------------------------------------------------------------------------------------
// State

const UNINIT: u8 = 0;
const READY: u8 = 1;
const OFF: u8 = 2;
const RESTARTING: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static ENGINE: AtomicPtr<Engine> = AtomicPtr::new(std::ptr::null_mut());
/// The process whose engine `ENGINE` is.
static ENGINE_PID: AtomicI32 = AtomicI32::new(0);
/// Set by the fork child handler: this pid may start its own engine.
static FORKED_PID: AtomicI32 = AtomicI32::new(0);
/// The process that loaded the shim (it prints the stats).
static ROOT_PID: AtomicI32 = AtomicI32::new(0);
static THRESHOLD: AtomicUsize = AtomicUsize::new(usize::MAX);
static OPTIONS: OnceLock<Options> = OnceLock::new();
/// Counters shared by this process's engine and its forked children's (MAP_SHARED).
static STATS: AtomicPtr<Stats> = AtomicPtr::new(std::ptr::null_mut());
static ARENA_BASE: AtomicUsize = AtomicUsize::new(0);
static ARENA_LEN: AtomicUsize = AtomicUsize::new(0);
static FREE: Locked = Locked::new();
/// A copy of stderr taken at start-up for the exit report: programs (coreutils among them)
/// close fd 2 in their own atexit handlers, which run before library destructors.
static REPORT_FD: AtomicI32 = AtomicI32::new(2);

thread_local! {
    /// Inside a hook (or the constructor): nested calls pass straight through.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread as inside the shim until dropped; `None` if it already is.
struct Guard;

fn enter() -> Option<Guard> {
    IN_HOOK.with(|f| {
        if f.get() {
            None
        } else {
            f.set(true);
            Some(Guard)
        }
    })
}

impl Drop for Guard {
    fn drop(&mut self) {
        IN_HOOK.with(|f| f.set(false));
    }
}

fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// Writes one line to stderr without buffering.
fn say(line: &str) {
    let s = format!("{line}\n");
    // SAFETY: writes a valid buffer of its stated length to fd 2.
    unsafe { libc::write(2, s.as_ptr() as *const c_void, s.len()) };
}

/// The engine, if this process may use it now: the shim is up, the caller is not an engine
/// thread, and the engine is this process's (a fork child starts its own on first use).
fn engine() -> Option<&'static Engine> {
    if engine::in_engine_thread() {
        return None;
    }
    match STATE.load(Acquire) {
        READY => {}
        _ => return None,
    }
    let pid = getpid();
    if ENGINE_PID.load(Acquire) != pid {
        if FORKED_PID.load(Acquire) != pid {
            return None; // a vfork child, or a fork we were not told of: plain memory
        }
        restart_in_child(pid);
        if STATE.load(Acquire) != READY {
            return None;
        }
    }
    let e = ENGINE.load(Acquire);
    // SAFETY: ENGINE points to a leaked Box<Engine> that is never freed while READY.
    (!e.is_null()).then(|| unsafe { &*e })
}

/// Starts the engine of a forked child, replacing the parent's (forgotten, not dropped: its
/// threads do not exist here).
fn restart_in_child(pid: i32) {
    if STATE.compare_exchange(READY, RESTARTING, AcqRel, Acquire).is_err() {
        return;
    }
    let old = ENGINE.swap(std::ptr::null_mut(), AcqRel);
    if !old.is_null() {
        // SAFETY: `old` came from Box::into_raw and nobody else holds it in this process.
        unsafe { Box::from_raw(old) }.forget_after_fork();
    }
    let ok = start_engine().is_ok();
    ENGINE_PID.store(pid, Release);
    STATE.store(if ok { READY } else { OFF }, Release);
}

/// Starts an engine with the options and shared counters, and registers the arena with it.
fn start_engine() -> Result<(), String> {
    let opts = OPTIONS.get().ok_or("no options")?.clone();
    let stats = STATS.load(Acquire);
    let e = if stats.is_null() {
        Engine::new(opts)
    } else {
        // SAFETY: STATS points to a MAP_SHARED block of size_of::<Stats>() zeroed bytes (all
        // zero is a valid Stats of atomics), mapped for the life of the process.
        Engine::with_stats(opts, unsafe { &*stats })
    }
    .map_err(|e| e.to_string())?;
    let (base, len) = (ARENA_BASE.load(Acquire), ARENA_LEN.load(Acquire));
    if len > 0 {
        // SAFETY: the arena is our own anonymous private read-write mapping, mapped for the
        // life of the process and registered with no other userfaultfd (a fork child's
        // registration was dropped by the kernel).
        match unsafe { e.register(base as *mut u8, len) } {
            Ok(region) => std::mem::forget(region), // registered for the life of the process
            Err(_) => ARENA_LEN.store(0, Release),  // no arena: large mallocs pass through
        }
    }
    ENGINE.store(Box::into_raw(Box::new(e)), Release);
    Ok(())
}

/// Reads `ZEROFAULT_*` straight from `environ` (no std::env: it may not be set up yet).
fn env_lookup(name: &str) -> Option<String> {
    extern "C" {
        static environ: *const *const c_char;
    }
    // SAFETY: environ is the process's NULL-terminated array of NUL-terminated strings; it is
    // read in the constructor, before the program's main can change it.
    unsafe {
        let mut p = environ;
        if p.is_null() {
            return None;
        }
        while !(*p).is_null() {
            let kv = CStr::from_ptr(*p).to_bytes();
            if kv.len() > name.len() && kv.starts_with(name.as_bytes()) && kv[name.len()] == b'=' {
                return Some(String::from_utf8_lossy(&kv[name.len() + 1..]).into_owned());
            }
            p = p.add(1);
        }
    }
    None
}

/// mmap(2) as a system call, so the shim's own mappings bypass its hooks.
unsafe fn sys_mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    // SAFETY: the caller upholds mmap's contract.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

extern "C" fn init() {
    let Some(_g) = enter() else { return };
    resolve();
    let opts = match Options::from_lookup(env_lookup) {
        Ok(o) => o,
        Err(e) => {
            say(&format!("zerofault: {e}; running without the engine"));
            STATE.store(OFF, Release);
            return;
        }
    };
    let pid = getpid();
    ROOT_PID.store(pid, Release);
    if opts.disable {
        STATE.store(OFF, Release);
        return;
    }
    if opts.stats {
        // SAFETY: fcntl on fd 2; a failure leaves the report on fd 2 itself.
        let fd = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 512) };
        if fd >= 0 {
            REPORT_FD.store(fd, Release);
        }
    }
    THRESHOLD.store(opts.preload_threshold.max(PAGE_SIZE), Release);
    let _ = OPTIONS.set(opts.clone());
    // SAFETY: a fresh shared anonymous mapping; checked below.
    let s = unsafe {
        sys_mmap(
            std::ptr::null_mut(),
            std::mem::size_of::<Stats>().next_multiple_of(PAGE_SIZE),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if s != libc::MAP_FAILED {
        STATS.store(s as *mut Stats, Release);
    }
    // The arena: address space only (MAP_NORESERVE), 2 MiB aligned, 4 KiB pages.
    let len = opts.preload_arena.next_multiple_of(PMD_SIZE);
    // SAFETY: a fresh private anonymous mapping at an address the kernel chooses.
    let a = unsafe {
        sys_mmap(
            std::ptr::null_mut(),
            len + PMD_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if a != libc::MAP_FAILED && len > 0 {
        let base = (a as usize).next_multiple_of(PMD_SIZE);
        let _ = engine::sys::mman::madvise(base, len, engine::sys::mman::MADV_NOHUGEPAGE);
        ARENA_BASE.store(base, Release);
        ARENA_LEN.store(len, Release);
        FREE.with(|f| f.reset((len / PAGE_SIZE) as u64));
    }
    if let Err(e) = start_engine() {
        if opts.stats {
            say(&format!(
                "zerofault: the engine did not start ({e}); running on plain memory"
            ));
        }
        ARENA_LEN.store(0, Release);
        if a != libc::MAP_FAILED {
            // SAFETY: our own reservation, unused (no block was handed out).
            unsafe { libc::syscall(libc::SYS_munmap, a, len + PMD_SIZE) };
        }
        STATE.store(OFF, Release);
        return;
    }
    // SAFETY: the handlers are plain extern "C" functions that only take and release a lock
    // and store atomics.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    ENGINE_PID.store(pid, Release);
    STATE.store(READY, Release);
}

extern "C" fn fork_prepare() {
    FREE.lock();
}

extern "C" fn fork_parent() {
    FREE.unlock();
}

extern "C" fn fork_child() {
    FREE.unlock();
    FORKED_PID.store(getpid(), Release);
}

extern "C" fn fini() {
    let Some(_g) = enter() else { return };
    let Some(o) = OPTIONS.get() else { return };
    if !o.stats || getpid() != ROOT_PID.load(Acquire) {
        return;
    }
    let s = STATS.load(Acquire);
    if s.is_null() {
        return;
    }
    // SAFETY: see start_engine: a live MAP_SHARED Stats block.
    let snap = unsafe { &*s }.snapshot();
    let mut out = format!(
        "zerofault: stats of pid {} and the children it forked\nzerofault: pages_served {}\n",
        ROOT_PID.load(Acquire),
        snap.pages_served()
    );
    for line in snap.to_text().lines() {
        out += &format!("zerofault: {line}\n");
    }
    // SAFETY: writes a valid buffer of its stated length to our copy of stderr.
    unsafe { libc::write(REPORT_FD.load(Acquire), out.as_ptr() as *const c_void, out.len()) };
}

// ---------------------------------------------------------------------------------------------
// The next allocator

type MallocFn = unsafe extern "C" fn(size_t) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, size_t) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type MemalignFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, size_t, size_t) -> c_int;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> size_t;

static NEXT: [AtomicUsize; 10] = [const { AtomicUsize::new(0) }; 10];
const NAMES: [&CStr; 10] = [
    c"malloc",
    c"calloc",
    c"realloc",
    c"free",
    c"memalign",
    c"posix_memalign",
    c"aligned_alloc",
    c"valloc",
    c"pvalloc",
    c"malloc_usable_size",
];

thread_local! {
    static RESOLVING: Cell<bool> = const { Cell::new(false) };
}

/// dlsym may allocate; while it runs, allocations come from this buffer and are never freed.
static BOOT: BootBuf = BootBuf(std::cell::UnsafeCell::new([0; 1 << 16]), AtomicUsize::new(0));
struct BootBuf(std::cell::UnsafeCell<[u8; 1 << 16]>, AtomicUsize);
// SAFETY: disjoint slices are handed out by an atomic bump offset.
unsafe impl Sync for BootBuf {}

fn boot_alloc(n: usize) -> *mut c_void {
    let n = n.next_multiple_of(16);
    let at = BOOT.1.fetch_add(n, Relaxed);
    if at + n > 1 << 16 {
        return std::ptr::null_mut();
    }
    // SAFETY: [at, at + n) is inside the buffer and handed out once; the buffer is zeroed.
    unsafe { (BOOT.0.get() as *mut u8).add(at) as *mut c_void }
}

fn in_boot(p: *mut c_void) -> bool {
    let base = BOOT.0.get() as usize;
    (base..base + (1 << 16)).contains(&(p as usize))
}

fn resolve() {
    if NEXT[0].load(Acquire) != 0 {
        return;
    }
    RESOLVING.with(|r| r.set(true));
    for (slot, name) in NEXT.iter().zip(NAMES) {
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; a null result is kept as 0.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        slot.store(f as usize, Release);
    }
    RESOLVING.with(|r| r.set(false));
}

fn resolving() -> bool {
    RESOLVING.with(|r| r.get())
}

macro_rules! next {
    ($i:expr, $t:ty) => {{
        resolve();
        let f = NEXT[$i].load(Acquire);
        // SAFETY: the slot holds the address dlsym returned for this symbol, whose C type is
        // $t; 0 (not found) becomes None.
        (f != 0).then(|| unsafe { std::mem::transmute::<usize, $t>(f) })
    }};
}

// ---------------------------------------------------------------------------------------------
// Arena blocks

fn in_arena(p: *mut c_void) -> bool {
    let (base, len) = (ARENA_BASE.load(Acquire), ARENA_LEN.load(Acquire));
    len > 0 && (base..base + len).contains(&(p as usize))
}

/// Whether a request of `size` bytes goes to the engine (and the engine, if so).
fn large(size: usize) -> Option<&'static Engine> {
    if size < THRESHOLD.load(Relaxed) || ARENA_LEN.load(Relaxed) == 0 {
        return None;
    }
    engine()
}

/// A zeroed block of `size` bytes aligned to `align` from the arena, or null.
fn arena_alloc(size: usize, align: usize) -> *mut c_void {
    let Some((pages, _)) = arena::layout(size, align) else {
        return std::ptr::null_mut();
    };
    let Some(first) = FREE.with(|f| f.take(pages)) else {
        return std::ptr::null_mut();
    };
    let base = ARENA_BASE.load(Acquire);
    let block = base + first as usize * PAGE_SIZE;
    let p = arena::user_ptr(block, align);
    let h = Header {
        magic: MAGIC,
        first,
        pages,
        usable: (block + pages as usize * PAGE_SIZE - p) as u64,
    };
    // SAFETY: [p - HEADER, p) lies in the block's header page (p is at least one page into the
    // block), which this thread now owns; the write may fault, served by the engine.
    unsafe { ((p - HEADER) as *mut Header).write(h) };
    p as *mut c_void
}

/// The header of an arena pointer, if it is one of ours.
fn header(p: *mut c_void) -> Option<Header> {
    if !in_arena(p) || (p as usize) % PAGE_SIZE != 0 {
        return None;
    }
    // SAFETY: p is page aligned inside the arena and not its first page (blocks start with a
    // header page), so p - HEADER is mapped arena memory.
    let h = unsafe { ((p as usize - HEADER) as *const Header).read() };
    (h.magic == MAGIC).then_some(h)
}

fn arena_free(h: Header) {
    let base = ARENA_BASE.load(Acquire);
    let block = base + h.first as usize * PAGE_SIZE;
    // Drop the pages: the next block here reads zero and is served by the engine again.
    let _ = engine::sys::mman::madvise(block, h.pages as usize * PAGE_SIZE, engine::sys::mman::MADV_DONTNEED);
    FREE.with(|f| f.give(h.first, h.pages));
}

// ---------------------------------------------------------------------------------------------
// malloc family

#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    if resolving() {
        return boot_alloc(size);
    }
    if size >= THRESHOLD.load(Relaxed) {
        if let Some(_g) = enter() {
            if large(size).is_some() {
                let p = arena_alloc(size, 16);
                if !p.is_null() {
                    return p;
                }
            }
        }
    }
    match next!(0, MallocFn) {
        // SAFETY: the next allocator's malloc, with the caller's argument.
        Some(f) => unsafe { f(size) },
        None => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    if resolving() {
        return n.checked_mul(size).map_or(std::ptr::null_mut(), boot_alloc);
    }
    let Some(total) = n.checked_mul(size) else {
        // SAFETY: errno is thread-local and writable.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return std::ptr::null_mut();
    };
    if total >= THRESHOLD.load(Relaxed) {
        if let Some(_g) = enter() {
            if large(total).is_some() {
                // Fresh arena blocks are zero: no memset.
                let p = arena_alloc(total, 16);
                if !p.is_null() {
                    return p;
                }
            }
        }
    }
    match next!(1, CallocFn) {
        // SAFETY: the next allocator's calloc, with the caller's arguments.
        Some(f) => unsafe { f(n, size) },
        None => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || in_boot(p) {
        return;
    }
    if in_arena(p) {
        if let Some(h) = header(p) {
            arena_free(h);
        }
        return;
    }
    if let Some(f) = next!(3, FreeFn) {
        // SAFETY: p came from the next allocator (it is neither ours nor the boot buffer's).
        unsafe { f(p) }
    }
}

#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    if p.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n).
        return unsafe { malloc(size) };
    }
    if in_boot(p) {
        // SAFETY: copy into a real block; boot blocks are at most the buffer's size.
        let q = unsafe { malloc(size) };
        if !q.is_null() {
            let avail = (BOOT.0.get() as usize + (1 << 16)) - p as usize;
            // SAFETY: both ranges are valid for the copied length.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, size.min(avail)) };
        }
        return q;
    }
    if let Some(h) = header(p) {
        if size as u64 <= h.usable && size > 0 {
            return p;
        }
        // SAFETY: a new block, then the copy of what fits, then the old block freed.
        unsafe {
            let q = malloc(size.max(1));
            if q.is_null() {
                return q; // the old block stays valid, as realloc requires
            }
            std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, size.min(h.usable as usize));
            free(p);
            return q;
        }
    }
    if size >= THRESHOLD.load(Relaxed) {
        if let Some(_g) = enter() {
            if large(size).is_some() {
                let old = next!(9, UsableFn).map_or(0, |f| {
                    // SAFETY: p came from the next allocator.
                    unsafe { f(p) }
                });
                if old > 0 {
                    let q = arena_alloc(size, 16);
                    if !q.is_null() {
                        // SAFETY: q has `size` bytes, p has `old` usable bytes.
                        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size)) };
                        if let Some(f) = next!(3, FreeFn) {
                            // SAFETY: p came from the next allocator and is no longer used.
                            unsafe { f(p) };
                        }
                        return q;
                    }
                }
            }
        }
    }
    match next!(2, ReallocFn) {
        // SAFETY: p came from the next allocator.
        Some(f) => unsafe { f(p, size) },
        None => std::ptr::null_mut(),
    }
}

/// An aligned large block from the arena, if the request is large and the engine is up.
fn aligned_large(align: usize, size: usize) -> Option<*mut c_void> {
    if size < THRESHOLD.load(Relaxed) || !align.is_power_of_two() || align > (1 << 30) {
        return None;
    }
    let _g = enter()?;
    large(size)?;
    let p = arena_alloc(size, align);
    (!p.is_null()).then_some(p)
}

#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: size_t, size: size_t) -> c_int {
    if let Some(p) = aligned_large(align, size) {
        // SAFETY: the caller passes a valid out-pointer.
        unsafe { *out = p };
        return 0;
    }
    match next!(5, PosixMemalignFn) {
        // SAFETY: the next allocator's posix_memalign, with the caller's arguments.
        Some(f) => unsafe { f(out, align, size) },
        None => libc::ENOMEM,
    }
}

#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if let Some(p) = aligned_large(align, size) {
        return p;
    }
    match next!(6, MemalignFn) {
        // SAFETY: the next allocator's aligned_alloc, with the caller's arguments.
        Some(f) => unsafe { f(align, size) },
        None => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    if let Some(p) = aligned_large(align, size) {
        return p;
    }
    match next!(4, MemalignFn) {
        // SAFETY: the next allocator's memalign, with the caller's arguments.
        Some(f) => unsafe { f(align, size) },
        None => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    if let Some(p) = aligned_large(PAGE_SIZE, size) {
        return p;
    }
    match next!(7, MallocFn) {
        // SAFETY: the next allocator's valloc.
        Some(f) => unsafe { f(size) },
        None => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    if let Some(p) = aligned_large(PAGE_SIZE, size.next_multiple_of(PAGE_SIZE)) {
        return p;
    }
    match next!(8, MallocFn) {
        // SAFETY: the next allocator's pvalloc.
        Some(f) => unsafe { f(size) },
        None => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() || in_boot(p) {
        return 0;
    }
    if let Some(h) = header(p) {
        return h.usable as size_t;
    }
    match next!(9, UsableFn) {
        // SAFETY: p came from the next allocator.
        Some(f) => unsafe { f(p) },
        None => 0,
    }
}

// ---------------------------------------------------------------------------------------------
// mmap

/// Registers a fresh mapping with the engine when it is large anonymous private memory.
fn maybe_register(p: *mut c_void, len: size_t, flags: c_int) {
    let anon_private = flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & (libc::MAP_SHARED | libc::MAP_GROWSDOWN | libc::MAP_HUGETLB) == 0;
    if p == libc::MAP_FAILED || !anon_private || len < THRESHOLD.load(Relaxed) {
        return;
    }
    let Some(_g) = enter() else { return };
    let Some(e) = engine() else { return };
    let len = len.next_multiple_of(PAGE_SIZE);
    // SAFETY: a fresh anonymous private mapping of the caller's; the engine fills its missing
    // pages with zeros, as the kernel would, and forgets it on munmap (UNMAP event).
    if let Ok(region) = unsafe { e.register(p as *mut u8, len) } {
        std::mem::forget(region); // lives until the program unmaps it
    }
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the caller's arguments, passed on unchanged.
    let p = unsafe { sys_mmap(addr, len, prot, flags, fd, off) };
    maybe_register(p, len, flags);
    p
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: as mmap (off_t is 64-bit here).
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

// ---------------------------------------------------------------------------------------------
// The C API (include/zerofault.h)

/// Maps `len` bytes (rounded up to pages) of anonymous memory served by the engine; plain
/// memory when the engine is off. NULL on failure.
#[no_mangle]
pub extern "C" fn zerofault_map(len: size_t) -> *mut c_void {
    if len == 0 {
        return std::ptr::null_mut();
    }
    let len = len.next_multiple_of(PAGE_SIZE);
    // SAFETY: a fresh private anonymous mapping at an address the kernel chooses.
    let p = unsafe {
        sys_mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let _ = engine::sys::mman::madvise(p as usize, len, engine::sys::mman::MADV_NOHUGEPAGE);
    let Some(_g) = enter() else { return p };
    if let Some(e) = engine() {
        // SAFETY: as in maybe_register: our fresh mapping, handed to the caller.
        if let Ok(region) = unsafe { e.register(p as *mut u8, len) } {
            std::mem::forget(region);
        }
    }
    p
}

/// Unmaps memory from zerofault_map. 0, or -1 with errno set.
#[no_mangle]
pub unsafe extern "C" fn zerofault_unmap(p: *mut c_void, len: size_t) -> c_int {
    // SAFETY: the caller hands back a mapping it owns.
    unsafe { libc::syscall(libc::SYS_munmap, p, len.next_multiple_of(PAGE_SIZE)) as c_int }
}

/// 1 when the engine serves faults in this process, 0 otherwise.
#[no_mangle]
pub extern "C" fn zerofault_active() -> c_int {
    let _g = enter();
    engine().is_some_and(|e| e.is_active()) as c_int
}

/// Writes the counters as one JSON object, NUL-terminated, into `buf` (at most `cap` bytes,
/// truncated if short). Returns the JSON's length without the NUL, like snprintf.
#[no_mangle]
pub unsafe extern "C" fn zerofault_stats_json(buf: *mut c_char, cap: size_t) -> size_t {
    let _g = enter();
    let s = STATS.load(Acquire);
    let json = if s.is_null() {
        engine::Snapshot::default().to_json()
    } else {
        // SAFETY: see start_engine: a live MAP_SHARED Stats block.
        unsafe { &*s }.snapshot().to_json()
    };
    if !buf.is_null() && cap > 0 {
        let n = json.len().min(cap - 1);
        // SAFETY: the caller's buffer holds `cap` bytes; n + 1 <= cap.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
    }
    json.len()
}
