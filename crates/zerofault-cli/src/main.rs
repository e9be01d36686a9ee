//! The `zerofault` command: its clap definition ([`cli`]) and the dispatch to each subcommand.
//! `bench`, `bench-zero`, `bench-flush` and `report` are zerofault-bench's; `run`, `verify` and
//! `options` call the engine.
//!
//! `run` reads its own arguments ([`run::parse`]): a knob it refuses must still leave the
//! program running (fail open), and everything after `--` is the program's, untouched. Its
//! clap definition gives its help, completions and man page.

mod cli;
mod doctor;
mod embedded;
mod run;
mod stats;
mod verify;

use cli::{Cli, Cmd};
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "run") && !run::asks_help(&argv[2..]) {
        let e = match run::parse(&argv[2..]) {
            Ok(a) => run::run(&a), // returns only if exec failed
            Err(e) => e,
        };
        eprintln!("{e}");
        return ExitCode::from(127);
    }
    // Output cut short (`zerofault bench | head`) ends the command quietly, as it would a C
    // tool: the default action of SIGPIPE, which Rust's runtime ignores. (`run` execs the
    // program with the disposition it was given.)
    // SAFETY: signal() with a valid signal number and SIG_DFL.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let matches = match cli::command().try_get_matches_from(&argv) {
        Ok(m) => m,
        Err(e) => return cli::usage_error(e),
    };
    let parsed = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => return cli::usage_error(e),
    };
    match dispatch(parsed.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one parsed subcommand; an error is one line.
fn dispatch(cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Bench(f) => zerofault_bench::run_bench(&f),
        Cmd::BenchZero => zerofault_bench::run_bench_zero(),
        Cmd::BenchFlush(f) => zerofault_bench::run_bench_flush(&f),
        Cmd::Report(f) => zerofault_bench::run_report(&f),
        // main hands `run` to run::parse before clap sees it, but for its help.
        Cmd::Run(_) => Err("zerofault run: give the program after --".into()),
        Cmd::Verify(a) => verify::run(&a),
        Cmd::Options { markdown } => {
            match markdown {
                false => print!("{}", zerofault::Options::table_text()),
                true => print!("{}", zerofault::Options::table_markdown()),
            }
            Ok(())
        }
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut cli::command(), "zerofault", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Man { out } => cli::man(out.as_deref()),
        Cmd::Stats { format, files } => stats::run(&files, format == cli::StatsFormat::Json),
        Cmd::Doctor { format } => match doctor::run(format == cli::Format::Json) {
            0 => Ok(()),
            _ => Err("zerofault doctor: the engine cannot run here (see the lines marked missing)".into()),
        },
    }
}
