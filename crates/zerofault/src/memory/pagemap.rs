//! The page-state map (seed 004): one atomic bit per page of a region, *claimed* when the engine
//! installs that page.
//!
//! Seed 004 took the page_table_lock out of the anonymous fault path: an empty PTE is populated
//! with one atomic compare-and-exchange, and the lock is kept only for changes to valid entries.
//! The same idea serves our handlers. A window's pages are claimed with one `fetch_or` per 64
//! pages; the bits that were clear before are the pages this handler now owns and installs, the
//! others were installed (or are being installed) by someone else. Two handlers therefore never
//! install the same page, and a window's missing runs fall out of the same operation.
//!
//! A bit is cleared when the kernel drops the page (UFFD_EVENT_REMOVE / UNMAP), or released
//! when an install failed. The map is a hint, never the truth: the kernel's page tables are.
//! Where the two disagree, an install ioctl reports EEXIST for a present page, and a fault on a
//! page whose bit is set is answered with a one-page install attempt, so a stale bit costs one
//! round trip and never a hang.
//!
//! # Shape: proportional to what is touched
//!
//! The kernel's page tables are sparse: a PTE page exists only where something was mapped. The
//! map follows them, because a program may register far more than it touches (a 16 TiB
//! `MAP_NORESERVE` reservation of a wasm runtime, a GC heap or a sanitizer), and a flat bitmap
//! of it would be 512 MiB that a cut (munmap of part of it) copies and counts in full. So:
//!
//! - **Leaves**: 4 KiB of bits each, [`LEAF_PAGES`] (32768) pages, 128 MiB of address space.
//!   A leaf is made on the first `claim` / `set` that lands in it; an absent leaf reads as all
//!   clear, so `is_claimed`, `clear`, `count`, `count_range` and `slice` skip it. A leaf lives
//!   until the map is dropped (a cut copies only the words that have bits into the new maps).
//!   Leaf `i` is page `i` of the map's *arena*, one `MAP_NORESERVE` mapping of 4 KiB per leaf
//!   the map could have (a 16 TiB map: 512 MiB of address space), made with the first leaf.
//!   Making a leaf is then no system call: its page is faulted in by the first bit written to
//!   it, and an arena page no leaf uses is never touched, so it costs nothing but address
//!   space. One mapping per map also keeps the process's mapping count (`vm.max_map_count`)
//!   out of it, and its drop is one munmap.
//! - **Directory**: one slot per leaf holding its address, 0 while absent. Up to
//!   [`INLINE_WORDS`] slots live in the map itself (ranges up to 2 GiB: no mapping at all for
//!   the directory); a larger directory is a `MAP_NORESERVE` mapping whose untouched pages cost
//!   nothing (8 bytes per 128 MiB: 1 MiB of address space for 16 TiB, resident only where a
//!   leaf was made).
//! - **Small maps** (up to [`INLINE_PAGES`] = 1024 pages: the page map of a range up to 4 MiB,
//!   the PMD map of one up to 2 GiB) keep their bits in those same inline words: no leaf, no
//!   directory, no system call ever.
//!
//! Leaves and directories come from raw `mmap` ([`crate::sys::mman`]), never from the global
//! allocator: they go back to the kernel when the map is dropped, and under the LD_PRELOAD shim
//! the engine never calls into the program's allocator. A map that gets leaves pays the system
//! calls of [`mman::map_private`] and one madvise (no huge pages: one leaf written must not
//! make 2 MiB resident) once, at its first leaf; the hot path (`claim`, `is_claimed`) adds one load of the
//! directory slot per leaf it crosses. If a leaf or a directory cannot be mapped (ENOMEM), the
//! pages concerned are treated as if the map were not there: `claim` reports them all as newly
//! claimed without recording them, `set` records nothing. Being a hint, the map stays correct:
//! two handlers may then both install a page, and the second gets EEXIST.
//!
//! # Ordering
//!
//! Every operation on the bits is a single read-modify-write on one word, and RMWs on one
//! location are totally ordered, which is all that exclusivity needs. The bits guard no
//! user-space data (the page contents are installed by the kernel under its own locks), so
//! `Relaxed` is enough for them. (`clear` loads a word first and skips the RMW when none of its
//! bits is set: that load is where it takes effect for that word, as good a point as the RMW.)
//!
//! A leaf's publication is different: a thread that loads a slot dereferences the address it
//! finds, and must see the leaf as it was made (zeroed by the kernel, a valid array of atomics).
//! So the compare-and-exchanges that install the arena and a leaf are `AcqRel` (Release: the
//! mapping happens before any reader's use; Acquire on failure: the loser uses the winner's)
//! and every load of the arena or a slot is `Acquire`: the arena's mmap happens before the
//! arena is published, which happens before the leaf maker's slot CAS, which happens before
//! any reader's use. Two threads may race to make the arena; the loser unmaps its own. Two
//! threads that race to make a leaf install the same address. Nothing is unpublished while the
//! map is shared: only `Drop` (with `&mut self`) unmaps.

use crate::page::index;
use crate::sync::{AtomicU64, AtomicUsize};
use crate::sys::mman::{self, PAGE_SIZE};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};

/// Words of bits in one leaf: one page of them.
const LEAF_WORDS: u64 = (PAGE_SIZE / 8) as u64;
/// Pages one leaf covers (32768: 128 MiB of address space).
pub(crate) const LEAF_PAGES: u64 = LEAF_WORDS * 64;
/// Bytes of one leaf (one page of the arena).
const LEAF_BYTES: usize = PAGE_SIZE;
/// Words kept inside the map: bits of a small map, or the directory of a medium one.
pub(crate) const INLINE_WORDS: usize = 16;
/// The largest map whose bits live inline (1024 pages, 4 MiB of range).
pub(crate) const INLINE_PAGES: u64 = INLINE_WORDS as u64 * 64;

type Leaf = [AtomicU64; index(LEAF_WORDS)];

/// Where the bits live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Storage {
    /// In `inline`, one bit per page.
    Bits,
    /// In leaves; `inline` is the directory.
    Inline,
    /// In leaves; the directory is the mapping at `dir`.
    Mapped,
    /// The directory could not be mapped: every leaf is absent and none can be made.
    Lost,
}

/// One bit per page, sparse (see the module documentation).
pub(crate) struct PageMap {
    pages: u64,
    kind: Storage,
    /// Address of the directory mapping (`Storage::Mapped`), else 0.
    dir: usize,
    /// Bytes of the directory mapping.
    dir_bytes: usize,
    /// Address of the leaves' mapping ([`PageMap::arena_bytes`]), 0 until the first leaf.
    arena: AtomicUsize,
    /// Leaves made (for [`PageMap::metadata_bytes`]).
    leaves: AtomicUsize,
    inline: [AtomicU64; INLINE_WORDS],
}

impl std::fmt::Debug for PageMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageMap")
            .field("pages", &self.pages)
            .field("kind", &self.kind)
            .field("leaves", &self.leaves.load(Relaxed))
            .field("claimed", &self.count())
            .finish()
    }
}

/// The bits of word `w` that fall in pages `[first, end)`.
fn word_mask(w: u64, first: u64, end: u64) -> u64 {
    let lo = first.max(w * 64) - w * 64;
    let hi = end.min(w * 64 + 64) - w * 64;
    if hi <= lo {
        return 0;
    }
    let upper = if hi == 64 { u64::MAX } else { (1u64 << hi) - 1 };
    upper & !((1u64 << lo) - 1)
}

/// Appends the set bits of `new` (word `w`) to `runs` as maximal runs, merging with the last.
fn push_runs(runs: &mut Vec<(u64, u64)>, w: u64, mut new: u64) {
    while new != 0 {
        let lo = new.trailing_zeros() as u64;
        let len = (new >> lo).trailing_ones() as u64;
        let start = w * 64 + lo;
        match runs.last_mut() {
            Some((s, l)) if *s + *l == start => *l += len,
            _ => runs.push((start, len)),
        }
        new &= if lo + len == 64 { 0 } else { !((1u64 << (lo + len)) - 1) };
    }
}

impl PageMap {
    /// # Context
    /// The thread registering the range (a program thread, or a handler taking a loan back); maps
    /// the directory.
    pub(crate) fn new(pages: u64) -> PageMap {
        // Leaves are atomics laid over mapped memory, which loom's atomics are not.
        #[cfg(loom)]
        assert!(pages <= INLINE_PAGES, "under loom, only maps whose bits are inline");
        let leaves = pages.div_ceil(LEAF_PAGES);
        let (kind, dir, dir_bytes) = if pages <= INLINE_PAGES {
            (Storage::Bits, 0, 0)
        } else if leaves <= INLINE_WORDS as u64 {
            (Storage::Inline, 0, 0)
        } else {
            let bytes = (index(leaves) * 8).next_multiple_of(PAGE_SIZE);
            match mman::map_private(bytes, true) {
                Ok(addr) => {
                    // A directory of 2 MiB or more (ranges from 32 TiB) must not get huge pages:
                    // one slot written would make 2 MiB resident.
                    // SAFETY: our fresh mapping; advice changes no content.
                    let _ = unsafe { mman::madvise(addr, bytes, mman::MADV_NOHUGEPAGE) };
                    (Storage::Mapped, addr, bytes)
                }
                Err(_) => (Storage::Lost, 0, 0),
            }
        };
        PageMap {
            pages,
            kind,
            dir,
            dir_bytes,
            arena: AtomicUsize::new(0),
            leaves: AtomicUsize::new(0),
            inline: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Bytes of the arena: one leaf's worth per leaf the map could have.
    fn arena_bytes(&self) -> usize {
        index(self.pages.div_ceil(LEAF_PAGES)) * LEAF_BYTES
    }

    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn pages(&self) -> u64 {
        self.pages
    }

    /// Bytes mapped for this map beyond the struct itself: the directory mapping (all of it,
    /// though only the pages holding a leaf's slot are resident) and the leaves made (the
    /// arena's other pages are address space, never touched).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn metadata_bytes(&self) -> usize {
        self.dir_bytes + self.leaves.load(Relaxed) * LEAF_BYTES
    }

    /// The directory slot of leaf `leaf` (< the number of leaves), if there is a directory.
    #[inline]
    fn slot(&self, leaf: u64) -> Option<&AtomicU64> {
        match self.kind {
            Storage::Inline => Some(&self.inline[index(leaf)]),
            Storage::Mapped => {
                debug_assert!(index(leaf) < self.dir_bytes / 8);
                // SAFETY: `dir` is our live read-write mapping of `dir_bytes` bytes, page aligned,
                // zero-filled by the kernel and written only through atomics, so every slot is a
                // valid AtomicU64; `leaf` is below pages / LEAF_PAGES rounded up, which is within
                // `dir_bytes / 8`. It is unmapped only in Drop, which holds `&mut self`.
                Some(unsafe { &*(self.dir as *const AtomicU64).add(index(leaf)) })
            }
            Storage::Bits | Storage::Lost => None,
        }
    }

    /// Leaf `leaf`, made if absent and `create` (None if absent, or it could not be mapped).
    #[inline]
    fn leaf(&self, leaf: u64, create: bool) -> Option<&Leaf> {
        let slot = self.slot(leaf)?;
        let mut addr = slot.load(Acquire);
        if addr == 0 {
            if !create {
                return None;
            }
            addr = self.make_leaf(leaf, slot)?;
        }
        // SAFETY: a non-zero slot holds the address of a leaf: one page of the arena, our live
        // read-write mapping, page aligned and zero-filled by the kernel, published with Release
        // and loaded with Acquire (see the module documentation), written only through atomics;
        // the arena is unmapped only in Drop, which holds `&mut self`, so it outlives this
        // borrow of `self`.
        Some(unsafe { &*(index(addr) as *const Leaf) })
    }

    /// Installs leaf `leaf` in its `slot`, mapping the arena first if this is the map's first
    /// leaf. None if the arena cannot be mapped.
    #[cold]
    fn make_leaf(&self, leaf: u64, slot: &AtomicU64) -> Option<u64> {
        let mut arena = self.arena.load(Acquire);
        if arena == 0 {
            let len = self.arena_bytes();
            let new = mman::map_private(len, true).ok()?;
            // SAFETY: our fresh mapping; advice changes no content.
            let _ = unsafe { mman::madvise(new, len, mman::MADV_NOHUGEPAGE) };
            arena = match self.arena.compare_exchange(0, new, AcqRel, Acquire) {
                Ok(_) => new,
                Err(theirs) => {
                    // SAFETY: our fresh mapping, which lost the race: nobody saw it.
                    let _ = unsafe { mman::unmap(new, len) };
                    theirs
                }
            };
        }
        let addr = (arena + index(leaf) * LEAF_BYTES) as u64;
        match slot.compare_exchange(0, addr, AcqRel, Acquire) {
            Ok(_) => {
                self.leaves.fetch_add(1, Relaxed);
            }
            Err(theirs) => debug_assert_eq!(theirs, addr),
        }
        Some(addr)
    }

    /// Word `w` (< the map's words), made if absent and `create`.
    #[inline]
    fn word(&self, w: u64, create: bool) -> Option<&AtomicU64> {
        if self.kind == Storage::Bits {
            return Some(&self.inline[index(w)]);
        }
        self.leaf(w / LEAF_WORDS, create).map(|l| &l[(w % LEAF_WORDS) as usize])
    }

    /// Calls `op(w, words)` for the words `[w, w + count)` overlapping pages `[first, end)`, in
    /// ascending order, one call per leaf (or one for an inline map): `words` is `Some` slice of
    /// exactly those words where they exist (made first when `create`), `None` where absent.
    #[inline]
    fn each_chunk(&self, first: u64, end: u64, create: bool, mut op: impl FnMut(u64, u64, Option<&[AtomicU64]>)) {
        if first >= end {
            return;
        }
        let (w_first, w_last) = (first / 64, (end - 1) / 64);
        if self.kind == Storage::Bits {
            op(
                w_first,
                w_last - w_first + 1,
                Some(&self.inline[index(w_first)..=index(w_last)]),
            );
            return;
        }
        let mut w = w_first;
        while w <= w_last {
            let leaf = w / LEAF_WORDS;
            let upto = w_last.min(leaf * LEAF_WORDS + LEAF_WORDS - 1);
            let words = self
                .leaf(leaf, create)
                .map(|l| &l[(w % LEAF_WORDS) as usize..=(upto % LEAF_WORDS) as usize]);
            op(w, upto - w + 1, words);
            w = upto + 1;
        }
    }

    /// `[first, first + n)` clipped to the map.
    fn clip(&self, first: u64, n: u64) -> (u64, u64) {
        (first, first.saturating_add(n).min(self.pages))
    }

    /// Whether `page` is claimed.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    #[inline]
    pub(crate) fn is_claimed(&self, page: u64) -> bool {
        if page >= self.pages {
            return false;
        }
        self.word(page / 64, false)
            .is_some_and(|word| word.load(Relaxed) & (1 << (page % 64)) != 0)
    }

    /// Claims every unclaimed page of `[first, first + n)`. Appends to `runs` the maximal runs
    /// `(first_page, pages)` that this call claimed, in ascending order.
    ///
    /// # Context
    /// Any thread; lock-free, one `fetch_or`/`fetch_and` per 64 pages; a leaf is mapped on its
    /// first claim (an mmap).
    pub(crate) fn claim(&self, first: u64, n: u64, runs: &mut Vec<(u64, u64)>) {
        let (first, end) = self.clip(first, n);
        self.each_chunk(first, end, true, |w0, count, words| match words {
            Some(words) => {
                for (w, word) in (w0..).zip(words) {
                    let mask = word_mask(w, first, end);
                    push_runs(runs, w, mask & !word.fetch_or(mask, Relaxed));
                }
            }
            // No leaf could be mapped: nothing recorded, all of it ours to install (see above).
            None => {
                for w in w0..w0 + count {
                    push_runs(runs, w, word_mask(w, first, end));
                }
            }
        });
    }

    /// Appends to `runs` the maximal runs `(first_page, pages)` of claimed pages in
    /// `[first, first + n)`, in ascending order (pages recorded nowhere, where no leaf could be
    /// mapped, are not claimed here).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn claimed_runs(&self, first: u64, n: u64, runs: &mut Vec<(u64, u64)>) {
        let (first, end) = self.clip(first, n);
        self.each_chunk(first, end, false, |w0, _, words| {
            for (w, word) in (w0..).zip(words.unwrap_or_default()) {
                push_runs(runs, w, word.load(Relaxed) & word_mask(w, first, end));
            }
        });
    }

    /// Clears the bits of `[first, first + n)`; returns how many were set.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn clear(&self, first: u64, n: u64) -> u64 {
        let (first, end) = self.clip(first, n);
        let mut cleared = 0;
        self.each_chunk(first, end, false, |w0, _, words| {
            for (w, word) in (w0..).zip(words.unwrap_or_default()) {
                let mask = word_mask(w, first, end);
                // A load first: most words of a large span are clear, and a load of a clear
                // word is cheaper than an RMW that would also dirty its cache line.
                if word.load(Relaxed) & mask != 0 {
                    cleared += (word.fetch_and(!mask, Relaxed) & mask).count_ones() as u64;
                }
            }
        });
        cleared
    }

    /// Sets every bit of `[first, first + n)` (pages that are not ours to install).
    ///
    /// # Context
    /// Any thread; lock-free, one `fetch_or`/`fetch_and` per 64 pages; a leaf is mapped on its
    /// first claim (an mmap).
    pub(crate) fn set(&self, first: u64, n: u64) {
        let (first, end) = self.clip(first, n);
        self.each_chunk(first, end, true, |w0, _, words| {
            for (w, word) in (w0..).zip(words.unwrap_or_default()) {
                word.fetch_or(word_mask(w, first, end), Relaxed);
            }
        });
    }

    /// How many pages of `[first, first + n)` are claimed.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn count_range(&self, first: u64, n: u64) -> u64 {
        let (first, end) = self.clip(first, n);
        let mut count = 0;
        self.each_chunk(first, end, false, |w0, _, words| {
            for (w, word) in (w0..).zip(words.unwrap_or_default()) {
                count += (word.load(Relaxed) & word_mask(w, first, end)).count_ones() as u64;
            }
        });
        count
    }

    /// How many pages are claimed.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn count(&self) -> u64 {
        self.count_range(0, self.pages)
    }

    /// ORs `bits` into word `w` (a map nobody else sees yet: [`PageMap::slice`]).
    fn or_word(&self, w: u64, bits: u64) {
        if bits != 0 {
            if let Some(word) = self.word(w, true) {
                word.fetch_or(bits, Relaxed);
            }
        }
    }

    /// A new map of `n` pages whose bits are copied from `[first, first + n)` of this one
    /// (a region split by munmap or moved by mremap). Word by word, skipping absent leaves and
    /// clear words: the new map gets leaves only where this one has bits.
    ///
    /// # Context
    /// Any thread (a handler cutting or moving a range, under the range table's write lock);
    /// no lock of its own; maps the new map's directory and leaves where bits are copied (mmap).
    pub(crate) fn slice(&self, first: u64, n: u64) -> PageMap {
        let (first, end) = self.clip(first, n);
        let out = PageMap::new(n);
        // Source page p is page p - first of `out`: bit b of source word w goes to bit
        // (b - s) mod 64 of word w - w0 (b >= s) or w - w0 - 1 (b < s).
        let (w0, s) = (first / 64, first % 64);
        self.each_chunk(first, end, false, |w, _, words| {
            for (w, word) in (w..).zip(words.unwrap_or_default()) {
                let v = word.load(Relaxed) & word_mask(w, first, end);
                if v == 0 {
                    continue;
                }
                let d = w - w0;
                out.or_word(d, v >> s);
                if s != 0 && d > 0 {
                    out.or_word(d - 1, v << (64 - s));
                }
            }
        });
        out
    }
}

impl Drop for PageMap {
    fn drop(&mut self) {
        let arena = self.arena.load(Acquire);
        if arena != 0 {
            // SAFETY: the map's own arena, and the map is dropped (`&mut self`).
            let _ = unsafe { mman::unmap(arena, self.arena_bytes()) };
        }
        if self.dir != 0 {
            // SAFETY: as above, for its directory.
            let _ = unsafe { mman::unmap(self.dir, self.dir_bytes) };
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "test data patterns"
)]
mod tests {
    use super::*;
    use crate::testing::Lcg;
    use std::sync::Arc;

    #[test]
    fn claim_returns_the_missing_runs_and_takes_them() {
        let m = PageMap::new(200);
        m.set(5, 1);
        m.set(64, 3);
        let mut runs = vec![];
        m.claim(0, 130, &mut runs);
        assert_eq!(runs, vec![(0, 5), (6, 58), (67, 63)]);
        runs.clear();
        m.claim(0, 130, &mut runs);
        assert!(runs.is_empty());
        assert_eq!(m.count(), 130);
    }

    #[test]
    fn runs_merge_across_word_boundaries_and_clip_at_the_end() {
        let m = PageMap::new(150);
        let mut runs = vec![];
        m.claim(60, 1000, &mut runs);
        assert_eq!(runs, vec![(60, 90)]);
        assert!(m.is_claimed(149) && !m.is_claimed(59) && !m.is_claimed(150));
    }

    #[test]
    fn claimed_runs_are_the_set_bits_in_runs() {
        let m = PageMap::new(300);
        m.set(3, 5);
        m.set(60, 10); // across a word boundary
        m.set(290, 20); // clipped at the end
        let mut runs = vec![];
        m.claimed_runs(0, 300, &mut runs);
        assert_eq!(runs, [(3, 5), (60, 10), (290, 10)]);
        runs.clear();
        m.claimed_runs(5, 60, &mut runs);
        assert_eq!(runs, [(5, 3), (60, 5)]);
    }

    #[test]
    fn clear_counts_and_forgets() {
        let m = PageMap::new(128);
        m.set(0, 128);
        assert_eq!(m.clear(10, 20), 20);
        assert_eq!(m.clear(10, 20), 0);
        assert_eq!(m.count(), 108);
        let mut runs = vec![];
        m.claim(0, 128, &mut runs);
        assert_eq!(runs, vec![(10, 20)]);
    }

    #[test]
    fn slice_copies_bits() {
        let m = PageMap::new(256);
        m.set(100, 10);
        let s = m.slice(96, 64);
        assert_eq!(s.pages(), 64);
        assert_eq!(s.count(), 10);
        assert!(s.is_claimed(4) && s.is_claimed(13) && !s.is_claimed(14));
    }

    /// Four threads each claiming `rounds` windows `(first, pages)` that `pick` chooses from
    /// its own generator. Checks that no page was handed out twice and that the map counts
    /// them; returns every page claimed, sorted.
    fn claim_from_four_threads(
        m: &Arc<PageMap>,
        rounds: usize,
        pick: impl Fn(&mut Lcg) -> (u64, u64) + Send + Sync + 'static,
    ) -> Vec<u64> {
        let pick = Arc::new(pick);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (m, pick) = (m.clone(), pick.clone());
                std::thread::spawn(move || {
                    let mut got = vec![];
                    let mut g = Lcg(t + 1);
                    for _ in 0..rounds {
                        let (first, n) = pick(&mut g);
                        let mut runs = vec![];
                        m.claim(first, n, &mut runs);
                        got.extend(runs.iter().flat_map(|(s, l)| *s..*s + *l));
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a page was claimed twice");
        assert_eq!(n as u64, m.count());
        all
    }

    #[test]
    fn concurrent_claims_never_hand_out_a_page_twice() {
        let m = Arc::new(PageMap::new(4096));
        claim_from_four_threads(&m, 2000, |g| (g.below(4096), 1 + g.below(100)));
    }

    #[test]
    fn a_16_tib_map_costs_what_is_touched() {
        let t = std::time::Instant::now();
        let pages = 1u64 << 32; // 16 TiB of 4 KiB pages
        let m = PageMap::new(pages);
        assert_eq!(m.kind, Storage::Mapped);
        let dir = m.metadata_bytes();
        assert_eq!(dir, (pages / LEAF_PAGES * 8) as usize, "1 MiB of directory");
        assert_eq!(m.count(), 0);
        assert!(!m.is_claimed(123_456_789));

        let edge = 7 * LEAF_PAGES; // a leaf boundary
        let mid = (1 << 31) + 12_345;
        let mut runs = vec![];
        m.claim(0, 5, &mut runs);
        m.claim(edge - 10, 20, &mut runs);
        m.claim(mid, 1000, &mut runs);
        m.claim(pages - 3, u64::MAX, &mut runs); // clipped at the end
        assert_eq!(runs, vec![(0, 5), (edge - 10, 20), (mid, 1000), (pages - 3, 3)]);
        runs.clear();
        m.claim(edge - 20, 40, &mut runs); // half of it was claimed
        assert_eq!(runs, vec![(edge - 20, 10), (edge + 10, 10)]);
        assert_eq!(m.count(), 5 + 40 + 1000 + 3);
        assert_eq!(m.count_range(edge - 1, 2), 2);
        assert_eq!(m.count_range(mid + 999, pages), 1 + 3);
        assert!(m.is_claimed(edge - 1) && m.is_claimed(edge) && m.is_claimed(pages - 1));
        assert!(!m.is_claimed(5) && !m.is_claimed(mid - 1) && !m.is_claimed(mid + 1000));
        // Leaves: 0, 6, 7, the middle one, the last.
        assert_eq!(m.metadata_bytes(), dir + 5 * LEAF_BYTES);

        // Clearing a huge span touches only the leaves there; absent ones stay absent.
        assert_eq!(m.clear(3, pages - 6), 2 + 40 + 1000);
        assert_eq!(m.count(), 3 + 3);
        assert_eq!(m.clear(LEAF_PAGES, pages / 2), 0);
        assert_eq!(m.metadata_bytes(), dir + 5 * LEAF_BYTES);
        m.set(mid, 64);

        // A slice at an unaligned offset, across leaves, gets leaves only where there are bits.
        let first = edge - 12_345;
        let s = m.slice(first, pages - first);
        assert_eq!(s.pages(), pages - first);
        assert_eq!(s.count(), 64 + 3);
        assert!(s.is_claimed(mid - first) && s.is_claimed(mid + 63 - first) && !s.is_claimed(mid + 64 - first));
        assert!(s.is_claimed(pages - 1 - first) && !s.is_claimed(pages - 4 - first));
        assert!(s.metadata_bytes() <= dir + 3 * LEAF_BYTES, "{}", s.metadata_bytes());
        let head = m.slice(0, 5);
        assert_eq!((head.kind, head.count(), head.metadata_bytes()), (Storage::Bits, 3, 0));

        assert!(m.metadata_bytes() + s.metadata_bytes() < 4 << 20);
        drop((m, s));
        assert!(t.elapsed().as_millis() < 2000, "took {:?}", t.elapsed());
    }

    /// The bits of `m` as bools (for comparison with a reference).
    fn bits(m: &PageMap) -> Vec<bool> {
        (0..m.pages()).map(|p| m.is_claimed(p)).collect()
    }

    #[test]
    fn slice_and_count_range_match_a_naive_copy_across_leaves() {
        let mut g = Lcg(42);
        // Every kind of map: inline bits, inline directory, mapped directory.
        for pages in [1000, 3 * LEAF_PAGES + 77, 20 * LEAF_PAGES + 5] {
            let m = PageMap::new(pages);
            let mut reference = vec![false; pages as usize];
            for _ in 0..200 {
                // Runs of all lengths, many near leaf boundaries.
                let at = if g.below(2) == 0 {
                    (g.below(pages / LEAF_PAGES + 1) * LEAF_PAGES).saturating_sub(g.below(300))
                } else {
                    g.below(pages)
                };
                let n = [1, 63, 64, 65, 700, 5000][g.below(6) as usize];
                let end = (at + n).min(pages);
                let v = g.below(3) != 0;
                if v {
                    m.set(at, n);
                } else {
                    assert_eq!(
                        m.clear(at, n),
                        reference[at as usize..end as usize].iter().filter(|b| **b).count() as u64
                    );
                }
                reference[at as usize..end as usize].fill(v);
            }
            assert_eq!(m.count(), reference.iter().filter(|b| **b).count() as u64);
            for _ in 0..40 {
                let first = if g.below(2) == 0 {
                    (g.below(pages / LEAF_PAGES + 1) * LEAF_PAGES).saturating_sub(g.below(130))
                } else {
                    g.below(pages)
                };
                let n = [1, 64, 1000, 1024, 1025, 40_000, 2 * LEAF_PAGES + 3][g.below(7) as usize];
                let end = (first + n).min(pages) as usize;
                let want = &reference[first as usize..end];
                let ones = want.iter().filter(|b| **b).count() as u64;
                assert_eq!(m.count_range(first, n), ones, "count_range({first}, {n}) of {pages}");
                let s = m.slice(first, n);
                assert_eq!(s.pages(), n);
                assert_eq!(s.count(), ones, "slice({first}, {n}) of {pages}");
                let got = bits(&s);
                assert_eq!(&got[..want.len()], want, "slice({first}, {n}) of {pages}");
                assert!(got[want.len()..].iter().all(|b| !b));
            }
        }
    }

    #[test]
    fn racing_threads_make_each_leaf_once_and_claim_each_page_once() {
        let pages = 1u64 << 32;
        let m = Arc::new(PageMap::new(pages));
        // Leaf boundaries: claims around them race to make both leaves.
        let spots: Vec<u64> = (1..=64).map(|i| i * (pages / 65) / LEAF_PAGES * LEAF_PAGES).collect();
        let all = claim_from_four_threads(&m, 3000, move |g| {
            (spots[g.below(64) as usize] - 1000 + g.below(2000), 1 + g.below(100))
        });
        let mut leaves: Vec<u64> = all.iter().map(|p| p / LEAF_PAGES).collect();
        leaves.dedup();
        assert_eq!(
            m.metadata_bytes(),
            m.dir_bytes + leaves.len() * LEAF_BYTES,
            "one leaf each"
        );
    }

    #[test]
    fn without_a_directory_every_page_is_ours_and_nothing_is_recorded() {
        // What PageMap::new makes when the directory cannot be mapped.
        let m = PageMap {
            pages: 1 << 32,
            kind: Storage::Lost,
            dir: 0,
            dir_bytes: 0,
            arena: AtomicUsize::new(0),
            leaves: AtomicUsize::new(0),
            inline: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        let mut runs = vec![];
        m.claim(LEAF_PAGES - 64, 200, &mut runs);
        assert_eq!(runs, vec![(LEAF_PAGES - 64, 200)]);
        m.set(0, 1 << 20);
        assert!(!m.is_claimed(LEAF_PAGES) && !m.is_claimed(0));
        assert_eq!((m.count(), m.clear(0, 1 << 32), m.metadata_bytes()), (0, 0, 0));
        assert_eq!(m.slice(5, 1 << 31).count(), 0);
    }
}

/// Loom models of the page map's claim and clear (`RUSTFLAGS="--cfg loom"`, see `.ci/run`), on
/// a map whose bits are inline: the same words and the same `fetch_or` / `fetch_and` as every
/// map.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::PageMap;
    use crate::sync::loom_model as model;
    use loom::sync::Arc;
    use loom::thread;

    /// Pages of `runs`, one entry each.
    fn pages(runs: &[(u64, u64)]) -> Vec<u64> {
        runs.iter().flat_map(|&(f, n)| f..f + n).collect()
    }

    #[test]
    fn loom_two_claimers_of_overlapping_windows_install_each_page_once() {
        model(|| {
            // 128 pages: two words; the windows overlap across the word boundary.
            let m = Arc::new(PageMap::new(128));
            let claim = |first, n| {
                let m = m.clone();
                thread::spawn(move || {
                    let mut runs = vec![];
                    m.claim(first, n, &mut runs);
                    pages(&runs)
                })
            };
            let (a, b) = (claim(40, 40), claim(60, 40));
            let (a, b) = (a.join().unwrap(), b.join().unwrap());
            let mut all: Vec<u64> = a.iter().chain(&b).copied().collect();
            all.sort_unstable();
            assert_eq!(all, (40..100).collect::<Vec<_>>(), "a page claimed twice or by nobody");
            assert_eq!(m.count(), 60);
        });
    }

    #[test]
    fn loom_a_clear_racing_claims_loses_no_count() {
        model(|| {
            // A window claimed twice (the second claimer installs only what the first left)
            // while an event clears part of it: every bit set was claimed by someone, and
            // every claimed bit is either still set or was counted by the clear.
            let m = Arc::new(PageMap::new(64));
            let claimers: Vec<_> = [(0, 48), (16, 48)]
                .into_iter()
                .map(|(first, n)| {
                    let m = m.clone();
                    thread::spawn(move || {
                        let mut runs = vec![];
                        m.claim(first, n, &mut runs);
                        pages(&runs).len() as u64
                    })
                })
                .collect();
            let clear = {
                let m = m.clone();
                thread::spawn(move || m.clear(8, 32))
            };
            let claimed: u64 = claimers.into_iter().map(|c| c.join().unwrap()).sum();
            let cleared = clear.join().unwrap();
            assert_eq!(claimed, m.count() + cleared, "claims and clears do not add up");
        });
    }
}
