//! The arena: one reserved address range from which large malloc-family blocks are carved, so
//! that `free`, `realloc` and `malloc_usable_size` recognise them with a range check.
//!
//! Nothing here allocates: the free list is a fixed array of extents (in pages, sorted by
//! address, coalesced on free) behind a spin lock that fork handlers can hold across a fork.
//! A block is `[header page][user pages]`; the header sits in the last bytes before the user
//! pointer. A freed block is `MADV_DONTNEED`ed before its pages return to the list, so every
//! block handed out reads zero (calloc needs no memset) and the engine serves its first touch.

use std::sync::atomic::{AtomicBool, Ordering::*};

use engine::sys::mman::PAGE_SIZE;

/// Extents the free list can hold; a free that would need more leaks its pages (counted).
pub const MAX_EXTENTS: usize = 4096;

/// Free extents `[start, start + len)` in pages from the arena base, sorted by start.
pub struct FreeList {
    n: usize,
    start: [u64; MAX_EXTENTS],
    len: [u64; MAX_EXTENTS],
    /// Pages lost because the list was full when they were freed.
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

    /// First fit: the start of `pages` free pages, taken from the list.
    pub fn take(&mut self, pages: u64) -> Option<u64> {
        let i = (0..self.n).find(|&i| self.len[i] >= pages)?;
        let at = self.start[i];
        if self.len[i] == pages {
            self.start.copy_within(i + 1..self.n, i);
            self.len.copy_within(i + 1..self.n, i);
            self.n -= 1;
        } else {
            self.start[i] += pages;
            self.len[i] -= pages;
        }
        Some(at)
    }

    /// Returns `[at, at + pages)` to the list, merged with its neighbours.
    pub fn give(&mut self, at: u64, pages: u64) {
        let i = (0..self.n).find(|&i| self.start[i] > at).unwrap_or(self.n);
        let joins_prev = i > 0 && self.start[i - 1] + self.len[i - 1] == at;
        let joins_next = i < self.n && at + pages == self.start[i];
        match (joins_prev, joins_next) {
            (true, true) => {
                self.len[i - 1] += pages + self.len[i];
                self.start.copy_within(i + 1..self.n, i);
                self.len.copy_within(i + 1..self.n, i);
                self.n -= 1;
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
}
