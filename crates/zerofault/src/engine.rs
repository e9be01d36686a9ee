//! The engine: its userfaultfd, its threads, the state they share, and failing open.
//!
//! [`Engine`] owns the handler thread ([`crate::fault`]) and the scrub thread
//! ([`crate::pool::scrub`]); [`Shared`] is what they and every [`Region`] hold. Failing open
//! ([`Shared::fail_open`]) closes the userfaultfd: the kernel wakes every blocked fault and
//! serves all later ones. After a fork the child's copy is closed and forgotten
//! ([`Engine::forget_after_fork`]).

use crate::memory::region::Region;
use crate::options::{OptionError, Options};
use crate::page::{bytes, pages};
use crate::pool::scrub;
use crate::pool::zero::source::ZeroSource;
use crate::pool::Pool;
use crate::state::{ring_doorbells, Shared, SharedParts};
use crate::stats::Snapshot;
use crate::stats::{Stats, StatsHome};
use crate::sys::mman::{self, PAGE_SIZE, PMD_SIZE};
use crate::sys::raw::Errno;
use crate::sys::thread::EngineThread;
use crate::sys::uffd::Uffd;
use crate::sys::uffd::{Features, UffdError};
use crate::{fault, sys};
use std::io;
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};

/// Ranges in a row found sparse and given back to their end after which the program's new mappings
/// are left to the kernel, all but one in as many (see [`Engine::leaves_mapping`]).
pub(crate) const SPARSE_BACKOFF: u32 = 8;
/// Mappings this large are never left to the kernel by the backoff (see
/// [`Engine::leaves_mapping`]).
const LEAVE_BELOW: usize = 64 << 20;

/// Why the engine could not start or could not serve a request.
#[derive(Debug)]
pub enum EngineError {
    /// A knob had a bad value (the message names it and what it accepts).
    Options(OptionError),
    /// No userfaultfd could be opened.
    Uffd(UffdError),
    /// The system page size is not the 4 KiB the engine serves.
    PageSize(usize),
    /// Mapping memory failed.
    Map(io::Error),
    /// Registering a range with the userfaultfd failed.
    Register(io::Error),
    /// Starting the handler or scrub thread failed.
    Thread(io::Error),
    /// An address or length was not page aligned.
    Unaligned {
        /// The address asked for.
        addr: usize,
        /// The length asked for.
        len: usize,
    },
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Options(e) => write!(f, "{e}"),
            EngineError::Uffd(e) => write!(f, "{e}"),
            EngineError::PageSize(p) => write!(f, "the page size is {p} bytes; zerofault serves 4096-byte pages"),
            EngineError::Map(e) => write!(f, "failed to map memory: {e}"),
            EngineError::Register(e) => write!(f, "failed to register memory with the userfaultfd: {e}"),
            EngineError::Thread(e) => write!(f, "failed to start an engine thread: {e}"),
            EngineError::Unaligned { addr, len } => {
                write!(f, "range {addr:#x}+{len:#x} is not page aligned (4096 bytes)")
            }
        }
    }
}

impl std::error::Error for EngineError {}

impl From<OptionError> for EngineError {
    fn from(e: OptionError) -> Self {
        EngineError::Options(e)
    }
}

/// The engine: a userfaultfd, its handler thread, the pool and its scrub thread.
///
/// Dropping it stops both threads and closes the userfaultfd (regions still alive keep their
/// memory; the kernel serves their faults from then on).
#[derive(Debug)]
pub struct Engine {
    shared: Arc<Shared>,
    /// The engine's threads; empty while paused ([`Engine::pause`]).
    threads: Mutex<Threads>,
}

/// The engine's threads.
#[derive(Debug, Default)]
struct Threads {
    handlers: Vec<EngineThread>,
    /// One scrub thread per pool.
    scrubbers: Vec<EngineThread>,
    /// Callers of [`Engine::pause`] not resumed yet (one for good, after
    /// [`Engine::stop_for_good`]): the threads are stopped while any holds them.
    holders: usize,
}

/// Whether the calling thread is one of an engine's own (fault handler, scrub). An LD_PRELOAD
/// shim passes their allocations and mappings straight to the system: they serve faults and
/// must never wait on one. No thread-local is read (a registry of thread pointers in `sys/thread.rs`).
pub fn in_engine_thread() -> bool {
    sys::thread::is_engine_thread()
}

/// Whether this process can open a userfaultfd, and with which features.
pub fn probe() -> Result<Features, UffdError> {
    Uffd::open().map(|u| u.features())
}

/// The NUMA view the engine runs with: `None` (one pool, nothing NUMA done) unless at least
/// two nodes with memory are open to the process, and the calls per-node pools need work here
/// (a container's seccomp profile may refuse them: then it runs as on one node). Handler
/// threads inherit the starting thread's policy, which the kernel applies to mappings with none
/// of their own. Nodes outside the process's cpuset, or outside its bind or interleave policy
/// (`numactl --membind`, `--interleave`), take no pool: natively it would hold no memory there.
/// On one node, no NUMA system call is made.
fn numa_view() -> Option<crate::nodes::Nodes> {
    use crate::nodes::Policy;
    use crate::sys::numa;
    let mut t = numa::Topology::read(std::path::Path::new("/sys")).ok()?;
    let with_memory = |t: &numa::Topology| t.nodes.iter().filter(|n| n.mem_total > 0).count();
    if with_memory(&t) < 2 {
        return None;
    }
    let (mode, mask) = numa::thread_policy().ok()?;
    let allowed = numa::mems_allowed().ok()?;
    let here = 0u8;
    let mut on = [-1i32];
    numa::nodes_of(&[std::ptr::addr_of!(here) as usize & !(PAGE_SIZE - 1)], &mut on).ok()?;
    let policy = Policy::from_mode(mode, mask).unwrap_or(Policy::Local);
    let keep = |id: u32| {
        allowed.contains(id)
            && match policy {
                Policy::Bind(m) | Policy::Interleave(m) => m.contains(id),
                _ => true,
            }
    };
    for n in t.nodes.iter_mut().filter(|n| !keep(n.id)) {
        n.mem_total = 0;
    }
    (with_memory(&t) > 1).then(|| crate::nodes::Nodes::new(t, policy))
}

/// `opts` with the pools bounded by a memory cgroup's limit: an eighth of it at most (no pool
/// when that is under two huge pages), the scrub's watermarks within it (DESIGN.md, "The
/// pool's memory budget").
fn within_cgroup(mut opts: Options, cgroup: Option<&sys::cgroup::MemoryCgroup>) -> Options {
    let Some(cg) = cgroup else { return opts };
    let eighth = usize::try_from(cg.limit / 8).unwrap_or(usize::MAX) / PMD_SIZE * PMD_SIZE;
    if eighth >= opts.pool_max {
        return opts;
    }
    opts.pool_max = eighth.max(PMD_SIZE);
    if eighth < 2 * PMD_SIZE {
        opts.pool = false;
    }
    opts.scrub_stop = opts.scrub_stop.min(opts.pool_max);
    opts.scrub_start = opts.scrub_start.min(opts.scrub_stop);
    opts
}

/// The doorbells of `handlers` handlers, one page each, registered with `uffd`: their address.
///
/// # Context
/// A program thread, in [`Engine::start`], with no lock held; maps and registers memory.
fn doorbells(uffd: &Uffd, handlers: usize) -> Result<usize, EngineError> {
    let bells = handlers * PAGE_SIZE;
    let doorbell = mman::map_aligned(bells, PAGE_SIZE, libc::PROT_NONE, true).map_err(EngineError::Map)?;
    // SAFETY: the doorbells are our own fresh pages; each one's fault is answered by a
    // handler (or, the descriptor closed, by the kernel).
    if let Err(e) = unsafe { uffd.register(doorbell, bells) } {
        // SAFETY: our own pages, known to nobody yet.
        let _ = unsafe { mman::unmap(doorbell, bells) };
        return Err(EngineError::Register(e.into()));
    }
    Ok(doorbell)
}

/// The engine's pools (none without the pool knob or `UFFDIO_MOVE`): one per node of `numa`
/// that takes one, or one as on one node; `huge`: with huge rings, `recycle`: recycling.
///
/// # Context
/// A program thread, in [`Engine::start`], with no lock held; maps memory.
fn make_pools(
    opts: &Options,
    features: Features,
    huge: bool,
    numa: &Option<crate::nodes::Nodes>,
    recycle: bool,
) -> Result<Vec<Pool>, EngineError> {
    if !(opts.pool && features.has(Features::MOVE)) {
        return Ok(Vec::new());
    }
    let nodes: Vec<Option<u32>> = match numa {
        Some(n) => n.pool_nodes().map(Some).collect(),
        None => vec![None],
    };
    // Under an address-space limit (the shim caps pool_max by it) the nodes share it.
    let bytes = match (nodes.len(), mman::address_limit()) {
        (k, Some(_)) if k > 1 => (opts.pool_max / k / PMD_SIZE * PMD_SIZE).max(PMD_SIZE),
        _ => opts.pool_max,
    };
    nodes
        .iter()
        .map(|&node| Pool::new(bytes, huge, recycle, node).map_err(EngineError::Map))
        .collect()
}

/// The staging areas of `handlers` handlers, one PMD each, when the first of `pools` has a
/// huge ring; none otherwise.
///
/// # Context
/// A program thread, in [`Engine::start`], with no lock held; maps memory.
fn staging_areas(pools: &[Pool], handlers: usize) -> Result<Vec<mman::Mapping>, EngineError> {
    let mut stage = Vec::new();
    if pools.first().is_some_and(|p| p.huge.is_some()) {
        for _ in 0..handlers {
            let m = mman::Mapping::new(PMD_SIZE, mman::Thp::Always).map_err(EngineError::Map)?;
            // SAFETY: the staging area is ours; a forked child has no use for it.
            let _ = unsafe { mman::madvise(m.as_ptr() as usize, PMD_SIZE, mman::MADV_DONTFORK) };
            stage.push(m);
        }
    }
    Ok(stage)
}

/// `pools` with their rings registered with `uffd` for recycling (`opts.recycle`); where
/// registration is refused, pools made again without recycling (see [`make_pools`]).
///
/// # Context
/// A program thread, in [`Engine::start`], with no lock held; registers memory (and maps it,
/// making pools again).
fn register_rings(
    opts: &Options,
    uffd: &Uffd,
    pools: Vec<Pool>,
    features: Features,
    huge: bool,
    numa: &Option<crate::nodes::Nodes>,
) -> Result<Vec<Pool>, EngineError> {
    // Recycled pages move into the rings, which the kernel allows only into ranges
    // registered with the userfaultfd. Registered last, when nothing can fail before the
    // handler runs: a registered ring unmapped with the descriptor open and no handler
    // would wait for ever for its UNMAP event to be read. Where registration is refused,
    // the rings are unregistered again and there is no recycling.
    if opts.recycle && pools.iter().any(|p| p.register(uffd).is_err()) {
        for p in &pools {
            p.unregister(uffd);
        }
        drop(pools);
        make_pools(opts, features, huge, numa, false)
    } else {
        Ok(pools)
    }
}

/// One node's pool, as [`Engine::node_pools`] reports it. Counts are pages, as the kernel's
/// per-node `numastat` counts allocations (pool pages only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodePool {
    /// The node's id.
    pub node: u32,
    /// Pages ready now.
    pub ready_pages: u64,
    /// Pages given to faults that wanted this node.
    pub hit: u64,
    /// Pages given to faults that wanted another node (it was full).
    pub miss: u64,
    /// Pages faults wanted from this node and got from another's pool.
    pub foreign: u64,
    /// Of the hits, pages an interleave policy sent here.
    pub interleave_hit: u64,
    /// A populate of this pool found the node full within the last second (either ring): the
    /// faults that want this node take the next node's pool when its ring is empty.
    pub low: bool,
}

impl Engine {
    /// Starts an engine with the given options.
    pub fn new(opts: Options) -> Result<Engine, EngineError> {
        Engine::start(opts, StatsHome::Own(Box::default()))
    }

    /// Starts an engine that adds its counters to `stats`, which others may share (the
    /// counters of several engines then add up; [`Engine::stats`] shows the sum).
    pub fn with_stats(opts: Options, stats: &'static Stats) -> Result<Engine, EngineError> {
        Engine::start(opts, StatsHome::Lent(stats))
    }

    /// The engine of [`Engine::new`] and [`Engine::with_stats`]: its userfaultfd, doorbells,
    /// pools and staging areas, the state they share, then its threads.
    ///
    /// # Context
    /// A program thread (the one starting the engine), with no lock held; takes only the new
    /// engine's thread list; waits for nothing but its system calls and the threads it spawns.
    fn start(opts: Options, stats: StatsHome) -> Result<Engine, EngineError> {
        opts.validate()?;
        let cgroup = sys::cgroup::MemoryCgroup::find();
        let opts = within_cgroup(opts, cgroup.as_ref());
        let page = mman::system_page_size();
        if page != PAGE_SIZE {
            return Err(EngineError::PageSize(page));
        }
        sys::thread::prepare().map_err(|e| EngineError::Thread(io::Error::other(e)))?;
        let uffd = Uffd::open().map_err(EngineError::Uffd)?;
        let features = uffd.features();
        let handlers = opts.handler_count();
        let doorbell = doorbells(&uffd, handlers)?;
        let huge = opts.pool_thp && mman::thp_available();
        // Several nodes with memory: a pool per node (see nodes.rs); where a node's pool cannot
        // be bound, one pool as on one node.
        let mut numa = numa_view();
        let pools = match make_pools(&opts, features, huge, &numa, opts.recycle) {
            Err(_) if numa.is_some() => {
                numa = None;
                make_pools(&opts, features, huge, &numa, opts.recycle)?
            }
            r => r?,
        };
        let stage = staging_areas(&pools, handlers)?;
        let zero = ZeroSource::new().map_err(EngineError::Map)?;
        let pools = register_rings(&opts, &uffd, pools, features, huge, &numa)?;
        let identity = uffd.identity();
        // The engine's producers: its handlers and one scrub per pool.
        let lend_at = opts.lend_at(handlers + pools.len(), sys::thread::allowed_cpus());
        let (machine, machine_refused) = machine_state(&opts);
        let shared = Arc::new(Shared::new(SharedParts {
            stage,
            uffd: Some(uffd),
            features,
            pools,
            zero,
            stats,
            machine,
            machine_refused,
            thp_disabled: sys::thread::thp_disabled(),
            doorbell,
            handlers,
            uffd_identity: Some(identity),
            lending: crate::fault::handback::Lending::new(lend_at),
            budget: crate::pool::budget::Budget::new(opts.pool_max, cgroup),
            numa,
            opts,
        }));
        // Built before spawning, so that a failed spawn drops an Engine that stops what started
        // (its drop rings one doorbell per handler started).
        let mut engine = Engine {
            shared,
            threads: Mutex::new(Threads::default()),
        };
        let threads = engine.threads.get_mut().unwrap_or_else(|e| e.into_inner());
        Engine::spawn_handlers(&engine.shared, threads, &|| ())?;
        Engine::spawn_scrubbers(&engine.shared, threads)?;
        Ok(engine)
    }

    /// Starts the handlers; `after_first` runs once the first one is there (the resume re-arms
    /// the doorbells then).
    fn spawn_handlers(shared: &Arc<Shared>, threads: &mut Threads, after_first: &dyn Fn()) -> Result<(), EngineError> {
        for i in 0..shared.handling.len() {
            let s = shared.clone();
            let t = sys::thread::spawn("zerofault-fault", Box::new(move || fault::run(s, i)));
            threads.handlers.push(t.map_err(EngineError::Thread)?);
            if i == 0 {
                after_first();
            }
        }
        Ok(())
    }

    fn spawn_scrubbers(shared: &Arc<Shared>, threads: &mut Threads) -> Result<(), EngineError> {
        for i in 0..shared.pools.len() {
            let s = shared.clone();
            let t = sys::thread::spawn("zerofault-scrub", Box::new(move || scrub::run(s, i)));
            threads.scrubbers.push(t.map_err(EngineError::Thread)?);
        }
        Ok(())
    }

    /// Starts an engine with the options of the environment (`ZEROFAULT_<NAME>`).
    pub fn from_env() -> Result<Engine, EngineError> {
        Engine::new(Options::from_env()?)
    }

    /// Maps `len` bytes (rounded up to pages) of anonymous private memory, 2 MiB aligned,
    /// registered with the engine. `MADV_NOHUGEPAGE`: the kernel does not try a huge page of
    /// its own on each fault there (wasted on a registered range: docs/DESIGN.md, "Huge pages"); the engine still
    /// moves huge pages into its whole PMDs.
    ///
    /// With the engine failed open, returns plain memory that the kernel serves.
    pub fn map(&self, len: usize) -> Result<Region, EngineError> {
        let len = len.max(1).next_multiple_of(PAGE_SIZE);
        let addr =
            mman::map_aligned(len, PMD_SIZE, libc::PROT_READ | libc::PROT_WRITE, false).map_err(EngineError::Map)?;
        // SAFETY: a fresh mapping of ours; huge-page and dump advice change no content. The
        // program's memory, dumped with the process (map_aligned left it out).
        let _ = unsafe { mman::madvise(addr, len, mman::MADV_NOHUGEPAGE) };
        // SAFETY: as above.
        let _ = unsafe { mman::madvise(addr, len, libc::MADV_DODUMP) };
        let id = self.shared.next_region.fetch_add(1, Relaxed);
        // SAFETY: a fresh anonymous private mapping of ours, served by this engine from now on.
        if let Err(e) = unsafe { self.shared.register_range(addr, len, Some(id), true) } {
            // SAFETY: ours, and no Region was made for it.
            let _ = unsafe { mman::unmap(addr, len) };
            return Err(EngineError::Register(e));
        }
        if let Some(r) = self.shared.ranges.find(addr) {
            r.own_advice.store(true, Relaxed);
        }
        Ok(Region {
            shared: self.shared.clone(),
            id,
            addr,
            len,
            owned: true,
        })
    }

    /// Serves the faults of memory mapped elsewhere. Dropping the Region unregisters it and
    /// leaves the mapping to its owner.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be page aligned, anonymous private read-write memory that stays
    /// mapped while the Region lives, and must not be registered with another userfaultfd.
    /// Its pages that are not present will be filled with zeros on first touch, as the kernel
    /// would.
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<Region, EngineError> {
        let addr = ptr as usize;
        if addr % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 || len == 0 {
            return Err(EngineError::Unaligned { addr, len });
        }
        let id = self.shared.next_region.fetch_add(1, Relaxed);
        // SAFETY: this function's contract.
        unsafe { self.shared.register_range(addr, len, Some(id), false) }.map_err(EngineError::Register)?;
        Ok(Region {
            shared: self.shared.clone(),
            id,
            addr,
            len,
            owned: false,
        })
    }

    /// Fills the pool until it holds `bytes` (capped at `pool_max`) on the calling thread, for
    /// callers that want the pool warm before a critical phase; the scrub thread keeps it
    /// between its watermarks from then on. No-op without a pool. With a pool per node, each
    /// is filled to `bytes` (its rings are bound to its node, whatever thread populates them).
    pub fn prefill(&self, bytes: usize) -> io::Result<()> {
        // Each pool is filled to `bytes` (one per node): the budget holds them all.
        let pools = self.shared.pools.len().max(1) as u64;
        self.shared.budget.filling(pages(bytes).saturating_mul(pools));
        let filled = self.prefill_pools(bytes);
        self.shared.budget.filled();
        filled
    }

    fn prefill_pools(&self, bytes: usize) -> io::Result<()> {
        if !self.shared.pools.is_empty() {
            self.shared.streaming.store(true, Release);
        }
        for p in &self.shared.pools {
            match p.fill_to(pages(bytes), &self.shared.stats, || false) {
                // A full node's pool stays as it is (its faults go to the next node's).
                Err(e) if p.node.is_some() && e.kind() == io::ErrorKind::OutOfMemory => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// For the child of a fork(): this engine belongs to the parent (its threads were not
    /// copied, its userfaultfd serves the parent's memory). Closes the child's copy of the
    /// descriptor, so that the parent failing open is never held up by it, and forgets the
    /// rest without touching the threads or any lock they may have held at the fork.
    pub fn forget_after_fork(self) {
        self.close_after_fork();
        std::mem::forget(self);
    }

    /// The descriptor half of [`Engine::forget_after_fork`], for a fork handler that holds the
    /// engine by reference and leaks it itself: only atomics and one close(2), so it is safe
    /// in the child of a multi-threaded fork.
    pub fn close_after_fork(&self) {
        // No lock is touched: the parent's handlers hold read guards for their whole lives,
        // and a fail-open may have been waiting for the write lock at the fork. The number is
        // closed if it still names the engine's file (the parent may have closed it, and the
        // number been reused, before the fork); the engine is leaked, so that nothing closes
        // it twice.
        if let Some(id) = self.shared.uffd_identity {
            // SAFETY: the engine is leaked right after (see above): nothing closes or uses the
            // child's copy of the descriptor again.
            unsafe { id.close_if_same() };
        }
    }

    /// Serves the faults of `[addr, addr + len)` with no [`Region`] to own it: for memory whose
    /// owner (an LD_PRELOAD shim's program) unmaps, moves and discards it itself; the engine
    /// follows through the kernel's events. Registering memory already registered here is
    /// harmless (it is recorded afresh). `fresh`: its pages were never touched (a new mapping),
    /// so its PMDs hold no page tables.
    ///
    /// # Safety
    /// As [`Engine::register`], except that the memory may be unmapped at any time (the
    /// engine then forgets it).
    pub unsafe fn adopt(&self, addr: usize, len: usize, fresh: bool) -> Result<(), EngineError> {
        if addr % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 || len == 0 {
            return Err(EngineError::Unaligned { addr, len });
        }
        // SAFETY: this function's contract.
        unsafe { self.shared.register_range(addr, len, None, fresh) }.map_err(EngineError::Register)
    }

    /// Serves `[addr, addr + len)`, which the kernel registered itself: the part a served
    /// mapping grew by in place (`mremap` grows the VMA with its flags, the registration among
    /// them). Recorded only, with no `UFFDIO_REGISTER`, which would take the address space's
    /// lock for writing and wait for the scrub's populate of a whole PMD. Were the part not
    /// registered after all, its faults would stay the kernel's and installs there would fail
    /// and be let go, as on memory gone.
    ///
    /// # Safety
    /// As [`Engine::adopt`], and `[addr, addr + len)` is registered with the engine's
    /// userfaultfd (no page there yet).
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes the registration lock.
    pub unsafe fn adopt_grown(&self, addr: usize, len: usize) -> Result<(), EngineError> {
        if addr % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 || len == 0 {
            return Err(EngineError::Unaligned { addr, len });
        }
        let _reg = self.shared.reg_lock();
        self.shared.ranges.insert(addr, pages(len), None);
        Ok(())
    }

    /// Hands `[addr, addr + len)` back to the kernel: unregistered and forgotten. Pages already
    /// there stay. For callers that must see the program's mappings as they would be without
    /// the engine (registration splits VMAs).
    pub fn release(&self, addr: usize, len: usize) {
        let _reg = self.shared.reg_lock();
        let seq = self.shared.ranges.seq();
        self.shared.ranges.unmap(addr, addr + len, seq);
        let uffd = self.shared.uffd.read().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = uffd.as_ref() {
            let _ = u.unregister(addr, len);
        }
    }

    /// Before the program registers `[addr, addr + len)` with a userfaultfd of its own: every
    /// part of it the engine serves is handed back to the kernel (unregistered and forgotten),
    /// so that the program's registration finds the memory as it would natively. Returns
    /// whether the engine served any of it. Pages already there stay.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes the registration lock.
    pub fn release_overlapping(&self, addr: usize, len: usize) -> bool {
        let start = addr & !(PAGE_SIZE - 1);
        let end = addr.saturating_add(len).saturating_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
        let mut any = false;
        for r in self.shared.ranges.ranges() {
            let (a, b) = (r.start.max(start), r.end().min(end));
            if a < b {
                self.release(a, b - a);
                any = true;
            }
        }
        any
    }

    /// Installs one zero page at `addr` (page aligned) from the calling thread, if the engine
    /// serves it and nobody installed it yet: for a page written alone where nothing follows
    /// (an allocator's block header), which a fault would answer with a whole window of pages
    /// the program never asked for (a userfaultfd of the program's own, registered on the block
    /// right after, would then find them present where natively they are missing). Returns
    /// whether the page is there now; otherwise the write faults as usual.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes no lock but a read guard on the
    /// descriptor.
    pub fn fill_page(&self, addr: usize) -> bool {
        let page = addr & !(PAGE_SIZE - 1);
        self.fill_claimed(page, page + PAGE_SIZE) == Some(1)
    }

    /// Installs zero pages in the part of `[addr, addr + len)` (whole pages of memory the
    /// engine serves) before its first whole PMD, from the calling thread: copies of the zero
    /// source (grow.rs says why not pool pages). For the part a block just grew by (the
    /// shim's `realloc` and `mremap`), which the program writes next: served by faults, a
    /// block grown by 64 KiB steps paid a round trip per step and ran slower than the kernel's
    /// own faults (docs/DESIGN.md, "Blocks that grow in small steps"). Whole PMDs are left to the windows, which give
    /// them huge pages (4 KiB pages put here would keep them 4 KiB for good), and so is what
    /// the program has not written yet of a large growth (a vector that doubled).
    /// Pages someone else claimed are left alone, and whatever does not go in faults as usual.
    /// Returns the pages installed.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked. Takes the descriptor's read guard;
    /// never reads the descriptor (its messages are the handlers').
    pub fn fill_grown(&self, addr: usize, len: usize) -> u64 {
        if !self.is_active() || self.shared.exiting.load(Acquire) || self.shared.pool_paused.load(Acquire) {
            return 0;
        }
        let Some(installed) = self.fill_claimed(addr, crate::grow::fill_end(addr, len)) else {
            return 0;
        };
        Stats::add(&self.shared.stats.grow_fills, 1);
        Stats::add(&self.shared.stats.grow_pages, installed);
        installed
    }

    /// The program's access advice for `[addr, addr + len)`: `true` for `MADV_RANDOM`,
    /// `false` for `MADV_NORMAL` or `MADV_SEQUENTIAL`. Where it is on, reads map the zero page
    /// whatever the program writes afterwards (fault/reads.rs).
    ///
    /// # Context
    /// A program thread, inside the shim's madvise hook, signals blocked.
    pub fn set_random(&self, addr: usize, len: usize, on: bool) {
        self.shared.ranges.set_random(addr, addr.saturating_add(len), on);
    }

    /// Copies zero pages into the pages of `[addr, end)` (clipped to its range) that this call
    /// claims, from the calling thread ([`crate::grow::fill`]); what does not go in is released
    /// and faults as usual. Returns the pages there now of those claimed; `None` when there
    /// was nothing to fill (no served page in the span, or no descriptor).
    fn fill_claimed(&self, addr: usize, end: usize) -> Option<u64> {
        let r = self.shared.ranges.find(addr)?;
        let end = end.min(r.end());
        if addr % PAGE_SIZE != 0 || end <= addr {
            return None;
        }
        let uffd = self.shared.uffd.read().unwrap_or_else(|e| e.into_inner());
        let u = uffd.as_ref()?;
        let mut runs = Vec::new();
        r.map.claim(r.page_of(addr), pages(end - addr), &mut runs);
        let mut installed = 0;
        for (first, n) in runs {
            let dst = r.addr_of(first);
            let done = crate::grow::fill(&self.shared, u, dst, bytes(n));
            // 4 KiB pages went in: their PMD holds a page table now.
            r.pmds.mark_tables(dst, done);
            if done < bytes(n) {
                r.map.clear(first + pages(done), n - pages(done));
            }
            installed += pages(done);
        }
        Some(installed)
    }

    /// Whether `fd` is the engine's own userfaultfd.
    pub fn is_own_uffd(&self, fd: i32) -> bool {
        self.shared.uffd_identity.as_ref().is_some_and(|id| id.is(fd))
    }

    /// The program's transparent-huge-page advice for `[addr, addr + len)`: `true` for
    /// `MADV_HUGEPAGE` (or new memory under THP `always`), `false` for `MADV_NOHUGEPAGE`. Where
    /// it is on, a write fault takes whole huge pages, as the kernel would give it.
    pub fn set_huge(&self, addr: usize, len: usize, on: bool) {
        let end = addr.saturating_add(len);
        self.shared.ranges.set_huge(addr, end, on);
        // MADV_NOHUGEPAGE: no huge page of the engine's either (as the kernel would make none).
        self.shared.ranges.set_never(addr, end, !on);
        self.shared.lending.advise(addr, end, on);
    }

    /// `[addr, addr + len)` carries no huge-page advice any more (a freed block handed out
    /// again): neither `MADV_HUGEPAGE` nor `MADV_NOHUGEPAGE`.
    pub fn forget_huge_advice(&self, addr: usize, len: usize) {
        let end = addr.saturating_add(len);
        self.shared.ranges.set_huge(addr, end, false);
        self.shared.ranges.set_never(addr, end, false);
        self.shared.lending.advise(addr, end, false);
    }

    /// `prctl(PR_SET_THP_DISABLE)`: `true`, the engine moves no huge page into the program's
    /// memory from now on (4 KiB pages only), as the kernel makes none; `false` undoes it.
    pub fn set_thp_disabled(&self, on: bool) {
        self.shared.thp_disabled.store(on, Release);
    }

    /// Whether a new mapping of the program's is better left to the kernel: the last
    /// [`SPARSE_BACKOFF`] ranges were each found sparse and given back to their end
    /// (a program that maps, touches one page in 16 and unmaps, in a loop, paid a
    /// registration, two round trips and a hand-back a mapping, well over the kernel's cost:
    /// docs/DESIGN.md, "Sparse streams"). Now and then
    /// one is taken all the same, to look again: after [`SPARSE_BACKOFF`] left alone, then
    /// twice as many each time that one is sparse too, up to 64; dense evidence anywhere ends
    /// the backoff. A mapping next to served memory is always taken (see the shim's mmap
    /// hook), and so is one of 64 MiB or more.
    ///
    /// # Context
    /// The program's thread, in the shim's mmap hook.
    pub fn leaves_mapping(&self, len: usize) -> bool {
        let sparse = self.shared.sparse_run.load(Relaxed);
        // A mapping of 64 MiB or more is always taken: its sparse stream costs a few round
        // trips per 256 MiB, and a dense one gains most.
        if sparse < SPARSE_BACKOFF || len >= LEAVE_BELOW {
            return false;
        }
        let every = SPARSE_BACKOFF << (sparse - SPARSE_BACKOFF).min(3);
        // The one taken to look again is a VMA of its own while it is registered, where it
        // lies next to one left alone (natively they merge); its hand-back, if it is sparse
        // too, merges them again.
        if self.shared.left_alone.fetch_add(1, Relaxed) + 1 >= every {
            self.shared.left_alone.store(0, Relaxed);
            return false;
        }
        Stats::add(&self.shared.stats.mappings_left, 1);
        true
    }

    /// Whether any page of `[addr, addr + len)` lies in memory the engine serves.
    pub fn serves_any(&self, addr: usize, len: usize) -> bool {
        self.is_active() && self.shared.ranges.any(addr, addr.saturating_add(len))
    }

    /// The registered range holding `addr`, as (start, end), while the engine serves.
    pub fn range_of(&self, addr: usize) -> Option<(usize, usize)> {
        if !self.is_active() {
            return None;
        }
        self.shared
            .ranges
            .find(addr & !(PAGE_SIZE - 1))
            .map(|r| (r.start, r.end()))
    }

    /// Whether `addr` lies in memory the engine serves.
    pub fn serves(&self, addr: usize) -> bool {
        self.is_active() && self.shared.ranges.find(addr & !(PAGE_SIZE - 1)).is_some()
    }

    /// Moves the pages of `[src, src + len)` to `[dst, dst + len)` without copying
    /// (`UFFDIO_MOVE`, holes allowed: a hole in the source stays a hole at the destination).
    /// Both must be served by this engine, the destination must have no page yet, and both
    /// mappings must have the same protection and lock state. Returns the bytes moved before an
    /// error, or all of them.
    ///
    /// # Safety
    /// The caller owns both ranges; the source reads zero (it faults again) afterwards.
    pub unsafe fn move_pages(&self, dst: usize, src: usize, len: usize) -> usize {
        let uffd = self.shared.uffd.read().unwrap_or_else(|e| e.into_inner());
        let Some(u) = uffd.as_ref() else { return 0 };
        let mut done = 0;
        while done < len {
            // SAFETY: the caller owns both ranges (this function's contract).
            let p = unsafe { u.move_pages_mode(dst + done, src + done, len - done, sys::uffd::MOVE_ALLOW_SRC_HOLES) };
            done += p.done;
            match p.errno {
                None => break,
                Some(Errno(libc::EAGAIN)) if p.done > 0 => continue,
                Some(_) => break,
            }
        }
        done
    }

    /// Discards `[ptr, ptr + len)` like `MADV_DONTNEED` (it reads zero afterwards, and its
    /// next touch is served by the engine), but keeps the pages the engine installed there:
    /// they move into the pool, whole 2 MiB huge pages with one PMD move each, and come back
    /// zeroed by the scrub thread to the next fault anywhere. Pages whose move the kernel
    /// refuses (shared with a forked child, mlocked) are discarded instead. Memory the engine
    /// does not serve is simply discarded. With recycling off or the engine failed open, this
    /// is `MADV_DONTNEED`.
    ///
    /// # Safety
    /// The caller owns the range and gives up its contents, as for `MADV_DONTNEED`: nothing
    /// reads or writes it while the call runs.
    pub unsafe fn recycle(&self, ptr: *mut u8, len: usize) -> Result<crate::Recycled, EngineError> {
        let addr = ptr as usize;
        if addr % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 {
            return Err(EngineError::Unaligned { addr, len });
        }
        if len == 0 {
            return Ok(crate::Recycled::default());
        }
        self.shared.recycle(addr, len).map_err(EngineError::Map)
    }

    /// Every mapping the engine made for itself (pool rings, staging area, zero source,
    /// doorbell, thread stacks), as (address, length).
    pub fn own_mappings(&self) -> Vec<(usize, usize)> {
        let bells = self.shared.handling.len() * PAGE_SIZE;
        let mut v = vec![(self.shared.doorbell, bells), self.shared.zero.area()];
        for p in &self.shared.pools {
            v.extend(p.areas());
        }
        v.extend(self.shared.stage.iter().map(|m| (m.as_ptr() as usize, m.len())));
        let t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        v.extend(t.handlers.iter().chain(&t.scrubbers).map(|t| t.area()));
        v
    }

    /// Before the program's `mlockall(MCL_CURRENT)`: the engine's read-write reservations
    /// (pool rings, staging area) become `PROT_NONE`, which mlockall never populates, so that it
    /// does not fill them with locked zero pages. Until [`Engine::after_mlockall`] the handler
    /// copies instead of moving.
    pub fn before_mlockall(&self) {
        // Between two steps of the scrub, which leaves protected rings alone (it writes the
        // dirty ones).
        let _work: Vec<_> = self
            .shared
            .pools
            .iter()
            .map(|p| {
                let g = p.work.lock().unwrap_or_else(|e| e.into_inner());
                p.protected.store(true, Release);
                g
            })
            .collect();
        for (a, l) in self.rw_reservations() {
            // SAFETY: the engine's own reservations; the handler copies instead of moving
            // until after_mlockall (see above), and the scrub leaves them alone while they
            // are protected, so nothing reads or writes them meanwhile.
            let _ = unsafe { mman::protect(a, l, libc::PROT_NONE) };
        }
    }

    /// After the program's `mlockall`: unlocks every engine mapping (they are not the
    /// program's memory) and gives the reservations their protection back.
    pub fn after_mlockall(&self) {
        for (a, l) in self.own_mappings() {
            let _ = mman::munlock(a, l);
        }
        let _work: Vec<_> = self
            .shared
            .pools
            .iter()
            .map(|p| p.work.lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        for (a, l) in self.rw_reservations() {
            // SAFETY: the engine's own reservations, given their protection back.
            let _ = unsafe { mman::protect(a, l, libc::PROT_READ | libc::PROT_WRITE) };
        }
        for p in &self.shared.pools {
            p.protected.store(false, Release);
        }
    }

    /// Empties the pool and stops refilling it (`true`), or lets the scrub refill it again.
    /// For a program under `mlockall(MCL_FUTURE)`: its new memory is locked, and the kernel
    /// moves no page between a locked and an unlocked mapping, so pool pages could only be
    /// copied; keeping them would be memory populated for nothing.
    pub fn pause_pool(&self, paused: bool) {
        self.shared.pool_paused.store(paused, Release);
        for p in &self.shared.pools {
            if paused {
                p.release_all();
            } else {
                p.scrub.kick();
            }
        }
    }

    /// For tests: stops every scrub thread in the middle of its next step, holding its pool's
    /// work lock (as a scrub the scheduler never runs would), or lets them go on (`false`).
    /// Returns whether every scrub thread is parked (waits at most 5 s), or, for `false`,
    /// true at once. The fault path must make progress all the while (rule 7).
    #[doc(hidden)]
    pub fn park_scrub(&self, parked: bool) -> bool {
        self.shared.scrub_parked.store(parked, Release);
        if !parked {
            return true;
        }
        let want = u32::try_from(self.threads.lock().unwrap_or_else(|e| e.into_inner()).scrubbers.len()).unwrap_or(0);
        let t0 = std::time::Instant::now();
        while self.shared.scrubs_parked.load(Acquire) < want {
            if t0.elapsed() > std::time::Duration::from_secs(5) {
                return false;
            }
            self.shared.kick_scrubs();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    fn rw_reservations(&self) -> Vec<(usize, usize)> {
        let mut v = vec![];
        for p in &self.shared.pools {
            v.extend(p.areas());
        }
        v.extend(self.shared.stage.iter().map(|m| (m.as_ptr() as usize, m.len())));
        v
    }

    /// Pages ready in the pool (every node's).
    pub fn pool_pages(&self) -> u64 {
        self.shared.pools.iter().map(Pool::available).sum()
    }

    /// Pages the pools hold: ready, and recycled but not zeroed yet (every node's). At most
    /// the memory budget once the scrub looked (DESIGN.md, "The pool's memory budget").
    pub fn pool_held_pages(&self) -> u64 {
        self.shared.pool_held()
    }

    /// Each node's pool, where there is one per node (empty on a one-node machine): its level
    /// and what it gave, for `zerofault bench`'s per-node line.
    pub fn node_pools(&self) -> Vec<NodePool> {
        self.shared
            .pools
            .iter()
            .filter_map(|p| {
                Some(NodePool {
                    node: p.node?,
                    ready_pages: p.available(),
                    hit: p.counts.hit.load(Relaxed),
                    miss: p.counts.miss.load(Relaxed),
                    foreign: p.counts.foreign.load(Relaxed),
                    interleave_hit: p.counts.interleave_hit.load(Relaxed),
                    low: p.node_full(),
                })
            })
            .collect()
    }

    /// Bytes mapped for the page-state maps of the registered ranges (directories and leaves,
    /// see `memory/pagemap.rs`): proportional to what was touched, not to what was registered.
    pub fn metadata_bytes(&self) -> usize {
        let ranges = self.shared.ranges.ranges();
        ranges
            .iter()
            .map(|r| r.map.metadata_bytes() + r.pmds.metadata_bytes())
            .sum()
    }

    /// A snapshot of the counters. It includes every install that woke a thread before this
    /// call: an install wakes the faulting thread before the handler has counted it, so a
    /// snapshot taken while the handler is inside a message waits (at most 50 ms) for it.
    pub fn stats(&self) -> Snapshot {
        let t0 = std::time::Instant::now();
        for bracket in self.shared.handling.iter() {
            let g = bracket.load(SeqCst);
            if g % 2 == 1 {
                while bracket.load(SeqCst) == g
                    && !self.shared.failed.load(Acquire)
                    && t0.elapsed() < std::time::Duration::from_millis(50)
                {
                    std::thread::yield_now();
                }
            }
        }
        self.shared.stats.snapshot()
    }

    /// The options the engine runs with.
    pub fn options(&self) -> &Options {
        &self.shared.opts
    }

    /// Whether the machine-wide state is shared with this user's other processes, or why not
    /// (`crate::machine`).
    pub fn machine_state(&self) -> Result<(), String> {
        match &self.shared.machine_refused {
            None if self.shared.machine.is_shared() => Ok(()),
            None => Err("not opened".into()),
            Some(why) => Err(why.clone()),
        }
    }

    /// The userfaultfd features in use.
    pub fn features(&self) -> Features {
        self.shared.features
    }

    /// False once the engine failed open (the kernel serves every fault).
    pub fn is_active(&self) -> bool {
        !self.shared.failed.load(Acquire)
    }

    /// Stops the engine's threads, and returns once none of them is left in the process: for a
    /// call that must find the process as the program made it (`setuid` and the rest of the
    /// credential calls, `unshare` and `setns`, which need a one-threaded process for a user
    /// namespace, `PR_SET_NO_NEW_PRIVS`), after which [`Engine::resume`] starts them again from
    /// the calling thread, which hands them the new credentials, namespaces and flags, as
    /// `clone(2)` does. Registered memory stays registered: until then a fault there waits
    /// (a program thread's fault, or a `MADV_DONTNEED` of served memory, waits for the resume),
    /// so the caller resumes right after its call. The scrub threads stop first: a discard of
    /// theirs in a registered pool ring waits for a handler to read its event.
    /// Callers nest: the threads come back at the last [`Engine::resume`] (two threads changing
    /// their rights at once both find the engine stopped for their calls). Returns true: the
    /// caller must resume. DESIGN.md, "The program's rights".
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes the threads' lock; sleeps until
    /// the threads have left (they need no lock the caller holds).
    pub fn pause(&self) -> bool {
        let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        t.holders += 1;
        if t.holders > 1 {
            return true;
        }
        self.shared.stopping.store(true, Release);
        self.shared.kick_scrubs();
        let tids: Vec<u32> = t.handlers.iter().chain(&t.scrubbers).map(EngineThread::tid).collect();
        for s in t.scrubbers.drain(..) {
            s.join();
        }
        let handlers = std::mem::take(&mut t.handlers);
        ring_doorbells(&self.shared, handlers.len());
        for h in handlers {
            h.join();
        }
        sys::thread::wait_gone(&tids);
        true
    }

    /// Starts the threads [`Engine::pause`] stopped, from the calling thread, once no caller
    /// holds them stopped any more. Where a thread cannot be started, the engine fails open
    /// (the kernel serves every fault from then on).
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked, right after its call; takes the
    /// threads' lock.
    pub fn resume(&self) {
        let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        t.holders = t.holders.saturating_sub(1);
        if t.holders > 0 || self.shared.failed.load(Acquire) {
            return;
        }
        self.shared.stopping.store(false, Release);
        // The doorbells the pause rang hold zero pages: missing again for the next stop (a
        // registered range: the handler just started reads the REMOVE event).
        let rearm = || {
            let bells = self.shared.handling.len() * PAGE_SIZE;
            // SAFETY: the engine's own doorbell pages, read by nobody but a stop.
            let _ = unsafe { mman::madvise(self.shared.doorbell, bells, libc::MADV_DONTNEED) };
        };
        let started = Engine::spawn_handlers(&self.shared, &mut t, &rearm);
        if started
            .and_then(|()| Engine::spawn_scrubbers(&self.shared, &mut t))
            .is_err()
        {
            drop(t);
            self.stop_for_good();
        }
    }

    /// Hands every fault to the kernel for the rest of the process's life, the threads stopped:
    /// before a call whose consequences the engine cannot follow (a seccomp filter, which may
    /// refuse the calls an engine thread makes).
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; as [`Engine::pause`].
    pub fn stop_for_good(&self) {
        self.pause();
        if !self.shared.failed.load(Acquire) {
            Stats::add(&self.shared.stats.steps_aside, 1);
        }
        self.fail_open_paused();
    }

    /// The process is exiting (`exit`, or a return from `main`): the scrub threads leave at
    /// their next look and fill nothing more; nothing waits for them. The handlers serve on,
    /// so that a later destructor's faults are answered, until `exit_group` ends every thread.
    /// Whichever thread is last out tears the address space down at the program's own
    /// priority (no engine thread is ever SCHED_IDLE), and nothing is unmapped or closed here
    /// that the kernel's teardown would not do anyway (DESIGN.md, "Exit").
    ///
    /// # Context
    /// The exiting program thread (a library destructor), signals blocked; waits for nothing.
    pub fn stop_at_exit(&self) {
        self.shared.exiting.store(true, Release);
        self.shared.machine.release();
        self.shared.kick_scrubs();
    }

    /// With no thread running: fails open (the descriptor closed, the pools emptied).
    fn fail_open_paused(&self) {
        self.shared.failed.store(true, Release);
        drop(self.shared.uffd.write().unwrap_or_else(|e| e.into_inner()).take());
        for p in &self.shared.pools {
            p.release_all();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Release);
        self.shared.kick_scrubs();
        let t = self.threads.get_mut().unwrap_or_else(|e| e.into_inner());
        let handlers = std::mem::take(&mut t.handlers);
        ring_doorbells(&self.shared, handlers.len());
        for h in handlers {
            h.join();
        }
        // Closing the descriptor hands every registered range back to the kernel. Before the
        // scrub is joined: a MADV_DONTNEED of its on a pool ring (registered, see pool.rs)
        // waits for its REMOVE event to be read, which the handler no longer does; the close
        // releases it.
        drop(self.shared.uffd.write().unwrap_or_else(|e| e.into_inner()).take());
        for s in t.scrubbers.drain(..) {
            s.join();
        }
        // Regions may outlive the engine and keep `Shared` alive: free the pools' pages now.
        for p in &self.shared.pools {
            p.release_all();
        }
        let bells = self.shared.handling.len() * PAGE_SIZE;
        // SAFETY: the doorbells are the engine's own pages; every thread is joined.
        let _ = unsafe { mman::unmap(self.shared.doorbell, bells) };
    }
}

/// The machine-wide state (`machine` knob), or alone with the reason.
fn machine_state(opts: &Options) -> (crate::machine::Machine, Option<String>) {
    use crate::machine::Machine;
    if !opts.machine {
        return (Machine::alone(), Some("the machine knob is off".into()));
    }
    let dir = crate::machine::runtime_dir();
    let cpus = u32::try_from(sys::thread::online_cpus()).unwrap_or(u32::MAX);
    match Machine::open(dir.as_deref(), cpus) {
        Ok(m) => (m, None),
        Err(why) => (Machine::alone(), Some(why.to_string())),
    }
}
