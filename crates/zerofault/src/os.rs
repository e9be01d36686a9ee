//! The part of the system-call seam that an embedder living inside another program's process
//! needs (the LD_PRELOAD shim is one): memory mapped for itself, the engine's own allocator and
//! its fork hooks, blocking signals, preparing threads, and system calls that leave the
//! program's `errno` alone.
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
}

/// System calls that leave the program's `errno` alone.
pub mod raw {
    pub use crate::sys::raw::{call, syscall, Errno};
}

/// Signals and threads.
pub mod thread {
    pub use crate::sys::thread::{
        forget_engine_threads_after_fork, own_allocator, prepare, seccomp_filtered, traced, Blocked,
    };
}

/// The machine-wide state shared with this user's other processes (`machine.rs`).
pub mod machine {
    pub use crate::machine::set_runtime_dir;
}

/// The engine's allocator over raw mmap, and its fork hooks.
pub mod alloc {
    pub use crate::alloc::{fork_child, fork_parent, fork_prepare, EngineAlloc};
}
