//! The engine: its userfaultfd, its threads, the state they share, and failing open.
//!
//! [`Engine`] owns the handler thread ([`crate::fault`]) and the scrub thread
//! ([`crate::pool::scrub`]); [`Shared`] is what they and every [`Region`] hold. Failing open
//! ([`Shared::handler_left`], [`Engine::stop_for_good`]) closes the userfaultfd: the kernel wakes every blocked fault and
//! serves all later ones. After a fork the child's copy is closed and forgotten
//! ([`Engine::forget_after_fork`]).
//!
//! Here: the API a program thread calls. The start (userfaultfd, doorbells, pools, staging
//! areas, threads) is `start.rs`; the program's life-cycle calls (fork, `mlockall`, pause and
//! resume around a change of rights, exit, drop) are `life.rs`; the errors, one type per
//! operation, `error.rs`; what it reports (pool levels, counters, options), `report.rs`.

use crate::memory::region::Region;
use crate::page::{bytes, page_start, pages};
use crate::pool::FillError;
use crate::state::Shared;
use crate::stats::Stats;
use crate::sys;
use crate::sys::mman::{self, PAGE_SIZE, PMD_SIZE};
use crate::sys::raw::Errno;
use crate::sys::thread::EngineThread;
use crate::sys::uffd::Uffd;
use crate::sys::uffd::{Features, UffdError};
use std::io;
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};

/// Ranges in a row found sparse and given back to their end after which the program's new mappings
/// are left to the kernel, all but one in as many (see [`Engine::leaves_mapping`]).
pub(crate) const SPARSE_BACKOFF: u32 = 8;
/// Mappings this large are never left to the kernel by the backoff (see
/// [`Engine::leaves_mapping`]).
const LEAVE_BELOW: usize = 64 << 20;

mod error;
mod life;
mod report;
mod start;

pub use error::{MapError, RecycleError, StartError};
pub use report::NodePool;

/// The engine: a userfaultfd, its handler thread, the pool and its scrub thread.
///
/// Dropping it stops both threads and closes the userfaultfd (regions still alive keep their
/// memory; the kernel serves their faults from then on).
#[derive(Debug)]
pub struct Engine {
    shared: Arc<Shared>,
    /// The engine's threads; empty while paused ([`Engine::pause`]).
    threads: Mutex<Threads>,
    /// Held by [`Engine::give_back`] from the stop to the last unmap: a second caller waits,
    /// then repeats its call with the mappings gone.
    giving_back: Mutex<()>,
}

/// The program's advice for some memory, as the kernel keeps it in the VMA's flags
/// ([`Engine::advice`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Advice {
    /// `MADV_HUGEPAGE`.
    pub huge: bool,
    /// `MADV_NOHUGEPAGE`.
    pub no_huge: bool,
    /// `MADV_RANDOM`.
    pub random: bool,
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
///
/// # Context
/// Any thread; reads the engine threads' registry, no lock.
pub fn in_engine_thread() -> bool {
    sys::thread::is_engine_thread()
}

/// Whether this process can open a userfaultfd, and with which features.
///
/// # Context
/// Any thread; opens and closes a userfaultfd.
pub fn probe() -> Result<Features, UffdError> {
    Uffd::open().map(|u| u.features())
}

impl Engine {
    /// Maps `len` bytes (rounded up to pages) of anonymous private memory, 2 MiB aligned,
    /// registered with the engine. `MADV_NOHUGEPAGE`: the kernel does not try a huge page of
    /// its own on each fault there (wasted on a registered range: docs/DESIGN.md, "Huge pages"); the engine still
    /// moves huge pages into its whole PMDs.
    ///
    /// With the engine failed open, returns plain memory that the kernel serves.
    ///
    /// # Context
    /// A program thread; maps memory, then takes the registration lock and the range table's write
    /// lock; the register ioctl may sleep on the mmap lock.
    pub fn map(&self, len: usize) -> Result<Region, MapError> {
        let len = len.max(1).next_multiple_of(PAGE_SIZE);
        let addr =
            mman::map_aligned(len, PMD_SIZE, libc::PROT_READ | libc::PROT_WRITE, false).map_err(MapError::Map)?;
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
            return Err(MapError::Register(e));
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
    ///
    /// # Context
    /// A program thread; as [`Engine::map`], without the mmap.
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<Region, MapError> {
        let addr = ptr as usize;
        if addr % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 || len == 0 {
            return Err(MapError::Unaligned { addr, len });
        }
        let id = self.shared.next_region.fetch_add(1, Relaxed);
        // SAFETY: this function's contract.
        unsafe { self.shared.register_range(addr, len, Some(id), false) }.map_err(MapError::Register)?;
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
    ///
    /// # Context
    /// A program thread; populates the pools (may sleep in reclaim), taking each ring's fill lock.
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
            self.shared.pool_may_fill.store(true, Release);
        }
        for p in &self.shared.pools {
            match p.fill_to(pages(bytes), &self.shared.stats, || false) {
                // A full node's pool stays as it is (its faults go to the next node's).
                Err(FillError::NodeFull) if p.node.is_some() => {}
                r => r?,
            }
        }
        Ok(())
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
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; as [`Engine::register`].
    pub unsafe fn adopt(&self, addr: usize, len: usize, fresh: bool) -> Result<(), MapError> {
        if addr % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 || len == 0 {
            return Err(MapError::Unaligned { addr, len });
        }
        // SAFETY: this function's contract.
        unsafe { self.shared.register_range(addr, len, None, fresh) }.map_err(MapError::Register)
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
    pub unsafe fn adopt_grown(&self, addr: usize, len: usize) -> Result<(), MapError> {
        if addr % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 || len == 0 {
            return Err(MapError::Unaligned { addr, len });
        }
        let _reg = self.shared.registration_lock();
        self.shared.ranges.insert(addr, pages(len), None);
        Ok(())
    }

    /// Hands `[addr, addr + len)` back to the kernel: unregistered and forgotten. Pages already
    /// there stay. For callers that must see the program's mappings as they would be without
    /// the engine (registration splits VMAs).
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes the registration lock and the range
    /// table's write lock; the unregister ioctl may sleep on the mmap lock.
    pub fn release(&self, addr: usize, len: usize) {
        let _reg = self.shared.registration_lock();
        let seq = self.shared.ranges.seq();
        self.shared.ranges.unmap(addr, addr + len, seq);
        let held = self.shared.uffd_here();
        let uffd = held.as_deref().and_then(Option::as_ref);
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
        let start = page_start(addr);
        let end = page_start(addr.saturating_add(len).saturating_add(PAGE_SIZE - 1));
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
        let page = page_start(addr);
        self.fill_claimed(page, page + PAGE_SIZE) == Some(1)
    }

    /// Installs zero pages in the part of `[addr, addr + len)` (whole pages of memory the
    /// engine serves) before its first whole PMD, from the calling thread: copies of the zero
    /// source (fault/grow.rs says why not pool pages). For the part a block just grew by (the
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
        let Some(installed) = self.fill_claimed(addr, crate::fault::grow::fill_end(addr, len)) else {
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

    /// The advice the program gave `[addr, addr + len)` (huge pages, random access), to give
    /// the same memory again where the program moves it ([`Engine::advise`]): the kernel keeps
    /// advice in the VMA's flags, which `mremap` moves and a growth in place extends.
    ///
    /// # Context
    /// A program thread, inside the shim's mremap hook, signals blocked; takes the range table's
    /// read lock.
    pub fn advice(&self, addr: usize, len: usize) -> Advice {
        let (huge, no_huge, random) = self.shared.ranges.advice(addr, addr.saturating_add(len));
        Advice { huge, no_huge, random }
    }

    /// Gives `[addr, addr + len)` the advice [`Engine::advice`] read elsewhere.
    ///
    /// # Context
    /// As [`Engine::set_huge`].
    pub fn advise(&self, addr: usize, len: usize, advice: Advice) {
        if advice.huge || advice.no_huge {
            self.set_huge(addr, len, advice.huge);
        }
        if advice.random {
            self.set_random(addr, len, true);
        }
    }

    /// The page tables of `[addr, addr + len)` as the kernel has them: memory an `mremap` just
    /// moved or grew (the move takes the old part's tables along, and the part grown into has
    /// none). A PMD where the pagemap shows pages holds a table; the others may take whole huge
    /// pages, as the kernel's faults would make them there. An empty table the pagemap cannot
    /// show costs one refused huge move. Unreadable pagemap: any PMD may hold a table.
    ///
    /// # Context
    /// A program thread, inside the shim's mremap hook, signals blocked; takes the range table's
    /// read lock; reads the pagemap (`PAGEMAP_SCAN`).
    pub fn tables_as_seen(&self, addr: usize, len: usize) {
        let end = addr.saturating_add(len);
        for r in self.shared.ranges.overlapping(addr, end) {
            let (a, b) = (addr.max(r.start), end.min(r.end()));
            r.pmds.clear_tables(a, b);
            if mman::populated_pmds(a, b - a, |x, n| r.pmds.mark_tables(x, n)).is_err() {
                r.pmds.mark_tables(a, b - a);
            }
        }
    }

    /// Copies zero pages into the pages of `[addr, end)` (clipped to its range) that this call
    /// claims, from the calling thread ([`crate::fault::grow::fill`]); what does not go in is released
    /// and faults as usual. Returns the pages there now of those claimed; `None` when there
    /// was nothing to fill (no served page in the span, or no descriptor).
    fn fill_claimed(&self, addr: usize, end: usize) -> Option<u64> {
        let r = self.shared.ranges.find(addr)?;
        let end = end.min(r.end());
        if addr % PAGE_SIZE != 0 || end <= addr {
            return None;
        }
        let held = self.shared.uffd_here();
        let uffd = held.as_deref().and_then(Option::as_ref);
        let u = uffd.as_ref()?;
        let mut runs = Vec::new();
        r.map.claim(r.page_of(addr), pages(end - addr), &mut runs);
        let mut installed = 0;
        for (first, n) in runs {
            let dst = r.addr_of(first);
            let done = crate::fault::grow::fill(&self.shared, u, dst, bytes(n));
            // 4 KiB pages went in: their PMD holds a page table now.
            r.pmds.mark_tables(dst, done);
            if done < bytes(n) {
                r.map.clear(first + pages(done), n - pages(done));
            }
            installed += pages(done);
        }
        Some(installed)
    }

    /// The engine's userfaultfd as its number and `(st_dev, st_ino)`: for a process that will
    /// share the memory (`clone(CLONE_VM)` without `CLONE_THREAD` or `CLONE_FILES`), which
    /// closes its copy first, so that this process's exit remains the last close.
    ///
    /// # Context
    /// Any thread; no lock.
    pub fn uffd_parts(&self) -> Option<(i32, (u64, u64))> {
        if self.shared.failed.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.shared.uffd_identity.as_ref().map(|id| id.parts())
    }

    /// Whether `fd` is the engine's own userfaultfd.
    ///
    /// # Context
    /// Any thread; no lock.
    pub fn is_own_uffd(&self, fd: i32) -> bool {
        self.shared.uffd_identity.as_ref().is_some_and(|id| id.is(fd))
    }

    /// The program's transparent-huge-page advice for `[addr, addr + len)`: `true` for
    /// `MADV_HUGEPAGE` (or new memory under THP `always`), `false` for `MADV_NOHUGEPAGE`. Where
    /// it is on, a write fault takes whole huge pages, as the kernel would give it.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes the range table's read lock and the
    /// loans lock.
    pub fn set_huge(&self, addr: usize, len: usize, on: bool) {
        let end = addr.saturating_add(len);
        self.shared.ranges.set_huge(addr, end, on);
        // MADV_NOHUGEPAGE: no huge page of the engine's either (as the kernel would make none).
        self.shared.ranges.set_never(addr, end, !on);
        self.shared.lending.advise(addr, end, on);
    }

    /// `[addr, addr + len)` carries no huge-page advice any more (a freed block handed out
    /// again): neither `MADV_HUGEPAGE` nor `MADV_NOHUGEPAGE`.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes the range table's read lock and the
    /// loans lock.
    pub fn forget_huge_advice(&self, addr: usize, len: usize) {
        let end = addr.saturating_add(len);
        self.shared.ranges.set_huge(addr, end, false);
        self.shared.ranges.set_never(addr, end, false);
        self.shared.lending.advise(addr, end, false);
    }

    /// `prctl(PR_SET_THP_DISABLE)`: `true`, the engine moves no huge page into the program's
    /// memory from now on (4 KiB pages only), as the kernel makes none; `false` undoes it.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; atomics only.
    pub fn set_thp_disabled(&self, on: bool) {
        self.shared.thp_disabled.store(on, Release);
    }

    /// Whether a new mapping of the program's is better left to the kernel: the last
    /// `SPARSE_BACKOFF` ranges were each found sparse and given back to their end
    /// (a program that maps, touches one page in 16 and unmaps, in a loop, paid a
    /// registration, two round trips and a hand-back a mapping, well over the kernel's cost:
    /// docs/DESIGN.md, "Sparse streams"). Now and then
    /// one is taken all the same, to look again: after `SPARSE_BACKOFF` left alone, then
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
    ///
    /// # Context
    /// Any thread; takes the range table's read lock.
    pub fn serves_any(&self, addr: usize, len: usize) -> bool {
        self.is_active() && self.shared.ranges.any(addr, addr.saturating_add(len))
    }

    /// The registered range holding `addr`, as (start, end), while the engine serves.
    ///
    /// # Context
    /// Any thread; takes the range table's read lock.
    pub fn range_of(&self, addr: usize) -> Option<(usize, usize)> {
        if !self.is_active() {
            return None;
        }
        self.shared.ranges.find(page_start(addr)).map(|r| (r.start, r.end()))
    }

    /// Whether `addr` lies in memory the engine serves.
    ///
    /// # Context
    /// Any thread; takes the range table's read lock.
    pub fn serves(&self, addr: usize) -> bool {
        self.is_active() && self.shared.ranges.find(page_start(addr)).is_some()
    }

    /// Moves the pages of `[src, src + len)` to `[dst, dst + len)` without copying
    /// (`UFFDIO_MOVE`, holes allowed: a hole in the source stays a hole at the destination).
    /// Both must be served by this engine, the destination must have no page yet, and both
    /// mappings must have the same protection and lock state. Returns the bytes moved before an
    /// error, or all of them.
    ///
    /// # Safety
    /// The caller owns both ranges; the source reads zero (it faults again) afterwards.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes the descriptor's read lock; the
    /// moves may sleep on the mmap lock.
    pub unsafe fn move_pages(&self, dst: usize, src: usize, len: usize) -> usize {
        let held = self.shared.uffd_here();
        let uffd = held.as_deref().and_then(Option::as_ref);
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
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; as `Shared::recycle` (`pool/recycle.rs`).
    pub unsafe fn recycle(&self, ptr: *mut u8, len: usize) -> Result<crate::Recycled, RecycleError> {
        let addr = ptr as usize;
        if addr % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 {
            return Err(RecycleError::Unaligned { addr, len });
        }
        if len == 0 {
            return Ok(crate::Recycled::default());
        }
        self.shared.recycle(addr, len).map_err(RecycleError::Discard)
    }

    /// False once the engine failed open (the kernel serves every fault).
    ///
    /// # Context
    /// Any thread; atomics only.
    pub fn is_active(&self) -> bool {
        !self.shared.failed.load(Acquire)
    }
}
