//! The `zerofault` command line, declared with clap: every subcommand, its flags, help and
//! examples. [`command`] adds what derive cannot know: one `--KNOB=VALUE` flag of `run` per knob
//! of the engine's options table, so that help, completions and the man page list them all.
//!
//! Errors are one line on stderr ([`usage_error`]), exit status 2; help and `--version` go to
//! stdout, status 0.

use clap::{Arg, ArgAction, CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const ABOUT: &str = "serve anonymous page faults from a pre-zeroed pool (userfaultfd)";

const LONG_ABOUT: &str = "\
zerofault serves a process's anonymous page faults through userfaultfd: it moves in pages a \
background thread zeroed earlier, in windows that grow while access stays sequential, and \
hands sparse or random access back to the kernel.

Needs Linux 6.8 or later and one of: root, access to /dev/userfaultfd, or \
vm.unprivileged_userfaultfd=1. Without them every program runs on plain memory.";

const EXAMPLES: &str = "\
Examples:
  zerofault bench                              the engine against the kernel, 1 GiB
  zerofault run -- python3 train.py            a program under the shim
  zerofault run --stats --pool_max=4G -- make -j8
  zerofault verify                             every served page reads zero
  zerofault options                            the knobs (ZEROFAULT_<NAME>)";

#[derive(Parser, Debug)]
#[command(name = "zerofault", version, about = ABOUT, long_about = LONG_ABOUT, after_help = EXAMPLES)]
#[command(propagate_version = true, arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// pft: first-touch fault rate of the engine against the kernel.
    #[command(long_about = "pft, the seeds' page-fault benchmark: first-touch fault rate of the \
        engine against the kernel. Every row's ratio is over the native row of the same run.")]
    Bench(zerofault_bench::BenchFlags),
    /// GB/s of each zeroing method (kernel, stosb, nt, clzero), 4 KiB and 2 MiB calls, cold and
    /// cached.
    BenchZero,
    /// What a huge-page move costs the mover and each CPU running the process (TLB flushes).
    BenchFlush(zerofault_bench::FlushFlags),
    /// The headline suite: writes DIR/BENCHMARKS.md with tables, ratios and plots.
    Report(zerofault_bench::ReportFlags),
    /// Run PROGRAM with the LD_PRELOAD shim: its large anonymous memory is served by the engine.
    #[command(long_about = "Runs PROGRAM with the LD_PRELOAD shim: its large anonymous memory is \
        served by the engine. Its exit status is the program's. A knob the engine refuses, or a \
        program the shim cannot go into (static, set-user-ID), is one line on stderr and the \
        program runs without the engine.")]
    Run(RunFlags),
    /// Every served page reads zero before the first write, under several patterns.
    Verify(crate::verify::VerifyArgs),
    /// What this machine offers zerofault: each check ok, warn or missing, with the fix.
    #[command(long_about = "What this machine offers zerofault: the kernel and UFFDIO_MOVE, \
        userfaultfd access for this user, THP and mTHP, free page reporting, NUMA nodes, the \
        zeroing methods, a seccomp filter, cgroup CPU and memory limits, and a self-test that \
        serves 64 MiB and checks it reads zero. Each line is ok, warn or missing, with the exact \
        fix. Exits 1 when the engine cannot run here; warnings do not fail.")]
    #[command(
        after_help = "Examples:\n  zerofault doctor\n  zerofault doctor --format json | jq '.checks[] | select(.status != \"ok\")'"
    )]
    Doctor {
        /// Output: table, or one JSON object.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Add up the JSON lines ZEROFAULT_STATS wrote, one per process: a fleet's counters.
    #[command(long_about = "Adds up the lines ZEROFAULT_STATS=json (stderr) or \
        ZEROFAULT_STATS=/path/file wrote, one JSON object per process that started the engine: \
        `processes N`, then each counter summed (the [max] counters, a method, the zeroing \
        measurements and an errno, the largest).")]
    #[command(after_help = "Examples:
  ZEROFAULT_STATS=/tmp/zf.jsonl zerofault run -- make -j8 && zerofault stats /tmp/zf.jsonl
  zerofault stats --format json host1.jsonl host2.jsonl
  journalctl -u myapp -o cat | grep '^{\"pid\"' | zerofault stats -")]
    Stats {
        /// Output: one `name value` line per counter, or one JSON object.
        #[arg(long, value_enum, default_value = "text")]
        format: StatsFormat,
        /// Files of JSON lines; `-` reads stdin.
        #[arg(value_name = "FILE", required = true)]
        files: Vec<String>,
    },
    /// The engine's knobs (environment ZEROFAULT_<NAME>), their defaults and what they accept.
    Options {
        /// As a Markdown table.
        #[arg(long)]
        markdown: bool,
    },
    /// Shell completions for bash, zsh, fish, elvish or powershell, on stdout.
    #[command(after_help = "Example:\n  zerofault completions bash > /etc/bash_completion.d/zerofault")]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The man page (roff) on stdout, or every page (one per subcommand) into DIR.
    #[command(after_help = "Examples:\n  zerofault man | man -l -\n  zerofault man --out /usr/local/share/man/man1")]
    Man {
        /// Write zerofault.1 and zerofault-SUBCOMMAND.1 into this directory.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

/// An output format: a table for people, JSON for programs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

/// `zerofault stats`' output.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsFormat {
    Text,
    Json,
}

/// `zerofault run`'s flags as help shows them; [`crate::run::parse`] reads them.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  zerofault run -- sort -S 2G big.txt
  zerofault run --stats --verbose -- java -Xms8g -jar app.jar
  zerofault run --max_order=9 --pool_max=1G -- ./simulate")]
pub struct RunFlags {
    /// Print the engine's counters to stderr at exit (the process and the children it forked).
    #[arg(long)]
    stats: bool,
    /// One line per process: whether the engine started and, if not, why.
    #[arg(long)]
    verbose: bool,
    /// The program and its arguments, untouched (`--` before it may be left out).
    #[arg(
        value_name = "PROGRAM",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    program: Vec<OsString>,
}

/// The whole command: the derive's, with one `--KNOB=VALUE` flag of `run` per engine knob
/// (`stats` and `verbose` are run's own switches, which set those knobs).
pub fn command() -> clap::Command {
    Cli::command().mut_subcommand("run", |run| {
        let own: Vec<String> = run.get_arguments().map(|a| a.get_id().to_string()).collect();
        let knobs = zerofault::Options::TABLE
            .iter()
            .filter(|k| !own.iter().any(|o| o == k.name));
        let knobs = knobs.map(|k| {
            Arg::new(k.name)
                .long(k.name)
                .value_name("VALUE")
                .require_equals(true)
                .action(ArgAction::Set)
                .help_heading("Knobs (ZEROFAULT_<NAME>, see zerofault options)")
                .help(format!("{} [default: {}]", first_sentence(k.doc), k.default))
        });
        run.args(knobs)
    })
}

/// A knob's doc up to its first full stop, on one line.
fn first_sentence(doc: &str) -> String {
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.find(". ") {
        Some(i) => flat[..=i].to_string(),
        None => flat,
    }
}

/// A clap error: help and version to stdout (status 0), anything else one line on stderr
/// (status 2).
pub fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind::*;
    match e.kind() {
        DisplayHelp | DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::from(2)
        }
        _ => {
            let sub = std::env::args_os()
                .nth(1)
                .map(|s| s.to_string_lossy().into_owned())
                .filter(|s| !s.starts_with('-'));
            let name = match sub {
                Some(s) if command().find_subcommand(&s).is_some() => format!("zerofault {s}"),
                _ => "zerofault".to_string(),
            };
            eprintln!("{}", zerofault_bench::args::one_line(&e, &name));
            ExitCode::from(2)
        }
    }
}

/// `zerofault man`: zerofault.1 on stdout, or every page into `out`.
pub fn man(out: Option<&Path>) -> Result<(), String> {
    let cmd = command();
    let Some(dir) = out else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd)
            .render(&mut page)
            .map_err(|e| e.to_string())?;
        return std::io::Write::write_all(&mut std::io::stdout(), &page).map_err(|e| e.to_string());
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("zerofault man: --out {}: {e}", dir.display()))?;
    clap_mangen::generate_to(cmd, dir).map_err(|e| format!("zerofault man: --out {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn run_lists_every_knob_with_its_default() {
        let run = command().find_subcommand("run").unwrap().clone();
        for k in zerofault::Options::TABLE
            .iter()
            .filter(|k| !["stats", "verbose"].contains(&k.name))
        {
            let arg = run.get_arguments().find(|a| a.get_id() == k.name);
            let help = arg
                .and_then(|a| a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(
                help.ends_with(&format!("[default: {}]", k.default)),
                "{}: {help}",
                k.name
            );
        }
    }

    #[test]
    fn a_knobs_first_sentence() {
        assert_eq!(
            first_sentence("Pool on or off. Off: the\nkernel zeroes.\n"),
            "Pool on or off."
        );
        assert_eq!(first_sentence("No full stop here\n"), "No full stop here");
    }
}
