//! What the program does to its own process that the engine must follow: its rights (the
//! credential calls, `PR_SET_NO_NEW_PRIVS`, namespaces), a seccomp filter, a userfaultfd of its
//! own, and the futex operations the kernel runs with faults it cannot wait for. The front
//! (front/front.c) hooks the calls and comes here around them; DESIGN.md, "The program's
//! rights".
//!
//! - **Rights.** Engine threads are raw clones: glibc's set*id broadcast never reaches them, and
//!   a credential, a capability set or `NO_NEW_PRIVS` is per thread in the kernel. So around
//!   such a call the engine's threads are stopped ([`zerofault_hold_threads`]) and started
//!   again from the calling thread afterwards ([`zerofault_release_threads`]), which hands them
//!   its new state, as `clone(2)` does. Stopped, the process is one-threaded again for
//!   `unshare(CLONE_NEWUSER)` and `setns` into a user namespace.
//! - **Seccomp.** A filter may refuse what an engine thread calls (and kill the process for
//!   it). Before one is installed the engine stops for good: the kernel serves every fault. A
//!   process that installs one before the engine starts never starts it.
//! - **The program's own userfaultfd.** The kernel refuses a registration over memory another
//!   userfaultfd holds (EBUSY). The front retries a refused `UFFDIO_REGISTER` once after
//!   [`zerofault_foreign_register`] handed that memory back to the kernel.
//! - **Futexes.** The kernel's futex code touches the word with page faults disabled and then
//!   faults it in with no way to wait for a userfaultfd (EFAULT where natively the page would
//!   be made). The front retries such an EFAULT once after [`zerofault_prefault`] had the
//!   engine serve the words.

use crate::hook::Hook;
use crate::state::{self, arena, say};
use engine::os::mman::{self, PAGE_SIZE};
use libc::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Mutex;

/// `MADV_POPULATE_WRITE` (Linux 5.14).
const MADV_POPULATE_WRITE: c_int = 23;

/// The engine's threads, stopped around a call that changes the process's rights; or the
/// engine stopped for good (`for_good`: 1 before a seccomp filter, [`FOR_GOOD_REALTIME`]
/// before a real-time policy). Returns 1 when the caller must call
/// [`zerofault_release_threads`] after its call.
///
/// # Context
/// A program thread, from the front's hook, before the call, inside the hook scope, quiet;
/// sleeps until the engine's threads have left.
#[no_mangle]
pub extern "C" fn zerofault_hold_threads(for_good: c_int) -> c_int {
    let Some(h) = Hook::enter() else { return 0 };
    h.quiet();
    // No descriptor of the engine's outlives a change of rights (report.rs).
    crate::report::credentials_changed();
    if for_good != 0 {
        let why = match for_good {
            FOR_GOOD_REALTIME => {
                "the program gives a thread a real-time policy (its faults must not wait for \
                                  a handler behind the real-time threads of its CPU)"
            }
            _ => "the program installs a seccomp filter (it may refuse the engine's calls)",
        };
        match h.switch_off() {
            Some(e) if e.is_active() => {
                e.stop_for_good();
                if e.options().verbose {
                    say(&format!(
                        "zerofault: engine stopped in pid {}: {why}; the kernel serves its faults from now on",
                        state::getpid()
                    ));
                }
            }
            Some(_) => {}
            None if state::verbose() => say(&format!(
                "zerofault: engine not started in pid {}: {why}; running on plain memory",
                state::getpid()
            )),
            None => {}
        }
        return 0;
    }
    match h.running() {
        Some(e) if e.is_active() && HELD.fetch_add(1, Relaxed) >= MAX_HOLDS => {
            e.stop_for_good();
            if e.options().verbose {
                say(&format!(
                    "zerofault: engine stopped in pid {}: the program changed its rights {MAX_HOLDS} times \
                     (each stops and restarts the engine's threads); the kernel serves its faults from now on",
                    state::getpid()
                ));
            }
            0
        }
        Some(e) if e.is_active() => c_int::from(e.pause()),
        _ => 0,
    }
}

/// `for_good` of [`zerofault_hold_threads`] before a real-time policy (the front's
/// `FOR_GOOD_REALTIME`).
const FOR_GOOD_REALTIME: c_int = 2;

/// After a set*id call of glibc's that succeeded: the engine's threads are stopped and started
/// again from the calling thread, which hands them the new credentials. Not before the call,
/// as for the others: glibc's call signals every other thread of the program and waits for
/// each, and one waiting for the engine (in a `MADV_DONTNEED` of served memory, a fault taken
/// in a system call) would wait for ever with the engine stopped. Between the call and the
/// restart the engine's threads keep the old credentials, running only the engine's code.
///
/// # Context
/// A program thread, from the front's hook, after the call; as [`zerofault_hold_threads`] and
/// [`zerofault_release_threads`], each in a hook scope of its own.
#[no_mangle]
pub extern "C" fn zerofault_restart_threads() {
    if zerofault_hold_threads(0) != 0 {
        zerofault_release_threads();
    }
}

/// Times the engine's threads were stopped for a change of rights.
static HELD: AtomicU32 = AtomicU32::new(0);

/// After this many changes of rights the engine stops for good: a program that switches
/// credentials all the time (a file server impersonating each client) would pay a stop and
/// restart of the engine's threads each time (DESIGN.md, "The program's rights").
const MAX_HOLDS: u32 = 64;

/// Starts the engine's threads again after the call [`zerofault_hold_threads`] stopped them for.
///
/// # Context
/// A program thread, from the front's hook, right after the call, inside the hook scope,
/// quiet; waits for the engine's threads to start.
#[no_mangle]
pub extern "C" fn zerofault_release_threads() {
    if let Some(e) = Hook::enter().as_ref().and_then(Hook::running) {
        e.resume();
    }
}

/// `UFFDIO_REGISTER` on descriptor `fd` was refused with EBUSY, for the range `arg` (a `struct
/// uffdio_register` the kernel just read) names: if the engine serves any of it and `fd` is
/// not the engine's, that part is handed back to the kernel. Returns 1 when the caller should
/// try the registration again.
///
/// # Safety
/// `arg` points to a readable `struct uffdio_register` (the kernel read it).
///
/// # Context
/// A program thread, from the front's hook, inside the hook scope, quiet; takes the
/// registration lock and the shim's lock of foreign spans.
#[no_mangle]
pub unsafe extern "C" fn zerofault_foreign_register(fd: c_int, arg: *const c_void) -> c_int {
    let Some(h) = Hook::enter() else { return 0 };
    let Some(e) = h.running() else { return 0 };
    if arg.is_null() || e.is_own_uffd(fd) {
        return 0;
    }
    // SAFETY: the caller's contract: `struct uffdio_register` begins with its range, two u64.
    let (start, len) = unsafe {
        (
            arg.cast::<u64>().read_unaligned(),
            arg.cast::<u64>().add(1).read_unaligned(),
        )
    };
    let (start, len) = (start as usize, len as usize);
    if !e.release_overlapping(start, len) {
        return 0;
    }
    if let Some(a) = arena() {
        let (base, alen) = a.area();
        let (s, t) = (start.max(base), start.saturating_add(len).min(base + alen));
        if s < t {
            foreign_arena_span(s, t);
        }
    }
    if e.options().verbose {
        say(&format!(
            "zerofault: pid {} registers {start:#x}+{len:#x} with a userfaultfd of its own: \
             the engine handed that memory back to the kernel",
            state::getpid()
        ));
    }
    1
}

/// A futex operation on `uaddr` (and `uaddr2`, when not null) returned EFAULT: the words the
/// engine serves are faulted in (`MADV_POPULATE_WRITE`, which waits for the engine as a
/// program's own touch does). Returns 1 when one was, and the operation may be tried again.
///
/// # Context
/// A program thread, from the front's hook, inside the hook scope, quiet; waits for the
/// engine to serve the words.
#[no_mangle]
pub extern "C" fn zerofault_prefault(uaddr: *const c_void, uaddr2: *const c_void) -> c_int {
    let Some(h) = Hook::enter() else { return 0 };
    let Some(e) = h.running() else { return 0 };
    let mut any = 0;
    for a in [uaddr as usize, uaddr2 as usize] {
        if a != 0 && e.serves(a) {
            let page = engine::page::page_start(a);
            // SAFETY: one page of memory the engine serves, made present and writable with its
            // contents unchanged (a populate never writes data).
            if unsafe { mman::madvise(page, PAGE_SIZE, MADV_POPULATE_WRITE) }.is_ok() {
                any = 1;
            }
        }
    }
    any
}

/// Arena spans the program registered with a userfaultfd of its own, as (start, end): when
/// the arena gets them back (a free), they are mapped afresh, so that the next block there is
/// zero and served by the engine, not by the program's descriptor.
static FOREIGN: Mutex<[(usize, usize); 64]> = Mutex::new([(0, 0); 64]);

fn foreign_arena_span(start: usize, end: usize) {
    let mut t = FOREIGN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(slot) = t.iter_mut().find(|s| s.0 == s.1) {
        *slot = (start, end);
    } else {
        // Full: the oldest is forgotten; its span stays the program's registration until
        // the program's descriptor closes (its blocks there are then served by the kernel).
        t.rotate_left(1);
        t[63] = (start, end);
    }
}

/// Before arena pages `[addr, addr + len)` go back to the free list: where the program had
/// registered some of them with a userfaultfd of its own, the whole range is mapped afresh
/// (`PROT_NONE`, as the arena's free pages are) and given to the engine again. Returns true
/// when it was (the range then reads zero).
///
/// # Context
/// A program thread, inside free or realloc, in the hook scope `h`, quiet; takes the shim's
/// lock of foreign spans, and the engine's registration lock.
pub fn renew_foreign(h: &Hook, addr: usize, len: usize) -> bool {
    let end = addr + len;
    let hit = {
        let mut t = FOREIGN.lock().unwrap_or_else(|e| e.into_inner());
        let mut hit = false;
        for s in t.iter_mut().filter(|s| s.0 < end && addr < s.1) {
            hit = true;
            if addr <= s.0 && s.1 <= end {
                *s = (0, 0);
            }
        }
        hit
    };
    if !hit {
        return false;
    }
    // SAFETY: arena pages the program gave up; the fixed mapping replaces them (and the
    // program's registration with them) with fresh memory inside the arena's reservation.
    if unsafe { mman::remap_fresh(addr, len) }.is_err() {
        return false;
    }
    if let Some(e) = h.running() {
        // SAFETY: fresh anonymous private memory of the arena's.
        let _ = unsafe { e.adopt(addr, len, false) };
    }
    true
}

/// A program thread's CPUs changed (`sched_setaffinity`, `pthread_setaffinity_np`): the
/// engine's threads are given the process's, so that they run only where the program's may.
///
/// # Context
/// A program thread, from the front's hook, after the call, inside the hook scope; takes the
/// engine's threads' lock.
#[no_mangle]
pub extern "C" fn zerofault_cpus_changed() {
    if let Some(e) = Hook::enter().as_ref().and_then(Hook::running) {
        e.follow_cpus();
    }
}

/// `prctl(PR_SET_THP_DISABLE, on)` succeeded: the engine moves no huge page into the program's
/// memory while it is set, as the kernel makes none.
///
/// # Context
/// A program thread, from the front's hook, after the call, inside the hook scope; stores one
/// flag, takes no lock.
#[no_mangle]
pub extern "C" fn zerofault_thp_disabled(on: c_int) {
    if let Some(e) = Hook::enter().as_ref().and_then(Hook::running) {
        e.set_thp_disabled(on != 0);
    }
}
