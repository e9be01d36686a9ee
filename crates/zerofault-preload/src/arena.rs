//! The arena: one reserved address range from which large malloc-family blocks are carved, so
//! that `free`, `realloc` and `malloc_usable_size` recognise them with a range check.
//!
//! ## Shape
//! - The reservation is `PROT_NONE` and `MAP_NORESERVE`: address space only. The kernel never
//!   populates it (not even for `mlockall(MCL_CURRENT)`), and it counts against no overcommit
//!   budget. A block is made read-write when it is handed out and `PROT_NONE` again when it is
//!   freed, as a native large block is mapped and unmapped: a use after free faults. A block
//!   the program sealed (`mseal(2)`), whose native munmap the kernel refuses, stays as it is
//!   when freed, out of the free list for good ([`sealed`], asked before anything is done to it).
//! - A block is `[header page][user pages]`; the [`Header`] sits in the last bytes before the
//!   user pointer (for alignments above a page, slack pages come first).
//! - The free list is a fixed array of extents (in pages, sorted by address, coalesced on free)
//!   behind a spin lock that fork handlers hold across a fork. Nothing here allocates.
//! - The live map: one bit per arena page, set on the header page of each live block (an atomic
//!   `fetch_and` clears it on free, so of two frees of one block exactly one succeeds). A free of
//!   a pointer whose bit is clear is a double free or a pointer the arena never returned: the
//!   caller aborts, naming it, as glibc does. The map is a `MAP_NORESERVE` mapping touched only
//!   where blocks are.
//!
//! ## Advice
//! Free pages carry no advice from their last block: a free leaves them `MADV_DONTDUMP` (a
//! core dump holds no freed block, as natively, where it is unmapped) and, once the program
//! gave arena memory fork or huge-page advice ([`ADVISED`]), back on `MADV_DOFORK`,
//! `MADV_KEEPONFORK` and the arena's `MADV_NOHUGEPAGE`. A block handed out is `MADV_DODUMP`.
//!
//! ## Zero-ness
//! Every page on the free list reads zero: it was never touched, or its block was discarded
//! by an `MADV_DONTNEED` that succeeded, or (when that fails: an `mlock`ed block the program
//! freed without unlocking, as freeing a native block unmaps and so unlocks it) the block was
//! unlocked and discarded again, or, failing that too, written with zeros here. So a block
//! handed out is zero, and `calloc` needs no memset: proved, never assumed.

use engine::os::mman::{self, PAGE_SIZE, PMD_SIZE};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// Set once the program gave memory of the arena fork or huge-page advice (`MADV_DONTFORK`,
/// `MADV_WIPEONFORK`, `MADV_HUGEPAGE`, `MADV_NOHUGEPAGE`): from then on a freed block's
/// advice is put back as a fresh mapping's (see "Advice" above). Until then a free makes no
/// such call.
pub static ADVISED: AtomicBool = AtomicBool::new(false);

/// Extents the free list can hold; a free that would need more leaks its pages (counted).
pub const MAX_EXTENTS: usize = 4096;

/// Free extents `[start, start + len)` in pages from the arena base, sorted by start.
pub struct FreeList {
    n: usize,
    start: [u64; MAX_EXTENTS],
    len: [u64; MAX_EXTENTS],
    /// Pages lost because the list was full when they were freed, or because their block was
    /// sealed (`mseal(2)`: natively its munmap is refused and it stays mapped).
    pub leaked: u64,
}

impl FreeList {
    pub const fn new() -> FreeList {
        FreeList {
            n: 0,
            start: [0; MAX_EXTENTS],
            len: [0; MAX_EXTENTS],
            leaked: 0,
        }
    }

    /// Starts over with one free extent of `pages`.
    pub fn reset(&mut self, pages: u64) {
        self.n = 1;
        self.start[0] = 0;
        self.len[0] = pages;
        self.leaked = 0;
    }

    fn remove(&mut self, i: usize) {
        self.start.copy_within(i + 1..self.n, i);
        self.len.copy_within(i + 1..self.n, i);
        self.n -= 1;
    }

    /// First fit: the start of `pages` free pages, taken from the list.
    pub fn take(&mut self, pages: u64) -> Option<u64> {
        let i = (0..self.n).find(|&i| self.len[i] >= pages)?;
        let at = self.start[i];
        if self.len[i] == pages {
            self.remove(i);
        } else {
            self.start[i] += pages;
            self.len[i] -= pages;
        }
        Some(at)
    }

    /// Takes exactly `[at, at + pages)` if it is free and starts an extent (a block growing
    /// into the free space right after it).
    pub fn take_at(&mut self, at: u64, pages: u64) -> bool {
        let Some(i) = (0..self.n).find(|&i| self.start[i] == at) else {
            return false;
        };
        if self.len[i] < pages {
            return false;
        }
        if self.len[i] == pages {
            self.remove(i);
        } else {
            self.start[i] += pages;
            self.len[i] -= pages;
        }
        true
    }

    /// Returns `[at, at + pages)` to the list, merged with its neighbours.
    pub fn give(&mut self, at: u64, pages: u64) {
        let i = (0..self.n).find(|&i| self.start[i] > at).unwrap_or(self.n);
        let joins_prev = i > 0 && self.start[i - 1] + self.len[i - 1] == at;
        let joins_next = i < self.n && at + pages == self.start[i];
        match (joins_prev, joins_next) {
            (true, true) => {
                self.len[i - 1] += pages + self.len[i];
                self.remove(i);
            }
            (true, false) => self.len[i - 1] += pages,
            (false, true) => {
                self.start[i] = at;
                self.len[i] += pages;
            }
            (false, false) => {
                if self.n == MAX_EXTENTS {
                    self.leaked += pages;
                    return;
                }
                self.start.copy_within(i..self.n, i + 1);
                self.len.copy_within(i..self.n, i + 1);
                self.start[i] = at;
                self.len[i] = pages;
                self.n += 1;
            }
        }
    }

    /// Free pages in all.
    pub fn free_pages(&self) -> u64 {
        self.len[..self.n].iter().sum()
    }

    pub fn extents(&self) -> usize {
        self.n
    }

    /// Extent `i` as (first page, pages).
    pub fn extent(&self, i: usize) -> (u64, u64) {
        (self.start[i], self.len[i])
    }
}

impl Default for FreeList {
    fn default() -> Self {
        FreeList::new()
    }
}

/// A spin lock around the free list. Held only for a list update (no syscalls, no memory
/// touched outside the list), and by the fork handlers across fork().
pub struct Locked {
    busy: AtomicBool,
    list: std::cell::UnsafeCell<FreeList>,
}

// SAFETY: the list is only reached through `with`, under the lock.
unsafe impl Sync for Locked {}

impl Locked {
    pub const fn new() -> Locked {
        Locked {
            busy: AtomicBool::new(false),
            list: std::cell::UnsafeCell::new(FreeList::new()),
        }
    }

    pub fn lock(&self) {
        while self.busy.compare_exchange_weak(false, true, Acquire, Relaxed).is_err() {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
    }

    pub fn unlock(&self) {
        self.busy.store(false, Release);
    }

    /// Runs `f` on the list under the lock.
    pub fn with<R>(&self, f: impl FnOnce(&mut FreeList) -> R) -> R {
        self.lock();
        // SAFETY: the lock is held: no other reference to the list exists until unlock.
        let r = f(unsafe { &mut *self.list.get() });
        self.unlock();
        r
    }
}

impl Default for Locked {
    fn default() -> Self {
        Locked::new()
    }
}

/// What sits right before a user pointer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub magic: u64,
    /// First page of the block, from the arena base.
    pub first: u64,
    /// Pages of the block, header page included.
    pub pages: u64,
    /// Bytes usable from the user pointer to the block's end.
    pub usable: u64,
}

pub const MAGIC: u64 = 0x7a65_726f_6661_756c; // "zerofaul"
pub const HEADER: usize = std::mem::size_of::<Header>();

/// The block for `size` bytes aligned to `align` (a power of two): pages to take, and the
/// user pointer's offset from the block start.
pub fn layout(size: usize, align: usize) -> Option<(u64, usize)> {
    let align = align.max(16);
    // The header page, then slack so that an aligned pointer with a header before it fits.
    let slack = if align <= PAGE_SIZE { 0 } else { align };
    let bytes = PAGE_SIZE.checked_add(slack)?.checked_add(size.max(1))?;
    let pages = bytes.div_ceil(PAGE_SIZE) as u64;
    Some((pages, PAGE_SIZE))
}

/// The user pointer inside a block starting at `block` for `align`.
pub fn user_ptr(block: usize, align: usize) -> usize {
    let align = align.max(PAGE_SIZE);
    (block + PAGE_SIZE).next_multiple_of(align)
}

/// Why a pointer handed to `free` or `realloc` is not a live block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalid;

/// The reserved range, its free list and its live map.
pub struct Arena {
    base: usize,
    len: usize,
    free: Locked,
    /// One bit per page, set on each live block's header page.
    live: usize,
    live_len: usize,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arena({:#x}+{:#x})", self.base, self.len)
    }
}

impl Arena {
    /// Reserves `len` bytes (rounded up to 2 MiB) of address space, 2 MiB aligned, with no
    /// memory behind it.
    pub fn new(len: usize) -> io::Result<Arena> {
        let len = len.max(PMD_SIZE).next_multiple_of(PMD_SIZE);
        let base = mman::map_aligned(len, PMD_SIZE, libc::PROT_NONE, true)?;
        // 4 KiB pages: the engine moves whole huge pages into whole PMDs of its windows itself,
        // and the kernel's own huge-page attempt on each fault would be wasted (docs/DESIGN.md,
        // "Huge pages").
        // SAFETY: our fresh reservation; advice changes no content.
        let _ = unsafe { mman::madvise(base, len, mman::MADV_NOHUGEPAGE) };
        let pages = len / PAGE_SIZE;
        let live_len = pages.div_ceil(8).next_multiple_of(PAGE_SIZE);
        let live = match mman::map_private(live_len, true) {
            Ok(l) => l,
            Err(e) => {
                // SAFETY: our fresh reservation, known to nobody.
                let _ = unsafe { mman::unmap(base, len) };
                return Err(e);
            }
        };
        let a = Arena {
            base,
            len,
            free: Locked::new(),
            live,
            live_len,
        };
        a.free.with(|f| f.reset(pages as u64));
        Ok(a)
    }

    /// The reservation, as (address, length).
    pub fn area(&self) -> (usize, usize) {
        (self.base, self.len)
    }

    pub fn contains(&self, p: usize) -> bool {
        (self.base..self.base + self.len).contains(&p)
    }

    /// The free list's lock, for the fork handlers.
    pub fn lock(&self) -> &Locked {
        &self.free
    }

    fn live_word(&self, page: u64) -> (&AtomicU64, u64) {
        let w = (page / 64) as usize;
        debug_assert!(w * 8 < self.live_len);
        // SAFETY: the live map covers one bit per arena page, and `page` is an arena page; the
        // mapping lives as long as the arena; AtomicU64 has the layout of u64.
        (unsafe { &*((self.live as *const AtomicU64).add(w)) }, 1 << (page % 64))
    }

    fn page_of(&self, addr: usize) -> u64 {
        ((addr - self.base) / PAGE_SIZE) as u64
    }

    /// A zero block of `size` bytes aligned to `align`, read-write; locked too when `lock` (the
    /// program asked for `mlockall(MCL_FUTURE)`, which a native mapping would get). None when
    /// the arena is full. `header(page)` is offered the header's page before it is written
    /// (the engine installs it alone: see `Engine::fill_page`).
    pub fn alloc(&self, size: usize, align: usize, lock: bool, header: &dyn Fn(usize)) -> Option<usize> {
        let (pages, _) = layout(size, align)?;
        let first = self.free.with(|f| f.take(pages))?;
        let block = self.base + first as usize * PAGE_SIZE;
        let bytes = pages as usize * PAGE_SIZE;
        // SAFETY: free pages of the arena, just taken off the free list: nobody else has them.
        if unsafe { mman::protect(block, bytes, libc::PROT_READ | libc::PROT_WRITE) }.is_err() {
            // Out of VMAs or memory: the pages are still zero and PROT_NONE.
            self.free.with(|f| f.give(first, pages));
            return None;
        }
        // SAFETY: as above; dump advice changes no content.
        let _ = unsafe { mman::madvise(block, bytes, libc::MADV_DODUMP) };
        if lock {
            let _ = mman::mlock(block, bytes);
        }
        let p = user_ptr(block, align);
        let h = Header {
            magic: MAGIC,
            first,
            pages,
            usable: (block + bytes - p) as u64,
        };
        header(p - PAGE_SIZE);
        // SAFETY: [p - HEADER, p) lies in the page before p, inside the block, which is ours and
        // read-write now; the write may fault, served by the engine.
        unsafe { ((p - HEADER) as *mut Header).write(h) };
        let (w, bit) = self.live_word(self.page_of(p - PAGE_SIZE));
        w.fetch_or(bit, Release);
        Some(p)
    }

    /// The header of a live block whose user pointer is `p`.
    pub fn block(&self, p: usize) -> Result<Header, Invalid> {
        if !self.contains(p) || p % PAGE_SIZE != 0 || p < self.base + PAGE_SIZE {
            return Err(Invalid);
        }
        let (w, bit) = self.live_word(self.page_of(p - PAGE_SIZE));
        if w.load(Acquire) & bit == 0 {
            return Err(Invalid);
        }
        // SAFETY: the live bit says the page before p is a live block's header page, read-write.
        let h = unsafe { ((p - HEADER) as *const Header).read() };
        if h.magic != MAGIC {
            return Err(Invalid);
        }
        Ok(h)
    }

    /// Frees the block at `p`. `Err` for a pointer that is not a live block (a double free, or
    /// one the arena never returned); the caller aborts. `recycle(addr, len)` is offered the
    /// block's pages first (the engine keeps them for its pool); it returns `true` only when
    /// the range reads zero afterwards (its discard succeeded), else the arena discards them.
    pub fn free(&self, p: usize, recycle: &dyn Fn(usize, usize) -> bool) -> Result<(), Invalid> {
        let h = self.block(p)?;
        let (w, bit) = self.live_word(self.page_of(p - PAGE_SIZE));
        if w.fetch_and(!bit, AcqRel) & bit == 0 {
            return Err(Invalid); // another thread freed it first
        }
        // SAFETY: the block's pages; its live bit was ours to clear, so its owner freed it.
        unsafe { self.release(h.first, h.pages, recycle) };
        Ok(())
    }

    /// Returns pages `[first, first + pages)` to the free list, zero and `PROT_NONE`: recycled
    /// (see [`Arena::free`]) or discarded.
    ///
    /// # Safety
    /// The pages are allocated from this arena and their owner gives them up: nothing touches
    /// them again.
    unsafe fn release(&self, first: u64, pages: u64, recycle: &dyn Fn(usize, usize) -> bool) {
        let addr = self.base + first as usize * PAGE_SIZE;
        let bytes = pages as usize * PAGE_SIZE;
        if sealed(addr, bytes) {
            // Natively the munmap of a sealed block fails and the block stays, contents and
            // all: so here, out of the free list for good.
            self.free.with(|f| f.leaked += pages);
            return;
        }
        // SAFETY: the caller's contract; advice changes no content.
        unsafe {
            if !recycle(addr, bytes) {
                discard(addr, bytes);
            }
            let _ = mman::protect(addr, bytes, libc::PROT_NONE);
            let _ = mman::madvise(addr, bytes, libc::MADV_DONTDUMP);
            if ADVISED.load(Relaxed) {
                let _ = mman::madvise(addr, bytes, libc::MADV_DOFORK);
                let _ = mman::madvise(addr, bytes, libc::MADV_KEEPONFORK);
                let _ = mman::madvise(addr, bytes, libc::MADV_NOHUGEPAGE);
            }
        }
        self.free.with(|f| f.give(first, pages));
    }

    /// Grows the block at `p` in place to hold `size` bytes from `p`, when the pages right
    /// after it are free. Returns the new header, and the part added as (address, bytes).
    pub fn grow_in_place(&self, p: usize, h: Header, size: usize, lock: bool) -> Option<(Header, usize, usize)> {
        let block = self.base + h.first as usize * PAGE_SIZE;
        let want = ((p - block).checked_add(size)?).div_ceil(PAGE_SIZE) as u64;
        let extra = want.checked_sub(h.pages).filter(|e| *e > 0)?;
        let end = h.first + h.pages;
        if !self.free.with(|f| f.take_at(end, extra)) {
            return None;
        }
        let tail = self.base + end as usize * PAGE_SIZE;
        let bytes = extra as usize * PAGE_SIZE;
        // SAFETY: free pages just taken off the free list: nobody else has them.
        if unsafe { mman::protect(tail, bytes, libc::PROT_READ | libc::PROT_WRITE) }.is_err() {
            self.free.with(|f| f.give(end, extra));
            return None;
        }
        // SAFETY: as above; dump advice changes no content.
        let _ = unsafe { mman::madvise(tail, bytes, libc::MADV_DODUMP) };
        if lock {
            let _ = mman::mlock(tail, bytes);
        }
        let n = Header {
            pages: want,
            usable: h.usable + bytes as u64,
            ..h
        };
        // SAFETY: the header of a live block of ours, read-write.
        unsafe { ((p - HEADER) as *mut Header).write(n) };
        Some((n, tail, bytes))
    }

    /// Gives back the pages of the block at `p` beyond `size` bytes from `p`, when that frees
    /// at least `min_pages`. `renew(addr, len)` is offered them first, as `recycle` in
    /// [`Arena::free`] (the pages are discarded unless it returns `true`).
    pub fn shrink(&self, p: usize, h: Header, size: usize, min_pages: u64, renew: &dyn Fn(usize, usize) -> bool) {
        let block = self.base + h.first as usize * PAGE_SIZE;
        let keep = (p - block + size.max(1)).div_ceil(PAGE_SIZE) as u64;
        let Some(spare) = h.pages.checked_sub(keep).filter(|s| *s >= min_pages.max(1)) else {
            return;
        };
        // A sealed tail: natively the shrinking mremap fails and realloc keeps the block whole.
        if sealed(block + keep as usize * PAGE_SIZE, spare as usize * PAGE_SIZE) {
            return;
        }
        let n = Header {
            pages: keep,
            usable: h.usable - spare * PAGE_SIZE as u64,
            ..h
        };
        // SAFETY: the header of a live block of ours, read-write.
        unsafe { ((p - HEADER) as *mut Header).write(n) };
        // SAFETY: the block's pages past what it keeps, which its owner gives up by shrinking.
        unsafe { self.release(h.first + keep, spare, renew) };
    }

    /// Calls `f(addr, len)` for every free extent (to unlock them after `mlockall`).
    pub fn each_free(&self, mut f: impl FnMut(usize, usize)) {
        let mut v = [(0u64, 0u64); 64];
        let mut from = 0;
        loop {
            // Copied out in batches: `f` makes system calls, which the lock must not wait on.
            let n = self.free.with(|l| {
                let n = l.extents().saturating_sub(from).min(v.len());
                for (i, e) in v.iter_mut().enumerate().take(n) {
                    *e = l.extent(from + i);
                }
                n
            });
            for &(s, l) in &v[..n] {
                f(self.base + s as usize * PAGE_SIZE, l as usize * PAGE_SIZE);
            }
            if n < v.len() {
                break;
            }
            from += n;
        }
    }

    /// The live map, as (address, length): the shim unlocks it after the program's
    /// `mlockall(MCL_CURRENT)` (it is the shim's bookkeeping, not the program's memory).
    pub fn live_area(&self) -> (usize, usize) {
        (self.live, self.live_len)
    }

    /// Free pages, and pages lost to a full free list.
    pub fn free_pages(&self) -> (u64, u64) {
        self.free.with(|f| (f.free_pages(), f.leaked))
    }
}

/// Whether part of `[addr, addr + len)` (a block the program gives up, or part of one) is sealed
/// (`mseal(2)`): asked with `mprotect(PROT_READ | PROT_WRITE)`, which the kernel refuses with
/// EPERM on a sealed VMA, as it refuses the munmap that frees a native block. Nothing else in a
/// free is refused there (`UFFDIO_MOVE` and `MADV_DONTNEED` of a sealed writable range succeed),
/// so this is asked before any of it. Read-write is what the block was handed out as; a part
/// the program protected otherwise is given up with it.
pub fn sealed(addr: usize, len: usize) -> bool {
    // SAFETY: protection of arena pages their owner gives up; no content changes.
    let r = unsafe { mman::protect(addr, len, libc::PROT_READ | libc::PROT_WRITE) };
    r.is_err_and(|e| e.raw_os_error() == Some(libc::EPERM))
}

/// Makes `[addr, addr + len)` (read-write, ours) read zero with no memory behind it: discarded
/// by `MADV_DONTNEED`; if the kernel refuses (an `mlock`ed range), unlocked and discarded; if
/// that fails too, written with zeros.
///
/// # Safety
/// The range is the arena's, read-write, and given up by its owner.
unsafe fn discard(addr: usize, len: usize) {
    // SAFETY: the caller's contract.
    if unsafe { mman::madvise(addr, len, mman::MADV_DONTNEED) }.is_ok() {
        return;
    }
    let _ = mman::munlock(addr, len);
    // SAFETY: as above.
    if unsafe { mman::madvise(addr, len, mman::MADV_DONTNEED) }.is_ok() {
        return;
    }
    // SAFETY: the range is ours and read-write (it is made PROT_NONE only after this).
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0, len) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_and_coalescing() {
        let mut f = FreeList::new();
        f.reset(100);
        let a = f.take(10).unwrap();
        let b = f.take(20).unwrap();
        let c = f.take(30).unwrap();
        assert_eq!((a, b, c), (0, 10, 30));
        assert_eq!(f.free_pages(), 40);
        f.give(b, 20);
        assert_eq!(f.extents(), 2);
        assert_eq!(f.take(15), Some(10), "first fit reuses the hole");
        f.give(10, 15);
        f.give(a, 10);
        assert_eq!(f.extents(), 2, "a and b merged");
        f.give(c, 30);
        assert_eq!((f.extents(), f.free_pages()), (1, 100), "all merged back");
        assert_eq!(f.take(101), None);
    }

    #[test]
    fn take_at_grows_into_the_extent_that_starts_right_there() {
        let mut f = FreeList::new();
        f.reset(100);
        assert_eq!(f.take(10), Some(0));
        assert!(f.take_at(10, 5));
        assert!(!f.take_at(10, 5), "taken");
        assert!(!f.take_at(20, 1), "inside an extent, not at its start");
        assert!(f.take_at(15, 85));
        assert_eq!(f.free_pages(), 0);
        assert!(!f.take_at(100, 1));
    }

    #[test]
    fn a_full_list_leaks_instead_of_growing() {
        let mut f = FreeList::new();
        f.reset(2 * MAX_EXTENTS as u64 + 10);
        let blocks: Vec<u64> = (0..2 * MAX_EXTENTS + 4).map(|_| f.take(1).unwrap()).collect();
        // Free every other block: each is its own extent.
        for b in blocks.iter().step_by(2) {
            f.give(*b, 1);
        }
        assert_eq!(f.extents(), MAX_EXTENTS);
        assert!(f.leaked > 0);
    }

    #[test]
    fn layout_leaves_room_for_the_header_and_alignment() {
        let (pages, _) = layout(2 << 20, 16).unwrap();
        assert_eq!(pages, 513);
        let (pages, _) = layout(2 << 20, 2 << 20).unwrap();
        assert_eq!(pages as usize * PAGE_SIZE, PAGE_SIZE + (2 << 20) + (2 << 20));
        let block = 0x7000_0000_0000 + 3 * PAGE_SIZE;
        let p = user_ptr(block, 2 << 20);
        assert_eq!(p % (2 << 20), 0);
        assert!(p >= block + PAGE_SIZE && p + (2 << 20) <= block + (pages as usize) * PAGE_SIZE);
        assert_eq!(user_ptr(block, 64), block + PAGE_SIZE);
        assert!(layout(usize::MAX - 10, 16).is_none());
    }

    fn resident(addr: usize, len: usize) -> usize {
        mman::resident_pages(addr, len).unwrap()
    }

    #[test]
    fn blocks_are_zero_and_freed_blocks_go_back_to_the_kernel() {
        let a = Arena::new(64 << 20).unwrap();
        let p = a.alloc(8 << 20, 16, false, &|_| ()).unwrap();
        // SAFETY: p is a live 8 MiB block of ours.
        let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, 8 << 20) };
        assert!(engine::is_zero(s));
        s.fill(0x5a);
        assert_eq!(a.block(p).unwrap().usable, 8 << 20);
        a.free(p, &|_, _| false).unwrap();
        assert_eq!(resident(p, 8 << 20), 0, "discarded");
        assert_eq!(a.free(p, &|_, _| false), Err(Invalid), "a double free is refused");
        assert_eq!(
            a.free(p + PAGE_SIZE, &|_, _| false),
            Err(Invalid),
            "so is a pointer inside a block"
        );
        let q = a.alloc(8 << 20, 16, false, &|_| ()).unwrap();
        assert_eq!(q, p, "first fit");
        // SAFETY: q is a live 8 MiB block of ours.
        assert!(engine::is_zero(unsafe {
            std::slice::from_raw_parts(q as *const u8, 8 << 20)
        }));
        assert_eq!(a.free_pages().0, (64 << 20) / PAGE_SIZE as u64 - 2049);
        a.free(q, &|_, _| false).unwrap();
        assert_eq!(a.free_pages().0, (64 << 20) / PAGE_SIZE as u64);
    }

    #[test]
    fn a_locked_block_freed_without_unlocking_still_comes_back_zero() {
        let a = Arena::new(16 << 20).unwrap();
        let p = a.alloc(4 << 20, 16, false, &|_| ()).unwrap();
        mman::mlock(p, 4 << 20).unwrap();
        // SAFETY: p is a live 4 MiB block of ours.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0x5a, 4 << 20) };
        a.free(p, &|_, _| false).unwrap();
        let q = a.alloc(4 << 20, 16, false, &|_| ()).unwrap();
        assert_eq!(q, p);
        // SAFETY: q is a live 4 MiB block of ours.
        let s = unsafe { std::slice::from_raw_parts(q as *const u8, 4 << 20) };
        assert!(engine::is_zero(s), "no secret from the locked block");
        a.free(q, &|_, _| false).unwrap();
    }

    #[test]
    fn blocks_grow_in_place_and_shrink() {
        let a = Arena::new(64 << 20).unwrap();
        let p = a.alloc(4 << 20, 16, false, &|_| ()).unwrap();
        let h = a.block(p).unwrap();
        // SAFETY: p is a live block of at least 4 MiB.
        unsafe { (p as *mut u8).add((4 << 20) - 1).write(7) };
        let (g, tail, grown) = a.grow_in_place(p, h, 6 << 20, false).unwrap();
        // The part added starts where the block's usable bytes ended.
        assert_eq!((tail, grown), (p + h.usable as usize, (6 << 20) - h.usable as usize));
        assert_eq!(g.usable, 6 << 20);
        // SAFETY: the block now holds 6 MiB from p.
        unsafe {
            assert_eq!((p as *const u8).add((4 << 20) - 1).read(), 7);
            (p as *mut u8).add((6 << 20) - 1).write(8);
        }
        let q = a.alloc(1 << 20, 16, false, &|_| ()).unwrap();
        assert!(a.grow_in_place(p, g, 8 << 20, false).is_none(), "q is in the way");
        a.shrink(p, g, 1 << 20, 16, &|_, _| false);
        assert_eq!(a.block(p).unwrap().usable, 1 << 20);
        assert!(a.block(q).is_ok());
        a.free(p, &|_, _| false).unwrap();
        a.free(q, &|_, _| false).unwrap();
        assert_eq!(a.free_pages().0, (64 << 20) / PAGE_SIZE as u64);
    }
}
