//! The pool's memory budget: how many pages the pools may hold (ready and recycled together),
//! so that the engine's own resident memory stays small beside the program's and inside its
//! memory cgroup (DESIGN.md, "The pool's memory budget").
//!
//! - **Demand.** The pools keep [`FLOOR`] (128 MiB), what a caller asked for on top
//!   (`Engine::prefill`), and twice the largest block the program freed in the last
//!   `purge_delay` on top of that (a program freeing 1 GiB to map it again keeps it). A
//!   program churning 16 MiB blocks keeps 160 MiB, not `pool_max`.
//! - **The memory cgroup.** With a limit (`memory.max`/`memory.high` of v2, v1's
//!   `memory.limit_in_bytes`, at any level up the hierarchy), the pools of **every process in
//!   it together** hold at most an eighth of the lowest limit: each process writes what its
//!   pools hold in the cgroup's ledger, in the machine-wide state (`pool/machine.rs`), and
//!   budgets only what the others leave. The kernel would otherwise reclaim (with no swap:
//!   kill) a program for pages the engines keep.
//! - **Headroom.** A refill step populates only while the cgroup's headroom (limit less
//!   usage, the least over the limited levels), less the steps other processes are
//!   populating, keeps [`fill_reserve`] (a quarter of the limit) after it ([`Budget::may_fill`],
//!   [`fill_allowed`]); the step is claimed in the ledger first, so that forty processes
//!   starting at once do not each see the same headroom. The programs' own faults are
//!   charged too: once the headroom is under the fill reserve, each pool gives back what it
//!   lacks, and under [`purge_reserve`] (an eighth) all it holds, so that the pools are empty
//!   well before the programs reach the limit. While the headroom is under twice the fill
//!   reserve and the pools hold pages, the budget is looked at every [`NEAR_EVERY`] instead of
//!   every `scrub::LOOK_EVERY`.
//!
//! The first scrub thread computes it now and then ([`Budget::update`], [`Budget::look_every`]);
//! every scrub gives back what its pool holds above its share (dirty pages first, oldest
//! first, then ready ones), and a recycle is refused (the pages discarded, as natively) while
//! the pools hold it all.

use crate::page::{bytes, pages};
use crate::pool::machine::{Ledger, Machine};
use crate::sys::cgroup::MemoryCgroup;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// What the pools may always hold: 128 MiB.
pub(crate) const FLOOR: u64 = pages(128 << 20);

/// How often the budget is looked at while a cgroup's headroom is under twice
/// [`fill_reserve`] and the pools hold pages: they must give them back before the programs'
/// own faults reach the limit.
pub(crate) const NEAR_EVERY: Duration = Duration::from_millis(10);

/// The headroom a refill step leaves the cgroup's programs, bytes: a quarter of its limit.
/// Under it the pools give back what it lacks.
pub(crate) const fn fill_reserve(limit: u64) -> u64 {
    limit / 4
}

/// The headroom under which the cgroup's pools hold nothing, bytes: an eighth of its limit.
pub(crate) const fn purge_reserve(limit: u64) -> u64 {
    limit / 8
}

/// What pools holding `held` pages may keep with `headroom` bytes left in a cgroup of
/// `limit`: all of it above [`fill_reserve`], what the headroom lacks less below it (each
/// process gives that back: together more than needed, never less), nothing under
/// [`purge_reserve`].
pub(crate) fn keep(limit: u64, headroom: u64, held: u64) -> u64 {
    if headroom < purge_reserve(limit) {
        return 0;
    }
    let lacks = fill_reserve(limit).saturating_sub(headroom);
    held.saturating_sub(pages(usize::try_from(lacks).unwrap_or(usize::MAX)))
}

/// Pages the pools of all the processes in a cgroup may hold together: an eighth of its limit.
fn cgroup_pages(limit: u64) -> u64 {
    pages(usize::try_from(limit / 8).unwrap_or(usize::MAX))
}

/// Whether one refill step of `step` pages may populate, in a cgroup of `limit` bytes with
/// `headroom` bytes left, the other processes' pools holding and populating `others`, ours
/// holding `mine` pages: all the pools stay within the cgroup's share ([`cgroup_pages`]), and
/// the headroom after this step and the others' keeps [`fill_reserve`]. The same for v1 and
/// v2: only the files the numbers come from differ (`sys::cgroup`).
pub(crate) fn fill_allowed(limit: u64, headroom: u64, others: Ledger, mine: u64, step: u64) -> bool {
    let pooled = others
        .pooled
        .saturating_add(others.claims)
        .saturating_add(mine)
        .saturating_add(step);
    let charged = u64::try_from(bytes(others.claims.saturating_add(step))).unwrap_or(u64::MAX);
    pooled <= cgroup_pages(limit) && headroom >= charged.saturating_add(fill_reserve(limit))
}

/// A refill step allowed by [`Budget::may_fill`]: its claim in the cgroup's ledger, withdrawn
/// when it is [done](FillClaim::done) or dropped.
#[derive(Debug)]
pub(crate) struct FillClaim<'a> {
    at: Option<(&'a Machine, u32, u64)>,
}

impl FillClaim<'_> {
    /// The step is over, and the pools hold `held` pages: written in the ledger, the claim
    /// withdrawn.
    ///
    /// # Context
    /// A scrub thread; atomics on the shared page.
    pub(crate) fn done(self, held: u64) {
        if let Some((m, key, _)) = self.at {
            m.ledger_hold(key, held);
        }
    }
}

impl Drop for FillClaim<'_> {
    fn drop(&mut self) {
        if let Some((m, key, n)) = self.at.take() {
            m.ledger_claim(key, n, false);
        }
    }
}

/// The budget, shared by the pools' scrubs and the recycling program threads.
#[derive(Debug)]
pub(crate) struct Budget {
    cgroup: Option<MemoryCgroup>,
    /// `pool_max`, in pages: the budget never exceeds it.
    max: u64,
    /// Pages the pools may hold now.
    pages: AtomicU64,
    /// The largest release (one recycle call) since the last update, in pages.
    released: AtomicU64,
    /// Pages a caller asked the pools to hold (`Engine::prefill`), until the pools are idle
    /// for `purge_delay` after it.
    reserved: AtomicU64,
    /// Prefills begun and finished: the idle purge counts its delay from the last change.
    fills: AtomicU64,
    /// Prefills running now: the pools are busy, not idle.
    filling: AtomicU64,
    /// The cgroup's headroom when last looked at, bytes (`u64::MAX`: no cgroup).
    headroom: AtomicU64,
    /// The other processes' pools in the cgroup, held and populating, when last looked at.
    others: AtomicU64,
    /// What the pools may keep, as [`keep`] found it at the last look (`u64::MAX`: the
    /// headroom was above [`fill_reserve`]).
    keep: AtomicU64,
}

/// What the updating scrub remembers between updates: the largest recent release, and when it
/// was seen.
#[derive(Debug)]
pub(crate) struct Recent {
    big: u64,
    since: Instant,
}

impl Default for Recent {
    fn default() -> Recent {
        Recent {
            big: 0,
            since: Instant::now(),
        }
    }
}

impl Budget {
    /// A budget for pools of `pool_max` bytes in all, in `cgroup`.
    ///
    /// # Context
    /// The program thread starting the engine.
    pub(crate) fn new(pool_max: usize, cgroup: Option<MemoryCgroup>) -> Budget {
        let max = pages(pool_max);
        let first = cgroup.map_or(max, |c| {
            max.min(pages(usize::try_from(c.limit / 8).unwrap_or(usize::MAX)))
        });
        Budget {
            cgroup,
            max,
            pages: AtomicU64::new(first.min(FLOOR)),
            released: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            fills: AtomicU64::new(0),
            filling: AtomicU64::new(0),
            headroom: AtomicU64::new(u64::MAX),
            others: AtomicU64::new(0),
            keep: AtomicU64::new(u64::MAX),
        }
    }

    /// Pages the pools may hold now.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn pages(&self) -> u64 {
        self.pages.load(Relaxed)
    }

    /// A recycle of `n` pages is asked for: remembered as demand, and the budget raised at once
    /// (within the cgroup's bound) to the floor and the reserve and twice `n`, so that a program
    /// freeing a large block keeps it.
    ///
    /// # Context
    /// A program thread releasing memory (recycling, a discard); atomics only.
    pub(crate) fn note_release(&self, n: u64) {
        self.released.fetch_max(n, Relaxed);
        let base = FLOOR.saturating_add(self.reserved.load(Relaxed));
        self.pages
            .fetch_max(base.saturating_add(n.saturating_mul(2)).min(self.cap()), Relaxed);
    }

    /// A caller asked the pools to hold `n` pages (`Engine::prefill`).
    ///
    /// # Context
    /// A program thread, in `Engine::prefill` ([`Budget::filling`]); atomics only.
    pub(crate) fn reserve(&self, n: u64) {
        self.reserved.fetch_max(n, Relaxed);
        self.pages.fetch_max(n.min(self.cap()), Relaxed);
    }

    /// A prefill of `n` pages begins: they are reserved, and the pools are busy until
    /// [`Budget::filled`].
    ///
    /// # Context
    /// A program thread, in `Engine::prefill`; atomics only.
    pub(crate) fn filling(&self, n: u64) {
        self.filling.fetch_add(1, AcqRel);
        self.fills.fetch_add(1, Release);
        self.reserve(n);
    }

    /// A prefill finished (see [`Budget::fills`]).
    ///
    /// # Context
    /// A program thread, in `Engine::prefill`; atomics only.
    pub(crate) fn filled(&self) {
        self.fills.fetch_add(1, Release);
        self.filling.fetch_sub(1, AcqRel);
    }

    /// Prefills begun and finished so far, and whether one is running: the scrub's idle purge
    /// waits `purge_delay` after the last change, and none runs during a prefill.
    ///
    /// # Context
    /// The scrub thread. Atomics only.
    pub(crate) fn fills(&self) -> (u64, bool) {
        (self.fills.load(Acquire), self.filling.load(Acquire) > 0)
    }

    /// The pools were idle for `purge_delay` and gave back what a prefill had asked for.
    ///
    /// # Context
    /// The scrub thread. Atomics only.
    pub(crate) fn end_reserve(&self) {
        self.reserved.store(0, Relaxed);
    }

    /// The most the pools may hold: `pool_max`, what the other processes' pools leave of the
    /// cgroup's share, what the headroom lets them [`keep`] (as last looked at by
    /// [`Budget::look`]).
    fn cap(&self) -> u64 {
        let Some(cg) = self.cgroup else { return self.max };
        self.max
            .min(cgroup_pages(cg.limit).saturating_sub(self.others.load(Relaxed)))
            .min(self.keep.load(Relaxed))
    }

    /// Reads the cgroup's headroom and its ledger, and writes our line (`held`: pages our pools
    /// hold).
    fn look(&self, machine: &Machine, held: u64) {
        let Some(cg) = self.cgroup else { return };
        let key = cg.key();
        machine.ledger_hold(key, held);
        let others = machine.ledger_others(key);
        let room = cg.headroom();
        self.others.store(others.pooled.saturating_add(others.claims), Relaxed);
        self.headroom.store(room, Relaxed);
        let keep = if room >= fill_reserve(cg.limit) {
            u64::MAX
        } else {
            keep(cg.limit, room, held)
        };
        self.keep.store(keep, Relaxed);
    }

    /// How long until the budget is looked at again: `every`, or [`NEAR_EVERY`] while the
    /// cgroup's headroom is under twice [`fill_reserve`] and the pools hold pages (`held`).
    ///
    /// # Context
    /// A scrub thread; atomics only.
    pub(crate) fn look_every(&self, every: Duration, held: bool) -> Duration {
        let near = self
            .cgroup
            .is_some_and(|cg| self.headroom.load(Relaxed) < fill_reserve(cg.limit).saturating_mul(2));
        if near && held {
            every.min(NEAR_EVERY)
        } else {
            every
        }
    }

    /// Whether a refill step of `step` pages may populate now, our pools holding `held`: always
    /// without a cgroup limit; else the step is claimed in the cgroup's ledger, and kept only
    /// if [`fill_allowed`] (with the headroom read after the claim).
    ///
    /// # Context
    /// A scrub thread, before a refill step; reads the cgroup's files (raw system calls, no
    /// allocation), atomics on the shared page.
    pub(crate) fn may_fill<'a>(&self, machine: &'a Machine, held: u64, step: u64) -> Option<FillClaim<'a>> {
        let Some(cg) = self.cgroup else {
            return Some(FillClaim { at: None });
        };
        if self.keep.load(Relaxed) != u64::MAX {
            return None; // giving back, not filling
        }
        let key = cg.key();
        machine.ledger_claim(key, step, true);
        let claim = FillClaim {
            at: Some((machine, key, step)),
        };
        let others = machine.ledger_others(key);
        let room = cg.headroom();
        self.headroom.store(room, Relaxed);
        fill_allowed(cg.limit, room, others, held, step).then_some(claim)
    }

    /// Computes the budget afresh (see the module's docs); `delay` is how long a release counts
    /// as recent, `held` what our pools hold (written in the cgroup's ledger). Returns it.
    ///
    /// # Context
    /// The first scrub thread, every [`Budget::look_every`]; reads the cgroup's files, atomics
    /// on the shared page.
    pub(crate) fn update(&self, recent: &mut Recent, delay: Duration, machine: &Machine, held: u64) -> u64 {
        let released = self.released.swap(0, Relaxed);
        if released >= recent.big || recent.since.elapsed() > delay {
            *recent = Recent {
                big: released,
                since: Instant::now(),
            };
        }
        self.look(machine, held);
        let want = FLOOR
            .saturating_add(self.reserved.load(Relaxed))
            .saturating_add(recent.big.saturating_mul(2));
        let b = want.min(self.cap());
        self.pages.store(b, Relaxed);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_keeps_the_floor_and_twice_a_recent_release() {
        let b = Budget::new(2 << 30, None);
        let m = Machine::alone();
        let mut r = Recent::default();
        assert_eq!(b.update(&mut r, Duration::from_secs(1), &m, 0), FLOOR);
        b.note_release(pages(1 << 30));
        assert_eq!(b.pages(), pages(2 << 30), "raised at once, to pool_max at most");
        assert_eq!(b.update(&mut r, Duration::from_secs(1), &m, 0), pages(2 << 30));
        // Still recent: kept.
        assert_eq!(b.update(&mut r, Duration::from_secs(1), &m, 0), pages(2 << 30));
        // No longer recent.
        assert_eq!(b.update(&mut r, Duration::ZERO, &m, 0), FLOOR);
        b.reserve(pages(1 << 30));
        assert_eq!(b.update(&mut r, Duration::ZERO, &m, 0), FLOOR + pages(1 << 30));
        // A release comes on top of the floor and the reserve.
        b.note_release(pages(64 << 20));
        assert_eq!(b.pages(), FLOOR + pages(1 << 30) + pages(128 << 20));
    }

    const MIB: u64 = 1 << 20;

    /// Pages in `mib` MiB.
    fn p(mib: u64) -> u64 {
        pages(usize::try_from(mib * MIB).unwrap())
    }

    #[test]
    fn a_refill_step_keeps_the_headroom_and_the_cgroups_share() {
        // The cgroup of the forty children: 2650 MiB; its pools' share is an eighth (331 MiB),
        // the fill reserve a quarter, the purge reserve an eighth.
        let limit = 2650 * MIB;
        assert_eq!((fill_reserve(limit), purge_reserve(limit)), (limit / 4, limit / 8));
        let none = Ledger::default();
        let step = p(2);
        // Alone, plenty of room.
        assert!(fill_allowed(limit, 2000 * MIB, none, 0, step));
        // The step would leave less than the reserve.
        assert!(fill_allowed(limit, limit / 4 + 2 * MIB, none, 0, step));
        assert!(!fill_allowed(limit, limit / 4 + 2 * MIB - 1, none, 0, step));
        // Other processes' steps in flight are not charged yet: they count against the
        // headroom as if they were.
        let busy = Ledger {
            pooled: 0,
            claims: p(40),
        };
        assert!(!fill_allowed(limit, limit / 4 + 40 * MIB, busy, 0, step));
        assert!(fill_allowed(limit, limit / 4 + 42 * MIB, busy, 0, step));
        // The others' pools (charged: already in the headroom) and ours share one eighth.
        let full = Ledger {
            pooled: p(300),
            claims: 0,
        };
        assert!(fill_allowed(limit, 2000 * MIB, full, p(29), step));
        assert!(!fill_allowed(limit, 2000 * MIB, full, p(30), step));
        // Forty processes each asking as if alone: the first few fill the share, the rest
        // are refused, whatever the headroom.
        let mut held = Ledger::default();
        let allowed = (0..40)
            .filter(|_| {
                let ok = fill_allowed(limit, 2000 * MIB, held, 0, p(64));
                if ok {
                    held.pooled += p(64);
                }
                ok
            })
            .count();
        assert_eq!(allowed, 5, "5 x 64 MiB fit in 331 MiB");
        // An empty limit allows nothing.
        assert!(!fill_allowed(0, 0, none, 0, 1));
    }

    #[test]
    fn under_the_fill_reserve_a_pool_gives_back_what_the_headroom_lacks() {
        let limit = 1024 * MIB;
        // Above a quarter: all kept.
        assert_eq!(keep(limit, 256 * MIB, p(100)), p(100));
        // 56 MiB short of it: 56 MiB given back.
        assert_eq!(keep(limit, 200 * MIB, p(100)), p(44));
        assert_eq!(keep(limit, 200 * MIB, p(50)), 0);
        // Under an eighth: nothing kept.
        assert_eq!(keep(limit, 128 * MIB, p(200)), p(72));
        assert_eq!(keep(limit, 128 * MIB - 1, p(1000)), 0);
        assert_eq!(keep(limit, 0, p(1000)), 0);
    }

    #[test]
    fn the_same_rule_for_v2s_memory_high_and_a_tiny_cgroup() {
        // v2: the limit is the lower of memory.max and memory.high (sys::cgroup); a cgroup over
        // memory.high has no headroom.
        let limit = 256 * MIB;
        assert!(fill_allowed(limit, 200 * MIB, Ledger::default(), 0, p(2)));
        assert!(!fill_allowed(limit, 0, Ledger::default(), 0, p(2)));
        assert_eq!(keep(limit, 0, p(10)), 0);
        // 32 MiB of pools at most in all.
        let others = Ledger {
            pooled: p(30),
            claims: 0,
        };
        assert!(fill_allowed(limit, 200 * MIB, others, 0, p(2)));
        assert!(!fill_allowed(limit, 200 * MIB, others, 1, p(2)));
    }

    #[test]
    fn a_small_pool_max_bounds_everything() {
        let b = Budget::new(64 << 20, None);
        let m = Machine::alone();
        let mut r = Recent::default();
        assert_eq!(b.update(&mut r, Duration::from_secs(1), &m, 0), pages(64 << 20));
        b.note_release(pages(1 << 30));
        assert_eq!(b.pages(), pages(64 << 20));
    }
}
