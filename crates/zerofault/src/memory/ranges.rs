//! The table of registered ranges ([`RangeTable`]): which addresses the engine serves, found by
//! address under a read lock, changed under the write lock (see `region.rs`'s module docs for
//! how events and registrations cross).

use crate::memory::pagemap::PageMap;
use crate::memory::pmds::PmdMap;
use crate::memory::region::Range;
use crate::page::{bytes, PAGE_SIZE, PMD_SIZE};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

#[derive(Debug, Default)]
struct Table {
    by_start: BTreeMap<usize, Arc<Range>>,
    seq: u64,
    next_id: u64,
    /// Spans of Regions' memory that left the table unregistered (handed back or lent to the
    /// kernel), as (owner, start, end): still the Region's, unmapped with it.
    left: Vec<(u64, usize, usize)>,
}

impl Table {
    /// The table's invariants: every range valid, keyed by its start, registered no later than
    /// the table's sequence number, and no two overlapping. O(ranges): debug builds only.
    fn is_valid(&self) -> bool {
        let mut prev_end = 0;
        self.by_start.iter().all(|(&start, r)| {
            let ok = r.is_valid() && r.start == start && r.seq <= self.seq && start >= prev_end;
            prev_end = r.end();
            ok
        })
    }

    fn new_range(&mut self, start: usize, map: PageMap, pmds: PmdMap, owner: Option<u64>) -> Arc<Range> {
        self.next_id += 1;
        self.seq += 1;
        let r = Arc::new(Range {
            id: self.next_id,
            seq: self.seq,
            start,
            pages: map.pages(),
            map,
            pmds,
            owner,
            misses: Mutex::default(),
            reads: Mutex::default(),
            handbacks: AtomicU32::new(0),
            own_advice: AtomicBool::new(false),
            loans: AtomicU32::new(0),
            starved: AtomicU32::new(0),
        });
        self.by_start.insert(start, r.clone());
        r
    }

    /// `[start, end)` is no longer in `left`: registered again, or unmapped or moved away by
    /// the program (an UNMAP or REMAP event covers the whole span of the call).
    fn trim_left(&mut self, start: usize, end: usize) {
        // Called for every UNMAP and REMAP event: most touch no span, and cost no copy.
        if !self.left.iter().any(|&(_, a, b)| a < end && start < b) {
            return;
        }
        let mut kept = Vec::with_capacity(self.left.len());
        for &(o, a, b) in &self.left {
            if a < end && start < b {
                if a < start {
                    kept.push((o, a, start));
                }
                if end < b {
                    kept.push((o, end, b));
                }
            } else {
                kept.push((o, a, b));
            }
        }
        self.left = kept;
    }

    /// Ranges overlapping `[start, end)` registered at or before `upto` (all when `None`).
    fn overlapping(&self, start: usize, end: usize, upto: Option<u64>) -> Vec<Arc<Range>> {
        let first = self
            .by_start
            .range(..start)
            .next_back()
            .map(|(k, _)| *k)
            .unwrap_or(start);
        self.by_start
            .range(first..end)
            .map(|(_, r)| r.clone())
            .filter(|r| r.end() > start && upto.is_none_or(|s| r.seq <= s))
            .collect()
    }

    /// Removes `[start, end)` from ranges registered at or before `upto`, keeping the pieces
    /// outside it (with their page states). Returns the page states cleared, and the cut pieces
    /// as (range they came from, first page, pages).
    fn cut(&mut self, start: usize, end: usize, upto: Option<u64>) -> (u64, Vec<(Arc<Range>, u64, u64)>) {
        let mut cleared = 0;
        let mut cut = vec![];
        for r in self.overlapping(start, end, upto) {
            self.by_start.remove(&r.start);
            let lo = r.page_of(start.max(r.start));
            let hi = r.page_of(end.min(r.end()));
            cleared += r.map.count_range(lo, hi - lo);
            let inherit = |p: Arc<Range>| {
                p.handbacks.store(r.handbacks.load(Relaxed), Relaxed);
                p.own_advice.store(r.own_advice.load(Relaxed), Relaxed);
                p.loans.store(r.loans.load(Relaxed), Relaxed);
            };
            if lo > 0 {
                inherit(self.new_range(r.start, r.map.slice(0, lo), r.pmds.slice(r.start, lo), r.owner));
            }
            if hi < r.pages {
                let at = r.addr_of(hi);
                let n = r.pages - hi;
                inherit(self.new_range(at, r.map.slice(hi, n), r.pmds.slice(at, n), r.owner));
            }
            cut.push((r, lo, hi - lo));
        }
        (cleared, cut)
    }
}

/// Write access to a [`Table`] that checks [`Table::is_valid`] when dropped (debug builds).
struct Checked<'a>(std::sync::RwLockWriteGuard<'a, Table>);

impl std::ops::Deref for Checked<'_> {
    type Target = Table;
    fn deref(&self) -> &Table {
        &self.0
    }
}

impl std::ops::DerefMut for Checked<'_> {
    fn deref_mut(&mut self) -> &mut Table {
        &mut self.0
    }
}

/// Up to how many ranges a debug build checks the whole table after each change: past it the
/// check would make a program registering tens of thousands of ranges quadratic (a test at
/// `vm.max_map_count`), and tables that large are checked by the tests of smaller ones.
const CHECKED_RANGES: usize = 2048;

impl Drop for Checked<'_> {
    fn drop(&mut self) {
        debug_assert!(
            std::thread::panicking() || self.0.by_start.len() > CHECKED_RANGES || self.0.is_valid(),
            "range table invalid: {:?}",
            *self.0
        );
    }
}

/// The engine's registered ranges.
#[derive(Debug, Default)]
pub(crate) struct RangeTable {
    inner: RwLock<Table>,
}

impl RangeTable {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The table for a change; in debug builds its invariants are checked when the change
    /// is done (the guard drops).
    fn write(&self) -> Checked<'_> {
        Checked(self.inner.write().unwrap_or_else(|e| e.into_inner()))
    }

    /// The range containing `addr`.
    ///
    /// # Context
    /// Any thread; takes the range table's read lock.
    pub(crate) fn find(&self, addr: usize) -> Option<Arc<Range>> {
        let t = self.read();
        let (_, r) = t.by_start.range(..=addr).next_back()?;
        (addr < r.end()).then(|| r.clone())
    }

    /// The ranges overlapping `[start, end)`, in address order.
    ///
    /// # Context
    /// Any thread; takes the range table's read lock.
    pub(crate) fn overlapping(&self, start: usize, end: usize) -> Vec<Arc<Range>> {
        self.read().overlapping(start, end, None)
    }

    /// The first range that ends after `addr`, as `(start, end)`: a walk over the table that
    /// allocates nothing (the exit's and a fail-open's unregistering, where the engine's
    /// allocator may have no memory left to give: at `vm.max_map_count`).
    ///
    /// # Context
    /// Any thread; takes the range table's read lock for the lookup only.
    pub(crate) fn next_span(&self, addr: usize) -> Option<(usize, usize)> {
        let t = self.read();
        if let Some((_, r)) = t.by_start.range(..=addr).next_back() {
            if r.end() > addr {
                return Some((r.start, r.end()));
            }
        }
        t.by_start
            .range(addr.saturating_add(1)..)
            .next()
            .map(|(_, r)| (r.start, r.end()))
    }

    /// Whether a range overlaps `[start, end)`.
    ///
    /// # Context
    /// Any thread; takes the range table's read lock.
    pub(crate) fn any(&self, start: usize, end: usize) -> bool {
        !self.read().overlapping(start, end, None).is_empty()
    }

    /// The current sequence number: note it before reading messages from the kernel.
    ///
    /// # Context
    /// Any thread; takes the range table's read lock.
    pub(crate) fn seq(&self) -> u64 {
        self.read().seq
    }

    /// Adds `[start, start + pages)`, replacing whatever stale ranges overlapped it.
    ///
    /// # Context
    /// A program thread registering a range, or a handler taking a loan back (`Handler::retake`);
    /// takes the range table's write lock; may map the new range's page and PMD maps (mmap).
    pub(crate) fn insert(&self, start: usize, pages: u64, owner: Option<u64>) -> Arc<Range> {
        let mut t = self.write();
        let end = start + bytes(pages);
        t.cut(start, end, None);
        // Registered again (a loan taken back): the table holds it, not `left`.
        t.trim_left(start, end);
        t.new_range(start, PageMap::new(pages), PmdMap::new(start, pages), owner)
    }

    /// UFFD_EVENT_REMOVE: the kernel dropped the pages of `[start, end)`. Returns page states
    /// cleared. A PMD the span cuts through (not whole) may hold a page table from now on: a
    /// huge page there was split.
    ///
    /// # Context
    /// A handler (a REMOVE event); takes the range table's read lock.
    pub(crate) fn forget(&self, start: usize, end: usize, upto: u64) -> u64 {
        let t = self.read();
        t.overlapping(start, end, Some(upto))
            .iter()
            .map(|r| {
                let (a, b) = (start.max(r.start), end.min(r.end()));
                if a % PMD_SIZE != 0 {
                    r.pmds.mark_tables(a, PAGE_SIZE);
                }
                if b % PMD_SIZE != 0 {
                    r.pmds.mark_tables(b - PAGE_SIZE, PAGE_SIZE);
                }
                let (lo, hi) = (r.page_of(a), r.page_of(b));
                r.map.clear(lo, hi - lo)
            })
            .sum()
    }

    /// The program's huge-page advice for `[start, end)` (see [`Range::set_huge`](crate::memory::region::Range::set_huge)).
    ///
    /// # Context
    /// A program thread (the madvise hook); takes the range table's read lock.
    pub(crate) fn set_huge(&self, start: usize, end: usize, on: bool) {
        for r in self.read().overlapping(start, end, None) {
            r.set_huge(start, end, on);
        }
    }

    /// See [`Range::set_never`].
    ///
    /// # Context
    /// A program thread (the madvise hook); takes the range table's read lock.
    pub(crate) fn set_never(&self, start: usize, end: usize, on: bool) {
        for r in self.read().overlapping(start, end, None) {
            r.set_never(start, end, on);
        }
    }

    /// The advice the program gave any PMD of `[start, end)`, as (`MADV_HUGEPAGE`,
    /// `MADV_NOHUGEPAGE`, `MADV_RANDOM`): what the kernel keeps in the VMA's flags, and moves
    /// with it (`mremap`).
    ///
    /// # Context
    /// A program thread (the mremap hook); takes the range table's read lock.
    pub(crate) fn advice(&self, start: usize, end: usize) -> (bool, bool, bool) {
        let mut got = (false, false, false);
        for r in self.read().overlapping(start, end, None) {
            let (a, b) = (start.max(r.start), end.min(r.end()));
            // Whole PMDs only: a PMD shared with a neighbour may carry the neighbour's advice.
            // A span with none has its first PMD's (the advice it was given, or a neighbour's:
            // nothing tells them apart there).
            let (lo, hi) = (a.next_multiple_of(PMD_SIZE), crate::page::pmd_start(b));
            let (lo, hi) = if lo < hi {
                (lo, hi)
            } else {
                (crate::page::pmd_start(a), crate::page::pmd_start(a) + PMD_SIZE)
            };
            for pmd in (lo..hi).step_by(PMD_SIZE) {
                got.0 |= r.pmds.wants_huge(pmd);
                got.1 |= r.pmds.no_huge(pmd);
                got.2 |= r.pmds.is_random(pmd);
            }
        }
        got
    }

    /// See [`Range::set_random`].
    ///
    /// # Context
    /// A program thread (the madvise hook); takes the range table's read lock.
    pub(crate) fn set_random(&self, start: usize, end: usize, on: bool) {
        for r in self.read().overlapping(start, end, None) {
            r.set_random(start, end, on);
        }
    }

    /// `[start, end)` is no longer registered (handed back to the kernel): cut from every range.
    /// What belonged to a Region is remembered, for its drop to unmap.
    ///
    /// # Context
    /// A handler (a hand-back, a loan); takes the range table's write lock, and may map the page
    /// maps of the pieces left (mmap) under it.
    pub(crate) fn drop_span(&self, start: usize, end: usize) {
        let mut t = self.write();
        let (_, pieces) = t.cut(start, end, None);
        for (r, first, n) in pieces {
            if let Some(owner) = r.owner {
                let a = r.addr_of(first);
                t.left.push((owner, a, a + bytes(n)));
            }
        }
    }

    /// UFFD_EVENT_UNMAP: `[start, end)` is gone. Returns page states cleared.
    ///
    /// # Context
    /// A handler (an UNMAP event) or a program thread (a release); takes the range table's write
    /// lock, under which the page maps of the ranges cut are unmapped (munmap).
    pub(crate) fn unmap(&self, start: usize, end: usize, upto: u64) -> u64 {
        let mut t = self.write();
        // A span that left the table inside the call went with it: a Region's drop must not
        // unmap whatever is mapped there later.
        t.trim_left(start, end);
        let (cleared, pieces) = t.cut(start, end, Some(upto));
        // The ranges cut go (their page maps unmapped) before the table is readable again:
        // one that reads the table empty finds their memory returned.
        drop(pieces);
        drop(t);
        cleared
    }

    /// UFFD_EVENT_REMAP: `len` bytes moved from `from` to `to`, page tables and registration
    /// with them. The destination becomes a range of its own, owned by nobody.
    ///
    /// # Context
    /// A handler (a REMAP event); takes the range table's write lock, and may map the moved range's
    /// page and PMD maps (mmap) under it.
    pub(crate) fn remap(&self, from: usize, to: usize, len: usize, upto: u64) {
        let mut t = self.write();
        t.trim_left(from, from + len);
        t.trim_left(to, to + len);
        let (_, pieces) = t.cut(from, from + len, Some(upto));
        t.cut(to, to + len, None);
        for (r, first, pages) in pieces {
            let dst = to + (r.addr_of(first) - from);
            // The kernel moved page tables and huge pages as it saw fit: tables are assumed
            // anywhere. Huge-page advice moves with the mapping (the VMA's flags go along).
            let pmds = r.pmds.moved(r.addr_of(first), pages, dst);
            t.new_range(dst, r.map.slice(first, pages), pmds, None);
        }
    }

    /// Removes one range (a registration that failed).
    ///
    /// # Context
    /// A program thread whose registration failed, or a handler whose take-back failed
    /// (`Handler::retake`); takes the range table's write lock.
    pub(crate) fn remove(&self, r: &Arc<Range>) {
        let mut t = self.write();
        if t.by_start.get(&r.start).is_some_and(|x| x.id == r.id) {
            t.by_start.remove(&r.start);
        }
    }

    /// `[start, end)` of `owner`'s memory is out of the table again (a take-back that failed).
    ///
    /// # Context
    /// A handler whose take-back failed (`Handler::retake`), holding the registration lock;
    /// takes the range table's write lock.
    pub(crate) fn leave(&self, owner: u64, start: usize, end: usize) {
        self.write().left.push((owner, start, end));
    }

    /// Removes and returns the spans of `owner`'s memory that left the table unregistered
    /// (see [`Table::left`]).
    ///
    /// # Context
    /// A program thread, a Region's drop, holding the registration lock; takes the range
    /// table's write lock.
    pub(crate) fn take_left(&self, owner: u64) -> Vec<(usize, usize)> {
        let mut t = self.write();
        let mine = t.left.iter().filter(|l| l.0 == owner).map(|l| (l.1, l.2)).collect();
        t.left.retain(|l| l.0 != owner);
        mine
    }

    /// Removes and returns every range of `owner`.
    ///
    /// # Context
    /// A program thread, a Region's drop, holding the registration lock; takes the range
    /// table's write lock.
    pub(crate) fn take_owned(&self, owner: u64) -> Vec<Arc<Range>> {
        let mut t = self.write();
        let mine: Vec<usize> = t
            .by_start
            .values()
            .filter(|r| r.owner == Some(owner))
            .map(|r| r.start)
            .collect();
        mine.iter().filter_map(|s| t.by_start.remove(s)).collect()
    }

    /// Every range, in address order (for tests and stats).
    ///
    /// # Context
    /// Any thread; takes the range table's read lock.
    pub(crate) fn ranges(&self) -> Vec<Arc<Range>> {
        self.read().by_start.values().cloned().collect()
    }
}
