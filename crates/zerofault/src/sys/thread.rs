//! Thread-level syscalls: the engine's own threads, scheduling class, CPU affinity,
//! thread CPU time, tid, a one-instruction thread id, load average.

// The clone(2) path is x86-64 only; elsewhere its pieces are unused.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

use super::mman::{self, PAGE_SIZE};
use super::raw;
use crate::page::index;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};
use std::sync::OnceLock;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// The engine's own threads
//
// An engine thread must never call the program's allocator: the program's threads may hold its
// locks while they wait on a fault only the engine can serve. `pthread_create` calls it twice
// (glibc allocates each new thread's TLS vector with the `calloc` the program links, and Rust's
// thread start registers thread-local destructors through `__cxa_thread_atexit_impl`, which
// calls `calloc` too), and a hook that starts the engine from inside jemalloc's `mmap` would
// deadlock on jemalloc's own lock. So engine threads are made here, with `clone(2)`, on memory
// of their own: a stack, and a copy of what glibc gives a thread (the static TLS blocks of the
// modules loaded at start, initialised from their images; a TLS vector (DTV) long enough that
// glibc never grows it; a thread control block with the stack and pointer guards of the
// process). Thread-local variables, `errno` and unwinding work on them as on any thread.
//
// They start with every signal blocked (signals are the program's), are named
// `zerofault-*`, and are invisible to glibc's thread list: nothing of glibc's that needs it
// (pthread_self's tid, cancellation, setxid broadcasts, rseq, sched_getcpu) may run on them.
// The engine's code calls raw system calls, std's futex-based locks, atomics and its own
// allocations only; it does not call `std::thread::current()` or anything that registers a
// thread-local destructor.
//
// x86-64 only (TLS variant II: the static blocks sit below the thread pointer, the TCB at it).
// Elsewhere engine threads are std threads, with the allocator caveat above.

/// Bytes of stack per engine thread (address space; pages are used as touched).
const STACK: usize = 512 << 10;
/// Bytes reserved for glibc's `struct pthread` at the thread pointer (2,304 in glibc 2.36).
const TCB: usize = 16 << 10;
/// TLS vector slots: module ids up to this need no reallocation by glibc.
const DTV_SLOTS: usize = 4096;
/// glibc's `TLS_DTV_UNALLOCATED`.
const DTV_UNALLOCATED: usize = usize::MAX;
const MAX_MODULES: usize = 64;

/// One module's TLS block.
#[derive(Clone, Copy, Debug, Default)]
struct TlsModule {
    modid: usize,
    /// Thread pointer minus the block's address (the same on every thread) for a block in
    /// static TLS; 0 for a dynamic one (a dlopen()ed module, this library among them when the
    /// shim's front loaded it), which an engine thread gets in its own mapping instead.
    offset: usize,
    image: usize,
    filesz: usize,
    memsz: usize,
    align: usize,
}

/// The process's TLS, read once (at load, by the shim's constructor, or at the first engine
/// start): the modules with TLS and the size glibc reserves below the thread pointer.
#[derive(Debug)]
struct TlsLayout {
    /// Bytes below the thread pointer.
    below: usize,
    align: usize,
    /// Static modules first (`modules[..n]`), then dynamic ones (`modules[n..n + dynamic]`).
    n: usize,
    dynamic: usize,
    modules: [TlsModule; MAX_MODULES],
}

impl TlsLayout {
    /// Bytes an engine thread needs for the dynamic modules' blocks, each aligned.
    fn dynamic_bytes(&self) -> usize {
        self.modules[self.n..self.n + self.dynamic]
            .iter()
            .fold(0usize, |at, m| at.next_multiple_of(m.align) + m.memsz)
            + 64
    }
}

// ---------------------------------------------------------------------------------------------
// Which threads are engine threads
//
// Read on every hook call, on program threads: no thread-local may be touched there (under the
// shim's front this library's thread-locals are dynamic TLS, which glibc allocates with the
// program's malloc on a thread's first touch). So engine threads are known by their thread
// pointer ([`thread_id`]): each registers itself here while it runs.

const MAX_ENGINE_THREADS: usize = 64;
static ENGINE_THREADS: [AtomicUsize; MAX_ENGINE_THREADS] = [const { AtomicUsize::new(0) }; MAX_ENGINE_THREADS];
/// Slots below this may be in use.
static ENGINE_THREADS_HIGH: AtomicUsize = AtomicUsize::new(0);

/// Whether the calling thread is one made by [`spawn`] (and still running its body).
pub(crate) fn is_engine_thread() -> bool {
    let me = thread_id();
    let high = ENGINE_THREADS_HIGH.load(Acquire).min(MAX_ENGINE_THREADS);
    ENGINE_THREADS[..high].iter().any(|t| t.load(Relaxed) == me)
}

/// Registers the calling thread as an engine thread until dropped.
struct Registered(Option<usize>);

impl Registered {
    fn new() -> Registered {
        let me = thread_id();
        for (i, slot) in ENGINE_THREADS.iter().enumerate() {
            if slot.compare_exchange(0, me, AcqRel, Relaxed).is_ok() {
                ENGINE_THREADS_HIGH.fetch_max(i + 1, AcqRel);
                return Registered(Some(i));
            }
        }
        Registered(None)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            ENGINE_THREADS[i].store(0, Release);
        }
    }
}

/// In a fork child: the parent's engine threads are not here. Async-signal-safe (stores).
pub fn forget_engine_threads_after_fork() {
    for slot in &ENGINE_THREADS {
        slot.store(0, Relaxed);
    }
    ENGINE_THREADS_HIGH.store(0, Release);
}

/// Tells glibc that the process has more than one thread, as its `pthread_create` does before
/// the first one: the calling thread's `header.multiple_threads` (which glibc 2.36's malloc
/// reads as `SINGLE_THREAD_P`) is set. Otherwise a program whose only thread is the one
/// starting the engine keeps taking glibc's single-thread shortcuts, malloc without its arena
/// locks among them, while an engine thread allocates from the same arena (where the program's
/// global allocator is glibc's: a Rust program using the library; the shim allocates from its
/// own memory on engine threads). Seen here as heap corruption in `zerofault verify`, before
/// any thread of its own existed.
///
/// `__libc_single_threaded` (which glibc's malloc reads too) must be cleared as well, but only
/// once glibc's own first `pthread_create` has run: that call installs the handlers of glibc's
/// set*id and cancellation signals only while the byte still says one thread, and without
/// them the program's first `setuid` with two threads killed it ("Unknown signal 33"). So a
/// library user's engine (whose threads allocate with glibc's malloc) has glibc start and join
/// one thread of its own first; the shim, whose engine threads allocate only from the
/// engine's own memory ([`own_allocator`]), leaves the byte to the program's first
/// `pthread_create` (it may not call glibc's allocator from its hooks).
#[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
fn mark_multi_threaded() {
    extern "C" {
        static mut __libc_single_threaded: libc::c_char;
    }
    // SAFETY: %fs:0x18 is `header.multiple_threads` in glibc's x86-64 TCB of the calling
    // thread (the offset prepare() checked the layout for, and the one written for engine
    // threads); glibc only ever sets it to 1 itself, and reads it on this thread.
    unsafe { std::arch::asm!("mov dword ptr fs:[0x18], 1", options(nostack, preserves_flags)) };
    if !glibc_signals_ready() {
        if OWN_ALLOCATOR.load(Relaxed) {
            return;
        }
        // glibc's late_init, through its own first thread.
        if let Ok(t) = std::thread::Builder::new().spawn(|| {}) {
            let _ = t.join();
        }
    }
    // SAFETY: `__libc_single_threaded` is glibc's exported byte (2.32+); it is only ever
    // cleared, as here, never set back.
    unsafe { std::ptr::addr_of_mut!(__libc_single_threaded).write_volatile(0) };
}

/// Set by an embedder whose engine threads allocate only from the engine's own memory (the
/// LD_PRELOAD shim: [`crate::sys::alloc::EngineAlloc`] is its global allocator).
static OWN_ALLOCATOR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says that the engine's threads allocate only from the engine's own memory, never with
/// glibc's malloc (see [`mark_multi_threaded`]).
pub fn own_allocator() {
    OWN_ALLOCATOR.store(true, Relaxed);
}

/// Whether glibc installed its handler for SIGSETXID (33), which its first `pthread_create`
/// does (`late_init`): a handler, not SIG_DFL (0) nor SIG_IGN (1), which a parent may have
/// left (a process started with 33 ignored, as `cargo test` children are, got late_init's
/// handler natively and hung in its first setuid under the shim).
#[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
fn glibc_signals_ready() -> bool {
    // The kernel's struct sigaction on x86-64: handler, flags, restorer, mask.
    let mut old = [0usize; 4];
    // SAFETY: rt_sigaction reads no new action (NULL) and writes the old one into `old`, which
    // is as large as the kernel's struct with an 8-byte mask.
    let r = unsafe { raw::syscall(libc::SYS_rt_sigaction, [33, 0, old.as_mut_ptr() as usize, 8, 0, 0]) };
    r == 0 && old[0] > 1
}

#[cfg(not(all(target_arch = "x86_64", target_env = "gnu")))]
fn mark_multi_threaded() {}

/// The calling thread's thread pointer (`%fs:0`, glibc's self-pointer).
#[cfg(target_arch = "x86_64")]
#[inline]
fn tcb_word(offset: usize) -> usize {
    let v: usize;
    // SAFETY: glibc's x86-64 TCB starts at %fs and holds at least 0x80 bytes of header words;
    // the offsets read here are 0, 8, 0x28, 0x30.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[{}]", out(reg) v, in(reg) offset, options(nostack, readonly, preserves_flags));
    }
    v
}

/// A word that names the calling thread among the live threads of the process, never 0: its
/// thread pointer (one instruction, no thread-local access, no allocation). Valid on the
/// program's threads and on engine threads alike, and inside a signal handler (which runs on
/// the thread it interrupted, so it reads the same word). A thread that has exited may see its
/// word reused by a later thread.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn thread_id() -> usize {
    tcb_word(0)
}

/// See the x86-64 version: here `tpidr_el0`.
#[cfg(target_arch = "aarch64")]
#[inline]
pub fn thread_id() -> usize {
    let v: usize;
    // SAFETY: reading the EL0 thread pointer register has no side effect.
    unsafe { std::arch::asm!("mrs {}, tpidr_el0", out(reg) v, options(nomem, nostack, preserves_flags)) };
    v
}

/// See the x86-64 version: here the address of a thread-local byte (const-initialised, no
/// destructor, so no allocation and no registration).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline]
pub fn thread_id() -> usize {
    thread_local! {
        static ME: u8 = const { 0 };
    }
    ME.with(|b| b as *const u8 as usize)
}

static LAYOUT: OnceLock<Result<TlsLayout, &'static str>> = OnceLock::new();

/// Reads the static TLS layout of the process. Call it where the dynamic loader's lock is
/// safe to take (not from inside another allocator's hook): the shim's constructor does.
/// Cheap after the first call.
pub fn prepare() -> Result<(), &'static str> {
    LAYOUT.get_or_init(read_layout).as_ref().map(|_| ()).map_err(|e| *e)
}

#[cfg(target_arch = "x86_64")]
fn read_layout() -> Result<TlsLayout, &'static str> {
    type StaticInfo = unsafe extern "C" fn(*mut usize, *mut usize);
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name; null when absent.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_get_tls_static_info".as_ptr()) };
    let (mut size, mut align) = (0usize, 64usize);
    if !f.is_null() {
        // SAFETY: glibc's _dl_get_tls_static_info(size_t *, size_t *) writes two words.
        unsafe { std::mem::transmute::<*mut libc::c_void, StaticInfo>(f)(&mut size, &mut align) };
    }
    let tp = tcb_word(0);
    let mut l = TlsLayout {
        below: size,
        align: align.max(64),
        n: 0,
        dynamic: 0,
        modules: [TlsModule::default(); MAX_MODULES],
    };
    extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the duration of the call, and `data`
        // is the `(tp, &mut TlsLayout)` pair below.
        let (info, (tp, l)) = unsafe { (&*info, &mut *data.cast::<(usize, &mut TlsLayout)>()) };
        // The calling thread's block of the module: null for a dynamic module this thread has
        // not touched yet.
        let block = info.dlpi_tls_data as usize;
        if info.dlpi_tls_modid == 0 || l.n == MAX_MODULES {
            return 0;
        }
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers of the module.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        if let Some(h) = phdrs.iter().find(|h| h.p_type == libc::PT_TLS) {
            l.modules[l.n] = TlsModule {
                modid: info.dlpi_tls_modid,
                offset: if block != 0 && block < *tp { *tp - block } else { 0 },
                image: index(info.dlpi_addr) + index(h.p_vaddr),
                filesz: index(h.p_filesz),
                memsz: index(h.p_memsz),
                align: index(h.p_align).clamp(1, PAGE_SIZE).next_power_of_two(),
            };
            l.n += 1;
        }
        0
    }
    let mut data = (tp, &mut l);
    // SAFETY: the callback only reads what dl_iterate_phdr hands it and writes `data`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut data).cast::<libc::c_void>()) };
    // Blocks below the thread pointer within glibc's static size are static; the others are
    // dynamic (dlopen()ed modules, allocated elsewhere, or not yet in this thread): an engine
    // thread gets its own copy of each, so that glibc never allocates one for it (through the
    // program's malloc).
    let deepest = l.modules[..l.n].iter().map(|m| m.offset).max().unwrap_or(0);
    if l.below == 0 {
        l.below = deepest + (64 << 10);
    }
    let below = l.below;
    let all = l.n;
    let is_static = |m: &TlsModule| m.offset != 0 && m.offset <= below && m.offset >= m.memsz;
    let mut ordered = [TlsModule::default(); MAX_MODULES];
    let mut k = 0;
    for m in l.modules[..all].iter().filter(|m| is_static(m)) {
        ordered[k] = *m;
        k += 1;
    }
    l.n = k;
    for m in l.modules[..all]
        .iter()
        .filter(|m| !is_static(m) && m.modid <= DTV_SLOTS)
    {
        ordered[k] = *m;
        k += 1;
    }
    l.dynamic = k - l.n;
    l.modules = ordered;
    Ok(l)
}

#[cfg(not(target_arch = "x86_64"))]
fn read_layout() -> Result<TlsLayout, &'static str> {
    Ok(TlsLayout {
        below: 0,
        align: 64,
        n: 0,
        dynamic: 0,
        modules: [TlsModule::default(); MAX_MODULES],
    })
}

/// A thread made by [`spawn`]. Dropping the handle detaches it (its memory then lives as long
/// as the process); [`EngineThread::join`] waits for it and frees its memory.
#[derive(Debug)]
pub(crate) struct EngineThread {
    block: usize,
    len: usize,
    /// Cleared by the kernel when the thread has exited (CLONE_CHILD_CLEARTID).
    tid: *const AtomicU32,
    #[cfg(not(target_arch = "x86_64"))]
    std: Option<std::thread::JoinHandle<()>>,
}

// SAFETY: the handle is an address range and a pointer into it; the thread itself owns nothing
// the handle exposes, and join only reads an atomic.
unsafe impl Send for EngineThread {}
// SAFETY: as above.
unsafe impl Sync for EngineThread {}

struct Start {
    name: [u8; 16],
    body: Box<dyn FnOnce() + Send>,
}

extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the Box<Start> that spawn leaked for this thread, taken once.
    let start = unsafe { Box::from_raw(arg.cast::<Start>()) };
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes.
    let _ = unsafe {
        raw::call(
            libc::SYS_prctl,
            [libc::PR_SET_NAME as usize, start.name.as_ptr() as usize, 0, 0, 0, 0],
        )
    };
    let body = start.body;
    let _me = Registered::new();
    // A panic must not unwind out of this C entry point; the body reports its own.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    0
}

/// Starts an engine thread named `name` (at most 15 bytes shown) running `body`, with every
/// signal blocked. Allocates nothing through the program's allocator.
pub(crate) fn spawn(name: &str, body: Box<dyn FnOnce() + Send>) -> io::Result<EngineThread> {
    let mut n = [0u8; 16];
    for (d, s) in n.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    spawn_impl(Start { name: n, body })
}

/// Every signal blocked on the calling thread until dropped (then the old mask is back). All 64
/// bits: glibc's `sigfillset` leaves out the two signals glibc keeps for itself, which an engine
/// thread must not take either.
pub struct Blocked(u64);

impl Blocked {
    /// Blocks every signal on this thread until the guard drops.
    pub fn all() -> Blocked {
        let all = u64::MAX;
        let mut old = 0u64;
        // SAFETY: rt_sigprocmask reads `all` and writes `old`, both 8-byte kernel sigsets.
        let _ = unsafe {
            raw::call(
                libc::SYS_rt_sigprocmask,
                [
                    libc::SIG_SETMASK as usize,
                    &all as *const u64 as usize,
                    &mut old as *mut u64 as usize,
                    8,
                    0,
                    0,
                ],
            )
        };
        Blocked(old)
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `all`.
        let _ = unsafe {
            raw::call(
                libc::SYS_rt_sigprocmask,
                [libc::SIG_SETMASK as usize, &self.0 as *const u64 as usize, 0, 8, 0, 0],
            )
        };
    }
}

#[cfg(target_arch = "x86_64")]
fn spawn_impl(start: Start) -> io::Result<EngineThread> {
    let layout = match LAYOUT.get_or_init(read_layout) {
        Ok(l) => l,
        Err(why) => return Err(io::Error::other(*why)),
    };
    let tls = layout.below.next_multiple_of(layout.align);
    let dtv_bytes = (DTV_SLOTS + 2) * 16;
    let len =
        (PAGE_SIZE + STACK + tls + TCB + dtv_bytes + PAGE_SIZE + layout.dynamic_bytes()).next_multiple_of(PAGE_SIZE);
    let block = mman::map_private(len, true)?;
    // The lowest page is the stack's guard.
    // SAFETY: the block is our fresh mapping, unknown to anyone else yet.
    if let Err(e) = unsafe { mman::protect(block, PAGE_SIZE, libc::PROT_NONE) } {
        // SAFETY: as above.
        let _ = unsafe { mman::unmap(block, len) };
        return Err(e);
    }
    let tp = (block + PAGE_SIZE + STACK + tls).next_multiple_of(layout.align);
    let dtv = tp + TCB;
    let tid = dtv + dtv_bytes;
    // The dynamic modules' blocks, above the tid word.
    let dynamic = (tid + 8).next_multiple_of(64);
    // SAFETY: [block, block + len) is our fresh zeroed read-write mapping (but its guard page),
    // laid out above as `set_up_tls` asks.
    unsafe { set_up_tls(layout, tp, dtv, dynamic) };
    mark_multi_threaded();
    let arg = Box::into_raw(Box::new(start)).cast::<libc::c_void>();
    let flags = libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS
        | libc::CLONE_PARENT_SETTID
        | libc::CLONE_CHILD_CLEARTID;
    let stack_top = (block + PAGE_SIZE + STACK) & !15;
    let rc = {
        let _mask = Blocked::all();
        // SAFETY: glibc's clone(2) wrapper runs `entry(arg)` on the new stack and exits the
        // thread when it returns. The thread shares our memory (CLONE_VM) and gets `tp` as its
        // thread pointer; the kernel writes its tid to `tid` now and clears it (with a futex
        // wake) when the thread is gone. It inherits the all-blocked signal mask.
        unsafe { libc::clone(entry, stack_top as *mut libc::c_void, flags, arg, tid, tp, tid) }
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: the thread was not created: the Box is still ours.
        drop(unsafe { Box::from_raw(arg.cast::<Start>()) });
        // SAFETY: no thread runs on the block.
        let _ = unsafe { mman::unmap(block, len) };
        return Err(e);
    }
    Ok(EngineThread {
        block,
        len,
        tid: tid as *const AtomicU32,
    })
}

/// Fills a new engine thread's TLS, DTV and thread control block (at thread pointer `tp`, the
/// DTV at `dtv`, the dynamic modules' blocks from `dynamic`) from `layout`, as glibc would.
///
/// # Safety
/// The memory below `tp` for the static modules' blocks, the TCB at `tp`, the DTV at `dtv`
/// (`DTV_SLOTS + 2` slots of 16 bytes) and `layout.dynamic_bytes()` from `dynamic` must be a
/// fresh zeroed read-write mapping of the caller's that no one else uses yet.
///
/// # Context
/// The thread spawning an engine thread (from `spawn_impl`), before the clone; takes no lock,
/// does not sleep.
#[cfg(target_arch = "x86_64")]
unsafe fn set_up_tls(layout: &TlsLayout, tp: usize, dtv: usize, dynamic: usize) {
    // SAFETY: every write below lands inside the caller's mapping: static module blocks end
    // at tp (offset >= memsz), the DTV and the tid word are above the TCB, the dynamic blocks
    // above those (dynamic_bytes).
    unsafe {
        for m in &layout.modules[..layout.n] {
            std::ptr::copy_nonoverlapping(m.image as *const u8, (tp - m.offset) as *mut u8, m.filesz);
        }
        let slots = dtv as *mut [usize; 2];
        // dtv[-1].counter: slots allocated.
        (*slots)[0] = DTV_SLOTS;
        // dtv[0].counter: the TLS generation this vector is up to date with. The highest there
        // is: glibc's __tls_get_addr then never updates the vector (which would drop the
        // blocks set below and allocate new ones with malloc); it finds every block here.
        (*slots.add(1))[0] = usize::MAX;
        for i in 1..=DTV_SLOTS {
            (*slots.add(1 + i))[0] = DTV_UNALLOCATED;
        }
        for m in &layout.modules[..layout.n] {
            if m.modid <= DTV_SLOTS {
                *slots.add(1 + m.modid) = [tp - m.offset, 0];
            }
        }
        let mut at = dynamic;
        for m in &layout.modules[layout.n..layout.n + layout.dynamic] {
            at = at.next_multiple_of(m.align);
            std::ptr::copy_nonoverlapping(m.image as *const u8, at as *mut u8, m.filesz);
            // [address, to_free]: nothing for glibc to free.
            *slots.add(1 + m.modid) = [at, 0];
            at += m.memsz;
        }
        let tcb = tp as *mut usize;
        *tcb = tp; // header.tcb
        *tcb.add(1) = dtv + 16; // header.dtv points at dtv[0]
        *tcb.add(2) = tp; // header.self
        *(tp as *mut u32).add(6) = 1; // header.multiple_threads
        *tcb.add(5) = tcb_word(0x28); // header.stack_guard
        *tcb.add(6) = tcb_word(0x30); // header.pointer_guard
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn spawn_impl(start: Start) -> io::Result<EngineThread> {
    let _mask = Blocked::all();
    let h = std::thread::Builder::new()
        .name(String::from_utf8_lossy(&start.name).trim_end_matches('\0').to_string())
        .spawn(move || {
            let _me = Registered::new();
            (start.body)()
        })?;
    Ok(EngineThread {
        block: 0,
        len: 0,
        tid: std::ptr::null(),
        std: Some(h),
    })
}

impl EngineThread {
    /// The thread's stack and TLS mapping, as (address, length).
    pub(crate) fn area(&self) -> (usize, usize) {
        (self.block, self.len)
    }

    /// The thread's kernel id, 0 once it has exited.
    pub(crate) fn tid(&self) -> u32 {
        if self.tid.is_null() {
            return 0;
        }
        // SAFETY: `tid` points into the thread's block, mapped until join frees it.
        unsafe { &*self.tid }.load(Acquire)
    }

    /// Waits for the thread to exit, then frees its stack and TLS.
    pub(crate) fn join(self) {
        #[cfg(not(target_arch = "x86_64"))]
        if let Some(h) = self.std {
            let _ = h.join();
            return;
        }
        loop {
            let t = self.tid();
            if t == 0 {
                break;
            }
            // SAFETY: FUTEX_WAIT on the tid word while it still holds `t`; the kernel wakes us
            // when it clears the word at the thread's exit.
            let _ = unsafe {
                raw::call(
                    libc::SYS_futex,
                    [self.tid as usize, libc::FUTEX_WAIT as usize, t as usize, 0, 0, 0],
                )
            };
        }
        // SAFETY: the thread has exited (the kernel cleared its tid word): nothing runs on
        // its stack or reads its TLS any more.
        let _ = unsafe { mman::unmap(self.block, self.len) };
    }
}

/// `struct sched_attr`, its first version (48 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

const SCHED_ATTR_SIZE: u32 = 48;
const _: () = assert!(std::mem::size_of::<SchedAttr>() == SCHED_ATTR_SIZE as usize);
/// `SCHED_FLAG_RESET_ON_FORK`: the one flag carried over.
const RESET_ON_FORK: u64 = 1;

/// The calling thread's scheduling attributes (`sched_getattr`).
fn sched_attr() -> Option<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: sched_getattr of the calling thread (0) into a buffer of the size passed.
    unsafe {
        raw::call(
            libc::SYS_sched_getattr,
            [
                0,
                &mut attr as *mut SchedAttr as usize,
                SCHED_ATTR_SIZE as usize,
                0,
                0,
                0,
            ],
        )
    }
    .ok()?;
    Some(attr)
}

fn set_sched_attr(attr: &SchedAttr) -> bool {
    // SAFETY: sched_setattr on the calling thread (0) with a valid, sized attribute.
    unsafe {
        raw::call(
            libc::SYS_sched_setattr,
            [0, attr as *const SchedAttr as usize, 0, 0, 0, 0],
        )
    }
    .is_ok()
}

/// Asks the scheduler for the shortest time slice it grants (EEVDF's custom slice, Linux
/// 6.12: `sched_runtime` at its minimum, 100 us) at the thread's own policy and nice: a thread
/// that wakes with a shorter slice has an earlier deadline and runs at once where one with the
/// default slice waits behind the thread on the CPU. Its share of the CPU stays what its nice gives.
/// For a thread that runs briefly each time it wakes (a fault handler). Only a thread at
/// `SCHED_OTHER` or `SCHED_BATCH`: any other policy is the program's choice (real-time, idle,
/// sched_ext) and is left as it is. Whether the call was accepted (a kernel before 6.12
/// accepts the attribute and ignores it).
pub(crate) fn short_slice() -> bool {
    let Some(now) = sched_attr() else { return false };
    if now.policy != libc::SCHED_OTHER as u32 && now.policy != libc::SCHED_BATCH as u32 {
        return false;
    }
    set_sched_attr(&SchedAttr {
        size: SCHED_ATTR_SIZE,
        policy: now.policy,
        flags: now.flags & RESET_ON_FORK,
        nice: now.nice,
        runtime: 100_000,
        ..SchedAttr::default()
    })
}

/// Leaves a real-time policy (`SCHED_FIFO`, `SCHED_RR`) the thread inherited from the
/// program's thread that started it, for `SCHED_OTHER` at its nice: for a thread that works
/// in the background (the scrub), which at a real-time priority would take the CPU from
/// every normal thread, the program's included. Any other policy is left as it is.
pub(crate) fn leave_realtime() {
    let Some(now) = sched_attr() else { return };
    if now.policy == libc::SCHED_FIFO as u32 || now.policy == libc::SCHED_RR as u32 {
        set_sched_attr(&SchedAttr {
            size: SCHED_ATTR_SIZE,
            policy: libc::SCHED_OTHER as u32,
            flags: now.flags & RESET_ON_FORK,
            nice: now.nice,
            ..SchedAttr::default()
        });
    }
}

/// Waits (at most a second) until none of `tids` is a thread of this process any more. A
/// joined thread's tid word is cleared when it leaves its memory, a little before the kernel
/// takes it out of the thread group; `unshare(CLONE_NEWUSER)` needs it out.
pub(crate) fn wait_gone(tids: &[u32]) {
    // SAFETY: getpid has no arguments and no side effect.
    let pid = usize::try_from(unsafe { raw::syscall(libc::SYS_getpid, [0; 6]) }).unwrap_or(0);
    let t0 = std::time::Instant::now();
    for &tid in tids.iter().filter(|&&t| t != 0) {
        // SAFETY: signal 0 only checks that the thread exists.
        while unsafe { raw::syscall(libc::SYS_tgkill, [pid, tid as usize, 0, 0, 0, 0]) } == 0 {
            if t0.elapsed() > Duration::from_secs(1) {
                return;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// The kernel thread id of the caller, as userfaultfd reports it with THREAD_ID.
pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and no side effect.
    u32::try_from(unsafe { raw::syscall(libc::SYS_gettid, [0; 6]) }).unwrap_or(0)
}

/// Number of CPUs the calling thread may run on (sched_getaffinity, up to 4096 CPUs; the
/// online CPUs if the call fails). A raw system call: no libc path that could allocate.
pub(crate) fn allowed_cpus() -> usize {
    let mut mask = [0u64; 64];
    // SAFETY: the kernel writes at most `size_of_val(&mask)` bytes into `mask`.
    let r = unsafe {
        raw::call(
            libc::SYS_sched_getaffinity,
            [0, std::mem::size_of_val(&mask), mask.as_mut_ptr() as usize, 0, 0, 0],
        )
    };
    match r {
        Ok(_) => (mask.iter().map(|w| w.count_ones() as usize).sum::<usize>()).max(1),
        Err(_) => online_cpus(),
    }
}

/// Number of online CPUs.
pub(crate) fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n.max(1)).unwrap_or(1)
}

/// The size of CPU 0's last-level cache in bytes (the highest `level` under
/// /sys/devices/system/cpu/cpu0/cache), if sysfs says.
pub(crate) fn llc_bytes() -> Option<usize> {
    let mut best: Option<(u32, usize)> = None;
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let Ok(level) = std::fs::read_to_string(format!("{dir}/level")) else {
            break;
        };
        let Ok(size) = std::fs::read_to_string(format!("{dir}/size")) else {
            continue;
        };
        let (Ok(level), Some(size)) = (level.trim().parse::<u32>(), cache_size(size.trim())) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, size));
        }
    }
    best.map(|(_, s)| s)
}

/// A cache size as sysfs writes it: a count with a binary suffix (`48K`, `36608K`, `2M`).
fn cache_size(s: &str) -> Option<usize> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 10),
        b'M' => (&s[..s.len() - 1], 20),
        b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// How long, in all, the calling thread waited runnable for a CPU, in ns (the second field
/// of `/proc/thread-self/schedstat`, CONFIG_SCHED_INFO; `None` without it), read with raw
/// system calls. Opened for each read: a descriptor kept open is one a program that closes
/// every descriptor it did not open (a daemon starting up) would close under us, and its
/// number reused for the program's own file.
pub(crate) fn run_delay() -> Option<u64> {
    let mut buf = [0u8; 128];
    let n = super::numa::read_small(b"/proc/thread-self/schedstat\0", &mut buf)?;
    std::str::from_utf8(&buf[..n])
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The 1-minute load average (from /proc/loadavg), if readable.
pub(crate) fn loadavg_1min() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// A numeric field of this process's `/proc/self/status` ("TracerPid:\t123", "VmPTE:\t 88 kB":
/// the number, without its unit), read with raw system calls into a buffer on the stack (no
/// allocation: engine threads call it).
pub(crate) fn status_field(name: &str) -> Option<u64> {
    let mut buf = [0u8; 4096];
    let n = super::numa::read_small(b"/proc/self/status\0", &mut buf)?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(name)?
            .strip_prefix(':')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// Whether the process asked for no transparent huge pages (`prctl(PR_SET_THP_DISABLE)`,
/// inherited across fork and exec).
pub(crate) fn thp_disabled() -> bool {
    // SAFETY: PR_GET_THP_DISABLE reads a flag of the process; no pointer.
    unsafe { raw::syscall(libc::SYS_prctl, [libc::PR_GET_THP_DISABLE as usize, 0, 0, 0, 0, 0]) == 1 }
}

/// Whether a tracer (a debugger, strace) is attached to the process's main thread.
pub fn traced() -> bool {
    status_field("TracerPid").is_some_and(|p| p != 0)
}

/// Whether the process runs under a seccomp filter (mode 2) or in strict mode (1).
pub fn seccomp_filtered() -> bool {
    status_field("Seccomp").is_some_and(|m| m != 0)
}

/// The CPU-time clock of one thread, readable from any thread while it lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    /// The clock of the calling thread, by its tid (the kernel's CPUCLOCK_PERTHREAD encoding,
    /// as glibc's pthread_getcpuclockid computes it), so that it works on engine threads too.
    pub(crate) fn current() -> ThreadClock {
        let tid = gettid() as libc::clockid_t;
        ThreadClock((!tid << 3) | 4 | 2)
    }

    /// CPU time used so far. Only meaningful while the thread lives.
    pub(crate) fn read(&self) -> Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid timespec to write into; a stale clock id yields EINVAL and
        // leaves `ts` zero.
        let _ = unsafe {
            raw::call(
                libc::SYS_clock_gettime,
                [
                    raw::int_arg(self.0),
                    &mut ts as *mut libc::timespec as usize,
                    0,
                    0,
                    0,
                    0,
                ],
            )
        };
        Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "test data patterns"
)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(cache_size("48K"), Some(48 << 10));
        assert_eq!(cache_size("36608K"), Some(36608 << 10));
        assert_eq!(cache_size("2M"), Some(2 << 20));
        assert_eq!(cache_size("512"), Some(512));
        assert_eq!(cache_size("K"), None);
        assert_eq!(cache_size(""), None);
    }
    use std::sync::atomic::{AtomicU64, AtomicUsize};
    use std::sync::Arc;

    thread_local! {
        static SEVEN: Cell<u64> = const { Cell::new(7) };
    }

    fn run(name: &str, body: impl FnOnce() + Send + 'static) -> u32 {
        let t = spawn(name, Box::new(body)).unwrap();
        let tid = t.tid();
        t.join();
        tid
    }

    #[test]
    fn engine_threads_start_with_every_signal_blocked() {
        let blocked = Arc::new(AtomicU64::new(0));
        let b = blocked.clone();
        run("zf-test-sig", move || {
            let mut cur = 0u64;
            // SAFETY: rt_sigprocmask with no new set only writes the current 8-byte mask.
            unsafe { raw::call(libc::SYS_rt_sigprocmask, [0, 0, &mut cur as *mut u64 as usize, 8, 0, 0]) }.unwrap();
            b.store(cur, Relaxed);
        });
        // Every signal but SIGKILL and SIGSTOP, which cannot be blocked.
        let unblockable = (1u64 << (libc::SIGKILL - 1)) | (1u64 << (libc::SIGSTOP - 1));
        assert_eq!(blocked.load(Relaxed) | unblockable, u64::MAX);
        // The creating thread's mask is as it was.
        let mut cur = 0u64;
        // SAFETY: as above.
        unsafe { raw::call(libc::SYS_rt_sigprocmask, [0, 0, &mut cur as *mut u64 as usize, 8, 0, 0]) }.unwrap();
        assert_ne!(cur | unblockable, u64::MAX);
    }

    #[test]
    fn thread_locals_and_errno_are_the_threads_own() {
        SEVEN.with(|c| c.set(9));
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = 5 };
        let seen = Arc::new(AtomicU64::new(0));
        let s = seen.clone();
        run("zf-test-tls", move || {
            let first = SEVEN.with(|c| c.get());
            SEVEN.with(|c| c.set(8));
            // SAFETY: errno is thread-local.
            unsafe { *libc::__errno_location() = 77 };
            // SAFETY: as above.
            let e = unsafe { *libc::__errno_location() } as u64;
            s.store(first * 1000 + SEVEN.with(|c| c.get()) * 100 + e, Relaxed);
        });
        assert_eq!(
            seen.load(Relaxed),
            7000 + 800 + 77,
            "initial value, own copy, own errno"
        );
        assert_eq!(SEVEN.with(|c| c.get()), 9);
        // SAFETY: as above.
        assert_eq!(unsafe { *libc::__errno_location() }, 5);
    }

    #[test]
    fn status_fields_are_read_with_or_without_a_unit() {
        assert!(status_field("Threads").is_some_and(|n| n >= 1));
        assert!(
            status_field("VmPTE").is_some_and(|kb| kb > 0),
            "a field with kB after it"
        );
        assert_eq!(status_field("NoSuchField"), None);
    }

    #[test]
    fn a_panic_ends_only_the_thread_and_the_name_is_set() {
        let name = Arc::new(AtomicUsize::new(0));
        let n = name.clone();
        run("zf-test-name", move || {
            let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
            n.store((comm.trim() == "zf-test-name") as usize, Relaxed);
        });
        assert_eq!(name.load(Relaxed), 1);
        let tid = run("zf-test-panic", || panic!("on purpose"));
        assert!(tid > 0);
        // Joined once its tid word is cleared, a moment before it leaves the thread group (a
        // loaded machine made that moment long enough to see: wait_gone's reason).
        wait_gone(&[tid]);
        assert!(!std::path::Path::new(&format!("/proc/self/task/{tid}")).exists());
    }
}
