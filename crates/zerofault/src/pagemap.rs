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
//! Ordering: every operation is a single read-modify-write on one word, and RMWs on one
//! location are totally ordered, which is all that exclusivity needs. The bits guard no
//! user-space data (the page contents are installed by the kernel under its own locks), so
//! `Relaxed` is enough throughout.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One bit per page.
#[derive(Debug)]
pub struct PageMap {
    words: Box<[AtomicU64]>,
    pages: u64,
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

impl PageMap {
    pub fn new(pages: u64) -> PageMap {
        PageMap {
            words: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            pages,
        }
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Applies `op(word, mask)` to every word overlapping `[first, first + n)`, returning the
    /// previous value of each word masked to the range, with its word index.
    fn each_word(&self, first: u64, n: u64, mut op: impl FnMut(&AtomicU64, u64, u64)) {
        let end = (first + n).min(self.pages);
        if first >= end {
            return;
        }
        for w in first / 64..=(end - 1) / 64 {
            op(&self.words[w as usize], w, word_mask(w, first, end));
        }
    }

    /// Whether `page` is claimed.
    pub fn is_claimed(&self, page: u64) -> bool {
        page < self.pages && self.words[(page / 64) as usize].load(Relaxed) & (1 << (page % 64)) != 0
    }

    /// Claims every unclaimed page of `[first, first + n)`. Appends to `runs` the maximal runs
    /// `(first_page, pages)` that this call claimed, in ascending order.
    pub fn claim(&self, first: u64, n: u64, runs: &mut Vec<(u64, u64)>) {
        self.each_word(first, n, |word, w, mask| {
            let mut new = mask & !word.fetch_or(mask, Relaxed);
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
        });
    }

    /// Clears the bits of `[first, first + n)`; returns how many were set.
    pub fn clear(&self, first: u64, n: u64) -> u64 {
        let mut cleared = 0;
        self.each_word(first, n, |word, _, mask| {
            cleared += (word.fetch_and(!mask, Relaxed) & mask).count_ones() as u64;
        });
        cleared
    }

    /// Sets every bit of `[first, first + n)` (pages that are not ours to install).
    pub fn set(&self, first: u64, n: u64) {
        self.each_word(first, n, |word, _, mask| {
            word.fetch_or(mask, Relaxed);
        });
    }

    /// How many pages are claimed.
    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| w.load(Relaxed).count_ones() as u64).sum()
    }

    /// A new map of `n` pages whose bits are copied from `[first, first + n)` of this one
    /// (a region split by munmap or moved by mremap).
    pub fn slice(&self, first: u64, n: u64) -> PageMap {
        let out = PageMap::new(n);
        for i in 0..n {
            if self.is_claimed(first + i) {
                out.set(i, 1);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn concurrent_claims_never_hand_out_a_page_twice() {
        let m = Arc::new(PageMap::new(4096));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    let mut got = vec![];
                    let mut x = t as u64 * 7919 + 1;
                    for _ in 0..2000 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        let first = (x >> 33) % 4096;
                        let mut runs = vec![];
                        m.claim(first, 1 + (x >> 20) % 100, &mut runs);
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
    }
}
