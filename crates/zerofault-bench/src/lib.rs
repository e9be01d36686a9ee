//! # zerofault-bench: pft, the engine against the kernel
//!
//! pft, the seeds' page-fault benchmark, measures first touch: each run maps fresh anonymous
//! memory and each of N threads writes the first C cache lines of every 4 KiB page of its share,
//! in a pattern (sequential, random, stride K). Wall time runs from a start barrier to the last
//! thread's end; user and system time are the whole process's (the engine's threads
//! included). `fault/wsec` = pages / wall, `flt/cpu/s` = pages / CPU.
//!
//! Modes: `native` (kernel 4 KiB faults), `thp` (kernel huge-page faults), `populate`
//! (`MADV_POPULATE_WRITE`, then the touch), `engine` (the pool filled before the timed part,
//! the fill shown apart), `engine-cold` (the pool empty), and `engine:KNOB=VALUE...` to switch
//! one mechanism off.
//!
//! Speed is shown by ratios measured in one run: every table, plot and report gives each mode's
//! `fault/wsec` over the `native` row of the same run, at the same point, the reps interleaving
//! the modes so that the machine's drift falls on all of them alike. Figures from two runs, or
//! two machines, are not compared.
//!
//! For the `zerofault` command: [`run_bench`] and [`run_report`] run `zerofault bench` and
//! `zerofault report` from their flags ([`BenchFlags`], [`ReportFlags`], clap's); [`args`] has
//! the value parsers its other commands share; [`shuffle`] the fixed-seed permutation `verify` visits pages in; [`Hogs`] the CPU
//! hogs of `--busy`.

pub mod args;
mod bench;
#[cfg(test)]
mod fixtures;
mod flush;
mod machine;
mod output;
mod plot;
mod procs;
mod progress;
mod report;
mod shuttle;
mod sys;
mod zeroing;

pub use bench::{shuffle, BenchFlags};
pub use flush::{run_bench_flush, FlushFlags};
pub use report::ReportFlags;
pub use sys::Hogs;
pub use zeroing::run_bench_zero;

/// `zerofault bench`: runs the sweep and prints its rows (table, JSON or CSV), and the plot if
/// asked; an error is one line.
///
/// # Context
/// The command's main thread.
pub fn run_bench(flags: &BenchFlags) -> Result<(), String> {
    let a = flags.args()?;
    if a.procs > 1 {
        return procs::run(&a);
    }
    if let Some(path) = &a.plot {
        // Find out now, not after the whole run, that the plot cannot be written.
        std::fs::File::create(path).map_err(|e| format!("--plot {}: {e}", path.display()))?;
    }
    let m = machine::Machine::read();
    let rows = {
        let progress = progress::Progress::new(a.runs(), a.quiet);
        bench::run(&a, &progress)?
    };
    match a.format {
        bench::Format::Table => print!("{}", output::table(&a, &m, &rows)),
        bench::Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&output::json(&a, &m, &rows)).expect("JSON")
        ),
        bench::Format::Csv => print!("{}", output::csv(&a, &m, &rows)),
    }
    if let Some(path) = &a.plot {
        let title = format!(
            "zerofault bench: {} GiB, {}, touch {}, {}",
            output::gb_text(a.gb),
            a.pattern.name(),
            a.touch,
            if a.reps == 1 {
                "1 rep".to_string()
            } else {
                format!("median of {} reps", a.reps)
            }
        );
        plot::write(path, &title, &rows)?;
        eprintln!("zerofault bench: plot written to {}", path.display());
    }
    Ok(())
}

/// `zerofault report`: runs the headline suite and writes DIR/BENCHMARKS.md, its plots and
/// benchmarks.json; an error is one line.
///
/// # Context
/// The command's main thread.
pub fn run_report(flags: &ReportFlags) -> Result<(), String> {
    report::run(flags)
}
