//! libzerofault_shim.so: the LD_PRELOAD shim proper, and the C API of `include/zerofault.h`.
//!
//! Loaded into a program it never saw, the shim serves the first touch of the program's large
//! anonymous memory with the engine, and changes nothing else.
//!
//! The file in LD_PRELOAD is its front, `libzerofault.so` (`front/front.c`, a small C library
//! the build script compiles): every process started under the shim loads the front, which
//! passes each call to the next definition until the process's first large request, then
//! dlopen()s this library beside it and calls `zerofault_shim_init` (init.rs); every call goes
//! here from then on. Most processes (a build's thousand `sh`, `cc`, `git`) never make one and
//! never load this library, whose loading costs more than the front's (docs/DESIGN.md, "The
//! shim's front"). Dlopen()ed, this library's thread-locals are dynamic TLS, which glibc allocates with the program's malloc on a
//! thread's first touch: no hook touches one on a program thread (the hooks' flags live in the
//! front's static TLS; engine threads are known by their thread pointer, and get their own
//! copy of every TLS block, see `engine::os::thread`).
//!
//! # The rules: it lives inside other people's programs
//! 1. **Nothing on a hook path or an engine thread calls the program's allocator, or takes a
//!    lock the program's allocator may hold.** The program's malloc may be jemalloc calling
//!    `mmap` with its own lock held; a hook that then allocated through it would deadlock.
//!    Every Rust allocation in this library comes from the engine's own allocator over raw
//!    `mmap` ([`engine::os::alloc::EngineAlloc`], the global allocator here), the engine's
//!    threads are made without `pthread_create` (which allocates with the program's `calloc`),
//!    and the only locks a hook takes are the engine's and the arena's.
//! 2. **Signals are the program's.** Engine threads start with every signal blocked, so a
//!    process-directed signal reaches a program thread, as without the shim. A hook that takes
//!    an engine lock blocks signals meanwhile, so that a signal handler calling `mmap` cannot
//!    find that lock held by the thread it interrupted.
//! 3. **Fail open.** Any error on the userfaultfd the engine does not expect closes it: the
//!    kernel serves every fault from then on; the program never hangs and loses no data.
//! 4. **Zero-ness is proved, never assumed.** `calloc` skips its memset only for arena pages
//!    that were never touched or whose discard succeeded ([`arena`]).
//! 5. **The program's memory calls give the results they give without the shim**: `mmap`,
//!    `munmap`, `mremap`, `madvise`, `mprotect`, `mlock`, `mlockall`, the rlimits, THP advice.
//!    Hooks keep `errno` as the real call left it. The engine starts only on the first large
//!    request, reserves nothing that counts against a finite `RLIMIT_AS`/`RLIMIT_DATA`, locks
//!    and populates none of its own memory, and holds one file descriptor (none until then).
//! 6. **Bad input is one line** naming the knob and what it accepts; the program still runs.
//!
//! # What it does
//! - `mmap` / `mmap64` of anonymous private memory at or above `ZEROFAULT_PRELOAD_THRESHOLD`
//!   (2 MiB) is registered with the engine (JVM heaps, jemalloc / mimalloc / tcmalloc arenas),
//!   and so is a smaller `MAP_FIXED` mapping made inside or next to served memory (so that the
//!   pieces merge into one VMA as they would natively). `mremap` follows: grown and moved
//!   memory is served like the rest, and a move the registration would make fail natively
//!   succeeds by handing the range back first ([`mmap`]).
//! - glibc's malloc reaches mmap through an internal call nobody can interpose, so large
//!   malloc-family blocks are carved from one reserved, registered range ([`arena`]); `free`,
//!   `realloc` and `malloc_usable_size` recognise them by address. `realloc` grows in place or
//!   moves pages without copying them. Smaller requests go to the next allocator (found with
//!   `dlsym(RTLD_NEXT)`) untouched.
//! - The program's rights ([`rights`]): the credential calls, `NO_NEW_PRIVS`, `unshare` and
//!   `setns` stop the engine's threads and start them again from the calling thread; a seccomp
//!   filter stops the engine for good; a tracer makes it step aside; the program's own
//!   `UFFDIO_REGISTER` and futex operations the kernel refuses on served memory are tried again
//!   once the engine made way.
//! - fork(): the child's copy of the engine's descriptor is closed at once; its memory is no
//!   longer registered (the engine does not ask for fork events), and its first large request
//!   starts an engine of its own. vfork() children and exec'd images never touch the parent's.
//!
//! # Where things are
//! | file | what |
//! |------|------|
//! | `front.rs` | what the front hands the shim: the thread's flags (in the front's TLS), its lookup of the next definitions |
//! | `init.rs` | `zerofault_shim_init`: the knobs read from `environ`, the report, the fork handlers installed |
//! | `state.rs` | the shim's state in this process: options, engine, arena, `mlockall(MCL_FUTURE)`, a seccomp filter |
//! | `start.rs` | the engine's start on the first large request (once, the others wait), the fork handlers |
//! | `hook.rs` | the hook scope, the one way from a hook to the engine: re-entry guard, errno, signals |
//! | `mmap.rs` | `mmap`, `munmap`, `mremap`, `madvise`, `mlockall`, gperftools' MallocHook |
//! | `malloc.rs` | the malloc family; `next.rs` the next allocator's, `arena.rs` the arena of large blocks |
//! | `rights.rs` | what the front's hooks of rights, seccomp, userfaultfd and futex calls ask of the engine |
//! | `capi.rs` | the C API of `include/zerofault.h` |
//! | `exit.rs` | the destructor: the engine stopped, the exit report (`report.rs` writes it) |
//!
//! Which thread runs what: every hook and C API call runs on the program thread that calls
//! it, inside the hook scope; `zerofault_shim_init` on the thread whose large request loaded
//! the shim; the fork handlers on the thread that forks (and the child's only thread); the
//! destructor on the thread that exits. An engine thread that reaches a hook (through a libc
//! call of its own) gets no engine from the scope, and passes the call through.

#![allow(clippy::missing_safety_doc)]

pub mod arena;
#[cfg(not(test))]
mod capi;
#[cfg(not(test))]
mod exit;
#[cfg(not(test))]
mod front;
mod glibc;
#[cfg(not(test))]
mod hook;
#[cfg(not(test))]
mod init;
#[cfg(not(test))]
mod malloc;
#[cfg(not(test))]
mod mmap;
#[cfg(not(test))]
mod next;
mod report;
#[cfg(not(test))]
pub mod rights;
#[cfg(not(test))]
mod start;
#[cfg(not(test))]
mod state;

#[cfg(not(test))]
pub use capi::*;
#[cfg(not(test))]
pub use malloc::*;
#[cfg(not(test))]
pub use mmap::*;
#[cfg(not(test))]
pub use rights::*;

#[global_allocator]
static ALLOC: engine::os::alloc::EngineAlloc = engine::os::alloc::EngineAlloc;

#[cfg(test)]
mod tests {
    /// The front (front/front.c) loads the shim on requests of at least `ZF_FRONT_THRESHOLD`
    /// when no knob is set: that must be the knob's default, or requests between the two would
    /// be served or not depending on whether the shim happened to be loaded.
    #[test]
    fn the_front_loads_the_shim_at_the_default_threshold() {
        let src = include_str!("../front/front.c");
        let line = src
            .lines()
            .find(|l| l.starts_with("#define ZF_FRONT_THRESHOLD"))
            .expect("front.c defines ZF_FRONT_THRESHOLD");
        // #define ZF_FRONT_THRESHOLD ((size_t)2 << 20)
        let expr = line.split("(size_t)").nth(1).expect("((size_t)A << B)");
        let (a, b) = expr.trim_end_matches(')').split_once("<<").expect("A << B");
        let front = a.trim().parse::<usize>().unwrap() << b.trim().parse::<u32>().unwrap();
        assert_eq!(front, engine::Options::default().preload_threshold);
    }
}
