//! The C API (include/zerofault.h).
//!
//! # Context
//! Every function here runs on any program thread that calls it; what reaches the engine does
//! so inside the hook scope ([`Hook`]).

use crate::hook::{set_errno, Hook};
use crate::state;
use engine::os::mman::{self, PAGE_SIZE};
use libc::{c_char, c_int, c_void, size_t};

/// Maps `len` bytes (rounded up to pages) of anonymous memory served by the engine (started
/// now if it was not yet); plain memory when the engine is off. NULL on failure.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub extern "C" fn zerofault_map(len: size_t) -> *mut c_void {
    if len == 0 {
        return std::ptr::null_mut();
    }
    let len = len.next_multiple_of(PAGE_SIZE);
    let Ok(p) = mman::map_private(len, false) else {
        return std::ptr::null_mut();
    };
    // SAFETY: our fresh mapping; advice changes no content.
    let _ = unsafe { mman::madvise(p, len, mman::MADV_NOHUGEPAGE) };
    let Some(h) = Hook::enter() else {
        return p as *mut c_void;
    };
    if let Some(e) = h.engine() {
        // SAFETY: our fresh mapping, handed to the caller.
        let _ = unsafe { e.adopt(p, len, true) };
    }
    p as *mut c_void
}

/// Unmaps memory from zerofault_map. 0, or -1 with errno set.
///
/// # Safety
/// `[p, p + len)` is a mapping from `zerofault_map` that nothing uses any more.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn zerofault_unmap(p: *mut c_void, len: size_t) -> c_int {
    // SAFETY: the caller hands back a mapping it owns.
    unsafe {
        libc::syscall(
            libc::SYS_munmap,
            p,
            len.checked_next_multiple_of(PAGE_SIZE).unwrap_or(len),
        ) as c_int
    }
}

/// Discards `[p, p + len)` like `madvise(MADV_DONTNEED)` (it reads zero afterwards), keeping
/// the pages the engine installed there for its pool: they come back zeroed to the next
/// fault. Memory the engine does not serve, or with the engine off, is simply discarded.
/// 0, or -1 with errno set (EINVAL for an unaligned range, or MADV_DONTNEED's own errno).
///
/// # Safety
/// The caller owns the range and gives up its contents, as for `MADV_DONTNEED`.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn zerofault_recycle(p: *mut c_void, len: size_t) -> c_int {
    let addr = p as usize;
    if addr % PAGE_SIZE != 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // A length past the address space: madvise's own EINVAL below, as natively.
    let len = len.checked_next_multiple_of(PAGE_SIZE).unwrap_or(len);
    let recycled = Hook::enter().and_then(|h| {
        let e = h.running().filter(|e| e.options().recycle && e.serves_any(addr, len))?;
        // SAFETY: the caller gives the range up (this function's contract).
        Some(unsafe { e.recycle(p.cast(), len) })
    });
    match recycled {
        Some(Ok(_)) => 0,
        // SAFETY: the caller's range; MADV_DONTNEED's own result and errno, as without the
        // engine (the recycle's own discard failed the same way, or a move was refused).
        _ => unsafe { libc::syscall(libc::SYS_madvise, p, len, libc::MADV_DONTNEED) as c_int },
    }
}

/// 1 when the engine serves faults in this process, 0 otherwise (not started yet, failed
/// open, or off). Answers inside a hook too (a signal handler's call).
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub extern "C" fn zerofault_active() -> c_int {
    let h = Hook::enter_or_nest();
    h.running().is_some_and(|e| e.is_active()) as c_int
}

/// Writes the counters as one JSON object, NUL-terminated, into `buf` (at most `cap` bytes,
/// truncated if short). Returns the JSON's length without the NUL, like snprintf.
///
/// # Safety
/// `buf` is valid for writes of `cap` bytes (or `cap` is 0).
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn zerofault_stats_json(buf: *mut c_char, cap: size_t) -> size_t {
    // Answers inside a hook too (a signal handler's call).
    let h = Hook::enter_or_nest();
    h.quiet();
    let json = match (state::stats_block(), h.running()) {
        (Some(s), _) => s.snapshot().to_json(),
        (None, Some(e)) => e.stats().to_json(),
        (None, None) => engine::Snapshot::default().to_json(),
    };
    if !buf.is_null() && cap > 0 {
        let n = json.len().min(cap - 1);
        // SAFETY: the caller's buffer holds `cap` bytes; n + 1 <= cap.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    json.len()
}
