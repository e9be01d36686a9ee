//! The fault handlers: threads reading the userfaultfd and answering each message (one by
//! default; `handlers` of them, each serving whichever message it reads: docs/SCALING.md has
//! what they share and how events stay ordered).
//!
//! A page fault goes through three steps, each in a file named after it:
//! 1. [`handler`]: the thread loop reads messages and dispatches them. Events (REMOVE, UNMAP,
//!    REMAP) update the range table; faults go on. Faults read while draining for an event
//!    (below) wait in a queue of deferred faults and are handled next.
//! 2. [`locate`]: find the fault's range (a fault outside every range, a race with
//!    munmap/mmap, is served one page at a time and woken: never left blocked); a page whose
//!    state bit is set already is another window's (or the map is stale): one page is tried,
//!    EEXIST proves it present. Otherwise the thread's predictor ([`crate::fault::window`]) gives the
//!    window, the range's miss run may hand a span back to the kernel ([`crate::fault::handback`]), and
//!    the window is claimed in the page map: the newly claimed runs are the pages to install.
//! 3. [`install`]: writes take whole huge pages where a PMD holds no page table
//!    ([`crate::fault::huge`]), pool pages moved in (`fill_move`) elsewhere, and copies of the zero
//!    source (`fill_copy`) for what the pool cannot give; reads map the zero page
//!    (`fill_zeropage`), no pool page spent, unless the program writes what it reads
//!    ([`reads`]: then as writes). Runs and pieces go in last to first, so that the
//!    thread is woken once its window is complete; it is woken explicitly if no install
//!    covered it. A window refused whole at the end of its mapping goes in as halving pieces.
//! 4. [`ahead`]: a confirmed stream's window ahead (by default part of the window itself,
//!    installed before the wake; with `ahead=wake`, installed here after it).
//!
//! Partial progress: EEXIST skips one present destination page; ENOENT on a move skips one
//! source hole (checked with mincore, so that a vanished destination is not mistaken for a
//! hole); EAGAIN with progress retries from where it stopped; EAGAIN without progress means a
//! munmap/madvise/mremap event is pending (`mmap_changing`), so pending messages are read and
//! their events applied before retrying. Anything else ends the install with a [`Stop`]; the
//! bits of pages not installed are released and the thread, woken, faults again if it still
//! needs to.
//!
//! Fail open: if the thread panics, or an ioctl fails with an errno no install expects, the
//! userfaultfd is closed. The kernel then wakes every blocked fault and serves all later ones.
//!
//! The ioctls go through [`Kernel`], so that the install policy is unit-tested against a fake
//! (`tests.rs`) without a real userfaultfd.

mod ahead;
mod events;
pub(crate) mod grow;
pub(crate) mod handback;
mod handler;
pub(crate) mod huge;
mod install;
pub(crate) mod lend;
mod locate;
mod numa;
mod reads;
#[cfg(test)]
mod tests;
pub(crate) mod window;

pub(crate) use events::{Inflight, EVENT_RETRIES};
pub(crate) use handler::{run, Handler};

pub(crate) use crate::sys::mman::PageState;
use crate::sys::raw::Errno;
use crate::sys::uffd::{Msg, Progress, RawMsg, Uffd};

/// Messages read per read(2).
const BATCH: usize = 64;

/// The userfaultfd operations of the fault path: [`Uffd`] in the engine, a fake in the tests.
pub(crate) trait Kernel {
    /// `UFFDIO_MOVE` of `[src, src + len)` to the missing pages at `dst`.
    ///
    /// # Safety
    /// As [`Uffd::move_pages`]: the caller owns the source, whose bytes the program may see.
    unsafe fn move_pages(&self, dst: usize, src: usize, len: usize) -> Progress;
    /// `UFFDIO_COPY` of `[src, src + len)` into the missing pages at `dst`.
    ///
    /// # Safety
    /// As [`Uffd::copy`]: the source is readable and its bytes are what the program may see.
    unsafe fn copy(&self, dst: usize, src: usize, len: usize) -> Progress;
    /// `UFFDIO_ZEROPAGE`: the zero page at the missing pages of `[dst, dst + len)`.
    fn zeropage(&self, dst: usize, len: usize) -> Progress;
    /// Wakes the threads faulting in `[addr, addr + len)`.
    fn wake(&self, addr: usize, len: usize) -> Result<(), Errno>;
    /// Hands `[addr, addr + len)` back to the kernel.
    fn unregister(&self, addr: usize, len: usize) -> Result<(), Errno>;
    /// Takes `[addr, addr + len)` back from the kernel (after a loan).
    ///
    /// # Safety
    /// As [`Uffd::register`].
    unsafe fn register(&self, addr: usize, len: usize) -> Result<(), Errno>;
    /// Reads the pending messages that fit in `out` without blocking; 0 when none is pending.
    fn read(&self, out: &mut [Msg]) -> Result<usize, Errno>;
    /// The run of accessible (not `PROT_NONE`) mappings holding `addr`, as `[lo, hi)`; `None`
    /// if `addr` is in none.
    fn mapping_of(&self, addr: usize) -> Option<(usize, usize)>;
    /// The state of each page from `addr` into `out` (see [`PageState`]); false when it
    /// cannot be known (no /proc, a sandbox).
    fn page_states(&self, addr: usize, out: &mut [PageState]) -> bool;
}

impl Kernel for Uffd {
    unsafe fn move_pages(&self, dst: usize, src: usize, len: usize) -> Progress {
        // SAFETY: the caller upholds the contract, which is the same.
        unsafe { Uffd::move_pages(self, dst, src, len) }
    }

    unsafe fn copy(&self, dst: usize, src: usize, len: usize) -> Progress {
        // SAFETY: as above.
        unsafe { Uffd::copy(self, dst, src, len) }
    }

    fn zeropage(&self, dst: usize, len: usize) -> Progress {
        Uffd::zeropage(self, dst, len)
    }

    fn wake(&self, addr: usize, len: usize) -> Result<(), Errno> {
        Uffd::wake(self, addr, len)
    }

    fn unregister(&self, addr: usize, len: usize) -> Result<(), Errno> {
        Uffd::unregister(self, addr, len)
    }

    unsafe fn register(&self, addr: usize, len: usize) -> Result<(), Errno> {
        // SAFETY: the caller upholds the contract, which is the same.
        unsafe { Uffd::register(self, addr, len) }
    }

    fn mapping_of(&self, addr: usize) -> Option<(usize, usize)> {
        crate::sys::mman::accessible_around(addr)
    }

    fn page_states(&self, addr: usize, out: &mut [PageState]) -> bool {
        // Opened for each look (a few per 8 MiB read window): a descriptor kept open would
        // outlive a fork in the child, where /proc/self is someone else.
        std::fs::File::open("/proc/self/pagemap")
            .and_then(|f| crate::sys::mman::page_states(&f, addr, out))
            .is_ok()
    }

    fn read(&self, out: &mut [Msg]) -> Result<usize, Errno> {
        let mut raw = [RawMsg::default(); BATCH];
        let n = out.len().min(BATCH);
        let got = Uffd::read(self, &mut raw[..n])?;
        for (o, r) in out.iter_mut().zip(&raw[..got]) {
            *o = r.decode();
        }
        Ok(got)
    }
}

/// Why an install stopped before the end of its span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The kernel refused with this errno. ENOENT or EINVAL for a whole span: it runs past
    /// the end of its mapping, or the mapping is gone; EAGAIN: events kept coming; EBUSY: a
    /// page shared after fork; see [`handler::benign`] for the rest.
    Kernel(Errno),
    /// The pool's ring has no ready page left.
    RingEmpty,
    /// The pool run taken for a move is used up (its pages were holes).
    RunUsed,
    /// No huge page could be made here: no staging area, resting after a slow populate, or the
    /// populate failed.
    NoHugePage,
}

impl Stop {
    /// The kernel refused the span as a whole: it crosses the end of its mapping (or the
    /// mapping is gone).
    pub(crate) fn refused_whole(self) -> bool {
        matches!(self, Stop::Kernel(Errno(libc::ENOENT | libc::EINVAL)))
    }
}

/// An install that stopped: at byte offset `at` of its span, for `why`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stopped {
    pub(crate) at: usize,
    pub(crate) why: Stop,
}

impl Stopped {
    /// The same stop, seen from a span that starts `off` bytes earlier.
    pub(crate) fn offset(self, off: usize) -> Stopped {
        Stopped {
            at: self.at + off,
            why: self.why,
        }
    }
}

/// How an install of a span ended: all of it installed (or found present), or [`Stopped`].
pub(crate) type Filled = Result<(), Stopped>;
