//! The part of the system-call seam that an embedder living inside another program's process
//! needs (the LD_PRELOAD shim is one): memory mapped for itself, the engine's own allocator and
//! its fork hooks, blocking signals, preparing threads, and system calls that leave the
//! program's `errno` alone. The bench uses it too: plain kernel memory for its baselines
//! ([`mman::Mapping`]) and the moves `zerofault bench-flush` times ([`uffd`]).
//!
//! The contract is the seam's (`sys/mod.rs`): page-aligned addresses and page-multiple
//! lengths, errors as values, and every call that can break memory an `unsafe fn` whose
//! `# Safety` says what the caller must own.

/// mmap, mprotect, madvise, mlock and mincore on memory the caller owns.
pub mod mman {
    pub use crate::page::{PAGE_SIZE, PMD_SIZE};
    pub use crate::sys::mman::{
        address_limit, anon_huge_bytes, madvise, map_aligned, map_private, mlock, munlock, protect, remap_fresh,
        resident_pages, thp_always, thp_available, unmap, Mapping, Thp,
    };
    pub use libc::{MADV_DONTNEED, MADV_NOHUGEPAGE};

    /// Whether the PMD at `addr` (2 MiB aligned) is mapped by one transparent huge page
    /// (`PAGEMAP_SCAN` of /proc/self/pagemap).
    pub fn huge_mapped(addr: usize) -> std::io::Result<bool> {
        crate::sys::mman::huge_mapped(addr)
    }
}

/// A userfaultfd that moves pages between the caller's own mappings (`UFFDIO_MOVE`), and
/// registers nothing for faults: what `zerofault bench-flush` times.
pub mod uffd {
    pub use crate::sys::raw::Errno;
    pub use crate::sys::uffd::{Features, Progress, UffdError};

    /// An open userfaultfd, with every feature the engine asks for that the kernel offers;
    /// closed on drop (which unregisters its ranges).
    #[derive(Debug)]
    pub struct Uffd(crate::sys::uffd::Uffd);

    impl Uffd {
        /// Opens a userfaultfd (see [`UffdError`] for why it may not).
        pub fn open() -> Result<Uffd, UffdError> {
            crate::sys::uffd::Uffd::open().map(Uffd)
        }

        /// The features this descriptor was opened with.
        pub fn features(&self) -> Features {
            self.0.features()
        }

        /// Registers `[start, start + len)` (page aligned, the caller's own memory) as a
        /// destination of [`Uffd::move_pages`], and for nothing else: its missing pages stay
        /// the kernel's to fill.
        pub fn register_as_destination(&self, start: usize, len: usize) -> Result<(), Errno> {
            self.0.register_as_destination(start, len)
        }

        /// `UFFDIO_MOVE` the pages at `src` (exclusive anonymous pages of this process) to
        /// `dst`, registered as a destination: the page frames change owner, no byte is written.
        ///
        /// # Safety
        /// The caller owns `[src, src + len)` and `[dst, dst + len)`: no one reads or writes
        /// them while the move runs, and `src` reads as missing afterwards.
        pub unsafe fn move_pages(&self, dst: usize, src: usize, len: usize) -> Progress {
            // SAFETY: this function's contract.
            unsafe { self.0.move_pages(dst, src, len) }
        }
    }
}

/// System calls that leave the program's `errno` alone.
pub mod raw {
    pub use crate::sys::raw::{call, syscall, Errno};
}

/// Signals and threads.
pub mod thread {
    pub use crate::sys::thread::{
        forget_engine_threads_after_fork, own_allocator, own_tables, prepare, seccomp_filtered, traced, Blocked,
    };
}

/// The machine-wide state shared with this user's other processes (`pool/machine.rs`).
pub mod machine {
    pub use crate::pool::machine::set_runtime_dir;
}

/// The engine's allocator over raw mmap, and its fork hooks.
pub mod alloc {
    pub use crate::alloc::{fork_child, fork_parent, fork_prepare, reservation_area, EngineAlloc};
}
