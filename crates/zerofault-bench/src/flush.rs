//! `zerofault bench-flush`: what one huge-page move costs when other CPUs run the process.
//!
//! The engine installs a huge page with one `UFFDIO_MOVE` of a PMD, and the kernel then flushes
//! the pool's PMD from every CPU running a thread of the process: an interrupt each, which the
//! mover waits for. `bench-flush` measures the two sides in one run. Writer threads (one per
//! CPU but the last, each pinned, each writing one byte per 4 KiB page of its own populated
//! 256 MiB, over and over: pft's floor) run alone, then while a mover pinned to the last CPU
//! moves one huge page back and forth ([`zerofault::PmdShuttle`]); then the writers stop and
//! the mover runs alone. It prints the mover's time per move both ways, the writers' time per
//! page both ways, the TLB-shootdown interrupts their CPUs took (`/proc/interrupts`, x86), and
//! from those what each move costs each running writer. docs/SCALING.md's model uses these
//! terms for N cores; on a machine with more of them, `--writers N` measures how they grow.

use crate::sys::{allowed_cpus, pin_to_cpu, populate_write, Mapping, Thp};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerofault::page::PAGE_SIZE;
use zerofault::PmdShuttle;

/// Each writer's memory: far beyond the caches, populated 4 KiB pages (TLB misses, no faults).
const WRITER_BYTES: usize = 256 << 20;
/// Pages a writer writes between two updates of its count.
const COUNT_EVERY: usize = 4096;

/// What `bench-flush` measured.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Flush {
    /// The writers' CPUs, and the mover's.
    pub(crate) writer_cpus: Vec<usize>,
    pub(crate) mover_cpu: usize,
    pub(crate) phase: Duration,
    /// Nanoseconds per page written, over all writers, alone and while the mover ran.
    pub(crate) writer_ns_alone: f64,
    pub(crate) writer_ns_moving: f64,
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

/// `zerofault bench-flush [--writers N] [--secs F]`.
pub fn run_bench_flush(rest: &[String]) -> Result<(), String> {
    let cpus = allowed_cpus().len();
    let (mut writers, mut secs) = (cpus.saturating_sub(1).max(1), 1.0f64);
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .ok_or_else(|| format!("zerofault bench-flush: {a} needs {what}"))
                .cloned()
        };
        match a.as_str() {
            "--writers" => {
                let v = value("a number of writer threads")?;
                writers = v
                    .parse()
                    .ok()
                    .filter(|&n| (1..cpus.max(2)).contains(&n))
                    .ok_or_else(|| {
                        format!(
                            "zerofault bench-flush: --writers {v}: accepts 1 to {} (one CPU is the mover's)",
                            cpus.saturating_sub(1).max(1)
                        )
                    })?;
            }
            "--secs" => {
                let v = value("seconds per phase")?;
                secs = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && (0.05..=60.0).contains(s))
                    .ok_or_else(|| {
                        format!("zerofault bench-flush: --secs {v}: accepts 0.05 to 60 (seconds per phase)")
                    })?;
            }
            _ => {
                return Err(format!(
                    "zerofault bench-flush: unknown argument {a}; it takes --writers N and --secs F"
                ))
            }
        }
    }
    let f = measure(writers, Duration::from_secs_f64(secs))?;
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

/// Runs the three phases: `writers` writers pinned to the first CPUs the process may use, the
/// mover pinned to the next one, each phase `phase` long.
pub(crate) fn measure(writers: usize, phase: Duration) -> Result<Flush, String> {
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
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..writers).map(|_| AtomicU64::new(0)).collect());
    let mut threads = vec![];
    for (i, &cpu) in writer_cpus.iter().enumerate() {
        let m = Mapping::new(WRITER_BYTES, Thp::Never).map_err(|e| format!("zerofault bench-flush: mmap: {e}"))?;
        populate_write(m.as_ptr() as usize, WRITER_BYTES)
            .map_err(|e| format!("zerofault bench-flush: MADV_POPULATE_WRITE: {e}"))?;
        let (stop, counts) = (stop.clone(), counts.clone());
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            pin_to_cpu(cpu).map_err(|e| format!("zerofault bench-flush: pinning a writer to CPU {cpu}: {e}"))?;
            let p = m.as_ptr();
            let mut pass = 0u8;
            while !stop.load(Relaxed) {
                pass = pass.wrapping_add(1);
                for chunk in (0..WRITER_BYTES).step_by(COUNT_EVERY * PAGE_SIZE) {
                    for off in (chunk..(chunk + COUNT_EVERY * PAGE_SIZE).min(WRITER_BYTES)).step_by(PAGE_SIZE) {
                        // SAFETY: inside this thread's own populated mapping.
                        unsafe { p.add(off).write_volatile(pass) };
                    }
                    counts[i].fetch_add(COUNT_EVERY as u64, Relaxed);
                }
            }
            drop(m);
            Ok(())
        }));
    }
    let total = |c: &[AtomicU64]| c.iter().map(|n| n.load(Relaxed)).sum::<u64>();
    let finish = |threads: Vec<std::thread::JoinHandle<Result<(), String>>>, stop: &AtomicBool| {
        stop.store(true, Relaxed);
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("a writer panicked".into())))
            .collect::<Result<Vec<()>, String>>()
    };
    // Warm up: every writer running, its pages in the TLB's reach as they will be.
    std::thread::sleep(Duration::from_millis(100));
    let (t0, c0) = (Instant::now(), total(&counts));
    std::thread::sleep(phase);
    let (t1, c1) = (Instant::now(), total(&counts));
    // The mover, on its own CPU, with the writers running.
    let run_mover = |shuttle: &mut PmdShuttle, phase: Duration| -> Result<(u64, Duration), String> {
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < phase {
            for _ in 0..16 {
                shuttle.shuttle().map_err(|e| format!("zerofault bench-flush: {e}"))?;
            }
            n += 16;
        }
        Ok((n, t.elapsed()))
    };
    let moving = std::thread::scope(|s| {
        s.spawn(|| -> Result<_, String> {
            pin_to_cpu(mover_cpu)
                .map_err(|e| format!("zerofault bench-flush: pinning the mover to CPU {mover_cpu}: {e}"))?;
            let before = shootdowns(&writer_cpus);
            let (c2, t2) = (total(&counts), Instant::now());
            let (n, took) = run_mover(&mut shuttle, phase)?;
            let (c3, t3) = (total(&counts), Instant::now());
            let shot = before.zip(shootdowns(&writer_cpus)).map(|(b, a)| a.saturating_sub(b));
            Ok((n, took, c3 - c2, t3 - t2, shot))
        })
        .join()
        .unwrap_or_else(|_| Err("zerofault bench-flush: the mover panicked".into()))
    });
    let joined = finish(threads, &stop);
    let (moves_with_writers, took_with, pages_moving, wall_moving, shootdowns) = moving?;
    joined?;
    // The mover alone: no other CPU runs the process (but this thread, asleep in join).
    let (moves_alone, took_alone) = std::thread::scope(|s| {
        s.spawn(|| -> Result<_, String> {
            pin_to_cpu(mover_cpu).map_err(|e| format!("zerofault bench-flush: pinning the mover: {e}"))?;
            run_mover(&mut shuttle, phase)
        })
        .join()
        .unwrap_or_else(|_| Err("zerofault bench-flush: the mover panicked".into()))
    })?;
    let per_page = |wall: Duration, pages: u64| wall.as_secs_f64() * 1e9 * writers as f64 / pages.max(1) as f64;
    let per_move = |took: Duration, n: u64| took.as_secs_f64() * 1e6 / n.max(1) as f64;
    Ok(Flush {
        writer_cpus,
        mover_cpu,
        phase,
        writer_ns_alone: per_page(t1 - t0, c1 - c0),
        writer_ns_moving: per_page(wall_moving, pages_moving),
        moves_with_writers,
        move_us_with_writers: per_move(took_with, moves_with_writers),
        moves_alone,
        move_us_alone: per_move(took_alone, moves_alone),
        shootdowns,
        stayed_huge: shuttle.is_huge().map_err(|e| format!("zerofault bench-flush: {e}"))?,
    })
}

impl Flush {
    pub(crate) fn writers(&self) -> usize {
        self.writer_cpus.len()
    }

    /// Microseconds each move took from each running writer: the writers' extra time per page
    /// while the mover ran, times the pages they wrote then, over the moves and the writers.
    pub(crate) fn writer_us_per_move(&self) -> f64 {
        let pages_per_writer = self.phase.as_secs_f64() * 1e9 / self.writer_ns_moving.max(f64::MIN_POSITIVE);
        let lost_ns = (self.writer_ns_moving - self.writer_ns_alone) * pages_per_writer;
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
            "zerofault bench-flush: {} (CPU {}), the mover on CPU {}, {:.2} s a phase; one huge page moved back and forth (UFFDIO_MOVE of a PMD)\n",
            w(self.writers()),
            list.join(","),
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
            "  each move took from each running writer            {us:>9.2} us   ({:.1} ns per 4 KiB page moved)\n",
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
            mover_cpu: 1,
            phase: Duration::from_secs(1),
            writer_ns_alone: 25.0,
            writer_ns_moving: 50.0,
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
        // 1 s at 50 ns a page: 20 M pages, each 25 ns slower: 0.5 s lost over 40,000 moves.
        assert!(
            (f.writer_us_per_move() - 12.5).abs() < 1e-9,
            "{}",
            f.writer_us_per_move()
        );
        let t = f.text();
        assert!(t.contains("20.00x the time alone"), "{t}");
        assert!(t.contains("1.00 a move per writer"), "{t}");
        assert!(t.contains("12.50 us"), "{t}");
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
        let e = |a: &[&str]| run_bench_flush(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap_err();
        assert!(e(&["--writers", "0"]).contains("--writers 0: accepts 1 to"));
        assert!(e(&["--secs", "-1"]).contains("--secs -1: accepts 0.05 to 60"));
        assert!(e(&["--secs"]).contains("--secs needs seconds per phase"));
        assert!(e(&["--bogus"]).contains("unknown argument --bogus"));
    }

    /// The real thing, briefly: moves are made, the page stays huge, and on x86 the writer's
    /// CPU takes a TLB-shootdown interrupt for (nearly) every move while it runs.
    #[test]
    fn moves_made_while_a_writer_runs_interrupt_its_cpu() {
        if allowed_cpus().len() < 2 {
            assert!(measure(1, Duration::from_millis(50))
                .unwrap_err()
                .contains("needs 2 CPUs"));
            return;
        }
        let f = match measure(1, Duration::from_millis(200)) {
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
        assert!(f.writer_ns_alone > 0.0 && f.writer_ns_moving > 0.0, "{f:?}");
        assert!(f.stayed_huge, "{f:?}");
        if let Some(n) = f.shootdowns {
            // Each move flushes the writer's CPU while the writer runs there; the test
            // harness's other threads may take that CPU now and then (they are of this process
            // too, so the interrupt still comes), or leave it idle (then it does not).
            assert!(
                n * 2 >= f.moves_with_writers,
                "{n} shootdowns for {} moves: {f:?}",
                f.moves_with_writers
            );
        }
    }
}
