//! mmap / munmap / madvise helpers.
//!
//! These are raw system calls, not the libc wrappers: a process that runs the engine under an
//! LD_PRELOAD shim has `mmap`, `munmap` and `madvise` interposed, and the engine's own memory
//! (its pool, its zero source, the regions it maps) must never come back to the shim.
//!
//! Contract: every address handed in is page aligned and every length a multiple of the page
//! size; every mapping returned is anonymous and private. Callers own what they map and unmap
//! it exactly once.
//!
//! What /proc/self/maps and smaps say is read in [`super::maps`], the page-table walk of
//! /proc/self/pagemap in [`super::pagemap`]; both are re-exported here.

use super::raw;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub use super::maps::anon_huge_bytes;
pub(crate) use super::maps::{accessible_around, anonymous_private};
#[cfg(test)]
pub(crate) use super::pagemap::pagemap_scan;
pub(crate) use super::pagemap::{huge_mapped, page_states, populated_pmds, PageState};
pub(crate) use crate::page::{PAGE_SIZE, PMD_SIZE};

/// Where the engine asks for its own mappings: an address-space zone far from where the kernel
/// places a program's mappings (top-down from below the stack) and its heap. A program that
/// unmaps part of a reservation and maps it again at the same address (`MAP_FIXED`, `mremap`
/// back) relies on nobody mapping into the hole meanwhile: natively nobody does, and the
/// engine's tables and chunks must not either. Each mapping is asked for at the next address of
/// the zone; where that is taken (or beyond this machine's address space) the kernel places it
/// as usual.
const ZONE: usize = 0x1000_0000_0000;
static ZONE_NEXT: AtomicUsize = AtomicUsize::new(ZONE);

/// `MADV_POPULATE_READ` (Linux 5.14): fault pages in readable; a missing anonymous page maps
/// the shared zero page.
const MADV_POPULATE_READ: libc::c_int = 22;
/// `MADV_POPULATE_WRITE` (Linux 5.14): fault pages in writable, zero-filled by the kernel.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// mmap(2) of anonymous memory as a system call.
///
/// # Safety
/// As mmap(2): a MAP_FIXED mapping replaces whatever was at the address.
unsafe fn sys_mmap(addr: usize, len: usize, prot: libc::c_int, flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: the caller upholds mmap's contract; an anonymous mapping takes no fd (-1).
    let r = unsafe {
        raw::call(
            libc::SYS_mmap,
            [addr, len, raw::int_arg(prot), raw::int_arg(flags), usize::MAX, 0],
        )
    };
    Ok(r?)
}

/// The system page size, from sysconf.
pub(crate) fn system_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0)
}

/// Maps `len` bytes of anonymous private memory with protection `prot`, aligned to `align` (a
/// power of two at least the page size). Reserves `len + align` and trims the ends. `noreserve`
/// skips overcommit accounting (for pools and zero sources whose pages are mostly never
/// faulted).
///
/// Never locked: under `mlockall(MCL_FUTURE)` a new mapping would be locked and populated at
/// once (a 256 MiB pool reservation, all of it). So the mapping is made `PROT_NONE` (which the
/// kernel never populates), unlocked, and only then given `prot`: engine memory is used as
/// touched, whatever the program asked of its own. `MADV_DONTDUMP`: a core dump leaves it out.
pub fn map_aligned(len: usize, align: usize, prot: libc::c_int, noreserve: bool) -> io::Result<usize> {
    debug_assert!(align.is_power_of_two() && align >= PAGE_SIZE && len % PAGE_SIZE == 0);
    let total = len
        .checked_add(align)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if noreserve {
        flags |= libc::MAP_NORESERVE;
    }
    let hint = ZONE_NEXT.fetch_add(total.next_multiple_of(PMD_SIZE), Relaxed);
    // SAFETY: a fresh anonymous mapping; without MAP_FIXED the address is only a hint, and no
    // existing memory is affected.
    let base = unsafe { sys_mmap(hint, total, libc::PROT_NONE, flags) }?;
    let start = (base + align - 1) & !(align - 1);
    if start > base {
        // SAFETY: (so for the unmaps and the protect below) `[base, base + total)` is the
        // mapping just made, which nobody else knows of yet.
        unsafe { unmap(base, start - base) }?;
    }
    let tail = base + total - (start + len);
    if tail > 0 {
        // SAFETY: as above.
        unsafe { unmap(start + len, tail) }?;
    }
    let _ = munlock(start, len);
    // Not the program's memory: a core dump of the process holds none of it (pool pages that
    // held what the program freed, above all), as it holds none natively. Engine::map gives
    // the program's regions back to the dump.
    // SAFETY: as above; dump advice changes no content.
    let _ = unsafe { madvise(start, len, libc::MADV_DONTDUMP) };
    // SAFETY: as above.
    if let Err(e) = unsafe { protect(start, len, prot) } {
        // SAFETY: as above.
        let _ = unsafe { unmap(start, len) };
        return Err(e);
    }
    Ok(start)
}

/// Replaces `[addr, addr + len)` with a fresh `PROT_NONE` anonymous private reservation
/// (`MAP_FIXED`, `MAP_NORESERVE`), advised as the shim's arena is: no huge pages of the
/// kernel's, left out of core dumps. Whatever was there is gone, and so is any userfaultfd
/// registration of it.
///
/// # Safety
/// The caller owns the range and gives up its contents.
pub unsafe fn remap_fresh(addr: usize, len: usize) -> io::Result<()> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
    // SAFETY: the caller owns the range it replaces.
    unsafe { sys_mmap(addr, len, libc::PROT_NONE, flags) }?;
    // SAFETY: as above; advice changes no content.
    let _ = unsafe { madvise(addr, len, MADV_NOHUGEPAGE) };
    // SAFETY: as above.
    let _ = unsafe { madvise(addr, len, libc::MADV_DONTDUMP) };
    Ok(())
}

/// Maps `len` bytes (a multiple of the page size) of anonymous private read-write memory,
/// page aligned, never locked (see [`map_aligned`]).
pub fn map_private(len: usize, noreserve: bool) -> io::Result<usize> {
    map_aligned(len, PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE, noreserve)
}

/// Maps the 4 KiB portal of a device work queue (`/dev/dsa/wqX.Y`) write-only and shared, for
/// ENQCMD; the descriptor is closed again (the mapping keeps the queue).
pub(crate) fn map_portal(path: &str) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let f = super::file::open(path, libc::O_RDWR)?;
    // SAFETY: a new shared mapping of the device file; no existing memory is affected.
    let r = unsafe {
        raw::call(
            libc::SYS_mmap,
            [
                0,
                PAGE_SIZE,
                raw::int_arg(libc::PROT_WRITE),
                raw::int_arg(libc::MAP_SHARED | libc::MAP_POPULATE),
                raw::int_arg(f.as_raw_fd()),
                0,
            ],
        )
    };
    Ok(r?)
}

/// mprotect(2).
///
/// # Safety
/// The caller owns `[addr, addr + len)`: nobody else relies on its protection (a read of a
/// page made `PROT_NONE` would fault).
pub unsafe fn protect(addr: usize, len: usize, prot: libc::c_int) -> io::Result<()> {
    // SAFETY: the caller owns the range; mprotect touches nothing outside it.
    unsafe { raw::call(libc::SYS_mprotect, [addr, len, raw::int_arg(prot), 0, 0, 0]) }?;
    Ok(())
}

/// mlock(2): populates and locks the range (what a mapping made under `mlockall(MCL_FUTURE)`
/// gets).
pub fn mlock(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: locking changes no memory content; it populates the range as a touch would.
    unsafe { raw::call(libc::SYS_mlock, [addr, len, 0, 0, 0, 0]) }?;
    Ok(())
}

/// munlock(2): the range's pages may be paged out again (and a locked VMA is unlocked).
pub fn munlock(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: unlocking changes no memory content.
    unsafe { raw::call(libc::SYS_munlock, [addr, len, 0, 0, 0, 0]) }?;
    Ok(())
}

/// Maps fresh anonymous private read-write memory over `[addr, addr + len)`, replacing what
/// was there (`MAP_FIXED`), as one atomic step: no other thread can map in between.
///
/// # Safety
/// The caller owns `[addr, addr + len)` and wants its contents replaced by zero pages.
pub(crate) unsafe fn map_fixed(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range and wants its contents replaced by zero pages; MAP_FIXED
    // affects only `[addr, addr + len)`.
    unsafe {
        sys_mmap(
            addr,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
        )
    }?;
    Ok(())
}

/// Unmaps `[addr, addr + len)`.
///
/// # Safety
/// The caller owns the range (it mapped it, or the program handed it over to drop) and nothing
/// will touch it again.
pub unsafe fn unmap(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range; munmap of a page-aligned range cannot corrupt memory
    // outside it.
    unsafe { raw::call(libc::SYS_munmap, [addr, len, 0, 0, 0, 0]) }?;
    Ok(())
}

/// madvise(2).
///
/// # Safety
/// The caller owns `[addr, addr + len)`. `MADV_DONTNEED` discards its contents (they read
/// zero afterwards) and `MADV_DONTFORK` leaves it out of a forked child: both must be what its
/// owner wants.
pub unsafe fn madvise(addr: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: the caller owns the range; madvise touches nothing outside it.
    unsafe { raw::call(libc::SYS_madvise, [addr, len, raw::int_arg(advice), 0, 0, 0]) }?;
    Ok(())
}

/// Whether the process is within a few mappings of `vm.max_map_count` (or out of address
/// space): a three-page `PROT_NONE` mapping cannot be made, or cannot be split in three (an
/// `mprotect` of its middle page, which needs two more mappings: what a program's `munmap` or
/// `mprotect` of a middle page needs). Asked after the kernel refused the program a call with
/// ENOMEM, which it also returns for a hole; the probe tells the two apart without reading
/// /proc. Shared anonymous memory, which never merges with a neighbour (each mapping has a file
/// of its own), so that the probe's count is its own. Raw system calls, no allocation; the
/// probe is unmapped again.
pub(crate) fn near_map_limit() -> bool {
    let flags = libc::MAP_SHARED | libc::MAP_ANONYMOUS;
    // SAFETY: a fresh mapping; without MAP_FIXED nothing existing is affected.
    let Ok(p) = (unsafe { sys_mmap(0, 3 * PAGE_SIZE, libc::PROT_NONE, flags) }) else {
        return true;
    };
    // SAFETY: (so for the unmap) the probe's own mapping, known to nobody else.
    let split = unsafe { protect(p + PAGE_SIZE, PAGE_SIZE, libc::PROT_READ) };
    // SAFETY: as above.
    let _ = unsafe { unmap(p, 3 * PAGE_SIZE) };
    split.is_err()
}

/// The process's address-space or data-size limit (the lower soft limit of `RLIMIT_AS` and
/// `RLIMIT_DATA`), `None` where both are unlimited. A raw `prlimit64`: no allocation.
pub fn address_limit() -> Option<usize> {
    let soft = |res: u32| {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: prlimit64(0, res, NULL, &l) reads our own limit into `l`.
        let r = unsafe {
            raw::call(
                libc::SYS_prlimit64,
                [0, res as usize, 0, &mut l as *mut libc::rlimit as usize, 0, 0],
            )
        };
        r.ok().map(|_| l.rlim_cur).filter(|c| *c != libc::RLIM_INFINITY)
    };
    let (a, d) = (soft(libc::RLIMIT_AS), soft(libc::RLIMIT_DATA));
    a.into_iter()
        .chain(d)
        .min()
        .map(|l| usize::try_from(l).unwrap_or(usize::MAX))
}

/// Allocates and zero-fills every page of the range now, writable (`MADV_POPULATE_WRITE`).
/// The range must not be registered with a userfaultfd, or this would fault into ourselves.
pub(crate) fn populate_write(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: populating changes no content: missing pages become zero pages, which is what
    // they read as already; present pages stay as they are.
    unsafe { madvise(addr, len, MADV_POPULATE_WRITE) }
}

/// Maps every page of the range now, readable (`MADV_POPULATE_READ`): in a private anonymous
/// mapping, the shared zero page everywhere, in one call instead of a fault per page.
pub(crate) fn populate_read(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: populating for reading changes no content and allocates nothing in anonymous
    // memory: missing pages map the zero page, which is what they read as already.
    unsafe { madvise(addr, len, MADV_POPULATE_READ) }
}

/// The advices the engine uses, re-exported so that callers need no libc.
pub(crate) use libc::{MADV_DONTFORK, MADV_DONTNEED, MADV_HUGEPAGE, MADV_NOHUGEPAGE};

/// Whether the page at `addr` is resident (present in the page tables), from mincore(2);
/// false if it is not mapped. No allocation: for engine threads.
pub(crate) fn is_resident(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: one byte for the one page, as mincore requires.
    let r = unsafe {
        raw::call(
            libc::SYS_mincore,
            [addr, PAGE_SIZE, &mut v as *mut u8 as usize, 0, 0, 0],
        )
    };
    r.is_ok() && v & 1 != 0
}

/// How many pages of `[addr, addr + len)` are resident, from mincore(2). For tests and stats.
pub fn resident_pages(addr: usize, len: usize) -> io::Result<usize> {
    let mut v = vec![0u8; len.div_ceil(PAGE_SIZE)];
    // SAFETY: `v` has one byte per page of the range, as mincore requires.
    unsafe { raw::call(libc::SYS_mincore, [addr, len, v.as_mut_ptr() as usize, 0, 0, 0]) }?;
    Ok(v.iter().filter(|b| **b & 1 != 0).count())
}

/// Whether the kernel hands out 2 MiB transparent huge pages to `MADV_HUGEPAGE` memory: THP
/// is built in, not `never` (the administrator's word), and a huge page is one PMD.
pub fn thp_available() -> bool {
    let enabled = thp_setting("enabled").is_ok_and(|s| !s.contains("[never]"));
    let size = thp_setting("hpage_pmd_size").is_ok_and(|s| s.trim().parse::<usize>() == Ok(PMD_SIZE));
    enabled && size
}

/// Whether `MADV_DONTNEED` of a whole PMD of 4 KiB pages frees its page table here (Linux
/// 6.14+ with CONFIG_PT_RECLAIM), so that a huge page can be moved into that PMD whole again
/// (into a PMD that keeps an empty table the kernel splits the huge page instead: correct,
/// most of a millisecond). Probed once: 8 PMDs of fresh memory get one page each (a table
/// each), are discarded whole, and the process's page-table bytes (`VmPTE`) must fall back by
/// most of what they grew. The probe is three reads of /proc/self/status and eight faults,
/// too slow for a program thread: an engine thread makes it at start ([`probe_pt_reclaim`]), and a program
/// thread only asks for the answer ([`pt_reclaim_known`]).
static PT_RECLAIM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// The process's page-table kilobytes (`VmPTE`), read into a buffer on the stack: the scrub
/// thread allocates nothing for it (each size class a growing String passes through would take
/// the engine's allocator a 256 KiB chunk, which a later `mlockall` of the program's locks).
fn vm_pte() -> Option<usize> {
    super::thread::status_field("VmPTE").and_then(|kb| usize::try_from(kb).ok())
}

/// [`PT_RECLAIM`], probed now if nobody did.
pub(crate) fn probe_pt_reclaim() -> bool {
    *PT_RECLAIM.get_or_init(|| {
        const PMDS: usize = 8;
        let Ok(base) = map_aligned(PMDS * PMD_SIZE, PMD_SIZE, libc::PROT_READ | libc::PROT_WRITE, true) else {
            return false;
        };
        // SAFETY: (all three blocks) our own fresh mapping, known to nobody else.
        let _ = unsafe { madvise(base, PMDS * PMD_SIZE, MADV_NOHUGEPAGE) };
        let before = vm_pte();
        for i in 0..PMDS {
            // SAFETY: as above; one write per PMD makes its page table.
            unsafe { ((base + i * PMD_SIZE) as *mut u8).write_volatile(1) };
        }
        let grown = vm_pte();
        // SAFETY: as above.
        let _ = unsafe { madvise(base, PMDS * PMD_SIZE, MADV_DONTNEED) };
        let after = vm_pte();
        // SAFETY: as above.
        let _ = unsafe { unmap(base, PMDS * PMD_SIZE) };
        match (before, grown, after) {
            (Some(b), Some(g), Some(a)) => g >= b + PMDS * 4 * 3 / 4 && a + PMDS * 4 * 3 / 4 <= g,
            _ => false,
        }
    })
}

/// [`PT_RECLAIM`] if it was probed; `None` before (the caller then assumes tables stay: the
/// cautious answer, which costs a PMD its huge pages, never correctness).
pub(crate) fn pt_reclaim_known() -> Option<bool> {
    PT_RECLAIM.get().copied()
}

/// Whether the system's THP setting is `always`: then every anonymous mapping without
/// `MADV_NOHUGEPAGE` gets huge pages at its faults.
pub fn thp_always() -> bool {
    thp_setting("enabled").is_ok_and(|s| s.contains("[always]"))
}

/// Whether the kernel accounts commit strictly (`vm.overcommit_memory` 2): then a writable
/// private mapping is charged whole when it is made, `MAP_NORESERVE` or not.
pub(crate) fn strict_overcommit() -> bool {
    super::file::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() == "2")
}

/// One file of /sys/kernel/mm/transparent_hugepage.
fn thp_setting(file: &str) -> io::Result<String> {
    super::file::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{file}"))
}

/// An owned anonymous private mapping, unmapped on drop: plain kernel-served memory, for
/// baselines and for callers that need memory the engine does not serve.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

/// Transparent huge page advice for a [`Mapping`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thp {
    /// `MADV_NOHUGEPAGE`: 4 KiB faults.
    Never,
    /// `MADV_HUGEPAGE`.
    Always,
    /// No advice: the system default.
    Default,
}

impl Mapping {
    /// Maps `len` bytes (rounded up to pages), 2 MiB aligned.
    pub fn new(len: usize, thp: Thp) -> io::Result<Mapping> {
        let len = len.max(1).next_multiple_of(PAGE_SIZE);
        let addr = map_aligned(len, PMD_SIZE, libc::PROT_READ | libc::PROT_WRITE, false)?;
        let m = Mapping { addr, len };
        let advice = match thp {
            Thp::Never => MADV_NOHUGEPAGE,
            Thp::Always => MADV_HUGEPAGE,
            Thp::Default => return Ok(m),
        };
        // SAFETY: the mapping is ours; huge-page advice changes no content.
        unsafe { madvise(addr, len, advice) }?;
        Ok(m)
    }

    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping has no bytes (never: lengths are rounded up to a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Populates every page now (`MADV_POPULATE_WRITE`).
    pub fn populate(&self) -> io::Result<()> {
        populate_write(self.addr, self.len)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours, and dropped: nothing refers to it any more.
        let _ = unsafe { unmap(self.addr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a probe that says "at the limit" where there is room (every refused madvise over
    /// a hole would then stop the engine) or misses a process out of address space.
    #[test]
    fn the_map_limit_probe_sees_a_process_out_of_address_space() {
        assert!(!near_map_limit());
        // SAFETY: the child runs only raw system calls (async-signal-safe) before _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let tight = libc::rlimit {
                rlim_cur: 0,
                rlim_max: libc::RLIM_INFINITY,
            };
            // SAFETY: plain system calls in the child; it exits right after.
            unsafe {
                libc::setrlimit(libc::RLIMIT_AS, &tight);
                libc::_exit(i32::from(near_map_limit()));
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert_eq!(
            libc::WEXITSTATUS(status),
            1,
            "no address space left: the probe must say so"
        );
    }

    #[test]
    fn the_page_table_size_is_read_and_the_probe_answer_is_kept() {
        // A parse that failed would make the probe say "no" on every kernel.
        assert!(vm_pte().is_some_and(|kb| kb > 0), "{:?}", vm_pte());
        let said = probe_pt_reclaim();
        assert_eq!(pt_reclaim_known(), Some(said));
    }
}
