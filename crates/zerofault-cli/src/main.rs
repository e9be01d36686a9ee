//! The `zerofault` command.

mod args;
mod bench;
mod verify;

use std::process::ExitCode;

const USAGE: &str = "\
zerofault: serve anonymous page faults from a pre-zeroed pool (userfaultfd)

usage:
  zerofault bench  [--gb F] [--reps N] [--threads N] [--mode native,engine,engine-cold]
                   [--pattern seq|random] [--touch F] [--format table|json]
      pft: first-touch fault rate of the engine against the native kernel
  zerofault verify [--gb F] [--threads N]
      every served page reads zero before the first write, under several patterns
  zerofault options [--markdown]
      the engine's knobs (environment ZEROFAULT_<NAME>), their defaults and what they accept
";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match argv.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match cmd {
        "bench" => bench::parse(rest).and_then(|a| {
            let rows = bench::run(&a)?;
            match a.format {
                bench::Format::Table => print!("{}", bench::table(&a, &rows)),
                bench::Format::Json => {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&bench::json(&a, &rows)).expect("JSON")
                    )
                }
            }
            Ok(())
        }),
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
            "zerofault: unknown command {other:?}; it accepts bench, verify, options, help"
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
