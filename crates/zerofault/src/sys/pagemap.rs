//! The kernel's page-table walk over /proc/self/pagemap (`PAGEMAP_SCAN`): the populated PMDs
//! of a range, whether a PMD is one huge page, the present runs, each page's state.

use super::mman::{PAGE_SIZE, PMD_SIZE};
use super::raw;
use std::os::fd::AsRawFd;

/// Calls `each(start, len)` for every PMD of `[addr, addr + len)` (clipped to it) where a page
/// is present or swapped out: where the kernel put a page table or a huge page. Asks the
/// kernel for the populated runs only (`PAGEMAP_SCAN`, Linux 6.7; this project needs 6.8), so
/// that a sparse terabyte costs a few calls. `Err` when it fails (then nothing is known).
pub(crate) fn populated_pmds(addr: usize, len: usize, mut each: impl FnMut(usize, usize)) -> std::io::Result<()> {
    let f = super::file::open("/proc/self/pagemap", libc::O_RDONLY)?;
    let end = addr.saturating_add(len);
    // Each PMD once, in address order, though runs may share one.
    let mut last = None;
    let mut pmds_of = |a: usize, b: usize| {
        let mut at = a.max(addr);
        while at < b.min(end) {
            let pmd = crate::page::pmd_start(at);
            if last != Some(pmd) {
                last = Some(pmd);
                each(pmd.max(addr), (pmd + PMD_SIZE).min(end) - pmd.max(addr));
            }
            at = pmd + PMD_SIZE;
        }
    };
    pagemap_scan(&f, addr, end, &mut pmds_of)
}

/// Whether the PMD at `addr` (PMD aligned) is mapped by one huge page (`PAGEMAP_SCAN`'s
/// `PAGE_IS_HUGE` over all of it).
pub(crate) fn huge_mapped(addr: usize) -> std::io::Result<bool> {
    let f = super::file::open("/proc/self/pagemap", libc::O_RDONLY)?;
    let mut whole = false;
    scan(
        &f,
        addr,
        addr + PMD_SIZE,
        (PAGE_IS_HUGE, PAGE_IS_HUGE, 0),
        &mut |a, b, _| {
            whole |= a <= addr && b >= addr + PMD_SIZE;
        },
    )?;
    Ok(whole)
}

const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
const PAGE_IS_PFNZERO: u64 = 1 << 5;
const PAGE_IS_HUGE: u64 = 1 << 6;

/// `PAGEMAP_SCAN` (include/uapi/linux/fs.h): the runs of `[addr, end)` whose pages are present
/// or swapped, passed to `run(start, end)`.
pub(crate) fn pagemap_scan(
    f: &impl AsRawFd,
    addr: usize,
    end: usize,
    run: &mut impl FnMut(usize, usize),
) -> std::io::Result<()> {
    scan(
        f,
        addr,
        end,
        (PAGE_IS_PRESENT | PAGE_IS_SWAPPED, 0, 0),
        &mut |a, b, _| run(a, b),
    )
}

/// What a page's entry holds, as far as reads before writes care (`fault/reads.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageState {
    /// Nothing: never installed, or discarded since.
    Absent,
    /// The shared zero page: read, never written.
    ZeroPage,
    /// A page of its own (written since a zero page was mapped there, or installed so).
    Own,
}

/// The state of each page of `[addr, addr + bytes(out.len()))` into `out` (`PAGEMAP_SCAN`'s
/// `PAGE_IS_PFNZERO`: a page table walk, which never faults a page in, so it is safe on memory
/// the handler serves). `f`: /proc/self/pagemap.
pub(crate) fn page_states(f: &impl AsRawFd, addr: usize, out: &mut [PageState]) -> std::io::Result<()> {
    out.fill(PageState::Absent);
    let end = addr + out.len() * PAGE_SIZE;
    scan(
        f,
        addr,
        end,
        (PAGE_IS_PRESENT, 0, PAGE_IS_PFNZERO),
        &mut |a, b, categories| {
            let state = if categories & PAGE_IS_PFNZERO != 0 {
                PageState::ZeroPage
            } else {
                PageState::Own
            };
            for page in (a.max(addr)..b.min(end)).step_by(PAGE_SIZE) {
                out[(page - addr) / PAGE_SIZE] = state;
            }
        },
    )
}

/// `PAGEMAP_SCAN` of `[addr, end)`: the runs with any of the categories `anyof` and all of
/// `all`, passed to `run(start, end, categories)`, told apart by `also` too (`(anyof, all,
/// also)`: runs differing only in a category outside the three are one run).
fn scan(
    f: &impl AsRawFd,
    addr: usize,
    end: usize,
    (anyof, all, also): (u64, u64, u64),
    run: &mut impl FnMut(usize, usize, u64),
) -> std::io::Result<()> {
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct PageRegion {
        start: u64,
        end: u64,
        categories: u64,
    }
    #[repr(C)]
    struct ScanArg {
        size: u64,
        flags: u64,
        start: u64,
        end: u64,
        walk_end: u64,
        vec: u64,
        vec_len: u64,
        max_pages: u64,
        category_inverted: u64,
        category_mask: u64,
        category_anyof_mask: u64,
        return_mask: u64,
    }
    // _IOWR('f', 16, struct pm_scan_arg): read and write, size 96.
    const PAGEMAP_SCAN: libc::c_ulong =
        (3 << 30) | ((std::mem::size_of::<ScanArg>() as libc::c_ulong) << 16) | ((b'f' as libc::c_ulong) << 8) | 16;
    let mut regions = [PageRegion::default(); 64];
    let mut at = addr;
    while at < end {
        let mut arg = ScanArg {
            size: std::mem::size_of::<ScanArg>() as u64,
            flags: 0,
            start: at as u64,
            end: end as u64,
            walk_end: 0,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            max_pages: 0,
            category_inverted: 0,
            category_mask: all,
            category_anyof_mask: anyof,
            return_mask: anyof | all | also,
        };
        // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most `vec_len` regions into
        // `regions`, which outlives the call; it changes no mapping (no write-protect flags).
        let n = unsafe {
            raw::call(
                libc::SYS_ioctl,
                [
                    raw::int_arg(f.as_raw_fd()),
                    raw::ulong_arg(PAGEMAP_SCAN),
                    &mut arg as *mut ScanArg as usize,
                    0,
                    0,
                    0,
                ],
            )
        }
        .map_err(|e| e.to_io())?;
        for r in &regions[..n.min(regions.len())] {
            run(crate::page::index(r.start), crate::page::index(r.end), r.categories);
        }
        let walked = crate::page::index(arg.walk_end);
        if walked <= at {
            // No progress: what is left is unknown, which the caller must not take for empty.
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        at = walked;
    }
    Ok(())
}
