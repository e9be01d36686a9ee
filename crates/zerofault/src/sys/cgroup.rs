//! The process's memory cgroup: its limit and what it uses, cgroup v2 (`memory.max`,
//! `memory.high`, `memory.current`) or v1 (`memory.limit_in_bytes`, `memory.usage_in_bytes`,
//! and `hierarchical_memory_limit` in `memory.stat` for the ancestors' limits). Read with raw
//! system calls into buffers on the stack: the scrub thread reads them.

use super::file::read_small;

/// A memory cgroup with a limit: where its files are, and the limit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemoryCgroup {
    /// `/sys/fs/cgroup/...` of the process's cgroup, NUL-terminated, and its length.
    dir: [u8; 512],
    dir_len: usize,
    v2: bool,
    /// The lowest limit of the cgroup and its ancestors (v1: the hierarchical limit), bytes.
    pub(crate) limit: u64,
}

/// Parses a number of bytes as cgroup files write it ("max" and v1's near-2^63 mean none).
fn bytes(text: &[u8]) -> Option<u64> {
    let v: u64 = std::str::from_utf8(text).ok()?.trim().parse().ok()?;
    (v < 1 << 60).then_some(v)
}

impl MemoryCgroup {
    /// The process's memory cgroup, if it has a limit (none, or no cgroup filesystem: `None`).
    pub(crate) fn find() -> Option<MemoryCgroup> {
        let mut buf = [0u8; 4096];
        let n = read_small(b"/proc/self/cgroup\0", &mut buf)?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        // v1's memory hierarchy if it is mounted (a line "N:...memory...:/path"), else v2's
        // ("0::/path").
        let v1 = text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
            ctl.split(',').any(|c| c == "memory").then_some(path)
        });
        let (v2, path) = match v1 {
            Some(p) => (false, p),
            None => (true, text.lines().find_map(|l| l.strip_prefix("0::"))?),
        };
        let root: &[u8] = if v2 {
            b"/sys/fs/cgroup"
        } else {
            b"/sys/fs/cgroup/memory"
        };
        let mut cg = MemoryCgroup {
            dir: [0; 512],
            dir_len: 0,
            v2,
            limit: u64::MAX,
        };
        let path = path.trim_end_matches('/').as_bytes();
        if root.len() + path.len() + 40 > cg.dir.len() {
            return None;
        }
        cg.dir[..root.len()].copy_from_slice(root);
        cg.dir[root.len()..root.len() + path.len()].copy_from_slice(path);
        cg.dir_len = root.len() + path.len();
        cg.limit = if v2 { cg.v2_limit() } else { cg.v1_limit() }?;
        Some(cg)
    }

    /// Reads `name` in the directory of the first `len` bytes of the cgroup's path.
    fn read(&self, len: usize, name: &[u8], buf: &mut [u8]) -> Option<usize> {
        let mut path = [0u8; 560];
        if len + 1 + name.len() + 1 > path.len() {
            return None;
        }
        path[..len].copy_from_slice(&self.dir[..len]);
        path[len] = b'/';
        path[len + 1..len + 1 + name.len()].copy_from_slice(name);
        read_small(&path[..len + 2 + name.len()], buf)
    }

    /// The lowest `memory.max` or `memory.high` of the cgroup and its ancestors.
    fn v2_limit(&self) -> Option<u64> {
        let mut lowest = None::<u64>;
        let mut len = self.dir_len;
        let root = b"/sys/fs/cgroup".len();
        while len > root {
            for name in [&b"memory.max"[..], b"memory.high"] {
                let mut buf = [0u8; 64];
                if let Some(v) = self.read(len, name, &mut buf).and_then(|n| bytes(&buf[..n])) {
                    lowest = Some(lowest.map_or(v, |l| l.min(v)));
                }
            }
            len = self.dir[..len].iter().rposition(|&c| c == b'/')?;
        }
        lowest
    }

    /// v1's `hierarchical_memory_limit` (the lowest limit up the hierarchy).
    fn v1_limit(&self) -> Option<u64> {
        let mut buf = [0u8; 8192];
        let n = self.read(self.dir_len, b"memory.stat", &mut buf)?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let v = text
            .lines()
            .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))?;
        bytes(v.as_bytes())
    }

    /// Bytes the cgroup uses now (its own; under v1 with the hierarchy, with its children).
    pub(crate) fn usage(&self) -> Option<u64> {
        let mut buf = [0u8; 64];
        let name: &[u8] = if self.v2 {
            b"memory.current"
        } else {
            b"memory.usage_in_bytes"
        };
        let n = self.read(self.dir_len, name, &mut buf)?;
        bytes(&buf[..n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_numbers_and_their_none() {
        assert_eq!(bytes(b"536870912\n"), Some(512 << 20));
        assert_eq!(bytes(b"max\n"), None);
        assert_eq!(bytes(b"9223372036854771712\n"), None);
    }

    #[test]
    fn a_cgroup_limit_found_comes_with_its_usage() {
        // Whatever the machine: a limit found is a positive number with a readable usage.
        if let Some(cg) = MemoryCgroup::find() {
            assert!(cg.limit > 0);
            assert!(cg.usage().is_some());
        }
    }
}
