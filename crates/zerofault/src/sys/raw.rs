//! System calls that leave `errno` alone.
//!
//! The engine runs inside programs it never saw: on their threads (the LD_PRELOAD shim's hooks)
//! and on its own. libc's wrappers report failure through `errno`, a thread-local of the
//! program's: a hook that failed an internal `madvise` would change the `errno` the program
//! sees after a `free()` that POSIX says leaves it alone. So every call below `sys` goes
//! through [`syscall`], which returns the kernel's answer as it is: a value, or `-errno`.
//!
//! On x86-64 it is the `syscall` instruction itself. Elsewhere it falls back to libc's
//! `syscall()` and puts `errno` back as it found it.

use std::io;

/// An errno value the kernel returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// As an `io::Error`.
    pub fn to_io(self) -> io::Error {
        io::Error::from_raw_os_error(self.0)
    }
}

impl From<Errno> for io::Error {
    fn from(e: Errno) -> io::Error {
        e.to_io()
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_io())
    }
}

/// Calls system call `nr` with six arguments (unused ones are ignored by the kernel). Returns
/// the kernel's result: non-negative on success, `-errno` on failure.
///
/// # Safety
/// The arguments must satisfy the contract of the system call: pointers valid for what the
/// call reads or writes, memory calls only on ranges the caller may change.
#[cfg(target_arch = "x86_64")]
#[inline]
pub unsafe fn syscall(nr: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the System V x86-64 syscall convention: number in rax, arguments in rdi, rsi,
    // rdx, r10, r8, r9; the kernel clobbers rcx and r11 and returns in rax. The caller upholds
    // the call's own contract.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// See the x86-64 version.
///
/// # Safety
/// As the x86-64 version.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn syscall(nr: libc::c_long, a: [usize; 6]) -> isize {
    // SAFETY: errno is thread-local; reading and restoring it is always valid.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: the caller upholds the call's contract.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) } as isize;
    let r = if r == -1 {
        // SAFETY: as above.
        -(unsafe { *libc::__errno_location() } as isize)
    } else {
        r
    };
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
    r
}

/// A C `int` argument (a descriptor, flags, a protection) as a system-call register: sign
/// extended, as C passes it; the kernel reads the low 32 bits.
#[inline]
#[allow(clippy::cast_sign_loss, reason = "a register holds the int's bits, sign extended")]
pub(crate) const fn int_arg(i: libc::c_int) -> usize {
    i as isize as usize
}

/// A C `unsigned long` argument (an ioctl request) as a register.
#[inline]
#[allow(clippy::cast_possible_truncation, reason = "64-bit targets only (lib.rs)")]
pub(crate) const fn ulong_arg(u: libc::c_ulong) -> usize {
    u as usize
}

/// A descriptor a system call returned (the kernel's descriptors fit in an `int`).
#[inline]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "fds are below INT_MAX"
)]
pub(crate) const fn fd_of(r: usize) -> std::os::fd::RawFd {
    r as std::os::fd::RawFd
}

/// [`syscall`] folded into a Result.
///
/// # Safety
/// As [`syscall`].
#[inline]
pub unsafe fn call(nr: libc::c_long, a: [usize; 6]) -> Result<usize, Errno> {
    // SAFETY: the caller upholds the contract of `nr`.
    let r = unsafe { syscall(nr, a) };
    if (-4095..0).contains(&r) {
        #[allow(clippy::cast_possible_truncation, reason = "checked: -4095..0")]
        Err(Errno(-r as i32))
    } else {
        #[allow(clippy::cast_sign_loss, reason = "checked: not an error, so the kernel's value")]
        Ok(r as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_come_back_as_errno_and_leave_errno_alone() {
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = 1234 };
        // close(-1): EBADF, no side effect.
        // SAFETY: closing an invalid descriptor touches nothing.
        let r = unsafe { call(libc::SYS_close, [usize::MAX, 0, 0, 0, 0, 0]) };
        assert_eq!(r, Err(Errno(libc::EBADF)));
        // SAFETY: as above.
        assert_eq!(unsafe { *libc::__errno_location() }, 1234);
        // SAFETY: getpid has no arguments and no side effect.
        let pid = unsafe { call(libc::SYS_getpid, [0; 6]) }.unwrap();
        assert_eq!(pid, std::process::id() as usize);
    }
}
