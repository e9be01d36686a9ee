//! Anticipatory prefaulting (seed 000): predict the next fault, and prepare more pages ahead of it
//! each time the prediction comes true. A pure state machine: page numbers in, windows out.
//!
//! ## The seed, and what changed
//! Lameter's patch kept, per task, the address the next fault would hit if the access were
//! sequential. A fault there doubled the pages prepared (order 0, 1, 2, 3 -> 1, 2, 4, 8 pages,
//! max order 3); any other fault reset the order to 0. It stopped at the VMA end and at a page
//! table boundary.
//!
//! Here each fault is a round trip through a handler thread (~15 µs, ten native faults), so
//! the window starts larger and grows faster than the seed's, and goes further:
//! - **max order 11** (2048 pages, 8 MiB): past it the gain is under 10%, and the window is also
//!   what a writer that stops may leave unused (`ZEROFAULT_MAX_ORDER` raises it).
//! - **start order 4, step 2** (16 pages, then ×4 per hit: 16, 64, 256, 1024, 2048): the ramp is
//!   most of the cost on small regions.
//! - **A miss installs one page** (order 0), as in the seed: a random fault costs no more memory
//!   than a native one. A miss still opens a stream, so if the next fault follows it, the
//!   window jumps straight to the start order.
//! - **No stop at page-table boundaries**: UFFDIO_MOVE takes the PTE locks itself, and
//!   clipping at 2 MiB quadrupled the round trips.
//!
//! Past max order a confirmed stream's windows go on with a window ahead
//! (`fault/ahead.rs`, `installed_until` here). The measurements behind each default are in
//! docs/DESIGN.md.
//!
//! ## Streams
//! The seed had one prediction per task. A thread that fills two arrays in the same region
//! (a column store, `memcpy` between two parts of one arena) would miss on every fault, so each
//! thread keeps [`STREAMS`] streams per region, least recently used replaced. A fault *hits* a
//! stream when it lands in the window that stream would install next: `[next, next + 2^order)`,
//! so strided writers whose stride is under the window count as sequential.
//!

use crate::page::PMD_PAGES;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard};

/// Streams tracked per thread and region.
pub(crate) const STREAMS: usize = 4;

/// The window sizing knobs (from [`crate::options::Options`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tuning {
    pub start_order: u8,
    pub order_step: u8,
    pub max_order: u8,
}

/// How a fault related to the predictions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The thread's first fault in this region.
    Start,
    /// The fault was where a stream expected it.
    Hit,
    /// Somewhere else.
    Miss,
}

/// What to install: pages `[first, first + pages)`; `order` is the window asked for before
/// clipping to the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub first: u64,
    pub pages: u64,
    pub order: u8,
    pub outcome: Outcome,
    /// Pages the stream installed before this window (0 for a new stream).
    pub streak: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Stream {
    live: bool,
    next: u64,
    order: u8,
    last_use: u64,
    /// Pages installed since the stream began.
    streak: u64,
}

/// The streams of one thread in one region.
#[derive(Clone, Debug, Default)]
pub(crate) struct Predictor {
    streams: [Stream; STREAMS],
    clock: u64,
}

impl Predictor {
    #[cfg(test)]
    pub(crate) fn new() -> Predictor {
        Predictor::default()
    }

    /// A fault on page `page` of a region whose pages end before `end`: the window to install.
    #[cfg(test)]
    pub(crate) fn on_fault(&mut self, page: u64, end: u64, t: &Tuning) -> Window {
        self.on_fault_aligned(page, end, None, t)
    }

    /// As [`Predictor::on_fault`]; with `phase` (the region's first page modulo
    /// [`PMD_PAGES`] in the address space), a window of a PMD or more is stretched (by at most
    /// 511 pages) to end one page short of a PMD boundary. The next sequential fault then lands
    /// on the last page of a PMD: the kernel gives the faulting PMD a page table before it asks
    /// us, so that PMD must take 4 KiB pages, and this way it has one left to take, while every
    /// PMD of the window after it is whole and free of tables, ready for a huge page. Without it
    /// a stream that starts off a boundary covers one PMD in four partly, forever.
    pub(crate) fn on_fault_aligned(&mut self, page: u64, end: u64, phase: Option<u64>, t: &Tuning) -> Window {
        debug_assert!(page < end);
        self.clock += 1;
        let hit = self
            .streams
            .iter()
            .position(|s| s.live && page >= s.next && page - s.next < 1u64 << s.order);
        let (slot, order, outcome) = match hit {
            Some(i) => {
                let grown = (self.streams[i].order + t.order_step).max(t.start_order);
                (i, grown.min(t.max_order), Outcome::Hit)
            }
            None => {
                let first = !self.streams.iter().any(|s| s.live);
                // The least recently used (or an unused) slot opens the new stream.
                let i = (0..STREAMS)
                    .min_by_key(|&i| (self.streams[i].live, self.streams[i].last_use))
                    .unwrap_or(0);
                if first {
                    (i, t.start_order.min(t.max_order), Outcome::Start)
                } else {
                    (i, 0, Outcome::Miss)
                }
            }
        };
        let mut pages = 1u64 << order;
        if let Some(phase) = phase.filter(|_| pages >= PMD_PAGES) {
            let to = (phase + page + pages + 1).next_multiple_of(PMD_PAGES) - 1 - phase;
            pages = to - page;
        }
        let pages = pages.min(end - page);
        let streak = if outcome == Outcome::Hit {
            self.streams[slot].streak
        } else {
            0
        };
        self.streams[slot] = Stream {
            live: true,
            next: page + pages,
            order,
            last_use: self.clock,
            streak: streak + pages,
        };
        Window {
            first: page,
            pages,
            order,
            outcome,
            streak,
        }
    }
}

impl Predictor {
    /// Faults predicted so far: unchanged between two reads means no fault of this thread was
    /// predicted in between (by another handler).
    pub(crate) fn clock(&self) -> u64 {
        self.clock
    }

    /// The window just returned was installed up to `end` (widened to whole huge pages): the
    /// stream expects its next fault there.
    pub(crate) fn installed_to(&mut self, end: u64) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.live && s.last_use == self.clock) {
            s.streak += end.saturating_sub(s.next);
            s.next = s.next.max(end);
        }
    }

    /// The window just returned, and its window ahead, were installed up to exactly `end`
    /// (the head was cut at the fault's PMD, the window ahead may stop early): the stream
    /// expects its next fault there.
    pub(crate) fn installed_until(&mut self, end: u64) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.live && s.last_use == self.clock) {
            s.streak = (s.streak + end).saturating_sub(s.next);
            s.next = end;
        }
    }
}

/// Shards of [`Predictors`] (a power of two).
const SHARDS: usize = 16;
/// Predictor entries kept per shard before the shard is reset (threads and ranges come and go).
const MAX_PER_SHARD: usize = 256;

/// A key's hasher: the key is two integers already well spread (a range id, a thread id), so a
/// multiply mixes them enough; and it reads no random seed (std's `RandomState` reads a
/// thread-local one, which the LD_PRELOAD shim avoids before `main`).
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(29) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
}

type Shard = HashMap<(u64, u32), Predictor, BuildHasherDefault<KeyHasher>>;

/// Pads a shard's lock to its own cache line pair, so that handlers locking different shards
/// do not share a line.
#[repr(align(128))]
#[derive(Default)]
struct Padded(Mutex<Shard>);

/// The predictors of every (range, thread), shared by the fault handler threads: the kernel
/// gives a fault to whichever handler reads it first, so one stream's faults land on different
/// handlers, and a predictor per handler would see every other fault as a miss. Sharded by the
/// key, one small lock per shard and no global one; a thread has one fault outstanding at a
/// time, so two handlers meet on one entry only when they serve two threads whose keys share a
/// shard, for the microsecond a window takes to predict.
#[derive(Default)]
pub(crate) struct Predictors {
    shards: [Padded; SHARDS],
}

impl std::fmt::Debug for Predictors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Predictors")
    }
}

/// One locked shard of [`Predictors`], holding the entry of one key.
pub(crate) struct Entry<'a> {
    shard: MutexGuard<'a, Shard>,
    key: (u64, u32),
}

impl Entry<'_> {
    /// The predictor of the key (new if it had none).
    pub(crate) fn get(&mut self) -> &mut Predictor {
        self.shard.entry(self.key).or_default()
    }
}

impl Predictors {
    /// Locks the shard of thread `tid` in range `id`; held while a window is predicted.
    pub(crate) fn lock(&self, id: u64, tid: u32) -> Entry<'_> {
        let mut h = KeyHasher::default();
        h.write_u64(id);
        h.write_u32(tid);
        let i = (h.finish() >> 32) as usize % SHARDS;
        let mut shard = self.shards[i].0.lock().unwrap_or_else(|e| e.into_inner());
        if shard.len() >= MAX_PER_SHARD && !shard.contains_key(&(id, tid)) {
            shard.clear();
        }
        Entry { shard, key: (id, tid) }
    }

    /// Entries held, over every shard.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.0.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Tuning = crate::testing::TUNING;

    /// The shared table keeps a stream's state whichever handler locks it next, spreads keys
    /// over its shards, and bounds each shard.
    #[test]
    fn the_shared_table_keeps_streams_across_locks_and_bounds_its_shards() {
        let t = Predictors::default();
        assert_eq!(t.lock(1, 7).get().on_fault(0, 1 << 20, &T).outcome, Outcome::Start);
        let w = t.lock(1, 7).get().on_fault(16, 1 << 20, &T);
        assert_eq!(w.outcome, Outcome::Hit, "the second lock sees the first's stream");
        assert_eq!(t.lock(1, 8).get().on_fault(16, 1 << 20, &T).outcome, Outcome::Start);
        assert_eq!(t.len(), 2);
        // Thread ids in a row spread over every shard.
        let used: std::collections::HashSet<usize> = (0..256u32)
            .map(|tid| {
                let mut h = KeyHasher::default();
                h.write_u64(3);
                h.write_u32(tid);
                (h.finish() >> 32) as usize % SHARDS
            })
            .collect();
        assert_eq!(used.len(), SHARDS);
        for tid in 0..u32::try_from(SHARDS * MAX_PER_SHARD * 4).unwrap() {
            t.lock(2, tid).get();
        }
        assert!(t.len() <= SHARDS * MAX_PER_SHARD, "{}", t.len());
    }

    #[test]
    fn sequential_faults_grow_the_window_to_the_max_order() {
        let mut p = Predictor::new();
        let mut page = 0;
        let mut orders = vec![];
        for _ in 0..8 {
            let w = p.on_fault(page, 1 << 30, &T);
            assert_eq!(w.first, page);
            orders.push((w.order, w.outcome));
            page += w.pages;
        }
        use Outcome::*;
        assert_eq!(
            orders,
            vec![
                (4, Start),
                (6, Hit),
                (8, Hit),
                (10, Hit),
                (11, Hit),
                (11, Hit),
                (11, Hit),
                (11, Hit)
            ]
        );
    }

    #[test]
    fn the_seed_model_is_order_plus_one_from_zero() {
        // Seed 000: 1, 2, 4, 8 pages, max order 3.
        let seed = Tuning {
            start_order: 0,
            order_step: 1,
            max_order: 3,
        };
        let mut p = Predictor::new();
        let mut page = 100;
        let mut sizes = vec![];
        for _ in 0..6 {
            let w = p.on_fault(page, 1 << 20, &seed);
            sizes.push(w.pages);
            page += w.pages;
        }
        assert_eq!(sizes, vec![1, 2, 4, 8, 8, 8]);
    }

    #[test]
    fn a_miss_resets_to_one_page_and_a_following_hit_jumps_to_the_start_order() {
        let mut p = Predictor::new();
        let w = p.on_fault(0, 1 << 20, &T);
        let w = p.on_fault(w.pages, 1 << 20, &T);
        assert_eq!(w.outcome, Outcome::Hit);
        let m = p.on_fault(5000, 1 << 20, &T);
        assert_eq!((m.outcome, m.pages), (Outcome::Miss, 1));
        let h = p.on_fault(5001, 1 << 20, &T);
        assert_eq!((h.outcome, h.order), (Outcome::Hit, 4));
    }

    #[test]
    fn windows_are_clipped_at_the_region_end() {
        let mut p = Predictor::new();
        let w = p.on_fault(10, 12, &T);
        assert_eq!((w.first, w.pages, w.order), (10, 2, 4));
    }

    #[test]
    fn strided_access_within_the_window_counts_as_sequential() {
        let mut p = Predictor::new();
        let w = p.on_fault(0, 1 << 20, &T); // installs [0, 16)
        let w2 = p.on_fault(w.pages + 3, 1 << 20, &T); // a stride of 4 lands at 19
        assert_eq!(w2.outcome, Outcome::Hit);
        let w3 = p.on_fault(w2.first + w2.pages + (1 << w2.order), 1 << 20, &T); // past the next window
        assert_eq!(w3.outcome, Outcome::Miss);
    }

    #[test]
    fn two_interleaved_streams_both_hit() {
        let mut p = Predictor::new();
        let (mut a, mut b) = (0u64, 1 << 19);
        let mut outcomes = vec![];
        for _ in 0..5 {
            let wa = p.on_fault(a, 1 << 20, &T);
            let wb = p.on_fault(b, 1 << 20, &T);
            outcomes.push((wa.outcome, wb.outcome));
            a += wa.pages;
            b += wb.pages;
        }
        use Outcome::*;
        assert_eq!(outcomes[0], (Start, Miss));
        assert!(outcomes[2..].iter().all(|o| *o == (Hit, Hit)), "{outcomes:?}");
    }

    #[test]
    fn more_streams_than_slots_evicts_the_least_recently_used() {
        let mut p = Predictor::new();
        let bases: Vec<u64> = (0..=STREAMS as u64).map(|i| i * 100_000).collect();
        let mut next: Vec<u64> = bases.iter().map(|b| b + p.on_fault(*b, 1 << 30, &T).pages).collect();
        // Stream 0 was evicted by the last one; the others still hit.
        assert_eq!(p.on_fault(next[0], 1 << 30, &T).outcome, Outcome::Miss);
        next[0] = 0;
        assert_eq!(p.on_fault(next[STREAMS], 1 << 30, &T).outcome, Outcome::Hit);
    }

    #[test]
    fn windows_of_a_pmd_or_more_end_on_a_pmd_boundary_when_asked() {
        let mut p = Predictor::new();
        // A region whose page 0 is page 1 of a PMD (the shim's blocks start after a header page).
        let phase = Some(1);
        let mut page = 0;
        let mut got = vec![];
        for _ in 0..7 {
            let w = p.on_fault_aligned(page, 1 << 20, phase, &T);
            assert_eq!(w.outcome, if page == 0 { Outcome::Start } else { Outcome::Hit });
            got.push(w.pages);
            page = w.first + w.pages;
        }
        // 16, 64, 256 as usual; 1024 from page 336 stretches to end one page short of the
        // boundary at region page 1535 (1536 in the address space); after that every window
        // is 2048 and ends one page short of a boundary too.
        assert_eq!(got, [16, 64, 256, 1198, 2048, 2048, 2048]);
        assert_eq!((1 + page + 1) % PMD_PAGES, 0);
        // Clipped at the region end all the same.
        let mut q = Predictor::new();
        let t9 = Tuning { start_order: 9, ..T };
        let w = q.on_fault_aligned(0, 1200, Some(0), &t9);
        assert_eq!(w.pages, 1023, "512 stretched to one short of the second boundary");
        let w = q.on_fault_aligned(1023, 1200, Some(0), &t9);
        assert_eq!(w.pages, 177);
    }
}
