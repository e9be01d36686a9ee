//! Where zero bytes come from.
//!
//! - **Pool pages** are zeroed by the kernel when the scrub thread populates them
//!   (`MADV_POPULATE_WRITE` allocates zero-filled pages, 4 KiB or 2 MiB huge), away from any
//!   fault; a huge page the handler prepares itself is zeroed the same way, in its staging
//!   area. Seed 003's point holds: zeroing pays only for pages that are cold, and a freshly
//!   allocated page is.
//! - **The copy path** (pool empty, `pool=off`, no UFFDIO_MOVE, or a move refused) installs
//!   pages with `UFFDIO_COPY` from a [`ZeroSource`]: a read-only mapping whose every page is
//!   the kernel's shared zero page. The kernel's copy then reads one physical page that stays in
//!   cache, which beats copying from a memset buffer (docs/DESIGN.md).

use crate::sys::mman::{self, PAGE_SIZE, PMD_SIZE};
use std::io;

/// A read-only run of zero pages, the source of every UFFDIO_COPY.
#[derive(Debug)]
pub(crate) struct ZeroSource {
    addr: usize,
    len: usize,
}

impl ZeroSource {
    /// Bytes one copy may take from the source at most.
    pub(crate) const LEN: usize = PMD_SIZE;

    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn new() -> io::Result<ZeroSource> {
        let len = Self::LEN;
        let addr = mman::map_aligned(len, PMD_SIZE, libc::PROT_READ, true)?;
        // 4 KiB zero pages, not the huge zero page: one 4 KiB frame stays hot in cache.
        // SAFETY: a fresh mapping of ours; huge-page advice changes no content.
        let _ = unsafe { mman::madvise(addr, len, mman::MADV_NOHUGEPAGE) };
        let z = ZeroSource { addr, len };
        // Map the zero page everywhere now, so that no copy takes a fault on its source: one
        // call (a read fault per page would lengthen every start), or the reads where the
        // call is refused.
        if mman::populate_read(addr, len).is_err() {
            let pages = z.as_slice();
            for i in (0..len).step_by(PAGE_SIZE) {
                // black_box: the read is the point (it maps the zero page); keep it in release.
                std::hint::black_box(pages[i]);
            }
        }
        Ok(z)
    }

    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn addr(&self) -> usize {
        self.addr
    }

    /// The mapping, as (address, length).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn area(&self) -> (usize, usize) {
        (self.addr, self.len)
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: [addr, addr + len) is a live read-only anonymous mapping owned by `self`
        // until drop; nobody can write to it (PROT_READ), so shared references are sound.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

impl Drop for ZeroSource {
    fn drop(&mut self) {
        // SAFETY: the source is ours, and dropped (copies borrow it through `&self`).
        let _ = unsafe { mman::unmap(self.addr, self.len) };
    }
}

/// Whether every byte of `bytes` is zero (word at a time).
///
/// # Context
/// Any thread; reads the source.
pub fn is_zero(bytes: &[u8]) -> bool {
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to only reinterprets the aligned middle.
        unsafe { bytes.align_to::<u64>() }
    };
    head.iter().all(|b| *b == 0) && words.iter().all(|w| *w == 0) && tail.iter().all(|b| *b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zero_source_reads_zero() {
        let z = ZeroSource::new().unwrap();
        // Mapped before any read of ours: every page is in the page tables already.
        let (addr, len) = z.area();
        assert_eq!(mman::resident_pages(addr, len).unwrap(), len / PAGE_SIZE);
        assert!(is_zero(z.as_slice()));
    }

    #[test]
    fn is_zero_finds_any_nonzero_byte() {
        let mut v = vec![0u8; 4099];
        assert!(is_zero(&v));
        for i in [0, 7, 8, 2048, 4098] {
            v[i] = 1;
            assert!(!is_zero(&v), "{i}");
            v[i] = 0;
        }
    }
}
