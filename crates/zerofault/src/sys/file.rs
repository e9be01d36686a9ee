//! Files of /proc, sysfs and /dev, opened and read with raw system calls: open (`O_CLOEXEC`),
//! read, close. Every file the engine opens goes through here, so that no open or read changes
//! the program's `errno`; [`read_small`] reads into the caller's buffer without allocating,
//! for engine threads. The page-table walk (`pagemap.rs`) opens /proc/self/pagemap here and
//! asks it with an ioctl.

use super::raw::{self, Errno};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// An open descriptor, closed on drop.
#[derive(Debug)]
pub(crate) struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor was opened by `open_cstr` and is closed once, here.
        let _ = unsafe { raw::call(libc::SYS_close, [raw::int_arg(self.0), 0, 0, 0, 0, 0]) };
    }
}

/// openat(2) of a NUL-terminated path, with `O_CLOEXEC` added to `flags`.
fn open_cstr(path: &[u8], flags: libc::c_int) -> Result<Fd, Errno> {
    debug_assert_eq!(path.last(), Some(&0));
    // SAFETY: openat reads the NUL-terminated path; it creates nothing (no O_CREAT).
    let fd = unsafe {
        raw::call(
            libc::SYS_openat,
            [
                raw::int_arg(libc::AT_FDCWD),
                path.as_ptr() as usize,
                raw::int_arg(flags | libc::O_CLOEXEC),
                0,
                0,
                0,
            ],
        )
    }?;
    Ok(Fd(raw::fd_of(fd)))
}

/// Opens the file at `path` with `flags` (`O_RDONLY`, `O_RDWR`; `O_CLOEXEC` is added). A path
/// with a NUL byte in it is `InvalidInput`, as for `std::fs`.
pub(crate) fn open(path: impl AsRef<OsStr>, flags: libc::c_int) -> io::Result<Fd> {
    let bytes = path.as_ref().as_bytes();
    if bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "file name contained an unexpected NUL byte",
        ));
    }
    let mut stack = [0u8; 256];
    let fd = if bytes.len() < stack.len() {
        stack[..bytes.len()].copy_from_slice(bytes);
        open_cstr(&stack[..=bytes.len()], flags)
    } else {
        let mut heap = Vec::with_capacity(bytes.len() + 1);
        heap.extend_from_slice(bytes);
        heap.push(0);
        open_cstr(&heap, flags)
    };
    Ok(fd?)
}

impl Fd {
    /// read(2) into `buf`: the bytes read, 0 at the end.
    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
        let r = unsafe {
            raw::call(
                libc::SYS_read,
                [raw::int_arg(self.0), buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
            )
        };
        Ok(r?)
    }

    /// The rest of the file as bytes, appended to `out` (the global allocator's `Vec`: in the
    /// shim, the engine's own). A read a signal interrupts is made again, as
    /// `std::io::Read::read_to_end` does.
    pub(crate) fn read_to_end(&self, out: &mut Vec<u8>) -> io::Result<()> {
        let mut chunk = [0u8; 4096];
        loop {
            let n = match self.read(&mut chunk) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            };
            if n == 0 {
                return Ok(());
            }
            out.extend_from_slice(&chunk[..n]);
        }
    }
}

/// The whole file at `path` as text, like `std::fs::read_to_string`: the open's or a read's
/// errno as an `io::Error`, `InvalidData` when the text is not UTF-8.
pub(crate) fn read_to_string(path: impl AsRef<OsStr>) -> io::Result<String> {
    let f = open(path, libc::O_RDONLY)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"))
}

/// Reads a small file into `buf` with raw system calls (no allocation); the bytes read.
/// `path` ends in a NUL (the caller's buffer ends in zeros). One read: a file longer than
/// `buf` is cut.
pub(crate) fn read_small(path: &[u8], buf: &mut [u8]) -> Option<usize> {
    read_small_or_errno(path, buf).ok()
}

/// [`read_small`], with the errno of the open or of the read that failed.
pub(crate) fn read_small_or_errno(path: &[u8], buf: &mut [u8]) -> Result<usize, Errno> {
    let f = open_cstr(path, libc::O_RDONLY)?;
    f.read(buf).map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// Gives the calling thread a descriptor table of its own holding only `keep` (the
/// userfaultfd), every other inherited copy closed: its later opens then never take a number
/// the program's table has free (`close(0); open()` gets 0 as natively), and no file the
/// program closes stays open through it. POSIX record locks and dnotify marks belong to the
/// table that took them, so the closes here drop none of the program's. False if the kernel
/// refused (the thread then shares the program's table, as before).
///
/// # Context
/// An engine thread, first thing in its life; no lock, no allocation.
pub(crate) fn own_descriptor_table(keep: Option<RawFd>) -> bool {
    const CLOSE_RANGE_UNSHARE: usize = 1 << 1;
    let close_range = |first: usize, last: usize, flags: usize| {
        // SAFETY: close_range closes descriptors of this thread's table only (after the
        // unshare, a private copy); nothing of ours is in use in the range.
        unsafe { raw::call(libc::SYS_close_range, [first, last, flags, 0, 0, 0]) }.is_ok()
    };
    match keep.and_then(|k| usize::try_from(k).ok()) {
        None => close_range(0, u32::MAX as usize, CLOSE_RANGE_UNSHARE),
        Some(0) => close_range(1, u32::MAX as usize, CLOSE_RANGE_UNSHARE),
        Some(k) => {
            close_range(0, k - 1, CLOSE_RANGE_UNSHARE)
                && (k == u32::MAX as usize || close_range(k + 1, u32::MAX as usize, 0))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn reads_a_file_whole_and_into_a_buffer_and_reports_errno() {
        let dir = std::env::temp_dir().join(format!("zerofault-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("text");
        let text = "line\n".repeat(2000);
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_to_string(&path).unwrap(), text);
        let mut cpath = path.as_os_str().as_bytes().to_vec();
        cpath.push(0);
        let mut buf = [0u8; 8];
        assert_eq!(read_small(&cpath, &mut buf), Some(8));
        assert_eq!(&buf, b"line\nlin");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert_eq!(read_to_string(&path).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let missing = read_to_string(dir.join("missing")).unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(read_to_string("a\0b").unwrap_err().kind(), io::ErrorKind::InvalidInput);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_thread_with_its_own_table_keeps_one_descriptor_and_leaves_the_numbers_free() {
        let kept = open("/dev/null", libc::O_RDONLY).unwrap();
        let other = open("/dev/null", libc::O_RDONLY).unwrap();
        let (k, o) = (kept.as_raw_fd(), other.as_raw_fd());
        let seen = std::thread::spawn(move || {
            assert!(own_descriptor_table(Some(k)));
            // Its own opens start from 0: the program's 0-2 are not in this table.
            let mine = open("/dev/null", libc::O_RDONLY).unwrap();
            (alive(k), alive(o), mine.as_raw_fd())
        })
        .join()
        .unwrap();
        assert_eq!(seen, (true, false, 0), "kept, another closed, the lowest number free");
        // The process's table is as it was.
        assert!(alive(o));
        drop((kept, other));
    }

    /// Whether `fd` is open in the calling thread's table.
    pub(crate) fn alive(fd: RawFd) -> bool {
        // SAFETY: F_GETFD only reads the descriptor's flags.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }
}
