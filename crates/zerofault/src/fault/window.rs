//! Anticipatory prefaulting (seed 000): predict the next fault, and prepare more pages ahead of it
//! each time the prediction comes true. A pure state machine: page numbers in, windows out.
//!
//! ## The seed, and what changed
//! Lameter's patch kept, per task, the address the next fault would hit if the access were
//! sequential. A fault there doubled the pages prepared (order 0, 1, 2, 3 -> 1, 2, 4, 8 pages,
//! max order 3); any other fault reset the order to 0. It stopped at the VMA end and at a page
//! table boundary.
//!
//! Here each fault is a round trip through a handler thread (about ten native faults), so
//! the window starts larger and grows faster than the seed's, and goes further:
//! - **max order 11** (2048 pages, 8 MiB): past it the gain is small (docs/DESIGN.md, "The
//!   prefault window"), and the window is also
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
//! so a writer whose stride is under the window faults exactly where a sequential one would.
//!
//! ## Sparse streams (sparse access never fills memory the program did not touch)
//! Faults alone cannot tell a writer of every page from one of every other page: both fault
//! at the end of each window. So a stream's first window leaves out a **probe**, the page
//! after the fault's: a dense writer touches it (one more round trip, once per stream), and
//! is proven dense. A writer that reaches the window's end with the probe still missing may
//! skip pages, or may have started its dense part a few pages on (a header, then a buffer):
//! it gets the same window again with a probe of its own, and passing that one too makes the
//! fault [`Outcome::Sparse`]. A stream opened by a miss needs no probe: its window is the
//! fault's page alone, and a fault on the next page is the proof. Misses in a row at one
//! stride are sparse too, from the [`SPARSE_MISSES`]th (a stride past the window), and so is a
//! stream going down, a stack, from its [`SPARSE_MISSES`]th new low (windows go up: each of
//! its faults misses, and a round trip a page is ten native faults). The handler gives a sparse stream's
//! way ahead back to the kernel (`fault/handback.rs`), which faults only what the program touches,
//! at native speed.
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
    /// On the page a stream's first window left out: the stream is dense.
    Probe,
    /// A sparse stream: past two probes untouched, the [`SPARSE_MISSES`]th miss in a row at
    /// one stride, or a descent as long. The window is the fault's page; [`Window::stride`]
    /// says which way the stream goes.
    Sparse,
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
    /// A page of the window to leave out: the probe of a new stream (see the module doc).
    pub probe: Option<u64>,
    /// For [`Outcome::Sparse`], the stream's stride in pages (negative downwards; 2 for a
    /// stream past its probes, whose stride is only known to be 2 or more).
    pub stride: i64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Stream {
    live: bool,
    next: u64,
    order: u8,
    last_use: u64,
    /// Pages installed since the stream began.
    streak: u64,
    /// The page its first window left out, until a fault there proves the stream dense.
    probe: Option<u64>,
    /// It went past one probe untouched (and got another).
    passed: bool,
}

/// Whether a hit went past its stream's probe untouched.
enum Passed {
    No,
    Once,
    Twice,
}

/// The streams of one thread in one region.
#[derive(Clone, Debug, Default)]
pub(crate) struct Predictor {
    streams: [Stream; STREAMS],
    clock: u64,
    /// The thread's last fault here, the distance of the last miss from the fault before, and
    /// how many misses in a row kept that distance.
    last: Option<u64>,
    stride: i64,
    run: u32,
    /// The lowest fault of the thread's descent here, and how many faults in a row went
    /// below the one before it (each at most [`DESCENT_PAGES`] lower), faults above it aside.
    low: Option<u64>,
    descents: u32,
}

/// How far below the last new low a fault may land and still go on a descent: a stack frame
/// of 256 KiB.
const DESCENT_PAGES: u64 = 64;

/// Misses in a row at one stride that make a sparse stream: more than a thread's streams, so
/// that [`STREAMS`] equal columns written round-robin are not taken for one.
const SPARSE_MISSES: u32 = 5;
const _: () = assert!(SPARSE_MISSES as usize == STREAMS + 1);

/// A window this small has no probe: a fault on its next page costs as much as the window.
const PROBE_MIN_PAGES: u64 = 4;

impl Predictor {
    /// # Context
    /// A handler, under the predictor shard's lock ([`Predictors::lock`]).
    #[cfg(test)]
    pub(crate) fn new() -> Predictor {
        Predictor::default()
    }

    /// A fault on page `page` of a region whose pages end before `end`: the window to install.
    ///
    /// # Context
    /// A handler, under the predictor shard's lock ([`Predictors::lock`]).
    #[cfg(test)]
    pub(crate) fn on_fault(&mut self, page: u64, end: u64, t: &Tuning) -> Window {
        self.on_fault_aligned(page, end, None, t)
    }

    /// As [`Predictor::on_fault`], probing new streams; `installed` says whether a page was
    /// installed since (by another thread: a probe so filled is no evidence either way).
    ///
    /// # Context
    /// A handler, under the predictor shard's lock ([`Predictors::lock`]).
    #[cfg(test)]
    pub(crate) fn on_fault_probing(
        &mut self,
        page: u64,
        end: u64,
        installed: &dyn Fn(u64) -> bool,
        t: &Tuning,
    ) -> Window {
        self.on_fault_at(
            Fault {
                page,
                end,
                phase: None,
                probing: true,
                installed,
            },
            t,
        )
    }

    /// As [`Predictor::on_fault`]; with `phase` (the region's first page modulo
    /// [`PMD_PAGES`] in the address space), a window of a PMD or more is stretched (by at most
    /// 511 pages) to end one page short of a PMD boundary. The next sequential fault then lands
    /// on the last page of a PMD: the kernel gives the faulting PMD a page table before it asks
    /// us, so that PMD must take 4 KiB pages, and this way it has one left to take, while every
    /// PMD of the window after it is whole and free of tables, ready for a huge page. Without it
    /// a stream that starts off a boundary covers one PMD in four partly, forever.
    ///
    /// # Context
    /// A handler, under the predictor shard's lock ([`Predictors::lock`]).
    #[cfg(test)]
    pub(crate) fn on_fault_aligned(&mut self, page: u64, end: u64, phase: Option<u64>, t: &Tuning) -> Window {
        let installed = |_| false;
        self.on_fault_at(
            Fault {
                page,
                end,
                phase,
                probing: false,
                installed: &installed,
            },
            t,
        )
    }

    /// The window for fault `f` (see [`Fault`]).
    ///
    /// # Context
    /// A handler, under the predictor shard's lock ([`Predictors::lock`]).
    pub(crate) fn on_fault_at(&mut self, f: Fault<'_>, t: &Tuning) -> Window {
        let page = f.page;
        debug_assert!(page < f.end);
        self.clock += 1;
        let last = self.last.replace(page);
        self.descend(page);
        if let Some(w) = self.probed(page) {
            return w;
        }
        let hit = self
            .streams
            .iter()
            .position(|s| s.live && page >= s.next && page - s.next < 1u64 << s.order);
        let mut reprobe = false;
        if let Some(i) = hit {
            match self.passed_probe(i, f.installed) {
                Passed::No => {}
                Passed::Once => reprobe = true,
                // Known only to skip pages: the least of strides, the least of reaches.
                Passed::Twice => return self.sparse(i, page, 2),
            }
        }
        if hit.is_some() || !self.streams.iter().any(|s| s.live) {
            // Only misses in a row keep a stride: a stream of short runs is no sparse one.
            (self.stride, self.run) = (0, 0);
        }
        let (slot, order, outcome) = match hit {
            Some(i) => {
                // Past one probe untouched: the same window again, with a probe of its own.
                let step = if reprobe { 0 } else { t.order_step };
                let grown = (self.streams[i].order + step).max(t.start_order);
                (i, grown.min(t.max_order), Outcome::Hit)
            }
            None => {
                let first = !self.streams.iter().any(|s| s.live);
                let i = self.lru_slot();
                if first {
                    (i, t.start_order.min(t.max_order), Outcome::Start)
                } else {
                    if let Some(w) = f.probing.then(|| self.strided(i, page, last)).flatten() {
                        return w;
                    }
                    if f.probing && self.descents >= SPARSE_MISSES {
                        return self.sparse(i, page, -1);
                    }
                    (i, 0, Outcome::Miss)
                }
            }
        };
        let pages = window_pages(page, order, &f);
        let (streak, passed) = match outcome {
            Outcome::Hit => (self.streams[slot].streak, self.streams[slot].passed),
            _ => (0, false),
        };
        let probing = outcome == Outcome::Start || reprobe;
        let probe = (probing && f.probing && pages >= PROBE_MIN_PAGES).then_some(page + 1);
        self.streams[slot] = Stream {
            live: true,
            next: page + pages,
            order,
            last_use: self.clock,
            streak: streak + pages,
            probe,
            passed,
        };
        Window {
            first: page,
            pages,
            order,
            outcome,
            streak,
            probe,
            stride: 0,
        }
    }

    /// The slot that opens a new stream: the least recently used, or an unused one.
    ///
    /// # Context
    /// A handler thread, from [`Predictor::on_fault_at`], with the stream's predictor lock held
    /// (`Predictors::lock`); takes no lock, does not sleep.
    #[inline]
    fn lru_slot(&self) -> usize {
        (0..STREAMS)
            .min_by_key(|&i| (self.streams[i].live, self.streams[i].last_use))
            .unwrap_or(0)
    }

    /// A fault on a stream's probe: the stream is dense from now on.
    fn probed(&mut self, page: u64) -> Option<Window> {
        let s = self.streams.iter_mut().find(|s| s.live && s.probe == Some(page))?;
        (self.stride, self.run) = (0, 0);
        s.probe = None;
        s.last_use = self.clock;
        Some(Window {
            first: page,
            pages: 1,
            order: 0,
            outcome: Outcome::Probe,
            streak: s.streak,
            probe: None,
            stride: 0,
        })
    }

    /// A hit on stream `i`: whether it went past its probe untouched, the first time or the
    /// second. A probe installed meanwhile (another thread's fault there) or not yet passed
    /// (a window cut short before it) is no evidence.
    fn passed_probe(&mut self, i: usize, installed: &dyn Fn(u64) -> bool) -> Passed {
        let s = &mut self.streams[i];
        let Some(probe) = s.probe.take() else {
            return Passed::No;
        };
        if installed(probe) || s.next <= probe {
            return Passed::No;
        }
        if std::mem::replace(&mut s.passed, true) {
            Passed::Twice
        } else {
            Passed::Once
        }
    }

    /// A miss at `page` that opens stream `i`: sparse when it is the [`SPARSE_MISSES`]th miss
    /// in a row at one distance from the fault before: 2 pages or more up, or any distance
    /// down (a stream going down, a stack, say, whose windows, all going up, would each miss).
    /// Runs of pages at one stride hit within each run, and are served; so are up to
    /// [`STREAMS`] equal columns written round-robin (each miss once, then hit).
    fn strided(&mut self, i: usize, page: u64, last: Option<u64>) -> Option<Window> {
        let d = last.map_or(0, |l| i64::try_from(page).unwrap_or(0) - i64::try_from(l).unwrap_or(0));
        if d == self.stride && !(0..2).contains(&d) {
            self.run += 1;
        } else {
            (self.stride, self.run) = (d, 1);
        }
        (self.run >= SPARSE_MISSES).then(|| self.sparse(i, page, d))
    }

    /// Follows the thread's descent: a fault below the lowest so far, and at most
    /// [`DESCENT_PAGES`] below it, goes on with it; one within as many pages above leaves it as
    /// it is (a stack's frames write their top pages after their bottom ones: a hit now and
    /// then); any other fault starts another.
    fn descend(&mut self, page: u64) {
        match self.low {
            Some(low) if page < low && low - page <= DESCENT_PAGES => self.descents += 1,
            // Near the low, above it: a frame's top. Farther up, the thread is at something
            // else, and the descent is over.
            Some(low) if page >= low && page - low <= DESCENT_PAGES => return,
            _ => self.descents = 0,
        }
        self.low = Some(page);
    }

    /// Stream `i` is sparse, at `stride`: it goes on one page at a time (the handler gives its
    /// way ahead back to the kernel).
    fn sparse(&mut self, i: usize, page: u64, stride: i64) -> Window {
        (self.stride, self.run, self.descents, self.low) = (0, 0, 0, None);
        self.streams[i] = Stream {
            live: true,
            next: page + 1,
            order: 0,
            last_use: self.clock,
            streak: 0,
            probe: None,
            passed: false,
        };
        Window {
            first: page,
            pages: 1,
            order: 0,
            outcome: Outcome::Sparse,
            streak: 0,
            probe: None,
            stride,
        }
    }
}

/// The pages of a window of `2^order` asked for at `page` for fault `f`: with `f.phase`, one
/// of a PMD or more stretched to end a page short of a PMD boundary (see
/// `Predictor::on_fault_aligned`); clipped to the region's end.
///
/// # Context
/// A handler thread, from [`Predictor::on_fault_at`], with the stream's predictor lock held;
/// takes no lock, does not sleep.
#[inline]
fn window_pages(page: u64, order: u8, f: &Fault<'_>) -> u64 {
    let mut pages = 1u64 << order;
    if let Some(phase) = f.phase.filter(|_| pages >= PMD_PAGES) {
        let to = (phase + page + pages + 1).next_multiple_of(PMD_PAGES) - 1 - phase;
        pages = to - page;
    }
    pages.min(f.end - page)
}

/// One fault, for [`Predictor::on_fault_at`].
pub(crate) struct Fault<'a> {
    /// The fault's page, of a range whose pages end before `end`.
    pub page: u64,
    pub end: u64,
    /// The range's first page modulo [`PMD_PAGES`] in the address space, where windows of a
    /// PMD or more end one page short of a PMD boundary (see `Predictor::on_fault_aligned`).
    pub phase: Option<u64>,
    /// Whether a new stream's window may leave out a probe (not where the fault takes whole
    /// huge pages).
    pub probing: bool,
    /// Whether a page is installed now.
    pub installed: &'a dyn Fn(u64) -> bool,
}

impl Predictor {
    /// Faults predicted so far: unchanged between two reads means no fault of this thread was
    /// predicted in between (by another handler).
    ///
    /// # Context
    /// A handler, under the predictor shard's lock ([`Predictors::lock`]).
    pub(crate) fn clock(&self) -> u64 {
        self.clock
    }

    /// The window just returned was installed up to `end` (widened to whole huge pages): the
    /// stream expects its next fault there.
    ///
    /// # Context
    /// A handler, under the predictor shard's lock ([`Predictors::lock`]).
    pub(crate) fn installed_to(&mut self, end: u64) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.live && s.last_use == self.clock) {
            s.streak += end.saturating_sub(s.next);
            s.next = s.next.max(end);
        }
    }

    /// The window just returned, and its window ahead, were installed up to exactly `end`
    /// (the head was cut at the fault's PMD, the window ahead may stop early): the stream
    /// expects its next fault there.
    ///
    /// # Context
    /// A handler, under the predictor shard's lock ([`Predictors::lock`]).
    pub(crate) fn installed_until(&mut self, end: u64) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.live && s.last_use == self.clock) {
            s.streak = (s.streak + end).saturating_sub(s.next);
            s.next = end;
            // Cut before its probe (the install gave up: events kept coming): the thread
            // faults there next, which proves nothing, and nor would the hits after it. The
            // stream starts again.
            if s.probe.is_some_and(|p| end <= p) {
                *s = Stream::default();
            }
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
    ///
    /// # Context
    /// A handler, under the predictor shard's lock ([`Predictors::lock`]).
    pub(crate) fn get(&mut self) -> &mut Predictor {
        self.shard.entry(self.key).or_default()
    }
}

impl Predictors {
    /// Locks the shard of thread `tid` in range `id`; held while a window is predicted.
    ///
    /// # Context
    /// A handler; takes one shard's lock (a handler per shard at a time; never held across an
    /// ioctl).
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

    fn probing(p: &mut Predictor, page: u64) -> Window {
        p.on_fault_probing(page, 1 << 20, &|_| false, &T)
    }

    #[test]
    fn a_dense_writer_faults_once_on_its_probe_and_its_windows_grow() {
        let mut p = Predictor::new();
        let w = probing(&mut p, 0);
        assert_eq!((w.outcome, w.pages, w.probe), (Outcome::Start, 16, Some(1)));
        let w = probing(&mut p, 1);
        assert_eq!((w.outcome, w.first, w.pages), (Outcome::Probe, 1, 1));
        let mut page = 16;
        for order in [6, 8, 10, 11] {
            let w = probing(&mut p, page);
            assert_eq!((w.outcome, w.order, w.probe), (Outcome::Hit, order, None));
            page += w.pages;
        }
    }

    #[test]
    fn a_writer_past_two_probes_untouched_is_sparse_at_every_stride_under_the_window() {
        for stride in 2..=16u64 {
            let mut p = Predictor::new();
            assert_eq!(probing(&mut p, 0).probe, Some(1));
            // Strides under the window land in it (no fault) and fault at its end, or just past:
            // the same window again, with a probe of its own.
            let next = 16u64.next_multiple_of(stride);
            let w = probing(&mut p, next);
            assert_eq!(
                (w.outcome, w.order, w.probe),
                (Outcome::Hit, 4, Some(next + 1)),
                "stride {stride}"
            );
            let next = (next + 16).next_multiple_of(stride);
            let w = probing(&mut p, next);
            assert_eq!(
                (w.outcome, w.pages, w.stride),
                (Outcome::Sparse, 1, 2),
                "stride {stride}"
            );
        }
        // A header, then a buffer written from a few pages on: the second probe is touched.
        let mut p = Predictor::new();
        probing(&mut p, 0);
        assert_eq!(probing(&mut p, 16).probe, Some(17));
        assert_eq!(probing(&mut p, 17).outcome, Outcome::Probe);
        assert_eq!(probing(&mut p, 32).order, 6, "a stream: the window grows");
        // The probe installed meanwhile (another thread wrote there): no evidence, a hit.
        let mut p = Predictor::new();
        probing(&mut p, 0);
        let w = p.on_fault_probing(16, 1 << 20, &|pg| pg == 1, &T);
        assert_eq!((w.outcome, w.order), (Outcome::Hit, 6));
    }

    #[test]
    fn a_window_cut_before_its_probe_proves_nothing() {
        // The first window's install stopped at the fault's page (events kept coming): the
        // thread faults there again, which would be a hit that never had the chance to touch
        // the probe (and its next, a second hit: evidence of a dense stream it is not). The
        // stream starts again, probe and all.
        let mut p = Predictor::new();
        assert_eq!(probing(&mut p, 100).probe, Some(101));
        p.installed_until(100);
        let w = probing(&mut p, 100);
        assert_eq!((w.outcome, w.order, w.probe), (Outcome::Start, 4, Some(101)));
        // Cut between the fault and the probe's page: the same, from the probe's page.
        let mut p = Predictor::new();
        probing(&mut p, 100);
        p.installed_until(101);
        let w = probing(&mut p, 101);
        assert_eq!((w.outcome, w.probe), (Outcome::Start, Some(102)));
    }

    #[test]
    fn misses_in_a_row_at_one_stride_are_sparse_up_or_down() {
        for (start, stride) in [(0u64, 64i64), (0, 4096), (50_000, -1), (50_000, -3), (50_000, -700)] {
            let mut p = Predictor::new();
            let at = |k: i64| start.checked_add_signed(k * stride).unwrap();
            assert_eq!(probing(&mut p, at(0)).outcome, Outcome::Start);
            for k in 1..i64::from(SPARSE_MISSES) {
                assert_eq!(probing(&mut p, at(k)).outcome, Outcome::Miss, "{stride} {k}");
            }
            let w = probing(&mut p, at(SPARSE_MISSES.into()));
            assert_eq!((w.outcome, w.stride), (Outcome::Sparse, stride));
        }
        // Two distances that differ, or a stride of one page up (a hit), are not.
        let mut p = Predictor::new();
        for (page, outcome) in [
            (0, Outcome::Start),
            (100, Outcome::Miss),
            (300, Outcome::Miss),
            (301, Outcome::Hit),
        ] {
            assert_eq!(probing(&mut p, page).outcome, outcome, "{page}");
        }
        // Without probing, no sparse streams at all.
        let mut p = Predictor::new();
        for k in 0..10 {
            assert_ne!(p.on_fault(k * 64, 1 << 20, &T).outcome, Outcome::Sparse);
        }
    }

    #[test]
    fn a_stack_going_down_is_sparse_though_its_frames_touch_upwards() {
        // Each frame writes its bottom page, then the top of the frame in the page above:
        // misses down, and now and then a hit on the page above the last miss.
        let mut p = Predictor::new();
        let mut page = 10_000u64;
        let mut seen = vec![probing(&mut p, page).outcome];
        while !seen.contains(&Outcome::Sparse) && seen.len() < 40 {
            page -= 1;
            let w = probing(&mut p, page);
            seen.push(w.outcome);
            if w.outcome == Outcome::Miss && page % 2 == 0 {
                seen.push(probing(&mut p, page + 1).outcome);
            }
        }
        assert!(
            seen.contains(&Outcome::Hit) && seen.contains(&Outcome::Sparse),
            "{seen:?}"
        );
        assert!(seen.len() <= 10, "{seen:?}");
        // A writer going up, or hopping down farther than a frame, is no descent.
        let mut p = Predictor::new();
        for k in 0..8u64 {
            assert_ne!(probing(&mut p, 100_000 - k * 1000).outcome, Outcome::Sparse, "{k}");
            assert_ne!(probing(&mut p, 100_000 - k * 1000 + 5).outcome, Outcome::Sparse, "{k}");
        }
    }

    #[test]
    fn equal_columns_written_round_robin_are_streams_not_sparse() {
        // c[i] = a[i] + b[i] over fresh arrays of one size, or a column store's columns: each
        // column's first fault misses at one distance from the last, then every one hits.
        for columns in 2..=STREAMS as u64 + 1 {
            let mut p = Predictor::new();
            let mut next: Vec<u64> = (0..columns).map(|c| c * 16_384).collect();
            let mut seen = vec![];
            for _ in 0..6 {
                for n in &mut next {
                    let w = probing(&mut p, *n);
                    seen.push(w.outcome);
                    if w.probe.is_some() {
                        seen.push(probing(&mut p, *n + 1).outcome);
                    }
                    *n += w.pages;
                }
            }
            assert!(!seen.contains(&Outcome::Sparse), "{columns} columns: {seen:?}");
        }
    }

    #[test]
    fn runs_of_pages_at_one_stride_are_streams_not_sparse() {
        // A thread writing 16 pages of every 64 (threads sharing a region round-robin): its
        // runs start at one stride, but each run hits, and a hit ends the misses in a row.
        let mut p = Predictor::new();
        let mut seen = vec![];
        for run in 0..8u64 {
            let base = run * 64;
            let w = probing(&mut p, base);
            seen.push(w.outcome);
            let w = probing(&mut p, base + 1);
            seen.push(w.outcome);
        }
        assert!(!seen.contains(&Outcome::Sparse), "{seen:?}");
        assert_eq!(
            &seen[..4],
            [Outcome::Start, Outcome::Probe, Outcome::Miss, Outcome::Hit]
        );
    }

    #[test]
    fn no_probe_without_probing_or_in_a_small_window() {
        let mut p = Predictor::new();
        assert_eq!(p.on_fault(0, 1 << 20, &T).probe, None);
        let mut p = Predictor::new();
        assert_eq!(
            p.on_fault_probing(0, 3, &|_| false, &T).probe,
            None,
            "3 pages: no probe"
        );
        // A miss opens a one-page window: the next page's fault is the proof.
        let mut p = Predictor::new();
        probing(&mut p, 0);
        probing(&mut p, 1);
        assert_eq!(probing(&mut p, 5000).pages, 1);
        let w = probing(&mut p, 5001);
        assert_eq!((w.outcome, w.probe), (Outcome::Hit, None));
    }
}
