//! What each range knows of its PMDs: one bit per PMD for "may hold a page table" (a huge
//! page moved into a table would be split), and the program's huge-page and access advice
//! (see `fault/huge.rs` for what the handler does with them).

use crate::memory::pagemap::PageMap;
use crate::page::{bytes, pmd_start, PMD_SIZE};

/// The bits of each PMD a range overlaps (see the module doc), indexed from the range's first
/// PMD.
#[derive(Debug)]
pub(crate) struct PmdMap {
    /// The first PMD's index in the address space (`start / PMD_SIZE`).
    base: usize,
    /// Set: the PMD may hold a page table. Cleared only for whole PMDs a recycle emptied with
    /// MADV_DONTNEED, on kernels that free an emptied table then (`mman::pt_reclaim`, probed).
    tables: PageMap,
    /// Set: the program asked for huge pages there.
    huge: PageMap,
    /// Set: the program asked for none there (`MADV_NOHUGEPAGE`): 4 KiB pages only.
    never: PageMap,
    /// Set: the program advised random access there (`MADV_RANDOM`): its reads map the zero
    /// page (fault/reads.rs).
    random: PageMap,
}

/// PMDs overlapped by `pages` pages from `start`.
///
/// # Context
/// Any thread; arithmetic only.
pub(crate) fn pmds_overlapped(start: usize, pages: u64) -> u64 {
    let end = start + bytes(pages.max(1));
    ((end - 1) / PMD_SIZE - start / PMD_SIZE + 1) as u64
}

impl PmdMap {
    /// No table, no advice, for the PMDs of `pages` pages from `start`.
    ///
    /// # Context
    /// The thread registering the range.
    pub(crate) fn new(start: usize, pages: u64) -> PmdMap {
        let n = pmds_overlapped(start, pages);
        PmdMap {
            base: start / PMD_SIZE,
            tables: PageMap::new(n),
            huge: PageMap::new(n),
            never: PageMap::new(n),
            random: PageMap::new(n),
        }
    }

    /// Index of the PMD holding `addr`.
    fn index(&self, addr: usize) -> u64 {
        (addr / PMD_SIZE - self.base) as u64
    }

    /// PMDs covered.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.tables.pages()
    }

    /// The part for a piece of the range starting at `start` of `pages` pages; the huge-page
    /// advice goes along, and the table bits too unless `tables` says otherwise.
    ///
    /// # Context
    /// Any thread (a handler cutting or moving a range, under the range table's write lock);
    /// no lock of its own; maps the new maps' leaves where bits are copied or set (mmap).
    pub(crate) fn slice(&self, start: usize, pages: u64) -> PmdMap {
        let (first, n) = (self.index(start), pmds_overlapped(start, pages));
        PmdMap {
            base: start / PMD_SIZE,
            tables: self.tables.slice(first, n),
            huge: self.huge.slice(first, n),
            never: self.never.slice(first, n),
            random: self.random.slice(first, n),
        }
    }

    /// For pages the kernel moved in (`mremap`): the advice of the piece at `start` of this
    /// map, and a table assumed in every PMD at the destination `to`.
    ///
    /// # Context
    /// Any thread (a handler cutting or moving a range, under the range table's write lock);
    /// no lock of its own; maps the new maps' leaves where bits are copied or set (mmap).
    pub(crate) fn moved(&self, start: usize, pages: u64, to: usize) -> PmdMap {
        let tables = PageMap::new(pmds_overlapped(to, pages));
        tables.set(0, tables.pages());
        let (first, n) = (self.index(start), pmds_overlapped(start, pages));
        PmdMap {
            base: to / PMD_SIZE,
            tables,
            huge: self.huge.slice(first, n),
            never: self.never.slice(first, n),
            random: self.random.slice(first, n),
        }
    }

    /// Notes that 4 KiB pages went into `[addr, addr + len)`: its PMDs may hold page tables.
    ///
    /// # Context
    /// Any thread; lock-free, one `fetch_or` per 64 PMDs; a leaf of the bit map is mapped on
    /// its first set bit (an mmap).
    pub(crate) fn mark_tables(&self, addr: usize, len: usize) {
        if len > 0 {
            let (a, b) = (self.index(addr), self.index(addr + len - 1));
            self.tables.set(a, b - a + 1);
        }
    }

    /// The whole PMDs of `[a, b)` hold no page table any more (their pages were discarded
    /// whole on a kernel that frees emptied tables: see `tables`).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn clear_tables(&self, a: usize, b: usize) {
        let (a, b) = (a.next_multiple_of(PMD_SIZE), pmd_start(b));
        if a < b {
            self.tables.clear(self.index(a), ((b - a) / PMD_SIZE) as u64);
        }
    }

    /// Whether the PMD at `addr` may hold a page table.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn has_table(&self, addr: usize) -> bool {
        self.tables.is_claimed(self.index(addr))
    }

    /// Whether the program asked for huge pages in the PMD at `addr`.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn wants_huge(&self, addr: usize) -> bool {
        self.huge.is_claimed(self.index(addr))
    }

    /// Sets or clears the advice of the whole PMDs `[a, b)` (PMD aligned, `a < b`).
    ///
    /// # Context
    /// Any thread; lock-free, one `fetch_or` per 64 PMDs; a leaf of the bit map is mapped on
    /// its first set bit (an mmap).
    pub(crate) fn set_huge(&self, a: usize, b: usize, on: bool) {
        let (first, n) = (self.index(a), ((b - a) / PMD_SIZE) as u64);
        if on {
            self.huge.set(first, n);
        } else {
            self.huge.clear(first, n);
        }
    }

    /// Sets or clears `MADV_NOHUGEPAGE` on every PMD that `[a, b)` (`a < b`) touches.
    ///
    /// # Context
    /// Any thread; lock-free, one `fetch_or` per 64 PMDs; a leaf of the bit map is mapped on
    /// its first set bit (an mmap).
    pub(crate) fn set_never(&self, a: usize, b: usize, on: bool) {
        let (first, last) = (self.index(a), self.index(b - 1));
        if on {
            self.never.set(first, last - first + 1);
        } else {
            self.never.clear(first, last - first + 1);
        }
    }

    /// Sets or clears `MADV_RANDOM` on every PMD that `[a, b)` (`a < b`) touches.
    ///
    /// # Context
    /// Any thread; lock-free, one `fetch_or` per 64 PMDs; a leaf of the bit map is mapped on
    /// its first set bit (an mmap).
    pub(crate) fn set_random(&self, a: usize, b: usize, on: bool) {
        let (first, last) = (self.index(a), self.index(b - 1));
        if on {
            self.random.set(first, last - first + 1);
        } else {
            self.random.clear(first, last - first + 1);
        }
    }

    /// Whether the program advised random access in the PMD at `addr`.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn is_random(&self, addr: usize) -> bool {
        self.random.is_claimed(self.index(addr))
    }

    /// Whether the program asked for no huge page in the PMD at `addr`.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn no_huge(&self, addr: usize) -> bool {
        self.never.is_claimed(self.index(addr))
    }

    /// Whole PMDs from `at` that may take huge pages: `at` on a PMD boundary, each PMD inside
    /// `len` bytes, holding no table, not advised against huge pages, and advised for them
    /// unless `by_default` (see `Range::may_take_huge`).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn clear_run(&self, at: usize, len: usize, by_default: bool) -> usize {
        if at % PMD_SIZE != 0 {
            return 0;
        }
        (0..len / PMD_SIZE)
            .map(|i| at + i * PMD_SIZE)
            .take_while(|&a| !self.has_table(a) && !self.no_huge(a) && (by_default || self.wants_huge(a)))
            .count()
    }

    /// PMDs marked as possibly holding a table.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    #[cfg(test)]
    pub(crate) fn tables_count(&self) -> u64 {
        self.tables.count()
    }

    /// Whether the map covers exactly the PMDs of `pages` pages from `start` (see
    /// [`Range::is_valid`](crate::memory::region::Range::is_valid)).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn covers(&self, start: usize, pages: u64) -> bool {
        let n = pmds_overlapped(start, pages);
        self.base == start / PMD_SIZE
            && self.tables.pages() == n
            && self.huge.pages() == n
            && self.never.pages() == n
            && self.random.pages() == n
    }

    /// Bytes of metadata mapped for the bits.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn metadata_bytes(&self) -> usize {
        self.tables.metadata_bytes()
            + self.huge.metadata_bytes()
            + self.never.metadata_bytes()
            + self.random.metadata_bytes()
    }
}
