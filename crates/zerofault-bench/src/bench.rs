//! `zerofault bench`: pft, the seeds' page-fault benchmark, against everything the kernel
//! offers today.
//!
//! Each run maps fresh memory; each thread writes `--cachelines N` cache lines (the first N of
//! the page, one byte each) of every 4 KiB page of its contiguous share, in the order of
//! `--pattern` (sequential, a random permutation, or stride K); `--touch F` touches that
//! fraction of each share. Wall time runs from a start barrier to the last thread's end; user
//! and system time are getrusage deltas of the whole process over the same span, so the
//! engine's handler and scrub threads are counted. `flt/cpu/s` = pages / (user + system),
//! `fault/wsec` = pages / wall, as in pft. Rows are medians over the reps, with the wall's
//! min..max beside them.
//!
//! Every combination of `--threads` and `--cachelines` runs every mode; within a combination
//! the reps interleave the modes (native, engine, native, engine, ...) so drift of the machine
//! falls on every mode alike.
//!
//! Modes:
//! - `native`: plain anonymous memory, `MADV_NOHUGEPAGE` (4 KiB kernel faults).
//! - `thp`: plain anonymous memory, `MADV_HUGEPAGE` (2 MiB kernel faults where the kernel can).
//! - `populate`: `MADV_NOHUGEPAGE`, each thread `MADV_POPULATE_WRITE`s its whole share and then
//!   touches it, both timed (what MAP_POPULATE costs a program).
//! - `floor`: plain anonymous memory, `MADV_NOHUGEPAGE`, populated (`MADV_POPULATE_WRITE`)
//!   before the timed part: the same touch with no fault at all, the limit every other mode is
//!   measured against (with `--loop`, each thread's share is populated once and touched N times).
//! - `engine`: the engine with its pool filled to cover the run *before* the timed part; that
//!   fill's wall and CPU time are reported on their own, never hidden.
//! - `engine-cold`: the engine with the pool empty at the start; everything is counted.
//! - `engine:KNOB=VALUE[:KNOB=VALUE...]`, `engine-cold:...`: the same with knobs changed (on top
//!   of the `ZEROFAULT_*` environment), to switch one seed mechanism off and see what it brings:
//!   `engine:pool=off` (no prezeroing), `engine:start_order=0:max_order=0` (no anticipatory
//!   prefault).

use crate::args::{
    checked, gib_bytes, gib_in, has_blank_ends, int_in, int_list, invalid, positive_f64, List, GB_ACCEPTS,
};
use crate::progress::Progress;
use crate::sys::{online_cpus, pin_to_cpu, populate_write, process_cpu_time, Hogs, Mapping, Thp};
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use zerofault::page::PAGE_SIZE;
use zerofault::{Engine, NodePool, Options, Snapshot};

pub(crate) const CACHE_LINE: usize = 64;
pub(crate) const MAX_CACHELINES: usize = PAGE_SIZE / CACHE_LINE;

/// How a mode gets its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Base {
    Native,
    Thp,
    Populate,
    Engine,
    EngineCold,
    Floor,
}

impl Base {
    pub(crate) const ALL: [Base; 6] = [
        Base::Native,
        Base::Thp,
        Base::Populate,
        Base::Engine,
        Base::EngineCold,
        Base::Floor,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Base::Native => "native",
            Base::Thp => "thp",
            Base::Populate => "populate",
            Base::Engine => "engine",
            Base::EngineCold => "engine-cold",
            Base::Floor => "floor",
        }
    }

    /// One line on what the mode measures.
    pub(crate) fn about(self) -> &'static str {
        match self {
            Base::Native => "kernel 4 KiB faults (MADV_NOHUGEPAGE)",
            Base::Thp => "kernel huge-page faults (MADV_HUGEPAGE)",
            Base::Populate => "MADV_POPULATE_WRITE of each share, then the touch; both timed (4 KiB pages)",
            Base::Engine => "zerofault, pool filled before the timed part (fill shown apart)",
            Base::EngineCold => "zerofault, pool empty at the start; everything timed",
            Base::Floor => "memory mapped and populated before the timed part (4 KiB pages): the touch alone, no fault",
        }
    }

    fn is_engine(self) -> bool {
        matches!(self, Base::Engine | Base::EngineCold)
    }
}

/// A mode: a base and, for the engine, knobs to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mode {
    pub(crate) base: Base,
    pub(crate) knobs: Vec<(String, String)>,
}

impl Mode {
    pub(crate) fn plain(base: Base) -> Mode {
        Mode { base, knobs: vec![] }
    }

    /// `engine:max_order=3:pool=off` and so on.
    pub(crate) fn name(&self) -> String {
        let mut s = self.base.name().to_string();
        for (k, v) in &self.knobs {
            s += &format!(":{k}={v}");
        }
        s
    }

    pub(crate) fn is_native(&self) -> bool {
        self.base == Base::Native && self.knobs.is_empty()
    }

    /// Parses one mode of the `--mode` list (blanks around it are the list's, allowed after
    /// its commas); the error says what is wrong in one line.
    pub(crate) fn parse(s: &str) -> Result<Mode, String> {
        let accepts = format!("it accepts {MODE_ACCEPTS}");
        let mut parts = s.trim().split(':');
        let head = parts.next().unwrap_or_default();
        let base = Base::ALL
            .into_iter()
            .find(|b| b.name() == head)
            .ok_or_else(|| format!("--mode {s:?} is invalid: unknown mode {head:?}; {accepts}"))?;
        let mut knobs = vec![];
        for p in parts {
            if !base.is_engine() {
                return Err(format!(
                    "--mode {s:?} is invalid: only engine and engine-cold take knobs; {accepts}"
                ));
            }
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("--mode {s:?} is invalid: {p:?} is not KNOB=VALUE; {accepts}"))?;
            knobs.push((k.trim().to_string(), v.trim().to_string()));
        }
        let mode = Mode { base, knobs };
        mode.options(Options::default(), None)
            .map_err(|e| format!("--mode {s:?} is invalid: {e}"))?;
        Ok(mode)
    }

    /// `base` with this mode's knobs applied; `warm_pool` (bytes the run needs) raises
    /// pool_max to hold them, unless the mode sets pool_max itself.
    fn options(&self, mut o: Options, warm_pool: Option<usize>) -> Result<Options, String> {
        for (k, v) in &self.knobs {
            o.set(k, v).map_err(|e| e.to_string())?;
        }
        let sets = |name: &str| self.knobs.iter().any(|(k, _)| Options::canonical(k) == name);
        // `engine:max_order=3` means windows of at most 8 pages, from the first fault on:
        // a start order above it is lowered unless the mode sets one itself.
        if sets("max_order") && !sets("start_order") {
            o.start_order = o.start_order.min(o.max_order);
        }
        if let Some(need) = warm_pool {
            if !sets("pool_max") {
                o.pool_max = o.pool_max.max(need.next_multiple_of(2 << 20));
            }
        }
        o.validate().map_err(|e| e.to_string())?;
        Ok(o)
    }

    /// The `--mode` list: modes separated by commas (blanks allowed after them), each once.
    pub(crate) fn parse_list(s: &str) -> Result<Modes, String> {
        if has_blank_ends(s) {
            return Err(invalid("mode", s, MODE_ACCEPTS));
        }
        let modes = s.split(',').map(Mode::parse).collect::<Result<Vec<_>, _>>()?;
        for (i, m) in modes.iter().enumerate() {
            if modes[..i].contains(m) {
                return Err(format!("--mode {s:?} is invalid: {} is listed twice", m.name()));
            }
        }
        Ok(Modes(modes))
    }
}

/// What `--mode` accepts.
const MODE_ACCEPTS: &str = "a comma-separated list of native, thp, populate, engine, engine-cold, floor, \
                            and engine:KNOB=VALUE[:KNOB=VALUE...] or engine-cold:KNOB=VALUE...";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    Seq,
    Random,
    /// Every K-th page, then the pages after those, and so on: each page once.
    Stride(usize),
    /// As `Seq`, each page read (its first byte) before it is written: a checksum of a new
    /// buffer, `if (p[i] == 0)` on a fresh table.
    ReadWrite,
}

impl Pattern {
    pub(crate) fn name(self) -> String {
        match self {
            Pattern::Seq => "seq".into(),
            Pattern::Random => "random".into(),
            Pattern::Stride(k) => format!("stride:{k}"),
            Pattern::ReadWrite => "readwrite".into(),
        }
    }

    /// Each page is read before it is written.
    pub(crate) fn reads_first(self) -> bool {
        self == Pattern::ReadWrite
    }

    fn parse(s: &str) -> Option<Pattern> {
        match s {
            "seq" => Some(Pattern::Seq),
            "random" => Some(Pattern::Random),
            "readwrite" => Some(Pattern::ReadWrite),
            other => {
                let k = other.strip_prefix("stride:")?.parse::<usize>().ok()?;
                (1..=1 << 20).contains(&k).then_some(Pattern::Stride(k))
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Table,
    Json,
    Csv,
}

impl Format {
    fn parse(s: &str) -> Option<Format> {
        match s {
            "table" => Some(Format::Table),
            "json" => Some(Format::Json),
            "csv" => Some(Format::Csv),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BenchArgs {
    pub(crate) gb: f64,
    pub(crate) reps: u32,
    pub(crate) threads: Vec<usize>,
    pub(crate) cachelines: Vec<usize>,
    pub(crate) modes: Vec<Mode>,
    pub(crate) pattern: Pattern,
    pub(crate) touch: f64,
    /// `--loop N`: each thread allocates, touches and frees its share N times (seed 003).
    pub(crate) loops: u32,
    /// `--busy N`: N CPU hogs at normal priority, in processes of their own, for the whole run.
    pub(crate) busy: u32,
    /// `--procs N`: N bench processes at once, each timed run started together (procs.rs).
    pub(crate) procs: u32,
    pub(crate) format: Format,
    pub(crate) plot: Option<PathBuf>,
    pub(crate) pin: bool,
    pub(crate) quiet: bool,
}

impl Default for BenchArgs {
    fn default() -> BenchArgs {
        BenchArgs {
            gb: 1.0,
            reps: 3,
            threads: vec![1],
            cachelines: vec![1],
            modes: vec![Mode::plain(Base::Native), Mode::plain(Base::Engine)],
            pattern: Pattern::Seq,
            touch: 1.0,
            loops: 1,
            busy: 0,
            procs: 1,
            format: Format::Table,
            plot: None,
            pin: false,
            quiet: false,
        }
    }
}

/// The `--mode` list as one flag value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Modes(Vec<Mode>);

/// What `--cachelines` accepts.
const CACHELINES_ACCEPTS: &str = "a list of cache lines per page 1..=64: 1,8,64 or 1..4";
const _: () = assert!(MAX_CACHELINES == 64, "CACHELINES_ACCEPTS says 64");

/// `zerofault bench`'s flags, as clap reads them; [`BenchFlags::args`] checks the relations
/// between them.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = BENCH_EXAMPLES)]
pub struct BenchFlags {
    /// Memory each timed run maps and touches, in GiB.
    #[arg(long, allow_hyphen_values = true, value_name = "GIB", default_value = "1",
          value_parser = checked("gb", GB_ACCEPTS, gib_in(PAGE_SIZE)))]
    gb: f64,
    /// Timed runs per mode and combination; rows are their medians.
    #[arg(long, allow_hyphen_values = true, value_name = "N", default_value = "3",
          value_parser = checked("reps", "an integer 1..=1000", int_in(1, 1000)))]
    reps: u64,
    /// Thread counts to sweep: 1,2,4 or 1..4.
    #[arg(long, allow_hyphen_values = true, value_name = "LIST", default_value = "1",
          value_parser = checked("threads", "a list of thread counts 1..=1024: 1,2,4 or 1..4", int_list(1, 1024)))]
    threads: List,
    /// Cache lines written per 4 KiB page, to sweep: 1,8,64 or 1..4.
    #[arg(long, allow_hyphen_values = true, value_name = "LIST", default_value = "1",
          value_parser = checked("cachelines", CACHELINES_ACCEPTS, int_list(1, MAX_CACHELINES as u64)))]
    cachelines: List,
    /// Modes, comma-separated: native, thp, populate, engine, engine-cold, floor, and
    /// engine:KNOB=VALUE[:KNOB=VALUE...] or engine-cold:KNOB=VALUE... (one mechanism changed).
    #[arg(long, allow_hyphen_values = true, value_name = "LIST", default_value = "native,engine", value_parser = Mode::parse_list)]
    mode: Modes,
    /// Order of first touch: seq, random, readwrite (each page read, then written) or stride:K.
    #[arg(long, allow_hyphen_values = true, value_name = "PATTERN", default_value = "seq",
          value_parser = checked("pattern", "seq, random, readwrite or stride:K (K 1..=1048576)", Pattern::parse))]
    pattern: Pattern,
    /// Fraction of each thread's share touched, 0 < F <= 1.
    #[arg(long, allow_hyphen_values = true, value_name = "F", default_value = "1",
          value_parser = checked("touch", "a fraction 0 < F <= 1", |s: &str| positive_f64(s).filter(|f| *f <= 1.0)))]
    touch: f64,
    /// Allocate, touch and free N times per thread (seed 003's loop).
    #[arg(long = "loop", allow_hyphen_values = true, value_name = "N", default_value = "1",
          value_parser = checked("loop", "an integer 1..=1000", int_in(1, 1000)))]
    loops: u64,
    /// Pin each thread to a CPU of its own.
    #[arg(long)]
    pin: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// N CPU hogs at normal priority beside the whole run.
    #[arg(long, allow_hyphen_values = true, value_name = "N", default_value = "0",
          value_parser = checked("busy", "an integer 0..=1024 (CPU hogs)", int_in(0, 1024)))]
    busy: u64,
    /// N bench processes at once: each one's wall, and the slowest.
    #[arg(long, allow_hyphen_values = true, value_name = "N", default_value = "1",
          value_parser = checked("procs", "an integer 1..=64 (bench processes at once)", int_in(1, 64)))]
    procs: u64,
    /// Output: table, json or csv.
    #[arg(long, allow_hyphen_values = true, value_name = "FORMAT", default_value = "table",
          value_parser = checked("format", "table, json or csv", Format::parse))]
    format: Format,
    /// Also plot fault/wsec against threads to FILE (.svg or .png).
    #[arg(long, allow_hyphen_values = true, value_name = "FILE",
          value_parser = checked("plot", "a file name ending in .svg or .png", plot_path))]
    plot: Option<PathBuf>,
}

const BENCH_EXAMPLES: &str = "\
Examples:
  zerofault bench                                   1 GiB, native against engine, 3 reps
  zerofault bench --mode native,thp,engine,engine-cold --threads 1..2
  zerofault bench --pattern readwrite --loop 10     read, then write; map/touch/unmap 10 times
  zerofault bench --mode native,engine,engine:pool=off --busy 2 --format json";

/// `--plot FILE`: a path ending in .svg or .png.
fn plot_path(s: &str) -> Option<PathBuf> {
    let lower = s.to_ascii_lowercase();
    (lower.ends_with(".svg") || lower.ends_with(".png")).then(|| PathBuf::from(s))
}

impl BenchFlags {
    /// The run these flags ask for, once the relations between them hold.
    pub(crate) fn args(&self) -> Result<BenchArgs, String> {
        let a = BenchArgs {
            gb: self.gb,
            reps: self.reps as u32,
            threads: self.threads.0.clone(),
            cachelines: self.cachelines.0.clone(),
            modes: self.mode.0.clone(),
            pattern: self.pattern,
            touch: self.touch,
            loops: self.loops as u32,
            busy: self.busy as u32,
            procs: self.procs as u32,
            format: self.format,
            plot: self.plot.clone(),
            pin: self.pin,
            quiet: self.quiet,
        };
        a.check()?;
        Ok(a)
    }
}

/// `zerofault bench ARGS` (without the command's name) as [`BenchArgs`]; an error is one line.
#[cfg(test)]
pub(crate) fn parse(args: &[String]) -> Result<BenchArgs, String> {
    crate::args::parse_flags::<BenchFlags>("bench", args)?.args()
}

impl BenchArgs {
    pub(crate) fn bytes(&self) -> usize {
        gib_bytes(self.gb)
    }

    /// Relations between flags.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.procs > 1 && self.plot.is_some() {
            return Err("--plot does not go with --procs: it prints a table or JSON".into());
        }
        if self.procs > 1 && self.format == Format::Csv {
            return Err("--format csv does not go with --procs: it prints a table or JSON".into());
        }
        let most = self.threads.iter().copied().max().unwrap_or(1);
        if self.bytes() / PAGE_SIZE < most {
            return Err(format!(
                "--gb {} is too small for --threads {most}: each thread needs a page",
                self.gb
            ));
        }
        Ok(())
    }

    /// Timed runs in all: combinations x modes x reps.
    pub(crate) fn runs(&self) -> usize {
        self.threads.len() * self.cachelines.len() * self.modes.len() * self.reps as usize
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
    /// Each node's pool at the end (several NUMA nodes only).
    nodes: Vec<NodePool>,
}

/// Page indices each of `threads` threads touches, in order, prepared outside the timed part.
/// Thread t owns the t-th contiguous share of `pages`.
pub(crate) fn touch_lists(pattern: Pattern, touch: f64, threads: usize, pages: usize, rep: u32) -> Vec<Vec<u32>> {
    let share = pages / threads;
    (0..threads)
        .map(|t| {
            let first = (t * share) as u32;
            let n = ((share as f64 * touch).round() as usize).clamp(1, share);
            let mut idx: Vec<u32> = match pattern {
                Pattern::Seq | Pattern::Random | Pattern::ReadWrite => (first..first + share as u32).collect(),
                Pattern::Stride(k) => (0..k.min(share))
                    .flat_map(|off| (off..share).step_by(k))
                    .map(|i| first + i as u32)
                    .collect(),
            };
            if pattern == Pattern::Random {
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

/// What one touch thread does.
struct Job {
    list: Vec<u32>,
    /// `MADV_POPULATE_WRITE` this (address, length) first (the populate mode).
    populate: Option<(usize, usize)>,
    cpu: Option<usize>,
}

/// Runs the touch phase on `base` with one thread per job; returns (user, sys, wall) seconds.
fn timed_touch(base: usize, jobs: Vec<Job>, at: Point, pattern: Pattern) -> Result<(f64, f64, f64), String> {
    let (cachelines, read_first) = (at.cachelines, pattern.reads_first());
    let n = jobs.len();
    let barrier = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            let barrier = barrier.clone();
            std::thread::spawn(move || -> Result<Instant, String> {
                let pinned = job.cpu.map(pin_to_cpu).transpose();
                barrier.wait();
                pinned.map_err(|e| format!("--pin: sched_setaffinity: {e}"))?;
                if let Some((addr, len)) = job.populate {
                    populate_write(addr, len).map_err(|e| format!("MADV_POPULATE_WRITE: {e}"))?;
                }
                for &p in &job.list {
                    let page = base + p as usize * PAGE_SIZE;
                    if read_first {
                        // SAFETY: as the writes below.
                        std::hint::black_box(unsafe { (page as *const u8).read_volatile() });
                    }
                    for c in 0..cachelines {
                        // SAFETY: `base` is a live read-write mapping covering every listed
                        // page for the whole run (the caller keeps it mapped until the threads
                        // are joined); threads write disjoint pages; c * 64 < 4096.
                        unsafe { ((page + c * CACHE_LINE) as *mut u8).write_volatile(1) };
                    }
                }
                Ok(Instant::now())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(5)); // let every thread reach the barrier
    crate::procs::wait_for_go(); // --procs: every process's timed part starts together
    let (u0, s0) = process_cpu_time();
    let t0 = Instant::now();
    barrier.wait();
    let mut end = t0;
    let mut err = None;
    for h in handles {
        match h.join().expect("touch thread") {
            Ok(t) => end = end.max(t),
            Err(e) => err = Some(e),
        }
    }
    let (u1, s1) = process_cpu_time();
    match err {
        Some(e) => Err(e),
        None => Ok((
            (u1 - u0).as_secs_f64(),
            (s1 - s0).as_secs_f64(),
            (end - t0).as_secs_f64(),
        )),
    }
}

/// One point of the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Point {
    pub(crate) threads: usize,
    pub(crate) cachelines: usize,
}

fn run_rep(a: &BenchArgs, mode: &Mode, at: Point, rep: u32) -> Result<Rep, String> {
    if a.loops > 1 {
        return run_loop_rep(a, mode, at, rep);
    }
    let bytes = a.bytes();
    let pages_total = bytes / PAGE_SIZE;
    let lists = touch_lists(a.pattern, a.touch, at.threads, pages_total, rep);
    let pages: u64 = lists.iter().map(|l| l.len() as u64).sum();
    let ncpu = online_cpus();
    let jobs = |base: usize, populate: bool| -> Vec<Job> {
        let share = (pages_total / at.threads) * PAGE_SIZE;
        lists
            .iter()
            .enumerate()
            .map(|(t, l)| Job {
                list: l.clone(),
                populate: populate.then_some((base + t * share, share)),
                cpu: a.pin.then_some(t % ncpu),
            })
            .collect()
    };
    let plain = |thp: Thp, populate: bool| -> Result<Rep, String> {
        let m = Mapping::new(bytes, thp).map_err(|e| format!("mmap: {e}"))?;
        let base = m.as_ptr() as usize;
        if mode.base == Base::Floor {
            populate_write(base, bytes).map_err(|e| format!("MADV_POPULATE_WRITE: {e}"))?;
        }
        let (user, sys, wall) = timed_touch(base, jobs(base, populate), at, a.pattern)?;
        Ok(Rep {
            user,
            sys,
            wall,
            pages,
            fill: None,
            stats: None,
            nodes: Vec::new(),
        })
    };
    match mode.base {
        Base::Native => plain(Thp::Never, false),
        Base::Thp => plain(Thp::Always, false),
        Base::Populate => plain(Thp::Never, true),
        Base::Floor => plain(Thp::Never, false),
        Base::Engine | Base::EngineCold => {
            // Each page of the region is claimed once, so the region's size is all the run
            // can take from the pool, and a run that touches part of it (`--touch`) takes that
            // part and at most a window and a window ahead (34 MiB) more per thread; one more
            // 2 MiB chunk covers the rounding. What the run takes, no more: pool_max is a cap
            // (2G by default), not a target, and a pool filled far beyond what a sparse run
            // touches slowed the kernel's own faults after the hand-back (random 5%: 1.03-1.07x
            // native warm against 0.975x cold, 2026-11-24).
            let touched = (pages as usize * PAGE_SIZE).saturating_add(at.threads * (34 << 20));
            let (engine, fill) = start_engine(mode, touched.min(bytes) + (2 << 20))?;
            let region = engine.map(bytes).map_err(|e| format!("engine: {e}"))?;
            let before = engine.stats();
            let base = region.as_ptr() as usize;
            let (user, sys, wall) = timed_touch(base, jobs(base, false), at, a.pattern)?;
            let stats = engine.stats().since(&before);
            let nodes = engine.node_pools();
            drop(region);
            drop(engine);
            Ok(Rep {
                user,
                sys,
                wall,
                pages,
                fill,
                stats: Some(stats),
                nodes,
            })
        }
    }
}

/// The engine a mode runs, and for `engine` (warm) its pre-fill: (engine, fill wall and CPU
/// seconds). A run of `need` bytes takes most of them as huge pages and some as 4 KiB pages
/// (each fault's own PMD, a new stream's first windows: a sixteenth to a quarter, with
/// windows ahead or without); the fill spreads over the two rings by their shares (the small
/// ring is a quarter of the pool), so it is `need` and a third more: the huge ring alone holds
/// `need`, and the small ring a third of it.
fn start_engine(mode: &Mode, need: usize) -> Result<(Engine, Option<(f64, f64)>), String> {
    let warm = mode.base == Base::Engine;
    let need = (need + need / 3).next_multiple_of(2 << 20);
    let env = Options::from_env().map_err(|e| e.to_string())?;
    let opts = mode
        .options(env, warm.then_some(need))
        .map_err(|e| format!("--mode {}: {e}", mode.name()))?;
    let engine = Engine::new(opts).map_err(|e| format!("engine: {e}"))?;
    if !warm {
        return Ok((engine, None));
    }
    let (u0, s0) = process_cpu_time();
    let t0 = Instant::now();
    engine.prefill(need).map_err(|e| format!("pool fill: {e}"))?;
    let (u1, s1) = process_cpu_time();
    let fill = (t0.elapsed().as_secs_f64(), (u1 - u0 + s1 - s0).as_secs_f64());
    Ok((engine, Some(fill)))
}

/// `--loop N` (seed 003's benchmark): each thread allocates its share, touches it as in a plain
/// run and frees it, N times in a row. Natively the share is an mmap freed with munmap (THP
/// and populate advice as their modes say); under the engine it is a region whose pages are
/// recycled ([`zerofault::Region::recycle`]) before it is unmapped. Wall runs from the start
/// barrier to the last thread's end; user and system are the whole process's, read once the
/// scrub thread has zeroed every recycled page, so that its work is counted.
fn run_loop_rep(a: &BenchArgs, mode: &Mode, at: Point, rep: u32) -> Result<Rep, String> {
    let pages_total = a.bytes() / PAGE_SIZE;
    let share_pages = pages_total / at.threads;
    let share = share_pages * PAGE_SIZE;
    let lists = touch_lists(a.pattern, a.touch, at.threads, pages_total, rep);
    let pages: u64 = lists.iter().map(|l| l.len() as u64).sum::<u64>() * u64::from(a.loops);
    let ncpu = online_cpus();
    let (engine, fill) = match mode.base {
        Base::Engine | Base::EngineCold => {
            let (e, f) = start_engine(mode, share * at.threads + (2 << 20))?;
            (Some(e), f)
        }
        _ => (None, None),
    };
    // The floor's shares: mapped and populated once, before the timed part.
    let floor = if mode.base == Base::Floor {
        let m = Mapping::new(share * at.threads, Thp::Never).map_err(|e| format!("mmap: {e}"))?;
        populate_write(m.as_ptr() as usize, share * at.threads).map_err(|e| format!("MADV_POPULATE_WRITE: {e}"))?;
        Some(m)
    } else {
        None
    };
    let before = engine.as_ref().map(Engine::stats);
    let read_first = a.pattern.reads_first();
    let touch = |base: usize, t: usize, list: &[u32]| {
        let first = t * share_pages;
        for &p in list {
            let page = base + (p as usize - first) * PAGE_SIZE;
            if read_first {
                // SAFETY: as the writes below.
                std::hint::black_box(unsafe { (page as *const u8).read_volatile() });
            }
            for c in 0..at.cachelines {
                // SAFETY: `base` is this thread's live read-write share for this round; the
                // page index lies inside it; c * 64 < 4096.
                unsafe { ((page + c * CACHE_LINE) as *mut u8).write_volatile(1) };
            }
        }
    };
    let round = |t: usize, list: &[u32]| -> Result<(), String> {
        match (&engine, mode.base) {
            (Some(e), _) => {
                let mut r = e.map(share).map_err(|e| format!("engine: {e}"))?;
                touch(r.as_ptr() as usize, t, list);
                r.recycle(0, r.len()).map_err(|e| format!("recycle: {e}"))?;
            }
            (None, Base::Floor) => {
                let m = floor.as_ref().expect("the floor's mapping");
                touch(m.as_ptr() as usize + t * share, t, list);
            }
            (None, base) => {
                let thp = if base == Base::Thp { Thp::Always } else { Thp::Never };
                let m = Mapping::new(share, thp).map_err(|e| format!("mmap: {e}"))?;
                let addr = m.as_ptr() as usize;
                if base == Base::Populate {
                    populate_write(addr, share).map_err(|e| format!("MADV_POPULATE_WRITE: {e}"))?;
                }
                touch(addr, t, list);
                drop(m); // munmap
            }
        }
        Ok(())
    };
    let barrier = Barrier::new(at.threads + 1);
    let (u0, s0, t0, end) = std::thread::scope(|s| -> Result<_, String> {
        let handles: Vec<_> = lists
            .iter()
            .enumerate()
            .map(|(t, list)| {
                let (barrier, round) = (&barrier, &round);
                s.spawn(move || -> Result<Instant, String> {
                    if a.pin {
                        pin_to_cpu(t % ncpu).map_err(|e| format!("--pin: sched_setaffinity: {e}"))?;
                    }
                    barrier.wait();
                    for _ in 0..a.loops {
                        round(t, list)?;
                    }
                    Ok(Instant::now())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(5)); // let every thread reach the barrier
        crate::procs::wait_for_go(); // --procs: every process's timed part starts together
        let (u0, s0) = process_cpu_time();
        let t0 = Instant::now();
        barrier.wait();
        let mut end = t0;
        for h in handles {
            end = end.max(h.join().expect("loop thread")?);
        }
        Ok((u0, s0, t0, end))
    })?;
    let stats = engine.as_ref().map(|e| {
        // The scrub's work on the last round's pages counts too.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            let s = e.stats();
            if s.pages_scrubbed + s.pages_purged >= s.pages_recycled {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        e.stats().since(before.as_ref().expect("stats before"))
    });
    let (u1, s1) = process_cpu_time();
    let nodes = engine.as_ref().map(Engine::node_pools).unwrap_or_default();
    drop(engine);
    Ok(Rep {
        user: (u1 - u0).as_secs_f64(),
        sys: (s1 - s0).as_secs_f64(),
        wall: (end - t0).as_secs_f64(),
        pages,
        fill,
        stats,
        nodes,
    })
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The summary of one mode's reps at one point.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) mode: Mode,
    pub(crate) at: Point,
    pub(crate) user: f64,
    pub(crate) sys: f64,
    pub(crate) wall: f64,
    pub(crate) wall_min: f64,
    pub(crate) wall_max: f64,
    pub(crate) pages: u64,
    pub(crate) flt_per_cpu_s: f64,
    pub(crate) fault_per_wsec: f64,
    /// Median pool fill before the timed part, (wall, cpu) seconds: `engine` modes only.
    pub(crate) fill: Option<(f64, f64)>,
    /// The engine's counters during the last rep's timed part.
    pub(crate) stats: Option<Snapshot>,
    /// Each node's pool after the last rep (several NUMA nodes only).
    pub(crate) nodes: Vec<NodePool>,
}

impl Row {
    /// Min and max wall over the reps differ by more than 25%.
    pub(crate) fn spread_warning(&self) -> bool {
        self.wall_max > self.wall_min * 1.25
    }
}

fn summarize(mode: &Mode, at: Point, reps: &[Rep]) -> Row {
    let col = |f: &dyn Fn(&Rep) -> f64| median(reps.iter().map(f).collect());
    let walls: Vec<f64> = reps.iter().map(|r| r.wall).collect();
    Row {
        mode: mode.clone(),
        at,
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
        nodes: reps.last().map(|r| r.nodes.clone()).unwrap_or_default(),
    }
}

/// `MemAvailable` from /proc/meminfo, in bytes.
fn mem_available() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Checks that the runs fit in memory: a run holds its region, and `engine` also its
/// pre-filled pool, at once.
pub(crate) fn check_memory(a: &BenchArgs) -> Result<(), String> {
    let copies = if a.modes.iter().any(|m| m.base == Base::Engine) {
        2
    } else {
        1
    };
    let need = a.bytes() * copies * a.procs as usize;
    match mem_available() {
        Some(avail) if need > avail / 10 * 9 => Err(format!(
            "--gb {} is too large here: a run needs {:.1} GiB (its memory{}) and {:.1} GiB is available",
            a.gb,
            need as f64 / (1u64 << 30) as f64,
            if copies == 2 {
                " and the engine's pre-filled pool"
            } else {
                ""
            },
            avail as f64 / (1u64 << 30) as f64
        )),
        _ => Ok(()),
    }
}

/// Checks that the engine modes can run here.
pub(crate) fn preflight(modes: &[Mode]) -> Result<(), String> {
    if modes.iter().any(|m| m.base.is_engine()) {
        zerofault::probe().map_err(|e| {
            format!("zerofault bench: the engine modes need userfaultfd: {e} (native, thp and populate run without it)")
        })?;
    }
    Ok(())
}

/// Runs every point and mode; rows come out by threads, then cache lines, then mode.
pub(crate) fn run(a: &BenchArgs, progress: &Progress) -> Result<Vec<Row>, String> {
    preflight(&a.modes)?;
    check_memory(a)?;
    // Every mode and rep runs beside the same hogs; they end when `_hogs` drops.
    let _hogs = Hogs::start(a.busy).map_err(|e| format!("--busy: starting a CPU hog: {e}"))?;
    let mut rows = vec![];
    for &threads in &a.threads {
        for &cachelines in &a.cachelines {
            let at = Point { threads, cachelines };
            let mut reps: Vec<Vec<Rep>> = vec![vec![]; a.modes.len()];
            for r in 0..a.reps {
                for (i, mode) in a.modes.iter().enumerate() {
                    progress.label(format!(
                        "{} {} threads={threads} cachelines={cachelines} rep {}",
                        a.pattern.name(),
                        mode.name(),
                        r + 1
                    ));
                    reps[i].push(run_rep(a, mode, at, r)?);
                    progress.step();
                }
            }
            rows.extend(a.modes.iter().zip(&reps).map(|(m, r)| summarize(m, at, r)));
        }
    }
    Ok(rows)
}

/// The `native` row at the same point, for ratios.
pub(crate) fn native_at(rows: &[Row], at: Point) -> Option<&Row> {
    rows.iter().find(|r| r.at == at && r.mode.is_native())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::args;

    #[test]
    fn defaults_follow_the_issues() {
        let a = parse(&[]).unwrap();
        assert_eq!(a, BenchArgs::default());
        assert_eq!((a.gb, a.reps, a.touch), (1.0, 3, 1.0));
        assert_eq!((a.threads, a.cachelines), (vec![1], vec![1]));
        assert_eq!(a.modes.iter().map(Mode::name).collect::<Vec<_>>(), ["native", "engine"]);
        assert_eq!(
            (a.pattern, a.format, a.pin, a.quiet),
            (Pattern::Seq, Format::Table, false, false)
        );
    }

    #[test]
    fn sweeps_modes_and_variants_parse() {
        let a = parse(&args(
            "--threads 1..3,8 --cachelines 1,8,64 --mode native,thp,populate,engine,engine-cold,\
             engine:max_order=3,engine-cold:pool=off:start_order=0 --pattern stride:16 --format csv \
             --plot x.PNG --pin --quiet --reps 5 --gb 0.5 --touch 0.25 --busy 2",
        ))
        .unwrap();
        assert_eq!(a.threads, [1, 2, 3, 8]);
        assert_eq!(a.cachelines, [1, 8, 64]);
        let names: Vec<String> = a.modes.iter().map(Mode::name).collect();
        assert_eq!(
            names,
            [
                "native",
                "thp",
                "populate",
                "engine",
                "engine-cold",
                "engine:max_order=3",
                "engine-cold:pool=off:start_order=0"
            ]
        );
        assert_eq!(a.modes[6].base, Base::EngineCold);
        assert_eq!(a.pattern, Pattern::Stride(16));
        assert_eq!(parse(&args("--pattern readwrite")).unwrap().pattern, Pattern::ReadWrite);
        assert_eq!((a.format, a.pin, a.quiet, a.reps), (Format::Csv, true, true, 5));
        assert_eq!(a.plot, Some(PathBuf::from("x.PNG")));
        assert_eq!(a.runs(), 4 * 3 * 7 * 5);
        assert_eq!(a.busy, 2);
        assert_eq!(parse(&args("--procs 4 --format json")).unwrap().procs, 4);
        assert_eq!(parse(&[]).unwrap().busy, 0);
    }

    #[test]
    fn bad_flags_give_one_line_errors_naming_the_flag() {
        for (a, needle) in [
            ("--gb -1", "--gb"),
            ("--gb 0", "--gb"),
            ("--gb nan", "--gb"),
            ("--threads 0", "--threads"),
            ("--threads 1,0", "--threads"),
            ("--threads 3..1", "--threads"),
            ("--threads 1..2000", "--threads"),
            ("--cachelines 65", "--cachelines"),
            ("--cachelines 0", "--cachelines"),
            ("--reps x", "--reps"),
            ("--mode native,warp", "unknown mode \"warp\""),
            ("--mode native,native", "listed twice"),
            ("--mode engine:max_order", "not KNOB=VALUE"),
            ("--mode engine:max_order=99", "ZEROFAULT_MAX_ORDER"),
            ("--mode engine:warp=1", "unknown knob"),
            ("--mode engine:start_order=9:max_order=3", "ZEROFAULT_START_ORDER"),
            ("--mode native:pool=off", "only engine and engine-cold take knobs"),
            ("--pattern zigzag", "--pattern"),
            ("--pattern stride:0", "--pattern"),
            ("--touch 1.5", "--touch"),
            ("--loop 0", "--loop"),
            ("--loop 1001", "--loop"),
            ("--busy x", "--busy"),
            ("--busy 1025", "--busy"),
            ("--busy -1", "--busy"),
            ("--procs 0", "--procs"),
            ("--procs 65", "--procs"),
            ("--procs 2 --plot x.svg", "--plot does not go with --procs"),
            ("--procs 2 --format csv", "--format csv does not go with --procs"),
            ("--format xml", "--format"),
            ("--plot x.pdf", "--plot"),
            ("--pin=1", "for '--pin'"),
            ("--frobnicate", "--frobnicate"),
            ("--gb 0.000001 --threads 4", "--gb"),
            ("--gb 1e30", "at most 131072 (128 TiB)"),
            ("--gb 18446744073709551615", "at most 131072 (128 TiB)"),
            ("--gb 131073", "--gb"),
            ("--gb 1e-300", "at least one 4 KiB page"),
        ] {
            let e = parse(&args(a)).unwrap_err();
            assert!(e.contains(needle) && !e.contains('\n'), "{a}: {e}");
        }
    }

    #[test]
    fn blanks_around_a_value_are_refused() {
        for (flag, value) in [
            ("--gb", " 1"),
            ("--reps", "3 "),
            ("--threads", "1,2\t"),
            ("--cachelines", " 1..4"),
            ("--mode", " native"),
            ("--mode", "native,engine "),
            ("--pattern", "seq "),
            ("--touch", " 0.5"),
            ("--format", "csv "),
        ] {
            let e = parse(&[flag.to_string(), value.to_string()]).unwrap_err();
            assert!(
                e.starts_with(&format!("{flag} {value:?} is invalid: it accepts ")),
                "{e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
        // Inside a list, blanks after a comma are the list's.
        let a = parse(&[
            "--mode".into(),
            "native, engine".into(),
            "--threads".into(),
            "1, 2".into(),
        ])
        .unwrap();
        assert_eq!(a.modes.len(), 2);
        assert_eq!(a.threads, [1, 2]);
    }

    #[test]
    fn variant_knobs_apply_on_top_and_warm_pool_grows() {
        let m = Mode::parse("engine:max_order=3:pool=off").unwrap();
        let o = m.options(Options::default(), Some(4 << 30)).unwrap();
        assert_eq!((o.max_order, o.pool), (3, false));
        assert_eq!(o.pool_max, 4 << 30, "warm: pool_max covers the run");
        let o = m.options(Options::default(), Some(1 << 30)).unwrap();
        assert_eq!(o.pool_max, Options::default().pool_max, "and is never lowered");
        assert_eq!(o.start_order, 3, "start order follows a lower max order");
        let m = Mode::parse("engine:pool_max=64M").unwrap();
        let o = m.options(Options::default(), Some(1 << 30)).unwrap();
        assert_eq!(o.pool_max, 64 << 20, "an explicit pool_max wins");
    }

    #[test]
    fn touch_lists_cover_each_share_once() {
        for pattern in [Pattern::Seq, Pattern::Random, Pattern::Stride(7), Pattern::ReadWrite] {
            let pages = 1000;
            let lists = touch_lists(pattern, 0.5, 2, pages, 0);
            assert_eq!(lists.len(), 2);
            let share = pages / 2;
            for (t, l) in lists.iter().enumerate() {
                assert_eq!(l.len(), share / 2, "{pattern:?}");
                let mut s = l.clone();
                s.sort_unstable();
                s.dedup();
                assert_eq!(s.len(), l.len(), "no page twice");
                assert!(
                    l.iter().all(|&p| (p as usize) / share == t),
                    "inside the thread's share"
                );
            }
            let full = touch_lists(pattern, 1.0, 1, 100, 0);
            let mut s = full[0].clone();
            s.sort_unstable();
            assert_eq!(s, (0..100).collect::<Vec<u32>>(), "touch 1 covers every page");
            match pattern {
                Pattern::Seq | Pattern::ReadWrite => assert_eq!(full[0], s),
                Pattern::Random => assert_ne!(full[0], s, "shuffled"),
                Pattern::Stride(_) => assert_eq!(&full[0][..4], [0, 7, 14, 21]),
            }
        }
    }
}
