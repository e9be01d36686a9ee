//! `zerofault report`: the headline suite in one command. Sequential first touch over threads
//! 1..ncpu and cache lines 1..64, random first touch (dense and sparse), and the seed
//! mechanisms switched off one at a time, seed 003's allocate-touch-free loop; every kernel
//! baseline beside the engine; a busy machine (beside two CPU hogs, then 2 and 4 processes at
//! once); then the zeroing methods' table (`bench-zero`). Writes
//! DIR/BENCHMARKS.md (tables, ratios to native, plots), the plots as PNG, and every row as
//! DIR/benchmarks.json.

use crate::args::{checked, gib_bytes, gib_in, int_in, GB_ACCEPTS};
use crate::bench::{self, Base, BenchArgs, Format, Mode, Pattern, Row};
use crate::machine::Machine;
use crate::output::{distinct, gb_text, modes, ratio, ratio_grid};
use crate::progress::Progress;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use zerofault::page::PAGE_SIZE;

/// `zerofault report`'s flags.
#[derive(clap::Args, Clone, Debug, PartialEq)]
#[command(
    after_help = "Examples:\n  zerofault report --out docs            the committed report\n  zerofault report --gb 0.25 --reps 1    a quick one"
)]
pub struct ReportFlags {
    /// Directory to write BENCHMARKS.md, its plots and benchmarks.json into.
    #[arg(long, allow_hyphen_values = true, value_name = "DIR", default_value = "zerofault-report",
          value_parser = checked("out", "a directory", |s: &str| (!s.trim().is_empty()).then(|| PathBuf::from(s))))]
    pub(crate) out: PathBuf,
    /// Memory each timed run maps and touches, in GiB.
    #[arg(long, allow_hyphen_values = true, value_name = "GIB", default_value = "1", value_parser = checked("gb", GB_ACCEPTS, gib_in(PAGE_SIZE)))]
    pub(crate) gb: f64,
    /// Timed runs per mode and combination.
    #[arg(long, allow_hyphen_values = true, value_name = "N", default_value = "3",
          value_parser = checked("reps", "an integer 1..=1000", |s: &str| int_in(1, 1000)(s).map(|n| n as u32)))]
    pub(crate) reps: u32,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
}

/// `zerofault report ARGS` (without the command's name); an error is one line.
#[cfg(test)]
pub(crate) fn parse(args: &[String]) -> Result<ReportFlags, String> {
    crate::args::parse_flags("report", args)
}

/// One section of the report.
pub(crate) struct Suite {
    /// File stem of its plot.
    pub(crate) id: &'static str,
    pub(crate) title: &'static str,
    pub(crate) about: &'static str,
    pub(crate) args: BenchArgs,
}

/// Every mode, sequential first touch by threads 1..=cpus, one cache line a page.
fn base_args(r: &ReportFlags, cpus: usize) -> BenchArgs {
    BenchArgs {
        gb: r.gb,
        reps: r.reps,
        threads: (1..=cpus).collect(),
        cachelines: vec![1],
        modes: Base::ALL.into_iter().map(Mode::plain).collect(),
        pattern: Pattern::Seq,
        touch: 1.0,
        loops: 1,
        busy: 0,
        procs: 1,
        format: Format::Table,
        plot: None,
        pin: false,
        quiet: r.quiet,
    }
}

pub(crate) fn suites(r: &ReportFlags, cpus: usize) -> Vec<Suite> {
    let base = base_args(r, cpus);
    let variant = |s: &str| Mode::parse(s).expect("report modes parse");
    vec![
        Suite {
            id: "seq",
            title: "Sequential first touch: threads and cache lines",
            about: "Each thread writes its share of fresh memory page by page, the first N cache \
                    lines of each page (seed 000's threads table crossed with seed 003's \
                    cache-line table). The more of each page the program writes itself, the \
                    less it matters who zeroed it.",
            args: BenchArgs {
                cachelines: vec![1, 2, 4, 8, 16, 32, 64],
                ..base.clone()
            },
        },
        Suite {
            id: "random",
            title: "Random first touch, every page",
            about: "Each thread writes every page of its share once, in a random order. The \
                    engine's predictor sees no sequence, hands the region back to the kernel \
                    after a run of misses, and the kernel serves the rest.",
            args: BenchArgs {
                pattern: Pattern::Random,
                ..base.clone()
            },
        },
        Suite {
            id: "random-sparse",
            title: "Random first touch, 5% of the pages",
            about: "Sparse random access: a few faults scattered over a large mapping. The \
                    engine should cost nothing here (hand-back), and populate pays for pages \
                    nobody touches.",
            args: BenchArgs {
                pattern: Pattern::Random,
                touch: 0.05,
                ..base.clone()
            },
        },
        Suite {
            id: "mechanisms",
            title: "The seed mechanisms, one at a time",
            about: "The engine with one mechanism switched off: `pool=off` installs zero-filled \
                    copies on the faulting path (no prezeroing, seeds 002/003); \
                    `start_order=0:max_order=0` serves one page per fault (no anticipatory \
                    prefault, seed 000); `start_order=0:order_step=1:max_order=3` is seed 000's \
                    own setting (1, 2, 4, 8 pages); `ahead=off` installs no window ahead (each \
                    fault at most 8 MiB); `pool_thp=off` moves 4 KiB pages only (no huge pages \
                    for the whole PMDs of a window), warm and cold.",
            args: BenchArgs {
                modes: vec![
                    Mode::plain(Base::Native),
                    Mode::plain(Base::Engine),
                    variant("engine:pool=off"),
                    variant("engine:start_order=0:max_order=0"),
                    variant("engine:start_order=0:order_step=1:max_order=3"),
                    variant("engine:ahead=off"),
                    variant("engine:pool_thp=off"),
                    Mode::plain(Base::EngineCold),
                    variant("engine-cold:pool_thp=off"),
                    Mode::plain(Base::Floor),
                ],
                ..base.clone()
            },
        },
        Suite {
            id: "loop",
            title: "Allocate, touch, free, ten times (seed 003's benchmark)",
            about: "Each thread allocates its share, touches every page and frees it, ten times in a row. \
                    Natively each round is a fresh mmap freed with munmap; the engine recycles each round's \
                    pages (moved into the pool, zeroed by the scrub thread, moved back to the next round), \
                    and `engine:recycle=off` gives them back to the kernel as before recycling existed. User \
                    and system include the scrub thread's zeroing of the last round.",
            args: BenchArgs {
                loops: 10,
                modes: vec![
                    Mode::plain(Base::Native),
                    Mode::plain(Base::Thp),
                    Mode::plain(Base::Engine),
                    Mode::plain(Base::EngineCold),
                    variant("engine-cold:recycle=off"),
                    Mode::plain(Base::Floor),
                ],
                ..base.clone()
            },
        },
        Suite {
            id: "readwrite",
            title: "Read, then write, each page",
            about: "One thread reads each page of its share, then writes it, as a checksum of a \
                    new buffer or a test of a fresh table does. Natively the read maps the zero \
                    page and the write is a copy-on-write fault. The engine's first read window \
                    maps the zero page too; once its sample pages show the writes, read windows \
                    take pool pages as write windows do (docs/DESIGN.md, \"Reads before \
                    writes\").",
            args: BenchArgs {
                threads: vec![1],
                pattern: Pattern::ReadWrite,
                modes: busy_modes(),
                ..base.clone()
            },
        },
        Suite {
            id: "busy",
            title: "Busy machine: two CPU hogs",
            about: "One thread's first touch while two CPU hogs (processes of their own, at \
                    normal priority) keep both CPUs busy, as on a loaded server or a build \
                    machine. The engine's scrub works only while it finds a CPU to itself, and \
                    its handler asks for the shortest slice; the hogs run for the whole sweep.",
            args: BenchArgs {
                threads: vec![1],
                busy: 2,
                modes: busy_modes(),
                ..base
            },
        },
    ]
}

/// The modes of the busy-machine sections.
fn busy_modes() -> Vec<Mode> {
    [Base::Native, Base::Thp, Base::Engine, Base::EngineCold]
        .into_iter()
        .map(Mode::plain)
        .collect()
}

/// Processes at once in the "several processes" section.
pub(crate) const PROCS: [u32; 2] = [2, 4];

/// The sweep each process of the "several processes" section runs: one thread's first touch,
/// `n` such processes at once.
pub(crate) fn procs_args(r: &ReportFlags, n: u32) -> BenchArgs {
    BenchArgs {
        procs: n,
        modes: busy_modes(),
        ..base_args(r, 1)
    }
}

/// The "several processes" section's title and what it shows.
const PROCS_TITLE: &str = "Busy machine: several processes at once";
const PROCS_ABOUT: &str = "The same first touch in 2 and then 4 processes at once, each timed run of \
    every process started together (`bench --procs`): under the shim, each process has its own \
    engine, and they share the CPUs (and a machine-wide state) as a build farm's or a server's \
    processes do. What a user waits for is the slowest process.";

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
pub(crate) fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn today() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (y, m, d) = civil((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// fault/wsec over native: one row per point, one column per mode.
pub(crate) fn ratio_markdown(rows: &[Row]) -> String {
    let (others, grid) = ratio_grid(rows);
    let mut s = String::from("| threads | cache lines |");
    for m in &others {
        s += &format!(" `{m}` |");
    }
    s += "\n|---:|---:|";
    s += &"---:|".repeat(others.len());
    s += "\n";
    for (at, cells) in grid {
        s += &format!("| {} | {} |", at.threads, at.cachelines);
        for cell in cells {
            s += &format!(" {cell} |");
        }
        s += "\n";
    }
    s
}

/// Every row: pft's columns, the wall's min..max, the ratio and the pool fill.
pub(crate) fn rows_markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| threads | cache lines | mode | user s | system s | wall s | wall min..max | flt/cpu/s | fault/wsec | x native | pool fill (wall s, apart) |\n\
         |---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | `{}` | {:.3} | {:.3} | {:.3} | {:.3}..{:.3}{} | {:.0} | {:.0} | {} | {} |\n",
            r.at.threads,
            r.at.cachelines,
            r.mode.name(),
            r.user,
            r.sys,
            r.wall,
            r.wall_min,
            r.wall_max,
            if r.spread_warning() { " (!)" } else { "" },
            r.flt_per_cpu_s,
            r.fault_per_wsec,
            ratio(rows, r).map_or("-".into(), |x| format!("{x:.2}x")),
            r.fill.map_or("-".into(), |f| format!("{:.3}", f.0)),
        );
    }
    s
}

/// `mode` over native at `at`, as text.
fn headline(rows: &[Row], mode: &str, threads: usize) -> String {
    rows.iter()
        .find(|r| r.mode.name() == mode && r.at.threads == threads && r.at.cachelines == 1)
        .and_then(|r| ratio(rows, r))
        .map_or("-".into(), |x| format!("{x:.2}x"))
}

/// The zeroing section's title and what it shows.
const ZEROING_TITLE: &str = "Zeroing methods";
fn zeroing_about(cold_bytes: usize) -> String {
    format!(
        "How fast each of the scrub's zeroing methods (`ZEROFAULT_ZERO_METHOD`) zeroes memory here, in \
         4 KiB and 2 MiB calls (one fence per call for the non-temporal methods), on cold memory ({} MiB, \
         the report's size up to 1 GiB; the median of 3 passes) and cached memory (16 MiB written just \
         before), each result checked to read zero. Seed 003's rule: cold memory wants stores that \
         bypass the caches, cached memory temporal ones. `auto` measures the methods on the scrub's \
         first cold batches and keeps the fastest.",
        cold_bytes >> 20
    )
}

/// The "several processes" section's results: per number of processes, its sweep and rows.
pub(crate) type ProcsDone = Vec<(BenchArgs, Vec<crate::procs::Row>)>;

/// The "several processes" section: a table per number of processes.
fn procs_markdown(number: usize, procs: &ProcsDone) -> String {
    let mut s = format!("## {number}. {PROCS_TITLE}\n\n{PROCS_ABOUT}\n\n");
    for (a, rows) in procs {
        s += &format!(
            "`zerofault bench {} --procs {}`\n\n",
            crate::procs::flags(a).join(" "),
            a.procs
        );
        s += "| mode |";
        for i in 1..=a.procs {
            s += &format!(" process {i} wall s |");
        }
        s += " slowest s | slowest, native's over it |\n|---|";
        s += &"---:|".repeat(a.procs as usize + 2);
        s += "\n";
        for r in rows {
            s += &format!("| `{}` |", r.mode);
            for w in &r.walls {
                s += &format!(" {w:.3} |");
            }
            s += &format!(
                " {:.3} | {} |\n",
                r.slowest(),
                crate::procs::ratio(rows, r).map_or("-".into(), |x| format!("{x:.2}x"))
            );
        }
        s += "\n";
    }
    s
}

pub(crate) fn markdown(
    r: &ReportFlags,
    m: &Machine,
    done: &[(Suite, Vec<Row>)],
    procs: &ProcsDone,
    zero: &crate::zeroing::Table,
    took: f64,
) -> String {
    let mut s = String::from("# zerofault benchmarks\n\n");
    s += &format!(
        "Made by `zerofault report` on {} in {:.0} s. Make your own with `cargo run --release -- report --out DIR`.\n\n",
        today(),
        took
    );
    s += &format!("**Machine:** {}\n\n", m.line());
    s += &format!(
        "**Method:** pft, the seeds' benchmark. Each run maps {} GiB of fresh anonymous memory; each \
         thread writes its contiguous share, page by page, in the order of the pattern; wall time \
         runs from a start barrier to the last thread's end, user and system time are the whole \
         process's over the same span (the engine's threads included). `fault/wsec` = pages / wall, \
         `flt/cpu/s` = pages / (user + system). Every figure is the median of {} reps; the reps \
         interleave the modes so the machine's drift falls on all of them alike; `(!)` marks a row \
         whose wall min and max differ by more than 25%. The engine's pool fill (mode `engine`) \
         happens before the timed part and is shown in its own column, never hidden.\n\n",
        gb_text(r.gb),
        r.reps
    );
    s += "| mode | what it measures |\n|---|---|\n";
    for b in Base::ALL {
        s += &format!("| `{}` | {} |\n", b.name(), b.about());
    }
    s += "| `engine:KNOB=VALUE` | the engine with knobs changed (see the mechanisms section) |\n\n";
    if let Some((_, seq)) = done.iter().find(|(suite, _)| suite.id == "seq") {
        s += "**Headline** (sequential first touch, 1 cache line per page, fault/wsec over native):\n\n";
        s += "| threads |";
        let modes: Vec<String> = modes(seq).into_iter().filter(|m| m != "native").collect();
        for mode in &modes {
            s += &format!(" `{mode}` |");
        }
        s += "\n|---:|";
        s += &"---:|".repeat(modes.len());
        s += "\n";
        for t in distinct(seq.iter().map(|r| r.at.threads)) {
            s += &format!("| {t} |");
            for mode in &modes {
                s += &format!(" {} |", headline(seq, mode, t));
            }
            s += "\n";
        }
        s += "\n";
    }
    for (i, (suite, rows)) in done.iter().enumerate() {
        let a = &suite.args;
        s += &format!("## {}. {}\n\n{}\n\n", i + 1, suite.title, suite.about);
        s +=
            &format!(
            "`zerofault bench --gb {} --reps {} --threads {} --cachelines {} --pattern {} --touch {}{} --mode {}`\n\n",
            gb_text(a.gb),
            a.reps,
            a.threads.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
            a.cachelines.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
            a.pattern.name(),
            a.touch,
            if a.loops > 1 { format!(" --loop {}", a.loops) } else { String::new() },
            a.modes.iter().map(Mode::name).collect::<Vec<_>>().join(",")
        );
        s += &format!("![{}]({}.png)\n\n", suite.title, suite.id);
        s += "fault/wsec relative to native:\n\n";
        s += &ratio_markdown(rows);
        s += "\n<details><summary>All rows</summary>\n\n";
        s += &rows_markdown(rows);
        s += "\n</details>\n\n";
        let warned = rows.iter().filter(|r| r.spread_warning()).count();
        if warned > 0 {
            s += &format!(
                "Warning: {warned} of {} rows varied by more than 25% between reps (marked `(!)`).\n\n",
                rows.len()
            );
        }
    }
    let mut next = done.len() + 1;
    if !procs.is_empty() {
        s += &procs_markdown(next, procs);
        next += 1;
    }
    s += &format!(
        "## {}. {ZEROING_TITLE}\n\n{}\n\n`zerofault bench-zero`\n\n{}\n",
        next,
        zeroing_about(zero.cold_bytes),
        zero.markdown()
    );
    s += "Every row of every section, with the engine's counters, is in `benchmarks.json` beside this file.\n";
    s
}

pub(crate) fn run(r: &ReportFlags) -> Result<(), String> {
    let m = Machine::read();
    let suites = suites(r, m.cpus);
    for s in &suites {
        s.args.check()?;
    }
    bench::preflight(&suites.iter().flat_map(|s| s.args.modes.clone()).collect::<Vec<_>>())
        .map_err(|e| e.replace("zerofault bench", "zerofault report"))?;
    std::fs::create_dir_all(&r.out).map_err(|e| format!("--out {}: {e}", r.out.display()))?;
    let t0 = Instant::now();
    let procs_args: Vec<BenchArgs> = PROCS.iter().map(|&n| procs_args(r, n)).collect();
    let total =
        suites.iter().map(|s| s.args.runs()).sum::<usize>() + procs_args.iter().map(BenchArgs::runs).sum::<usize>();
    let mut done = vec![];
    let mut procs: ProcsDone = vec![];
    {
        let progress = Progress::new(total, r.quiet);
        for suite in suites {
            let rows = bench::run(&suite.args, &progress)?;
            done.push((suite, rows));
        }
        for a in procs_args {
            let rows = crate::procs::measure(&a, &progress)?;
            procs.push((a, rows));
        }
    }
    if !r.quiet {
        eprintln!("zerofault report: measuring the zeroing methods (bench-zero)");
    }
    // On the report's size (up to bench-zero's 1 GiB), so a small report stays small. A
    // failure here is written into the section: it does not throw away the suites' hour.
    let cold = gib_bytes(r.gb)
        .next_multiple_of(2 << 20)
        .clamp(2 << 20, crate::zeroing::COLD);
    let zero = crate::zeroing::measure(cold);
    let took = t0.elapsed().as_secs_f64();
    let mut all = vec![];
    for (suite, rows) in &done {
        let title = format!(
            "{} ({} GiB, {} reps)",
            suite.title,
            gb_text(suite.args.gb),
            suite.args.reps
        );
        crate::plot::write(&r.out.join(format!("{}.png", suite.id)), &title, rows)?;
        let mut j = crate::output::json(&suite.args, &m, rows);
        j["suite"] = json!(suite.id);
        all.push(j);
    }
    let write = |name: &str, text: String| {
        let p = r.out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("--out {}: {e}", p.display()))
    };
    write("BENCHMARKS.md", markdown(r, &m, &done, &procs, &zero, took))?;
    let procs_json: Vec<_> = procs.iter().map(|(a, rows)| crate::procs::to_json(a, rows)).collect();
    write(
        "benchmarks.json",
        serde_json::to_string_pretty(&json!({
            "machine": m.json(),
            "suites": all,
            "procs": procs_json,
            "zeroing": zero.json(),
        }))
        .expect("JSON")
            + "\n",
    )?;
    eprintln!(
        "zerofault report: wrote {} (and its plots, benchmarks.json) in {took:.0} s",
        r.out.join("BENCHMARKS.md").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{args, machine, row};

    #[test]
    fn parse_defaults_and_errors() {
        let a = parse(&[]).unwrap();
        assert_eq!(
            (a.out.to_str(), a.gb, a.reps, a.quiet),
            (Some("zerofault-report"), 1.0, 3, false)
        );
        let a = parse(&args("--out docs --gb 0.25 --reps 1 --quiet")).unwrap();
        assert_eq!((a.out.to_str(), a.gb, a.reps, a.quiet), (Some("docs"), 0.25, 1, true));
        for (bad, needle) in [
            ("--gb -1", "--gb"),
            ("--gb 1e30", "at most 131072 (128 TiB)"),
            ("--reps 0", "--reps"),
            ("--out", "--out"),
            ("x", "unexpected"),
        ] {
            let e = parse(&args(bad)).unwrap_err();
            assert!(e.contains(needle) && !e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn the_suite_covers_threads_cachelines_patterns_and_every_mode() {
        let s = suites(&parse(&[]).unwrap(), 2);
        assert_eq!(s[0].args.threads, [1, 2]);
        assert_eq!(s[0].args.cachelines, [1, 2, 4, 8, 16, 32, 64]);
        let names: Vec<String> = s[0].args.modes.iter().map(Mode::name).collect();
        assert_eq!(names, ["native", "thp", "populate", "engine", "engine-cold", "floor"]);
        assert_eq!(s[1].args.pattern, Pattern::Random);
        assert_eq!((s[2].args.pattern, s[2].args.touch), (Pattern::Random, 0.05));
        for m in [
            "engine:pool=off",
            "engine:ahead=off",
            "engine:pool_thp=off",
            "engine-cold:pool_thp=off",
        ] {
            assert!(s[3].args.modes.iter().any(|x| x.name() == m), "{m}");
        }
        assert_eq!(s[4].args.loops, 10, "seed 003's benchmark");
        assert!(s[4].args.modes.iter().any(|x| x.name() == "engine-cold:recycle=off"));
        assert_eq!(
            (s[5].args.pattern, s[5].args.threads.as_slice()),
            (Pattern::ReadWrite, [1].as_slice())
        );
        assert_eq!((s[6].args.busy, s[6].args.threads.as_slice()), (2, [1].as_slice()));
        for i in [5, 6] {
            let names: Vec<String> = s[i].args.modes.iter().map(Mode::name).collect();
            assert_eq!(names, ["native", "thp", "engine", "engine-cold"]);
        }
        let runs: usize = s.iter().map(|x| x.args.runs()).sum();
        assert_eq!(runs, 3 * (14 * 6 + 2 * 6 + 2 * 6 + 2 * 10 + 2 * 6 + 4 + 4));
        let p = procs_args(&parse(&[]).unwrap(), 4);
        assert_eq!((p.procs, p.threads.as_slice(), p.busy), (4, [1].as_slice(), 0));
    }

    #[test]
    fn markdown_has_tables_ratios_and_plots() {
        let r = parse(&[]).unwrap();
        let mut suite = suites(&r, 2);
        suite.truncate(1);
        let rows = vec![
            row("native", 1, 1, 1.0),
            row("engine", 1, 1, 0.1),
            row("native", 1, 8, 1.0),
            row("engine", 1, 8, 0.2),
        ];
        let done = vec![(suite.pop().unwrap(), rows)];
        let zero = crate::zeroing::Table {
            rows: vec![],
            missing: vec![("dsa", "no work queue".into())],
            cold_bytes: 64 << 20,
            error: None,
        };
        let procs: ProcsDone = vec![(
            procs_args(&r, 2),
            vec![
                crate::procs::Row {
                    at: crate::bench::Point {
                        threads: 1,
                        cachelines: 1,
                    },
                    mode: "native".into(),
                    walls: vec![1.0, 2.0],
                },
                crate::procs::Row {
                    at: crate::bench::Point {
                        threads: 1,
                        cachelines: 1,
                    },
                    mode: "engine".into(),
                    walls: vec![0.5, 0.25],
                },
            ],
        )];
        let md = markdown(&r, &machine(), &done, &procs, &zero, 95.0);
        assert!(md.contains("**Machine:** Linux 6.8.0 | Test CPU"), "{md}");
        assert!(md.contains("![Sequential first touch: threads and cache lines](seq.png)"));
        assert!(
            md.contains(
                "| threads | cache lines | `engine` |\n|---:|---:|---:|\n| 1 | 1 | 10.00x |\n| 1 | 8 | 5.00x |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| 1 | 1 | `engine` | 0.100 | 0.200 | 0.100 | 0.100..0.110 | 3333 | 10000 | 10.00x | 0.400 |"),
            "{md}"
        );
        assert!(md.contains("**Headline**") && md.contains("| 1 | 10.00x |"), "{md}");
        assert!(
            md.contains("## 2. Busy machine: several processes at once\n")
                && md.contains("--mode native,thp,engine,engine-cold --procs 2`")
                && md.contains("| `native` | 1.000 | 2.000 | 2.000 | 1.00x |")
                && md.contains("| `engine` | 0.500 | 0.250 | 0.500 | 4.00x |"),
            "the processes section follows the suites: {md}"
        );
        assert!(
            md.contains("## 3. Zeroing methods\n") && md.contains("- `dsa`: no work queue"),
            "the zeroing section follows them: {md}"
        );
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(20_778), (2026, 11, 21));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }
}
