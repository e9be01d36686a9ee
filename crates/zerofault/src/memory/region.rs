//! Registered ranges: which addresses the engine serves, their page-state maps, and the
//! [`Region`] handle a program holds.
//!
//! The table maps start addresses to [`Range`]s. It changes on `map` / `register`, on a Region's
//! drop, on hand-back, and on the kernel's events: REMOVE (madvise) only clears page states;
//! UNMAP cuts the range (a partial munmap splits it in two); REMAP moves the pages' states to a
//! new range at the destination, owned by nobody (the program moved that memory; it unmaps it
//! itself).
//!
//! Events and registrations can cross: a thread's munmap returns as soon as the handler *read*
//! the UNMAP message, so the program may map and register the same addresses before the handler
//! *applied* it. Every range carries the table's sequence number at its registration, and an
//! event applies only to ranges registered before the handler read it.

use crate::memory::pagemap::PageMap;
use crate::memory::pmds::PmdMap;
use crate::page::{bytes, index, pages, pmd_start, PAGE_SIZE, PMD_SIZE};
use crate::sys::mman;
use crate::Shared;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// One registered, contiguous range of pages.
#[derive(Debug)]
pub(crate) struct Range {
    /// Unique for the engine's life; keys the handler's per-thread predictors.
    pub(crate) id: u64,
    /// Table sequence number at registration.
    pub(crate) seq: u64,
    pub(crate) start: usize,
    pub(crate) pages: u64,
    pub(crate) map: PageMap,
    /// Which of its PMDs may hold page tables, and which the program wants huge pages in
    /// ([`PmdMap`]).
    pub(crate) pmds: PmdMap,
    /// The Region that maps and unmaps this memory, if any.
    pub(crate) owner: Option<u64>,
    /// Unpredicted faults in a row (for hand-back).
    pub(crate) misses: Mutex<MissRun>,
    /// Spans handed back from this range or the range it was cut from: after one, a range whose
    /// faults miss again goes back to the kernel whole (its access is sparse throughout, a
    /// strided touch of a huge reservation, say).
    pub(crate) handbacks: AtomicU32,
    /// The engine chose this memory's huge-page advice (`MADV_NOHUGEPAGE` on an
    /// [`crate::Engine::map`] region), not the program: lent to the kernel, it is advised
    /// `MADV_HUGEPAGE` for the loan (see [`crate::fault::handback`]).
    pub(crate) own_advice: AtomicBool,
    /// Loans to the kernel this memory came back from (each next loan lasts twice as long).
    pub(crate) loans: AtomicU32,
    /// Write windows of a PMD or more in a row that the huge ring could not fill
    /// ([`crate::fault::lend::Lending::starved`]).
    pub(crate) starved: AtomicU32,
    /// Whether the program writes what it reads here (`fault/reads.rs`).
    pub(crate) reads: Mutex<Reads>,
}

/// Unpredicted faults in a row in one range, and where they fell: the hand-back's count
/// (`fault/handback.rs` keeps it and says when the run goes back to the kernel).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MissRun {
    pub(crate) count: u64,
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    /// The run's last miss, the thread that made its first, and whether every miss of the run
    /// was that thread's and fell far from the one before.
    pub(crate) last: u64,
    pub(crate) tid: u32,
    pub(crate) scattered: bool,
}

/// What one recycle did, in pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recycled {
    /// Pages moved into the pool, to come back zeroed.
    pub pages: u64,
    /// Of those, in whole 2 MiB huge pages.
    pub huge_pages: u64,
    /// Pages the engine had installed that were discarded instead: a move refused (pages
    /// shared with a forked child, an mlocked range) or the pool full.
    pub discarded: u64,
}

/// What reads before writes showed in one range (`fault/reads.rs`): the sample pages of each
/// reading thread's last read window, and the verdict of the last look at any of them.
#[derive(Debug, Default)]
pub(crate) struct Reads {
    pub(crate) slots: [ReadSamples; READ_SLOTS],
    pub(crate) verdict: ReadVerdict,
    /// Windows sampled so far (orders the slots: the oldest is replaced).
    pub(crate) clock: u64,
}

/// Threads whose samples a range keeps at once.
pub(crate) const READ_SLOTS: usize = 4;

/// One thread's samples: `pages` pages from `first` left on the zero page (0: none).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReadSamples {
    pub(crate) tid: u32,
    pub(crate) first: usize,
    pub(crate) pages: usize,
    /// They belong to a window served from the pool (they count for the stats).
    pub(crate) pool: bool,
    pub(crate) stamp: u64,
}

/// See [`Reads`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ReadVerdict {
    /// Not looked yet: the zero page.
    #[default]
    Unknown,
    /// Samples were written: pool pages.
    Writes,
    /// Samples stayed the zero page: the zero page.
    OnlyReads,
}

impl Range {
    /// The range's invariants (checked in debug builds after each change of the table, as
    /// mimalloc checks `mi_page_is_valid`): page aligned and not empty, inside the address
    /// space, its page map exactly its pages and its PMD map exactly the PMDs it overlaps.
    ///
    /// # Context
    /// Any thread, in debug checks.
    pub(crate) fn is_valid(&self) -> bool {
        self.start % PAGE_SIZE == 0
            && self.pages > 0
            && index(self.pages)
                .checked_mul(PAGE_SIZE)
                .and_then(|b| self.start.checked_add(b))
                .is_some()
            && self.map.pages() == self.pages
            && self.pmds.covers(self.start, self.pages)
    }

    /// # Context
    /// Any thread; arithmetic only.
    pub(crate) fn end(&self) -> usize {
        self.start + bytes(self.pages)
    }

    /// Page index of an address inside the range.
    ///
    /// # Context
    /// Any thread; arithmetic only.
    pub(crate) fn page_of(&self, addr: usize) -> u64 {
        pages(addr - self.start)
    }

    /// # Context
    /// Any thread; arithmetic only.
    pub(crate) fn addr_of(&self, page: u64) -> usize {
        self.start + bytes(page)
    }

    /// Sets or clears the `huge` bits of the PMDs inside both the range and `[addr, end)`.
    ///
    /// # Context
    /// A program thread (the madvise hook) or a handler (a lend); atomics only.
    pub(crate) fn set_huge(&self, addr: usize, end: usize, on: bool) {
        let a = addr.max(self.start).next_multiple_of(PMD_SIZE);
        let b = pmd_start(end.min(self.end()));
        if a < b {
            self.pmds.set_huge(a, b, on);
        }
    }

    /// Sets or clears `MADV_NOHUGEPAGE` on the PMDs `[addr, end)` touches in the range.
    ///
    /// # Context
    /// A program thread (the madvise hook); atomics only.
    pub(crate) fn set_never(&self, addr: usize, end: usize, on: bool) {
        let (a, b) = (addr.max(self.start), end.min(self.end()));
        if a < b {
            self.pmds.set_never(a, b, on);
        }
    }

    /// Sets or clears `MADV_RANDOM` on the PMDs `[addr, end)` touches in the range.
    ///
    /// # Context
    /// A program thread (the madvise hook); atomics only.
    pub(crate) fn set_random(&self, addr: usize, end: usize, on: bool) {
        let (a, b) = (addr.max(self.start), end.min(self.end()));
        if a < b {
            self.pmds.set_random(a, b, on);
        }
    }

    /// Whether the PMD at `addr` may take a huge page of the engine's where the kernel's own
    /// fault would take one: not advised against (`MADV_NOHUGEPAGE`), and advised for
    /// (`MADV_HUGEPAGE`) unless the system's THP mode is `always` (`thp_always`). Memory of
    /// an [`crate::Engine::map`] region (an owner, or advice the engine chose) takes them
    /// wherever THP is not `never`: the caller asked the engine for it, not the kernel. Under
    /// THP `madvise` a program's plain mapping gets none, as natively (a fork's copy-on-write
    /// of a huge page copies 2 MiB: services that keep THP to `madvise` for that reason keep
    /// their 4 KiB pages).
    ///
    /// # Context
    /// A handler; atomics only.
    pub(crate) fn may_take_huge(&self, addr: usize, thp_always: bool) -> bool {
        !self.pmds.no_huge(addr) && (self.huge_by_default(thp_always) || self.pmds.wants_huge(addr))
    }

    /// Whether a PMD of this range with no advice of the program's may take huge pages (see
    /// [`Range::may_take_huge`]).
    ///
    /// # Context
    /// A handler; atomics only.
    pub(crate) fn huge_by_default(&self, thp_always: bool) -> bool {
        thp_always || self.owner.is_some() || self.own_advice.load(Relaxed)
    }

    /// Whether the fault at `addr` came with its PMD empty and may take a huge page: the PMD
    /// wants huge pages and lies wholly inside the range.
    ///
    /// # Context
    /// A handler; atomics only.
    pub(crate) fn huge_fault(&self, addr: usize) -> bool {
        let pmd = pmd_start(addr);
        pmd >= self.start && pmd + PMD_SIZE <= self.end() && self.pmds.wants_huge(addr)
    }
}

/// Anonymous memory served by the engine.
///
/// From [`crate::Engine::map`] (the engine mapped it and unmaps it on drop) or
/// [`crate::Engine::register`] (the caller owns the mapping; drop only unregisters it).
/// After the engine is gone, or once it failed open, the memory stays valid and the kernel
/// serves its faults.
#[derive(Debug)]
pub struct Region {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: u64,
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) owned: bool,
}

// Send and Sync come with the fields (an address range and an Arc of the shared state); a
// test below keeps it so.

impl Region {
    /// First byte.
    ///
    /// # Context
    /// The Region's owner.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// Length in bytes.
    ///
    /// # Context
    /// The Region's owner.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes (never, for a region the engine made).
    ///
    /// # Context
    /// The Region's owner.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory as a byte slice. Touching it takes the faults the engine serves.
    ///
    /// # Context
    /// The Region's owner.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: [addr, addr + len) is a live read-write anonymous mapping that this Region
        // owns (or the caller of `register` promised to keep mapped while it lives), and
        // &mut self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }

    /// The memory as a shared slice. Reading untouched pages maps the zero page.
    ///
    /// # Context
    /// The Region's owner.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as for `as_mut_slice`; shared access through &self.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    fn check(&self, offset: usize, len: usize) -> std::io::Result<(usize, usize)> {
        if offset % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 || offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "offset and len must be page aligned and inside the region",
            ));
        }
        Ok((self.addr + offset, len))
    }

    /// Gives pages back to the kernel (`MADV_DONTNEED`); touched again they read zero, served
    /// by the engine again.
    ///
    /// # Context
    /// The Region's owner; `MADV_DONTNEED`, whose REMOVE event a handler reads.
    pub fn discard(&mut self, offset: usize, len: usize) -> std::io::Result<()> {
        let (addr, len) = self.check(offset, len)?;
        // SAFETY: inside the region (checked), which `&mut self` holds alone; discarding its
        // pages is what the caller asked for.
        unsafe { mman::madvise(addr, len, mman::MADV_DONTNEED) }
    }

    /// Discards `[offset, offset + len)` of the region like [`Region::discard`], keeping its
    /// pages for the pool (see [`crate::Engine::recycle`]): touched again, the range reads zero
    /// and is served by the engine, possibly with these very pages, zeroed.
    ///
    /// # Context
    /// The Region's owner; as [`crate::Engine::recycle`].
    pub fn recycle(&mut self, offset: usize, len: usize) -> std::io::Result<crate::Recycled> {
        let (addr, len) = self.check(offset, len)?;
        self.shared.recycle(addr, len)
    }

    /// Unmaps part of the region and maps fresh anonymous memory in its place, registered
    /// again: what an allocator does when it returns memory and gets the same addresses back.
    /// The engine sees UNMAP and serves the new pages afresh (they read zero).
    ///
    /// # Context
    /// The Region's owner.
    pub fn replace(&mut self, offset: usize, len: usize) -> std::io::Result<()> {
        let (addr, len) = self.check(offset, len)?;
        // SAFETY: inside the region (checked), which `&mut self` holds alone; replacing its
        // pages with fresh ones is what the caller asked for, and the fresh mapping is
        // registered with this engine again.
        unsafe {
            mman::map_fixed(addr, len)?;
            let _ = mman::madvise(addr, len, mman::MADV_NOHUGEPAGE);
            self.shared.register_range(addr, len, Some(self.id), true)?;
        }
        if let Some(r) = self.shared.ranges.find(addr) {
            r.own_advice.store(true, Relaxed);
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // A loan of this region's memory ends with it: nothing may register these addresses
        // again once they are unmapped. Under `reg`, which a lend and a take-back hold from
        // their check to their change of the table: a range lent or taken back before this is
        // in `left` or in the table below, and none after.
        let (pieces, left) = {
            let _reg = self.shared.registration_lock();
            self.shared.lending.forget(self.id, &self.shared.stats);
            (
                self.shared.ranges.take_owned(self.id),
                self.shared.ranges.take_left(self.id),
            )
        };
        let held = self.shared.uffd_here();
        let uffd = held.as_deref().and_then(Option::as_ref);
        if self.owned {
            // Unregister first: after it, munmap raises no UNMAP event for our handler to wait
            // on. Pieces the program unmapped itself are no longer in the table, and what it
            // moved elsewhere with mremap is no longer here: only the pieces in the table go,
            // and the spans handed back or lent to the kernel, which left the table but are
            // the region's all the same (else they would stay mapped for good).
            for r in &pieces {
                if let Some(u) = uffd.as_ref() {
                    let _ = u.unregister(r.start, r.end() - r.start);
                }
                // SAFETY: the engine mapped this Region (`owned`), and the Region is dropped.
                let _ = unsafe { mman::unmap(r.start, r.end() - r.start) };
            }
            for (a, b) in left {
                // SAFETY: as above: the region's, unregistered when it left the table.
                let _ = unsafe { mman::unmap(a, b - a) };
            }
        } else if let Some(u) = uffd.as_ref() {
            for r in &pieces {
                let _ = u.unregister(r.start, r.end() - r.start);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::ranges::RangeTable;

    #[test]
    fn spans_that_left_the_table_are_the_owners_until_unmapped_moved_or_registered_again() {
        const M: usize = PMD_SIZE;
        let t = RangeTable::default();
        t.insert(100 * M, pages(10 * M), Some(7));
        t.insert(200 * M, pages(10 * M), None);
        t.drop_span(102 * M, 104 * M); // Region 7's
        t.drop_span(106 * M, 108 * M);
        // Nobody's: not remembered.
        t.drop_span(202 * M, 204 * M);
        // A take-back registers part of one again.
        t.insert(103 * M, pages(M), Some(7));
        // The program unmaps part of the other (its UNMAP event covers the call's span).
        t.unmap(107 * M, 120 * M, u64::MAX);
        assert_eq!(t.take_left(7), [(102 * M, 103 * M), (106 * M, 107 * M)]);
        assert!(t.take_left(7).is_empty(), "taken once");
        // Moved away with mremap: gone from the source.
        t.insert(300 * M, pages(4 * M), Some(8));
        t.drop_span(300 * M, 302 * M);
        t.remap(301 * M, 400 * M, M, u64::MAX);
        assert_eq!(t.take_left(8), [(300 * M, 301 * M)]);
    }

    #[test]
    fn a_region_may_be_sent_and_shared_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Region>();
    }

    const P: u64 = crate::page::PMD_PAGES;

    /// Which PMD bits of the range at `start` are set, by PMD index.
    fn tables_at(t: &RangeTable, start: usize) -> Vec<bool> {
        let r = t.find(start).unwrap();
        assert_eq!(r.start, start);
        (0..index(r.pmds.len()))
            .map(|i| r.pmds.has_table((start / PMD_SIZE + i) * PMD_SIZE))
            .collect()
    }

    #[test]
    fn pmd_bits_follow_addresses_through_removes_and_cuts() {
        let t = RangeTable::default();
        // 5 PMDs' worth of pages, starting one page into a PMD: it overlaps 6 PMDs.
        let base = 64 * PMD_SIZE;
        let start = base + PAGE_SIZE;
        let r = t.insert(start, 5 * P, None);
        assert_eq!(r.pmds.len(), 6);
        assert!(!r.pmds.has_table(base + 3 * PMD_SIZE));
        r.pmds.mark_tables(base + 3 * PMD_SIZE - PAGE_SIZE, 2 * PAGE_SIZE); // straddles PMDs 2 and 3
        assert_eq!(tables_at(&t, start), [false, false, true, true, false, false]);

        // A REMOVE of whole PMD 1 sets nothing; one ending inside PMD 4 sets PMD 4.
        t.forget(base + PMD_SIZE, base + 2 * PMD_SIZE, u64::MAX);
        assert_eq!(tables_at(&t, start), [false, false, true, true, false, false]);
        t.forget(base + 4 * PMD_SIZE, base + 4 * PMD_SIZE + 8 * PAGE_SIZE, u64::MAX);
        assert_eq!(tables_at(&t, start), [false, false, true, true, true, false]);

        // munmap of PMD 1 leaves two ranges whose bits keep their addresses.
        t.unmap(base + PMD_SIZE, base + 2 * PMD_SIZE, u64::MAX);
        assert_eq!(tables_at(&t, start), [false]);
        assert_eq!(tables_at(&t, base + 2 * PMD_SIZE), [true, true, true, false]);

        // mremap: the kernel moved page tables as it saw fit, so every bit is set there.
        let to = 128 * PMD_SIZE;
        t.remap(base + 2 * PMD_SIZE, to, 2 * PMD_SIZE, u64::MAX);
        assert_eq!(tables_at(&t, to), [true, true]);
        assert_eq!(tables_at(&t, base + 4 * PMD_SIZE), [true, false]);
    }

    /// Engine metadata of every range of the table, in bytes beyond the structs.
    fn metadata(t: &RangeTable) -> usize {
        t.ranges()
            .iter()
            .map(|r| r.map.metadata_bytes() + r.pmds.metadata_bytes())
            .sum()
    }

    #[test]
    fn a_16_tib_range_is_cut_and_moved_at_the_cost_of_what_is_touched() {
        const GIB: usize = 1 << 30;
        let clock = std::time::Instant::now();
        let t = RangeTable::default();
        let start = 1usize << 45; // no memory behind it: the table only keeps addresses
        let pages = 1u64 << 32; // 16 TiB
        let r = t.insert(start, pages, None);
        let end = r.end();
        // 1 GiB touched 4 GiB in, a few pages at both ends.
        let (touched, touched_pages) = (start + 4 * GIB, crate::page::pages(GIB));
        r.map.set(r.page_of(touched), touched_pages);
        r.pmds.mark_tables(touched, GIB);
        r.map.set(0, 10);
        r.pmds.mark_tables(start, 10 * PAGE_SIZE);
        r.map.set(pages - 7, 7);
        r.pmds.mark_tables(end - 7 * PAGE_SIZE, 7 * PAGE_SIZE);
        assert_eq!(r.map.count(), touched_pages + 17);
        let meta = metadata(&t);
        assert!(meta < 2 << 20, "{meta} bytes for 16 TiB with 1 GiB touched");
        drop(r);

        // munmap of 1 TiB from the middle of the touched GiB.
        let (cut_lo, cut_hi) = (touched + GIB / 2, touched + GIB / 2 + 1024 * GIB);
        assert_eq!(t.unmap(cut_lo, cut_hi, u64::MAX), touched_pages / 2);
        let head = t.find(start).unwrap();
        let tail = t.find(cut_hi).unwrap();
        assert_eq!(
            (head.start, head.end(), tail.start, tail.end()),
            (start, cut_lo, cut_hi, end)
        );
        assert_eq!(head.map.count(), 10 + touched_pages / 2);
        assert_eq!(tail.map.count(), 7);
        assert!(
            head.map.is_claimed(head.page_of(cut_lo - PAGE_SIZE)) && !head.map.is_claimed(head.page_of(touched) - 1)
        );
        assert!(tail.map.is_claimed(tail.pages - 7) && !tail.map.is_claimed(tail.pages - 8));
        assert!(head.pmds.has_table(start) && !head.pmds.has_table(start + PMD_SIZE));
        assert!(head.pmds.has_table(touched) && !head.pmds.has_table(touched - PMD_SIZE));
        assert!(tail.pmds.has_table(end - PAGE_SIZE) && !tail.pmds.has_table(end - PMD_SIZE - PAGE_SIZE));
        assert_eq!(tail.pmds.tables_count(), 1);
        drop((head, tail));

        // mremap of 512 MiB holding a quarter of the touched GiB elsewhere: its bits go with it.
        let (from, len, to) = (touched - GIB / 4, GIB / 2, 1usize << 46);
        t.remap(from, to, len, u64::MAX);
        let moved = t.find(to).unwrap();
        assert_eq!((moved.start, moved.end(), moved.owner), (to, to + len, None));
        assert_eq!(moved.map.count(), touched_pages / 4);
        assert!(moved.map.is_claimed(moved.page_of(to + GIB / 4)));
        assert!(!moved.map.is_claimed(moved.page_of(to + GIB / 4) - 1));
        assert_eq!(moved.pmds.tables_count(), moved.pmds.len(), "tables assumed anywhere");
        let head = t.find(start).unwrap();
        assert_eq!((head.end(), head.map.count()), (from, 10));
        let between = t.find(from + len).unwrap();
        assert_eq!((between.start, between.end()), (from + len, cut_lo));
        assert_eq!(between.map.count(), touched_pages / 4);
        drop((moved, head, between));
        assert_eq!(t.ranges().len(), 4);

        let meta = metadata(&t);
        assert!(meta < 4 << 20, "{meta} bytes after the cut and the move");
        assert!(clock.elapsed().as_millis() < 2000, "took {:?}", clock.elapsed());
    }
}
