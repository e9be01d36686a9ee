//! The `zerofault` command: argument dispatch. `bench` and `report` are zerofault-bench's; `run`,
//! `verify` and `options` call the engine.

mod embedded;
mod run;
mod stats;
mod verify;

use std::process::ExitCode;

const USAGE: &str = "\
zerofault: serve anonymous page faults from a pre-zeroed pool (userfaultfd)

usage:
  zerofault bench  [--gb F] [--reps N] [--threads LIST] [--cachelines LIST] [--mode LIST]
                   [--pattern seq|random|readwrite|stride:K] [--touch F] [--loop N] [--pin] [--quiet]
                   [--busy N] [--procs N] [--format table|json|csv] [--plot FILE.svg|FILE.png]
      pft: first-touch fault rate of the engine against the kernel. LIST: 1,2,4 or 1..4.
      --loop N: allocate, touch, free N times; --busy N: N CPU hogs beside the run;
      --procs N: N bench processes at once, each one's wall and the slowest.
      modes: native, thp, populate, engine, engine-cold, floor, engine:KNOB=VALUE[:KNOB=VALUE]
  zerofault bench-zero
      GB/s of each zeroing method (kernel, stosb, nt, clzero), 4 KiB and 2 MiB calls, cold and cached
  zerofault bench-flush [--writers N] [--mib M] [--secs F]
      what a huge-page move costs the mover and each CPU running the process (TLB-flush interrupts)
  zerofault report [--out DIR] [--gb F] [--reps N] [--quiet]
      the headline suite; writes DIR/BENCHMARKS.md with tables, ratios and plots
  zerofault run [--stats] [--verbose] [--KNOB=VALUE ...] -- PROGRAM [ARGS]
      runs PROGRAM with the LD_PRELOAD shim: its large anonymous memory is served by the engine
  zerofault verify [--gb F] [--threads N] [--busy N]
      every served page reads zero before the first write, under several patterns
  zerofault stats [--format text|json] FILE...   sums the lines of ZEROFAULT_STATS=FILE (- for stdin)
  zerofault options [--markdown]
      the engine's knobs (environment ZEROFAULT_<NAME>), their defaults and what they accept
";

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "run") {
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(2).collect();
        let e = match run::parse(&args) {
            Ok(a) => run::run(&a), // returns only if exec failed
            Err(e) => e,
        };
        eprintln!("{e}");
        return ExitCode::from(127);
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match argv.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match cmd {
        "bench" => zerofault_bench::run_bench(rest),
        "report" => zerofault_bench::run_report(rest),
        "bench-zero" => zerofault_bench::run_bench_zero(rest),
        "bench-flush" => zerofault_bench::run_bench_flush(rest),
        "verify" => verify::parse(rest).and_then(|a| verify::run(&a)),
        "stats" => stats::parse(rest).and_then(|(files, json)| stats::run(&files, json)),
        "options" => match rest.first().map(String::as_str) {
            None => {
                print!("{}", zerofault::Options::table_text());
                Ok(())
            }
            Some("--markdown") => {
                print!("{}", zerofault::Options::table_markdown());
                Ok(())
            }
            Some(other) => Err(format!(
                "zerofault options: unknown flag {other}; it accepts --markdown"
            )),
        },
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!(
            "zerofault: unknown command {other:?}; it accepts bench, bench-zero, bench-flush, report, run, verify, options, help"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
