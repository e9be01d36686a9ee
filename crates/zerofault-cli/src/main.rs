//! The `zerofault` command.

mod args;
mod bench;
mod machine;
mod output;
mod plot;
mod progress;
mod report;
mod run;
mod verify;

use std::process::ExitCode;

const USAGE: &str = "\
zerofault: serve anonymous page faults from a pre-zeroed pool (userfaultfd)

usage:
  zerofault bench  [--gb F] [--reps N] [--threads LIST] [--cachelines LIST] [--mode LIST]
                   [--pattern seq|random|stride:K] [--touch F] [--pin] [--quiet]
                   [--format table|json|csv] [--plot FILE.svg|FILE.png]
      pft: first-touch fault rate of the engine against the kernel. LIST: 1,2,4 or 1..4.
      modes: native, thp, populate, engine, engine-cold, engine:KNOB=VALUE[:KNOB=VALUE]
  zerofault report [--out DIR] [--gb F] [--reps N] [--quiet]
      the headline suite; writes DIR/BENCHMARKS.md with tables, ratios and plots
  zerofault run [--stats] [--KNOB=VALUE ...] -- PROGRAM [ARGS]
      runs PROGRAM with the LD_PRELOAD shim: its large anonymous memory is served by the engine
  zerofault verify [--gb F] [--threads N]
      every served page reads zero before the first write, under several patterns
  zerofault options [--markdown]
      the engine's knobs (environment ZEROFAULT_<NAME>), their defaults and what they accept
";

fn bench(rest: &[String]) -> Result<(), String> {
    let a = bench::parse(rest)?;
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
        "bench" => bench(rest),
        "report" => report::parse(rest).and_then(|a| report::run(&a)),
        "verify" => verify::parse(rest).and_then(|a| verify::run(&a)),
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
            "zerofault: unknown command {other:?}; it accepts bench, report, run, verify, options, help"
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
