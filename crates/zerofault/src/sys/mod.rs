//! The operating-system seam: every unsafe call of the engine lives below this module, each
//! function stating its contract, each unsafe block its `// SAFETY:` argument.
//!
//! - [`uffd`]: userfaultfd(2) and its ioctls, including `UFFDIO_MOVE`.
//! - [`mman`]: mmap, munmap, madvise, mincore.
//! - [`thread`]: the engine's own threads, poll, scheduling class, CPU time, load average.
//! - [`raw`]: the system call itself, which leaves the program's `errno` alone.
//! - [`alloc`]: the engine's own allocator over raw mmap ([`alloc::EngineAlloc`]), so that the
//!   shim's Rust allocations never reach the program's malloc.

pub mod alloc;
pub mod mman;
pub mod raw;
pub mod thread;
pub mod uffd;
