//! `zerofault verify`: every byte of every page the engine serves reads zero before the
//! program's first write, and no page is lost or shared afterwards.
//!
//! Each pattern maps `--gb` of engine memory and visits every page: it writes an 8-byte marker
//! (unique per page, at an offset that varies per page) and checks that the page's other bytes
//! are zero. Pages installed ahead by a window are checked the same way when visited. A final
//! pass checks that every page holds exactly its own marker: a page moved twice, or installed
//! over data, would show another page's marker or lose its own. Each pattern also checks that
//! it exercised the path it names (stats), so a pattern that silently took another path fails.

use zerofault::page::PAGE_SIZE;
use zerofault::{is_zero, Engine, Options, Region, Snapshot};
use zerofault_bench::args::{checked, gib_bytes, gib_in, int_in};
use zerofault_bench::shuffle;

/// The smallest size verify checks: 4 MiB, 1024 pages. Below it the patterns cannot show the
/// paths they must take, with the default knobs: `sequential`'s windows (16, 64 and 256 pages,
/// then one from page 336 to a 2 MiB boundary) cover no whole 2 MiB PMD before page 1024, so
/// no huge page is moved and a cold pool moves nothing else; `unmap-and-touch-again` needs
/// two 2 MiB chunks, one kept and one dropped. (Measured: 3 MiB fails `sequential` nine
/// times in ten, 2 MiB also fails `unmap-and-touch-again` every time.)
pub const MIN_BYTES: usize = 4 << 20;

/// What `--gb` accepts: [`MIN_BYTES`] in GiB, up to the knobs' largest size.
pub const GB_ACCEPTS: &str = "a size in GiB, at least 0.00390625 (4 MiB) and at most 131072 (128 TiB), e.g. 2 or 0.25";

/// `zerofault verify`'s flags.
#[derive(clap::Args, Clone, Debug, PartialEq)]
#[command(after_help = "Examples:\n  zerofault verify\n  zerofault verify --gb 0.25 --busy 2    beside two CPU hogs")]
pub struct VerifyArgs {
    /// Engine memory each pattern maps and checks, in GiB (at least 4 MiB).
    #[arg(long, allow_hyphen_values = true, value_name = "GIB", default_value = "1", value_parser = checked("gb", GB_ACCEPTS, gib_in(MIN_BYTES)))]
    pub gb: f64,
    /// Threads of the multi-threaded patterns.
    #[arg(long, allow_hyphen_values = true, value_name = "N", default_value = "4",
          value_parser = checked("threads", "an integer 2..=256", |s: &str| int_in(2, 256)(s).map(|n| n as usize)))]
    pub threads: usize,
    /// N CPU hogs at normal priority beside every pattern.
    #[arg(long, allow_hyphen_values = true, value_name = "N", default_value = "0",
          value_parser = checked("busy", "an integer 0..=1024 (CPU hogs)", |s: &str| int_in(0, 1024)(s).map(|n| n as u32)))]
    pub busy: u32,
}

/// `zerofault verify ARGS` (without the command's name); an error is one line.
#[cfg(test)]
fn parse(args: &[String]) -> Result<VerifyArgs, String> {
    zerofault_bench::args::parse_flags("verify", args)
}

/// Marker of page `i`: never zero.
fn marker(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Byte offset of page `i`'s marker: 8-aligned, anywhere in the page.
fn marker_offset(i: usize) -> usize {
    (i % (PAGE_SIZE / 8)) * 8
}

/// The memory under test, shared by checking threads.
#[derive(Clone, Copy)]
struct Mem {
    base: usize,
    pages: usize,
}

impl Mem {
    fn page(&self, i: usize) -> &[u8] {
        assert!(i < self.pages);
        // SAFETY: page `i` lies inside the region, which stays mapped until every checking
        // thread is joined; each page is written by one thread only, and read by that thread
        // (or after the join), so this shared slice never overlaps a concurrent write.
        unsafe { std::slice::from_raw_parts((self.base + i * PAGE_SIZE) as *const u8, PAGE_SIZE) }
    }

    fn write_marker(&self, i: usize, m: u64) {
        assert!(i < self.pages);
        // SAFETY: as in `page`; the marker lies inside page `i` and is 8-byte aligned.
        unsafe { ((self.base + i * PAGE_SIZE + marker_offset(i)) as *mut u64).write_volatile(m) };
    }

    /// Nonzero bytes of page `i` outside its marker.
    fn stray_bytes(&self, i: usize) -> usize {
        let p = self.page(i);
        let o = marker_offset(i);
        if is_zero(&p[..o]) && is_zero(&p[o + 8..]) {
            return 0;
        }
        p.iter()
            .enumerate()
            .filter(|(j, b)| **b != 0 && !(o..o + 8).contains(j))
            .count()
    }

    /// First write: marker, then the rest must be zero. Returns stray bytes.
    fn first_write(&self, i: usize) -> usize {
        self.write_marker(i, marker(i));
        self.stray_bytes(i)
    }

    /// Reads the whole page first (zero page), then writes. Returns stray bytes.
    fn read_then_write(&self, i: usize) -> usize {
        let before = self.page(i).iter().filter(|b| **b != 0).count();
        before + self.first_write(i)
    }

    /// The page holds exactly its marker. Returns bad bytes.
    fn holds_marker(&self, i: usize) -> usize {
        let o = marker_offset(i);
        let m = u64::from_ne_bytes(self.page(i)[o..o + 8].try_into().expect("8 bytes"));
        self.stray_bytes(i) + if m == marker(i) { 0 } else { 8 }
    }
}

/// Runs `f` over the pages of `lists`, one thread per list; returns the summed result.
fn par(mem: Mem, lists: Vec<Vec<u32>>, f: fn(&Mem, usize) -> usize) -> usize {
    let handles: Vec<_> = lists
        .into_iter()
        .map(|l| std::thread::spawn(move || l.iter().map(|&i| f(&mem, i as usize)).sum::<usize>()))
        .collect();
    handles.into_iter().map(|h| h.join().expect("verify thread")).sum()
}

fn all(pages: usize) -> Vec<u32> {
    (0..pages as u32).collect()
}

struct Outcome {
    name: &'static str,
    pages: usize,
    bad: usize,
    stats: Snapshot,
    /// A path the pattern must have exercised, and whether it did.
    exercised: (&'static str, bool),
}

fn engine(tweak: &[(&str, &str)]) -> Result<Engine, String> {
    let mut o = Options::from_env().map_err(|e| e.to_string())?;
    for (k, v) in tweak {
        o.set(k, v).map_err(|e| e.to_string())?;
    }
    Engine::new(o).map_err(|e| format!("engine: {e}"))
}

fn region(e: &Engine, bytes: usize) -> Result<(Region, Mem), String> {
    let r = e.map(bytes).map_err(|e| format!("map: {e}"))?;
    let mem = Mem {
        base: r.as_ptr() as usize,
        pages: bytes / PAGE_SIZE,
    };
    Ok((r, mem))
}

/// Page orders: one list per thread.
fn sequential(pages: usize, _: usize) -> Vec<Vec<u32>> {
    vec![all(pages)]
}

fn random(pages: usize, _: usize) -> Vec<Vec<u32>> {
    let mut v = all(pages);
    shuffle(&mut v, 7);
    vec![v]
}

/// Threads take interleaved 64-page chunks, so each window reaches into other threads' pages
/// and the page-state claims decide who installs what.
fn interleaved(pages: usize, threads: usize) -> Vec<Vec<u32>> {
    (0..threads)
        .map(|t| {
            all(pages)
                .into_iter()
                .filter(|i| (*i as usize / 64) % threads == t)
                .collect()
        })
        .collect()
}

/// A pattern: engine knobs, page orders, what the first visit does, and the path it must take.
struct Pattern {
    name: &'static str,
    knobs: &'static [(&'static str, &'static str)],
    order: fn(usize, usize) -> Vec<Vec<u32>>,
    visit: fn(&Mem, usize) -> usize,
    must: &'static str,
    took_path: fn(&Snapshot) -> bool,
    /// Bytes the pool is filled with before the pattern runs (0: empty, the scrub fills it
    /// when a stream shows up).
    prefill: usize,
}

const PATTERNS: &[Pattern] = &[
    Pattern {
        name: "sequential",
        knobs: &[],
        order: sequential,
        visit: Mem::first_write,
        must: "pages moved from the pool",
        prefill: 0,
        took_path: |s| s.pages_moved > 0,
    },
    Pattern {
        name: "random",
        knobs: &[],
        order: random,
        visit: Mem::first_write,
        must: "a hand-back to the kernel",
        prefill: 0,
        took_path: |s| s.handbacks > 0,
    },
    Pattern {
        name: "multi-threaded",
        knobs: &[],
        order: interleaved,
        visit: Mem::first_write,
        must: "faults from several threads",
        prefill: 0,
        took_path: |s| s.predict_starts >= 2,
    },
    Pattern {
        name: "read-then-write",
        knobs: &[],
        order: sequential,
        visit: Mem::read_then_write,
        // The first read window maps the zero page; its samples, written, send the next ones
        // to the pool (fault/reads.rs).
        must: "zero-page mappings, then read windows served from the pool",
        prefill: 16 << 20,
        took_path: |s| s.pages_zero_mapped > 0 && s.read_windows_pool > 0 && s.pages_moved > 0,
    },
    Pattern {
        name: "copy-forced",
        knobs: &[("pool", "off")],
        order: sequential,
        visit: Mem::first_write,
        must: "UFFDIO_COPY only",
        prefill: 0,
        took_path: |s| s.pages_copied > 0 && s.pages_moved == 0,
    },
    Pattern {
        name: "small-pool",
        knobs: &[("pool_max", "8M"), ("scrub_stop", "8M"), ("scrub_start", "4M")],
        order: interleaved,
        visit: Mem::first_write,
        must: "both moves and copies (pool ran out)",
        // Filled first: a scrub that finds no CPU to itself rests, and may not run at all in
        // the ~30 ms the pattern lasts beside its threads (CI saw 0 moves), and the refill
        // waits while faults come.
        prefill: 8 << 20,
        took_path: |s| s.pages_moved > 0 && s.copy_pool_empty > 0,
    },
];

fn run_pattern(p: &Pattern, bytes: usize, threads: usize) -> Result<Outcome, String> {
    let pages = bytes / PAGE_SIZE;
    let e = engine(p.knobs)?;
    if p.prefill > 0 {
        e.prefill(p.prefill)
            .map_err(|err| format!("zerofault verify: {}: pool fill: {err}", p.name))?;
    }
    let (r, mem) = region(&e, bytes)?;
    let mut bad = par(mem, (p.order)(pages, threads), p.visit);
    bad += par(mem, vec![all(pages)], Mem::holds_marker);
    let stats = e.stats();
    drop(r);
    Ok(Outcome {
        name: p.name,
        pages,
        bad,
        exercised: (p.must, (p.took_path)(&stats)),
        stats,
    })
}

/// Writes every page, then drops every other 2 MiB chunk (alternately MADV_DONTNEED and
/// munmap + fresh map), then visits every page again: dropped pages must read zero, kept
/// pages must still hold their marker.
fn discard_and_retouch(bytes: usize) -> Result<Outcome, String> {
    let pages = bytes / PAGE_SIZE;
    let e = engine(&[])?;
    let (mut r, mem) = region(&e, bytes)?;
    let mut bad = par(mem, vec![all(pages)], Mem::first_write);
    const CHUNK: usize = 512;
    let chunks = pages.div_ceil(CHUNK);
    for c in (1..chunks).step_by(2) {
        let (off, len) = (c * CHUNK * PAGE_SIZE, (CHUNK.min(pages - c * CHUNK)) * PAGE_SIZE);
        if c % 4 == 1 {
            r.discard(off, len).map_err(|e| format!("madvise: {e}"))?;
        } else {
            r.replace(off, len).map_err(|e| format!("remap: {e}"))?;
        }
    }
    let dropped = |i: usize| (i / CHUNK) % 2 == 1;
    // Second visit, in random order so that windows start mid-chunk.
    let mut order = all(pages);
    shuffle(&mut order, 11);
    for &i in &order {
        let i = i as usize;
        bad += if dropped(i) {
            mem.first_write(i)
        } else {
            mem.holds_marker(i)
        };
    }
    bad += par(mem, vec![all(pages)], Mem::holds_marker);
    let stats = e.stats();
    drop(r);
    let ok = stats.events_remove > 0 && (chunks < 4 || stats.events_unmap > 0) && stats.pages_forgotten > 0;
    Ok(Outcome {
        name: "unmap-and-touch-again",
        pages,
        bad,
        exercised: ("REMOVE and UNMAP events", ok),
        stats,
    })
}

/// The scrub thread works only while it has a CPU to itself: on a machine kept busy
/// (`.ci/run`'s parallel tests, `stress-ng --cpu 2`) it rests, seen here for 10 s and more. The patterns
/// that need it wait this long, and keep the pages they recycle as long (`purge_delay`), so
/// that a late scrub zeroes them instead of giving them back unzeroed (before 2026-11-25 they
/// waited 10 s with a purge delay of 1 s, and failed "did not exercise" under load).
const SCRUB_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
const RECYCLING: [(&str, &str); 1] = [("purge_delay", "300s")];

/// Waits (at most [`SCRUB_WAIT`]) until the scrub zeroed, or purged, every page recycled so far.
fn scrubbed(e: &Engine) -> Snapshot {
    let t0 = std::time::Instant::now();
    loop {
        let s = e.stats();
        if s.pages_scrubbed + s.pages_purged >= s.pages_recycled || t0.elapsed() >= SCRUB_WAIT {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Nonzero bytes anywhere in pages `[from, to)`, read without writing (zero pages map where
/// nothing is).
fn nonzero_bytes(mem: &Mem, from: usize, to: usize) -> usize {
    (from..to)
        .map(|i| {
            let p = mem.page(i);
            if is_zero(p) {
                0
            } else {
                p.iter().filter(|b| **b != 0).count()
            }
        })
        .sum()
}

/// Fills every page with its marker (the secret), recycles the whole region, checks that it
/// reads zero, lets the scrub zero the recycled pages, and visits every page again: those
/// first writes take the recycled pages back from the pool, and must find them zero. Under
/// whatever `ZEROFAULT_ZERO_METHOD` says.
fn recycle_and_touch_again(bytes: usize) -> Result<Outcome, String> {
    let pages = bytes / PAGE_SIZE;
    let e = engine(&RECYCLING)?;
    let (mut r, mem) = region(&e, bytes)?;
    let mut bad = par(mem, vec![all(pages)], Mem::first_write);
    let done = r.recycle(0, bytes).map_err(|e| format!("recycle: {e}"))?;
    bad += nonzero_bytes(&mem, 0, pages);
    // The reads above mapped zero pages: drop them, so the second visit writes fresh pages.
    r.discard(0, bytes).map_err(|e| format!("madvise: {e}"))?;
    let before = scrubbed(&e);
    bad += par(mem, vec![all(pages)], Mem::first_write);
    bad += par(mem, vec![all(pages)], Mem::holds_marker);
    let stats = e.stats();
    drop(r);
    let moved_back = stats.since(&before).pages_moved;
    let ok = done.pages > 0 && before.pages_scrubbed > 0 && moved_back > 0;
    Ok(Outcome {
        name: "recycle",
        pages,
        bad,
        exercised: ("pages recycled, zeroed by the scrub and moved back", ok),
        stats,
    })
}

/// As `recycle`, with the pages shared by a forked child (which checks its copy): the moves
/// are refused (EBUSY) and the fallback discards; the region reads zero, the child keeps its
/// bytes.
fn recycle_after_fork(bytes: usize) -> Result<Outcome, String> {
    let pages = bytes / PAGE_SIZE;
    let e = engine(&[])?;
    let (mut r, mem) = region(&e, bytes)?;
    let mut bad = par(mem, vec![all(pages)], Mem::first_write);
    let mut fds = [0; 2];
    // SAFETY: a pipe into a valid array of two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the child reads its copy of the region, and leaves with _exit: no allocation,
    // no lock.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        let mut b = [0u8; 1];
        // SAFETY: a read into our byte, the check of our copy, _exit.
        unsafe {
            libc::read(fds[0], b.as_mut_ptr().cast(), 1);
            let lost = (0..pages).filter(|&i| mem.holds_marker(i) != 0).count();
            libc::_exit(i32::from(lost != 0));
        }
    }
    let done = r.recycle(0, bytes).map_err(|e| format!("recycle: {e}"))?;
    bad += nonzero_bytes(&mem, 0, pages);
    let mut status = 0;
    // SAFETY: one byte from our buffer to the child, then reaping it.
    unsafe {
        libc::write(fds[1], b"x".as_ptr().cast(), 1);
        libc::waitpid(pid, &mut status, 0);
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    let child_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    bad += if child_ok { 0 } else { bytes };
    r.discard(0, bytes).map_err(|e| format!("madvise: {e}"))?;
    bad += par(mem, vec![all(pages)], Mem::first_write);
    bad += par(mem, vec![all(pages)], Mem::holds_marker);
    let stats = e.stats();
    drop(r);
    Ok(Outcome {
        name: "recycle-after-fork",
        pages,
        bad,
        exercised: ("moves refused after fork, discarded instead", done.discarded > 0),
        stats,
    })
}

/// Threads each recycle and touch their own part of one region at once, three rounds: every
/// first write finds zero, every page keeps its own marker.
fn recycle_two_threads(bytes: usize, threads: usize) -> Result<Outcome, String> {
    let pages = bytes / PAGE_SIZE;
    let e = engine(&RECYCLING)?;
    let (r, mem) = region(&e, bytes)?;
    let share = pages / threads;
    let bad: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let e = &e;
                s.spawn(move || {
                    let (from, to) = (t * share, if t + 1 == threads { pages } else { (t + 1) * share });
                    let mut bad = 0;
                    for _ in 0..3 {
                        bad += (from..to).map(|i| mem.first_write(i)).sum::<usize>();
                        bad += (from..to).map(|i| mem.holds_marker(i)).sum::<usize>();
                        let (addr, len) = (mem.base + from * PAGE_SIZE, (to - from) * PAGE_SIZE);
                        // SAFETY: this thread's own part of the region, given up here; no other
                        // thread touches it.
                        if unsafe { e.recycle(addr as *mut u8, len) }.is_err() {
                            bad += len;
                        }
                        bad += nonzero_bytes(&mem, from, to);
                        // SAFETY: as above; the zero pages the check mapped go.
                        if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) } != 0 {
                            bad += len;
                        }
                    }
                    bad
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("verify thread")).sum()
    });
    let stats = scrubbed(&e);
    drop(r);
    Ok(Outcome {
        name: "recycle-threads",
        pages,
        bad,
        exercised: (
            "recycled pages zeroed and moved back while threads recycle",
            stats.pages_recycled > 0 && stats.pages_scrubbed > 0,
        ),
        stats,
    })
}

pub fn run(a: &VerifyArgs) -> Result<(), String> {
    zerofault::probe().map_err(|e| format!("zerofault verify: needs userfaultfd: {e}"))?;
    let bytes = gib_bytes(a.gb);
    let _hogs = zerofault_bench::Hogs::start(a.busy).map_err(|e| format!("--busy: starting a CPU hog: {e}"))?;
    if a.busy > 0 {
        println!(
            "beside {} CPU hog{} at normal priority",
            a.busy,
            if a.busy == 1 { "" } else { "s" }
        );
    }
    let mut failed = 0;
    let outcomes = PATTERNS
        .iter()
        .map(|p| run_pattern(p, bytes, a.threads))
        .chain(std::iter::once_with(|| discard_and_retouch(bytes)))
        .chain(std::iter::once_with(|| recycle_and_touch_again(bytes)))
        .chain(std::iter::once_with(|| recycle_after_fork(bytes)))
        .chain(std::iter::once_with(|| recycle_two_threads(bytes, a.threads)));
    for o in outcomes {
        let o = o?;
        let s = &o.stats;
        let ok = o.bad == 0 && o.exercised.1;
        println!(
            "{:<22} {:>8} pages  {:>6} bad bytes  moved {} copied {} zero-mapped {} handed back {} events remove/unmap {}/{} recycled/scrubbed/discarded {}/{}/{}  {}{}",
            o.name,
            o.pages,
            o.bad,
            s.pages_moved,
            s.pages_copied,
            s.pages_zero_mapped,
            s.pages_handed_back,
            s.events_remove,
            s.events_unmap,
            s.pages_recycled,
            s.pages_scrubbed,
            s.recycle_discarded,
            if ok { "OK" } else { "FAILED" },
            if o.exercised.1 { String::new() } else { format!(" (did not exercise: {})", o.exercised.0) }
        );
        failed += usize::from(!ok);
    }
    if failed > 0 {
        return Err(format!("zerofault verify: {failed} pattern(s) failed"));
    }
    let method = Options::from_env().map_err(|e| e.to_string())?.zero_method;
    println!(
        "verify: all patterns passed (recycled pages zeroed by zero_method={})",
        method.map_or("auto", |m| m.name())
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_nonzero_and_inside_the_page() {
        for i in 0..10_000 {
            assert_ne!(marker(i), 0);
            assert!(marker_offset(i) + 8 <= PAGE_SIZE && marker_offset(i) % 8 == 0);
        }
    }

    #[test]
    fn page_checks_catch_stray_and_missing_bytes() {
        let mut buf = vec![0u64; 2 * PAGE_SIZE / 8 + 512];
        let base = (buf.as_mut_ptr() as usize).next_multiple_of(PAGE_SIZE);
        let mem = Mem { base, pages: 1 };
        assert_eq!(mem.first_write(0), 0);
        assert_eq!(mem.holds_marker(0), 0);
        // SAFETY: base + 100 lies inside `buf`'s page-aligned first page.
        unsafe { ((base + 100) as *mut u8).write(7) };
        assert_eq!(mem.holds_marker(0), 1);
        mem.write_marker(0, 5);
        assert_eq!(mem.holds_marker(0), 9);
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(parse(&["--gb".into(), "-2".into()]).unwrap_err().contains("--gb"));
        for gb in ["0.001", "0.0039", "1e30", " 1"] {
            let e = parse(&["--gb".into(), gb.into()]).unwrap_err();
            assert!(e.starts_with(&format!("--gb {gb:?} is invalid: it accepts ")), "{e}");
            assert!(e.contains("at least 0.00390625 (4 MiB)") && !e.contains('\n'), "{e}");
        }
        let a = parse(&["--gb".into(), "0.00390625".into()]).unwrap();
        assert_eq!(gib_bytes(a.gb), MIN_BYTES);
        assert!(parse(&["--threads".into(), "1".into()])
            .unwrap_err()
            .contains("--threads"));
        assert!(parse(&["--busy".into(), "x".into()]).unwrap_err().contains("--busy"));
        assert_eq!(parse(&["--busy".into(), "2".into()]).unwrap().busy, 2);
        assert_eq!(parse(&[]).unwrap().busy, 0);
    }
}
