//! `zerofault bench-flush`: what one huge-page move costs when other CPUs run the process.
//!
//! The engine installs a huge page with one `UFFDIO_MOVE` of a PMD, and the kernel then flushes
//! the pool's PMD from every CPU running a thread of the process: an interrupt each, which the
//! mover waits for. `bench-flush` measures the two sides in one run. Writer threads (one per
//! CPU the process may use but the last, each pinned, each writing one byte per 4 KiB page of
//! its own populated memory, 256 MiB by default, over and over: pft's floor) run alone; then while a thread pinned
//! to the last CPU spins in user space (the control: a busy neighbour that flushes nothing, in
//! case the CPUs share a core); then while a mover pinned there moves one huge page back and
//! forth ([`PmdShuttle`], `shuttle.rs`); then the writers stop and the mover runs alone. It prints
//! the mover's time per move both ways, the writers' time per page in each phase, the
//! TLB-shootdown interrupts their CPUs took (`/proc/interrupts`, x86; it counts other
//! processes' flushes there too), and from those what each move costs each running writer.
//! docs/SCALING.md's model uses these terms for N cores; on a machine with more of them,
//! `--writers N` measures how they grow.

use crate::args::{checked, int_in, invalid, positive_f64};
use crate::shuttle::PmdShuttle;
use crate::sys::{allowed_cpus, pin_to_cpu, populate_write, Mapping, Thp};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerofault::page::PAGE_SIZE;

/// Each writer's memory by default, MiB: populated 4 KiB pages, far beyond the TLB's reach (a
/// miss a page, no fault), like pft's floor over a GiB; less when many writers would populate
/// more than [`TOTAL_MIB`] in all.
const WRITER_MIB: usize = 256;
const TOTAL_MIB: usize = 4096;
/// Pages a writer writes between two updates of its count.
const COUNT_EVERY: usize = 4096;

/// What `bench-flush` measured.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Flush {
    /// The writers' CPUs, each writer's memory, and the mover's CPU.
    pub(crate) writer_cpus: Vec<usize>,
    pub(crate) writer_mib: usize,
    pub(crate) mover_cpu: usize,
    pub(crate) phase: Duration,
    /// Nanoseconds per page written by a writer: alone, while the mover's CPU spun in user
    /// space (the control), and while the mover moved the huge page.
    pub(crate) writer_ns_alone: f64,
    pub(crate) writer_ns_spinning: f64,
    pub(crate) writer_ns_moving: f64,
    /// Pages the writers wrote while the mover moved, all of them.
    pub(crate) pages_moving: u64,
    /// Moves made while the writers ran, and microseconds per move then.
    pub(crate) moves_with_writers: u64,
    pub(crate) move_us_with_writers: f64,
    /// Moves made with the writers stopped, and microseconds per move then.
    pub(crate) moves_alone: u64,
    pub(crate) move_us_alone: f64,
    /// TLB-shootdown interrupts the writers' CPUs took while the mover ran (None: no such
    /// line in /proc/interrupts, as off x86).
    pub(crate) shootdowns: Option<u64>,
    /// The page was still one huge page after the last move.
    pub(crate) stayed_huge: bool,
}

/// `zerofault bench-flush`'s flags.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = "Example:\n  zerofault bench-flush --writers 1 --secs 0.5")]
pub struct FlushFlags {
    /// Threads writing to the page while it moves [default: one per CPU the process may use,
    /// less the mover's].
    #[arg(long, allow_hyphen_values = true, value_name = "N", value_parser = checked("writers", "an integer 1.. (one CPU the process may use is the mover's)", int_in(1, u64::MAX)))]
    writers: Option<u64>,
    /// MiB each writer writes [default: 64, less when many writers].
    #[arg(long, allow_hyphen_values = true, value_name = "M", value_parser = checked("mib", "an integer 2..=65536 (MiB per writer)", int_in(2, 65536)))]
    mib: Option<u64>,
    /// Seconds per phase, 0.05 to 60.
    #[arg(long, allow_hyphen_values = true, value_name = "F", default_value = "1",
          value_parser = checked("secs", "seconds per phase, 0.05 to 60", |s: &str| positive_f64(s).filter(|v| (0.05..=60.0).contains(v))))]
    secs: f64,
}

/// `zerofault bench-flush [--writers N] [--mib M] [--secs F]`.
///
/// # Context
/// The command's main thread.
pub fn run_bench_flush(flags: &FlushFlags) -> Result<(), String> {
    let most = allowed_cpus().len().saturating_sub(1).max(1) as u64;
    let writers = match flags.writers {
        None => most,
        Some(w) if w <= most => w,
        Some(w) => {
            let accepts = format!("an integer 1..={most} (one CPU the process may use is the mover's)");
            return Err(invalid("writers", &w.to_string(), &accepts));
        }
    } as usize;
    let mib = flags.mib.unwrap_or(WRITER_MIB.min(TOTAL_MIB / writers).max(2) as u64) as usize;
    let f = measure(writers, mib, Duration::from_secs_f64(flags.secs))?;
    print!("{}", f.text());
    Ok(())
}

/// The TLB-shootdown interrupts `cpus` have taken so far, summed: the "TLB" line of
/// /proc/interrupts, whose columns follow its header's `CPUn` names.
fn shootdowns(cpus: &[usize]) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/interrupts").ok()?;
    let columns: Vec<usize> = s
        .lines()
        .next()?
        .split_whitespace()
        .map_while(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect();
    let line = s.lines().find(|l| l.trim_start().starts_with("TLB:"))?;
    let counts: Vec<u64> = line
        .split_once(':')?
        .1
        .split_whitespace()
        .map_while(|w| w.parse().ok())
        .collect();
    cpus.iter()
        .map(|c| columns.iter().position(|x| x == c).and_then(|i| counts.get(i)))
        .sum::<Option<u64>>()
}

/// The writer threads: each pinned to its CPU, writing its own memory until stopped. Dropping
/// them stops and joins them (an error on the way out leaves none running).
struct Writers {
    stop: Arc<AtomicBool>,
    counts: Arc<Vec<AtomicU64>>,
    threads: Vec<std::thread::JoinHandle<Result<(), String>>>,
}

impl Writers {
    /// Starts one writer per CPU of `cpus`, and returns once each has mapped and populated
    /// its memory (on its own CPU, so on its own node) and begun writing.
    fn start(cpus: &[usize], bytes: usize) -> Result<Writers, String> {
        let mut w = Writers {
            stop: Arc::new(AtomicBool::new(false)),
            counts: Arc::new(cpus.iter().map(|_| AtomicU64::new(0)).collect()),
            threads: vec![],
        };
        let ready = Arc::new(AtomicU64::new(0));
        for (i, &cpu) in cpus.iter().enumerate() {
            let (stop, counts, ready) = (w.stop.clone(), w.counts.clone(), ready.clone());
            w.threads.push(std::thread::spawn(move || -> Result<(), String> {
                let failed = |e: String| {
                    ready.fetch_add(1 << 32, Relaxed);
                    e
                };
                pin_to_cpu(cpu)
                    .map_err(|e| failed(format!("zerofault bench-flush: pinning a writer to CPU {cpu}: {e}")))?;
                let m =
                    Mapping::new(bytes, Thp::Never).map_err(|e| failed(format!("zerofault bench-flush: mmap: {e}")))?;
                populate_write(m.as_ptr() as usize, bytes)
                    .map_err(|e| failed(format!("zerofault bench-flush: MADV_POPULATE_WRITE: {e}")))?;
                ready.fetch_add(1, Relaxed);
                let p = m.as_ptr();
                let mut pass = 0u8;
                while !stop.load(Relaxed) {
                    pass = pass.wrapping_add(1);
                    for chunk in (0..bytes).step_by(COUNT_EVERY * PAGE_SIZE) {
                        for off in (chunk..chunk + COUNT_EVERY * PAGE_SIZE).step_by(PAGE_SIZE) {
                            // SAFETY: inside this thread's own populated mapping (its length
                            // is a multiple of COUNT_EVERY pages).
                            unsafe { p.add(off).write_volatile(pass) };
                        }
                        counts[i].fetch_add(COUNT_EVERY as u64, Relaxed);
                    }
                }
                Ok(())
            }));
        }
        loop {
            let r = ready.load(Relaxed);
            if r >> 32 > 0 {
                return Err(w
                    .finish()
                    .err()
                    .unwrap_or_else(|| "zerofault bench-flush: a writer failed".into()));
            }
            if r == cpus.len() as u64 {
                return Ok(w);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Pages written so far, all writers.
    fn pages(&self) -> u64 {
        self.counts.iter().map(|n| n.load(Relaxed)).sum()
    }

    /// Stops and joins the writers; the first error any of them met.
    fn finish(&mut self) -> Result<(), String> {
        self.stop.store(true, Relaxed);
        let mut first = Ok(());
        for t in self.threads.drain(..) {
            let r = t
                .join()
                .unwrap_or_else(|_| Err("zerofault bench-flush: a writer panicked".into()));
            first = first.and(r);
        }
        first
    }
}

impl Drop for Writers {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Runs `body` on a thread pinned to `cpu`, and returns what it returned.
fn on_cpu<T: Send>(cpu: usize, body: impl FnOnce() -> Result<T, String> + Send) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            pin_to_cpu(cpu).map_err(|e| format!("zerofault bench-flush: pinning to CPU {cpu}: {e}"))?;
            body()
        })
        .join()
        .unwrap_or_else(|_| Err("zerofault bench-flush: a thread panicked".into()))
    })
}

/// Moves the shuttle's page back and forth for `phase`: the moves made and the time taken.
fn shuttle_for(shuttle: &mut PmdShuttle, phase: Duration) -> Result<(u64, Duration), String> {
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < phase {
        for _ in 0..16 {
            shuttle.shuttle().map_err(|e| format!("zerofault bench-flush: {e}"))?;
        }
        n += 16;
    }
    Ok((n, t.elapsed()))
}

/// Runs the four phases, each `phase` long: `writers` writers pinned to the first CPUs the
/// process may use write alone; then while a thread on the next CPU spins in user space (the
/// control: a busy neighbour, no flush); then while a thread there moves the huge page back
/// and forth; then the writers stop and the mover runs alone.
pub(crate) fn measure(writers: usize, mib: usize, phase: Duration) -> Result<Flush, String> {
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        return Err("zerofault bench-flush: needs 2 CPUs or more (the flush goes to the other CPUs)".into());
    }
    if writers == 0 || writers >= cpus.len() {
        return Err(format!(
            "zerofault bench-flush: {writers} writers: 1 to {} here",
            cpus.len() - 1
        ));
    }
    let (writer_cpus, mover_cpu) = (cpus[..writers].to_vec(), cpus[writers]);
    let mut shuttle = PmdShuttle::new().map_err(|e| format!("zerofault bench-flush: {e}"))?;
    // Whole counting chunks (COUNT_EVERY pages, 16 MiB), at least one.
    let bytes = (mib << 20).next_multiple_of(COUNT_EVERY * PAGE_SIZE);
    let mut w = Writers::start(&writer_cpus, bytes)?;
    // Warm up: every writer running, its pages in the TLB's reach as they will be.
    std::thread::sleep(Duration::from_millis(100));
    let timed = |w: &Writers, during: &mut dyn FnMut() -> Result<(), String>| -> Result<(u64, Duration), String> {
        let (t0, c0) = (Instant::now(), w.pages());
        during()?;
        Ok((w.pages() - c0, t0.elapsed()))
    };
    let alone = timed(&w, &mut || {
        std::thread::sleep(phase);
        Ok(())
    })?;
    let spinning = timed(&w, &mut || {
        on_cpu(mover_cpu, || {
            let t = Instant::now();
            while t.elapsed() < phase {
                std::hint::spin_loop();
            }
            Ok(())
        })
    })?;
    let (mut moves_with_writers, mut took_with, mut shot) = (0, Duration::ZERO, None);
    let moving = timed(&w, &mut || {
        let before = shootdowns(&writer_cpus);
        (moves_with_writers, took_with) = on_cpu(mover_cpu, || shuttle_for(&mut shuttle, phase))?;
        shot = before.zip(shootdowns(&writer_cpus)).map(|(b, a)| a.saturating_sub(b));
        Ok(())
    })?;
    w.finish()?;
    drop(w);
    // The mover alone: no other CPU runs the process (but this thread, asleep in a join).
    let (moves_alone, took_alone) = on_cpu(mover_cpu, || shuttle_for(&mut shuttle, phase))?;
    let per_page = |(pages, wall): (u64, Duration)| wall.as_secs_f64() * 1e9 * writers as f64 / pages.max(1) as f64;
    let per_move = |took: Duration, n: u64| took.as_secs_f64() * 1e6 / n.max(1) as f64;
    Ok(Flush {
        writer_cpus,
        writer_mib: bytes >> 20,
        mover_cpu,
        phase,
        writer_ns_alone: per_page(alone),
        writer_ns_spinning: per_page(spinning),
        writer_ns_moving: per_page(moving),
        pages_moving: moving.0,
        moves_with_writers,
        move_us_with_writers: per_move(took_with, moves_with_writers),
        moves_alone,
        move_us_alone: per_move(took_alone, moves_alone),
        shootdowns: shot,
        stayed_huge: shuttle.is_huge().map_err(|e| format!("zerofault bench-flush: {e}"))?,
    })
}

impl Flush {
    pub(crate) fn writers(&self) -> usize {
        self.writer_cpus.len()
    }

    /// Microseconds each move took from each running writer: a writer's extra time per page
    /// while the mover moved, against the control (the mover's CPU spinning, no flush), times
    /// the pages each writer wrote meanwhile, over the moves.
    pub(crate) fn writer_us_per_move(&self) -> f64 {
        let pages_per_writer = self.pages_moving as f64 / self.writers() as f64;
        let lost_ns = (self.writer_ns_moving - self.writer_ns_spinning) * pages_per_writer;
        lost_ns / 1e3 / self.moves_with_writers.max(1) as f64
    }

    pub(crate) fn text(&self) -> String {
        let w = |n: usize| {
            if n == 1 {
                "1 writer".to_string()
            } else {
                format!("{n} writers")
            }
        };
        let list: Vec<String> = self.writer_cpus.iter().map(|c| c.to_string()).collect();
        let mut s = format!(
            "zerofault bench-flush: {} (CPU {}, {} MiB each), the mover on CPU {}, {:.2} s a phase; one huge page moved back and forth (UFFDIO_MOVE of a PMD)\n",
            w(self.writers()),
            list.join(","),
            self.writer_mib,
            self.mover_cpu,
            self.phase.as_secs_f64()
        );
        let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}x", a / b) } else { "-".into() };
        s += &format!(
            "  huge-page move, no other CPU running the process   {:>9.2} us   ({} moves)\n",
            self.move_us_alone, self.moves_alone
        );
        s += &format!(
            "  huge-page move, {:<34} {:>9.2} us   ({} moves; {} the time alone)\n",
            format!("{} running", w(self.writers())),
            self.move_us_with_writers,
            self.moves_with_writers,
            ratio(self.move_us_with_writers, self.move_us_alone)
        );
        s += &format!(
            "  writer, alone                                      {:>9.2} ns/page\n",
            self.writer_ns_alone
        );
        s += &format!(
            "  writer, while the mover's CPU spins (no moves)     {:>9.2} ns/page ({} the time alone)\n",
            self.writer_ns_spinning,
            ratio(self.writer_ns_spinning, self.writer_ns_alone)
        );
        s += &format!(
            "  writer, while the moves run                        {:>9.2} ns/page ({} the time alone)\n",
            self.writer_ns_moving,
            ratio(self.writer_ns_moving, self.writer_ns_alone)
        );
        match self.shootdowns {
            Some(n) => {
                s += &format!(
                    "  TLB shootdowns on the writers' CPUs meanwhile      {n:>9} ({:.2} a move per writer)\n",
                    n as f64 / self.moves_with_writers.max(1) as f64 / self.writers() as f64
                )
            }
            None => s += "  TLB shootdowns: no TLB line in /proc/interrupts here\n",
        }
        let us = self.writer_us_per_move();
        s += &format!(
            "  each move took from each running writer            {us:>9.2} us   ({:.1} ns per 4 KiB page moved; against the spinning control)\n",
            us * 1e3 / 512.0
        );
        if !self.stayed_huge {
            s += "  warning: the page was split along the way: the last moves were not of a huge page\n";
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Flush {
        Flush {
            writer_cpus: vec![0],
            writer_mib: 256,
            mover_cpu: 1,
            phase: Duration::from_secs(1),
            writer_ns_alone: 25.0,
            writer_ns_spinning: 26.0,
            writer_ns_moving: 50.0,
            pages_moving: 20_000_000,
            moves_with_writers: 40_000,
            move_us_with_writers: 20.0,
            moves_alone: 1_000_000,
            move_us_alone: 1.0,
            shootdowns: Some(40_000),
            stayed_huge: true,
        }
    }

    #[test]
    fn a_writer_twice_as_slow_loses_its_extra_time_spread_over_the_moves() {
        let f = sample();
        // 20 M pages, each 24 ns slower than with the neighbour spinning: 0.48 s lost over
        // 40,000 moves.
        assert!(
            (f.writer_us_per_move() - 12.0).abs() < 1e-9,
            "{}",
            f.writer_us_per_move()
        );
        let t = f.text();
        assert!(t.contains("20.00x the time alone"), "{t}");
        assert!(t.contains("1.00 a move per writer"), "{t}");
        assert!(t.contains("12.00 us"), "{t}");
        assert!(t.contains("26.00 ns/page (1.04x the time alone)"), "{t}");
        assert!(!t.contains("warning"), "{t}");
        let split = Flush {
            stayed_huge: false,
            shootdowns: None,
            ..sample()
        };
        assert!(split.text().contains("warning: the page was split"));
        assert!(split.text().contains("no TLB line"));
    }

    #[test]
    fn bad_arguments_name_the_flag_and_what_it_accepts() {
        let e = |a: &[&str]| {
            let args: Vec<String> = a.iter().map(|s| s.to_string()).collect();
            match crate::args::parse_flags::<FlushFlags>("bench-flush", &args) {
                Ok(f) => run_bench_flush(&f).unwrap_err(),
                Err(e) => e,
            }
        };
        assert!(e(&["--writers", "0"]).contains("--writers \"0\" is invalid: it accepts an integer 1.."));
        assert!(e(&["--writers", "100000"]).contains("--writers \"100000\" is invalid: it accepts an integer 1..="));
        assert!(e(&["--secs", "-1"]).contains("--secs \"-1\" is invalid: it accepts seconds per phase, 0.05 to 60"));
        assert!(e(&["--secs"]).contains("'--secs <F>'"));
        assert!(e(&["--bogus"]).contains("unexpected argument '--bogus'"));
        assert!(e(&["--mib", "1"]).contains("--mib \"1\" is invalid: it accepts an integer 2..=65536 (MiB per writer)"));
    }

    /// The real thing, briefly: every phase measured, moves made, the page still huge at the
    /// end. (What the moves cost is shown by the command, not asserted: it is the machine's.)
    #[test]
    fn every_phase_is_measured_and_the_page_moves_whole() {
        if allowed_cpus().len() < 2 {
            assert!(measure(1, 16, Duration::from_millis(50))
                .unwrap_err()
                .contains("needs 2 CPUs"));
            return;
        }
        if !zerofault::os::mman::thp_available() {
            let e = measure(1, 16, Duration::from_millis(50)).unwrap_err();
            assert!(e.contains("no huge page"), "{e}");
            return;
        }
        let f = match measure(1, 64, Duration::from_millis(200)) {
            Ok(f) => f,
            Err(e) if e.contains("userfaultfd") => {
                assert!(
                    std::env::var_os("ZEROFAULT_REQUIRE_UFFD").is_none(),
                    "userfaultfd is required: {e}"
                );
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert!(f.moves_with_writers > 0 && f.moves_alone > 0, "{f:?}");
        assert!(f.pages_moving > 0, "{f:?}");
        for ns in [f.writer_ns_alone, f.writer_ns_spinning, f.writer_ns_moving] {
            assert!(ns.is_finite() && ns > 0.0, "{f:?}");
        }
        assert!(f.stayed_huge, "{f:?}");
        assert!(f.text().contains("writer, while the moves run"));
    }
}
