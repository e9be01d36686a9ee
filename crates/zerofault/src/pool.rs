//! The pre-zeroed page pool (seeds 002/003): pages allocated and zeroed ahead of need, handed to
//! the fault handler in contiguous runs and moved (not copied) into the faulting region.
//!
//! ## Shape
//! A ring of pages over one reserved anonymous area of `pool_max` bytes (2 MiB aligned,
//! `MADV_NOHUGEPAGE`, `MADV_DONTFORK`). Two monotonic counters index it, in pages:
//! - `tail`: pages populated so far. Only the producer (the scrub thread, or a prefill, one at a
//!   time under `fill_lock`) advances it, after `MADV_POPULATE_WRITE` has made the pages
//!   present and zero.
//! - `head`: pages handed out so far. Consumers (fault handlers) advance it with a CAS.
//!
//! `tail - head` pages are ready. A consumer takes a run `[head, head + n)`, never crossing the
//! ring's end, so a run is contiguous in memory and moves with one ioctl. The pages it moves
//! leave holes behind; the producer populates the holes again when `tail` comes round.
//!
//! ## Why 4 KiB pages, and why not registered
//! Moving a 4 KiB page out of a PMD-mapped huge page splits it (~620 µs for the first page,
//! shared/notes/uffd-facts.md), so the pool is `MADV_NOHUGEPAGE`. It is not registered with the
//! userfaultfd: populating a registered range would fault into our own handler. (Recycling pages
//! back into the pool, a later step, moves pages *into* the pool and will need its own
//! registered area.)
//!
//! `MADV_DONTFORK`: a child would share the pool pages copy-on-write, and shared pages cannot be
//! moved (EBUSY) until written again; the child does not need the pool at all.
//!
//! ## Orderings
//! `tail` is stored with Release after the populate syscall returned, and loaded with Acquire
//! by consumers, so a consumer that sees a page as ready runs its move after the populate.
//! `head` moves by CAS (AcqRel): the producer loads it with Acquire before reusing ring slots,
//! so it never repopulates a slot before its consumer took it.

use crate::stats::Stats;
use crate::sys::mman::{self, PAGE_SIZE, PMD_SIZE};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;

/// Pages populated per producer step: one PMD, so that consumers see pages appear every ~0.6 ms
/// instead of after a whole refill.
pub const FILL_CHUNK_PAGES: u64 = (PMD_SIZE / PAGE_SIZE) as u64;

/// A contiguous run of ready pages taken from the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub addr: usize,
    pub pages: u64,
    /// The ring index of the run's first page.
    index: u64,
}

/// Pads a hot atomic to its own cache line pair (128 bytes: adjacent-line prefetch).
#[repr(align(128))]
#[derive(Debug, Default)]
struct CachePadded<T>(T);

#[derive(Debug)]
pub struct Pool {
    base: usize,
    pages: u64,
    head: CachePadded<AtomicU64>,
    tail: CachePadded<AtomicU64>,
    fill_lock: Mutex<()>,
}

impl Pool {
    /// Reserves `bytes` (rounded up to 2 MiB) of address space; nothing is populated yet.
    pub fn new(bytes: usize) -> io::Result<Pool> {
        let len = bytes.max(PMD_SIZE).next_multiple_of(PMD_SIZE);
        let base = mman::map_aligned(len, PMD_SIZE, libc::PROT_READ | libc::PROT_WRITE, true)?;
        let advise =
            mman::madvise(base, len, mman::MADV_NOHUGEPAGE).and_then(|_| mman::madvise(base, len, mman::MADV_DONTFORK));
        if let Err(e) = advise {
            let _ = mman::unmap(base, len);
            return Err(e);
        }
        Ok(Pool {
            base,
            pages: (len / PAGE_SIZE) as u64,
            head: CachePadded::default(),
            tail: CachePadded::default(),
            fill_lock: Mutex::new(()),
        })
    }

    /// Capacity in pages.
    pub fn capacity(&self) -> u64 {
        self.pages
    }

    /// Pages ready to be taken.
    pub fn available(&self) -> u64 {
        let t = self.tail.0.load(Acquire);
        t - self.head.0.load(Acquire).min(t)
    }

    /// Takes up to `want` ready pages as one contiguous run; `None` when the pool is empty.
    pub fn take(&self, want: u64) -> Option<Run> {
        let mut h = self.head.0.load(Acquire);
        loop {
            let t = self.tail.0.load(Acquire);
            if h >= t || want == 0 {
                return None;
            }
            let to_ring_end = self.pages - h % self.pages;
            let n = want.min(t - h).min(to_ring_end);
            match self.head.0.compare_exchange_weak(h, h + n, AcqRel, Acquire) {
                Ok(_) => {
                    return Some(Run {
                        addr: self.base + (h % self.pages) as usize * PAGE_SIZE,
                        pages: n,
                        index: h,
                    })
                }
                Err(now) => h = now,
            }
        }
    }

    /// Gives back the last `unused` pages of `run` if nobody took pages after it; otherwise they
    /// stay where they are, populated, and the producer finds them present when it comes round.
    pub fn untake(&self, run: Run, unused: u64) {
        let end = run.index + run.pages;
        let _ = self
            .head
            .0
            .compare_exchange(end, end - unused.min(run.pages), AcqRel, Relaxed);
    }

    /// Producer step: populates up to `max_pages` (at most one chunk, never crossing the ring's
    /// end) and publishes them. Returns the pages added; 0 when the pool is full.
    pub fn fill_step(&self, max_pages: u64, stats: &Stats) -> io::Result<u64> {
        let _producer = self.fill_lock.lock().unwrap_or_else(|e| e.into_inner());
        let t = self.tail.0.load(Relaxed);
        let h = self.head.0.load(Acquire);
        let free = self.pages - (t - h.min(t));
        let to_ring_end = self.pages - t % self.pages;
        let n = max_pages.min(free).min(to_ring_end).min(FILL_CHUNK_PAGES);
        if n == 0 {
            return Ok(0);
        }
        let addr = self.base + (t % self.pages) as usize * PAGE_SIZE;
        mman::populate_write(addr, n as usize * PAGE_SIZE)?;
        self.tail.0.store(t + n, Release);
        Stats::add(&stats.pool_refills, 1);
        Stats::add(&stats.pool_pages_filled, n);
        Ok(n)
    }

    /// Populates until `target` pages are ready (capped at capacity), on the calling thread.
    pub fn fill_to(&self, target: u64, stats: &Stats, stop: impl Fn() -> bool) -> io::Result<()> {
        let target = target.min(self.pages);
        while !stop() {
            let have = self.available();
            if have >= target || self.fill_step(target - have, stats)? == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Whether `addr` (a page of a run) is still populated: tells a source hole from a
    /// destination problem when a move reports ENOENT.
    pub fn is_populated(&self, addr: usize) -> bool {
        mman::resident_pages(addr, PAGE_SIZE).map(|n| n == 1).unwrap_or(false)
    }
}

impl Pool {
    /// Frees every pool page (the engine is going away; the address space stays reserved
    /// until the last region lets go of the shared state).
    pub fn release_all(&self) {
        let _producer = self.fill_lock.lock().unwrap_or_else(|e| e.into_inner());
        let _ = mman::madvise(self.base, self.pages as usize * PAGE_SIZE, mman::MADV_DONTNEED);
        self.head.0.store(self.tail.0.load(Acquire), Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = mman::unmap(self.base, self.pages as usize * PAGE_SIZE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_contiguous_and_never_cross_the_ring_end() {
        let stats = Stats::default();
        let p = Pool::new(PMD_SIZE).unwrap(); // 512 pages
        assert_eq!(p.take(1), None);
        p.fill_to(512, &stats, || false).unwrap();
        assert_eq!(p.available(), 512);
        let a = p.take(500).unwrap();
        assert_eq!((a.addr, a.pages), (p.base, 500));
        // Populated and zero.
        // SAFETY: the run lies inside the pool mapping, populated and not yet moved out.
        let first = unsafe { std::slice::from_raw_parts(a.addr as *const u8, PAGE_SIZE) };
        assert!(crate::zero::is_zero(first));
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
        let p = Pool::new(PMD_SIZE).unwrap();
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
        let p = std::sync::Arc::new(Pool::new(4 * PMD_SIZE).unwrap());
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
}
