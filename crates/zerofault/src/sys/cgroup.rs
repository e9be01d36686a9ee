//! The process's memory cgroup: the limits over it and what it may still charge, cgroup v2
//! (`memory.max`, `memory.high`, `memory.current`) or v1 (`memory.limit_in_bytes`,
//! `memory.usage_in_bytes`). Every level of the hierarchy with a limit counts: the headroom
//! is the least of theirs (an ancestor's usage counts its other children too). Read with raw
//! system calls into buffers on the stack: the scrub thread reads them.

use super::file::read_small;

/// Levels with a limit that are looked at (the deepest ones; a deeper hierarchy keeps its
/// lowest limits).
const LEVELS: usize = 4;

/// A memory cgroup with a limit: where its files are, and the limits up its hierarchy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemoryCgroup {
    /// `/sys/fs/cgroup/...` of the process's cgroup, and its length.
    dir: [u8; 512],
    dir_len: usize,
    v2: bool,
    /// The levels with a limit: the length of their directory's path in `dir`, and the limit.
    levels: [(usize, u64); LEVELS],
    n_levels: usize,
    /// The lowest limit of the cgroup and its ancestors, bytes.
    pub(crate) limit: u64,
}

/// Parses a number of bytes as cgroup files write it ("max" and v1's near-2^63 mean none).
fn bytes(text: &[u8]) -> Option<u64> {
    let v: u64 = std::str::from_utf8(text).ok()?.trim().parse().ok()?;
    (v < 1 << 60).then_some(v)
}

/// The least headroom (limit less usage, 0 when over) of `levels`, (limit, usage) each; a
/// level whose usage could not be read counts as full (nothing is charged against a limit
/// that cannot be watched). `None`: no level.
pub(crate) fn least_headroom(levels: impl IntoIterator<Item = (u64, Option<u64>)>) -> Option<u64> {
    levels
        .into_iter()
        .map(|(limit, usage)| usage.map_or(0, |u| limit.saturating_sub(u)))
        .min()
}

impl MemoryCgroup {
    /// The process's memory cgroup, if it or an ancestor has a limit (none, or no cgroup
    /// filesystem: `None`).
    ///
    /// # Context
    /// The program thread starting the engine; reads /proc and the cgroup files (may sleep).
    pub(crate) fn find() -> Option<MemoryCgroup> {
        let mut buf = [0u8; 4096];
        let n = read_small(b"/proc/self/cgroup\0", &mut buf)?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        MemoryCgroup::find_in(text, b"/sys/fs/cgroup/memory", b"/sys/fs/cgroup")
    }

    /// [`MemoryCgroup::find`] for the text of /proc/self/cgroup, with the v1 memory hierarchy
    /// mounted at `v1_root` and v2's at `v2_root` (tests pass a directory of fake files).
    fn find_in(text: &str, v1_root: &[u8], v2_root: &[u8]) -> Option<MemoryCgroup> {
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
        let root = if v2 { v2_root } else { v1_root };
        let mut cg = MemoryCgroup {
            dir: [0; 512],
            dir_len: 0,
            v2,
            levels: [(0, 0); LEVELS],
            n_levels: 0,
            limit: u64::MAX,
        };
        let path = path.trim_end_matches('/').as_bytes();
        if root.len() + path.len() + 40 > cg.dir.len() {
            return None;
        }
        cg.dir[..root.len()].copy_from_slice(root);
        cg.dir[root.len()..root.len() + path.len()].copy_from_slice(path);
        cg.dir_len = root.len() + path.len();
        // Up from the process's cgroup to the root's child (the root has no limit).
        let mut len = cg.dir_len;
        while len > root.len() && cg.n_levels < LEVELS {
            if let Some(limit) = cg.level_limit(len) {
                cg.levels[cg.n_levels] = (len, limit);
                cg.n_levels += 1;
                cg.limit = cg.limit.min(limit);
            }
            len = cg.dir[..len].iter().rposition(|&c| c == b'/')?;
        }
        (cg.n_levels > 0).then_some(cg)
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

    /// A number of bytes in file `name` of the level whose path is `len` long.
    fn read_bytes(&self, len: usize, name: &[u8]) -> Option<u64> {
        let mut buf = [0u8; 64];
        self.read(len, name, &mut buf).and_then(|n| bytes(&buf[..n]))
    }

    /// The limit of one level: v2's lower of `memory.max` and `memory.high` (above `high`
    /// the kernel reclaims and throttles), v1's `memory.limit_in_bytes`.
    fn level_limit(&self, len: usize) -> Option<u64> {
        let names: &[&[u8]] = if self.v2 {
            &[b"memory.max", b"memory.high"]
        } else {
            &[b"memory.limit_in_bytes"]
        };
        names.iter().filter_map(|n| self.read_bytes(len, n)).min()
    }

    /// Bytes charged now to the level whose path is `len` long (with its children).
    fn level_usage(&self, len: usize) -> Option<u64> {
        let name: &[u8] = if self.v2 {
            b"memory.current"
        } else {
            b"memory.usage_in_bytes"
        };
        self.read_bytes(len, name)
    }

    /// What may still be charged before a limit is reached: the least, over the levels with a
    /// limit, of limit less usage (see [`least_headroom`]).
    ///
    /// # Context
    /// Any engine thread; reads one cgroup file a level into a stack buffer (no allocation).
    pub(crate) fn headroom(&self) -> u64 {
        least_headroom(
            self.levels[..self.n_levels]
                .iter()
                .map(|&(len, limit)| (limit, self.level_usage(len))),
        )
        .unwrap_or(0)
    }

    /// A number naming the cgroup whose limit is the lowest (never 0): the processes that
    /// share it share one ledger of pool pages (`crate::pool::machine`).
    ///
    /// # Context
    /// Any thread; computes, no system call.
    pub(crate) fn key(&self) -> u32 {
        let len = self.levels[..self.n_levels]
            .iter()
            .find(|l| l.1 == self.limit)
            .map_or(self.dir_len, |l| l.0);
        // 32-bit FNV-1a of the path (the v1 and v2 roots differ).
        let h = self.dir[..len]
            .iter()
            .fold(0x811c_9dc5u32, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
        h.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

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
            assert!(cg.level_usage(cg.dir_len).is_some());
            assert!(cg.headroom() <= cg.limit);
        }
    }

    #[test]
    fn headroom_is_the_least_of_the_levels() {
        assert_eq!(least_headroom([]), None);
        assert_eq!(least_headroom([(100, Some(30))]), Some(70));
        // A parent with a higher limit but other children using it binds first.
        assert_eq!(least_headroom([(100, Some(30)), (200, Some(180))]), Some(20));
        // Over the limit (v2's memory.high may be passed): none left.
        assert_eq!(least_headroom([(100, Some(130))]), Some(0));
        // A usage that cannot be read: nothing to charge against it.
        assert_eq!(least_headroom([(100, Some(10)), (100, None)]), Some(0));
    }

    /// A fake cgroup filesystem: `files` (path under the root, content) written under a fresh
    /// directory, which is returned.
    fn fake(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("zf-cgroup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for (path, text) in files {
            let p = d.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    fn root(d: &Path) -> Vec<u8> {
        d.to_str().unwrap().as_bytes().to_vec()
    }

    #[test]
    fn v2_limits_up_the_hierarchy_and_their_headroom() {
        let d = fake(
            "v2",
            &[
                ("a/memory.max", "max\n"),
                ("a/memory.high", "1073741824\n"),
                ("a/memory.current", "1000000000\n"),
                ("a/b/memory.max", "2147483648\n"),
                ("a/b/memory.high", "max\n"),
                ("a/b/memory.current", "500000000\n"),
            ],
        );
        let r = root(&d);
        let cg = MemoryCgroup::find_in("0::/a/b\n", b"/nonexistent", &r).unwrap();
        assert!(cg.v2);
        assert_eq!(cg.limit, 1 << 30, "a's memory.high is the lowest");
        assert_eq!(
            cg.level_usage(cg.dir_len),
            Some(500_000_000),
            "the process's own cgroup"
        );
        // b: 2 GiB - 500 MB; a: 1 GiB - 1 GB (its other children count).
        assert_eq!(cg.headroom(), (1 << 30) - 1_000_000_000);
        // The ledger is the binding level's: another process in a sibling of b shares it.
        std::fs::create_dir_all(d.join("a/c")).unwrap();
        let sib = MemoryCgroup::find_in("0::/a/c\n", b"/nonexistent", &r).unwrap();
        assert_eq!(sib.key(), cg.key());
        assert_ne!(sib.key(), 0);
        // No limit anywhere: none.
        let none = fake("v2none", &[("x/memory.max", "max\n"), ("x/memory.current", "5\n")]);
        assert!(MemoryCgroup::find_in("0::/x\n", b"/nonexistent", &root(&none)).is_none());
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&none).unwrap();
    }

    #[test]
    fn v1_limits_and_headroom() {
        let d = fake(
            "v1",
            &[
                ("p/memory.limit_in_bytes", "9223372036854771712\n"),
                ("p/memory.usage_in_bytes", "4096\n"),
                ("p/q/memory.limit_in_bytes", "2778726400\n"),
                ("p/q/memory.usage_in_bytes", "2700000000\n"),
            ],
        );
        let text = "5:cpu:/\n4:memory:/p/q\n0::/\n";
        let cg = MemoryCgroup::find_in(text, &root(&d), b"/nonexistent").unwrap();
        assert!(!cg.v2);
        assert_eq!(cg.limit, 2_778_726_400);
        assert_eq!(cg.headroom(), 78_726_400);
        // Over the limit (usage may pass it for a moment while the kernel reclaims): none.
        std::fs::write(d.join("p/q/memory.usage_in_bytes"), "2800000000\n").unwrap();
        assert_eq!(cg.headroom(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
