//! The scrub thread (seeds 002/003's kscrubd): zeroes the pages the program freed, keeps the
//! pool between its watermarks, and gives back what nobody takes, using only CPU nobody else
//! wants.
//!
//! States, like mm/page_reporting.c's worker: **idle** (asleep on a condition variable, or on a
//! timer tick), **requested** (a handler saw the pool below `scrub_start`, or a recycle brought
//! pages, and kicked it), **active** (one 2 MiB batch at a time).
//!
//! Each round, in order:
//! 1. **Recycled pages** (`recycle.rs`): each dirty batch is zeroed, with one fence, and moved
//!    into its clean ring while that has room. Seed 003's hot/cold rule picks the stores: a
//!    batch freed moments ago ([`HOT`]) while the whole dirty backlog fits in the last-level
//!    cache is zeroed with `rep stosb` (its lines are likely cached: temporal stores hit
//!    them); the rest with the cold method, `zero_method` or, for `auto`, the fastest of the
//!    machine's methods measured on the first cold batches ([`MethodChoice`]).
//! 2. **Refill**: populating 2 MiB at a time (`MADV_POPULATE_WRITE`: the kernel allocates and
//!    zeroes) until the pool, with the dirty pages on their way, holds `scrub_stop`. Only once
//!    a sequential writer was seen (the first predicted write fault) or the pool was prefilled:
//!    a program whose faults are random or read-only pays for no pool at all. In a memory
//!    cgroup, each step only within its headroom, every process's pools counted
//!    (`budget.rs`: [`crate::pool::budget::Budget::may_fill`]).
//! 3. **Purge**: dirty batches older than `purge_delay` that still find no room, and pool pages
//!    above `scrub_stop` when nobody took a page for `purge_delay`, go back to the kernel.
//!
//! - It works only while it has a CPU to itself, the seed's "run on the most idle CPU": at the
//!   program's own priority, never `SCHED_IDLE`, and it rests while it waits to run ([`Share`]).
//!   The faulting thread never waits for it; an empty pool means the handler copies from the
//!   zero source instead.
//! - `scrub_load` (seed 003, off by default): no refill while the one-minute load average per
//!   CPU is above it. Checked before each chunk; a skipped round is counted and retried on the
//!   next timer tick.

use crate::page::{bytes, pages, PMD_PAGES};
use crate::pool::recycle::DirtyRing;
use crate::pool::zero::methods::ZeroMethod;
use crate::pool::{FillError, Pool};
use crate::stats::{nanos, Stats};
use crate::sys::mman;
use crate::sys::raw::Errno;
use crate::sys::sched;
use crate::sys::thread::{self, ThreadClock};
use crate::sys::uffd::Uffd;
use crate::Shared;
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[cfg(doc)]
use super::budget::Budget;
use super::budget::Recent;
use super::share::Share;
pub(crate) use super::zero::choice::MethodChoice;
#[cfg(doc)]
use super::zero::choice::HOT;

/// How the handler and the engine talk to the scrub thread.
#[derive(Debug, Default)]
pub(crate) struct ScrubCtl {
    requested: Mutex<bool>,
    cv: Condvar,
}

impl ScrubCtl {
    /// Asks for a refill. Cheap when a request is already pending.
    ///
    /// # Context
    /// Any thread; takes the scrub's wake lock for a moment, never waits.
    pub(crate) fn kick(&self) {
        let mut r = self.requested.lock().unwrap_or_else(|e| e.into_inner());
        if !*r {
            *r = true;
            self.cv.notify_one();
        }
    }

    /// Waits for a request, or for `timeout`. Returns whether a request was pending.
    fn wait(&self, timeout: Duration) -> bool {
        let r = self.requested.lock().unwrap_or_else(|e| e.into_inner());
        let (mut r, _) = self
            .cv
            .wait_timeout_while(r, timeout, |r| !*r)
            .unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *r, false)
    }
}

/// Whether the load gate lets the scrub run now.
fn load_allows(limit: Option<f64>) -> bool {
    // The knob first: reading /proc/loadavg allocates.
    match limit.map(|l| (l, thread::loadavg_1min())) {
        Some((limit, Some(load))) => load / thread::online_cpus() as f64 <= limit,
        _ => true,
    }
}

/// Zeroes the dirty batches and moves them into their clean rings while those have room.
/// Returns whether it did anything.
fn clean_dirty(shared: &Shared, pool: &Pool, z: &mut MethodChoice, clock: &ThreadClock, share: &mut Share) -> bool {
    let stats = &*shared.stats;
    let mut worked = false;
    // The pairs whose clean ring took nothing more this round (see `Pool::next_dirty`).
    let mut done = [false; 2];
    loop {
        if stopping(shared) || !share.allows(clock, stats, &shared.machine) {
            return worked;
        }
        // One batch at a time under the pool's work lock, peeked under it: a release or the
        // mlockall protection happens between batches, never inside one.
        let Some(_step) = pool.step(&shared.pool_paused) else {
            return worked;
        };
        park(shared);
        let Some((i, dirty, clean, b)) = pool.next_dirty(done) else {
            return worked;
        };
        if !dirty.is_huge()
            && b.pages == PMD_PAGES
            && pool.wants_trade(1 << shared.opts.max_order)
            && trade(shared, pool, dirty, b.addr)
        {
            worked = true;
            continue;
        }
        let age = Duration::from_nanos(dirty.now().saturating_sub(b.stamp));
        let hot = z.is_hot(age, bytes(pool.dirty()));
        let method = if hot { ZeroMethod::Stosb } else { z.cold() };
        let mut consumed = 0;
        let mut zeroed = 0;
        let filled = clean.fill_with(b.pages, |dst, n| {
            let k = n.min(b.pages);
            let t0 = clock.read();
            // SAFETY: the batch is the dirty ring's head, which only the scrub touches
            // (recyclers fill slots past the tail); its bytes are the program's old ones,
            // which nobody may see: they are zeroed here, before they move.
            unsafe { method.zero(b.addr as *mut u8, bytes(k)) }?;
            let cpu = clock.read().saturating_sub(t0);
            Stats::add(&stats.scrub_zero_ns, nanos(cpu));
            if !hot {
                z.record(method, bytes(k) as u64, cpu, stats);
            }
            zeroed = k;
            // Only around the move: the kernel method's MADV_DONTNEED above waits for the
            // handler to read its REMOVE event, and a handler failing open waits for
            // every reader of the descriptor to let go of it.
            let uffd = shared.uffd.read().unwrap_or_else(|e| e.into_inner());
            let Some(u) = uffd.as_ref() else { return Ok(0) };
            let (filled, used) = move_zeroed(u, dst, n, b.addr, k, clean.is_huge_ring());
            consumed = used;
            Ok::<u64, std::io::Error>(filled)
        });
        match filled {
            Ok(0) if consumed == 0 && zeroed == 0 => {
                done[i] = true; // the clean ring is full
                continue;
            }
            Ok(_) => {}
            Err(_) => {
                // The zeroing failed (the kernel method's populate, out of memory): the
                // batch goes back to the kernel instead.
                purge_batch(dirty, b.addr, b.pages);
                Stats::add(&stats.pages_purged, b.pages);
                continue;
            }
        }
        if consumed == 0 && zeroed > 0 && filled.as_ref().is_ok_and(|f| *f == 0) {
            // Nothing moved and nothing filled (a move refused): leave it to the purge.
            done[i] = true;
            continue;
        }
        consume_zeroed(pool, dirty, b.addr, consumed, hot, stats);
        worked = true;
    }
}

/// The first `consumed` pages of the dirty batch at `addr` moved into their clean ring
/// (zeroed `hot` or not): they leave the dirty ring, the rest of a huge page moved in part
/// discarded with them; a huge ring's demand is met as far.
///
/// # Context
/// A scrub thread, from [`clean_dirty`], holding its pool's work lock (`Pool::step`); takes no
/// other lock; `MADV_DONTNEED` of the rest of a huge page may wait for the handler to read its
/// REMOVE event.
fn consume_zeroed(pool: &Pool, dirty: &DirtyRing, addr: usize, mut consumed: u64, hot: bool, stats: &Stats) {
    if dirty.is_huge() && consumed % PMD_PAGES != 0 {
        // A huge page moved in part (a clean slot found holding pages part way): the
        // dirty ring goes by whole slots, so the rest of this one is discarded.
        let whole = consumed.next_multiple_of(PMD_PAGES);
        // SAFETY: the rest of the scrub's own batch, zeroed already; discarded.
        let _ = unsafe { mman::madvise(addr + bytes(consumed), bytes(whole - consumed), mman::MADV_DONTNEED) };
        Stats::add(&stats.pages_purged, whole - consumed);
        consumed = whole;
    }
    dirty.consume(consumed);
    if dirty.is_huge() {
        pool.huge_demand_met(consumed / PMD_PAGES);
    }
    Stats::add(&stats.pages_scrubbed, consumed);
    if hot {
        Stats::add(&stats.pages_scrubbed_hot, consumed);
    }
}

/// Trades the whole dirty 4 KiB batch at `addr` for a huge page (see [`Pool::wants_trade`]):
/// populates one huge chunk into the huge ring, then gives the batch back to the kernel.
/// Returns false, having changed nothing, when no huge chunk could be populated (the demand
/// is then forgotten: the batch is zeroed as usual).
fn trade(shared: &Shared, pool: &Pool, dirty: &DirtyRing, addr: usize) -> bool {
    let Some(huge) = pool.huge.as_ref() else { return false };
    match huge.fill_step(PMD_PAGES, &shared.stats) {
        Ok(n) if n > 0 => {
            pool.take_huge_missed();
            purge_batch(dirty, addr, PMD_PAGES);
            Stats::add(&shared.stats.pages_purged, PMD_PAGES);
            Stats::add(&shared.stats.huge_traded, 1);
            true
        }
        _ => {
            pool.clear_huge_missed();
            false
        }
    }
}

/// Moves retried, each after a yield, after an EAGAIN that moved nothing (an event pending for
/// the handler): the batch is tried again on a later round if they run out.
const AGAIN_RETRIES: u32 = 64;

/// Moves `k` zeroed pages from `src` into the `n` free clean slots at `dst`: (slots filled,
/// source pages used). A slot that holds a page already holds a zero one (see
/// `Ring::fill_with`) and counts as filled; a source hole is skipped.
fn move_zeroed(u: &Uffd, dst: usize, n: u64, src: usize, k: u64, huge: bool) -> (u64, u64) {
    let (mut d, mut s, mut again) = (0u64, 0u64, 0u32);
    while d < n && s < k {
        let len = (n - d).min(k - s);
        // SAFETY: `src` is the zeroed head of a dirty ring (the scrub's alone) and `dst` free
        // slots of a clean ring reserved by `fill_with`, which only this producer fills.
        let p = unsafe { u.move_pages(dst + bytes(d), src + bytes(s), bytes(len)) };
        let done = pages(p.done);
        d += done;
        s += done;
        match p.errno {
            None => {}
            Some(Errno(libc::EAGAIN)) if done > 0 => {}
            Some(Errno(libc::EEXIST)) if huge => d = (d + 1).next_multiple_of(PMD_PAGES),
            Some(Errno(libc::EEXIST)) => d += 1,
            Some(Errno(libc::ENOENT)) => s += 1,
            Some(Errno(libc::EAGAIN)) if again < AGAIN_RETRIES => {
                again += 1;
                std::thread::yield_now();
            }
            Some(_) => break,
        }
    }
    (d.min(n), s.min(k))
}

/// Gives a dirty batch back to the kernel and drops it from the ring.
fn purge_batch(dirty: &DirtyRing, addr: usize, n: u64) {
    // SAFETY: the dirty ring's head, the scrub's alone; its bytes are discarded.
    let _ = unsafe { mman::madvise(addr, bytes(n), mman::MADV_DONTNEED) };
    dirty.consume(n);
}

/// What the purge remembers between rounds.
#[derive(Debug)]
struct Idle {
    taken: u64,
    /// Prefills seen ([`crate::pool::budget::Budget::fills`]): one counts as activity.
    fills: u64,
    since: Instant,
}

/// Step 3 of a round (see the module's docs).
fn purge(shared: &Shared, pool: &Pool, idle: &mut Idle) {
    let stats = &*shared.stats;
    let delay = shared.opts.purge_delay;
    let Some(_step) = pool.step(&shared.pool_paused) else {
        return;
    };
    for dirty in [pool.dirty_huge.as_ref(), pool.dirty_small.as_ref()]
        .into_iter()
        .flatten()
    {
        while let Some(b) = dirty.peek() {
            if Duration::from_nanos(dirty.now().saturating_sub(b.stamp)) < delay {
                break;
            }
            purge_batch(dirty, b.addr, b.pages);
            Stats::add(&stats.pages_purged, b.pages);
        }
    }
    let (taken, (fills, filling)) = (pool.taken(), shared.budget.fills());
    if taken != idle.taken || fills != idle.fills || filling {
        *idle = Idle {
            taken,
            fills,
            since: Instant::now(),
        };
        return;
    }
    let stop = pages(shared.opts.scrub_stop);
    if idle.since.elapsed() < delay || pool.available() <= stop {
        return;
    }
    shared.budget.end_reserve();
    // Down to scrub_stop, each ring to its share of it (the huge ring in whole huge pages, which
    // is all it hands out: rounded down, so that the pool ends at scrub_stop or below).
    let cap = pool.capacity();
    for ring in [Some(&pool.small), pool.huge.as_ref()].into_iter().flatten() {
        let keep = u64::try_from(u128::from(stop) * u128::from(pool.share(ring)) / u128::from(cap)).unwrap_or(0);
        let keep = if ring.is_huge_ring() {
            keep / PMD_PAGES * PMD_PAGES
        } else {
            keep
        };
        while ring.available() > keep && !stopping(shared) {
            let n = ring.purge(ring.available() - keep);
            if n == 0 {
                break;
            }
            Stats::add(&stats.pages_purged, n);
        }
    }
    idle.taken = pool.taken();
}

/// Stays here while a test parks the scrub ([`crate::Engine::park_scrub`]), in the middle of
/// a step (the caller holds the pool's work lock).
fn park(shared: &Shared) {
    if !shared.scrub_parked.load(Acquire) {
        return;
    }
    shared.scrubs_parked.fetch_add(1, AcqRel);
    while shared.scrub_parked.load(Acquire) && !stopping(shared) {
        std::thread::sleep(Duration::from_millis(1));
    }
    shared.scrubs_parked.fetch_sub(1, AcqRel);
}

/// A node's pool is scrubbed on that node's CPUs, and the pages this thread makes the kernel
/// allocate outside the bound rings (the `kernel` zeroing method's populate in a dirty ring)
/// come from its node too. The CPUs it is bound to, if it is.
fn bind_to_node(shared: &Shared, pool: &Pool) -> Option<sched::CpuMask> {
    let (Some(n), Some(node)) = (&shared.numa, pool.node) else {
        return None;
    };
    let _ = crate::sys::numa::prefer(Some(node));
    let i = n
        .topology
        .index(node)
        .filter(|&i| !n.topology.nodes[i].cpus.is_empty())?;
    let _ = crate::sys::numa::bind_to_cpus(&n.topology.nodes[i].cpus);
    sched::own_cpus()
}

fn stopping(shared: &Shared) -> bool {
    shared.stopping.load(Acquire) || shared.failed.load(Acquire) || shared.exiting.load(Acquire)
}

/// The thread's body, for pool `ix` of `Shared::pools`. A node's pool is scrubbed on that
/// node's CPUs: its zeroing stores and the kernel's page clearing for its populate then run
/// where the memory is.
///
/// # Context
/// The scrub thread, for its whole life (spawned by `Engine::start` or `Engine::resume`, every
/// signal blocked). Sleeps between steps on its wake lock's condition, rests on a busy machine, and
/// waits while the program is not quiet.
pub(crate) fn run(shared: Arc<Shared>, ix: usize) {
    let mut share = Share::new();
    // Started by a program thread, it has that thread's policy: not a real-time one.
    thread::leave_realtime();
    let clock = thread::ThreadClock::current();
    let mut counted = Duration::ZERO;
    let Some(pool) = shared.pools.get(ix) else { return };
    // Only where the program's threads may run (DESIGN.md, "The program's rights").
    let mut cpus = sched::Placement::start(bind_to_node(&shared, pool));
    // A process real-time from its start (chrt, an exec from a real-time thread).
    if ix == 0 && sched::process_realtime() {
        return shared.step_aside();
    }
    probe_tables(&shared, ix, pool);
    let start = pages(shared.opts.scrub_start);
    let stop = pages(shared.opts.scrub_stop);
    let mut choice = MethodChoice::new(
        shared.opts.zero_method,
        thread::llc_bytes().unwrap_or(8 << 20),
        &shared.stats,
    );
    let tick = (shared.opts.purge_delay / 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut idle = Idle {
        taken: pool.taken(),
        fills: shared.budget.fills().0,
        since: Instant::now(),
    };
    let mut looked = Instant::now();
    let mut budget_looked = (Instant::now(), Recent::default());
    // A request that came while the scrub rested: taken up when the rest is over.
    let mut deferred = false;
    while !stopping(&shared) {
        let every = shared.budget.look_every(LOOK_EVERY, shared.pool_held() > 0);
        let mut wait = tick.min(every);
        if deferred {
            if let Some(r) = share.resting_for(Instant::now()) {
                wait = wait.min(r + Duration::from_millis(1));
            }
        }
        let requested = pool.scrub.wait(wait) || deferred;
        if stopping(&shared) {
            break;
        }
        if ix == 0 && looked.elapsed() >= LOOK_EVERY {
            looked = Instant::now();
            // A tracer (or no way left to see one: /proc gone or denied), or a real-time
            // policy given from outside (`chrt -p`): the kernel serves the faults from now on.
            if thread::traced_or_unknown() || sched::process_realtime() {
                shared.step_aside();
                break;
            }
            cpus.look();
        }
        if ix == 0 {
            look_at_budget(&shared, &mut budget_looked, every);
        }
        cpus.follow();
        probe_tables(&shared, ix, pool);
        let budget = shared.budget.pages() / shared.pools.len() as u64;
        shrink(&shared, pool, budget);
        if !shared.pool_paused.load(Acquire) {
            shared.scrubs_working.fetch_add(1, Relaxed);
            clean_dirty(&shared, pool, &mut choice, &clock, &mut share);
            // Refill when asked, or on a timer tick that finds the pool low (after a load-gated
            // round, or before any handler noticed).
            if shared.pool_may_fill.load(Acquire) && (requested || pool.available() < start) {
                refill(&shared, pool, stop.min(budget), &clock, &mut share);
            }
            purge(&shared, pool, &mut idle);
            share.idle(&shared.machine);
            shared.scrubs_working.fetch_sub(1, Relaxed);
        }
        deferred = requested && share.resting_for(Instant::now()).is_some();
        let now = clock.read();
        Stats::add(&shared.stats.scrub_cpu_ns, nanos(now - counted));
        counted = now;
    }
    let now = clock.read();
    Stats::add(&shared.stats.scrub_cpu_ns, nanos(now.saturating_sub(counted)));
}

/// The first scrub computes the pools' budget afresh ([`Budget::update`]) when `every` has
/// passed since `looked`.
fn look_at_budget(shared: &Shared, looked: &mut (Instant, Recent), every: Duration) {
    if looked.0.elapsed() < every {
        return;
    }
    looked.0 = Instant::now();
    let held = shared.pool_held();
    shared
        .budget
        .update(&mut looked.1, shared.opts.purge_delay, &shared.machine, held);
}

/// Whether the kernel frees emptied page tables, probed once by the first scrub (not on the
/// first recycle: that is a program thread's free, sys::mman), as a step: under the pool's
/// work lock, so that the program's `mlockall` (which takes it, `Engine::before_mlockall`)
/// never finds the probe's 16 MiB mapped and locks it. Refused while the pool is protected
/// or paused: looked at again every round.
fn probe_tables(shared: &Shared, ix: usize, pool: &Pool) {
    if ix != 0 || !pool.recycles() || mman::pt_reclaim_known().is_some() {
        return;
    }
    if let Some(_step) = pool.step(&shared.pool_paused) {
        mman::probe_pt_reclaim();
    }
}

/// How often the first scrub thread looks whether a tracer attached to the process (a
/// debugger reads memory with no way to wait for the engine: /proc/PID/mem, ptrace; the engine
/// then steps aside for good, DESIGN.md, "The program's rights"; it does so too once it can no
/// longer look, `thread::traced_or_unknown`) and computes the pools' memory budget afresh
/// ([`crate::pool::budget`]).
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// Gives back what `pool` holds above `keep` pages: recycled pages first, oldest first (not
/// zeroed yet: the cheapest to lose), then ready ones (the huge ring in whole huge pages).
fn shrink(shared: &Shared, pool: &Pool, keep: u64) {
    let mut held = pool.available() + pool.dirty();
    if held <= keep {
        return;
    }
    let Some(_step) = pool.step(&shared.pool_paused) else {
        return;
    };
    let stats = &*shared.stats;
    for dirty in [pool.dirty_huge.as_ref(), pool.dirty_small.as_ref()]
        .into_iter()
        .flatten()
    {
        while held > keep {
            let Some(b) = dirty.peek() else { break };
            purge_batch(dirty, b.addr, b.pages);
            Stats::add(&stats.pages_purged, b.pages);
            held = held.saturating_sub(b.pages);
        }
    }
    for ring in [pool.huge.as_ref(), Some(&pool.small)].into_iter().flatten() {
        while held > keep && !stopping(shared) {
            let over = held - keep;
            let want = if ring.is_huge_ring() {
                over.div_ceil(PMD_PAGES) * PMD_PAGES
            } else {
                over
            };
            let n = ring.purge(want.min(ring.available()));
            if n == 0 {
                break;
            }
            Stats::add(&stats.pages_purged, n);
            held = held.saturating_sub(n);
        }
    }
}

/// How long the fault handler must have read no fault (and the program grown no block) for
/// the program to count as quiet.
const QUIET: Duration = Duration::from_millis(1);

/// Waits, before a refill step, while the program is faulting (a fault read within [`QUIET`])
/// and the pool still holds more than `reserve` pages (one largest window): populating then
/// competes with the faulting program for the CPU and the memory bus (a burst that
/// overlapped refills took over twice as long: docs/DESIGN.md, "A busy machine"), and a
/// program that frees what it touched brings the pages back anyway.
///
/// And while the program grows blocks (`grow_fills` within [`QUIET`]), however empty the
/// pool: a populate holds the address space's lock for a whole PMD, and each `mremap` or
/// `mprotect` that grows a block waits for it (docs/DESIGN.md, "Blocks that grow in small
/// steps"). Growth takes no pool page, so the pool waits until it pauses. Returns false when
/// the engine is stopping.
fn wait_for_quiet(shared: &Shared, pool: &Pool, reserve: u64) -> bool {
    let stats = &shared.stats;
    let mut growing = false;
    loop {
        if stopping(shared) {
            return false;
        }
        if !growing && pool.available() <= reserve {
            return true;
        }
        let seen = (stats.fault_events.load(Relaxed), stats.grow_fills.load(Relaxed));
        std::thread::sleep(QUIET);
        let now = (stats.fault_events.load(Relaxed), stats.grow_fills.load(Relaxed));
        growing = now.1 != seen.1;
        if growing {
            Stats::add(&stats.scrub_grow_waits, 1);
        }
        if now == seen {
            return true;
        }
    }
}

/// Step 2 of a round: populates until the pool, with the dirty pages on their way, holds
/// `stop` pages.
fn refill(shared: &Shared, pool: &Pool, stop: u64, clock: &thread::ThreadClock, share: &mut Share) {
    let reserve = 1u64 << shared.opts.max_order;
    // Before the program's memory took a huge page, the small ring alone, to its part of
    // `stop`: the huge ring's part stays free for when it does (see `Shared::huge_wanted`).
    let stop = if shared.huge_wanted.load(Relaxed) || pool.huge.is_none() {
        stop
    } else {
        stop.min(stop * pool.share(&pool.small) / pool.capacity().max(1))
    };
    while !stopping(shared) && pool.available() + pool.dirty() < stop {
        // Not stepping while it waits for the program to be quiet.
        share.idle(&shared.machine);
        if !wait_for_quiet(shared, pool, reserve) || !share.allows(clock, &shared.stats, &shared.machine) {
            break;
        }
        if !load_allows(shared.opts.scrub_load) {
            Stats::add(&shared.stats.scrub_load_skips, 1);
            break;
        }
        let huge_too = shared.huge_wanted.load(Relaxed);
        // Within the memory cgroup's headroom, with every other process's pools in it.
        let Some(claim) = shared.budget.may_fill(&shared.machine, shared.pool_held(), PMD_PAGES) else {
            Stats::add(&shared.stats.scrub_cgroup_skips, 1);
            break;
        };
        let step = pool.fill_step(
            stop.saturating_sub(pool.available()).min(PMD_PAGES),
            huge_too,
            &shared.stats,
        );
        claim.done(shared.pool_held());
        match step {
            Ok(0) => break,
            Ok(_) => {}
            // Out of memory, the node full (`Pool::low`), or a refused populate: the handlers
            // copy instead, or take the next node's pages; try again on a later tick.
            Err(e) => {
                if matches!(e, FillError::NodeFull) && pool.node.is_some() {
                    Stats::add(&shared.stats.scrub_node_full, 1);
                }
                break;
            }
        }
    }
}
