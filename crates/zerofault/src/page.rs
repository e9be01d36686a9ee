//! Sizes, in one place: the 4 KiB page the engine serves, the 2 MiB PMD (one page table's span,
//! and the size of a transparent huge page), and the conversions between bytes and pages.

/// The base page size this engine serves. x86-64 and arm64 (4K kernels) only, checked at start.
pub const PAGE_SIZE: usize = 4096;
/// A PMD: the span of one page table, and the size of a transparent huge page.
pub const PMD_SIZE: usize = 2 << 20;
/// Pages per PMD (Linux's `HPAGE_PMD_NR`).
pub const PMD_PAGES: u64 = (PMD_SIZE / PAGE_SIZE) as u64;

/// Bytes in `pages` pages.
#[inline]
pub const fn bytes(pages: u64) -> usize {
    index(pages) * PAGE_SIZE
}

/// A page or PMD count (`u64`, as the page maps keep them) as an index or length.
#[inline]
#[allow(clippy::cast_possible_truncation, reason = "64-bit targets only (lib.rs)")]
pub const fn index(n: u64) -> usize {
    n as usize
}

/// Whole pages in `bytes` bytes (rounded down).
#[inline]
pub const fn pages(bytes: usize) -> u64 {
    (bytes / PAGE_SIZE) as u64
}

/// `addr` rounded down to its PMD's start.
#[inline]
pub const fn pmd_start(addr: usize) -> usize {
    addr & !(PMD_SIZE - 1)
}

/// `addr` rounded down to its page's start.
#[inline]
pub const fn page_start(addr: usize) -> usize {
    addr & !(PAGE_SIZE - 1)
}
