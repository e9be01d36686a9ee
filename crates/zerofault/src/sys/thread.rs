//! Thread-level syscalls: the engine's own threads, scheduling class, CPU affinity,
//! thread CPU time, tid, a one-instruction thread id, load average. The scheduling and CPU
//! calls are in [`super::sched`] and the TLS layout in [`super::tls`], re-exported here.

// The clone(2) path is x86-64 only; elsewhere its pieces are unused.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

use super::mman::{self, PAGE_SIZE};
use super::raw;
pub(crate) use super::sched::{
    allowed_cpus, leave_realtime, llc_bytes, loadavg_1min, online_cpus, run_delay, short_slice, ThreadClock,
};
pub use super::tls::prepare;
#[cfg(target_arch = "x86_64")]
use super::tls::set_up_tls;
use super::tls::{read_layout, DTV_SLOTS, LAYOUT};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};
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
/// Bytes reserved for glibc's `struct pthread` at the thread pointer (2304 in glibc 2.36).
const TCB: usize = 16 << 10;

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
/// LD_PRELOAD shim: [`crate::alloc::EngineAlloc`] is its global allocator).
static OWN_ALLOCATOR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says that the engine's threads allocate only from the engine's own memory, never with
/// glibc's malloc (see `mark_multi_threaded`).
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
pub(super) fn tcb_word(offset: usize) -> usize {
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
    table: Table,
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
    own_table(start.table);
    // A panic must not unwind out of this C entry point; the body reports its own.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    0
}

/// Starts an engine thread named `name` (at most 15 bytes shown) running `body`, with every
/// signal blocked and a descriptor table of its own that holds only `keep`. Allocates nothing
/// through the program's allocator.
pub(crate) fn spawn(name: &str, table: Table, body: Box<dyn FnOnce() + Send>) -> io::Result<EngineThread> {
    let mut n = [0u8; 16];
    for (d, s) in n.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    spawn_impl(Start { name: n, table, body })
}

/// The descriptor table an engine thread runs with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Table {
    /// The program's, shared (as a thread's).
    Program,
    /// One of its own, holding only the given descriptor (see `own_table`).
    Own(Option<RawFd>),
}

impl Table {
    /// [`Table::Own`] keeping `keep` where the embedder asked for it ([`own_tables`]), else
    /// [`Table::Program`].
    pub(crate) fn for_engine(keep: Option<RawFd>) -> Table {
        if tables_own() {
            Table::Own(keep)
        } else {
            Table::Program
        }
    }
}

/// Set by an embedder that calls into the engine on every memory call of the program's (the
/// LD_PRELOAD shim), where a failed engine's last descriptor copy in the program's table is
/// closed by the program's next call ([`crate::Engine::tidy`]).
static OWN_TABLES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Engine threads started from now on leave the program's descriptor table (see
/// `own_table`). For an embedder that calls [`crate::Engine::tidy`] on each of the program's
/// memory calls: a failed engine whose ioctls are refused (a seccomp filter it did not see)
/// cannot unregister its ranges, and only the close of the program's copy, there, releases
/// them. Without it the engine's threads share the program's table, and a failed handler's
/// close is the last.
pub fn own_tables() {
    OWN_TABLES.store(true, Relaxed);
}

/// Whether engine threads have descriptor tables of their own ([`own_tables`]).
pub(crate) fn tables_own() -> bool {
    OWN_TABLES.load(Relaxed)
}

/// The calling engine thread leaves the program's descriptor table for `Table::Own`
/// (`own_descriptor_table`; Linux 5.9 and later): its opens then never take a number the
/// program's table has free, so `close(0); open()` there gets 0 as natively.
fn own_table(table: Table) {
    if let Table::Own(keep) = table {
        let _ = super::file::own_descriptor_table(keep);
    }
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
    let layout = LAYOUT.get_or_init(read_layout);
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

#[cfg(not(target_arch = "x86_64"))]
fn spawn_impl(start: Start) -> io::Result<EngineThread> {
    let _mask = Blocked::all();
    let h = std::thread::Builder::new()
        .name(String::from_utf8_lossy(&start.name).trim_end_matches('\0').to_string())
        .spawn(move || {
            let _me = Registered::new();
            own_table(start.table);
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

/// A numeric field of this process's `/proc/self/status` ("TracerPid:\t123", "VmPTE:\t 88 kB":
/// the number, without its unit), read with raw system calls into a buffer on the stack (no
/// allocation: engine threads call it).
pub(crate) fn status_field(name: &str) -> Option<u64> {
    let mut buf = [0u8; 4096];
    let n = super::file::read_small(b"/proc/self/status\0", &mut buf)?;
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

/// Whether a tracer may be attached to the process: one is (as [`traced`]), or the engine can
/// no longer tell, because /proc/self/status cannot be found or read any more for a reason
/// that lasts (the program `chroot`ed away from /proc, unmounted it in a mount namespace of its
/// own, or a Landlock domain denies it). An engine that cannot see a debugger arrive must step
/// aside as if one had: a debugger's read of memory the engine has not filled yet fails
/// (ptrace's EIO) for good otherwise. A failure that passes (out of descriptors or of memory,
/// an interrupted call) reads as no tracer: it is looked at again soon.
///
/// # Context
/// The first scrub thread, every [`crate::pool::scrub`] look; no lock, no allocation (a
/// stack buffer and raw system calls).
pub(crate) fn traced_or_unknown() -> bool {
    let mut buf = [0u8; 4096];
    match super::file::read_small_or_errno(b"/proc/self/status\0", &mut buf) {
        Ok(n) => {
            let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
            tracer_pid(text).is_none_or(|p| p != 0)
        }
        Err(raw::Errno(e)) => !matches!(
            e,
            libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR | libc::EAGAIN
        ),
    }
}

/// The `TracerPid:` field of a /proc/PID/status text.
fn tracer_pid(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:")?.split_whitespace().next()?.parse().ok())
}

/// Whether the process runs under a seccomp filter (mode 2) or in strict mode (1).
pub fn seccomp_filtered() -> bool {
    status_field("Seccomp").is_some_and(|m| m != 0)
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
    use std::sync::atomic::{AtomicU64, AtomicUsize};
    use std::sync::Arc;

    thread_local! {
        static SEVEN: Cell<u64> = const { Cell::new(7) };
    }

    fn run(name: &str, body: impl FnOnce() + Send + 'static) -> u32 {
        let t = spawn(name, Table::Program, Box::new(body)).unwrap();
        let tid = t.tid();
        t.join();
        tid
    }

    #[test]
    fn engine_threads_keep_one_descriptor_in_a_table_of_their_own() {
        use crate::sys::file::{open, tests::alive};
        use std::os::fd::AsRawFd;
        let (kept, other) = (
            open("/dev/null", libc::O_RDONLY).unwrap(),
            open("/dev/null", libc::O_RDONLY).unwrap(),
        );
        let (k, o) = (kept.as_raw_fd(), other.as_raw_fd());
        let seen = Arc::new(AtomicU64::new(u64::MAX));
        let s = seen.clone();
        let t = spawn(
            "zf-test-fds",
            Table::Own(Some(k)),
            Box::new(move || s.store(u64::from(alive(k)) | u64::from(alive(o)) << 1, Relaxed)),
        )
        .unwrap();
        t.join();
        assert_eq!(seen.load(Relaxed), 1, "the kept descriptor only");
        // The process's table is untouched.
        assert!(alive(o) && alive(k));
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
    fn a_tracer_pid_is_read_and_an_unreadable_status_is_unknown() {
        assert_eq!(tracer_pid("Name:\tx\nTracerPid:\t0\nUid:\t0\n"), Some(0));
        assert_eq!(tracer_pid("TracerPid:\t4242\n"), Some(4242));
        assert_eq!(tracer_pid("Name:\tx\n"), None);
        // Not traced here (the test runner runs under no debugger), and /proc is readable.
        assert_eq!(traced_or_unknown(), traced());
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
