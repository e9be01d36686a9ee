//! The dirty rings: [`DirtyRing`], recycled pages not yet zeroed, over its lock-free indices
//! (`DirtyIndex`, with its loom model); what a put did ([`PutOutcome`]) and the batches the scrub takes
//! ([`Batch`]). How pages come in and go on is `recycle.rs`'s module docs ("A dirty ring").

use crate::page::{bytes, pages, PMD_PAGES};
use crate::sync::AtomicU64;
use crate::sys::mman;
use crate::sys::raw::Errno;
use crate::sys::uffd::Progress;
use std::io;
use std::sync::atomic::Ordering::*;
use std::sync::Mutex;
use std::time::Instant;

/// How long a move is retried after an EAGAIN that moved nothing: an event is pending
/// (mmap_changing) for the handler to read. It reads it within microseconds when idle, but
/// not while it makes a huge page itself (a populate of 2 MiB): a few quick retries made a
/// two-thread allocate/free loop discard a share of the pages it freed (docs/DESIGN.md,
/// "Figures that left the code comments"). Yields the CPU between tries, then sleeps.
pub(crate) const AGAIN_WAIT: std::time::Duration = std::time::Duration::from_millis(5);
/// Tries that only yield before the retries sleep ([`AGAIN_NAP`] each).
const AGAIN_YIELDS: u32 = 64;
const AGAIN_NAP: std::time::Duration = std::time::Duration::from_micros(50);

/// What [`DirtyRing::put`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PutOutcome {
    /// Source pages dealt with, from the start: moved, or holes (nothing to move).
    pub(crate) consumed: u64,
    /// Of those, pages moved in.
    pub(crate) moved: u64,
    /// The errno that refused the page at `consumed` (EBUSY, EINVAL, ...).
    pub(crate) refused: Option<Errno>,
    /// The ring had no room for the page at `consumed`.
    pub(crate) full: bool,
}

/// A batch of dirty pages at the ring's head, for the scrub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Batch {
    pub(crate) addr: usize,
    pub(crate) pages: u64,
    /// When its last page came in (ns on the ring's clock).
    pub(crate) stamp: u64,
}

/// A dirty ring's indices, apart from its memory: the lock-free part, which loom checks
/// (`cfg(loom)`, see `sync.rs`). Counters in pages, monotonic (see the module's docs).
#[derive(Debug)]
struct DirtyIndex {
    /// Pages in the ring.
    pages: u64,
    /// Pages per slot: 1, or [`PMD_PAGES`] for the huge ring (one huge page a slot).
    unit: u64,
    /// Pages the scrub emptied so far (the scrub alone).
    head: AtomicU64,
    /// Pages moved in so far (one recycler at a time).
    tail: AtomicU64,
    /// Per [`PMD_PAGES`] slots: when a page last came in, on the ring's clock.
    stamps: Box<[AtomicU64]>,
}

impl DirtyIndex {
    /// An empty ring of `pages` pages, `unit` pages a slot.
    fn new(pages: u64, unit: u64) -> DirtyIndex {
        DirtyIndex {
            pages,
            unit,
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            stamps: (0..pages.div_ceil(PMD_PAGES)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Pages waiting to be zeroed.
    fn pending(&self) -> u64 {
        let t = self.tail.load(Acquire);
        t - self.head.load(Acquire).min(t)
    }

    /// A recycler's start (one at a time): `(head, tail)`. The slots from `tail` up to
    /// `head + pages` are empty.
    fn begin(&self) -> (u64, u64) {
        // Acquire: the scrub emptied every slot below `head` before it stored it.
        let h = self.head.load(Acquire);
        (h, self.tail.load(Relaxed))
    }

    /// The slots a recycler may fill from `t` (`h` from [`Self::begin`]): at most `max` pages,
    /// whole slots, never crossing the ring's end.
    fn room(&self, h: u64, t: u64, max: u64) -> u64 {
        let room = self.pages - (t - h);
        let slot = t % self.pages;
        let want = max.min(room).min(self.pages - slot);
        want - want % self.unit
    }

    /// The recycler filled the slots `[t0, t)`, the last of them at `now`: the scrub may take
    /// them.
    fn publish(&self, t0: u64, t: u64, now: u64) {
        for i in (t0..t).step_by(crate::page::index(PMD_PAGES)) {
            self.stamps[crate::page::index((i % self.pages) / PMD_PAGES)].store(now, Relaxed);
        }
        if t > t0 {
            self.stamps[crate::page::index(((t - 1) % self.pages) / PMD_PAGES)].store(now, Relaxed);
        }
        // Release: the moves happen before the scrub's Acquire load that sees them.
        self.tail.store(t, Release);
    }

    /// The batch at the head, `(first slot, pages, stamp)`: at most [`PMD_PAGES`], never
    /// crossing a batch boundary or the ring's end. Its stamp is no older than its pages (the
    /// stamps are stored before `tail`). The scrub alone calls this.
    fn peek(&self) -> Option<(u64, u64, u64)> {
        let h = self.head.load(Relaxed);
        let t = self.tail.load(Acquire);
        if h >= t {
            return None;
        }
        let slot = h % self.pages;
        let n = (t - h).min(PMD_PAGES - slot % PMD_PAGES);
        let stamp = self.stamps[crate::page::index(slot / PMD_PAGES)].load(Relaxed);
        Some((slot, n, stamp))
    }

    /// The scrub emptied the first `n` pages at the head.
    fn consume(&self, n: u64) {
        let h = self.head.load(Relaxed);
        debug_assert!(h + n <= self.tail.load(Acquire));
        // Release: the slots are empty before a recycler's Acquire load sees them free.
        self.head.store(h + n, Release);
    }

    /// Every slot is empty (recyclers held off, the scrub kept away).
    fn drain(&self) {
        self.head.store(self.tail.load(Relaxed), Release);
    }

    /// `head <= tail <= head + pages`, on whole slots.
    fn is_valid(&self) -> bool {
        let h = self.head.load(Acquire);
        let t = self.tail.load(Acquire);
        h <= t && t - h <= self.pages && h % self.unit == 0 && t % self.unit == 0
    }
}

/// One ring of recycled, not yet zeroed pages (see the module's docs).
#[derive(Debug)]
pub(crate) struct DirtyRing {
    base: usize,
    index: DirtyIndex,
    lock: Mutex<()>,
    /// The ring's clock: ns since then.
    born: Instant,
    /// Unmapped for good ([`DirtyRing::retire`]): the address space may be the program's now.
    gone: std::sync::atomic::AtomicBool,
}

impl DirtyRing {
    /// Reserves `bytes` (rounded up to 2 MiB) of address space for recycled pages; `huge`:
    /// whole huge pages, one per 2 MiB slot.
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn new(bytes: usize, huge: bool) -> io::Result<DirtyRing> {
        let (base, len) = crate::pool::map_ring(bytes, huge)?;
        Ok(DirtyRing {
            base,
            index: DirtyIndex::new(pages(len), if huge { PMD_PAGES } else { 1 }),
            lock: Mutex::new(()),
            born: Instant::now(),
            gone: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The reserved area, as (address, length).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn area(&self) -> (usize, usize) {
        (self.base, bytes(self.index.pages))
    }

    /// Whether slots hold whole huge pages.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn is_huge(&self) -> bool {
        self.index.unit > 1
    }

    /// Pages waiting to be zeroed.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn pending(&self) -> u64 {
        self.index.pending()
    }

    /// Now, on the ring's clock (ns).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Moves `n` pages from `src` in, with `mv(dst, src, len)` (UFFDIO_MOVE), as far as there
    /// is room. In the huge ring `n` is one huge page and fills one slot. Recyclers call this
    /// one at a time (the ring's lock).
    ///
    /// # Context
    /// A program thread recycling; takes the ring's put lock (one putter at a time); while an event
    /// is pending (`EAGAIN`) it yields, then naps, at most [`AGAIN_WAIT`].
    pub(crate) fn put(&self, src: usize, n: u64, mv: &mut dyn FnMut(usize, usize, usize) -> Progress) -> PutOutcome {
        let unit = self.index.unit;
        debug_assert!(n % unit == 0);
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_gone() {
            return PutOutcome {
                full: true,
                ..PutOutcome::default()
            };
        }
        let (h, t0) = self.index.begin();
        let mut t = t0;
        let mut got = PutOutcome::default();
        'segments: while got.consumed < n {
            let want = self.index.room(h, t, n - got.consumed);
            if want == 0 {
                got.full = true;
                break;
            }
            let dst = self.base + bytes(t % self.index.pages);
            // Slots of this segment used so far.
            let mut d = 0;
            let mut again = 0;
            let mut again_since: Option<Instant> = None;
            while d < want && got.consumed < n {
                let len = (want - d).min(n - got.consumed);
                let p = mv(dst + bytes(d), src + bytes(got.consumed), bytes(len));
                let done = pages(p.done);
                d += done;
                got.consumed += done;
                got.moved += done;
                match p.errno {
                    None => {}
                    Some(Errno(libc::EAGAIN)) if done > 0 => {}
                    // A page in the slot (never expected): the slot counts, and whatever it
                    // holds is zeroed before it goes anywhere.
                    Some(Errno(libc::EEXIST)) => d += 1,
                    // A hole in the source: nothing to move there.
                    Some(Errno(libc::ENOENT)) => got.consumed += 1,
                    Some(Errno(libc::EAGAIN))
                        if again_since.get_or_insert_with(Instant::now).elapsed() < AGAIN_WAIT =>
                    {
                        again += 1;
                        if again < AGAIN_YIELDS {
                            std::thread::yield_now();
                        } else {
                            std::thread::sleep(AGAIN_NAP);
                        }
                    }
                    Some(e) => {
                        got.refused = Some(e);
                        t += if unit > 1 && d > 0 { unit } else { d };
                        break 'segments;
                    }
                }
            }
            // A huge slot is used whole once anything is in it.
            t += if unit > 1 && d > 0 { unit } else { d };
        }
        self.index.publish(t0, t, self.now());
        debug_assert!(self.is_valid());
        got
    }

    /// The batch at the head: at most [`PMD_PAGES`], never crossing a batch boundary or the
    /// ring's end. The scrub alone calls this.
    ///
    /// # Context
    /// The scrub thread. Lock-free (the loom model checks it against `put`).
    pub(crate) fn peek(&self) -> Option<Batch> {
        let (slot, n, stamp) = self.index.peek()?;
        Some(Batch {
            addr: self.base + bytes(slot),
            pages: n,
            stamp,
        })
    }

    /// The scrub emptied the first `n` pages at the head (moved them on, or purged them).
    ///
    /// # Context
    /// The scrub thread. Lock-free (the loom model checks it against `put`).
    pub(crate) fn consume(&self, n: u64) {
        self.index.consume(n);
    }

    /// `head <= tail <= head + pages`, on whole slots.
    ///
    /// # Context
    /// Any thread, in debug checks; reads atomics.
    pub(crate) fn is_valid(&self) -> bool {
        self.index.is_valid()
    }

    /// Gives every page back to the kernel and forgets them (the engine is going away, or the
    /// pool is paused). Recyclers wait meanwhile; the caller holds the pool's work lock, which
    /// keeps the scrub between two batches (`Pool::release_all`).
    ///
    /// # Context
    /// Any thread holding the pool's work lock (pause, drop, `mlockall`); takes the put lock.
    pub(crate) fn release_all(&self) {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_gone() {
            return;
        }
        // SAFETY: the ring's own memory; no recycler runs (the lock), and the caller keeps the
        // scrub away.
        let _ = unsafe { mman::madvise(self.base, bytes(self.index.pages), mman::MADV_DONTNEED) };
        self.index.drain();
    }
}

impl DirtyRing {
    /// Unmaps the ring's area for good, as [`crate::pool::Ring::retire`] does.
    ///
    /// # Context
    /// Any thread, with the engine's threads stopped and the pool's work lock held; takes the
    /// put lock.
    pub(crate) fn retire(&self) {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.gone.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        self.index.drain();
        // SAFETY: the ring's own memory; under the put lock no recycler writes it, no scrub
        // runs, and the ring is marked gone before the addresses are free.
        let _ = unsafe { mman::unmap(self.base, bytes(self.index.pages)) };
    }

    /// Whether [`DirtyRing::retire`] unmapped the ring.
    ///
    /// # Context
    /// Any thread; one atomic load.
    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for DirtyRing {
    fn drop(&mut self) {
        if self.is_gone() {
            return;
        }
        // SAFETY: the ring's own memory, and the ring is dropped.
        let _ = unsafe { mman::unmap(self.base, bytes(self.index.pages)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::{PAGE_SIZE, PMD_SIZE};

    /// A fake UFFDIO_MOVE over page numbers: `present` pages of the source move, holes are
    /// ENOENT (or EAGAIN after progress), `busy` pages are EBUSY, occupied destinations EEXIST.
    struct FakeMove {
        present: std::collections::BTreeSet<usize>,
        busy: std::collections::BTreeSet<usize>,
        dst: std::collections::BTreeSet<usize>,
        calls: u32,
    }

    impl FakeMove {
        fn mv(&mut self, d: usize, s: usize, l: usize) -> Progress {
            self.calls += 1;
            let mut done = 0;
            while done < l {
                let (dp, sp) = (d + done, s + done);
                let err = if self.dst.contains(&dp) {
                    Some(libc::EEXIST)
                } else if self.busy.contains(&sp) {
                    Some(libc::EBUSY)
                } else if !self.present.contains(&sp) {
                    Some(libc::ENOENT)
                } else {
                    None
                };
                if let Some(e) = err {
                    let e = if done > 0 { libc::EAGAIN } else { e };
                    return Progress {
                        done,
                        errno: Some(Errno(e)),
                    };
                }
                self.present.remove(&sp);
                self.dst.insert(dp);
                done += PAGE_SIZE;
            }
            Progress { done, errno: None }
        }
    }

    fn fake(src: usize, n: usize) -> FakeMove {
        FakeMove {
            present: (0..n).map(|i| src + i * PAGE_SIZE).collect(),
            busy: Default::default(),
            dst: Default::default(),
            calls: 0,
        }
    }

    const SRC: usize = 1 << 40;

    #[test]
    fn put_moves_runs_skips_holes_and_stops_where_refused_or_full() {
        let ring = DirtyRing::new(PMD_SIZE, false).unwrap(); // 512 slots
        let mut f = fake(SRC, 600);
        f.present.remove(&(SRC + 3 * PAGE_SIZE)); // a hole
        let p = ring.put(SRC, 10, &mut |d, s, l| f.mv(d, s, l));
        assert_eq!((p.consumed, p.moved, p.refused, p.full), (10, 9, None, false));
        assert_eq!(ring.pending(), 9, "the hole used no slot");
        f.busy.insert(SRC + 15 * PAGE_SIZE);
        let p = ring.put(SRC + 10 * PAGE_SIZE, 10, &mut |d, s, l| f.mv(d, s, l));
        assert_eq!((p.consumed, p.moved, p.refused), (5, 5, Some(Errno(libc::EBUSY))));
        assert_eq!(ring.pending(), 14);
        // 498 slots left: a put of 600 fills them and says full.
        let p = ring.put(SRC + 16 * PAGE_SIZE, 584, &mut |d, s, l| f.mv(d, s, l));
        assert_eq!((p.moved, p.full), (498, true));
        assert_eq!(ring.pending(), 512);
        assert!(ring.is_valid());
        // The scrub empties the first batch (it crosses nothing: 512 slots are one batch).
        let b = ring.peek().unwrap();
        assert_eq!((b.addr, b.pages), (ring.area().0, 512));
        ring.consume(200);
        for i in 0..200 {
            f.dst.remove(&(ring.area().0 + i * PAGE_SIZE));
        }
        // Room again: the next put wraps to slot 0.
        let p = ring.put(SRC + 514 * PAGE_SIZE, 86, &mut |d, s, l| f.mv(d, s, l));
        assert_eq!((p.moved, p.full), (86, false));
        let b = ring.peek().unwrap();
        assert_eq!(
            (b.addr, b.pages),
            (ring.area().0 + 200 * PAGE_SIZE, 312),
            "to the ring's end"
        );
    }

    #[test]
    fn a_slot_still_holding_a_page_counts_as_dirty() {
        let ring = DirtyRing::new(PMD_SIZE, false).unwrap();
        let mut f = fake(SRC, 8);
        f.dst.insert(ring.area().0 + 2 * PAGE_SIZE);
        let p = ring.put(SRC, 8, &mut |d, s, l| f.mv(d, s, l));
        assert_eq!((p.consumed, p.moved), (8, 8));
        assert_eq!(ring.pending(), 9, "eight pages and the occupied slot");
    }

    #[test]
    fn the_huge_ring_takes_one_huge_page_a_slot() {
        let ring = DirtyRing::new(2 * PMD_SIZE, true).unwrap();
        assert!(ring.is_huge());
        let mut f = fake(SRC, 3 * 512);
        for k in 0..3 {
            let p = ring.put(SRC + k * PMD_SIZE, PMD_PAGES, &mut |d, s, l| f.mv(d, s, l));
            assert_eq!(p.moved, if k < 2 { PMD_PAGES } else { 0 }, "{k}");
            assert_eq!(p.full, k == 2);
        }
        assert_eq!(ring.pending(), 1024);
        // A partly refused huge page still uses its whole slot.
        ring.consume(512);
        f.dst.retain(|&d| d >= ring.area().0 + PMD_SIZE);
        f.present.extend((0..512).map(|i| SRC + 4 * PMD_SIZE + i * PAGE_SIZE));
        f.busy.insert(SRC + 4 * PMD_SIZE + 100 * PAGE_SIZE);
        let p = ring.put(SRC + 4 * PMD_SIZE, PMD_PAGES, &mut |d, s, l| f.mv(d, s, l));
        assert_eq!((p.moved, p.refused), (100, Some(Errno(libc::EBUSY))));
        assert_eq!(ring.pending(), 1024);
        assert!(ring.is_valid());
    }
}

/// Loom model of a dirty ring's index (`RUSTFLAGS="--cfg loom"`, see `.ci/run`). Slots are loom
/// cells: a recycler writes a slot when it moves a page in (the put's time, on the ring's
/// clock), the scrub reads and clears it when it empties the batch. Loom fails an access to a
/// slot not ordered after the previous one, and the assertions fail a slot consumed before it
/// was produced or twice, or a batch whose stamp is older than its pages.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::DirtyIndex;
    use crate::sync::loom_model as model;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    struct Ring {
        index: DirtyIndex,
        slots: Vec<UnsafeCell<u64>>,
    }

    impl Ring {
        fn new(pages: u64) -> Ring {
            Ring {
                index: DirtyIndex::new(pages, 1),
                slots: (0..pages).map(|_| UnsafeCell::new(0)).collect(),
            }
        }

        fn slot(&self, i: u64) -> &UnsafeCell<u64> {
            &self.slots[crate::page::index(i % self.index.pages)]
        }

        /// A recycler's put of up to `n` pages at time `now` (> 0), as `DirtyRing::put` steps
        /// the index: the pages moved in.
        fn put(&self, n: u64, now: u64) -> u64 {
            let (h, t0) = self.index.begin();
            let mut t = t0;
            while t - t0 < n {
                let want = self.index.room(h, t, n - (t - t0));
                if want == 0 {
                    break;
                }
                for i in t..t + want {
                    // SAFETY: loom checks this access against every other one of the slot.
                    self.slot(i).with_mut(|v| unsafe {
                        assert_eq!(*v, 0, "slot {i} refilled before the scrub emptied it");
                        *v = now;
                    });
                }
                t += want;
            }
            self.index.publish(t0, t, now);
            t - t0
        }

        /// One step of the scrub: empties the batch at the head, if any; the pages emptied.
        fn scrub(&self) -> u64 {
            let Some((slot, n, stamp)) = self.index.peek() else {
                return 0;
            };
            for i in slot..slot + n {
                // SAFETY: as above.
                self.slot(i).with_mut(|v| unsafe {
                    assert_ne!(*v, 0, "slot {i} consumed before it was produced, or twice");
                    assert!(stamp >= *v, "a batch stamped {stamp} holds a page of {}", *v);
                    *v = 0;
                });
            }
            self.index.consume(n);
            n
        }
    }

    #[test]
    fn loom_a_batch_is_produced_before_it_is_consumed_and_consumed_once() {
        // Four slots: three puts of two pages, the third only into slots the scrub emptied.
        model(|| {
            let r = Arc::new(Ring::new(4));
            let recycler = {
                let r = r.clone();
                thread::spawn(move || r.put(2, 1) + r.put(2, 2) + r.put(2, 3))
            };
            let scrub = {
                let r = r.clone();
                thread::spawn(move || r.scrub() + r.scrub())
            };
            let moved = recycler.join().unwrap();
            let mut emptied = scrub.join().unwrap();
            assert!(r.index.is_valid());
            assert_eq!(moved - emptied, r.index.pending());
            while r.index.pending() > 0 {
                emptied += r.scrub();
            }
            assert_eq!(moved, emptied, "a page lost or emptied twice");
        });
    }
}
