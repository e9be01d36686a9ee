//! What /proc/self/maps and /proc/self/smaps say of the process's mappings: a mapping's
//! line, whether a range is anonymous and private, the open run around an address, the
//! transparent huge pages of a range; and the stack-buffered line reader they go through.

/// Bytes of transparent huge pages mapped around `[addr, addr + len)`: the `AnonHugePages` of
/// every mapping of /proc/self/smaps that overlaps it (a registered range may be several VMAs,
/// and a mapping may have merged with a neighbour of the same flags). For tests and
/// diagnostics: it reads the whole smaps file.
pub fn anon_huge_bytes(addr: usize, len: usize) -> usize {
    let smaps = super::file::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut inside = false;
    let mut kb = 0;
    for l in smaps.lines() {
        if !l.starts_with(|c: char| c.is_ascii_uppercase()) {
            inside = vma_header(l).is_some_and(|(a, b, _)| a < addr + len && b > addr);
        } else if let Some(v) = l.strip_prefix("AnonHugePages:").filter(|_| inside) {
            kb += v.trim().trim_end_matches("kB").trim().parse::<usize>().unwrap_or(0);
        }
    }
    kb << 10
}

/// A mapping's line of /proc/self/maps (or header line of smaps), "start-end perms ...", as
/// (start, end, perms).
fn vma_header(l: &str) -> Option<(usize, usize, &str)> {
    let mut f = l.split(' ');
    let (a, b) = f.next()?.split_once('-')?;
    let parse = |x: &str| usize::from_str_radix(x, 16).ok();
    Some((parse(a)?, parse(b)?, f.next()?))
}

/// Whether `[addr, addr + len)` is covered, with no hole, by anonymous private mappings (no
/// file, no name such as `[stack]`; `MAP_SHARED` memory is refused). Reads /proc/self/maps:
/// not for hot paths.
pub(crate) fn anonymous_private(addr: usize, len: usize) -> bool {
    let (mut at, end) = (addr, addr.saturating_add(len));
    let mut kind_ok = true;
    // Through a stack buffer, as `accessible_around`: an engine thread calls it (a loan taken
    // back), and a String of the file would map allocator chunks a program's mlockall locks.
    let read = each_line("/proc/self/maps", |l| {
        let Some((a, b, perms)) = vma_header(l) else {
            kind_ok = false;
            return false;
        };
        if b <= at {
            return true;
        }
        if a > at || at >= end {
            return false;
        }
        // perms offset dev inode [path]
        let mut rest = l.split_whitespace().skip(2);
        let (_offset, _dev, inode, path) = (rest.next(), rest.next(), rest.next(), rest.next());
        if !perms.ends_with('p') || inode != Some("0") || path.is_some() {
            kind_ok = false;
            return false;
        }
        at = b;
        true
    });
    read.is_ok() && kind_ok && at >= end
}
/// The run of contiguous mappings that are not `PROT_NONE` holding `addr`, as `[lo, hi)`
/// (`None` if `addr` is unmapped or `PROT_NONE`). Reads /proc/self/maps through a stack
/// buffer, line by line: a handler calls it, and a `String` of the whole file mapped chunks
/// of the engine's allocator, which a program's `mlockall(MCL_FUTURE)` then locked (the
/// shim's `mlockall later` test went over its slack). Not for hot paths.
pub(crate) fn accessible_around(addr: usize) -> Option<(usize, usize)> {
    let mut run: Option<(usize, usize)> = None;
    let mut found = None;
    each_line("/proc/self/maps", |l| {
        let Some((a, b, perms)) = vma_header(l) else {
            return true;
        };
        let open = !perms.starts_with("---");
        run = match run {
            Some((lo, hi)) if open && a == hi => Some((lo, b)),
            Some((lo, hi)) if lo <= addr && addr < hi => {
                found = Some((lo, hi));
                return false;
            }
            _ if open => Some((a, b)),
            _ => None,
        };
        true
    })
    .ok()?;
    found.or(run).filter(|&(lo, hi)| lo <= addr && addr < hi)
}

/// Calls `f` on each line of the file at `path` (without its newline) until it returns
/// false, reading through a stack buffer: no allocation. A line longer than the buffer is cut
/// to its first 4 KiB (a /proc/self/maps line is its addresses and flags, then a path).
pub(crate) fn each_line(path: &str, mut f: impl FnMut(&str) -> bool) -> std::io::Result<()> {
    let file = super::file::open(path, libc::O_RDONLY)?;
    let mut buf = [0u8; 8192];
    let (mut len, mut skipping) = (0, false);
    loop {
        let n = file.read(&mut buf[len..])?;
        len += n;
        let mut start = 0;
        while let Some(i) = buf[start..len].iter().position(|&c| c == b'\n') {
            let line = &buf[start..start + i];
            start += i + 1;
            if std::mem::take(&mut skipping) {
                continue;
            }
            if !f(std::str::from_utf8(line).unwrap_or("")) {
                return Ok(());
            }
        }
        buf.copy_within(start..len, 0);
        len -= start;
        if n == 0 {
            if len > 0 && !skipping {
                f(std::str::from_utf8(&buf[..len]).unwrap_or(""));
            }
            return Ok(());
        }
        if len > buf.len() / 2 {
            // A line longer than half the buffer: its start is enough; the rest is skipped.
            if !skipping && !f(std::str::from_utf8(&buf[..len]).unwrap_or("")) {
                return Ok(());
            }
            skipping = true;
            len = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::mman::{protect, Mapping, Thp, PMD_SIZE};

    #[test]
    fn each_line_reads_every_line_through_its_buffer_long_ones_cut() {
        let dir = std::env::temp_dir().join(format!("zf-each-line-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lines");
        let long = "x".repeat(20_000);
        let mut text = String::new();
        for i in 0..3000 {
            text += &format!("line {i}\n");
        }
        text += &long;
        text += "\nafter the long one\nlast, no newline";
        std::fs::write(&path, &text).unwrap();
        let mut seen = Vec::new();
        each_line(path.to_str().unwrap(), |l| {
            seen.push(l.to_string());
            true
        })
        .unwrap();
        assert_eq!(seen.len(), 3003);
        assert_eq!((seen[0].as_str(), seen[2999].as_str()), ("line 0", "line 2999"));
        assert!(seen[3000].len() >= 4096 && seen[3000].len() < long.len() && seen[3000].bytes().all(|c| c == b'x'));
        assert_eq!(&seen[3001..], ["after the long one", "last, no newline"]);
        // Stopping early.
        let mut n = 0;
        each_line(path.to_str().unwrap(), |_| {
            n += 1;
            n < 10
        })
        .unwrap();
        assert_eq!(n, 10);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn accessible_around_finds_the_run_of_open_mappings_holding_an_address() {
        let m = Mapping::new(8 * PMD_SIZE, Thp::Default).unwrap();
        let a = m.as_ptr() as usize;
        // A PROT_NONE hole in the middle splits the run.
        // SAFETY: the middle PMD of our own mapping.
        unsafe { protect(a + 4 * PMD_SIZE, PMD_SIZE, libc::PROT_NONE) }.unwrap();
        let (lo, hi) = accessible_around(a + PMD_SIZE).unwrap();
        assert!(lo <= a && hi == a + 4 * PMD_SIZE, "{lo:#x}-{hi:#x} for {a:#x}");
        let (lo, hi) = accessible_around(a + 6 * PMD_SIZE).unwrap();
        assert!(lo == a + 5 * PMD_SIZE && hi >= a + 8 * PMD_SIZE, "{lo:#x}-{hi:#x}");
        assert_eq!(accessible_around(a + 4 * PMD_SIZE), None);
    }
}
