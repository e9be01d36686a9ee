//! Recycling: pages the program gives up come back through the scrub thread, zeroed. Each
//! test checks what a program would see (every byte zero after a recycle, its data kept where
//! a move was refused) and the counters that say the pages really took the recycling path.
//! The fork case is in `recycle_fork.rs`: a fork shares every page of the process with the
//! child, other tests' too, and shared pages do not move.

use std::time::{Duration, Instant};
use zerofault::os::mman::PAGE_SIZE;
use zerofault::{is_zero, Engine, Options, Region, ZeroMethod};

const MIB: usize = 1 << 20;

fn engine_with(tweak: &[(&str, &str)]) -> Engine {
    if let Err(e) = zerofault::probe() {
        panic!("userfaultfd is required for this test: {e}");
    }
    let mut o = Options::default();
    for (k, v) in tweak {
        o.set(k, v).unwrap();
    }
    Engine::new(o).expect("engine")
}

/// Fills every page of the region with a pattern that is never zero.
fn fill_secret(r: &mut Region, seed: u8) {
    for (i, b) in r.as_mut_slice().iter_mut().enumerate().step_by(64) {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed) | 1;
    }
}

/// Waits (at most 10 s) until `done(stats)`; returns the last snapshot.
fn wait_for(e: &Engine, done: impl Fn(&zerofault::Snapshot) -> bool) -> zerofault::Snapshot {
    let t0 = Instant::now();
    loop {
        let s = e.stats();
        if done(&s) || t0.elapsed() > Duration::from_secs(10) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Fill, recycle, check zero, then a new region served from the recycled pages.
fn recycle_round_trip(method: &str) {
    let e = engine_with(&[("zero_method", method)]);
    let len = 64 * MIB;
    let mut r = e.map(len).unwrap();
    fill_secret(&mut r, 7);
    let done = r.recycle(0, len).unwrap();
    assert!(
        r.as_slice().chunks(PAGE_SIZE).all(is_zero),
        "{method}: a recycled page kept bytes"
    );
    let s = e.stats();
    assert_eq!(s.pages_recycled, done.pages, "{method}");
    assert!(
        done.pages >= (len / PAGE_SIZE) as u64 * 9 / 10,
        "{method}: {done:?}\n{}",
        s.to_text()
    );
    assert!(
        done.huge_pages > 0,
        "{method}: whole huge pages move with one PMD move: {done:?}"
    );
    let s = wait_for(&e, |s| s.pages_scrubbed >= done.pages);
    assert_eq!(
        s.pages_scrubbed,
        done.pages,
        "{method}: every recycled page zeroed\n{}",
        s.to_text()
    );
    // The pages come back to a new region (the old one's pages too): every byte zero.
    let before = e.stats();
    let mut r2 = e.map(len).unwrap();
    let mut bad = 0;
    for p in r2.as_mut_slice().chunks_mut(PAGE_SIZE) {
        // A write first (a write fault takes a pool page), then the rest must read zero.
        p[0] = 1;
        bad += usize::from(!is_zero(&p[1..]));
    }
    assert_eq!(bad, 0, "{method}: pages handed out dirty");
    assert!(r.as_slice().chunks(PAGE_SIZE).all(is_zero), "{method}");
    let moved = e.stats().since(&before).pages_moved;
    assert!(
        moved >= done.pages / 2,
        "{method}: the new region came from the pool: {moved}\n{}",
        e.stats().since(&before).to_text()
    );
    if method != "auto" {
        let code = ZeroMethod::ALL.iter().position(|m| m.name() == method).unwrap() as u64 + 1;
        assert_eq!(e.stats().zero_method, code, "{method}");
    }
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn recycled_pages_read_zero_and_come_back_zeroed_under_every_method() {
    let mut ran = 0;
    for m in ZeroMethod::ALL {
        if m.available().is_ok() {
            recycle_round_trip(m.name());
            ran += 1;
        }
    }
    recycle_round_trip("auto");
    assert!(ran >= 1);
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn two_threads_recycling_and_touching_at_once_see_only_their_data_or_zero() {
    let e = std::sync::Arc::new(engine_with(&[]));
    let threads: Vec<_> = (0..2u8)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mut r = e.map(16 * MIB).unwrap();
                let mut bad = 0;
                for round in 0..20u8 {
                    // Every page reads zero before it is written (fresh, or recycled).
                    bad += r.as_slice().chunks(PAGE_SIZE).filter(|p| !is_zero(p)).count();
                    fill_secret(&mut r, t * 64 + round);
                    r.recycle(0, 16 * MIB).unwrap();
                }
                bad
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 0, "a page read nonzero before it was written");
    }
    let s = wait_for(&e, |s| s.pages_scrubbed > 0);
    assert!(s.pages_recycled > 0 && s.pages_scrubbed > 0, "{}", s.to_text());
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn an_mlocked_range_is_not_moved_and_its_discard_error_is_reported() {
    let e = engine_with(&[]);
    let len = 4 * MIB;
    let mut r = e.map(len).unwrap();
    fill_secret(&mut r, 9);
    // SAFETY: locking our own region.
    if unsafe { libc::mlock(r.as_ptr().cast(), len) } != 0 {
        eprintln!("mlock refused here (RLIMIT_MEMLOCK): the locked case is not exercised");
        return;
    }
    let before = r.as_slice().to_vec();
    let err = r.recycle(0, len).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "MADV_DONTNEED's own error");
    assert_eq!(r.as_slice(), &before[..], "nothing moved out of a locked range");
    assert!(e.stats().recycle_discarded > 0);
    // SAFETY: unlocking what we locked.
    unsafe { libc::munlock(r.as_ptr().cast(), len) };
    r.recycle(0, len).unwrap();
    assert!(r.as_slice().chunks(PAGE_SIZE).all(is_zero));
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn recycled_pages_nobody_takes_go_back_to_the_kernel_after_the_purge_delay() {
    // 10M: the huge ring's share of it (7.5 MiB) is not a whole number of huge pages; the
    // purge rounds it down, or the pool would end one huge page above scrub_stop.
    for stop_mib in [8, 10] {
        let stop = format!("{stop_mib}M");
        let e = engine_with(&[("scrub_start", "4M"), ("scrub_stop", &stop), ("purge_delay", "100ms")]);
        let len = 128 * MIB;
        let mut r = e.map(len).unwrap();
        fill_secret(&mut r, 1);
        let done = r.recycle(0, len).unwrap();
        assert!(done.pages > 0);
        let limit = (stop_mib * MIB / PAGE_SIZE) as u64;
        let t0 = Instant::now();
        let s = wait_for(&e, |s| {
            s.pages_scrubbed + s.pages_purged >= done.pages && e.pool_pages() <= limit
        });
        assert!(
            e.pool_pages() <= limit,
            "scrub_stop {stop}: pool holds {} pages after {:?}\n{}",
            e.pool_pages(),
            t0.elapsed(),
            s.to_text()
        );
        assert!(s.pages_purged > 0, "{}", s.to_text());
    }
}

/// The pool paused (the shim's mlockall(MCL_FUTURE)) and protected (around mlockall(MCL_CURRENT))
/// over and over while one thread recycles secrets and another takes fresh pages: the scrub
/// must never be inside a batch when the rings are released or made PROT_NONE (found by a
/// review: a released batch refilled by a recycler went on unzeroed; a protected dirty ring
/// faulted the scrub's zeroing).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn pausing_and_protecting_the_pool_while_the_scrub_works_hands_out_only_zero_pages() {
    let e = std::sync::Arc::new(engine_with(&[
        ("pool_max", "64M"),
        ("scrub_start", "0"),
        ("scrub_stop", "0"),
    ]));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let recycler = {
        let (e, stop) = (e.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut r = e.map(16 * MIB).unwrap();
            let mut round = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fill_secret(&mut r, round);
                r.recycle(0, 16 * MIB).unwrap();
                round = round.wrapping_add(1);
            }
        })
    };
    let toggler = {
        let (e, stop) = (e.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                e.pause_pool(true);
                e.pause_pool(false);
                std::thread::sleep(Duration::from_millis(1));
                e.before_mlockall();
                std::thread::yield_now();
                e.after_mlockall();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let t0 = Instant::now();
    let mut bad = 0;
    // 3 s, and on until the scrub has zeroed something while the toggling goes on (at most
    // 30 s): it rests while it finds no CPU to itself, and with the other tests of this file
    // running beside this one on 2 CPUs it once got 6 ms of CPU in the 3 s (seen in CI).
    while t0.elapsed() < Duration::from_secs(3)
        || (e.stats().pages_scrubbed == 0 && t0.elapsed() < Duration::from_secs(30))
    {
        let mut r = e.map(8 * MIB).unwrap();
        for p in r.as_mut_slice().chunks_mut(PAGE_SIZE) {
            p[0] = 1;
            bad += usize::from(!is_zero(&p[1..]));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    recycler.join().unwrap();
    toggler.join().unwrap();
    let s = e.stats();
    assert_eq!(bad, 0, "pages handed out with a freed block's bytes\n{}", s.to_text());
    assert!(s.pages_recycled > 0 && s.pages_scrubbed > 0, "{}", s.to_text());
}

/// A program that frees many small blocks (4 MiB each, 640 MiB in all) and touches nothing
/// after keeps its pools within the memory budget: 128 MiB and twice the largest recent block,
/// not `pool_max` (1 GiB here).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn small_frees_do_not_fill_the_pool_to_pool_max() {
    // A purge delay far longer than the wait below: the idle purge gives nothing back meanwhile.
    let e = engine_with(&[
        ("pool_max", "1G"),
        ("scrub_start", "0"),
        ("scrub_stop", "0"),
        ("purge_delay", "20s"),
    ]);
    let len = 64 * MIB;
    let mut regions: Vec<Region> = (0..10u8)
        .map(|i| {
            let mut r = e.map(len).unwrap();
            fill_secret(&mut r, i);
            r
        })
        .collect();
    // Nothing faults after: what is recycled stays in the pools unless given back.
    for r in &mut regions {
        for at in (0..len).step_by(4 * MIB) {
            r.recycle(at, 4 * MIB).unwrap();
        }
    }
    let budget = ((128 + 2 * 4) * MIB / PAGE_SIZE) as u64;
    // The scrub gives back what is above the budget within ~100 ms; wait up to 3 s.
    let t0 = Instant::now();
    while e.pool_held_pages() > budget && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = e.stats();
    assert!(s.pages_recycled > 0, "{}", s.to_text());
    assert!(
        e.pool_held_pages() <= budget,
        "the pools hold {} MiB, above the budget's {} MiB\n{}",
        (e.pool_held_pages() * PAGE_SIZE as u64) >> 20,
        (budget * PAGE_SIZE as u64) >> 20,
        s.to_text()
    );
}
