//! The pool's memory budget: how many pages the pools may hold (ready and recycled together),
//! so that the engine's own resident memory stays small beside the program's and inside its
//! memory cgroup (DESIGN.md, "The pool's memory budget").
//!
//! - **Demand.** The pools keep [`FLOOR`] (128 MiB), what a caller asked for on top
//!   (`Engine::prefill`), and twice the largest block the program freed in the last
//!   `purge_delay` on top of that (a program freeing 1 GiB to map it again keeps it). A
//!   program churning 16 MiB blocks keeps 160 MiB, not `pool_max`.
//! - **The memory cgroup.** With a limit (the lowest `memory.max`/`memory.high` up the v2
//!   hierarchy, v1's hierarchical limit), the pools hold at most an eighth of it, and nothing
//!   once the cgroup is within a sixteenth of it: the kernel would otherwise reclaim (with no
//!   swap: kill) the program for pages the engine keeps.
//!
//! The first scrub thread computes it now and then ([`Budget::update`], `scrub::LOOK_EVERY`); every scrub
//! gives back what its pool holds above its share (dirty pages first, oldest first, then ready
//! ones), and a recycle is refused (the pages discarded, as natively) while the pools hold it
//! all.

use crate::page::pages;
use crate::sys::cgroup::MemoryCgroup;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// What the pools may always hold: 128 MiB.
pub(crate) const FLOOR: u64 = pages(128 << 20);

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
            .fetch_max(base.saturating_add(n.saturating_mul(2)).min(self.cap(false)), Relaxed);
    }

    /// A caller asked the pools to hold `n` pages (`Engine::prefill`).
    ///
    /// # Context
    /// A program thread, in `Engine::prefill` ([`Budget::filling`]); atomics only.
    pub(crate) fn reserve(&self, n: u64) {
        self.reserved.fetch_max(n, Relaxed);
        self.pages.fetch_max(n.min(self.cap(false)), Relaxed);
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

    /// The most the pools may hold: `pool_max`, an eighth of the cgroup's limit, nothing when
    /// `look` finds the cgroup within a sixteenth of its limit.
    fn cap(&self, look: bool) -> u64 {
        let Some(cg) = self.cgroup else { return self.max };
        let eighth = pages(usize::try_from(cg.limit / 8).unwrap_or(usize::MAX));
        if look && cg.usage().is_some_and(|u| u.saturating_add(cg.limit / 16) >= cg.limit) {
            return 0;
        }
        self.max.min(eighth)
    }

    /// Computes the budget afresh (see the module's docs); `delay` is how long a release counts
    /// as recent. Returns it.
    ///
    /// # Context
    /// The first scrub thread, every `scrub::LOOK_EVERY`; reads the cgroup's usage.
    pub(crate) fn update(&self, recent: &mut Recent, delay: Duration) -> u64 {
        let released = self.released.swap(0, Relaxed);
        if released >= recent.big || recent.since.elapsed() > delay {
            *recent = Recent {
                big: released,
                since: Instant::now(),
            };
        }
        let want = FLOOR
            .saturating_add(self.reserved.load(Relaxed))
            .saturating_add(recent.big.saturating_mul(2));
        let b = want.min(self.cap(true));
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
        let mut r = Recent::default();
        assert_eq!(b.update(&mut r, Duration::from_secs(1)), FLOOR);
        b.note_release(pages(1 << 30));
        assert_eq!(b.pages(), pages(2 << 30), "raised at once, to pool_max at most");
        assert_eq!(b.update(&mut r, Duration::from_secs(1)), pages(2 << 30));
        // Still recent: kept.
        assert_eq!(b.update(&mut r, Duration::from_secs(1)), pages(2 << 30));
        // No longer recent.
        assert_eq!(b.update(&mut r, Duration::ZERO), FLOOR);
        b.reserve(pages(1 << 30));
        assert_eq!(b.update(&mut r, Duration::ZERO), FLOOR + pages(1 << 30));
        // A release comes on top of the floor and the reserve.
        b.note_release(pages(64 << 20));
        assert_eq!(b.pages(), FLOOR + pages(1 << 30) + pages(128 << 20));
    }

    #[test]
    fn a_small_pool_max_bounds_everything() {
        let b = Budget::new(64 << 20, None);
        let mut r = Recent::default();
        assert_eq!(b.update(&mut r, Duration::from_secs(1)), pages(64 << 20));
        b.note_release(pages(1 << 30));
        assert_eq!(b.pages(), pages(64 << 20));
    }
}
