//! The install policy against a fake kernel: which ioctls a fault makes, in which order, and
//! what it does when the kernel says no. No userfaultfd is opened; the pool is real memory.

use super::{Handler, Kernel};
use crate::fault::handback::SPARSE_REACH;
use crate::page::{bytes, pages, PAGE_SIZE, PMD_SIZE};
use crate::sys::raw::Errno;
use crate::sys::uffd::{Msg, Progress};
use crate::{Options, Shared};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;

/// Where the fake's registered memory starts: PMD aligned, and never touched (the fake only
/// keeps addresses).
const BASE: usize = 0x6000_0000_0000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    Move,
    Copy,
    Zeropage,
}

/// What the kernel would do with a userfaultfd, as far as the install policy can tell: pages
/// present or not at each destination address, the end of the mapping, and errors on demand.
#[derive(Default)]
struct Fake {
    present: RefCell<BTreeSet<usize>>,
    /// The mapping's end: a span that crosses it is refused whole (ENOENT, EINVAL for a move).
    end: Cell<usize>,
    /// A PROT_NONE mapping `[a, b)`: moves into it are refused (EINVAL: its flags differ from
    /// the ring's), copies inside it succeed, as the kernel does; a copy crossing its border
    /// crosses a mapping's end (ENOENT).
    none: Cell<(usize, usize)>,
    /// Errors for the next install calls, one each, then `always`.
    fail: RefCell<VecDeque<Errno>>,
    always: Cell<Option<Errno>>,
    calls: RefCell<Vec<(Verb, usize, usize)>>,
    wakes: RefCell<Vec<usize>>,
    unregistered: RefCell<Vec<(usize, usize)>>,
    registered: RefCell<Vec<(usize, usize)>>,
    /// Messages `read` returns.
    pending: RefCell<VecDeque<Msg>>,
    /// Present pages that map the zero page (installed by `zeropage`, not written since).
    zero: RefCell<BTreeSet<usize>>,
}

impl Fake {
    fn new() -> Fake {
        let f = Fake::default();
        f.end.set(usize::MAX);
        f
    }

    /// The kernel's answer to an install of `[dst, dst + len)`: the first page present gives
    /// EEXIST, a later one EAGAIN with the bytes done before it (mm/userfaultfd.c's rules, as
    /// measured in shared/notes/uffd-facts.md).
    fn install(&self, verb: Verb, dst: usize, len: usize) -> Progress {
        self.calls.borrow_mut().push((verb, dst, len));
        let fail = |e| Progress {
            done: 0,
            errno: Some(Errno(e)),
        };
        if let Some(e) = self.fail.borrow_mut().pop_front().or(self.always.get()) {
            return Progress {
                done: 0,
                errno: Some(e),
            };
        }
        if dst + len > self.end.get() {
            return fail(if verb == Verb::Move { libc::EINVAL } else { libc::ENOENT });
        }
        let (a, b) = self.none.get();
        if dst < b && dst + len > a {
            if verb == Verb::Move {
                return fail(libc::EINVAL);
            }
            if dst < a || dst + len > b {
                return fail(libc::ENOENT);
            }
        }
        let mut present = self.present.borrow_mut();
        for (i, page) in (dst..dst + len).step_by(PAGE_SIZE).enumerate() {
            if present.contains(&page) {
                if i == 0 {
                    return fail(libc::EEXIST);
                }
                present.extend((dst..page).step_by(PAGE_SIZE));
                return Progress {
                    done: i * PAGE_SIZE,
                    errno: Some(Errno(libc::EAGAIN)),
                };
            }
        }
        present.extend((dst..dst + len).step_by(PAGE_SIZE));
        if verb == Verb::Zeropage {
            self.zero.borrow_mut().extend((dst..dst + len).step_by(PAGE_SIZE));
        }
        Progress { done: len, errno: None }
    }

    /// The program writes the page at `addr`: a zero page there becomes a page of its own.
    fn write(&self, addr: usize) {
        self.zero.borrow_mut().remove(&addr);
    }

    /// Whether the thread faulting at `addr` was woken: by a wake, or by an install that put
    /// its page in (installs wake what they install).
    fn woken(&self, addr: usize) -> bool {
        self.wakes.borrow().contains(&addr) || self.present.borrow().contains(&addr)
    }

    fn calls(&self) -> Vec<(Verb, usize, usize)> {
        self.calls.borrow().clone()
    }
}

impl Kernel for Fake {
    unsafe fn move_pages(&self, dst: usize, _src: usize, len: usize) -> Progress {
        self.install(Verb::Move, dst, len)
    }
    unsafe fn copy(&self, dst: usize, _src: usize, len: usize) -> Progress {
        self.install(Verb::Copy, dst, len)
    }
    fn zeropage(&self, dst: usize, len: usize) -> Progress {
        self.install(Verb::Zeropage, dst, len)
    }
    fn wake(&self, addr: usize, _len: usize) -> Result<(), Errno> {
        self.wakes.borrow_mut().push(addr);
        Ok(())
    }
    fn unregister(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.unregistered.borrow_mut().push((addr, len));
        Ok(())
    }
    unsafe fn register(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.registered.borrow_mut().push((addr, len));
        Ok(())
    }
    fn mapping_of(&self, addr: usize) -> Option<(usize, usize)> {
        let (a, b) = self.none.get();
        match () {
            _ if (a..b).contains(&addr) => None,
            _ if addr < a => Some((0, a)),
            _ => Some((b, usize::MAX)),
        }
    }
    fn page_states(&self, addr: usize, out: &mut [super::PageState]) -> bool {
        use super::PageState;
        for (i, o) in out.iter_mut().enumerate() {
            let page = addr + bytes(i as u64);
            *o = match () {
                _ if self.zero.borrow().contains(&page) => PageState::ZeroPage,
                _ if self.present.borrow().contains(&page) => PageState::Own,
                _ => PageState::Absent,
            };
        }
        true
    }
    fn read(&self, out: &mut [Msg]) -> Result<usize, Errno> {
        let mut pending = self.pending.borrow_mut();
        let n = out.len().min(pending.len());
        for o in &mut out[..n] {
            *o = pending.pop_front().expect("counted");
        }
        Ok(n)
    }
}

/// Knobs for the tests: a 16 MiB pool (a 4 MiB small ring with `huge`), the default windows.
fn opts(pool: bool) -> Options {
    Options {
        pool,
        pool_max: 16 << 20,
        // Whole first windows: these tests are about installs (probes have their own).
        probe: false,
        ..Options::default()
    }
}

/// A detached engine state with a range of `pages` pages at [`BASE`] and `small` pages ready
/// in the small ring (and `huge` huge pages in the huge ring, which `huge > 0` creates).
fn state(pool: bool, pages: u64, small: u64, huge: u64) -> Shared {
    state_with(opts(pool), pages, small, huge)
}

/// [`state`] with knobs of the test's own.
fn state_with(o: Options, pages: u64, small: u64, huge: u64) -> Shared {
    let s = Shared::detached(o, huge > 0);
    s.ranges.insert(BASE, pages, None);
    if let Some(p) = s.pools.first() {
        while p.small.available() < small {
            p.small.fill_step(small - p.small.available(), &s.stats).unwrap();
        }
        if let Some(h) = &p.huge {
            while h.available() < huge * 512 {
                h.fill_step(u64::MAX, &s.stats).unwrap();
            }
        }
    }
    s
}

fn page(i: u64) -> usize {
    BASE + bytes(i)
}

#[test]
fn a_write_fault_moves_its_window_from_the_pool_and_the_move_wakes_the_thread() {
    let s = state(true, 4096, 256, 0);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    h.fault(page(0), true, 7);
    assert_eq!(k.calls(), [(Verb::Move, page(0), bytes(16))]);
    assert!(k.wakes.borrow().is_empty(), "the move woke the thread");
    let st = s.stats.snapshot();
    assert_eq!((st.pages_moved, st.pages_copied), (16, 0));
    assert_eq!(s.pools.first().unwrap().small.available(), 256 - 16);
    // The next fault where the window ended is a hit: the window grows, the pool is wanted.
    h.fault(page(16), true, 7);
    assert_eq!(k.calls()[1], (Verb::Move, page(16), bytes(64)));
    assert!(s.pool_may_fill.load(Relaxed));
    assert_eq!(s.ranges.find(BASE).unwrap().map.count(), 80);
}

#[test]
fn an_empty_pool_is_copied_from_and_the_copy_says_why() {
    let s = state(true, 4096, 0, 0);
    let k = Fake::new();
    Handler::new(&s, &k).fault(page(0), true, 1);
    assert_eq!(k.calls(), [(Verb::Copy, page(0), bytes(16))]);
    let st = s.stats.snapshot();
    assert_eq!((st.pool_empty, st.copy_pool_empty, st.copy_no_move), (1, 16, 0));

    let s = state(false, 4096, 0, 0);
    let k = Fake::new();
    Handler::new(&s, &k).fault(page(0), true, 1);
    assert_eq!(k.calls(), [(Verb::Copy, page(0), bytes(16))]);
    assert_eq!(s.stats.snapshot().copy_no_move, 16);
}

/// [`state`] with probes (the default outside these tests).
fn probing_state(pages: u64, small: u64) -> Shared {
    state_with(
        Options {
            probe: true,
            ..opts(true)
        },
        pages,
        small,
        0,
    )
}

#[test]
fn a_new_streams_window_leaves_its_probe_out_and_a_dense_writer_fills_it() {
    let s = probing_state(1 << 16, 256);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    h.fault(page(0), true, 7);
    // The last run first (see install_window), the fault's page last: it wakes the thread.
    assert_eq!(
        k.calls(),
        [(Verb::Move, page(2), bytes(14)), (Verb::Move, page(0), bytes(1))]
    );
    let range = s.ranges.find(BASE).unwrap();
    assert!(!range.map.is_claimed(1) && range.map.count() == 15);
    h.fault(page(1), true, 7);
    assert_eq!(k.calls()[2], (Verb::Move, page(1), bytes(1)));
    h.fault(page(16), true, 7);
    assert_eq!(
        k.calls()[3],
        (Verb::Move, page(16), bytes(64)),
        "a stream: the window grew"
    );
    let st = s.stats.snapshot();
    assert_eq!((st.predict_probes, st.sparse_streams, st.handbacks), (1, 0, 0));
}

#[test]
fn a_writer_past_two_probes_gives_its_way_ahead_back_and_faults_natively() {
    let s = probing_state(1 << 18, 256);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    // One page in eight: neither probe (pages 1 and 17) written.
    for p in [0, 16] {
        h.fault(page(p), true, 7);
    }
    assert_eq!(k.calls().len(), 4, "two windows, each in two runs around its probe");
    assert!(k.unregistered.borrow().is_empty());
    h.fault(page(32), true, 7);
    // SPARSE_REACH (256 MiB) from the fault on, in whole PMDs, went back; the thread was woken.
    let end = (32 + SPARSE_REACH - 1) / 512 * 512 + 512;
    assert_eq!(k.unregistered.borrow().as_slice(), [(page(0), bytes(end))]);
    assert_eq!(k.calls().len(), 4, "nothing installed for the fault");
    assert!(k.wakes.borrow().contains(&page(32)));
    let st = s.stats.snapshot();
    assert_eq!((st.sparse_streams, st.handbacks, st.pages_handed_back), (1, 1, end));
    assert!(s.ranges.find(page(100)).is_none() && s.ranges.find(page(end)).is_some());
    // Not one of the range's hand-backs of misses (a second of those gives back the rest).
    assert_eq!(s.ranges.find(page(end)).unwrap().handbacks.load(Relaxed), 0);

    // Down a region, one page at a time: what lies below goes back (in whole PMDs), at the
    // sixth fault.
    let s = probing_state(1 << 18, 256);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    let top = 200_000;
    for p in (top - 5..=top).rev() {
        h.fault(page(p), true, 7);
    }
    let (lo, hi) = (top - 5 - SPARSE_REACH, top - 5);
    let (a, b) = (lo / 512 * 512, (hi / 512 + 1) * 512);
    assert_eq!(k.unregistered.borrow().as_slice(), [(page(a), bytes(b - a))]);

    // With hand-backs off, a sparse stream is served a page at a time.
    let s = state_with(
        Options {
            probe: true,
            handback_misses: 0,
            ..opts(true)
        },
        1 << 16,
        256,
        0,
    );
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    for p in [0, 16, 32] {
        h.fault(page(p), true, 7);
    }
    assert!(k.unregistered.borrow().is_empty());
    assert_eq!(k.calls()[4], (Verb::Move, page(32), bytes(1)));
}

#[test]
fn a_sparse_stream_in_a_small_range_gives_back_only_its_way_ahead() {
    // 1 GiB: 256 MiB from the fault goes back, not the whole range (another thread's stream
    // may be writing the rest), though it is more than half of what lies ahead.
    let s = probing_state(1 << 18, 256);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    let f = 150_000;
    for p in [f, f + 16, f + 32] {
        h.fault(page(p), true, 7);
    }
    let (a, b) = ((f + 32) / 512 * 512, ((f + 32 + SPARSE_REACH - 1) / 512 + 1) * 512);
    assert_eq!(k.unregistered.borrow().as_slice(), [(page(a), bytes(b - a))]);
    assert!(2 * (b - a) > (1 << 18) - (f + 32) && b < 1 << 18);
}

#[test]
fn a_sparse_streams_hand_back_stops_where_its_accessible_memory_does() {
    // The shim's arena: a block, then free space kept PROT_NONE (blocks made there later would
    // be the kernel's for good had it gone back too).
    let s = probing_state(1 << 18, 256);
    let k = Fake::new();
    k.none.set((page(3000), page(200_000)));
    let mut h = Handler::new(&s, &k);
    for p in [0, 16, 32] {
        h.fault(page(p), true, 7);
    }
    assert_eq!(k.unregistered.borrow().as_slice(), [(page(0), bytes(3000))]);
}

#[test]
fn a_first_window_that_could_not_go_in_proves_nothing_on_the_refault() {
    let s = probing_state(1 << 16, 256);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    // Events keep coming: every install of the first window gives EAGAIN, the thread is woken
    // without its page, and faults there again.
    k.always.set(Some(Errno(libc::EAGAIN)));
    h.fault(page(0), true, 7);
    assert_eq!(s.stats.snapshot().windows_cut, 1);
    k.always.set(None);
    h.fault(page(0), true, 7);
    let st = s.stats.snapshot();
    assert_eq!((st.sparse_streams, st.handbacks), (0, 0), "{st:?}");
    assert!(k.unregistered.borrow().is_empty());
    assert!(s.ranges.find(BASE).unwrap().map.is_claimed(0));
}

#[test]
fn one_thread_writing_four_equal_columns_keeps_its_range() {
    // c[i] = a[i] + b[i] + d[i] over fresh columns of 64 MiB in one 256 MiB range, row by row.
    let s = probing_state(1 << 16, 1024);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    let mut next = [0u64, 16_384, 32_768, 49_152];
    for _ in 0..5 {
        for n in &mut next {
            h.fault(page(*n), true, 7);
            let range = s.ranges.find(BASE).unwrap();
            if !range.map.is_claimed(*n + 1) {
                h.fault(page(*n + 1), true, 7); // the probe, written next
            }
            while range.map.is_claimed(*n) {
                *n += 1;
            }
        }
    }
    let st = s.stats.snapshot();
    assert_eq!((st.sparse_streams, st.handbacks), (0, 0), "{st:?}");
    assert!(k.unregistered.borrow().is_empty());
}

#[test]
fn a_read_maps_the_zero_page_and_spends_no_pool_page() {
    let s = state(true, 4096, 64, 0);
    let k = Fake::new();
    Handler::new(&s, &k).fault(page(3), false, 1);
    assert_eq!(k.calls(), [(Verb::Zeropage, page(3), bytes(16))]);
    assert_eq!(s.pools.first().unwrap().small.available(), 64);
    assert_eq!(s.stats.snapshot().pages_zero_mapped, 16);
}

#[test]
fn present_pages_are_skipped_and_cost_no_pool_page() {
    let s = state(true, 4096, 64, 0);
    let k = Fake::new();
    k.present.borrow_mut().insert(page(5));
    Handler::new(&s, &k).fault(page(0), true, 1);
    // Five pages, EAGAIN at the present one, EEXIST there, then the rest.
    assert_eq!(
        k.calls(),
        [
            (Verb::Move, page(0), bytes(16)),
            (Verb::Move, page(5), bytes(11)),
            (Verb::Move, page(6), bytes(10)),
        ]
    );
    assert_eq!(k.present.borrow().len(), 16);
    let st = s.stats.snapshot();
    assert_eq!((st.partial_installs, st.pages_moved), (1, 15));
    assert_eq!(
        s.pools.first().unwrap().small.available(),
        64 - 15,
        "the unused page went back"
    );
}

#[test]
fn a_window_past_the_end_of_its_mapping_goes_in_up_to_the_end_and_no_further() {
    let s = state(true, 4096, 256, 0);
    let k = Fake::new();
    k.end.set(page(10));
    Handler::new(&s, &k).fault(page(0), true, 1);
    let present: Vec<usize> = k.present.borrow().iter().copied().collect();
    assert_eq!(present, (0..10).map(page).collect::<Vec<_>>());
    assert!(k.woken(page(0)));
    let r = s.ranges.find(BASE).unwrap();
    assert_eq!(r.map.count(), 10, "the pages beyond the mapping were released");
    assert_eq!(s.stats.snapshot().windows_clipped, 1);
    // Halving pieces from the fault on; a refused piece's last page and what lies beyond it
    // are not tried again (each refused move is followed by a refused copy).
    let moves: Vec<(u64, u64)> = k
        .calls()
        .iter()
        .filter(|c| c.0 == Verb::Move)
        .map(|&(_, dst, len)| (pages(dst - BASE), pages(len)))
        .collect();
    assert_eq!(moves, [(0, 16), (0, 8), (8, 8), (8, 4), (8, 2), (10, 1)]);
}

#[test]
fn a_window_running_into_prot_none_memory_puts_no_page_there() {
    // Pages 0..10 committed, the rest of the range PROT_NONE (an arena's or a JVM heap's
    // reserve): a copy would succeed there, so nothing may fall back to copying.
    let s = state(true, 4096, 256, 0);
    let k = Fake::new();
    k.none.set((page(10), page(4096)));
    Handler::new(&s, &k).fault(page(0), true, 1);
    let present: Vec<usize> = k.present.borrow().iter().copied().collect();
    assert_eq!(present, (0..10).map(page).collect::<Vec<_>>());
    assert!(k.woken(page(0)));
    assert!(
        k.calls().iter().all(|c| c.0 == Verb::Move || c.1 < page(10)),
        "no copy is tried in the reserve: {:?}",
        k.calls()
    );
    assert_eq!(s.ranges.find(BASE).unwrap().map.count(), 10);
    assert_eq!(s.stats.snapshot().pages_copied, 0);
    // The same with an empty pool: copies up to the reserve and none in it.
    let s = state(true, 4096, 0, 0);
    let k = Fake::new();
    k.none.set((page(10), page(4096)));
    Handler::new(&s, &k).fault(page(0), true, 1);
    let present: Vec<usize> = k.present.borrow().iter().copied().collect();
    assert_eq!(present, (0..10).map(page).collect::<Vec<_>>());
    assert_eq!(s.stats.snapshot().pages_copied, 10);
    // Where the move is refused for another reason (an mlocked range), copying goes on.
    let s = state(true, 4096, 256, 0);
    let k = Fake::new();
    k.always.set(Some(Errno(libc::EINVAL)));
    let mut h = Handler::new(&s, &k);
    k.always.set(None);
    k.fail.borrow_mut().push_back(Errno(libc::EINVAL));
    h.fault(page(0), true, 1);
    assert_eq!(k.calls()[1], (Verb::Copy, page(0), bytes(16)));
    assert_eq!(s.stats.snapshot().copy_move_refused, 16);
}

#[test]
fn mappings_that_keep_changing_end_the_install_and_the_thread_is_woken() {
    let s = state(true, 4096, 64, 0);
    let k = Fake::new();
    k.always.set(Some(Errno(libc::EAGAIN)));
    let mut h = Handler::new(&s, &k);
    h.fault(page(0), true, 1);
    assert!(h.fatal.is_none(), "EAGAIN is no reason to fail open");
    assert_eq!(k.wakes.borrow().as_slice(), [page(0)]);
    assert_eq!(
        s.ranges.find(BASE).unwrap().map.count(),
        0,
        "nothing claimed stays claimed"
    );
    // Each of the move and the copy retried after draining events, and gave up.
    let st = s.stats.snapshot();
    assert_eq!(st.drained_for_events, 2 * u64::from(super::EVENT_RETRIES));
    assert_eq!(
        s.pools.first().unwrap().small.available(),
        64,
        "the run went back whole"
    );
}

#[test]
fn an_errno_no_install_expects_fails_open() {
    let s = state(true, 4096, 64, 0);
    let k = Fake::new();
    k.fail.borrow_mut().push_back(Errno(libc::EPERM));
    let mut h = Handler::new(&s, &k);
    h.handle_counted(Msg::PageFault {
        addr: page(0),
        write: true,
        tid: 1,
    });
    assert_eq!(h.fatal, Some(Errno(libc::EPERM)));
    let before = k.calls().len();
    h.handle_counted(Msg::PageFault {
        addr: page(100),
        write: true,
        tid: 1,
    });
    assert_eq!(k.calls().len(), before, "failing open: the kernel answers from here");
}

#[test]
fn events_read_while_draining_apply_at_once_and_faults_wait_their_turn() {
    let s = state(false, 4096, 0, 0);
    s.ranges.insert(BASE + (1 << 30), 512, None);
    let k = Fake::new();
    k.fail.borrow_mut().push_back(Errno(libc::EAGAIN));
    k.pending.borrow_mut().extend([
        Msg::Unmap {
            start: BASE + (1 << 30),
            end: BASE + (1 << 30) + PMD_SIZE,
        },
        Msg::PageFault {
            addr: page(500),
            write: true,
            tid: 2,
        },
    ]);
    let mut h = Handler::new(&s, &k);
    h.seq = s.ranges.seq();
    h.fault(page(0), true, 1);
    assert!(s.ranges.find(BASE + (1 << 30)).is_none(), "the UNMAP was applied");
    assert_eq!(h.deferred.len(), 1);
    assert_eq!(k.present.borrow().len(), 16, "and the install went on after it");
}

#[test]
fn huge_pages_go_into_whole_clear_pmds_last_piece_first() {
    let s = state(true, 4096, 64, 2);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    assert!(h.stage.is_some());
    let r = s.ranges.find(BASE).unwrap();
    // Eight pages before a PMD boundary, then that whole PMD.
    let dst = BASE + PMD_SIZE - bytes(8);
    h.install_write(dst, bytes(8) + PMD_SIZE, Some(&r)).unwrap();
    assert_eq!(
        k.calls(),
        [(Verb::Move, BASE + PMD_SIZE, PMD_SIZE), (Verb::Move, dst, bytes(8))]
    );
    assert_eq!(s.stats.snapshot().huge_moves, 1);
    assert!(r.pmds.has_table(dst) && !r.pmds.has_table(BASE + PMD_SIZE));
}

/// Under THP `madvise` (not `always`) a PMD of the program's takes a huge page only where it
/// was advised `MADV_HUGEPAGE`, as the kernel's own fault would; a region of the engine's
/// (`Engine::map`: an owner) takes them without advice.
#[test]
fn under_thp_madvise_only_advised_pmds_of_the_programs_memory_take_huge_pages() {
    let mut s = state(true, 4096, 1024, 2);
    s.thp_always = false;
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    let r = s.ranges.find(BASE).unwrap();
    h.install_write(BASE, PMD_SIZE, Some(&r)).unwrap();
    assert_eq!(s.stats.snapshot().huge_moves, 0, "no advice: 4 KiB pages");
    assert!(r.pmds.has_table(BASE));
    s.ranges.set_huge(BASE + PMD_SIZE, BASE + 2 * PMD_SIZE, true);
    h.install_write(BASE + PMD_SIZE, PMD_SIZE, Some(&r)).unwrap();
    assert_eq!(s.stats.snapshot().huge_moves, 1, "advised: a huge page");
    assert!(!r.huge_by_default(false) && r.huge_by_default(true));
    drop(r);
    s.ranges.insert(BASE + (1 << 30), 1024, Some(7));
    let owned = s.ranges.find(BASE + (1 << 30)).unwrap();
    assert!(
        owned.may_take_huge(BASE + (1 << 30), false),
        "an engine region's memory"
    );
}

#[test]
fn an_empty_huge_ring_makes_the_huge_page_in_the_staging_area() {
    // A huge ring that is empty.
    let s = Shared::detached(opts(true), true);
    s.ranges.insert(BASE, 4096, None);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    let r = s.ranges.find(BASE).unwrap();
    h.install_write(BASE, PMD_SIZE, Some(&r)).unwrap();
    assert_eq!(k.calls(), [(Verb::Move, BASE, PMD_SIZE)]);
    assert_eq!(s.stats.snapshot().huge_made, 1);
}

#[test]
fn huge_pages_moved_before_a_failed_one_keep_their_pmds_clear() {
    // One huge page in the ring, no staging possible (it rests): the first PMD gets the ring's
    // huge page, the second falls back to small pages and only it is marked.
    let s = state(true, 4096, 1024, 1);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    h.stage_rests_until = Some(std::time::Instant::now() + std::time::Duration::from_secs(60));
    let r = s.ranges.find(BASE).unwrap();
    h.install_write(BASE, 2 * PMD_SIZE, Some(&r)).unwrap();
    assert_eq!(k.present.borrow().len(), 1024);
    assert!(!r.pmds.has_table(BASE), "the huge page's PMD holds no table");
    assert!(r.pmds.has_table(BASE + PMD_SIZE));
    let st = s.stats.snapshot();
    assert_eq!((st.huge_moves, st.huge_fallbacks), (1, 1));
    // The ring lacked one huge page: the scrub is told.
    assert!(s.pools.first().unwrap().take_huge_missed());
    assert!(!s.pools.first().unwrap().take_huge_missed());
}

#[test]
fn a_refused_huge_move_marks_the_pmd_and_falls_back_to_small_pages() {
    let s = state(true, 4096, 1024, 1);
    let k = Fake::new();
    k.fail.borrow_mut().push_back(Errno(libc::EBUSY));
    let mut h = Handler::new(&s, &k);
    let r = s.ranges.find(BASE).unwrap();
    h.install_write(BASE, PMD_SIZE, Some(&r)).unwrap();
    assert_eq!(k.calls()[0], (Verb::Move, BASE, PMD_SIZE));
    assert_eq!(k.present.borrow().len(), 512, "the PMD was filled with small pages");
    assert!(r.pmds.has_table(BASE));
    let st = s.stats.snapshot();
    assert_eq!((st.huge_fallbacks, st.huge_moves), (1, 0));
}

#[test]
fn random_faults_hand_their_span_back_and_the_faulting_page_goes_with_it() {
    let o = Options {
        handback_misses: 2,
        ..opts(false)
    };
    let s = Shared::detached(o, false);
    s.ranges.insert(BASE, 64 * 512, None);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    // A start (neutral), then two misses in the same PMD.
    for p in [3000, 10_000, 10_100] {
        h.fault(page(p), true, 1);
    }
    // Misses at 10,000 and 10,100: the whole PMD from page 9,728.
    assert_eq!(k.unregistered.borrow().as_slice(), [(page(9728), PMD_SIZE)]);
    assert!(s.ranges.find(page(10_100)).is_none());
    assert!(k.wakes.borrow().contains(&page(10_100)), "woken to fault natively");
    assert!(!k.present.borrow().contains(&page(10_100)));
    assert_eq!(s.stats.snapshot().handbacks, 1);
}

#[test]
fn the_doorbell_stops_the_handler_only_once_its_page_is_in() {
    // Engine::drop reads the doorbell and waits: the handler stops after answering it. A zero
    // page refused with EAGAIN (an event pending) is retried after draining events; refused
    // for good, the handler does not stop, so the woken reader's next fault is answered.
    for (fails, always, rung) in [(2, None, true), (0, Some(libc::EAGAIN), false)] {
        let mut s = state(false, 64, 0, 0);
        s.doorbell = page(1000);
        s.stopping.store(true, Relaxed);
        let k = Fake::new();
        k.fail
            .borrow_mut()
            .extend(std::iter::repeat_n(Errno(libc::EAGAIN), fails));
        k.always.set(always.map(Errno));
        let mut h = Handler::new(&s, &k);
        h.fault(page(1000), false, 1);
        assert_eq!(h.rung, rung, "fails {fails}, always {always:?}");
        assert!(k.wakes.borrow().contains(&page(1000)), "the reader is woken either way");
        let zeropages = k.calls().iter().filter(|c| c.0 == Verb::Zeropage).count();
        assert_eq!(zeropages, if rung { 3 } else { 1 + 8 }, "retried after draining events");
    }
}

/// Faults a sequential writer (thread 1) at the page after everything installed so far, `n`
/// times; returns the pages each fault installed (window and window ahead, with `fault`).
fn stream(h: &mut Handler<'_, Fake>, s: &Shared, n: usize) -> Vec<u64> {
    let r = s.ranges.find(BASE).unwrap();
    let mut got = vec![];
    for _ in 0..n {
        let before = r.map.count();
        h.fault(page(before), true, 1);
        got.push(r.map.count() - before);
    }
    got
}

#[test]
fn a_confirmed_stream_installs_whole_pmds_ahead_as_far_as_it_has_written() {
    use crate::options::AheadMode;
    // 256 MiB, a pool of 4 KiB pages only (64 MiB, all ready): the window sizes alone.
    let big = |ahead| Options {
        ahead,
        ahead_order: 13,
        pool_max: 64 << 20,
        ..opts(true)
    };
    let s = state_with(big(AheadMode::Fault), 1 << 16, 16384, 0);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    let got = stream(&mut h, &s, 8);
    // 16, 64, 256, 1024 as before; the first 2048 window is confirmed, and already goes as far
    // as the stream has written (1360 pages). From then on each window goes on to the PMD
    // boundary below twice what the stream has written: page 3408 + 3408 = 6816 rounds down
    // to 6656 (3248 pages), then 13312 (6656 pages). The next would be 2^13 pages
    // (ahead_order 13 here), but only 3072 pages are left in the pool: the window ahead ends where
    // they do.
    assert_eq!(got, [16, 64, 256, 1024, 2048, 3248, 6656, 3072]);
    let st = s.stats.snapshot();
    assert_eq!(
        (st.predict_misses, st.predict_hits),
        (0, 7),
        "every fault where the stream expected it"
    );
    assert_eq!((st.ahead_windows, st.pages_copied), (3, 0));
    assert!(
        got.iter().sum::<u64>() % 512 == 0,
        "windows ahead end on PMD boundaries"
    );

    // Off: windows of 2048 pages at most.
    let s = state_with(big(AheadMode::Off), 1 << 16, 16384, 0);
    let mut h = Handler::new(&s, &k);
    let got = stream(&mut h, &s, 7);
    assert_eq!(got, [16, 64, 256, 1024, 2048, 2048, 2048]);
    assert_eq!(s.stats.snapshot().ahead_windows, 0);
}

#[test]
fn a_window_ahead_after_the_wake_moves_huge_pages_in_address_order_and_yields_to_a_fault() {
    use crate::options::AheadMode;
    let o = Options {
        ahead: AheadMode::Wake,
        ..opts(true)
    };
    let s = state_with(o, 1 << 14, 1024, 6);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    let r = s.ranges.find(BASE).unwrap();
    let got = stream(&mut h, &s, 5);
    // With huge pages the 1024 window is stretched to end one page short of a PMD boundary
    // (fault/window.rs). Confirmed at the fifth fault (page 1535, the last of its PMD): its own
    // window ends at the PMD boundary after the next one (page 2048: with one page to write
    // the woken thread would overtake the handler), then 2048 pages ahead in whole PMDs.
    assert_eq!(got[..4], [16, 64, 256, 1199]);
    assert_eq!(got[4], 2048 - 1535 + 2048);
    let calls = k.calls();
    let ahead: Vec<_> = calls.iter().rev().take(4).rev().copied().collect();
    assert_eq!(
        ahead,
        (0..4)
            .map(|i| (Verb::Move, page(2048) + i * PMD_SIZE, PMD_SIZE))
            .collect::<Vec<_>>(),
        "huge pages, first to last, after the window: {calls:x?}"
    );
    let st = s.stats.snapshot();
    assert_eq!((st.ahead_windows, st.ahead_pages, st.ahead_stops), (1, 2048, 0));

    // A fault waiting on the descriptor: the window ahead stops before its first huge page,
    // releases its claim, and the stream expects its next fault where it stopped.
    k.pending.borrow_mut().push_back(Msg::PageFault {
        addr: page(9000),
        write: true,
        tid: 2,
    });
    let before = r.map.count();
    h.fault(page(before), true, 1);
    assert_eq!(
        r.map.count() - before,
        512,
        "its own window only (the fault's whole PMD)"
    );
    assert_eq!(h.deferred.len(), 1, "the waiting fault is handled next");
    let st = s.stats.snapshot();
    assert_eq!((st.ahead_windows, st.ahead_stops), (2, 1));
    let misses = st.predict_misses;
    stream(&mut h, &s, 1);
    assert_eq!(s.stats.snapshot().predict_misses, misses, "the next fault is a hit");
}

/// Two nodes (a fake tree: they need not exist here), a 4 KiB pool of 16 MiB each, with
/// `small` pages ready in each, and a range of `pages` pages at [`BASE`]. Nothing is handed
/// back: the tests fault far apart on purpose, which reads as random access.
fn two_nodes(name: &str, policy: crate::memory::nodes::Policy, pages: u64, small: u64) -> Shared {
    let root =
        crate::sys::numa::tests::fake_tree(name, "0-1", &[(0, "0", 1 << 20, "10 20"), (1, "1", 1 << 20, "20 10")]);
    let t = crate::sys::numa::Topology::read(&root).unwrap();
    std::fs::remove_dir_all(root).unwrap();
    let mut o = opts(true);
    o.handback_misses = 0;
    let s = Shared::detached_nodes(o, t, policy);
    s.ranges.insert(BASE, pages, None);
    for p in &s.pools {
        while p.small.available() < small {
            p.small.fill_step(small - p.small.available(), &s.stats).unwrap();
        }
    }
    s
}

/// A thread whose CPU cannot be read: its node is the first pool's (node 0).
const NO_SUCH_THREAD: u32 = u32::MAX - 1;

#[test]
fn with_two_nodes_a_fault_takes_its_nodes_pool_and_the_next_only_when_its_node_is_full() {
    let s = two_nodes("pool-choice", crate::memory::nodes::Policy::Local, 1 << 16, 256);
    let (p0, p1) = (&s.pools[0], &s.pools[1]);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    // Node 0's pool while it has pages: hits.
    h.fault(page(0), true, NO_SUCH_THREAD);
    assert_eq!((p0.small.available(), p1.small.available()), (240, 256));
    let st = s.stats.snapshot();
    assert_eq!((st.numa_hit, st.numa_miss), (16, 0));
    assert_eq!(p0.counts.hit.load(Relaxed), 16);
    // Node 0's ring empty but the node has memory: the handler makes the pages itself (on
    // node 0, as the kernel would), node 1's pool untouched, nothing marked. (A fault far from
    // the stream starts a new one: its window is a page or a few.)
    let all = p0.small.take(240).unwrap();
    assert_eq!(all.pages, 240);
    h.fault(page(10_000), true, NO_SUCH_THREAD);
    let st1 = s.stats.snapshot();
    assert!(st1.pages_copied > 0 && st1.pages_moved == 16, "{st1:?}");
    assert_eq!((st1.zlc_marks, st1.numa_miss), (0, 0));
    assert_eq!(p1.small.available(), 256);
    // Node 0 full (its last populate got another node's pages): node 1's pool, a miss for
    // node 1 and a foreign page for node 0, node 0 marked.
    p0.small.mark_node_full();
    // (Not at 20,000: a third miss at one stride is a sparse stream, handed back.)
    h.fault(page(21_000), true, NO_SUCH_THREAD);
    let st2 = s.stats.snapshot();
    let w = 256 - p1.small.available();
    assert!(w > 0);
    assert_eq!((st2.numa_miss, st2.zlc_marks, st2.zlc_skips), (w, 1, 0));
    assert_eq!(st2.pages_copied, st1.pages_copied, "moved, not copied");
    assert_eq!((p1.counts.miss.load(Relaxed), p0.counts.foreign.load(Relaxed)), (w, w));
    // Node 0 has pages again, but is skipped until the zap (a second).
    while p0.small.available() < 64 {
        p0.small.fill_step(64, &s.stats).unwrap();
    }
    let before = p0.small.available();
    h.fault(page(30_000), true, NO_SUCH_THREAD);
    let st3 = s.stats.snapshot();
    assert!(st3.numa_miss > st2.numa_miss);
    assert_eq!((st3.zlc_skips, st3.zlc_marks), (1, 1));
    assert_eq!(p0.small.available(), before, "node 0 skipped");
    // Node 1 empty and full too: copies, node 1 marked.
    let _ = p1.small.take(p1.small.available());
    p1.small.mark_node_full();
    h.fault(page(40_000), true, NO_SUCH_THREAD);
    let st4 = s.stats.snapshot();
    assert!(st4.pages_copied > st3.pages_copied);
    assert_eq!((st4.numa_miss, st4.zlc_marks), (st3.numa_miss, 2));
}

#[test]
fn with_two_nodes_an_interleaved_window_alternates_its_pages_between_the_pools() {
    let il = crate::memory::nodes::Policy::Interleave(crate::sys::numa::NodeMask::of([0, 1]));
    let s = two_nodes("interleave", il, 1 << 16, 64);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    // The fault's mapping has no policy of its own (BASE is not mapped: get_mempolicy fails),
    // so the process's, interleave, applies: one page from each node in turn.
    h.fault(page(0), true, NO_SUCH_THREAD);
    let moves: Vec<_> = k.calls().into_iter().filter(|c| c.0 == Verb::Move).collect();
    assert_eq!(moves.len(), 16, "one move per page: {moves:?}");
    assert_eq!((s.pools[0].small.available(), s.pools[1].small.available()), (56, 56));
    let st = s.stats.snapshot();
    assert_eq!((st.numa_hit, st.interleave_hit, st.numa_miss), (16, 16, 0));
}

/// Reads before writes (reads.rs): a range's first read window maps the zero page and keeps
/// two samples; a program that wrote them gets pool pages for its next read window, one that
/// did not gets the zero page again.
#[test]
fn a_read_takes_pool_pages_once_the_samples_of_the_last_read_window_were_written() {
    let s = state(true, 4096, 1024, 0);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    h.fault(page(0), false, 7);
    assert_eq!(
        k.calls(),
        [(Verb::Zeropage, page(0), bytes(16))],
        "first read: the zero page"
    );
    // The samples: the window's last two pages. The program writes what it read.
    k.write(page(14));
    k.write(page(15));
    h.fault(page(16), false, 7);
    let calls = k.calls();
    assert_eq!(
        calls[1],
        (Verb::Zeropage, page(16 + 62), bytes(1)),
        "samples first: {calls:?}"
    );
    assert_eq!(calls[2], (Verb::Zeropage, page(16 + 63), bytes(1)));
    assert!(
        calls[3..].iter().all(|c| c.0 == Verb::Move),
        "the rest moved: {calls:?}"
    );
    let st = s.stats.snapshot();
    assert_eq!((st.read_windows_pool, st.read_pages_pool, st.pages_moved), (1, 64, 62));
    assert_eq!(
        (st.read_samples_written, st.read_samples_unwritten),
        (0, 0),
        "zero-page window"
    );
    // This time the program only read: the next read window is the zero page, counted wrong.
    let before = k.calls().len();
    h.fault(page(80), false, 7);
    let calls = &k.calls()[before..];
    assert!(calls.iter().all(|c| c.0 == Verb::Zeropage), "{calls:?}");
    let st = s.stats.snapshot();
    assert_eq!((st.read_samples_written, st.read_samples_unwritten), (0, 2));
    assert_eq!(st.read_windows_pool, 1);
}

#[test]
fn a_program_that_only_reads_never_gets_a_pool_page() {
    let s = state(true, 8192, 2048, 0);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    let mut at = 0;
    for _ in 0..6 {
        h.fault(page(at), false, 7);
        at = k
            .present
            .borrow()
            .iter()
            .max()
            .map_or(0, |&a| (a - BASE) as u64 / PAGE_SIZE as u64 + 1);
    }
    assert!(k.calls().iter().all(|c| c.0 == Verb::Zeropage), "{:?}", k.calls());
    let st = s.stats.snapshot();
    assert_eq!((st.read_windows_pool, st.pages_moved, st.pages_copied), (0, 0, 0));
}

#[test]
fn a_read_served_from_the_pool_maps_the_zero_page_where_the_move_is_refused() {
    let s = state(true, 4096, 1024, 0);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    h.fault(page(0), false, 7);
    k.write(page(14));
    k.write(page(15));
    // A read-only mapping: the kernel refuses every move (protections differ).
    k.none.set((page(16), page(4096)));
    let before = k.calls().len();
    h.fault(page(16), false, 7);
    let calls = &k.calls()[before..];
    assert!(
        calls.iter().all(|c| c.0 != Verb::Copy),
        "no page made for a read: {calls:?}"
    );
    assert_eq!(s.stats.snapshot().pages_copied, 0);
}

#[test]
fn with_read_pool_off_reads_map_the_zero_page_whatever_the_program_wrote() {
    let s = state_with(
        Options {
            read_pool: false,
            ..opts(true)
        },
        4096,
        1024,
        0,
    );
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    h.fault(page(0), false, 7);
    k.write(page(14));
    k.write(page(15));
    h.fault(page(16), false, 7);
    assert!(k.calls().iter().all(|c| c.0 == Verb::Zeropage), "{:?}", k.calls());
}

/// A thread whose read verdict says writes (its first window's samples were written), for the
/// tests below: `h` has served page 0's read window, and the samples 14 and 15 were written.
fn reader_that_writes(h: &mut Handler<'_, Fake>, k: &Fake, tid: u32) {
    h.fault(page(0), false, tid);
    k.write(page(14));
    k.write(page(15));
}

#[test]
fn a_read_window_served_as_a_write_with_no_room_for_samples_keeps_none() {
    let s = state(true, 4096, 1024, 0);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    reader_that_writes(&mut h, &k, 7);
    // Two pages before the PMD's end: no sample, and the fault's own page is not one.
    let before = k.calls().len();
    h.fault(page(510), false, 7);
    let calls = &k.calls()[before..];
    assert!(calls.iter().all(|c| c.0 == Verb::Move), "{calls:?}");
    assert!(k.woken(page(510)));
}

#[test]
fn a_huge_read_fault_served_as_a_write_takes_a_whole_huge_page_and_no_sample() {
    let s = state(true, 4096, 1024, 4);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    // PMD 0 as usual, the next ones advised huge (the kernel asks with the PMD empty).
    s.ranges.set_huge(BASE + PMD_SIZE, BASE + 4 * PMD_SIZE, true);
    reader_that_writes(&mut h, &k, 7);
    let before = k.calls().len();
    h.fault(BASE + PMD_SIZE, false, 7);
    let calls = &k.calls()[before..];
    assert_eq!(calls[0], (Verb::Move, BASE + PMD_SIZE, PMD_SIZE), "{calls:?}");
    assert!(
        calls.iter().all(|c| c.0 != Verb::Zeropage),
        "no sample in a huge PMD: {calls:?}"
    );
    let st = s.stats.snapshot();
    assert_eq!((st.huge_moves, st.huge_fallbacks), (1, 0));
}

#[test]
fn a_read_window_served_as_a_write_goes_in_after_its_samples_first() {
    // No huge ring: the window's pages are 4 KiB moves, cut at the samples.
    let s = state(true, 8192, 4096, 0);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    reader_that_writes(&mut h, &k, 7);
    let before = k.calls().len();
    // A window of 64 pages from page 16: samples 78 and 79, the part after them is empty;
    // then from 80: a window of 256, whose part in PMD 0 ends at 336 (samples 334, 335).
    h.fault(page(16), false, 7);
    k.write(page(78));
    k.write(page(79));
    let mid = k.calls().len();
    h.fault(page(80), false, 7);
    let calls = &k.calls()[mid..];
    assert_eq!(
        &calls[..2],
        [
            (Verb::Zeropage, page(334), bytes(1)),
            (Verb::Zeropage, page(335), bytes(1))
        ]
    );
    assert_eq!(&calls[2..], [(Verb::Move, page(80), bytes(254))], "{calls:?}");
    assert!(k.calls()[before..mid].iter().any(|c| c.0 == Verb::Move));
    let st = s.stats.snapshot();
    assert_eq!((st.read_samples_written, st.read_samples_unwritten), (2, 0));
}

#[test]
fn each_thread_looks_at_its_own_samples_only() {
    let s = state(true, 8192, 4096, 0);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    reader_that_writes(&mut h, &k, 7);
    // Thread 8 reads the other half; its first window's samples are its own, not looked at
    // by thread 7, whose next fault comes past them before thread 8 wrote them.
    h.fault(page(4096), false, 8);
    let before = k.calls().len();
    h.fault(page(16), false, 7);
    assert!(
        k.calls()[before..].iter().any(|c| c.0 == Verb::Move),
        "thread 7 keeps its verdict"
    );
    h.fault(page(4096 + 16), false, 8);
    let st = s.stats.snapshot();
    // Thread 8 looked at its own samples (unwritten): the range's reads map the zero page.
    assert_eq!(st.read_windows_pool, 1, "{st:?}");
}

#[test]
fn reads_where_the_program_advised_random_access_map_the_zero_page() {
    let s = state(true, 4096, 1024, 0);
    let k = Fake::new();
    let mut h = Handler::new(&s, &k);
    reader_that_writes(&mut h, &k, 7);
    s.ranges.set_random(BASE, BASE + bytes(4096), true);
    let before = k.calls().len();
    h.fault(page(16), false, 7);
    assert!(
        k.calls()[before..].iter().all(|c| c.0 == Verb::Zeropage),
        "{:?}",
        k.calls()
    );
    // MADV_NORMAL: served as writes again.
    s.ranges.set_random(BASE, BASE + bytes(4096), false);
    k.write(page(78));
    k.write(page(79));
    let before = k.calls().len();
    h.fault(page(80), false, 7);
    assert!(k.calls()[before..].iter().any(|c| c.0 == Verb::Move), "{:?}", k.calls());
}
