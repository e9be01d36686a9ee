//! Starting the engine: its userfaultfd, doorbells, pools, staging areas and zero source,
//! the state they share, and its threads.

use super::{Engine, StartError, Threads};
use crate::options::Options;
use crate::page::{page_start, pmd_start};
use crate::pool::scrub;
use crate::pool::zero::source::ZeroSource;
use crate::pool::Pool;
use crate::state::{Shared, SharedParts};
use crate::stats::{Stats, StatsHome};
use crate::sys::mman::{self, PAGE_SIZE, PMD_SIZE};
use crate::sys::uffd::Features;
use crate::sys::uffd::Uffd;
use crate::{fault, sys};
use std::sync::{Arc, Mutex};

/// The NUMA view the engine runs with: `None` (one pool, nothing NUMA done) unless at least
/// two nodes with memory are open to the process, and the calls per-node pools need work here
/// (a container's seccomp profile may refuse them: then it runs as on one node). Handler
/// threads inherit the starting thread's policy, which the kernel applies to mappings with none
/// of their own. Nodes outside the process's cpuset, or outside its bind or interleave policy
/// (`numactl --membind`, `--interleave`), take no pool: natively it would hold no memory there.
/// On one node, no NUMA system call is made.
fn numa_view() -> Option<crate::memory::nodes::Nodes> {
    use crate::memory::nodes::Policy;
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
    numa::nodes_of(&[page_start(std::ptr::addr_of!(here) as usize)], &mut on).ok()?;
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
    (with_memory(&t) > 1).then(|| crate::memory::nodes::Nodes::new(t, policy))
}

/// `opts` with the pools bounded by a memory cgroup's limit: an eighth of it at most (no pool
/// when that is under two huge pages), the scrub's watermarks within it (DESIGN.md, "The
/// pool's memory budget").
fn within_cgroup(mut opts: Options, cgroup: Option<&sys::cgroup::MemoryCgroup>) -> Options {
    let Some(cg) = cgroup else { return opts };
    let eighth = pmd_start(usize::try_from(cg.limit / 8).unwrap_or(usize::MAX));
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

/// What the pools' rings may be charged in all under strict overcommit
/// (`vm.overcommit_memory` 2), where the kernel charges every read-write reservation whole when
/// it is made: the machine's commit budget is shared by every process, and a process under the
/// shim must leave it to the programs (DESIGN.md, "Strict overcommit").
pub(crate) const STRICT_RINGS: usize = 32 << 20;

/// `opts` with the pools small enough that their rings are charged at most [`STRICT_RINGS`]
/// under strict overcommit: each ring, and a dirty ring beside each when recycling, can hold
/// all of `pool_max` (see `Pool::new`).
fn within_commit(mut opts: Options, strict: bool) -> Options {
    let rings = if opts.recycle { 4 } else { 1 };
    let most = pmd_start(STRICT_RINGS / rings).max(PMD_SIZE);
    if !strict || opts.pool_max <= most {
        return opts;
    }
    opts.pool_max = most;
    opts.scrub_stop = opts.scrub_stop.min(opts.pool_max);
    opts.scrub_start = opts.scrub_start.min(opts.scrub_stop);
    opts
}

/// The doorbells of `handlers` handlers, one page each, registered with `uffd`: their address.
///
/// # Context
/// A program thread, in [`Engine::start`], with no lock held; maps and registers memory.
fn doorbells(uffd: &Uffd, handlers: usize) -> Result<usize, StartError> {
    let bells = handlers * PAGE_SIZE;
    let doorbell = mman::map_aligned(bells, PAGE_SIZE, libc::PROT_NONE, true).map_err(StartError::Doorbells)?;
    // SAFETY: the doorbells are our own fresh pages; each one's fault is answered by a
    // handler (or, the descriptor closed, by the kernel).
    if let Err(e) = unsafe { uffd.register(doorbell, bells) } {
        // SAFETY: our own pages, known to nobody yet.
        let _ = unsafe { mman::unmap(doorbell, bells) };
        return Err(StartError::RegisterDoorbells(e.into()));
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
    numa: &Option<crate::memory::nodes::Nodes>,
    recycle: bool,
) -> Result<Vec<Pool>, StartError> {
    if !(opts.pool && features.has(Features::MOVE)) {
        return Ok(Vec::new());
    }
    let nodes: Vec<Option<u32>> = match numa {
        Some(n) => n.pool_nodes().map(Some).collect(),
        None => vec![None],
    };
    // Under an address-space limit (the shim caps pool_max by it), or strict overcommit (see
    // `within_commit`), the nodes share it.
    let shared = mman::address_limit().is_some() || mman::strict_overcommit();
    let bytes = match nodes.len() {
        k if k > 1 && shared => pmd_start(opts.pool_max / k).max(PMD_SIZE),
        _ => opts.pool_max,
    };
    nodes
        .iter()
        .map(|&node| Pool::new(bytes, huge, recycle, node).map_err(StartError::Pool))
        .collect()
}

/// The staging areas of `handlers` handlers, one PMD each, when the first of `pools` has a
/// huge ring; none otherwise.
///
/// # Context
/// A program thread, in [`Engine::start`], with no lock held; maps memory.
fn staging_areas(pools: &[Pool], handlers: usize) -> Result<Vec<mman::Mapping>, StartError> {
    let mut stage = Vec::new();
    if pools.first().is_some_and(|p| p.huge.is_some()) {
        for _ in 0..handlers {
            let m = mman::Mapping::new(PMD_SIZE, mman::Thp::Always).map_err(StartError::Staging)?;
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
    numa: &Option<crate::memory::nodes::Nodes>,
) -> Result<Vec<Pool>, StartError> {
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

impl Engine {
    /// Starts an engine with the given options.
    ///
    /// # Context
    /// The program thread starting the engine, with no lock held; as `Engine::start`.
    pub fn new(opts: Options) -> Result<Engine, StartError> {
        Engine::start(opts, StatsHome::Own(Box::default()))
    }

    /// Starts an engine that adds its counters to `stats`, which others may share (the
    /// counters of several engines then add up; [`Engine::stats`] shows the sum).
    ///
    /// # Context
    /// The program thread starting the engine, with no lock held; as `Engine::start`.
    pub fn with_stats(opts: Options, stats: &'static Stats) -> Result<Engine, StartError> {
        Engine::start(opts, StatsHome::Lent(stats))
    }

    /// The engine of [`Engine::new`] and [`Engine::with_stats`]: its userfaultfd, doorbells,
    /// pools and staging areas, the state they share, then its threads.
    ///
    /// # Context
    /// A program thread (the one starting the engine), with no lock held; takes only the new
    /// engine's thread list; waits for nothing but its system calls and the threads it spawns.
    fn start(opts: Options, stats: StatsHome) -> Result<Engine, StartError> {
        opts.validate()?;
        let cgroup = sys::cgroup::MemoryCgroup::find();
        let opts = within_commit(within_cgroup(opts, cgroup.as_ref()), mman::strict_overcommit());
        let page = mman::system_page_size();
        if page != PAGE_SIZE {
            return Err(StartError::PageSize(page));
        }
        sys::thread::prepare();
        let uffd = Uffd::open().map_err(StartError::Uffd)?;
        let features = uffd.features();
        let handlers = opts.handler_count();
        let doorbell = doorbells(&uffd, handlers)?;
        let huge = opts.pool_thp && mman::thp_available();
        // Several nodes with memory: a pool per node (see memory/nodes.rs); where a node's pool cannot
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
        let zero = ZeroSource::new().map_err(StartError::ZeroSource)?;
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
            lending: crate::fault::lend::Lending::new(lend_at),
            budget: crate::pool::budget::Budget::new(opts.pool_max, cgroup),
            numa,
            opts,
        }));
        // Built before spawning, so that a failed spawn drops an Engine that stops what started
        // (its drop rings one doorbell per handler started).
        let mut engine = Engine {
            shared,
            threads: Mutex::new(Threads::default()),
            giving_back: Mutex::new(()),
        };
        let threads = engine.threads.get_mut().unwrap_or_else(|e| e.into_inner());
        Engine::spawn_handlers(&engine.shared, threads, &|| ())?;
        Engine::spawn_scrubbers(&engine.shared, threads)?;
        Ok(engine)
    }

    /// Starts the handlers; `after_first` runs once the first one is there (the resume re-arms
    /// the doorbells then).
    ///
    /// # Context
    /// A program thread, in the start or a resume, holding the threads' lock; maps each thread's
    /// stack and TLS and clones it.
    pub(super) fn spawn_handlers(
        shared: &Arc<Shared>,
        threads: &mut Threads,
        after_first: &dyn Fn(),
    ) -> Result<(), StartError> {
        let table = sys::thread::Table::for_engine(shared.uffd_identity.map(|id| id.parts().0));
        for i in 0..shared.handlers() {
            let s = shared.clone();
            let t = sys::thread::spawn("zerofault-fault", table, Box::new(move || fault::run(s, i)));
            threads.handlers.push(t.map_err(StartError::Thread)?);
            if i == 0 {
                after_first();
            }
        }
        Ok(())
    }

    /// # Context
    /// A program thread, in the start or a resume, holding the threads' lock; maps each thread's
    /// stack and TLS and clones it.
    pub(super) fn spawn_scrubbers(shared: &Arc<Shared>, threads: &mut Threads) -> Result<(), StartError> {
        let table = sys::thread::Table::for_engine(shared.uffd_identity.map(|id| id.parts().0));
        for i in 0..shared.pools.len() {
            let s = shared.clone();
            // Counted before the thread exists: a failed handler reading what is queued waits
            // for every scrub to leave (`Shared::drain_then_close`).
            shared.live_scrubs.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            let t = sys::thread::spawn(
                "zerofault-scrub",
                table,
                Box::new(move || {
                    let _alive = Alive(&s.live_scrubs);
                    scrub::run(s.clone(), i)
                }),
            );
            if t.is_err() {
                shared.live_scrubs.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            }
            threads.scrubbers.push(t.map_err(StartError::Thread)?);
        }
        Ok(())
    }

    /// Starts an engine with the options of the environment (`ZEROFAULT_<NAME>`).
    ///
    /// # Context
    /// The program thread starting the engine, with no lock held; as `Engine::start`.
    pub fn from_env() -> Result<Engine, StartError> {
        Engine::new(Options::from_env()?)
    }
}

/// The machine-wide state (`machine` knob), or alone with the reason.
fn machine_state(opts: &Options) -> (crate::pool::machine::Machine, Option<String>) {
    use crate::pool::machine::Machine;
    if !opts.machine {
        return (Machine::alone(), Some("the machine knob is off".into()));
    }
    let dir = crate::pool::machine::runtime_dir();
    let cpus = u32::try_from(sys::thread::online_cpus()).unwrap_or(u32::MAX);
    match Machine::open(dir.as_deref(), cpus) {
        Ok(m) => (m, None),
        Err(why) => (Machine::alone(), Some(why.to_string())),
    }
}

/// Counts a scrub thread out when its body returns or unwinds.
struct Alive<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches pools whose rings, charged whole under strict overcommit, took 8 GiB of the
    /// machine's commit at each engine's start (round 3's `r_commit`).
    #[test]
    fn strict_overcommit_caps_what_the_rings_are_charged() {
        let o = Options::default();
        assert_eq!(within_commit(o.clone(), false), o, "left alone otherwise");
        for recycle in [true, false] {
            let o = Options {
                recycle,
                ..Options::default()
            };
            let s = within_commit(o, true);
            let rings = if recycle { 4 } else { 1 };
            assert!(s.pool_max * rings <= STRICT_RINGS, "{recycle}: pool_max {}", s.pool_max);
            assert!(s.scrub_start <= s.scrub_stop && s.scrub_stop <= s.pool_max);
            assert!(s.validate().is_ok(), "{recycle}: {:?}", s.validate());
        }
    }
}
