//! Installing pages: the verbs of mm/userfaultfd.c (`fill_move`, `fill_copy`,
//! `fill_zeropage`), the loop they share, and the policy that picks among them.

use super::locate::Located;
use super::{Filled, Handler, Kernel, Stop, Stopped, EVENT_RETRIES};
use crate::fault::window::Outcome;
use crate::memory::nodes::RingKind;
use crate::memory::region::Range;
use crate::page::{bytes, pages, PAGE_SIZE, PMD_SIZE};
use crate::pool::tried_bit;
use crate::pool::zero::source::ZeroSource;
use crate::pool::Ring;
use crate::stats::Stats;
use crate::sys::raw::Errno;
use crate::sys::uffd::Progress;
use std::cell::Cell;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

impl<K: Kernel> Handler<'_, K> {
    /// Claims the window `w` of `range` for the fault at `page_addr`, installs the runs this
    /// claim won (last first), releases what did not go in, and wakes the fault if no install
    /// covered it.
    ///
    /// Returns the first page from the fault on that a stop left out (its thread faults there
    /// next), if any.
    ///
    /// # Context
    /// A handler. Its ioctls (`UFFDIO_MOVE`, `COPY`, `ZEROPAGE`) may sleep on the mmap lock and on
    /// page allocation; it takes no lock of the engine's, ring slots lock-free.
    pub(crate) fn install_window(&mut self, range: &Range, page_addr: usize, w: Located) -> Option<u64> {
        self.fault_page = page_addr;
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        match w.probe {
            // The probe stays missing: the stream's next fault there, or past it, tells
            // whether the program writes every page.
            Some(p) => {
                range.map.claim(w.first, p - w.first, &mut runs);
                range.map.claim(p + 1, w.end - p - 1, &mut runs);
            }
            None => range.map.claim(w.first, w.end - w.first, &mut runs),
        }
        if self.reading {
            // A read served from the pool: its samples stay the zero page (reads.rs).
            self.samples = self.place_samples(range, self.samples, &mut runs);
        }
        let mut woken = false;
        let mut cut: Option<usize> = None;
        // Last run first, for the reason install_write gives.
        for &(first, n) in runs.iter().rev() {
            let dst = range.addr_of(first);
            let len = bytes(n);
            let done = self.install_run(dst, len, w.write, range);
            let stop = match done {
                Ok(()) => dst + len,
                Err(s) => dst + s.at,
            };
            // A window that runs past the end of the mapping (into a PROT_NONE or unmapped
            // neighbour: memory committed with mprotect piece by piece) is refused whole.
            // The part from the fault on is then installed in pieces that fit.
            let refused = done.is_err_and(|s| s.why.refused_whole());
            let (from, to) = if stop <= page_addr && page_addr < dst + len && refused {
                (
                    page_addr,
                    self.install_to_boundary(page_addr, dst + len, w.write, range),
                )
            } else {
                (stop, stop)
            };
            // Release what was not installed, so that a later window tries it again.
            for (a, b) in [(stop, from), (to, dst + len)] {
                if a < b {
                    range.map.clear(range.page_of(a), pages(b - a));
                }
            }
            woken |= page_addr >= dst && (page_addr < stop || page_addr < to);
            // The thread faults next at the first page left out from its own on (a whole-PMD
            // run that stopped reports its start, which may lie before the fault's page).
            if stop < dst + len && page_addr < dst + len && !refused {
                let at = stop.max(page_addr);
                cut = Some(cut.map_or(at, |c| c.min(at)));
            }
        }
        self.runs = runs;
        if !woken {
            self.wake(page_addr);
        }
        // A predicted write wants the pool; not a window that probes again (a stream that may
        // be sparse: its pages would fill a pool for nothing).
        if w.outcome == Outcome::Hit && w.write && w.probe.is_none() {
            self.want_pool();
        }
        cut.map(|c| range.page_of(c))
    }

    /// One run of a window: zero pages for a write, zero-page mappings for a read.
    fn install_run(&mut self, dst: usize, len: usize, write: bool, range: &Range) -> Filled {
        if write {
            self.install_write(dst, len, Some(range))
        } else {
            range.pmds.mark_tables(dst, len);
            self.fill_zeropage(dst, len)
        }
    }

    /// Installs `[from, end)` up to the end of the mapping: a piece the kernel refuses as
    /// crossing it (ENOENT, EINVAL) is halved, and nothing past the refused piece's last page is
    /// tried again, so that the memory beyond (`PROT_NONE`, not yet committed by the program)
    /// is not populated. Stops at a refused one-page piece or any other stop. Returns where
    /// the installed part from `from` ends (`from`: nothing).
    fn install_to_boundary(&mut self, from: usize, mut end: usize, write: bool, range: &Range) -> usize {
        let mut at = from;
        let mut piece = ((end - from) / 2).next_multiple_of(PAGE_SIZE);
        while at < end {
            let len = piece.min(end - at);
            match self.install_run(at, len, write, range) {
                Ok(()) => at += len,
                Err(s) => {
                    // If refused, the end of the mapping lies inside this piece.
                    let last = at + len - PAGE_SIZE;
                    at += s.at;
                    if !s.why.refused_whole() || len == PAGE_SIZE {
                        break;
                    }
                    end = last;
                    piece = (len / 2).next_multiple_of(PAGE_SIZE);
                }
            }
        }
        Stats::add(&self.stats().windows_clipped, 1);
        at
    }

    /// Serves one page outside the window logic (already-claimed or unknown pages) and wakes it.
    ///
    /// # Context
    /// A handler. Its ioctls (`UFFDIO_MOVE`, `COPY`, `ZEROPAGE`) may sleep on the mmap lock and on
    /// page allocation; it takes no lock of the engine's, ring slots lock-free.
    pub(crate) fn install_one(&mut self, page_addr: usize, write: bool) {
        self.fault_page = page_addr;
        let filled = if write {
            self.install_write(page_addr, PAGE_SIZE, None)
        } else {
            self.fill_zeropage(page_addr, PAGE_SIZE)
        };
        if let Err(s) = filled {
            // The thread is woken either way and faults again if it still needs the page.
            let stats = self.stats();
            Stats::add(
                match s.why {
                    // The memory was unmapped, moved, unregistered or changed since the fault.
                    Stop::Kernel(Errno(libc::ENOENT | libc::EINVAL | libc::EFAULT | libc::ESRCH)) => {
                        &stats.installs_raced_unmap
                    }
                    // Mappings kept changing (munmap/madvise/mremap events each time).
                    Stop::Kernel(Errno(libc::EAGAIN)) => &stats.installs_raced_events,
                    _ => &stats.install_errors,
                },
                1,
            );
        }
        self.wake(page_addr);
    }

    /// Where the accessible memory around the faulting page ends: the end of the run of
    /// mappings that are not `PROT_NONE` from the one holding it (`usize::MAX` if unknown).
    /// Read from /proc/self/maps once and kept until a page falls outside it or an event
    /// (munmap, mremap, a discard) may have changed the mappings; an `mprotect` makes no
    /// event, so a kept end can be stale until then.
    ///
    /// # Context
    /// A handler; may read /proc/self/maps (through the `Kernel` seam), takes no lock.
    pub(crate) fn mapping_end(&mut self) -> usize {
        self.mapping_around(self.fault_page).map_or(usize::MAX, |(_, hi)| hi)
    }

    /// The run of mappings that are not `PROT_NONE` holding `a`, as `[lo, hi)` (`None` if
    /// unknown), cached as [`Self::mapping_end`] says.
    ///
    /// # Context
    /// A handler; may read /proc/self/maps (through the `Kernel` seam), takes no lock.
    pub(crate) fn mapping_around(&mut self, a: usize) -> Option<(usize, usize)> {
        // Before the table is read: an event after this load moves `events` on and makes the
        // next call read again.
        let events = self.shared.events.load(Acquire);
        if events != self.mapping_events {
            self.mapping = None;
        }
        if let Some(m) = self.mapping.filter(|&(lo, hi)| lo <= a && a < hi) {
            return Some(m);
        }
        self.mapping_events = events;
        self.mapping = self.kernel.mapping_of(a);
        self.mapping
    }

    /// The loop every install shares: calls `op(offset, len)` until `len` bytes are done,
    /// skipping present pages. `op` returns the ioctl's progress, or a stop of its own;
    /// `on_enoent` is asked what to do on ENOENT (true: a source page was a hole and was
    /// skipped, retry).
    ///
    /// # Context
    /// A handler. Its ioctls (`UFFDIO_MOVE`, `COPY`, `ZEROPAGE`) may sleep on the mmap lock and on
    /// page allocation; it takes no lock of the engine's, ring slots lock-free.
    pub(crate) fn install_loop(
        &mut self,
        len: usize,
        mut op: impl FnMut(&mut Self, usize, usize) -> Result<Progress, Stop>,
        mut on_enoent: impl FnMut(&mut Self, usize) -> bool,
    ) -> Filled {
        let mut off = 0;
        let mut retries = 0;
        while off < len {
            if let Some(e) = self.fatal {
                // Failing open: no more ioctls, the kernel answers from here.
                return Err(Stopped {
                    at: off,
                    why: Stop::Kernel(e),
                });
            }
            let p = op(self, off, len - off).map_err(|why| Stopped { at: off, why })?;
            off += p.done;
            match p.errno {
                None => {}
                Some(Errno(libc::EEXIST)) => {
                    Stats::add(&self.stats().partial_installs, 1);
                    self.partials += 1;
                    off += PAGE_SIZE;
                }
                Some(Errno(libc::EAGAIN)) if p.done > 0 => {}
                Some(e @ Errno(libc::EAGAIN)) => {
                    retries += 1;
                    if retries > EVENT_RETRIES {
                        return Err(Stopped {
                            at: off,
                            why: Stop::Kernel(e),
                        });
                    }
                    self.drain_events(retries);
                }
                Some(Errno(libc::ENOENT)) if on_enoent(self, off) => {}
                Some(e) => {
                    return Err(Stopped {
                        at: off,
                        why: Stop::Kernel(e),
                    })
                }
            }
        }
        Ok(())
    }

    /// Installs zero pages for a write. The whole PMDs of the span whose table bit is clear get
    /// huge pages ([`Self::install_huge`]); everything else gets 4 KiB pages
    /// ([`Self::install_small`]), and its PMDs are marked as holding a page table.
    ///
    /// The pieces go in from the last to the first. The faulting page is in the first one, and
    /// an install wakes the thread waiting there: woken early, it would run on into the pieces
    /// not yet installed and fault there, and its fault gives that PMD a page table, which
    /// splits the huge page moved into it next (most of a millisecond). If a piece stops, the whole span is
    /// reported stopped at its start: pages already installed only leave stale bits behind,
    /// which cost an EEXIST later, never a hang.
    ///
    /// # Context
    /// A handler. Its ioctls (`UFFDIO_MOVE`, `COPY`, `ZEROPAGE`) may sleep on the mmap lock and on
    /// page allocation; it takes no lock of the engine's, ring slots lock-free.
    pub(crate) fn install_write(&mut self, dst: usize, len: usize, range: Option<&Range>) -> Filled {
        if self.shared.pool_paused.load(Relaxed) {
            if let Some(r) = range {
                r.pmds.mark_tables(dst, len);
            }
            return self.fill_copy_or_zero(dst, len, None);
        }
        let mut pieces = std::mem::take(&mut self.pieces);
        pieces.clear();
        let mut off = 0;
        while off < len {
            let at = dst + off;
            let rest = len - off;
            let huge_ok = self.stage.is_some() && !self.shared.thp_disabled.load(Relaxed);
            let (n, huge) = match range.filter(|_| huge_ok) {
                Some(r) => match r.pmds.clear_run(at, rest, r.huge_by_default(self.shared.thp_always)) {
                    // 4 KiB pages up to the next PMD boundary, where huge pages may start.
                    0 => (((at / PMD_SIZE + 1) * PMD_SIZE - at).min(rest), false),
                    k => (k * PMD_SIZE, true),
                },
                None => (rest, false),
            };
            pieces.push((at, n, huge));
            off += n;
        }
        let mut filled = Ok(());
        for &(at, n, huge) in pieces.iter().rev() {
            let piece = match (range, huge) {
                (Some(r), true) => self.install_huge(at, n, r),
                (r, _) => {
                    if let Some(r) = r {
                        r.pmds.mark_tables(at, n);
                    }
                    self.install_small(at, n)
                }
            };
            if let Err(s) = piece {
                filled = Err(Stopped { at: 0, why: s.why });
                break;
            }
        }
        self.pieces = pieces;
        filled
    }

    /// 4 KiB pages: moved from the small ring while it has pages, else copied. With a pool per
    /// node, from the rings [`Handler::pool_for`] picks, one after the other as they run dry;
    /// under an interleave policy one page at a time, each from its own node's ring.
    ///
    /// # Context
    /// A handler. Its ioctls (`UFFDIO_MOVE`, `COPY`, `ZEROPAGE`) may sleep on the mmap lock and on
    /// page allocation; it takes no lock of the engine's, ring slots lock-free.
    pub(crate) fn install_small(&mut self, dst: usize, len: usize) -> Filled {
        if !self.can_move {
            return self.fill_copy(dst, len, None);
        }
        let per_page = self.interleave.is_some();
        let (mut off, mut tried, mut why) = (0, 0u64, Stop::RingEmpty);
        while off < len {
            let at = dst + off;
            let Some(src) = self.pool_for(RingKind::Small, at, tried) else {
                break;
            };
            let n = if per_page { PAGE_SIZE } else { len - off };
            let (moved, _) = self.fill_move(&src.pool.small, at, n);
            match moved {
                Ok(()) => {
                    self.count_taken(&src, pages(n));
                    off += n;
                    tried = 0;
                }
                Err(s) => {
                    self.count_taken(&src, pages(s.at));
                    off += s.at;
                    if s.why != Stop::RingEmpty {
                        why = s.why;
                        break;
                    }
                    tried |= tried_bit(src.ix);
                }
            }
        }
        if off >= len {
            return Ok(());
        }
        if why == Stop::RingEmpty {
            Stats::add(&self.stats().pool_empty, 1);
        }
        // Copying succeeds where moving is refused: in a PROT_NONE mapping past the memory the
        // program committed, too (an arena's or a JVM heap's reserve), which must get no page.
        // A span beyond the faulting page's mapping is refused instead, as the kernel refuses
        // one that crosses a mapping's end: the window is clipped there.
        if !(dst..dst + len).contains(&self.fault_page) && dst + off >= self.mapping_end() {
            return Err(Stopped {
                at: off,
                why: Stop::Kernel(Errno(libc::ENOENT)),
            });
        }
        self.fill_copy_or_zero(dst + off, len - off, Some(why))
            .map_err(|c| c.offset(off))
    }

    /// A copy of the zero source; for a read served as a write (`self.reading`, reads.rs)
    /// where moving was refused (a read-only mapping: `UFFDIO_MOVE` wants the same protection
    /// on both sides) or the pool is paused, the zero page, as natively.
    fn fill_copy_or_zero(&mut self, dst: usize, len: usize, after: Option<Stop>) -> Filled {
        if self.reading && after != Some(Stop::RingEmpty) {
            return self.fill_zeropage(dst, len);
        }
        self.fill_copy(dst, len, after)
    }

    /// Moves ready pages of `ring` into `[dst, dst + len)`, one ioctl per contiguous run, until
    /// done or the ring is empty ([`Stop::RingEmpty`]). Also returns whether it went cleanly: no
    /// page found present, no source hole (a huge page moves whole only then).
    ///
    /// # Context
    /// A handler. Its ioctls (`UFFDIO_MOVE`, `COPY`, `ZEROPAGE`) may sleep on the mmap lock and on
    /// page allocation; it takes no lock of the engine's, ring slots lock-free.
    pub(crate) fn fill_move(&mut self, ring: &Ring, dst: usize, len: usize) -> (Filled, bool) {
        let mut off = 0;
        let mut clean = true;
        while off < len {
            let Some(run) = ring.take(pages(len - off)) else {
                return (
                    Err(Stopped {
                        at: off,
                        why: Stop::RingEmpty,
                    }),
                    clean,
                );
            };
            // Pages of the run consumed so far (moved out, or found to be holes).
            let used = Cell::new(0usize);
            let run_len = bytes(run.pages);
            let seg_start = off;
            let seg_len = (len - off).min(run_len);
            let mut moved = 0u64;
            let partial_before = self.partials;
            let filled = self.install_loop(
                seg_len,
                |h, o, rest| {
                    // `o` destination bytes are done; skipped destination pages did not use
                    // source pages, so the source offset is tracked separately.
                    let src_left = run_len - used.get();
                    if src_left == 0 {
                        return Err(Stop::RunUsed);
                    }
                    let n = rest.min(src_left);
                    // SAFETY: the run was taken from the ring: the handler owns its pages until
                    // it gives the unused ones back, and pool pages are zeroes the kernel
                    // populated (or holes, which the kernel refuses with ENOENT).
                    let p = unsafe { h.kernel.move_pages(dst + seg_start + o, run.addr + used.get(), n) };
                    let p = h.note(p);
                    used.set(used.get() + p.done);
                    moved += pages(p.done);
                    Ok(p)
                },
                |_, _| {
                    // A source hole, or a destination gone? mincore on the source page tells.
                    if used.get() < run_len && !ring.is_populated(run.addr + used.get()) {
                        used.set(used.get() + PAGE_SIZE);
                        clean = false;
                        true
                    } else {
                        false
                    }
                },
            );
            clean &= self.partials == partial_before;
            Stats::add(&self.stats().pages_moved, moved);
            let used = used.get();
            ring.untake(run, pages(run_len - used));
            match filled {
                Ok(()) => off = seg_start + seg_len,
                // The run ran out of source pages (holes): take more.
                Err(s) if s.why == Stop::RunUsed => off = seg_start + s.at,
                // The move was refused, or the destination is gone (then a copy stops too).
                Err(s) => return (Err(s.offset(seg_start)), false),
            }
        }
        (Ok(()), clean)
    }

    /// `UFFDIO_COPY` from the zero source, in chunks of its size. `after`: the stop that sent
    /// this span to copying (`None`: moving was not possible at all), for the stats.
    ///
    /// # Context
    /// A handler. Its ioctls (`UFFDIO_MOVE`, `COPY`, `ZEROPAGE`) may sleep on the mmap lock and on
    /// page allocation; it takes no lock of the engine's, ring slots lock-free.
    pub(crate) fn fill_copy(&mut self, dst: usize, len: usize, after: Option<Stop>) -> Filled {
        let zero = self.zero.addr();
        let mut copied = 0u64;
        let filled = self.install_loop(
            len,
            |h, o, rest| {
                // SAFETY: the zero source is readable and reads zero, which is what a fresh
                // anonymous page holds.
                let p = unsafe { h.kernel.copy(dst + o, zero, rest.min(ZeroSource::LEN)) };
                let p = h.note(p);
                copied += pages(p.done);
                Ok(p)
            },
            |_, _| false,
        );
        let stats = self.stats();
        Stats::add(&stats.pages_copied, copied);
        Stats::add(
            match after {
                None => &stats.copy_no_move,
                Some(Stop::RingEmpty) => &stats.copy_pool_empty,
                Some(_) => &stats.copy_move_refused,
            },
            copied,
        );
        filled
    }

    /// `UFFDIO_ZEROPAGE`: the zero page mapped for a read.
    ///
    /// # Context
    /// A handler. Its ioctls (`UFFDIO_MOVE`, `COPY`, `ZEROPAGE`) may sleep on the mmap lock and on
    /// page allocation; it takes no lock of the engine's, ring slots lock-free.
    pub(crate) fn fill_zeropage(&mut self, dst: usize, len: usize) -> Filled {
        let mut mapped = 0u64;
        let filled = self.install_loop(
            len,
            |h, o, rest| {
                let p = h.kernel.zeropage(dst + o, rest);
                let p = h.note(p);
                mapped += pages(p.done);
                Ok(p)
            },
            |_, _| false,
        );
        Stats::add(&self.stats().pages_zero_mapped, mapped);
        filled
    }
}
