//! Where the shim's words go: the exit report's descriptor (`ZEROFAULT_STATS`) and every
//! write to it or to stderr, made so that they cannot change how the program ends.
//!
//! - The report's descriptor is set up at start-up ([`open`]): a copy of stderr (`on`, `json`)
//!   or the file of a path, on a descriptor of [`REPORT_FD_MIN`] or more, out of the way of
//!   programs that expect their own descriptors to be the lowest free ones. Its identity (device
//!   and inode) is kept: at exit the report is written only if that descriptor is still the
//!   same file, not one the program opened there after closing ours, or `dup2()`ed onto it.
//! - A path that is not a regular file (a FIFO with no reader would block the open, and the
//!   program with it, inside its first large request with every signal blocked) is refused
//!   with one line; so is a path when no descriptor of 512 or more is free.
//! - [`write_quietly`] blocks SIGPIPE and SIGXFSZ around the write: a report to a closed pipe or
//!   past a file size limit is lost, and the program does not die of it (natively it would
//!   not have written at all). A signal of those two already pending is left pending.

use engine::os::raw;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::*};

/// The report's descriptor: a copy of stderr taken at start-up (programs, coreutils among
/// them, close fd 2 in their own atexit handlers, which run before library destructors), or
/// the file of `ZEROFAULT_STATS=<path>`; -1 when there is none. A fork child inherits it
/// (O_CLOEXEC: an exec'd image opens its own).
static REPORT_FD: AtomicI32 = AtomicI32::new(-1);
/// (st_dev, st_ino) of [`REPORT_FD`]'s file when it was set up.
static REPORT_DEV: AtomicU64 = AtomicU64::new(0);
static REPORT_INO: AtomicU64 = AtomicU64::new(0);
/// The lowest descriptor the report's is moved to.
const REPORT_FD_MIN: usize = 512;

/// Sets up the report's descriptor: `path` to append to, or stderr's copy when None. A path
/// that cannot be used is one line naming the knob; the program and the engine go on.
///
/// # Context
/// The thread of the program that loads the shim, during its initialisation.
pub fn open(path: Option<&str>) {
    let low = match path {
        None => 2,
        Some(path) => match open_append(path) {
            Ok(fd) => fd,
            Err(why) => {
                say(&format!(
                    "zerofault: ZEROFAULT_STATS={path:?}: {why}; no stats are written"
                ));
                return;
            }
        },
    };
    // SAFETY: fcntl on an open descriptor; the result is checked.
    let moved = unsafe {
        raw::call(
            libc::SYS_fcntl,
            [low, libc::F_DUPFD_CLOEXEC as usize, REPORT_FD_MIN, 0, 0, 0],
        )
    };
    let fd = match (moved, path) {
        (Ok(fd), _) => fd,
        // stderr itself: the report goes there, if it is still stderr at exit.
        (Err(_), None) => low,
        (Err(e), Some(path)) => {
            close(low);
            say(&format!(
                "zerofault: ZEROFAULT_STATS={path:?}: no descriptor of {REPORT_FD_MIN} or more is free ({}); \
                 no stats are written",
                e.to_io()
            ));
            return;
        }
    };
    if fd != low && low != 2 {
        close(low);
    }
    if let Some((dev, ino, _)) = identity(fd) {
        REPORT_DEV.store(dev, Relaxed);
        REPORT_INO.store(ino, Relaxed);
        REPORT_FD.store(fd as i32, Release);
    }
}

/// Opens `path` to append the reports to: O_WRONLY|O_APPEND|O_CREAT|O_CLOEXEC, mode 0644, a
/// relative path from the working directory now. O_NONBLOCK, so that a FIFO with no reader
/// fails at once (ENXIO) instead of waiting; anything but a regular file is refused.
fn open_append(path: &str) -> Result<usize, String> {
    let mut c = [0u8; libc::PATH_MAX as usize];
    if path.len() >= c.len() {
        return Err(format!("cannot open it: {}", raw::Errno(libc::ENAMETOOLONG).to_io()));
    }
    c[..path.len()].copy_from_slice(path.as_bytes());
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: a NUL-terminated path in `c` (the knob refuses NUL bytes), which outlives the call.
    let fd = unsafe {
        raw::call(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as usize,
                c.as_ptr() as usize,
                flags as usize,
                0o644,
                0,
                0,
            ],
        )
    }
    .map_err(|e| format!("cannot open it for appending: {}", e.to_io()))?;
    match identity(fd) {
        Some((_, _, mode)) if mode & libc::S_IFMT == libc::S_IFREG => Ok(fd),
        _ => {
            close(fd);
            Err("it is not a regular file (the stats are appended to a file)".into())
        }
    }
}

/// One line on stderr.
fn say(line: &str) {
    write_quietly(2, format!("{line}\n").as_bytes());
}

fn close(fd: usize) {
    // SAFETY: closes a descriptor this module opened, once.
    let _ = unsafe { raw::call(libc::SYS_close, [fd, 0, 0, 0, 0, 0]) };
}

/// (st_dev, st_ino, st_mode) of `fd`'s file.
fn identity(fd: usize) -> Option<(u64, u64, u32)> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one `struct stat` into `st`, which outlives the call.
    unsafe { raw::call(libc::SYS_fstat, [fd, &mut st as *mut libc::stat as usize, 0, 0, 0, 0]) }.ok()?;
    Some((st.st_dev, st.st_ino, st.st_mode))
}

/// Writes `out` to the report's descriptor with one write(2), so that the lines of processes
/// sharing the file (or a pipe, up to PIPE_BUF) do not interleave; nothing if there is none or
/// it is no longer the file it was.
///
/// # Context
/// The thread that runs the process's exit (library destructors).
pub fn write_report(out: &str) {
    let fd = REPORT_FD.load(Acquire);
    if fd < 0 {
        return;
    }
    let same = identity(fd as usize)
        .is_some_and(|(dev, ino, _)| dev == REPORT_DEV.load(Relaxed) && ino == REPORT_INO.load(Relaxed));
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
    use std::os::fd::AsRawFd;

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

    #[test]
    fn only_a_regular_file_is_appended_to_and_a_fifo_is_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("zf-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = open_append(fifo.to_str().unwrap()).unwrap_err();
        assert!(e.contains("cannot open") || e.contains("not a regular file"), "{e}");
        assert!(open_append(dir.to_str().unwrap()).is_err(), "a directory");
        let file = dir.join("stats.jsonl");
        let fd = open_append(file.to_str().unwrap()).unwrap();
        write_quietly(fd, b"one\n");
        close(fd);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "one\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_report_goes_only_to_the_file_it_was_opened_on() {
        let dir = std::env::temp_dir().join(format!("zf-report-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ours = dir.join("ours.jsonl");
        open(Some(ours.to_str().unwrap()));
        let fd = REPORT_FD.load(Acquire);
        assert!(fd >= REPORT_FD_MIN as i32, "{fd}");
        write_report("first\n");
        // The program puts a file of its own on our descriptor.
        let theirs = std::fs::File::create(dir.join("theirs")).unwrap();
        // SAFETY: dup2 onto the report's descriptor, as a program may.
        assert_eq!(unsafe { libc::dup2(theirs.as_raw_fd(), fd) }, fd);
        write_report("second\n");
        assert_eq!(std::fs::read_to_string(&ours).unwrap(), "first\n");
        assert_eq!(
            std::fs::read_to_string(dir.join("theirs")).unwrap(),
            "",
            "not written into theirs"
        );
        REPORT_FD.store(-1, Release);
        close(fd as usize);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
