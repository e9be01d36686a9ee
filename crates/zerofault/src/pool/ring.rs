//! The rings of pre-zeroed pages: [`Ring`] over its reserved area ([`map_ring`], which the dirty
//! rings use too), its lock-free indices ([`RingIndex`], with their loom models) and the runs it
//! hands out ([`Run`]). Their shape, counters and orderings are the pool's module docs
//! (`pool/mod.rs`).

#[cfg(doc)]
use super::Pool;
use crate::page::{bytes, pages, PMD_PAGES, PMD_SIZE};
use crate::stats::Stats;
use crate::sync::AtomicU64;
use crate::sys::mman;
use std::io;
use std::sync::atomic::Ordering::*;
use std::sync::Mutex;

/// A contiguous run of ready pages taken from a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub addr: usize,
    pub pages: u64,
    /// The ring index of the run's first page.
    index: u64,
}

/// Pads a hot atomic to its own cache line pair (128 bytes: adjacent-line prefetch).
#[repr(align(128))]
#[derive(Debug, Default)]
pub(super) struct CachePadded<T>(pub(super) T);

/// The ring's indices, apart from its memory: the lock-free part, which loom checks
/// (`cfg(loom)`, see `sync.rs`). Counters in pages, monotonic (see the module's docs).
#[derive(Debug)]
pub(crate) struct RingIndex {
    /// Slots in the ring.
    pages: u64,
    /// Pages per unit of `take`, `untake` and `fill`: 1, or [`PMD_PAGES`] when huge.
    pub(super) unit: u64,
    /// Pages handed out so far (consumers, by CAS).
    pub(super) head: CachePadded<AtomicU64>,
    /// Pages populated so far (the one producer at a time).
    tail: CachePadded<AtomicU64>,
}

impl RingIndex {
    /// An empty ring of `pages` slots handed out `unit` pages at a time.
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn new(pages: u64, unit: u64) -> RingIndex {
        RingIndex {
            pages,
            unit,
            head: CachePadded(AtomicU64::new(0)),
            tail: CachePadded(AtomicU64::new(0)),
        }
    }

    /// Pages ready to be taken.
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn available(&self) -> u64 {
        let t = self.tail.0.load(Acquire);
        (t - self.head.0.load(Acquire).min(t)).min(self.pages)
    }

    /// Takes up to `want` ready pages (whole units) as one run that does not cross the ring's
    /// end: `(index, pages)`, its first slot being `index % pages`. `None` when empty.
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn take(&self, want: u64) -> Option<(u64, u64)> {
        let want = want - want % self.unit;
        let mut h = self.head.0.load(Acquire);
        loop {
            // Acquire: the populate of every slot below `t` happened before (the producer's
            // Release store).
            let t = self.tail.0.load(Acquire);
            if h >= t || want == 0 {
                return None;
            }
            let to_ring_end = self.pages - h % self.pages;
            let n = want.min(t - h).min(to_ring_end);
            // AcqRel: the slots are ours from here; the producer's Acquire load of `head`
            // orders its reuse of them after our use.
            match self.head.0.compare_exchange_weak(h, h + n, AcqRel, Acquire) {
                Ok(_) => return Some((h, n)),
                Err(now) => h = now,
            }
        }
    }

    /// Gives back the last `unused` pages (whole units) of the run `(index, pages)` if nobody
    /// took pages after it; otherwise they stay where they are, populated, and the producer
    /// finds them so when it comes round. Whether they were given back.
    ///
    /// The producer may have come round to the run's slots already (it saw them taken, and
    /// repopulated them: nothing happens to a present page). Then the given-back slots count
    /// twice, here and at the tail: the first taker gets their pages, the second finds holes,
    /// which the engine skips (ENOENT, told from a gone destination by mincore).
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn untake(&self, index: u64, pages: u64, unused: u64) -> bool {
        let unused = unused - unused % self.unit;
        if unused == 0 {
            return true;
        }
        let end = index + pages;
        // AcqRel on success: our use of the run's other pages happens before a later taker's.
        self.head
            .0
            .compare_exchange(end, end - unused.min(pages), AcqRel, Relaxed)
            .is_ok()
    }

    /// The producer's first half of a step (one producer at a time): the slots it may populate
    /// now, `(index, pages)`: at most `max` pages, whole units, never crossing the ring's end;
    /// `None` when full.
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn fill_begin(&self, max: u64) -> Option<(u64, u64)> {
        let t = self.tail.0.load(Relaxed);
        // Acquire: every consumer's use of a slot it took happened before we reuse it.
        let h = self.head.0.load(Acquire);
        // Saturating: a run given back after we came round its slots counts them twice (see
        // `untake`), so `t - h` may exceed the ring for a while.
        let free = self.pages.saturating_sub(t - h.min(t));
        let to_ring_end = self.pages - t % self.pages;
        let n = max.min(free).min(to_ring_end);
        let n = n - n % self.unit;
        (n > 0).then_some((t, n))
    }

    /// The second half: the `pages` slots from `index` are populated; consumers may take them.
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn fill_publish(&self, index: u64, pages: u64) {
        // Release: the populate happens before any consumer's Acquire load that sees it.
        self.tail.0.store(index + pages, Release);
    }

    /// Hands out nothing that is ready now (the pool is emptied).
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn drain(&self) {
        self.head.0.store(self.tail.0.load(Acquire), Release);
    }

    /// The indices' invariants (debug builds): `head <= tail <= head + 2 * pages` (a ring's
    /// worth, plus at most one run given back after the producer came round it: see
    /// `untake`), both on whole units. `head` is read first: it only ever moves up to a tail
    /// some consumer saw, and `tail` only grows, so a later read of `tail` is at least the
    /// `head` read before it.
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn is_valid(&self) -> bool {
        let h = self.head.0.load(Acquire);
        let t = self.tail.0.load(Acquire);
        h <= t && t - h <= 2 * self.pages && h % self.unit == 0 && t % self.unit == 0
    }
}

/// One ring of pre-zeroed pages (see the module's docs).
#[derive(Debug)]
pub(crate) struct Ring {
    base: usize,
    pub(super) index: RingIndex,
    fill_lock: Mutex<()>,
    /// The node the ring is bound to (see [`Pool::node`]): each populate is checked to have
    /// landed there.
    node: Option<u32>,
    /// When (monotonic ns, 0: never) a populate of this ring last found its node full, or was
    /// refused for memory; cleared by one that lands on the node. Per ring: a node too
    /// fragmented for a huge page on it may still have 4 KiB pages (see [`Ring::node_full`]).
    full_at: std::sync::atomic::AtomicU64,
    /// Unmapped for good ([`Ring::retire`]): the address space may be the program's now.
    gone: std::sync::atomic::AtomicBool,
}

/// How long a ring's node counts as full after a populate found it so, unless a later one
/// says otherwise: after that the handlers try the node again (their copies and huge pages go
/// where the kernel puts them) and the scrub's next populate looks again.
pub(crate) const NODE_FULL_TTL_NS: u64 = crate::memory::nodes::ZAP_NS;

/// Reserves a ring's area, clean or dirty: `bytes` rounded up to 2 MiB, 2 MiB aligned,
/// `MADV_HUGEPAGE` when `huge` (else `MADV_NOHUGEPAGE`) and `MADV_DONTFORK` (a forked child has
/// no use for the pool). Nothing is populated. Returns (address, length).
///
/// # Context
/// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
pub(crate) fn map_ring(bytes: usize, huge: bool) -> io::Result<(usize, usize)> {
    let len = bytes.max(PMD_SIZE).next_multiple_of(PMD_SIZE);
    let base = mman::map_aligned(len, PMD_SIZE, libc::PROT_READ | libc::PROT_WRITE, true)?;
    let thp = if huge {
        mman::MADV_HUGEPAGE
    } else {
        mman::MADV_NOHUGEPAGE
    };
    // SAFETY: a fresh mapping of ours, known to nobody yet: advice changes no content.
    let advise = unsafe { mman::madvise(base, len, thp).and_then(|_| mman::madvise(base, len, mman::MADV_DONTFORK)) };
    if let Err(e) = advise {
        // SAFETY: as above.
        let _ = unsafe { mman::unmap(base, len) };
        return Err(e);
    }
    Ok((base, len))
}

impl Ring {
    /// Reserves `bytes` (rounded up to 2 MiB) of address space; nothing is populated yet.
    /// `huge`: populated as transparent huge pages and handed out in whole chunks.
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn new(bytes: usize, huge: bool) -> io::Result<Ring> {
        let (base, len) = map_ring(bytes, huge)?;
        Ok(Ring {
            base,
            index: RingIndex::new(pages(len), if huge { PMD_PAGES } else { 1 }),
            fill_lock: Mutex::new(()),
            node: None,
            full_at: std::sync::atomic::AtomicU64::new(0),
            gone: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether this ring's node was found full within the last [`NODE_FULL_TTL_NS`].
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn node_full(&self) -> bool {
        use crate::memory::nodes::Clock;
        let at = self.full_at.load(Acquire);
        at != 0 && crate::memory::nodes::Monotonic.now_ns().saturating_sub(at) < NODE_FULL_TTL_NS
    }

    /// Records that a populate found the node full (or had no memory).
    ///
    /// # Context
    /// The ring's producer (the scrub or a prefill), under the fill lock.
    pub(crate) fn mark_node_full(&self) {
        use crate::memory::nodes::Clock;
        self.full_at
            .store(crate::memory::nodes::Monotonic.now_ns().max(1), Release);
    }

    /// Binds the ring's area to `node` (preferred: where the node is full, the kernel takes
    /// the next node's pages rather than failing the populate), and checks every populate
    /// against it from now on ([`Ring::fill_step`]).
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(super) fn bind(&mut self, node: u32) -> io::Result<()> {
        let (a, l) = self.area();
        let mask = crate::sys::numa::NodeMask::of([node]);
        // SAFETY: the ring's own area, not populated yet: its pages will come from `node`.
        unsafe { crate::sys::numa::mbind(a, l, crate::sys::numa::MPOL_PREFERRED, &mask) }
            .map_err(|e| io::Error::from_raw_os_error(e.0))?;
        self.node = Some(node);
        Ok(())
    }

    /// The ring's reserved area, as (address, length).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn area(&self) -> (usize, usize) {
        (self.base, bytes(self.index.pages))
    }

    /// Whether this is the huge ring (whole 2 MiB chunks).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    #[cfg(test)]
    pub(crate) fn is_huge(&self) -> bool {
        self.index.unit > 1
    }

    /// Whether this is the huge ring (whole 2 MiB chunks).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn is_huge_ring(&self) -> bool {
        self.index.unit > 1
    }

    /// Capacity in pages.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn capacity(&self) -> u64 {
        self.index.pages
    }

    /// Pages ready to be taken.
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn available(&self) -> u64 {
        self.index.available()
    }

    /// Takes up to `want` ready pages (whole chunks in the huge ring, so `want` is rounded down
    /// to them) as one contiguous run; `None` when the ring is empty or `want` is under a unit.
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn take(&self, want: u64) -> Option<Run> {
        let (index, n) = self.index.take(want)?;
        debug_assert!(self.index.is_valid());
        Some(Run {
            addr: self.base + bytes(index % self.index.pages),
            pages: n,
            index,
        })
    }

    /// Gives back the last `unused` pages of `run` if nobody took pages after it; otherwise they
    /// stay where they are, populated, and the producer finds them present when it comes round.
    /// The huge ring takes back whole unused chunks only.
    ///
    /// # Context
    /// Any thread; lock-free (the loom model `loom_tests` checks the protocol), never sleeps.
    pub(crate) fn untake(&self, run: Run, unused: u64) {
        self.index.untake(run.index, run.pages, unused);
        debug_assert!(self.index.is_valid());
    }

    /// Producer step: populates up to `max_pages` (at most one chunk, never crossing the ring's
    /// end) and publishes them. Returns the pages added; 0 when the pool is full. A ring bound
    /// to a node asks where the chunk's first and last pages went (`move_pages`, one call):
    /// pages the kernel took from another node mean the node is full (its fast path found the
    /// node below its watermark and fell back, seed 001's full zone), and the chunk is
    /// discarded unpublished: [`FillError::NodeFull`].
    ///
    /// # Context
    /// The ring's producer: the scrub thread, or a program thread's prefill. Takes the fill lock;
    /// the populate allocates pages and may sleep (reclaim, the mmap lock).
    pub(crate) fn fill_step(&self, max_pages: u64, stats: &Stats) -> Result<u64, FillError> {
        let node = self.node;
        let n = self.fill_with(max_pages, |addr, n| {
            mman::populate_write(addr, bytes(n)).map_err(FillError::from)?;
            if let Some(node) = node {
                let ends = [addr, addr + bytes(n - 1)];
                let mut on = [-1i32; 2];
                // A query that fails says nothing (the chunk stays): only pages seen on another
                // node, or not there at all, mean the node is full.
                if crate::sys::numa::nodes_of(&ends, &mut on).is_ok()
                    && on.iter().any(|&o| u32::try_from(o) != Ok(node))
                {
                    // SAFETY: free slots of the ring, not published: nobody takes them.
                    let _ = unsafe { mman::madvise(addr, bytes(n), mman::MADV_DONTNEED) };
                    return Err(FillError::NodeFull);
                }
            }
            Ok(n)
        });
        match &n {
            Ok(k) if *k > 0 => self.full_at.store(0, Release),
            Err(FillError::NodeFull) => self.mark_node_full(),
            _ => {}
        }
        let n = n?;
        if n > 0 {
            Stats::add(&stats.pool_refills, 1);
            Stats::add(&stats.pool_pages_filled, n);
        }
        Ok(n)
    }

    /// Producer step with a source of its own: `fill(addr, n)` puts zero pages into the first
    /// pages of the `n` free slots at `addr` (at most one chunk, whole chunks in the huge ring,
    /// never crossing the ring's end) and says how many; they are published. A slot that
    /// still holds a page (given back after the producer came round it: see
    /// `RingIndex::untake`) holds a zero page: `fill` may count it as filled. Returns the
    /// pages published; 0 when the ring is full.
    ///
    /// # Context
    /// The ring's producer (the scrub, or a prefill); takes the fill lock for the call, `fill`
    /// included.
    pub(crate) fn fill_with<E>(
        &self,
        max_pages: u64,
        fill: impl FnOnce(usize, u64) -> Result<u64, E>,
    ) -> Result<u64, E> {
        let _producer = self.fill_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.gone.load(Relaxed) {
            return Ok(0);
        }
        // One PMD a step: consumers see pages appear every PMD populated, not after a refill.
        let Some((t, n)) = self.index.fill_begin(max_pages.min(PMD_PAGES)) else {
            return Ok(0);
        };
        let addr = self.base + bytes(t % self.index.pages);
        let got = fill(addr, n)?.min(n);
        let got = got - got % self.index.unit;
        if got > 0 {
            self.index.fill_publish(t, got);
        }
        debug_assert!(self.index.is_valid());
        Ok(got)
    }

    /// Takes up to `max` ready pages and gives them back to the kernel (the scrub's purge of
    /// pages nobody took). Returns the pages purged.
    ///
    /// # Context
    /// The scrub thread. Takes ring slots lock-free; the discard may sleep on the mmap lock.
    pub(crate) fn purge(&self, max: u64) -> u64 {
        let Some(run) = self.take(max) else { return 0 };
        // SAFETY: a run taken from the ring is ours alone (see `take`); its pages are discarded
        // instead of moved.
        let _ = unsafe { mman::madvise(run.addr, bytes(run.pages), mman::MADV_DONTNEED) };
        run.pages
    }

    /// Populates until `target` pages are ready (capped at capacity), on the calling thread.
    ///
    /// # Context
    /// A test's thread, as [`Ring::fill_step`].
    #[cfg(test)]
    pub(crate) fn fill_to(&self, target: u64, stats: &Stats, stop: impl Fn() -> bool) -> Result<(), FillError> {
        fill_loop(
            target.min(self.index.pages),
            stop,
            || self.available(),
            |n| self.fill_step(n, stats),
        )
    }

    /// Whether `addr` (a page of a run) is still populated: tells a source hole from a
    /// destination problem when a move reports ENOENT.
    ///
    /// # Context
    /// Any thread; one `mincore`.
    pub(crate) fn is_populated(&self, addr: usize) -> bool {
        mman::is_resident(addr)
    }
}

impl Ring {
    /// Frees every page (the engine is going away; the address space stays reserved
    /// until the last region lets go of the shared state).
    ///
    /// # Context
    /// Any thread holding the pool's work lock; takes the fill lock.
    pub(crate) fn release_all(&self) {
        let _producer = self.fill_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.gone.load(Relaxed) {
            return;
        }
        // SAFETY: the ring's own memory. Under the fill lock no producer writes it, and after
        // head = tail below no consumer takes a run of it; a run taken before is moved out
        // already (the kernel refuses to move a discarded page: ENOENT, a hole).
        let _ = unsafe { mman::madvise(self.base, bytes(self.index.pages), mman::MADV_DONTNEED) };
        self.index.drain();
    }
}

impl Ring {
    /// Unmaps the ring's area for good, its pages with it (the engine gave its mappings back:
    /// `Engine::give_back`). From then on the ring is empty and takes no page, and nothing
    /// touches its addresses, which the program may map again.
    ///
    /// # Context
    /// Any thread, with the engine's threads stopped and the pool's work lock held; takes the
    /// fill lock.
    pub(crate) fn retire(&self) {
        let _producer = self.fill_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.gone.swap(true, Relaxed) {
            return;
        }
        self.index.drain();
        // SAFETY: the ring's own memory; under the fill lock no producer writes it, no handler
        // runs, and the ring is marked gone before the addresses are free.
        let _ = unsafe { mman::unmap(self.base, bytes(self.index.pages)) };
    }

    /// Whether [`Ring::retire`] unmapped the ring.
    ///
    /// # Context
    /// Any thread; one atomic load.
    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Relaxed)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.is_gone() {
            return;
        }
        // SAFETY: the ring's own memory, and the ring is dropped.
        let _ = unsafe { mman::unmap(self.base, bytes(self.index.pages)) };
    }
}

/// Why a producer step put no page into a ring.
#[derive(Debug)]
pub(crate) enum FillError {
    /// No page to be had on the ring's node: the populate's pages landed on another node (see
    /// [`Ring::fill_step`]), or the populate was refused for memory (`ENOMEM`).
    NodeFull,
    /// The populate was refused otherwise.
    Os(io::Error),
}

impl From<io::Error> for FillError {
    fn from(e: io::Error) -> FillError {
        if e.kind() == io::ErrorKind::OutOfMemory {
            FillError::NodeFull
        } else {
            FillError::Os(e)
        }
    }
}

impl From<FillError> for io::Error {
    fn from(e: FillError) -> io::Error {
        match e {
            FillError::NodeFull => io::Error::new(io::ErrorKind::OutOfMemory, "the pool's node is full"),
            FillError::Os(e) => e,
        }
    }
}

/// Producer steps until `available()` reaches `target`, a step adds nothing, or `stop()`.
///
/// # Context
/// The producer of [`Ring::fill_step`].
pub(super) fn fill_loop(
    target: u64,
    stop: impl Fn() -> bool,
    available: impl Fn() -> u64,
    mut step: impl FnMut(u64) -> Result<u64, FillError>,
) -> Result<(), FillError> {
    while !stop() {
        let have = available();
        if have >= target || step(target - have)? == 0 {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "test data patterns"
)]
mod tests {
    use super::*;
    use crate::page::PAGE_SIZE;

    #[test]
    fn runs_are_contiguous_and_never_cross_the_ring_end() {
        let stats = Stats::default();
        let p = Ring::new(PMD_SIZE, false).unwrap(); // 512 pages
        assert_eq!(p.take(1), None);
        p.fill_to(512, &stats, || false).unwrap();
        assert_eq!(p.available(), 512);
        let a = p.take(500).unwrap();
        assert_eq!((a.addr, a.pages), (p.base, 500));
        // Populated and zero.
        // SAFETY: the run lies inside the pool mapping, populated and not yet moved out.
        let first = unsafe { std::slice::from_raw_parts(a.addr as *const u8, PAGE_SIZE) };
        assert!(crate::pool::zero::source::is_zero(first));
        p.fill_to(512, &stats, || false).unwrap(); // refills the 500 slots, wrapping the ring
        let b = p.take(100).unwrap();
        assert_eq!(b.pages, 12, "stops at the ring end");
        let c = p.take(100).unwrap();
        assert_eq!((c.addr, c.pages), (p.base, 100));
        assert_eq!(stats.snapshot().pool_pages_filled, 1012);
    }

    #[test]
    fn untake_returns_the_unused_tail_only_when_nobody_took_after() {
        let stats = Stats::default();
        let p = Ring::new(PMD_SIZE, false).unwrap();
        p.fill_to(100, &stats, || false).unwrap();
        let a = p.take(40).unwrap();
        p.untake(a, 10);
        assert_eq!(p.available(), 70);
        let b = p.take(10).unwrap();
        let c = p.take(10).unwrap();
        p.untake(b, 5); // c was taken after b: b's pages stay out
        assert_eq!(p.available(), 50);
        p.untake(c, 10);
        assert_eq!(p.available(), 60);
    }

    #[test]
    fn concurrent_takers_get_disjoint_runs() {
        let stats = Stats::default();
        let p = std::sync::Arc::new(Ring::new(4 * PMD_SIZE, false).unwrap());
        p.fill_to(p.capacity(), &stats, || false).unwrap();
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut got = vec![];
                    while let Some(r) = p.take(7) {
                        got.push((r.addr, r.pages));
                    }
                    got
                })
            })
            .collect();
        let mut pages: Vec<usize> = ts
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .flat_map(|(a, n)| (0..n as usize).map(move |i| a + i * PAGE_SIZE))
            .collect();
        let n = pages.len();
        pages.sort_unstable();
        pages.dedup();
        assert_eq!((n, pages.len()), (p.capacity() as usize, p.capacity() as usize));
    }

    #[test]
    fn the_huge_ring_hands_out_whole_chunks_of_huge_pages() {
        let stats = Stats::default();
        let r = Ring::new(4 * PMD_SIZE, true).unwrap();
        assert!(r.is_huge());
        r.fill_to(r.capacity(), &stats, || false).unwrap();
        assert_eq!(r.available(), 2048);
        if mman::thp_available() {
            assert!(
                mman::anon_huge_bytes(r.base, bytes(r.capacity())) >= PMD_SIZE,
                "at least one chunk is a transparent huge page"
            );
        }
        assert_eq!(r.take(511), None, "less than a chunk");
        let a = r.take(1100).unwrap();
        assert_eq!((a.addr, a.pages), (r.base, 1024), "rounded down to whole chunks");
        r.untake(a, 600); // 600 unused pages: one whole chunk goes back
        assert_eq!(r.available(), 1536);
        let b = r.take(512).unwrap();
        assert_eq!(b.addr, r.base + PMD_SIZE, "the chunk given back");
        r.untake(b, 100); // part of a chunk: stays out
        assert_eq!(r.available(), 1024);
    }
}

/// Loom models of the ring's index (`RUSTFLAGS="--cfg loom"`, see `.ci/run`). Slots are loom
/// cells: the producer writes a slot when it populates it, a consumer that took it reads it
/// and clears it (the page moved out). Loom fails any access to a slot that is not ordered
/// after the previous one, and the assertions fail a slot handed out unpopulated or twice.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::RingIndex;
    use crate::sync::loom_model as model;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    struct Ring {
        index: RingIndex,
        slots: Vec<UnsafeCell<u64>>,
    }

    impl Ring {
        fn new(pages: u64) -> Ring {
            Ring {
                index: RingIndex::new(pages, 1),
                slots: (0..pages).map(|_| UnsafeCell::new(0)).collect(),
            }
        }

        fn slot(&self, i: u64) -> &UnsafeCell<u64> {
            &self.slots[crate::page::index(i % self.index.pages)]
        }

        /// One producer step of up to `max` pages; the pages filled.
        fn fill(&self, max: u64, mark: u64) -> u64 {
            let Some((t, n)) = self.index.fill_begin(max) else {
                return 0;
            };
            for i in t..t + n {
                // SAFETY: loom checks this access against every other one of the slot.
                self.slot(i).with_mut(|v| unsafe { *v = mark });
            }
            self.index.fill_publish(t, n);
            n
        }

        /// Takes up to `want` pages, moves out the first `used` of them and gives the rest
        /// back: (pages used, pages stranded because someone took pages after them).
        fn consume(&self, want: u64, used: u64) -> (u64, u64) {
            let Some((i, n)) = self.index.take(want) else {
                return (0, 0);
            };
            let used = used.min(n);
            for k in i..i + used {
                // SAFETY: as above.
                self.slot(k).with_mut(|v| unsafe {
                    assert_ne!(*v, 0, "slot {k} handed out before it was populated, or twice");
                    *v = 0;
                });
            }
            let back = self.index.untake(i, n, n - used);
            (used, if back { 0 } else { n - used })
        }
    }

    #[test]
    fn loom_pages_are_populated_before_they_are_taken_and_taken_once() {
        // One round of the ring (no slot reused: see the module's docs on reuse), filled in two
        // steps while two consumers take.
        model(|| {
            let r = Arc::new(Ring::new(4));
            let producer = {
                let r = r.clone();
                thread::spawn(move || r.fill(2, 1) + r.fill(2, 2))
            };
            let consumers: Vec<_> = (0..2)
                .map(|_| {
                    let r = r.clone();
                    thread::spawn(move || r.consume(2, 2).0)
                })
                .collect();
            let used: u64 = consumers.into_iter().map(|c| c.join().unwrap()).sum();
            let filled = producer.join().unwrap();
            assert_eq!(filled, 4);
            assert!(r.index.is_valid());
            assert_eq!(filled, used + r.index.available(), "a page lost or handed out twice");
        });
    }

    #[test]
    fn loom_a_give_back_racing_the_producer_coming_round_counts_a_slot_twice_at_most() {
        // A full ring; a consumer takes two pages and gives them back unused while the producer
        // may already have refilled their slots (it saw them taken). The slots then count
        // twice: the ring's arithmetic must survive it (no underflow), and the second count
        // is a hole, which the taker of it skips in the engine (ENOENT, mincore).
        model(|| {
            let r = Arc::new(Ring::new(4));
            assert_eq!(r.fill(4, 1), 4);
            let consumer = {
                let r = r.clone();
                thread::spawn(move || r.consume(2, 0))
            };
            let producer = {
                let r = r.clone();
                thread::spawn(move || r.index.fill_begin(2).map(|(t, n)| r.index.fill_publish(t, n)))
            };
            consumer.join().unwrap();
            producer.join().unwrap();
            assert!(r.index.is_valid());
            // Whatever the order, the ring holds (or counts) at least its capacity: the
            // producer finds no free slot, its arithmetic not wrapped by the double count.
            assert_eq!(r.index.fill_begin(4), None);
        });
    }

    #[test]
    fn loom_takers_and_givers_back_share_the_ring_without_handing_a_page_out_twice() {
        model(|| {
            let r = Arc::new(Ring::new(4));
            assert_eq!(r.fill(4, 1), 4);
            let a = {
                let r = r.clone();
                thread::spawn(move || r.consume(3, 1))
            };
            let b = {
                let r = r.clone();
                thread::spawn(move || r.consume(2, 2))
            };
            let ((used_a, stranded_a), (used_b, stranded_b)) = (a.join().unwrap(), b.join().unwrap());
            assert!(r.index.is_valid());
            let left = r.index.available();
            assert_eq!(
                used_a + used_b + stranded_a + stranded_b + left,
                4,
                "a page lost or handed out twice"
            );
            // What is left is still populated (consume checks), and takeable in one run.
            assert_eq!(r.consume(4, 4), (left, 0));
        });
    }
}
