//! [`PmdShuttle`]: one huge page moved back and forth between two PMDs with `UFFDIO_MOVE`, the
//! instrument of `zerofault bench-flush`.
//!
//! Every huge page the engine moves into a program clears a PMD of the pool, and the kernel
//! flushes that PMD from the TLB of every CPU then running a thread of the process: one
//! interrupt per CPU, which the mover waits for (x86 `flush_tlb_mm_range` over the mm's CPU
//! mask; CPUs idle or running other processes are skipped). `bench-flush` times these moves
//! with and without the program's threads running on the other CPUs, which is the term of
//! docs/SCALING.md's model that grows with the threads of one process.

use crate::sys::populate_write;
use zerofault::os::mman::{self, Mapping, Thp, PAGE_SIZE, PMD_SIZE};
use zerofault::os::uffd::{Features, Uffd};

/// A huge page that moves between the two PMDs of a mapping of its own, one `UFFDIO_MOVE` of a
/// whole PMD per [`PmdShuttle::shuttle`]. Nothing else in the process knows its memory.
#[derive(Debug)]
pub(crate) struct PmdShuttle {
    // Declared before `map`, so dropped first: closing the descriptor unregisters the mapping,
    // whose munmap would otherwise wait for a reader of its UNMAP event.
    uffd: Uffd,
    map: Mapping,
    at_second: bool,
}

impl PmdShuttle {
    /// Maps two PMDs advised huge, populates the first with one huge page and registers both
    /// as `UFFDIO_MOVE` destinations. Errors (one line): no userfaultfd, a kernel without
    /// `UFFDIO_MOVE`, or no huge page (THP `never`, or none free).
    pub(crate) fn new() -> Result<PmdShuttle, String> {
        let uffd = Uffd::open().map_err(|e| format!("userfaultfd: {e}"))?;
        if !uffd.features().has(Features::MOVE) {
            return Err("this kernel has no UFFDIO_MOVE (Linux 6.8 or later)".into());
        }
        let map = Mapping::new(2 * PMD_SIZE, Thp::Always).map_err(|e| format!("mmap: {e}"))?;
        let a = map.as_ptr() as usize;
        // A child forked meanwhile (by any thread) would share the page, which UFFDIO_MOVE
        // then refuses (EBUSY) until the child goes: keep the mapping out of children.
        // SAFETY: our own fresh mapping; the advice changes no content.
        unsafe { mman::madvise(a, 2 * PMD_SIZE, libc::MADV_DONTFORK) }.map_err(|e| format!("MADV_DONTFORK: {e}"))?;
        populate_write(a, PMD_SIZE).map_err(|e| format!("MADV_POPULATE_WRITE: {e}"))?;
        // A byte in every 4 KiB page: the kernel's shrinker of underused huge pages (6.12+) may
        // split a huge page that is mostly zero under memory pressure.
        for off in (0..PMD_SIZE).step_by(PAGE_SIZE) {
            // SAFETY: inside the first PMD of our own mapping, just populated.
            unsafe { ((a + off) as *mut u8).write_volatile(1) };
        }
        if !mman::huge_mapped(a).map_err(|e| format!("PAGEMAP_SCAN: {e}"))? {
            return Err("the kernel gave no huge page (THP never, or none free)".into());
        }
        uffd.register_as_destination(a, 2 * PMD_SIZE)
            .map_err(|e| format!("UFFDIO_REGISTER: {e}"))?;
        Ok(PmdShuttle {
            uffd,
            map,
            at_second: false,
        })
    }

    /// The PMD the huge page is in now.
    pub(crate) fn addr(&self) -> usize {
        self.map.as_ptr() as usize + if self.at_second { PMD_SIZE } else { 0 }
    }

    /// Moves the huge page into the other PMD: one PMD move (one TLB flush). After an error
    /// the page may be partly in each PMD and [`PmdShuttle::addr`] no longer says where: drop
    /// the shuttle.
    pub(crate) fn shuttle(&mut self) -> Result<(), String> {
        let src = self.addr();
        let dst = self.map.as_ptr() as usize + if self.at_second { 0 } else { PMD_SIZE };
        // SAFETY: both PMDs are this shuttle's own memory, which nothing reads or writes; the
        // page's bytes are ours, and reading as missing at `src` afterwards is what we want.
        let p = unsafe { self.uffd.move_pages(dst, src, PMD_SIZE) };
        match p.errno {
            None => {
                self.at_second = !self.at_second;
                Ok(())
            }
            Some(e) => Err(format!("UFFDIO_MOVE of a huge page: {e} ({} bytes moved)", p.done)),
        }
    }

    /// Whether the page is still one huge page where it is now (a PMD move keeps it whole;
    /// a split would have made this a 4 KiB move).
    pub(crate) fn is_huge(&self) -> Result<bool, String> {
        mman::huge_mapped(self.addr()).map_err(|e| format!("PAGEMAP_SCAN: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the page at `addr` is resident (mincore).
    fn resident(addr: usize) -> bool {
        mman::resident_pages(addr, PAGE_SIZE).unwrap() == 1
    }

    #[test]
    fn a_shuttled_page_stays_huge_and_keeps_its_bytes() {
        let mut s = match PmdShuttle::new() {
            Ok(s) => s,
            Err(e) if e.starts_with("userfaultfd") => {
                assert!(
                    std::env::var_os("ZEROFAULT_REQUIRE_UFFD").is_none(),
                    "userfaultfd is required: {e}"
                );
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) if !mman::thp_available() => {
                assert!(e.contains("no huge page"), "{e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let first = s.addr();
        // SAFETY: the shuttle's own page, present (populated) and not moving now.
        unsafe { ((first + 4096 + 8) as *mut u64).write_volatile(0x5a5a) };
        for i in 0..5 {
            s.shuttle().unwrap();
            assert_ne!(s.addr() == first, i % 2 == 0, "the page alternates between the PMDs");
        }
        assert!(s.is_huge().unwrap(), "moved whole, five times");
        // SAFETY: as above; after an odd number of moves the page is in the second PMD.
        assert_eq!(unsafe { ((s.addr() + 4096 + 8) as *const u64).read_volatile() }, 0x5a5a);
        assert!(resident(s.addr()) && !resident(first), "the first PMD is empty");
    }
}
