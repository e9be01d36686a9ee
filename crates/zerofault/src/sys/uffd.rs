//! userfaultfd(2): our own thin wrapper.
//!
//! No published crate wraps `UFFDIO_MOVE` (Linux 6.8), so the ABI is spelled out here from
//! `include/uapi/linux/userfaultfd.h`. Every ioctl is one function whose doc states its contract;
//! the rest of the engine never sees a raw fd or an `errno`.
//!
//! Partial progress (the rules measured in `shared/notes/uffd-facts.md`): `COPY`, `ZEROPAGE`
//! and `MOVE` fail with `EEXIST` when the *first* destination page is already present, and with
//! `EAGAIN` plus a byte count when they stopped part way (a present page, a source hole, or a
//! pending non-cooperative event: `mmap_changing`). Only the bytes actually installed are woken.
//! [`Progress`] carries both numbers so that the caller decides what to skip and what to retry.
//!
//! The messages it delivers are decoded in [`super::uffd_msg`], re-exported here.

use super::raw::{self, Errno};
use crate::page::index;
use std::io;
use std::os::fd::RawFd;

pub(crate) use super::uffd_msg::{Msg, RawMsg};

/// The API version handshake constant, `UFFD_API`.
const UFFD_API: u64 = 0xAA;

/// `_IOWR(0xAA, 0x3F, struct uffdio_api)`.
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
/// `_IOWR(0xAA, 0x00, struct uffdio_register)`.
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
/// `_IOR(0xAA, 0x01, struct uffdio_range)`.
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_AA01;
/// `_IOR(0xAA, 0x02, struct uffdio_range)`.
const UFFDIO_WAKE: libc::c_ulong = 0x8010_AA02;
/// `_IOWR(0xAA, 0x03, struct uffdio_copy)`.
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
/// `_IOWR(0xAA, 0x04, struct uffdio_zeropage)`.
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xC020_AA04;
/// `_IOWR(0xAA, 0x05, struct uffdio_move)`.
const UFFDIO_MOVE: libc::c_ulong = 0xC028_AA05;
/// `_IO(0xAA, 0x00)` on `/dev/userfaultfd`: a new userfaultfd, as the syscall would give.
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xAA00;

/// `UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES`: a hole in the source moves as a hole.
pub(crate) const MOVE_ALLOW_SRC_HOLES: u64 = 2;

/// `UFFDIO_REGISTER_MODE_MISSING`: report faults on pages that have no PTE.
const REGISTER_MODE_MISSING: u64 = 1;
/// `UFFDIO_REGISTER_MODE_WP`: report writes to write-protected pages (of which the engine makes
/// none: see [`Uffd::register_as_destination`]).
const REGISTER_MODE_WP: u64 = 2;

/// The `UFFD_FEATURE_*` bits zerofault knows about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features(pub u64);

impl Features {
    /// `UFFD_FEATURE_EVENT_FORK`: fork events (never asked for).
    pub const EVENT_FORK: u64 = 1 << 1;
    /// `UFFD_FEATURE_EVENT_REMAP`: mremap events.
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// `UFFD_FEATURE_EVENT_REMOVE`: madvise(DONTNEED/REMOVE/FREE) events.
    pub const EVENT_REMOVE: u64 = 1 << 3;
    /// `UFFD_FEATURE_EVENT_UNMAP`: munmap events.
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// `UFFD_FEATURE_THREAD_ID`: the faulting thread's id in each fault message.
    pub const THREAD_ID: u64 = 1 << 8;
    /// `UFFD_FEATURE_MOVE`: `UFFDIO_MOVE` (Linux 6.8).
    pub const MOVE: u64 = 1 << 16;

    /// What the engine asks for when the kernel offers it.
    pub const WANTED: u64 = Self::EVENT_REMAP | Self::EVENT_REMOVE | Self::EVENT_UNMAP | Self::THREAD_ID | Self::MOVE;

    /// Whether every bit of `bit` is set.
    pub fn has(self, bit: u64) -> bool {
        self.0 & bit == bit
    }
}

/// Why a userfaultfd could not be set up.
#[derive(Debug)]
pub enum UffdError {
    /// Neither /dev/userfaultfd nor the userfaultfd(2) syscall gave a descriptor.
    Open {
        /// Why `/dev/userfaultfd` gave none.
        dev: io::Error,
        /// Why userfaultfd(2) gave none.
        syscall: io::Error,
    },
    /// The UFFDIO_API handshake failed.
    Api(io::Error),
}

impl std::fmt::Display for UffdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UffdError::Open { dev, syscall } => write!(
                f,
                "cannot open a userfaultfd (/dev/userfaultfd: {dev}; userfaultfd(2): {syscall}); \
                 needs root, access to /dev/userfaultfd, or vm.unprivileged_userfaultfd=1"
            ),
            UffdError::Api(e) => write!(f, "UFFDIO_API handshake failed: {e}"),
        }
    }
}

impl std::error::Error for UffdError {}

/// How far an installing ioctl got before it stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Bytes installed (and woken, unless DONTWAKE) from the start of the range.
    pub done: usize,
    /// `None` when the whole range was installed; otherwise the errno it stopped with.
    pub errno: Option<Errno>,
}

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct uffdio_copy` and `struct uffdio_move` share this layout: dst, src, len, mode, result.
#[repr(C)]
struct UffdioTransfer {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    result: i64,
}

#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    result: i64,
}

/// A descriptor the engine owns, closed on drop only while it is still the file the engine
/// opened: a program may close descriptors it does not know (`closefrom`, `close_range`) and
/// get the number back for a file of its own, which the engine must then never read, ioctl or
/// close.
#[derive(Debug)]
pub(crate) struct Fd {
    fd: RawFd,
    /// `(st_dev, st_ino)` at open: each userfaultfd has an inode of its own.
    id: (u64, u64),
}

/// A descriptor's number and identity, apart from its owner: for a forked child, which closes
/// its copy without touching the lock its owner lives behind.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FdIdentity {
    fd: RawFd,
    id: (u64, u64),
}

impl FdIdentity {
    /// Whether descriptor `fd` is this one (the number, still naming the same file).
    pub(crate) fn is(&self, fd: RawFd) -> bool {
        self.fd == fd && file_id(fd) == Ok(self.id)
    }

    /// The number and `(st_dev, st_ino)`, for code outside the engine that closes a copy of
    /// the descriptor in a process sharing the memory (the shim's front, in a clone child).
    pub(crate) fn parts(&self) -> (RawFd, (u64, u64)) {
        (self.fd, self.id)
    }

    /// Whether the number still names this file (in the calling thread's table).
    pub(crate) fn present(&self) -> bool {
        file_id(self.fd) == Ok(self.id)
    }

    /// Closes the descriptor if its number still names the same file. Async-signal-safe
    /// (fstat and close).
    ///
    /// # Safety
    /// No owner in this process uses or closes the descriptor again.
    pub(crate) unsafe fn close_if_same(&self) {
        if file_id(self.fd) == Ok(self.id) {
            close_raw(self.fd);
        }
    }
}

/// `(st_dev, st_ino)` of an open descriptor.
fn file_id(fd: RawFd) -> Result<(u64, u64), Errno> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one `struct stat` into `st`.
    unsafe {
        raw::call(
            libc::SYS_fstat,
            [raw::int_arg(fd), &mut st as *mut libc::stat as usize, 0, 0, 0, 0],
        )
    }?;
    Ok((st.st_dev, st.st_ino))
}

/// The descriptor number a new engine descriptor is moved to: high, below both the soft
/// RLIMIT_NOFILE and 1024, so that programs that hand out low numbers themselves (`dup2(x, 3)`)
/// or assume them do not meet it.
fn high_fd_floor() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64(0, RLIMIT_NOFILE, NULL, &lim) reads our own limit into `lim`.
    let r = unsafe {
        raw::call(
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
    let soft = if r.is_ok() { index(lim.rlim_cur) } else { 1024 };
    soft.min(1024).saturating_sub(1)
}

impl Fd {
    /// Takes a fresh descriptor, moved to a high number where one is free.
    fn adopt(fd: RawFd) -> Result<Fd, Errno> {
        let mut fd = fd;
        let floor = high_fd_floor();
        if raw::int_arg(fd) < floor {
            // SAFETY: F_DUPFD_CLOEXEC duplicates our own descriptor to the lowest free number at
            // or above `floor`.
            let dup = unsafe {
                raw::call(
                    libc::SYS_fcntl,
                    [raw::int_arg(fd), raw::int_arg(libc::F_DUPFD_CLOEXEC), floor, 0, 0, 0],
                )
            };
            if let Ok(d) = dup {
                close_raw(fd);
                fd = raw::fd_of(d);
            }
        }
        match file_id(fd) {
            Ok(id) => Ok(Fd { fd, id }),
            Err(e) => {
                close_raw(fd);
                Err(e)
            }
        }
    }

    /// The descriptor number.
    pub(crate) fn raw(&self) -> RawFd {
        self.fd
    }

    /// Whether the number still names the file the engine opened.
    pub(crate) fn still_ours(&self) -> bool {
        file_id(self.fd) == Ok(self.id)
    }
}

fn close_raw(fd: RawFd) {
    // SAFETY: closes a descriptor the caller owns; nothing else is touched.
    let _ = unsafe { raw::call(libc::SYS_close, [raw::int_arg(fd), 0, 0, 0, 0, 0]) };
}

impl Drop for Fd {
    fn drop(&mut self) {
        if self.still_ours() {
            close_raw(self.fd);
        }
    }
}

/// An open, handshaken userfaultfd (non-blocking, close-on-exec).
#[derive(Debug)]
pub(crate) struct Uffd {
    fd: Fd,
    features: Features,
}

/// Opens a raw userfaultfd: /dev/userfaultfd first (works for non-root users given access to
/// the device), then the syscall (root, or `vm.unprivileged_userfaultfd=1`). Never with
/// `UFFD_USER_MODE_ONLY`: faults taken inside the kernel (a `read()` into fresh memory) must
/// reach us too, or those syscalls would fail with EFAULT.
fn open_raw() -> Result<RawFd, UffdError> {
    let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as usize;
    let path = c"/dev/userfaultfd";
    // SAFETY: openat() with a NUL-terminated literal path; the result is checked before use.
    let dev = unsafe {
        raw::call(
            libc::SYS_openat,
            [
                raw::int_arg(libc::AT_FDCWD),
                path.as_ptr() as usize,
                (libc::O_RDWR | libc::O_CLOEXEC) as usize,
                0,
                0,
                0,
            ],
        )
    };
    let dev_err = match dev {
        Ok(dev) => {
            // SAFETY: USERFAULTFD_IOC_NEW takes an int of open flags and returns a new fd.
            let fd = unsafe {
                raw::call(
                    libc::SYS_ioctl,
                    [dev, raw::ulong_arg(USERFAULTFD_IOC_NEW), flags, 0, 0, 0],
                )
            };
            close_raw(raw::fd_of(dev));
            match fd {
                Ok(fd) => return Ok(raw::fd_of(fd)),
                Err(e) => e,
            }
        }
        Err(e) => e,
    };
    // SAFETY: userfaultfd(2) takes one int of flags and returns a new fd.
    match unsafe { raw::call(libc::SYS_userfaultfd, [flags, 0, 0, 0, 0, 0]) } {
        Ok(fd) => Ok(raw::fd_of(fd)),
        Err(e) => Err(UffdError::Open {
            dev: dev_err.to_io(),
            syscall: e.to_io(),
        }),
    }
}

/// UFFDIO_API on `fd`, asking for `features`; returns what the kernel offers.
fn handshake(fd: RawFd, features: u64) -> Result<u64, Errno> {
    let mut api = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes a `struct uffdio_api`, which `api` is (repr(C)).
    unsafe { ioctl(fd, UFFDIO_API, &mut api as *mut UffdioApi as usize) }?;
    Ok(api.features)
}

/// ioctl(2) as a raw system call.
///
/// # Safety
/// `arg` must be what request `req` reads and writes.
unsafe fn ioctl(fd: RawFd, req: libc::c_ulong, arg: usize) -> Result<usize, Errno> {
    // SAFETY: the caller passes the argument the request expects.
    unsafe { raw::call(libc::SYS_ioctl, [raw::int_arg(fd), raw::ulong_arg(req), arg, 0, 0, 0]) }
}

impl Uffd {
    /// Opens a userfaultfd with every feature of [`Features::WANTED`] the kernel offers.
    ///
    /// The API handshake may be done once per descriptor, so a first descriptor asks for nothing
    /// and learns what is offered, and a second one asks for the subset we want. Only the second
    /// stays open.
    pub(crate) fn open() -> Result<Uffd, UffdError> {
        let probe = open_raw()?;
        let offered = handshake(probe, 0);
        close_raw(probe);
        let offered = offered.map_err(|e| UffdError::Api(e.to_io()))?;
        let fd = open_raw()?;
        let want = offered & Features::WANTED;
        if let Err(e) = handshake(fd, want) {
            close_raw(fd);
            return Err(UffdError::Api(e.to_io()));
        }
        let fd = Fd::adopt(fd).map_err(|e| UffdError::Api(e.to_io()))?;
        Ok(Uffd {
            fd,
            features: Features(want),
        })
    }

    /// The features this descriptor was opened with.
    pub(crate) fn features(&self) -> Features {
        self.features
    }

    /// The descriptor number.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.raw()
    }

    /// The descriptor's number and identity (see [`FdIdentity`]).
    pub(crate) fn identity(&self) -> FdIdentity {
        FdIdentity {
            fd: self.fd.fd,
            id: self.fd.id,
        }
    }

    /// Whether the descriptor still is this userfaultfd (the program did not close it).
    pub(crate) fn still_ours(&self) -> bool {
        self.fd.still_ours()
    }

    fn range_ioctl(&self, req: libc::c_ulong, start: usize, len: usize) -> Result<(), Errno> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: UNREGISTER and WAKE take a `struct uffdio_range`, which `r` is (repr(C)).
        // The kernel validates the range itself; no memory of ours is accessed through it.
        unsafe { ioctl(self.raw_fd(), req, &mut r as *mut UffdioRange as usize) }?;
        Ok(())
    }

    /// Registers `[start, start + len)` (page aligned) for missing-page faults.
    ///
    /// # Safety
    /// Anonymous private memory whose missing pages, from now on, only this descriptor's
    /// handler installs: a fault there waits for it (or for the descriptor to close).
    pub(crate) unsafe fn register(&self, start: usize, len: usize) -> Result<(), Errno> {
        // SAFETY: this function's contract.
        unsafe { self.register_mode(start, len, REGISTER_MODE_MISSING) }
    }

    /// Registers `[start, start + len)` (page aligned, the engine's own memory) so that
    /// `UFFDIO_MOVE` may move pages *into* it (the kernel wants every destination registered
    /// with the descriptor), and for nothing else: write-protect mode, with no page ever
    /// write-protected, reports no fault at all. Its missing pages stay the kernel's to fill
    /// (`MADV_POPULATE_WRITE` and plain writes work as before; seen on Linux 6.18).
    pub(crate) fn register_as_destination(&self, start: usize, len: usize) -> Result<(), Errno> {
        // SAFETY: write-protect mode changes no fault of the range until a page is
        // write-protected with UFFDIO_WRITEPROTECT, which the engine never calls.
        unsafe { self.register_mode(start, len, REGISTER_MODE_WP) }
    }

    /// UFFDIO_REGISTER with `mode`.
    ///
    /// # Safety
    /// As [`Uffd::register`] for the faults `mode` reports.
    unsafe fn register_mode(&self, start: usize, len: usize, mode: u64) -> Result<(), Errno> {
        let mut r = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a `struct uffdio_register`, which `r` is.
        unsafe { ioctl(self.raw_fd(), UFFDIO_REGISTER, &mut r as *mut UffdioRegister as usize) }?;
        Ok(())
    }

    /// Unregisters `[start, start + len)`: the kernel serves its faults natively from now on,
    /// and threads blocked on faults there are woken. Pages already present stay.
    pub(crate) fn unregister(&self, start: usize, len: usize) -> Result<(), Errno> {
        self.range_ioctl(UFFDIO_UNREGISTER, start, len)
    }

    /// Wakes threads blocked on faults in `[start, start + len)`; they retry their access.
    pub(crate) fn wake(&self, start: usize, len: usize) -> Result<(), Errno> {
        self.range_ioctl(UFFDIO_WAKE, start, len)
    }

    fn transfer(&self, req: libc::c_ulong, dst: usize, src: usize, len: usize, mode: u64) -> Progress {
        let mut t = UffdioTransfer {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode,
            result: 0,
        };
        // SAFETY: COPY and MOVE take a `struct uffdio_copy` / `struct uffdio_move`; both have the
        // layout of `UffdioTransfer` (repr(C)). The kernel checks that dst lies in a range
        // registered with this descriptor and that src is readable (COPY) or movable (MOVE);
        // MOVE takes the source pages away from `src`, which callers own (the pool).
        let r = unsafe { ioctl(self.raw_fd(), req, &mut t as *mut UffdioTransfer as usize) };
        progress(len, t.result, r.err())
    }

    /// UFFDIO_COPY `len` bytes from `src` into the missing pages at `dst`.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes, and its bytes must be what the program may see
    /// at `dst`: the pages appear there as if the program had written them.
    pub(crate) unsafe fn copy(&self, dst: usize, src: usize, len: usize) -> Progress {
        self.transfer(UFFDIO_COPY, dst, src, len, 0)
    }

    /// UFFDIO_MOVE the pages at `src` (exclusive anonymous pages of this process) to `dst`.
    /// Zero-copy: the page frames change owner, no byte is written.
    ///
    /// # Safety
    /// The caller owns `[src, src + len)`: no one reads or writes it while the move runs, and
    /// it reads as missing afterwards. Its bytes must be what the program may see at `dst`.
    pub(crate) unsafe fn move_pages(&self, dst: usize, src: usize, len: usize) -> Progress {
        self.transfer(UFFDIO_MOVE, dst, src, len, 0)
    }

    /// [`Uffd::move_pages`] with `UFFDIO_MOVE_MODE_*` bits (see [`MOVE_ALLOW_SRC_HOLES`]).
    ///
    /// # Safety
    /// As [`Uffd::move_pages`].
    pub(crate) unsafe fn move_pages_mode(&self, dst: usize, src: usize, len: usize, mode: u64) -> Progress {
        self.transfer(UFFDIO_MOVE, dst, src, len, mode)
    }

    /// UFFDIO_ZEROPAGE: map the shared zero page read-only at the missing pages of the range.
    pub(crate) fn zeropage(&self, dst: usize, len: usize) -> Progress {
        let mut z = UffdioZeropage {
            range: UffdioRange {
                start: dst as u64,
                len: len as u64,
            },
            mode: 0,
            result: 0,
        };
        // SAFETY: UFFDIO_ZEROPAGE reads and writes a `struct uffdio_zeropage`, which `z` is.
        let r = unsafe { ioctl(self.raw_fd(), UFFDIO_ZEROPAGE, &mut z as *mut UffdioZeropage as usize) };
        progress(len, z.result, r.err())
    }

    /// Reads as many pending messages as fit in `buf` without blocking. Returns 0 when none is
    /// pending.
    pub(crate) fn read(&self, buf: &mut [RawMsg]) -> Result<usize, Errno> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: `buf` is valid for writes of `bytes` bytes; RawMsg is plain old data for which
        // every bit pattern is valid, and the kernel writes whole 32-byte messages.
        let r = unsafe {
            raw::call(
                libc::SYS_read,
                [raw::int_arg(self.raw_fd()), buf.as_mut_ptr() as usize, bytes, 0, 0, 0],
            )
        };
        match r {
            Ok(n) if n % std::mem::size_of::<RawMsg>() == 0 => Ok(n / std::mem::size_of::<RawMsg>()),
            // Not a userfaultfd's answer: the number names another file now.
            Ok(_) => Err(Errno(libc::EBADF)),
            Err(Errno(libc::EAGAIN)) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Whether a message is pending now, without blocking (POLLIN). A closed or broken
    /// descriptor (POLLNVAL, POLLERR, POLLHUP) counts as ready, so that the caller's read
    /// finds out; a failed poll (EINTR, ENOMEM) is the error.
    pub(crate) fn ready(&self) -> Result<bool, Errno> {
        self.poll(Some(std::time::Duration::ZERO)).map(|revents| revents != 0)
    }

    /// Blocks until a message is pending (or the descriptor is closed or broken), or at most
    /// `timeout`. EINTR and the timeout count as ready: the caller reads, finds nothing, and
    /// waits again.
    pub(crate) fn wait(&self, timeout: Option<std::time::Duration>) -> Result<(), Errno> {
        match self.poll(timeout) {
            Ok(revents) if revents & libc::POLLNVAL != 0 => Err(Errno(libc::EBADF)),
            Ok(_) | Err(Errno(libc::EINTR)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One ppoll for POLLIN, for at most `timeout` (`None`: until something happens): the
    /// events it returned (0: the time ran out).
    fn poll(&self, timeout: Option<std::time::Duration>) -> Result<libc::c_short, Errno> {
        let mut p = libc::pollfd {
            fd: self.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Mutable: the kernel writes the time left back into it.
        let mut ts = timeout.map(|t| libc::timespec {
            tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(t.subsec_nanos()),
        });
        let tsp = ts.as_mut().map_or(0, |t| t as *mut libc::timespec as usize);
        // SAFETY: ppoll on one valid pollfd, with no timeout or a valid, writable timespec, no
        // signal mask change.
        let r = unsafe { raw::call(libc::SYS_ppoll, [&mut p as *mut libc::pollfd as usize, 1, tsp, 0, 0, 0]) };
        r.map(|_| p.revents)
    }
}

/// Folds an ioctl's return code and its result field into a [`Progress`]. The result field holds
/// the bytes done, or a negative errno when nothing was done.
fn progress(len: usize, result: i64, err: Option<Errno>) -> Progress {
    match err {
        None => Progress { done: len, errno: None },
        Some(e) => Progress {
            done: usize::try_from(result).unwrap_or(0),
            errno: Some(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_encoding() {
        // _IOC(dir, type, nr, size) = dir << 30 | size << 16 | type << 8 | nr
        let ioc = |dir: u64, nr: u64, size: usize| (dir << 30 | (size as u64) << 16 | 0xAA << 8 | nr) as libc::c_ulong;
        assert_eq!(UFFDIO_API, ioc(3, 0x3F, std::mem::size_of::<UffdioApi>()));
        assert_eq!(UFFDIO_REGISTER, ioc(3, 0x00, std::mem::size_of::<UffdioRegister>()));
        assert_eq!(UFFDIO_UNREGISTER, ioc(2, 0x01, std::mem::size_of::<UffdioRange>()));
        assert_eq!(UFFDIO_WAKE, ioc(2, 0x02, std::mem::size_of::<UffdioRange>()));
        assert_eq!(UFFDIO_COPY, ioc(3, 0x03, std::mem::size_of::<UffdioTransfer>()));
        assert_eq!(UFFDIO_ZEROPAGE, ioc(3, 0x04, std::mem::size_of::<UffdioZeropage>()));
        assert_eq!(UFFDIO_MOVE, ioc(3, 0x05, std::mem::size_of::<UffdioTransfer>()));
        assert_eq!(std::mem::size_of::<RawMsg>(), 32);
    }

    #[test]
    fn ready_says_whether_a_message_is_pending() {
        // The mapping first, so that it is unmapped after the descriptor closes, even when an
        // assertion fails: an unmap while the descriptor is open waits for its UNMAP event to
        // be read.
        let m = crate::sys::mman::Mapping::new(4096, crate::sys::mman::Thp::Never).unwrap();
        let u = match Uffd::open() {
            Ok(u) => u,
            Err(e) => {
                assert!(
                    std::env::var_os("ZEROFAULT_REQUIRE_UFFD").is_none(),
                    "userfaultfd is required: {e}"
                );
                return;
            }
        };
        let a = m.as_ptr() as usize;
        // SAFETY: the test's own anonymous page, whose fault this test answers below.
        unsafe { u.register(a, 4096) }.unwrap();
        assert_eq!(u.ready(), Ok(false), "nothing pending yet");
        let reader = std::thread::spawn(move || {
            // SAFETY: the mapping lives until this thread is joined.
            unsafe { (a as *const u8).read_volatile() }
        });
        let t0 = std::time::Instant::now();
        while u.ready() != Ok(true) {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "the fault never came"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut buf = [RawMsg::default(); 1];
        assert_eq!(u.read(&mut buf), Ok(1));
        assert!(
            matches!(buf[0].decode(), Msg::PageFault { .. }),
            "{:?}",
            buf[0].decode()
        );
        assert_eq!(u.ready(), Ok(false), "the one message was read");
        assert_eq!(u.zeropage(a, 4096).errno, None);
        assert_eq!(reader.join().unwrap(), 0);
    }

    #[test]
    fn progress_reports_partial_bytes_and_errno() {
        assert_eq!(
            progress(8192, 0, None),
            Progress {
                done: 8192,
                errno: None
            }
        );
        assert_eq!(
            progress(8192, 4096, Some(Errno(libc::EAGAIN))),
            Progress {
                done: 4096,
                errno: Some(Errno(libc::EAGAIN))
            }
        );
        assert_eq!(
            progress(8192, -17, Some(Errno(libc::EEXIST))),
            Progress {
                done: 0,
                errno: Some(Errno(libc::EEXIST))
            }
        );
    }
}
