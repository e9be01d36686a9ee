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

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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

/// `UFFDIO_REGISTER_MODE_MISSING`: report faults on pages that have no PTE.
const REGISTER_MODE_MISSING: u64 = 1;

/// Message types (`UFFD_EVENT_*`).
const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;
/// `UFFD_PAGEFAULT_FLAG_WRITE`.
const PAGEFAULT_FLAG_WRITE: u64 = 1;

/// The `UFFD_FEATURE_*` bits zerofault knows about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features(pub u64);

impl Features {
    pub const EVENT_FORK: u64 = 1 << 1;
    pub const EVENT_REMAP: u64 = 1 << 2;
    pub const EVENT_REMOVE: u64 = 1 << 3;
    pub const EVENT_UNMAP: u64 = 1 << 6;
    pub const THREAD_ID: u64 = 1 << 8;
    pub const MOVE: u64 = 1 << 16;

    /// What the engine asks for when the kernel offers it.
    pub const WANTED: u64 = Self::EVENT_REMAP | Self::EVENT_REMOVE | Self::EVENT_UNMAP | Self::THREAD_ID | Self::MOVE;

    pub fn has(self, bit: u64) -> bool {
        self.0 & bit == bit
    }
}

/// Why a userfaultfd could not be set up.
#[derive(Debug)]
pub enum UffdError {
    /// Neither /dev/userfaultfd nor the userfaultfd(2) syscall gave a descriptor.
    Open { dev: io::Error, syscall: io::Error },
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
    pub errno: Option<i32>,
}

/// One message read from the userfaultfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// A thread touched a missing page. `tid` is 0 without `THREAD_ID`.
    PageFault { addr: usize, write: bool, tid: u32 },
    /// `madvise(MADV_DONTNEED / MADV_REMOVE / MADV_FREE)` dropped `[start, end)`.
    Remove { start: usize, end: usize },
    /// `munmap` (or `mmap(MAP_FIXED)` over it) unmapped `[start, end)`.
    Unmap { start: usize, end: usize },
    /// `mremap` moved `len` bytes from `from` to `to`.
    Remap { from: usize, to: usize, len: usize },
    /// A fork event (not requested; listed so that it is never mistaken for a fault).
    Fork,
    /// Anything newer than this wrapper.
    Unknown(u8),
}

/// `struct uffd_msg`: 32 bytes, the event type then a 24-byte union.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RawMsg {
    event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    arg: [u64; 3],
}

impl RawMsg {
    /// Decodes the union according to the event type.
    pub fn decode(&self) -> Msg {
        let [a0, a1, a2] = self.arg;
        match self.event {
            EVENT_PAGEFAULT => Msg::PageFault {
                addr: a1 as usize,
                write: a0 & PAGEFAULT_FLAG_WRITE != 0,
                tid: a2 as u32,
            },
            EVENT_REMOVE => Msg::Remove {
                start: a0 as usize,
                end: a1 as usize,
            },
            EVENT_UNMAP => Msg::Unmap {
                start: a0 as usize,
                end: a1 as usize,
            },
            EVENT_REMAP => Msg::Remap {
                from: a0 as usize,
                to: a1 as usize,
                len: a2 as usize,
            },
            EVENT_FORK => Msg::Fork,
            other => Msg::Unknown(other),
        }
    }
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

/// An open, handshaken userfaultfd (non-blocking, close-on-exec).
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: Features,
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Opens a raw userfaultfd: /dev/userfaultfd first (works for non-root users given access to
/// the device), then the syscall (root, or `vm.unprivileged_userfaultfd=1`). Never with
/// `UFFD_USER_MODE_ONLY`: faults taken inside the kernel (a `read()` into fresh memory) must
/// reach us too, or those syscalls would fail with EFAULT.
fn open_raw() -> Result<OwnedFd, UffdError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: open() with a NUL-terminated literal path; the result is checked before use.
    let dev = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    let dev_err = if dev >= 0 {
        // SAFETY: `dev` is the descriptor we just opened and own.
        let dev = unsafe { OwnedFd::from_raw_fd(dev) };
        // SAFETY: USERFAULTFD_IOC_NEW takes an int of open flags and returns a new fd or -1.
        let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW, flags) };
        if fd >= 0 {
            // SAFETY: the ioctl returned a fresh descriptor that nobody else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        io::Error::last_os_error()
    } else {
        io::Error::last_os_error()
    };
    // SAFETY: userfaultfd(2) takes one int of flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        // SAFETY: the syscall returned a fresh descriptor that nobody else owns.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    }
    Err(UffdError::Open {
        dev: dev_err,
        syscall: io::Error::last_os_error(),
    })
}

/// UFFDIO_API on `fd`, asking for `features`; returns what the kernel offers.
fn handshake(fd: &OwnedFd, features: u64) -> io::Result<u64> {
    let mut api = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes a `struct uffdio_api`, which `api` is (repr(C)).
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(api.features)
}

impl Uffd {
    /// Opens a userfaultfd with every feature of [`Features::WANTED`] the kernel offers.
    ///
    /// The API handshake may be done once per descriptor, so a first descriptor asks for nothing
    /// and learns what is offered, and a second one asks for the subset we want.
    pub fn open() -> Result<Uffd, UffdError> {
        let offered = handshake(&open_raw()?, 0).map_err(UffdError::Api)?;
        let fd = open_raw()?;
        let want = offered & Features::WANTED;
        handshake(&fd, want).map_err(UffdError::Api)?;
        Ok(Uffd {
            fd,
            features: Features(want),
        })
    }

    /// The features this descriptor was opened with.
    pub fn features(&self) -> Features {
        self.features
    }

    /// The descriptor, for poll(2).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn range_ioctl(&self, req: libc::c_ulong, start: usize, len: usize) -> io::Result<()> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: UNREGISTER and WAKE take a `struct uffdio_range`, which `r` is (repr(C)).
        // The kernel validates the range itself; no memory of ours is accessed through it.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), req, &mut r) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Registers `[start, start + len)` (page aligned) for missing-page faults.
    pub fn register(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a `struct uffdio_register`, which `r` is.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER, &mut r) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Unregisters `[start, start + len)`: the kernel serves its faults natively from now on,
    /// and threads blocked on faults there are woken. Pages already present stay.
    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        self.range_ioctl(UFFDIO_UNREGISTER, start, len)
    }

    /// Wakes threads blocked on faults in `[start, start + len)`; they retry their access.
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
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
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), req, &mut t) };
        let err = if rc != 0 { Some(errno()) } else { None };
        progress(len, t.result, err)
    }

    /// UFFDIO_COPY `len` bytes from `src` into the missing pages at `dst`.
    pub fn copy(&self, dst: usize, src: usize, len: usize) -> Progress {
        self.transfer(UFFDIO_COPY, dst, src, len, 0)
    }

    /// UFFDIO_MOVE the pages at `src` (exclusive anonymous pages of this process) to `dst`.
    /// Zero-copy: the page frames change owner, no byte is written.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize) -> Progress {
        self.transfer(UFFDIO_MOVE, dst, src, len, 0)
    }

    /// UFFDIO_ZEROPAGE: map the shared zero page read-only at the missing pages of the range.
    pub fn zeropage(&self, dst: usize, len: usize) -> Progress {
        let mut z = UffdioZeropage {
            range: UffdioRange {
                start: dst as u64,
                len: len as u64,
            },
            mode: 0,
            result: 0,
        };
        // SAFETY: UFFDIO_ZEROPAGE reads and writes a `struct uffdio_zeropage`, which `z` is.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_ZEROPAGE, &mut z) };
        let err = if rc != 0 { Some(errno()) } else { None };
        progress(len, z.result, err)
    }

    /// Reads as many pending messages as fit in `buf` without blocking. Returns 0 when none is
    /// pending.
    pub fn read(&self, buf: &mut [RawMsg]) -> io::Result<usize> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: `buf` is valid for writes of `bytes` bytes; RawMsg is plain old data for which
        // every bit pattern is valid, and the kernel writes whole 32-byte messages.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), bytes) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize / std::mem::size_of::<RawMsg>())
    }
}

/// Folds an ioctl's return code and its result field into a [`Progress`]. The result field holds
/// the bytes done, or a negative errno when nothing was done.
fn progress(len: usize, result: i64, err: Option<i32>) -> Progress {
    match err {
        None => Progress { done: len, errno: None },
        Some(e) => Progress {
            done: result.max(0) as usize,
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
    fn messages_decode_by_event_type() {
        let m = RawMsg {
            event: EVENT_PAGEFAULT,
            arg: [PAGEFAULT_FLAG_WRITE, 0x7000, 42],
            ..Default::default()
        };
        assert_eq!(
            m.decode(),
            Msg::PageFault {
                addr: 0x7000,
                write: true,
                tid: 42
            }
        );
        let m = RawMsg {
            event: EVENT_REMAP,
            arg: [1, 2, 3],
            ..Default::default()
        };
        assert_eq!(m.decode(), Msg::Remap { from: 1, to: 2, len: 3 });
        let m = RawMsg {
            event: EVENT_UNMAP,
            arg: [4, 8, 0],
            ..Default::default()
        };
        assert_eq!(m.decode(), Msg::Unmap { start: 4, end: 8 });
        let m = RawMsg {
            event: 0x77,
            ..Default::default()
        };
        assert_eq!(m.decode(), Msg::Unknown(0x77));
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
            progress(8192, 4096, Some(libc::EAGAIN)),
            Progress {
                done: 4096,
                errno: Some(libc::EAGAIN)
            }
        );
        assert_eq!(
            progress(8192, -17, Some(libc::EEXIST)),
            Progress {
                done: 0,
                errno: Some(libc::EEXIST)
            }
        );
    }
}
