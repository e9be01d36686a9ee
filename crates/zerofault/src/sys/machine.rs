//! The machine-wide state's file: one page, shared by every process of this user under the
//! shim (`crate::pool::machine` says what it holds and why). Here: where it is, and opening it only
//! when it is safe to trust.
//!
//! The file is `$XDG_RUNTIME_DIR/zerofault-3.machine` when that directory is set, is ours and
//! is closed to others (mode 0700, the systemd user runtime directory), else
//! `/dev/shm/zerofault-<euid>-3.machine`. The 3 is the layout's version (`crate::pool::machine`'s
//! header): engines of another version use another file, and neither locks the other out. It is opened without following a symbolic link and
//! used only if it is a regular file owned by this effective user, with no permission for
//! group or others, of exactly one page; a file just made is given that size and its header.
//! Anything else (another owner, group or world access, another size, a directory, a link, a
//! header that is not ours) is refused with a reason, and the engine works as if alone.

use super::raw::{self, Errno};
use crate::page::PAGE_SIZE;
use std::ffi::CString;
use std::fmt;

/// Why the file was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No directory to put it in, or a path too long.
    NoPlace,
    /// A system call failed (open, fstat, ftruncate, mmap).
    Call(&'static str, i32),
    /// A symbolic link where the file should be.
    Link,
    /// Not a regular file.
    NotFile,
    /// Owned by another user.
    Owner(u32),
    /// Readable or writable by group or others.
    Mode(u32),
    /// Not one page long.
    Size(u64),
    /// More than one name links to it (a hard link made elsewhere).
    Links(u64),
    /// The header is not ours (another program's file, or a version we do not know).
    Header,
    /// Every slot is held by a live process.
    Full,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::NoPlace => write!(f, "no runtime directory to put it in"),
            Refused::Call(what, e) => write!(f, "{what} failed (errno {e})"),
            Refused::Link => write!(f, "it is a symbolic link"),
            Refused::NotFile => write!(f, "it is not a regular file"),
            Refused::Owner(uid) => write!(f, "it belongs to uid {uid}, not to this user"),
            Refused::Mode(m) => write!(f, "its mode {m:o} lets group or others in (0600 expected)"),
            Refused::Size(n) => write!(f, "it is {n} bytes long, not one page"),
            Refused::Links(n) => write!(f, "it has {n} names (hard links)"),
            Refused::Header => write!(f, "its header is not zerofault's machine state"),
            Refused::Full => write!(f, "every slot is held by a live process"),
        }
    }
}

/// The effective user id.
fn euid() -> u32 {
    // SAFETY: geteuid takes no argument and cannot fail.
    let r = unsafe { raw::syscall(libc::SYS_geteuid, [0; 6]) };
    u32::try_from(r).unwrap_or(u32::MAX)
}

/// `fstatat`/`fstat` of a path or descriptor.
fn stat_of(fd: Option<usize>, path: &CString, follow: bool) -> Result<libc::stat, Errno> {
    // SAFETY: zeroed is a valid `stat` (plain integers).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let (dirfd, p, flags) = match fd {
        Some(fd) => (fd, c"".as_ptr(), libc::AT_EMPTY_PATH),
        None => (
            raw::int_arg(libc::AT_FDCWD),
            path.as_ptr(),
            if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW },
        ),
    };
    // SAFETY: newfstatat writes one `stat` into `st`; the path is NUL-terminated.
    unsafe {
        raw::call(
            libc::SYS_newfstatat,
            [
                dirfd,
                p as usize,
                &mut st as *mut libc::stat as usize,
                raw::int_arg(flags),
                0,
                0,
            ],
        )
    }?;
    Ok(st)
}

/// The file's path, from `XDG_RUNTIME_DIR` (as `runtime_dir`, read by the caller) when that
/// directory is ours and closed to others, else in /dev/shm.
pub(crate) fn path(runtime_dir: Option<&str>) -> Option<CString> {
    let uid = euid();
    if let Some(dir) = runtime_dir.filter(|d| d.starts_with('/')) {
        let c = CString::new(dir).ok()?;
        if let Ok(st) = stat_of(None, &c, true) {
            let private = st.st_uid == uid && st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_mode & 0o077 == 0;
            if private {
                return CString::new(format!("{}/zerofault-3.machine", dir.trim_end_matches('/'))).ok();
            }
        }
    }
    CString::new(format!("/dev/shm/zerofault-{uid}-3.machine")).ok()
}

/// The file at `path` mapped shared, one page, read and write, its page allocated and mapped
/// now (a full tmpfs refuses it here, not with a SIGBUS later): the mapping's address. `init`
/// writes the header where it is all zero (a file just made here or by another
/// process), and `valid` checks the header of every file: `Refused::Header` when it fails.
pub(crate) fn open(path: &CString, init: &dyn Fn(usize), valid: &dyn Fn(usize) -> bool) -> Result<usize, Refused> {
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: openat of a NUL-terminated path; creates with mode 0600 (less the umask).
    let fd = unsafe {
        raw::call(
            libc::SYS_openat,
            [
                raw::int_arg(libc::AT_FDCWD),
                path.as_ptr() as usize,
                raw::int_arg(flags),
                0o600,
                0,
                0,
            ],
        )
    }
    .map_err(|e| match e.0 {
        libc::ELOOP => Refused::Link,
        e => Refused::Call("open", e),
    })?;
    let mapped = map_checked(fd, init, valid);
    // SAFETY: closes the descriptor opened above, once; the mapping outlives it.
    let _ = unsafe { raw::call(libc::SYS_close, [fd, 0, 0, 0, 0, 0]) };
    mapped
}

fn map_checked(fd: usize, init: &dyn Fn(usize), valid: &dyn Fn(usize) -> bool) -> Result<usize, Refused> {
    let st = stat_of(Some(fd), &CString::default(), false).map_err(|e| Refused::Call("fstat", e.0))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Refused::NotFile);
    }
    if st.st_uid != euid() {
        return Err(Refused::Owner(st.st_uid));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(Refused::Mode(st.st_mode & 0o7777));
    }
    if st.st_nlink != 1 {
        return Err(Refused::Links(st.st_nlink));
    }
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if size == 0 {
        // SAFETY: sizes the file we just made (or found empty) to one page of zeros.
        unsafe { raw::call(libc::SYS_ftruncate, [fd, PAGE_SIZE, 0, 0, 0, 0]) }
            .map_err(|e| Refused::Call("ftruncate", e.0))?;
    } else if size != PAGE_SIZE as u64 {
        return Err(Refused::Size(size));
    }
    // SAFETY: allocates the file's one page (tmpfs: now, or ENOSPC now); no content changes.
    unsafe { raw::call(libc::SYS_fallocate, [fd, 0, 0, PAGE_SIZE, 0, 0]) }
        .map_err(|e| Refused::Call("fallocate", e.0))?;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a new shared mapping of one page of the file; it affects no existing memory.
    let addr = unsafe {
        raw::call(
            libc::SYS_mmap,
            [0, PAGE_SIZE, raw::int_arg(prot), raw::int_arg(libc::MAP_SHARED), fd, 0],
        )
    }
    .map_err(|e| Refused::Call("mmap", e.0))?;
    // Mapped now, writable: no later access of ours faults on it.
    if let Err(e) = super::mman::populate_write(addr, PAGE_SIZE) {
        unmap(addr);
        return Err(Refused::Call("madvise", e.raw_os_error().unwrap_or(0)));
    }
    init(addr);
    if !valid(addr) {
        unmap(addr);
        return Err(Refused::Header);
    }
    Ok(addr)
}

/// Unmaps a page [`open`] mapped.
pub(crate) fn unmap(addr: usize) {
    // SAFETY: a page of ours from `open`, which nobody uses any more.
    let _ = unsafe { raw::call(libc::SYS_munmap, [addr, PAGE_SIZE, 0, 0, 0, 0]) };
}

/// This process's id.
pub(crate) fn getpid() -> i32 {
    // SAFETY: getpid takes no argument and cannot fail.
    let r = unsafe { raw::syscall(libc::SYS_getpid, [0; 6]) };
    i32::try_from(r).unwrap_or(0)
}

/// Whether a process exists (`kill(pid, 0)`; EPERM: it does, another user's).
pub(crate) fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    match unsafe { raw::call(libc::SYS_kill, [raw::int_arg(pid), 0, 0, 0, 0, 0]) } {
        Ok(_) => true,
        Err(Errno(e)) => e == libc::EPERM,
    }
}
