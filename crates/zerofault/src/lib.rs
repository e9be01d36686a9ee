//! # zerofault: anonymous page faults served from a pre-zeroed pool
//!
//! Five Linux postings from 2004–2006 made the anonymous fault path fast: **anticipatory
//! prefaulting** (seed 000: predict sequential faults and prepare pages ahead of them),
//! **prezeroing** (seeds 002/003: hand out pages a background scrub daemon zeroed earlier), and
//! **fault scalability** (seed 004: populate empty page-table entries with atomic operations).
//! zerofault does the same in user space, on an unmodified Linux ≥ 6.8, through userfaultfd:
//! the engine registers the program's large anonymous regions, and handler threads (one by
//! default on up to 15 CPUs, `ZEROFAULT_HANDLERS`) answer their missing-page faults with
//! pages that a scrub thread prepared earlier, moved into place with `UFFDIO_MOVE` (the page
//! frames change owner; no byte is copied).
//!
//! Why it pays: a native 4 KiB first touch pays a trap and the zeroing of a page, per page. One
//! userfaultfd round trip costs about ten such faults, but it can install a whole window, so
//! that past a few hundred pages a window the faulting thread spends a fraction of a fault per
//! page, and less again when three of the window's four PMDs are moved as huge pages (the
//! figures: `shared/notes/uffd-facts.md`, docs/BENCHMARKS.md).
//!
//! ## The life of a fault
//! 1. A thread writes to a page of a [`Region`] that has no page yet. The kernel blocks it and
//!    queues a message on the userfaultfd: address, read or write, thread id.
//! 2. A handler thread (`fault/`) reads it, finds the range (`memory/region.rs`) and asks that
//!    thread's predictor (`fault/window.rs`, one table the handlers share) for a window: 16 pages for a first fault, four times
//!    more each time the fault lands where the last window ended, up to 2048 (stretched to end
//!    one page short of a PMD boundary, so that the next window's PMDs are whole); one page
//!    for a fault nobody predicted. A new stream's first window leaves out the page after the
//!    fault's (a probe): a writer of every page faults there once; one that goes past it
//!    untouched writes sparsely (step 6). Once a stream reaches 2048, its windows also cover a
//!    window ahead (`fault/ahead.rs`): whole PMDs after the window, as many pages as the stream
//!    has written, up to 32768, so that a warm writer faults once per 128 MiB.
//! 3. It claims the window in the range's page-state map (`memory/pagemap.rs`): one atomic `fetch_or`
//!    per 64 pages. The bits it set are the pages it installs; bits already set belong to
//!    someone else. So two handlers never install the same page, and no lock is taken.
//! 4. For a write it takes ready pages from the pool (`pool/`) and moves them with
//!    `UFFDIO_MOVE`. Every whole 2 MiB-aligned PMD of the window gets a transparent huge page
//!    from the pool's huge ring, moved with one PMD update (one entry for 512 pages); the rest, and
//!    always the PMD the fault landed in (the kernel gave it a page table before it asked us),
//!    get 4 KiB pages from the small ring, one ioctl per contiguous run. The pieces go in last
//!    to first, so the thread wakes only when its whole window is there. A read maps the shared
//!    zero page (`UFFDIO_ZEROPAGE`), spending no pool page, as the seed did, until two sample
//!    pages of the thread's last read window show that the program writes what it reads: then
//!    its reads are served as writes (`fault/reads.rs`). A window that
//!    runs past the end of its mapping (memory committed piece by piece with `mprotect`, as a
//!    heap grown in place or a JVM heap is) is refused whole by the kernel; it then goes in
//!    as halving pieces from the fault on, rather than a page per fault.
//! 5. If the huge ring is empty the handler prepares the huge page itself (one populate of a
//!    2 MiB staging area, then the move: what the kernel's own THP fault would do, while the
//!    scrub refills on the other CPU); if the small ring is empty the pages are copied from a
//!    zero source (`UFFDIO_COPY`), and the scrub thread is kicked. The faulting thread never
//!    waits for the scrubber.
//! 6. When a thread's faults in a region keep missing the predictions (random access), the
//!    span they fell in is unregistered: the kernel serves it natively from then on, because a
//!    round trip per sparse page would cost ten native faults. A sparse stream (past its probe,
//!    or missing at one stride, or going down) has its way ahead unregistered at once: 64 MiB
//!    or more, so that only what it touches becomes resident.
//!
//! ## The life of a page
//! 1. Reserved: the pool is two anonymous areas used as rings (`MADV_DONTFORK`): a small one
//!    of 4 KiB pages (`MADV_NOHUGEPAGE`, a quarter of `pool_max`) and a huge one of 2 MiB
//!    transparent huge pages (`MADV_HUGEPAGE`, the rest; `pool_thp=off` or THP `never` leaves
//!    only the small one); at first no page exists.
//! 2. Zeroed: the scrub thread (`pool/scrub.rs`), while it has a CPU to itself, populates 2 MiB at a time with
//!    `MADV_POPULATE_WRITE`, into whichever ring is emptier, whenever the pool is below
//!    `scrub_start`, until `scrub_stop`. The kernel zero-fills them there, off every critical
//!    path (seed 003: zero cold pages, in bulk, on an idle CPU).
//! 3. Served: a fault's window moves it from the pool into the program's region. It is now an
//!    ordinary anonymous page of the program: swapped, migrated, freed like any other.
//! 4. Forgotten: when the program drops it (`madvise(MADV_DONTNEED)`, `munmap`, `mremap`), the
//!    kernel tells the handler (REMOVE / UNMAP / REMAP events) and the page's state bit is
//!    cleared, so the next touch is served again and reads zero.
//!
//! ## Failing open
//! Everything the engine does is an optimisation of what the kernel would do anyway. If a
//! handler thread panics, meets an errno no install expects (EPERM from a seccomp filter,
//! EBADF, a failed wake), the program closes the engine's descriptor, or the [`Engine`] is
//! dropped, every range is unregistered (by the last handler to leave, which then reads what
//! is still queued until its copy of the descriptor is the last: `Shared::drain_then_close`);
//! the kernel then wakes every blocked fault and serves every later one itself. Pages already
//! installed stay; nothing is lost, nothing hangs.
//!
//! ## Living inside other programs
//! The engine's threads are its own (`sys/thread.rs`): made with `clone(2)` on memory and TLS
//! the engine set up, so that starting them calls no allocator of the program's, and started
//! with every signal blocked, each in a descriptor table of its own that holds only the
//! userfaultfd (their opens of /proc never take a number the program's `open` expects). The
//! program's table holds one descriptor of the engine's, the userfaultfd (Engine::drop wakes
//! each handler by faulting on a page of its own, its doorbell). Every system call goes
//! through `sys/raw.rs`, which leaves the program's `errno` alone; its mappings are never
//! locked or populated by a program's `mlockall`, and are asked for in an address zone of their
//! own (`sys/mman.rs`). Its metadata grows with what is touched, not with what is reserved
//! (`memory/pagemap.rs`). Where the program asks for transparent huge pages (`MADV_HUGEPAGE`), the
//! kernel tries one before it asks us, with the PMD still empty, and the engine then moves a
//! whole huge page into each PMD of the window, from the PMD of the fault on.
//!
//! ## Where things are
//! - [`Engine`] (`engine/`): its API (`mod.rs`), its start (`start.rs`: userfaultfd, doorbells,
//!   pools, staging areas, threads), the program's life-cycle calls (`life.rs`: fork,
//!   `mlockall`, pause and resume around the calls that change the process's rights, exit,
//!   drop, failing open), what it reports (`report.rs`: pool levels, counters, options) and its
//!   errors, one type per operation (`error.rs`: [`StartError`],
//!   [`MapError`], [`RecycleError`]). The state its threads, handle and regions share, and
//!   its one constructor: `state.rs`. The layout and its rules: docs/DESIGN.md,
//!   "The engine's layout" (`.ci/layout` checks them).
//! - The life of a fault (`fault/`): the handler threads' loop and dispatch, and what they
//!   share (`fault/handler.rs`; the protocol between them: docs/SCALING.md), the events read
//!   in order and the windows in flight (`fault/events.rs`), the node a fault's pages come
//!   from (`fault/numa.rs`), locating a fault: range, claim, window (`fault/locate.rs`), and the
//!   install verbs `fill_move`, `fill_copy`, `fill_zeropage` (`fault/install.rs`), windows
//!   ahead (`fault/ahead.rs`), reads before writes (`fault/reads.rs`), behind the `Kernel`
//!   seam the unit tests fake (`fault/tests.rs`). A block the shim grows in small steps is
//!   filled in the call that grew it (`fault/grow.rs`, [`Engine::fill_grown`]).
//! - Whole-PMD placement and the staging area: `fault/huge.rs`. The prefault window (the
//!   predictor): `fault/window.rs`. Giving random access back to the kernel:
//!   `fault/handback.rs`; lending starved ranges to it: `fault/lend.rs`.
//! - The memory served (`memory/`): per-page state (`pagemap.rs`), per-PMD state (`pmds.rs`:
//!   may hold a page table, the program's huge-page and access advice), the registered
//!   ranges (`region.rs`: [`Region`], `Range` and the records it carries) and their table
//!   (`ranges.rs`).
//! - The pool (`pool/`): its clean rings (`ring.rs`), recycling the pages the program frees
//!   into them (`recycle.rs`; the dirty rings, `dirty.rs`; [`Recycled`]), the scrub thread
//!   (`scrub.rs`; its share of the CPUs, `share.rs`; its choice of stores, `zero/choice.rs`),
//!   what the pools may hold inside the process's memory cgroup (`budget.rs`), and zero bytes
//!   (`zero/`: the copy path's source, `source.rs`; the zeroing methods, [`ZeroMethod`],
//!   `methods.rs`, timed by `zerofault bench-zero`; Intel DSA's memory fill through a work
//!   queue, `dsa.rs`, run only against a fake).
//! - NUMA nodes: which node's pool a fault takes from, in the kernel's order, and the zonelist
//!   cache of nodes found full (`memory/nodes.rs`; a handler's use of it, `fault/numa.rs`; the
//!   system calls in `sys/numa.rs`).
//! - Sharing the machine with this user's other processes under the shim (`pool/machine.rs`: at
//!   most `cpus - 1` scrubs stepping, handlers polling only beside a free CPU; its file,
//!   checked before it is trusted, in `sys/machine.rs`).
//! - Knobs (`config/`: [`options`] (`options.rs`), the table read from `ZEROFAULT_<NAME>`;
//!   `kinds.rs`, the kinds of values), counters (`stats.rs`: [`Stats`], [`Snapshot`]),
//!   sizes and alignment (`page.rs`, [`page`]).
//! - Every system call, and every read of /proc, sysfs and /dev: `sys/`, whose contract
//!   `sys/mod.rs` states: userfaultfd and its ioctls (`uffd.rs`), its messages (`uffd_msg.rs`),
//!   mmap and the rest of the memory calls (`mman.rs`), /proc/self/maps and smaps (`maps.rs`),
//!   the page-table walk (`pagemap.rs`), NUMA (`numa.rs`), the engine's threads (`thread.rs`),
//!   their TLS (`tls.rs`), scheduling and CPU time (`sched.rs`), the memory cgroup
//!   (`cgroup.rs`), the machine-wide state's file (`machine.rs`), DSA work queues (`dsa.rs`),
//!   files read through raw calls (`file.rs`), and the system call itself (`raw.rs`). [`os`]
//!   (`os.rs`) is the part of it an embedder living inside another program (the LD_PRELOAD
//!   shim) uses. The engine's own allocator over raw mmap, the shim's global
//!   allocator: `alloc.rs`.
//! - Which thread runs what:
//!
//!   | thread | runs | may sleep |
//!   |---|---|---|
//!   | a program thread, in a shim hook or an API call | `Engine::map`, `adopt`, `adopt_grown`, `release`, `recycle` (`pool/recycle.rs`), `fill_grown` (`fault/grow.rs`), `fill_page`, `set_huge`, `pause`/`resume`, `stats` | on the registration lock and ring locks; never on a handler or a scrub |
//!   | a handler (`zerofault-fault`) | `fault/` (read, locate, install, ahead, reads), `fault/window.rs`, `fault/handback.rs` (give back), `fault/lend.rs` (lend, take back), `fault/events.rs`, `fault/numa.rs`, `fault/huge.rs` (staging), `memory/nodes.rs` (choosing) | in its wait and its poll; on the predictor and event-order locks |
//!   | a scrub (`zerofault-scrub`), one per pool | `pool/`: `scrub.rs` (refill, zero the dirty rings, purge, shrink), `budget.rs` (the first scrub), `mod.rs` (`fill_step`), `zero/` | between steps, resting, waiting for the program to be quiet |
//!
//!   Each entry point's `# Context` paragraph says which of these runs it and what it locks.
//! - Checking: `sync.rs` switches the lock-free parts' atomics to loom's under `cfg(loom)`,
//!   and `loom_tests` in `pool/ring.rs`, `memory/pagemap.rs`, `pool/dirty.rs`, `fault/lend.rs` and
//!   `fault/events.rs` model the ring, the page map, the dirty ring, the recent-faulters
//!   table and the windows in flight; debug builds check the ring's and the range table's
//!   invariants (`is_valid`) after each change; `testing.rs` holds what the unit tests share.

#![warn(
    missing_docs,
    unreachable_pub,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::ptr_as_ptr
)]

#[cfg(not(target_pointer_width = "64"))]
compile_error!("zerofault serves 64-bit Linux (x86-64, arm64) only");

mod alloc;
mod config;
mod engine;
mod fault;
mod memory;
pub use config::options;
pub mod os;
pub mod page;
mod pool;
mod state;
mod stats;
mod sync;
mod sys;
#[cfg(test)]
mod testing;

pub use engine::{in_engine_thread, probe, Advice, Engine, MapError, NodePool, RecycleError, StartError};
pub use memory::region::{Recycled, Region};
pub use options::{OptionError, Options, StatsOut};
pub use pool::zero::{is_zero, Unavailable, ZeroMethod};
pub(crate) use state::Shared;
pub use stats::{Snapshot, Stats};
pub use sys::uffd::{Features, UffdError};
