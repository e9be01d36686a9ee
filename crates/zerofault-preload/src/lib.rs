//! libzerofault.so: the LD_PRELOAD shim, and the C API of `include/zerofault.h`.
//!
//! Loaded into a program it never saw, the shim serves the first touch of the program's large
//! anonymous memory with the engine, and changes nothing else:
//!
//! - `mmap` / `mmap64` of anonymous private memory at or above `ZEROFAULT_PRELOAD_THRESHOLD`
//!   (2 MiB): the mapping is made as asked, then registered with the engine (JVM heaps,
//!   jemalloc / mimalloc / tcmalloc arenas). munmap, mremap and madvise of it reach the engine
//!   as userfaultfd events.
//! - glibc's malloc reaches mmap through an internal call nobody can interpose, so large
//!   `malloc`, `calloc`, `realloc`, `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`
//!   and `pvalloc` blocks are carved from one reserved, registered range (the arena, see
//!   [`arena`]); `free`, `realloc` and `malloc_usable_size` recognise them by address. Smaller
//!   requests go to the next allocator (found with `dlsym(RTLD_NEXT)`) untouched.
//!
//! Safety in any process:
//! - Until the engine is up, and on the engine's own threads, every hook passes through; a
//!   thread-local flag keeps the shim's own allocations (inside a hook) away from the hooks.
//! - Options come from `environ` in the constructor; nothing is printed unless asked
//!   (`ZEROFAULT_STATS=1`), except one line naming a knob whose value is refused.
//! - fork(): the arena lock is held across the fork, so the child's copy is consistent. The
//!   child's memory is no longer registered (the engine does not ask for fork events), so the
//!   child runs on kernel faults until its first large request, which starts a fresh engine
//!   there (its counters add to the same `MAP_SHARED` block the parent prints). vfork()
//!   children (no fork handlers run) and exec() images never touch the parent's engine; an
//!   exec'd program loads the shim afresh.
//! - Fail open: no userfaultfd, an old kernel, a refused option, an engine error: the hooks
//!   pass through and the program runs on plain memory.

#![allow(clippy::missing_safety_doc)]

pub mod arena;
#[cfg(not(test))]
mod hooks;
#[cfg(not(test))]
pub use hooks::*;
