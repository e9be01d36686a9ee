//! The operating-system seam: every system call of the engine is made below this module.
//!
//! The contract, stated once (mimalloc's `prim.h` is the model):
//! - **No errno, no lock of the program's.** Calls go through [`raw`], which leaves the
//!   program's `errno` alone, and nothing here takes a lock the program's allocator may hold.
//!   Every file of /proc, sysfs and /dev the engine reads is opened and read here, through
//!   [`file`] (one directory listing, the DSA queues', goes through `std::fs::read_dir` at
//!   start). What an engine thread reads goes into a buffer on its stack
//!   ([`file::read_small`]); the rest (a few `String`s and `Vec`s, at start and in
//!   diagnostics) comes from the global allocator, which under the shim is the engine's own
//!   (`crate::alloc`), never the program's malloc.
//! - **Nothing of the engine's.** `sys` imports [`crate::page`] and itself, nothing else: what
//!   a call needs from the engine comes in as a parameter.
//! - **Failure is a value.** A call returns the kernel's answer: `Err(`[`raw::Errno`]`)`, an
//!   `io::Error` made from it, or a [`uffd::Progress`] for the ioctls that stop part way. No
//!   call panics on the kernel's answer, and none retries behind the caller's back.
//! - **Pages.** Every address handed in is page aligned and every length a multiple of the
//!   4 KiB page ([`crate::page`]).
//! - **Memory that can break is `unsafe`.** A call that can change memory someone else may be
//!   using (unmap, protect, map over, discard or give away pages, move or copy pages into
//!   place, register a range for faults, close a descriptor) is an `unsafe fn`; its
//!   `# Safety` says what the caller must own, and every call site says why it does. Calls
//!   that only make new memory, read state, or change nothing a reader can see are safe.
//! - **The engine's mappings are its own**: anonymous, private, never locked, placed in an
//!   address zone of their own ([`mman`]).
//!
//! Modules:
//! - [`uffd`]: userfaultfd(2) and its ioctls, including `UFFDIO_MOVE`.
//! - [`uffd_msg`]: the messages a userfaultfd delivers, and their decoding.
//! - [`mman`]: mmap, munmap, mprotect, madvise, mincore.
//! - [`maps`]: what /proc/self/maps and smaps say of the process's mappings.
//! - [`pagemap`]: the page-table walk over /proc/self/pagemap (`PAGEMAP_SCAN`).
//! - [`numa`]: the node topology (sysfs), mbind, get_mempolicy, move_pages (query).
//! - [`thread`]: the engine's own threads, poll, scheduling class, CPU time, load average.
//! - [`tls`]: the process's TLS layout, and its copy for a new engine thread.
//! - [`sched`]: the calling thread's scheduling class, CPUs, CPU time, run delay, load average.
//! - [`cgroup`]: the memory cgroup's limit and usage.
//! - [`machine`]: the machine-wide state's file (found, checked, mapped).
//! - [`file`]: opening and reading files of /proc, sysfs and /dev.
//! - [`dsa`]: the Intel DSA work queues sysfs lists.
//! - [`raw`]: the system call itself, which leaves the program's `errno` alone.

pub(crate) mod cgroup;
pub(crate) mod dsa;
pub(crate) mod file;
pub(crate) mod machine;
pub(crate) mod maps;
pub(crate) mod mman;
pub(crate) mod numa;
pub(crate) mod pagemap;
pub(crate) mod raw;
pub(crate) mod sched;
pub(crate) mod thread;
pub(crate) mod tls;
pub(crate) mod uffd;
pub(crate) mod uffd_msg;
