//! `zerofault bench`: pft, the seeds' page-fault benchmark, against the native kernel.
//!
//! Each rep maps fresh memory; each thread writes one byte per 4 KiB page of its contiguous
//! share (sequentially, or in a random order of its pages); `--touch F` touches that fraction
//! of each share. Wall time runs from a start barrier to the last thread's end; user and system
//! time are getrusage deltas of the whole process over the same span, so the engine's handler
//! and scrub threads are counted. `flt/cpu/s` = pages / (user + system), `fault/wsec` =
//! pages / wall, as in pft. Rows are medians over the reps.
//!
//! Modes:
//! - `native`: plain anonymous memory, `MADV_NOHUGEPAGE` (4 KiB kernel faults).
//! - `engine`: the engine with its pool filled to cover the run *before* the timed part; that
//!   fill's wall and CPU time are reported on their own line, never hidden.
//! - `engine-cold`: the engine with the pool empty at the start; everything is counted.

use crate::args::{gib_bytes, int_in, positive_f64, Spec};
use serde_json::{json, Value};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use zerofault::sys::mman::{Mapping, Thp, PAGE_SIZE};
use zerofault::sys::thread::process_cpu_time;
use zerofault::{Engine, Options, Snapshot};

pub const SPEC: Spec = Spec {
    command: "bench",
    flags: &[
        ("gb", true),
        ("reps", true),
        ("threads", true),
        ("mode", true),
        ("pattern", true),
        ("touch", true),
        ("format", true),
    ],
    positional: false,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Native,
    Engine,
    EngineCold,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Engine => "engine",
            Mode::EngineCold => "engine-cold",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        [Mode::Native, Mode::Engine, Mode::EngineCold]
            .into_iter()
            .find(|m| m.name() == s.trim())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    Seq,
    Random,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BenchArgs {
    pub gb: f64,
    pub reps: u32,
    pub threads: usize,
    pub modes: Vec<Mode>,
    pub pattern: Pattern,
    pub touch: f64,
    pub format: Format,
}

pub fn parse(args: &[String]) -> Result<BenchArgs, String> {
    let p = SPEC.parse(args)?;
    let modes = p.get(
        "mode",
        vec![Mode::Native, Mode::Engine],
        "a comma-separated list of native, engine, engine-cold",
        |s| {
            let m: Option<Vec<Mode>> = s.split(',').map(Mode::parse).collect();
            m.filter(|m| !m.is_empty())
        },
    )?;
    let a = BenchArgs {
        gb: p.get("gb", 1.0, "a positive size in GiB (e.g. 1 or 0.25)", positive_f64)?,
        reps: p.get("reps", 3, "an integer 1..=1000", int_in(1, 1000))? as u32,
        threads: p.get("threads", 1, "an integer 1..=1024", int_in(1, 1024))? as usize,
        modes,
        pattern: p.get("pattern", Pattern::Seq, "seq or random", |s| match s {
            "seq" => Some(Pattern::Seq),
            "random" => Some(Pattern::Random),
            _ => None,
        })?,
        touch: p.get("touch", 1.0, "a fraction 0 < F <= 1", |s| {
            positive_f64(s).filter(|f| *f <= 1.0)
        })?,
        format: p.get("format", Format::Table, "table or json", |s| match s {
            "table" => Some(Format::Table),
            "json" => Some(Format::Json),
            _ => None,
        })?,
    };
    if a.bytes() / PAGE_SIZE < a.threads {
        return Err(format!(
            "--gb {} is too small for --threads {}: each thread needs a page",
            a.gb, a.threads
        ));
    }
    Ok(a)
}

impl BenchArgs {
    fn bytes(&self) -> usize {
        gib_bytes(self.gb)
    }
}

/// One timed run.
#[derive(Clone, Debug)]
struct Rep {
    user: f64,
    sys: f64,
    wall: f64,
    pages: u64,
    /// Pool fill before the timed part: (wall, cpu) seconds.
    fill: Option<(f64, f64)>,
    stats: Option<Snapshot>,
}

/// Page indices each thread touches, in order, prepared outside the timed part.
fn touch_lists(a: &BenchArgs, pages: usize, rep: u32) -> Vec<Vec<u32>> {
    let share = pages / a.threads;
    (0..a.threads)
        .map(|t| {
            let first = t * share;
            let n = ((share as f64 * a.touch).round() as usize).clamp(1, share);
            let mut idx: Vec<u32> = (first as u32..(first + share) as u32).collect();
            if a.pattern == Pattern::Random {
                // The same order for every mode.
                shuffle(&mut idx, ((t as u64) << 32) ^ rep as u64);
            }
            idx.truncate(n);
            idx
        })
        .collect()
}

/// Fisher-Yates with a fixed-seed LCG: the same permutation for the same seed.
pub fn shuffle(v: &mut [u32], seed: u64) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    for i in (1..v.len()).rev() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        v.swap(i, ((x >> 33) % (i as u64 + 1)) as usize);
    }
}

/// Runs the touch phase on `base` with one thread per list; returns (user, sys, wall) seconds.
fn timed_touch(base: usize, lists: Vec<Vec<u32>>) -> (f64, f64, f64) {
    let n = lists.len();
    let barrier = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = lists
        .into_iter()
        .map(|list| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                for &p in &list {
                    // SAFETY: `base` is a live read-write mapping covering every listed page for
                    // the whole run (the caller keeps it mapped until the threads are joined);
                    // threads write disjoint pages.
                    unsafe { ((base + p as usize * PAGE_SIZE) as *mut u8).write_volatile(1) };
                }
                Instant::now()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(5)); // let every thread reach the barrier
    let (u0, s0) = process_cpu_time();
    let t0 = Instant::now();
    barrier.wait();
    let end = handles
        .into_iter()
        .map(|h| h.join().expect("touch thread"))
        .max()
        .expect("a thread");
    let (u1, s1) = process_cpu_time();
    (
        (u1 - u0).as_secs_f64(),
        (s1 - s0).as_secs_f64(),
        (end - t0).as_secs_f64(),
    )
}

fn engine_options(a: &BenchArgs, warm: bool) -> Result<Options, String> {
    let mut o = Options::from_env().map_err(|e| e.to_string())?;
    if warm {
        // Room for the whole run plus one max window per thread of overshoot.
        let need = a.bytes() + a.threads * (PAGE_SIZE << o.max_order);
        o.pool_max = o.pool_max.max(need.next_multiple_of(2 << 20));
    }
    Ok(o)
}

fn run_rep(a: &BenchArgs, mode: Mode, rep: u32) -> Result<Rep, String> {
    let bytes = a.bytes();
    let lists = touch_lists(a, bytes / PAGE_SIZE, rep);
    let pages: u64 = lists.iter().map(|l| l.len() as u64).sum();
    match mode {
        Mode::Native => {
            let m = Mapping::new(bytes, Thp::Never).map_err(|e| format!("mmap: {e}"))?;
            let (user, sys, wall) = timed_touch(m.as_ptr() as usize, lists);
            Ok(Rep {
                user,
                sys,
                wall,
                pages,
                fill: None,
                stats: None,
            })
        }
        Mode::Engine | Mode::EngineCold => {
            let warm = mode == Mode::Engine;
            let engine = Engine::new(engine_options(a, warm)?).map_err(|e| format!("engine: {e}"))?;
            let mut fill = None;
            if warm {
                let (u0, s0) = process_cpu_time();
                let t0 = Instant::now();
                engine
                    .prefill(engine.options().pool_max)
                    .map_err(|e| format!("pool fill: {e}"))?;
                let (u1, s1) = process_cpu_time();
                fill = Some((t0.elapsed().as_secs_f64(), (u1 - u0 + s1 - s0).as_secs_f64()));
            }
            let region = engine.map(bytes).map_err(|e| format!("engine: {e}"))?;
            let before = engine.stats();
            let (user, sys, wall) = timed_touch(region.as_ptr() as usize, lists);
            let stats = engine.stats().since(&before);
            drop(region);
            drop(engine);
            Ok(Rep {
                user,
                sys,
                wall,
                pages,
                fill,
                stats: Some(stats),
            })
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The summary of one mode's reps.
#[derive(Clone, Debug)]
pub struct Row {
    pub mode: Mode,
    pub user: f64,
    pub sys: f64,
    pub wall: f64,
    pub wall_min: f64,
    pub wall_max: f64,
    pub pages: u64,
    pub flt_per_cpu_s: f64,
    pub fault_per_wsec: f64,
    pub fill: Option<(f64, f64)>,
    pub stats: Option<Snapshot>,
}

fn summarize(mode: Mode, reps: &[Rep]) -> Row {
    let col = |f: &dyn Fn(&Rep) -> f64| median(reps.iter().map(f).collect());
    let walls: Vec<f64> = reps.iter().map(|r| r.wall).collect();
    Row {
        mode,
        user: col(&|r| r.user),
        sys: col(&|r| r.sys),
        wall: col(&|r| r.wall),
        wall_min: walls.iter().cloned().fold(f64::INFINITY, f64::min),
        wall_max: walls.iter().cloned().fold(0.0, f64::max),
        pages: reps[0].pages,
        flt_per_cpu_s: col(&|r| r.pages as f64 / (r.user + r.sys).max(1e-9)),
        fault_per_wsec: col(&|r| r.pages as f64 / r.wall.max(1e-9)),
        fill: reps[0].fill.map(|_| {
            (
                median(reps.iter().filter_map(|r| r.fill.map(|f| f.0)).collect()),
                median(reps.iter().filter_map(|r| r.fill.map(|f| f.1)).collect()),
            )
        }),
        stats: reps.last().and_then(|r| r.stats.clone()),
    }
}

pub fn run(a: &BenchArgs) -> Result<Vec<Row>, String> {
    if a.modes.iter().any(|m| *m != Mode::Native) {
        zerofault::probe().map_err(|e| {
            format!("zerofault bench: the engine modes need userfaultfd: {e} (--mode native runs without it)")
        })?;
    }
    // Reps interleave the modes (native, engine, native, engine, ...) so that drift of the
    // machine over the run falls on every mode alike.
    let mut reps: Vec<Vec<Rep>> = vec![vec![]; a.modes.len()];
    for r in 0..a.reps {
        for (i, &mode) in a.modes.iter().enumerate() {
            reps[i].push(run_rep(a, mode, r)?);
        }
    }
    Ok(a.modes.iter().zip(&reps).map(|(m, r)| summarize(*m, r)).collect())
}

fn gb_text(gb: f64) -> String {
    if gb.fract() == 0.0 {
        format!("{gb:.0}")
    } else {
        format!("{gb}")
    }
}

/// pft's table: its columns in its order, then the mode.
pub fn table(a: &BenchArgs, rows: &[Row]) -> String {
    let mut s = String::from(" Gb Rep Threads   User      System     Wall flt/cpu/s fault/wsec mode\n");
    for r in rows {
        s += &format!(
            "{:>3} {:>3} {:>4}  {:>8.3}s {:>10.3}s {:>7.3}s {:>9.1} {:>10.1} {}\n",
            gb_text(a.gb),
            a.reps,
            a.threads,
            r.user,
            r.sys,
            r.wall,
            r.flt_per_cpu_s,
            r.fault_per_wsec,
            r.mode.name()
        );
    }
    let native = rows.iter().find(|r| r.mode == Mode::Native);
    for r in rows {
        if let (Some(n), true) = (native, r.mode != Mode::Native) {
            s += &format!(
                "{}: fault/wsec {:.2}x native, wall {:.2}x native\n",
                r.mode.name(),
                r.fault_per_wsec / n.fault_per_wsec,
                r.wall / n.wall
            );
        }
        if let Some((w, c)) = r.fill {
            s += &format!(
                "{}: pool filled before the timed part (not in the row): wall {w:.3}s, cpu {c:.3}s\n",
                r.mode.name()
            );
        }
        if r.wall_max > r.wall_min * 1.25 {
            s += &format!(
                "{}: warning: wall varied {:.3}s..{:.3}s over the reps (more than 25%)\n",
                r.mode.name(),
                r.wall_min,
                r.wall_max
            );
        }
    }
    s
}

pub fn json(a: &BenchArgs, rows: &[Row]) -> Value {
    let pattern = match a.pattern {
        Pattern::Seq => "seq",
        Pattern::Random => "random",
    };
    Value::Array(
        rows.iter()
            .map(|r| {
                let mut o = json!({
                    "mode": r.mode.name(),
                    "gb": a.gb,
                    "reps": a.reps,
                    "threads": a.threads,
                    "pattern": pattern,
                    "touch": a.touch,
                    "user_s": r.user,
                    "sys_s": r.sys,
                    "wall_s": r.wall,
                    "wall_s_min": r.wall_min,
                    "wall_s_max": r.wall_max,
                    "pages": r.pages,
                    "flt_per_cpu_s": r.flt_per_cpu_s,
                    "fault_per_wsec": r.fault_per_wsec,
                });
                if let Some((w, c)) = r.fill {
                    o["pool_fill_wall_s"] = json!(w);
                    o["pool_fill_cpu_s"] = json!(c);
                }
                if let Some(st) = &r.stats {
                    o["engine_stats"] = serde_json::from_str(&st.to_json()).expect("stats JSON");
                }
                o
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn defaults_follow_the_issue() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.gb, 1.0);
        assert_eq!((a.reps, a.threads, a.touch), (3, 1, 1.0));
        assert_eq!(a.modes, vec![Mode::Native, Mode::Engine]);
        assert_eq!((a.pattern, a.format), (Pattern::Seq, Format::Table));
    }

    #[test]
    fn bad_flags_give_one_line_errors_naming_the_flag() {
        for (a, needle) in [
            ("--gb -1", "--gb"),
            ("--gb 0", "--gb"),
            ("--threads 0", "--threads"),
            ("--reps x", "--reps"),
            ("--mode native,warp", "--mode"),
            ("--pattern zigzag", "--pattern"),
            ("--touch 1.5", "--touch"),
            ("--format xml", "--format"),
            ("--frobnicate", "--frobnicate"),
        ] {
            let e = parse(&args(a)).unwrap_err();
            assert!(e.contains(needle) && !e.contains('\n'), "{a}: {e}");
        }
    }

    #[test]
    fn touch_lists_cover_each_share_once() {
        let a = parse(&args("--gb 0.001 --threads 2 --pattern random --touch 0.5")).unwrap();
        let pages = a.bytes() / PAGE_SIZE;
        let lists = touch_lists(&a, pages, 0);
        assert_eq!(lists.len(), 2);
        let share = pages / 2;
        for (t, l) in lists.iter().enumerate() {
            assert_eq!(l.len(), (share as f64 * 0.5).round() as usize);
            let mut s = l.clone();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), l.len(), "no page twice");
            assert!(
                l.iter().all(|&p| (p as usize) / share == t),
                "inside the thread's share"
            );
        }
        assert_ne!(lists[0], (0..lists[0].len() as u32).collect::<Vec<_>>(), "shuffled");
    }

    #[test]
    fn table_has_pft_columns_then_mode_and_ratios() {
        let a = parse(&args("--reps 3")).unwrap();
        let row = |mode, wall: f64| Row {
            mode,
            user: 0.1,
            sys: 0.2,
            wall,
            wall_min: wall,
            wall_max: wall,
            pages: 1000,
            flt_per_cpu_s: 1000.0 / 0.3,
            fault_per_wsec: 1000.0 / wall,
            fill: None,
            stats: None,
        };
        let t = table(&a, &[row(Mode::Native, 1.0), row(Mode::Engine, 0.1)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "Gb",
                "Rep",
                "Threads",
                "User",
                "System",
                "Wall",
                "flt/cpu/s",
                "fault/wsec",
                "mode"
            ]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["1", "3", "1", "0.100s", "0.200s", "1.000s", "3333.3", "1000.0", "native"]
        );
        assert!(t.contains("engine: fault/wsec 10.00x native"), "{t}");
        let j = json(&a, &[row(Mode::Engine, 0.5)]);
        for k in [
            "mode",
            "gb",
            "reps",
            "threads",
            "pattern",
            "touch",
            "user_s",
            "sys_s",
            "wall_s",
            "pages",
            "flt_per_cpu_s",
            "fault_per_wsec",
        ] {
            assert!(j[0].get(k).is_some(), "{k}");
        }
        assert_eq!(j[0]["mode"], "engine");
        assert_eq!(j[0]["fault_per_wsec"], 2000.0);
    }
}
