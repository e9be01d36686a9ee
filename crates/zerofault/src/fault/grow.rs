//! Blocks that grow in small steps: the new part of a block is filled from the program's own
//! thread, inside the `realloc` or `mremap` that made it, before the program writes it
//! ([`crate::Engine::fill_grown`]).
//!
//! Served by faults, each step of a block grown 64 KiB at a time costs a round trip to the
//! handler for a window cut at the block's end, plus a TLB-flush interrupt for the move: more
//! than the kernel's own faults for those pages. Filled in the call (copies of the zero
//! source), the program's writes fault no more ([`fill`]; docs/DESIGN.md, "Blocks that grow in
//! small steps", has the figures).
//!
//! Only the part of a growth before its first whole PMD is filled ([`fill_end`]): whole PMDs
//! are left to the windows, which give them huge pages, and a vector that doubles its
//! capacity writes the new half over time: what it has not written yet stays as unresident
//! as natively. Pages are never installed beyond the block's new end: the caller
//! passes the grown part only.

use crate::page::{pages, PAGE_SIZE, PMD_SIZE};
use crate::pool::zero::source::ZeroSource;
use crate::stats::Stats;
use crate::sys::raw::Errno;
use crate::sys::uffd::Uffd;
use crate::Shared;

/// Where the fill of a growth of `len` bytes at `addr` ends: before the first whole PMD the
/// growth holds (the windows give whole PMDs huge pages, and a vector that doubled writes its
/// new half over time), else at its end: a step that crosses a PMD boundary is filled on
/// both sides of it.
///
/// # Context
/// A program thread, inside a hook; arithmetic only.
pub(crate) fn fill_end(addr: usize, len: usize) -> usize {
    let end = addr.saturating_add(len);
    let whole = addr.next_multiple_of(PMD_SIZE);
    if whole.saturating_add(PMD_SIZE) <= end {
        whole
    } else {
        end
    }
}

/// Installs zero pages in `[dst, dst + len)` (claimed by the caller, no page there yet):
/// copies of the zero source, the kernel allocating each page as its own fault would, without
/// the trap. Not pool pages: moved from a program thread while the scrub refills the small
/// ring on the other CPU, each move flushes that CPU's TLB (an interrupt; an exit in a virtual
/// machine) and the two contend for the ring's page-table lock: slower than copies
/// (docs/DESIGN.md, "Blocks that grow in small steps").
/// A page found present is skipped (counted in); any other refusal (an event pending, the
/// memory gone) stops it, and the rest faults as usual. Returns the bytes from `dst` that
/// hold a page now.
///
/// # Context
/// A program thread, inside a hook (`Engine::fill_grown`).
pub(crate) fn fill(shared: &Shared, u: &Uffd, dst: usize, len: usize) -> usize {
    let (zero, mut off) = (shared.zero.addr(), 0);
    while off < len {
        // SAFETY: the zero source reads zero, as a fresh anonymous page.
        let p = unsafe { u.copy(dst + off, zero, (len - off).min(ZeroSource::LEN)) };
        Stats::add(&shared.stats.pages_copied, pages(p.done));
        off += p.done;
        match p.errno {
            None => {}
            Some(Errno(libc::EAGAIN)) if p.done > 0 => {}
            // A page there already (the claim was ours, the page is: skipped, as a handler
            // does).
            Some(Errno(libc::EEXIST)) => off += PAGE_SIZE,
            Some(_) => break,
        }
    }
    debug_assert!(off % PAGE_SIZE == 0);
    off
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: usize = 0x7f00_0000_0000;

    #[test]
    fn a_growth_is_filled_up_to_its_first_whole_pmd_and_never_a_whole_pmd() {
        let k = 64 << 10;
        // 64 KiB steps inside a PMD, at its start, at its end, and across its end: all of it.
        assert_eq!(fill_end(A + PMD_SIZE / 2, k), A + PMD_SIZE / 2 + k);
        assert_eq!(fill_end(A, k), A + k);
        assert_eq!(fill_end(A + PMD_SIZE - k, k), A + PMD_SIZE);
        assert_eq!(fill_end(A + PMD_SIZE - k + PAGE_SIZE, k), A + PMD_SIZE + PAGE_SIZE);
        // Holding a whole PMD: up to it, that PMD and the rest are the windows'.
        assert_eq!(fill_end(A + PMD_SIZE - k, 8 << 20), A + PMD_SIZE);
        assert_eq!(fill_end(A, PMD_SIZE), A);
        assert_eq!(fill_end(A, 448 << 20), A);
        assert_eq!(fill_end(A, PMD_SIZE - PAGE_SIZE), A + PMD_SIZE - PAGE_SIZE);
    }
}
