//! NUMA topology and memory policy: the online nodes, their CPUs, memory and distance table from
//! sysfs (under an injectable root, so that tests read a fake tree), and the system calls
//! `mbind`, `get_mempolicy` and `move_pages` (query mode).
//! Also what the per-node pools need of the system: a thread bound to a node's CPUs
//! ([`bind_to_cpus`], the scrub) and the calling thread's own policy ([`thread_policy`]). Raw system calls and stack buffers on every path an
//! engine thread takes while serving.

use super::file::{self, read_small};
use super::raw::{self, Errno};
use std::io;
use std::path::Path;

/// Nodes a [`NodeMask`] can name: the kernel's `MAX_NUMNODES` on x86-64 distribution kernels
/// (`CONFIG_NODES_SHIFT=10`).
pub(crate) const MAX_NODES: usize = 1024;
const WORDS: usize = MAX_NODES / 64;

/// A set of node ids, laid out as the kernel's `nodemask_t` (bit n of word n / 64).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct NodeMask([u64; WORDS]);

impl std::fmt::Debug for NodeMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl NodeMask {
    /// The mask of the listed nodes (ids at or above [`MAX_NODES`] are left out).
    pub(crate) fn of(nodes: impl IntoIterator<Item = u32>) -> NodeMask {
        let mut m = NodeMask::default();
        for n in nodes {
            m.insert(n);
        }
        m
    }

    pub(crate) fn insert(&mut self, n: u32) {
        if let Some(w) = self.0.get_mut(n as usize / 64) {
            *w |= 1 << (n % 64);
        }
    }

    pub(crate) fn contains(&self, n: u32) -> bool {
        self.0.get(n as usize / 64).is_some_and(|w| w & (1 << (n % 64)) != 0)
    }

    /// Nodes in the mask.
    pub(crate) fn weight(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// The node ids, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0u32..)
            .zip(self.0.iter())
            .flat_map(|(i, &w)| (0..64u32).filter(move |b| w & (1 << b) != 0).map(move |b| i * 64 + b))
    }

    /// The `k`-th node of the mask (from 0, ascending), as the kernel's interleave counts.
    pub(crate) fn nth(&self, k: u64) -> Option<u32> {
        self.iter().nth(usize::try_from(k).ok()?)
    }
}

/// Parses a sysfs list (`0-3,8,10-11`) into ids; `None` if it is malformed.
pub(crate) fn parse_list(s: &str) -> Option<Vec<u32>> {
    let s = s.trim();
    let mut v = Vec::new();
    if s.is_empty() {
        return Some(v);
    }
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b || b - a > 1 << 16 {
                    return None;
                }
                v.extend(a..=b);
            }
            None => v.push(part.trim().parse().ok()?),
        }
    }
    Some(v)
}

/// One online node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) id: u32,
    pub(crate) cpus: Vec<u32>,
    /// `MemTotal` of the node's meminfo, in bytes (0 for a node without memory: a CPU-only
    /// node, which takes no pool).
    pub(crate) mem_total: u64,
    /// Distance to each online node, in the order of [`Topology::nodes`].
    pub(crate) distance: Vec<u32>,
}

/// The online nodes and their distances, as sysfs gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Topology {
    pub(crate) nodes: Vec<Node>,
}

fn read(root: &Path, rel: &str) -> io::Result<String> {
    file::read_to_string(root.join(rel))
}

fn malformed(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Topology {
    /// One node 0 holding every CPU: a kernel without NUMA (no `devices/system/node`), and
    /// what the engine runs as when the tree cannot be read.
    #[cfg(test)]
    pub(crate) fn single(cpus: u32) -> Topology {
        Topology {
            nodes: vec![Node {
                id: 0,
                cpus: (0..cpus.max(1)).collect(),
                mem_total: 0,
                distance: vec![10],
            }],
        }
    }

    /// Reads `root/devices/system/node` (root `/sys` on a real system): `online`, and each
    /// node's `cpulist`, `meminfo` and `distance`.
    pub(crate) fn read(root: &Path) -> io::Result<Topology> {
        let base = "devices/system/node";
        let online = read(root, &format!("{base}/online"))?;
        let ids = parse_list(&online).ok_or_else(|| malformed(format!("{base}/online: {online:?}")))?;
        if ids.is_empty() {
            return Err(malformed(format!("{base}/online lists no node")));
        }
        let mut nodes = Vec::with_capacity(ids.len());
        for &id in &ids {
            let dir = format!("{base}/node{id}");
            let cpulist = read(root, &format!("{dir}/cpulist"))?;
            let cpus = parse_list(&cpulist).ok_or_else(|| malformed(format!("{dir}/cpulist: {cpulist:?}")))?;
            let meminfo = read(root, &format!("{dir}/meminfo"))?;
            // "Node 0 MemTotal:       24573484 kB"
            let mem_total = meminfo_field(meminfo.as_bytes(), "MemTotal:")
                .ok_or_else(|| malformed(format!("{dir}/meminfo has no MemTotal")))?;
            // One distance per node of the system, in id order, possible nodes included on
            // some kernels: keep the online ones.
            let row = read(root, &format!("{dir}/distance"))?;
            let all: Vec<u32> = row
                .split_whitespace()
                .map(|d| d.parse().map_err(|_| malformed(format!("{dir}/distance: {row:?}"))))
                .collect::<Result<_, _>>()?;
            let distance = ids
                .iter()
                .map(|&to| {
                    // The row has one entry per node up to the highest online id at least.
                    all.get(to as usize)
                        .copied()
                        .ok_or_else(|| malformed(format!("{dir}/distance: {row:?}")))
                })
                .collect::<Result<_, _>>()?;
            nodes.push(Node {
                id,
                cpus,
                mem_total,
                distance,
            });
        }
        Ok(Topology { nodes })
    }

    /// The position of node `id` in [`Topology::nodes`].
    pub(crate) fn index(&self, id: u32) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The node whose CPU list holds `cpu`.
    pub(crate) fn node_of_cpu(&self, cpu: u32) -> Option<u32> {
        self.nodes.iter().find(|n| n.cpus.contains(&cpu)).map(|n| n.id)
    }

    /// The distance from node `a` to node `b` (`u32::MAX` if either is not online).
    pub(crate) fn distance(&self, a: u32, b: u32) -> u32 {
        match (self.index(a), self.index(b)) {
            (Some(i), Some(j)) => self.nodes[i].distance[j],
            _ => u32::MAX,
        }
    }

    /// The nodes with memory, nearest to `from` first (the kernel's zonelist order: by
    /// distance, ties by id); `from` itself first when it has memory.
    pub(crate) fn by_distance(&self, from: u32) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .nodes
            .iter()
            .filter(|n| n.mem_total > 0 || self.nodes.len() == 1)
            .map(|n| n.id)
            .collect();
        v.sort_by_key(|&n| (self.distance(from, n), n != from, n));
        v
    }

    /// Every online node id.
    #[cfg(test)]
    pub(crate) fn online(&self) -> NodeMask {
        NodeMask::of(self.nodes.iter().map(|n| n.id))
    }
}

/// `mode` values of `set_mempolicy(2)`, `mbind(2)` and `get_mempolicy(2)`.
pub(crate) const MPOL_DEFAULT: i32 = 0;
pub(crate) const MPOL_PREFERRED: i32 = 1;
pub(crate) const MPOL_BIND: i32 = 2;
pub(crate) const MPOL_INTERLEAVE: i32 = 3;
pub(crate) const MPOL_LOCAL: i32 = 4;
pub(crate) const MPOL_PREFERRED_MANY: i32 = 5;
pub(crate) const MPOL_WEIGHTED_INTERLEAVE: i32 = 6;
/// The mode flags get_mempolicy returns in the mode's high bits (static, relative nodes,
/// NUMA balancing): masked off.
const MPOL_MODE_FLAGS: i32 = (1 << 15) | (1 << 14) | (1 << 13);
const MPOL_F_ADDR: usize = 1 << 1;
const MPOL_F_MEMS_ALLOWED: usize = 1 << 2;

/// `get_mempolicy(mode, mask, MAX_NODES, addr, flags)`: the mode (flags masked off) and mask.
fn get_mempolicy(addr: usize, flags: usize) -> Result<(i32, NodeMask), Errno> {
    let mut mode: i32 = 0;
    let mut mask = NodeMask::default();
    // SAFETY: `mode` and `mask` are valid for writes; maxnode is the mask's size in bits; with
    // an address, the kernel only looks the mapping up.
    unsafe {
        raw::call(
            libc::SYS_get_mempolicy,
            [
                &mut mode as *mut i32 as usize,
                mask.0.as_mut_ptr() as usize,
                MAX_NODES,
                addr,
                flags,
                0,
            ],
        )
    }?;
    Ok((mode & !MPOL_MODE_FLAGS, mask))
}

/// The memory policy of the mapping holding `addr`: its mode (flags masked off) and node
/// mask. `MPOL_DEFAULT` means the mapping has none of its own (the faulting thread's policy
/// applies, which only that thread can read).
pub(crate) fn policy_of(addr: usize) -> Result<(i32, NodeMask), Errno> {
    get_mempolicy(addr, MPOL_F_ADDR)
}

/// Binds `[addr, addr + len)` to `mode` over `nodes` (`mbind(2)` with no flags: pages already
/// there stay where they are). For the engine's own rings.
///
/// # Safety
/// The caller owns the range (a policy changes where its future pages come from, not what
/// they hold).
pub(crate) unsafe fn mbind(addr: usize, len: usize, mode: i32, nodes: &NodeMask) -> Result<(), Errno> {
    // SAFETY: the mask is valid for reads of MAX_NODES bits; the caller owns the range.
    unsafe {
        raw::call(
            libc::SYS_mbind,
            [
                addr,
                len,
                raw::int_arg(mode),
                nodes.0.as_ptr() as usize,
                MAX_NODES + 1,
                0,
            ],
        )
    }
    .map(|_| ())
}

/// The node of each page at `pages` in this process (`move_pages(2)` in query mode), into
/// `out`: a node id, or a negative errno (`-ENOENT`: not present, `-EFAULT`: not mapped).
pub(crate) fn nodes_of(pages: &[usize], out: &mut [i32]) -> Result<(), Errno> {
    assert_eq!(pages.len(), out.len());
    // SAFETY: pid 0 is this process; `pages` holds `len` addresses to read, `out` `len` ints
    // to write; no node list (query only), so nothing moves.
    unsafe {
        raw::call(
            libc::SYS_move_pages,
            [0, pages.len(), pages.as_ptr() as usize, 0, out.as_mut_ptr() as usize, 0],
        )
    }
    .map(|_| ())
}

/// The calling thread's own memory policy (`get_mempolicy` without an address): its mode
/// (flags masked off) and node mask.
pub(crate) fn thread_policy() -> Result<(i32, NodeMask), Errno> {
    get_mempolicy(0, 0)
}

/// The nodes this process may allocate from (`get_mempolicy(MPOL_F_MEMS_ALLOWED)`: its
/// cpuset's memory nodes).
pub(crate) fn mems_allowed() -> Result<NodeMask, Errno> {
    get_mempolicy(0, MPOL_F_MEMS_ALLOWED).map(|(_, mask)| mask)
}

/// Lets the calling thread run only on those of `cpus` it may run on now
/// (`sched_setaffinity` over the intersection with its `sched_getaffinity` mask, so that a
/// `taskset` around the process still holds; ids at or above 4096 are left out). When none of
/// them is in its mask (it inherited one CPU, from a pinned program thread that started the
/// engine), on `cpus` as they are: the kernel still keeps it inside its cpuset, and refuses
/// (`EINVAL`) when none of them is there. For a node's scrub thread, which then populates and
/// zeroes on that node's CPUs.
pub(crate) fn bind_to_cpus(cpus: &[u32]) -> Result<(), Errno> {
    let mut now = [0u64; 64];
    // SAFETY: the kernel writes at most `size_of_val(&now)` bytes into `now`.
    unsafe {
        raw::call(
            libc::SYS_sched_getaffinity,
            [0, std::mem::size_of_val(&now), now.as_mut_ptr() as usize, 0, 0, 0],
        )
    }?;
    let mut mask = [0u64; 64];
    for &c in cpus {
        if let Some(w) = mask.get_mut(c as usize / 64) {
            *w |= 1 << (c % 64);
        }
    }
    let mut inside = [0u64; 64];
    for ((i, m), n) in inside.iter_mut().zip(mask).zip(now) {
        *i = m & n;
    }
    if inside.iter().any(|w| *w != 0) {
        mask = inside;
    }
    // SAFETY: the kernel reads `size_of_val(&mask)` bytes of `mask`; tid 0 is the caller.
    unsafe {
        raw::call(
            libc::SYS_sched_setaffinity,
            [0, std::mem::size_of_val(&mask), mask.as_ptr() as usize, 0, 0, 0],
        )
    }
    .map(|_| ())
}

/// A field of a node's meminfo ("Node 0 MemFree:  123 kB"), in bytes.
pub(crate) fn meminfo_field(meminfo: &[u8], field: &str) -> Option<u64> {
    let text = std::str::from_utf8(meminfo).ok()?;
    text.lines().find_map(|l| {
        let rest = l.split_once(field)?.1;
        Some(rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()? * 1024)
    })
}

/// Makes `node` the calling thread's preferred node (`set_mempolicy(MPOL_PREFERRED)`), or
/// gives it back the default local policy (`None`). Pages the thread makes the kernel allocate
/// from then on (a UFFDIO_COPY's, a populate's) come from that node first, where the
/// destination mapping has no policy of its own.
pub(crate) fn prefer(node: Option<u32>) -> Result<(), Errno> {
    let mask = node.map(|n| NodeMask::of([n]));
    let (mode, ptr, max) = match &mask {
        Some(m) => (MPOL_PREFERRED, m.0.as_ptr() as usize, MAX_NODES + 1),
        None => (MPOL_DEFAULT, 0, 0),
    };
    // SAFETY: the mask, when given, is valid for reads of MAX_NODES bits; the call changes
    // only the calling thread's policy.
    unsafe { raw::call(libc::SYS_set_mempolicy, [raw::int_arg(mode), ptr, max, 0, 0, 0]) }.map(|_| ())
}

/// The CPU thread `tid` of this process last ran on (field 39 of `/proc/self/task/<tid>/stat`):
/// for a thread blocked in a page fault, the CPU it faulted on, whose node the kernel would
/// have allocated from. Raw system calls and a stack buffer: no allocation, for engine threads.
pub(crate) fn cpu_of_thread(tid: u32) -> Option<u32> {
    use std::io::Write;
    let mut path = [0u8; 48];
    // Written into the stack buffer (io::Write for a slice): the zeros left after it end the
    // string.
    write!(&mut path[..47], "/proc/self/task/{tid}/stat").ok()?;
    let mut buf = [0u8; 1024];
    let n = read_small(&path, &mut buf)?;
    processor_field(&buf[..n])
}

/// Field 39 (`processor`) of a `/proc/<pid>/stat` line. The second field, the command name in
/// parentheses, may hold spaces and parentheses itself: fields are counted after its last `)`.
pub(crate) fn processor_field(stat: &[u8]) -> Option<u32> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    // After the name: field 3 (state) is the first.
    rest.split_ascii_whitespace().nth(39 - 3)?.parse().ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fake `devices/system/node` tree under a temporary root: `nodes` as (id, cpulist,
    /// MemTotal in kB, distance row).
    pub(crate) fn fake_tree(name: &str, online: &str, nodes: &[(u32, &str, u64, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("zerofault-numa-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let base = root.join("devices/system/node");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("online"), format!("{online}\n")).unwrap();
        for &(id, cpus, kb, dist) in nodes {
            let d = base.join(format!("node{id}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{cpus}\n")).unwrap();
            std::fs::write(
                d.join("meminfo"),
                format!("Node {id} MemTotal:       {kb} kB\nNode {id} MemFree:        1 kB\n"),
            )
            .unwrap();
            std::fs::write(d.join("distance"), format!("{dist}\n")).unwrap();
        }
        root
    }

    #[test]
    fn the_processor_field_is_counted_after_the_command_name() {
        let line = b"1234 (a (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
                     12345 1000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 7 0 0 0 0 0";
        assert_eq!(processor_field(line), Some(7));
        assert_eq!(processor_field(b"1 (x) S 1 2"), None);
    }

    #[test]
    fn a_thread_reads_the_cpu_it_runs_on_and_can_prefer_a_node() {
        // Pinned to its CPU, the thread reads its own: the field is the one the kernel fills.
        let cpu = u32::try_from(crate::sys::thread::online_cpus() - 1).unwrap();
        let got = std::thread::spawn(move || {
            // SAFETY: an all-zero cpu_set_t is the empty set.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: CPU_SET on a zeroed set we own.
            unsafe { libc::CPU_SET(cpu as usize, &mut set) };
            // SAFETY: sched_setaffinity of the calling thread with a valid set.
            let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
            assert_eq!(r, 0);
            let tid = crate::sys::thread::gettid();
            // Preferring node 0 (always online) and going back to the default both succeed,
            // and the thread's policy says so.
            assert_eq!(thread_policy().map(|p| p.0), Ok(MPOL_DEFAULT));
            prefer(Some(0)).unwrap();
            assert_eq!(thread_policy(), Ok((MPOL_PREFERRED, NodeMask::of([0]))));
            prefer(None).unwrap();
            assert_eq!(thread_policy().map(|p| p.0), Ok(MPOL_DEFAULT));
            cpu_of_thread(tid)
        })
        .join()
        .unwrap();
        assert_eq!(got, Some(cpu));
        assert_eq!(cpu_of_thread(u32::MAX), None, "no such thread");
    }

    #[test]
    fn lists_parse_as_sysfs_writes_them() {
        assert_eq!(parse_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_list("5"), Some(vec![5]));
        assert_eq!(parse_list(""), Some(vec![]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("a"), None);
    }

    #[test]
    fn masks_count_and_pick_the_nth_node_as_the_kernel_does() {
        let m = NodeMask::of([1, 3, 64, 200]);
        assert_eq!(m.weight(), 4);
        assert!(m.contains(64) && !m.contains(2));
        assert_eq!(m.iter().collect::<Vec<_>>(), [1, 3, 64, 200]);
        assert_eq!((m.nth(0), m.nth(3), m.nth(4)), (Some(1), Some(200), None));
        assert!(NodeMask::default().is_empty());
    }

    #[test]
    fn a_four_node_tree_reads_with_its_distances_and_a_cpu_less_node() {
        let root = fake_tree(
            "four",
            "0-3",
            &[
                (0, "0-1", 1 << 20, "10 20 30 30"),
                (1, "2-3", 1 << 20, "20 10 30 30"),
                (2, "", 0, "30 30 10 20"),
                (3, "4-5", 1 << 20, "30 30 20 10"),
            ],
        );
        let t = Topology::read(&root).unwrap();
        assert_eq!(t.nodes.len(), 4);
        assert_eq!(t.nodes[1].cpus, [2, 3]);
        assert_eq!(t.nodes[0].mem_total, 1 << 30);
        assert_eq!((t.node_of_cpu(5), t.node_of_cpu(9)), (Some(3), None));
        assert_eq!(
            (t.distance(0, 3), t.distance(3, 2), t.distance(0, 7)),
            (30, 20, u32::MAX)
        );
        // Node 2 has no memory: never a place for pages. Ties at 30 go by id.
        assert_eq!(t.by_distance(0), [0, 1, 3]);
        assert_eq!(t.by_distance(3), [3, 0, 1]);
        assert_eq!(t.by_distance(2), [3, 0, 1]);
        assert_eq!(t.online(), NodeMask::of([0, 1, 2, 3]));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_sparse_online_list_keeps_the_online_columns_of_the_distance_rows() {
        // Nodes 0 and 2 online; rows list every possible node.
        let root = fake_tree(
            "sparse",
            "0,2",
            &[(0, "0", 1024, "10 15 21"), (2, "1", 1024, "21 15 10")],
        );
        let t = Topology::read(&root).unwrap();
        assert_eq!(t.nodes[0].distance, [10, 21]);
        assert_eq!(t.by_distance(2), [2, 0]);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_malformed_tree_is_an_error_not_a_guess() {
        let root = fake_tree("bad", "0-1", &[(0, "0", 1024, "10 20"), (1, "1", 1024, "20 x")]);
        assert!(Topology::read(&root).is_err());
        std::fs::remove_dir_all(&root).unwrap();
        assert!(Topology::read(&root).is_err(), "no tree at all");
    }

    #[test]
    fn this_machine_reads_and_its_pages_are_on_an_online_node() {
        let t = match Topology::read(Path::new("/sys")) {
            Ok(t) => t,
            // A kernel built without NUMA has no node directory: one node.
            Err(_) if !Path::new("/sys/devices/system/node").exists() => Topology::single(1),
            Err(e) => panic!("/sys/devices/system/node is there but unreadable: {e}"),
        };
        assert!(!t.nodes.is_empty());
        let m = crate::sys::mman::Mapping::new(1 << 21, crate::sys::mman::Thp::Never).unwrap();
        let a = m.as_ptr() as usize;
        // SAFETY: our own mapping.
        unsafe { (a as *mut u8).write_volatile(1) };
        let mut out = [i32::MIN; 2];
        nodes_of(&[a, a + 4096], &mut out).unwrap();
        let node = u32::try_from(out[0]).unwrap();
        assert!(t.online().contains(node), "{out:?}");
        assert_eq!(out[1], -libc::ENOENT, "an untouched page is on no node");
        let (mode, _) = policy_of(a).unwrap();
        assert_eq!(mode, MPOL_DEFAULT, "a fresh mapping has no policy of its own");
        // SAFETY: our own mapping; binding it changes where its next pages come from.
        unsafe { mbind(a, 1 << 21, MPOL_BIND, &NodeMask::of([node])) }.unwrap();
        let (mode, mask) = policy_of(a).unwrap();
        assert_eq!((mode, mask), (MPOL_BIND, NodeMask::of([node])));
        assert_eq!(
            meminfo_field(b"Node 3 MemTotal:  10 kB\nNode 3 MemFree:   7 kB\n", "MemFree:"),
            Some(7 * 1024)
        );
        assert!(mems_allowed().unwrap().contains(node), "the page's node is allowed");
        // A thread bound to one CPU runs there; binding to a set that holds it and one it may
        // not run on keeps it on its own; a CPU that does not exist is refused.
        let cpu = t.nodes[0].cpus[0];
        let (on, kept, refused) = std::thread::spawn(move || {
            bind_to_cpus(&[cpu]).unwrap();
            // SAFETY: sched_getcpu reads the calling thread's CPU.
            let on = unsafe { libc::sched_getcpu() };
            bind_to_cpus(&[cpu, cpu + 1]).unwrap();
            (on, crate::sys::thread::allowed_cpus(), bind_to_cpus(&[4000]))
        })
        .join()
        .unwrap();
        assert_eq!(on, cpu as i32);
        assert_eq!(kept, 1, "not widened beyond the thread's own mask");
        assert_eq!(refused, Err(Errno(libc::EINVAL)));
    }
}
