//! Where the shim's words go: the exit report (`ZEROFAULT_STATS`) and every write to it or to
//! stderr, made so that they cannot change how the program ends, nor what it may do.
//!
//! - A path (`ZEROFAULT_STATS=<path>`) is opened when the report is written, with the rights
//!   the process holds then, and closed at once: no descriptor of the engine's outlives a drop
//!   of privileges (a root service that drops to nobody after start-up must not keep a way to
//!   write into a root-only file). It is opened at start-up too, and closed, so that a path
//!   that cannot be used is one line before the program runs. A relative path is taken from
//!   the working directory at start-up. After a `chroot` the path may name nothing (or
//!   another file, inside the new root): a report that cannot be written is one line on
//!   stderr.
//! - It is opened as careful daemons open a log: `O_NOFOLLOW` (a symlink planted at the path
//!   is refused), and, in a sticky directory others may write to (/tmp), only a file of the
//!   process's own effective user with a single link (not one another user created or
//!   hard-linked there). Anything but a regular file is refused (a FIFO with no reader would
//!   block the program).
//! - For stderr (`on`, `json`) a copy is kept from start-up on a descriptor of
//!   [`REPORT_FD_MIN`] or more (programs, coreutils among them, close fd 2 in their own atexit
//!   handlers, which run before library destructors), with the identity (device and inode) of
//!   its file: the report is written only if that descriptor is still the same file. When the
//!   program changes its credentials the copy is closed ([`credentials_changed`]): the report
//!   goes to fd 2 itself then, if that is still the same file.
//! - [`write_quietly`] blocks SIGPIPE and SIGXFSZ around the write: a report to a closed pipe or
//!   past a file size limit is lost, and the program does not die of it (natively it would
//!   not have written at all). A signal of those two already pending is left pending.

use engine::os::raw;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

/// The copy of stderr taken at start-up (or fd 2 itself, after a change of credentials); -1
/// when there is none. A fork child inherits it (O_CLOEXEC: an exec'd image takes its own).
static REPORT_FD: AtomicI32 = AtomicI32::new(-1);
/// (st_dev, st_ino) of stderr's file when the copy was taken.
static REPORT_DEV: AtomicU64 = AtomicU64::new(0);
static REPORT_INO: AtomicU64 = AtomicU64::new(0);
/// The report file's path, NUL-terminated, absolute when the working directory was known at
/// start-up (a leaked allocation of the engine's own memory, never freed); null when the
/// report goes to stderr or nowhere.
static REPORT_PATH: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
/// The path's length, NUL included.
static REPORT_PATH_LEN: AtomicUsize = AtomicUsize::new(0);
/// Whether this process said already that its report cannot be written.
static SAID: AtomicBool = AtomicBool::new(false);
/// The lowest descriptor stderr's copy is moved to.
const REPORT_FD_MIN: usize = 512;

/// Sets up the report: `path` to append to, or stderr's copy when None. A path that cannot be
/// used is one line naming the knob; the program and the engine go on.
///
/// # Context
/// The thread of the program that loads the shim, during its initialisation (before `main`
/// when a knob is set, as `ZEROFAULT_STATS` is).
pub fn open(path: Option<&str>) {
    let Some(path) = path else { return copy_stderr() };
    let Some(full) = absolute(path) else {
        return say(&format!(
            "zerofault: ZEROFAULT_STATS={path:?}: cannot open it: {}; no stats are written",
            raw::Errno(libc::ENAMETOOLONG).to_io()
        ));
    };
    match open_append(&full) {
        Ok(fd) => close(fd),
        Err(why) => {
            return say(&format!(
                "zerofault: ZEROFAULT_STATS={path:?}: {why}; no stats are written"
            ))
        }
    }
    let len = full.len();
    let leaked = Box::leak(full.into_boxed_slice());
    REPORT_PATH_LEN.store(len, Relaxed);
    REPORT_PATH.store(leaked.as_mut_ptr(), Release);
}

/// `path` NUL-terminated, made absolute with the working directory now; None when too long.
fn absolute(path: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(libc::PATH_MAX as usize);
    if !path.starts_with('/') {
        let mut cwd = [0u8; libc::PATH_MAX as usize];
        // SAFETY: getcwd writes at most `cwd.len()` bytes, NUL included, into `cwd`.
        let n = unsafe { raw::call(libc::SYS_getcwd, [cwd.as_mut_ptr() as usize, cwd.len(), 0, 0, 0, 0]) };
        // An unreachable directory ("(unreachable)/x") is no path: the relative one is kept.
        if let Ok(n @ 2..) = n {
            if cwd[0] == b'/' {
                out.extend_from_slice(&cwd[..n - 1]);
                out.push(b'/');
            }
        }
    }
    out.extend_from_slice(path.as_bytes());
    out.push(0);
    (out.len() <= libc::PATH_MAX as usize).then_some(out)
}

/// A copy of stderr on a descriptor of [`REPORT_FD_MIN`] or more, or stderr itself when none
/// is free.
fn copy_stderr() {
    // SAFETY: fcntl on a descriptor; the result is checked.
    let moved = unsafe {
        raw::call(
            libc::SYS_fcntl,
            [2, libc::F_DUPFD_CLOEXEC as usize, REPORT_FD_MIN, 0, 0, 0],
        )
    };
    let fd = moved.unwrap_or(2);
    if let Some((dev, ino, ..)) = identity(fd) {
        REPORT_DEV.store(dev, Relaxed);
        REPORT_INO.store(ino, Relaxed);
        REPORT_FD.store(fd as i32, Release);
    } else if fd != 2 {
        close(fd);
    }
}

/// The program changed its credentials (or capabilities): stderr's copy, the program's own
/// stderr of before (which it may have closed before dropping its privileges), is closed; the
/// report goes to fd 2 itself, if that is still the same file at exit.
///
/// # Context
/// A program thread, from a hook on a call that changes the process's rights; takes no lock.
pub fn credentials_changed() {
    let fd = REPORT_FD.load(Acquire);
    if fd > 2 && REPORT_FD.compare_exchange(fd, 2, AcqRel, Relaxed).is_ok() {
        close(fd as usize);
    }
}

/// Opens `path` (NUL-terminated) to append to: O_WRONLY|O_APPEND|O_CREAT|O_CLOEXEC|O_NOFOLLOW,
/// mode 0644. O_NONBLOCK, so that a FIFO with no reader fails at once (ENXIO) instead of
/// waiting; anything but a regular file is refused, and so is, in a sticky directory others
/// may write to, a file of another user or with more than one link.
fn open_append(path: &[u8]) -> Result<usize, String> {
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOFOLLOW;
    // SAFETY: a NUL-terminated path (the knob refuses NUL bytes), which outlives the call.
    let fd = unsafe {
        raw::call(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as usize,
                path.as_ptr() as usize,
                flags as usize,
                0o644,
                0,
                0,
            ],
        )
    }
    .map_err(|e| match e {
        raw::Errno(libc::ELOOP) => "cannot open it for appending: it is a symbolic link (refused)".to_string(),
        e => format!("cannot open it for appending: {}", e.to_io()),
    })?;
    let refused = match identity(fd) {
        Some((_, _, mode, ..)) if mode & libc::S_IFMT != libc::S_IFREG => {
            Some("it is not a regular file (the stats are appended to a file)")
        }
        Some((.., uid, links)) if (uid != euid() || links != 1) && shared_directory(path) => {
            Some("it is another user's file, or has other links, in a sticky directory others may write to (refused)")
        }
        Some(_) => None,
        None => Some("it cannot be examined"),
    };
    match refused {
        Some(why) => {
            close(fd);
            Err(why.into())
        }
        None => Ok(fd),
    }
}

/// Whether the directory of `path` (NUL-terminated) is sticky and writable by others than its
/// owner (/tmp, /var/tmp), where another user may have put the file; a directory that cannot
/// be examined is taken as one (the stricter rule).
fn shared_directory(path: &[u8]) -> bool {
    let body = &path[..path.len() - 1];
    let parent: &[u8] = match body.iter().rposition(|&b| b == b'/') {
        Some(0) => b"/",
        Some(i) => &body[..i],
        None => b".",
    };
    let mut dir = [0u8; libc::PATH_MAX as usize + 1];
    dir[..parent.len()].copy_from_slice(parent);
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: stat of a NUL-terminated path into `st`, both outliving the call.
    let ok = unsafe {
        raw::call(
            libc::SYS_newfstatat,
            [
                libc::AT_FDCWD as usize,
                dir.as_ptr() as usize,
                &mut st as *mut libc::stat as usize,
                0,
                0,
                0,
            ],
        )
    }
    .is_ok();
    !ok || (st.st_mode & libc::S_ISVTX != 0 && st.st_mode & (libc::S_IWOTH | libc::S_IWGRP) != 0)
}

/// The process's id (state.rs's own is not in unit tests).
fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and no side effect.
    unsafe { raw::syscall(libc::SYS_getpid, [0; 6]) as i32 }
}

/// The calling thread's effective user.
fn euid() -> u32 {
    // SAFETY: geteuid has no arguments and no side effect.
    unsafe { raw::syscall(libc::SYS_geteuid, [0; 6]) as u32 }
}

/// One line on stderr.
fn say(line: &str) {
    write_quietly(2, format!("{line}\n").as_bytes());
}

fn close(fd: usize) {
    // SAFETY: closes a descriptor this module opened, once.
    let _ = unsafe { raw::call(libc::SYS_close, [fd, 0, 0, 0, 0, 0]) };
}

/// (st_dev, st_ino, st_mode, st_uid, st_nlink) of `fd`'s file.
fn identity(fd: usize) -> Option<(u64, u64, u32, u32, u64)> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one `struct stat` into `st`, which outlives the call.
    unsafe { raw::call(libc::SYS_fstat, [fd, &mut st as *mut libc::stat as usize, 0, 0, 0, 0]) }.ok()?;
    Some((st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_nlink))
}

/// Writes `out` with one write(2), so that the lines of processes sharing the file (or a pipe,
/// up to PIPE_BUF) do not interleave: to the report's file, opened now with the process's
/// rights of now and closed at once (a file that cannot be opened is one line on stderr,
/// once), or to stderr's copy if it is still the file it was.
///
/// # Context
/// The thread that runs the process's exit (library destructors).
pub fn write_report(out: &str) {
    let path = REPORT_PATH.load(Acquire);
    if !path.is_null() {
        // SAFETY: a leaked NUL-terminated allocation of REPORT_PATH_LEN bytes, never freed.
        let path = unsafe { std::slice::from_raw_parts(path, REPORT_PATH_LEN.load(Relaxed)) };
        match open_append(path) {
            Ok(fd) => {
                write_quietly(fd, out.as_bytes());
                close(fd);
            }
            Err(why) if !SAID.swap(true, Relaxed) => say(&format!(
                "zerofault: ZEROFAULT_STATS={:?}: {why}; the stats of pid {} are not written",
                String::from_utf8_lossy(&path[..path.len() - 1]),
                getpid()
            )),
            Err(_) => {}
        }
        return;
    }
    let fd = REPORT_FD.load(Acquire);
    if fd < 0 {
        return;
    }
    let same = identity(fd as usize)
        .is_some_and(|(dev, ino, ..)| dev == REPORT_DEV.load(Relaxed) && ino == REPORT_INO.load(Relaxed));
    if same {
        write_quietly(fd as usize, out.as_bytes());
    }
}

/// Bit of signal `sig` in a kernel `sigset_t` of 8 bytes.
const fn bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

/// write(2) of `buf` to `fd` with SIGPIPE and SIGXFSZ blocked on this thread: a closed pipe or
/// a file size limit loses the words, not the program. A signal the write raised is taken
/// back (one of those two already pending before it is left alone).
///
/// # Context
/// Any thread of the program, in a hook or at exit.
pub fn write_quietly(fd: usize, buf: &[u8]) {
    let quiet = bit(libc::SIGPIPE) | bit(libc::SIGXFSZ);
    let (mut old, mut pending) = (0u64, 0u64);
    // SAFETY: rt_sigprocmask and rt_sigpending read and write 8-byte signal sets on this
    // thread, all of which outlive the calls.
    unsafe {
        let set = &quiet as *const u64 as usize;
        let _ = raw::call(
            libc::SYS_rt_sigprocmask,
            [libc::SIG_BLOCK as usize, set, &mut old as *mut u64 as usize, 8, 0, 0],
        );
        let _ = raw::call(
            libc::SYS_rt_sigpending,
            [&mut pending as *mut u64 as usize, 8, 0, 0, 0, 0],
        );
    }
    // SAFETY: writes a valid buffer of its stated length.
    let wrote = unsafe { raw::call(libc::SYS_write, [fd, buf.as_ptr() as usize, buf.len(), 0, 0, 0]) };
    let raised = match wrote {
        Err(raw::Errno(libc::EPIPE)) => bit(libc::SIGPIPE),
        Err(raw::Errno(libc::EFBIG)) => bit(libc::SIGXFSZ),
        _ => 0,
    } & !pending;
    if raised != 0 {
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: takes the one signal of `raised` pending on this thread, waiting for nothing.
        let _ = unsafe {
            raw::call(
                libc::SYS_rt_sigtimedwait,
                [
                    &raised as *const u64 as usize,
                    0,
                    &zero as *const libc::timespec as usize,
                    8,
                    0,
                    0,
                ],
            )
        };
    }
    // SAFETY: puts back this thread's mask as it was.
    let _ = unsafe {
        raw::call(
            libc::SYS_rt_sigprocmask,
            [libc::SIG_SETMASK as usize, &old as *const u64 as usize, 0, 8, 0, 0],
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending() -> u64 {
        let mut p = 0u64;
        // SAFETY: rt_sigpending writes an 8-byte set into `p`.
        unsafe { raw::call(libc::SYS_rt_sigpending, [&mut p as *mut u64 as usize, 8, 0, 0, 0, 0]) }.unwrap();
        p
    }

    #[test]
    fn a_write_to_a_closed_pipe_is_lost_and_raises_nothing() {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: closes the read end we just made.
        unsafe { libc::close(fds[0]) };
        // The test harness ignores nothing: a SIGPIPE raised and left would kill the test
        // binary when the mask is put back.
        write_quietly(fds[1] as usize, b"lost\n");
        assert_eq!(pending() & bit(libc::SIGPIPE), 0, "SIGPIPE taken back");
        // SAFETY: closes the write end.
        unsafe { libc::close(fds[1]) };
    }

    fn c(p: &std::path::Path) -> Vec<u8> {
        let mut v = p.as_os_str().as_encoded_bytes().to_vec();
        v.push(0);
        v
    }

    #[test]
    fn only_a_regular_file_is_appended_to_and_a_fifo_or_a_symlink_is_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("zf-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let cf = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(cf.as_ptr(), 0o644) }, 0);
        let e = open_append(&c(&fifo)).unwrap_err();
        assert!(e.contains("cannot open") || e.contains("not a regular file"), "{e}");
        assert!(open_append(&c(&dir)).is_err(), "a directory");
        let file = dir.join("stats.jsonl");
        let fd = open_append(&c(&file)).unwrap();
        write_quietly(fd, b"one\n");
        close(fd);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "one\n");
        let link = dir.join("link.jsonl");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = open_append(&c(&link)).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "one\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stderrs_copy_is_closed_when_the_credentials_change() {
        open(None);
        let fd = REPORT_FD.load(Acquire);
        assert!(fd >= REPORT_FD_MIN as i32, "{fd}");
        credentials_changed();
        assert_eq!(REPORT_FD.load(Acquire), 2, "fd 2 itself from now on");
        // SAFETY: fcntl F_GETFD on a descriptor number; no pointer.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_GETFD) }, -1, "the copy is closed");
        REPORT_FD.store(-1, Release);
    }

    /// The descriptors of this process that name `file`.
    fn open_on(file: &std::path::Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| t == file)
            .count()
    }

    #[test]
    fn the_report_file_is_opened_when_written_and_no_descriptor_is_kept() {
        let dir = std::env::temp_dir().join(format!("zf-report-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ours = dir.join("ours.jsonl");
        open(Some(ours.to_str().unwrap()));
        assert!(ours.exists(), "created at start-up, as a check");
        assert_eq!(open_on(&ours), 0, "no descriptor kept after start-up");
        write_report("first\n");
        assert_eq!(open_on(&ours), 0, "none kept after a write");
        // The file replaced by a symlink to another after start-up: refused at the write.
        let theirs = dir.join("theirs");
        std::fs::write(&theirs, "").unwrap();
        std::fs::rename(&ours, dir.join("kept")).unwrap();
        std::os::unix::fs::symlink(&theirs, &ours).unwrap();
        write_report("second\n");
        assert_eq!(std::fs::read_to_string(dir.join("kept")).unwrap(), "first\n");
        assert_eq!(
            std::fs::read_to_string(&theirs).unwrap(),
            "",
            "not written through the link"
        );
        REPORT_PATH.store(std::ptr::null_mut(), Release);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
