//! The value parsers behind the subcommands' clap flags (crate::cli), and the one line an error
//! becomes: every refusal names the flag and what it accepts.
//!
//! Values are taken as written: blanks around a value (`--gb " 1"`) make it invalid, as for the
//! `ZEROFAULT_*` knobs. Lists allow blanks after their commas (`1..2, 16`).

use std::error::Error as _;
use zerofault::options::MAX_SIZE;
use zerofault::page::PAGE_SIZE;

/// A clap value parser for `--name`: `parse` as written, and a refusal as the one line of
/// [`invalid`] (naming the flag and what it accepts).
pub fn checked<T>(
    name: &'static str,
    accepts: &'static str,
    parse: impl Fn(&str) -> Option<T> + Clone + Send + Sync + 'static,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    move |s| parse(s).ok_or_else(|| invalid(name, s, accepts))
}

/// A list of integers as one flag value (`--threads 1,2,4`): one value, not repeated flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct List(pub Vec<usize>);

/// Flags of type `T` (a subcommand's) parsed from `args` as `zerofault COMMAND args` would be,
/// an error as its [`one_line`]: for the subcommands' tests, without the whole command.
pub fn parse_flags<T: clap::Args + clap::FromArgMatches>(command: &str, args: &[String]) -> Result<T, String> {
    #[derive(clap::Parser)]
    struct Wrap<T: clap::Args> {
        #[command(flatten)]
        flags: T,
    }
    let argv = std::iter::once(command.to_string()).chain(args.iter().cloned());
    <Wrap<T> as clap::Parser>::try_parse_from(argv)
        .map(|w| w.flags)
        .map_err(|e| one_line(&e, &format!("zerofault {command}")))
}

/// A clap error as one line for stderr: a refused value is the value parser's own line
/// ([`invalid`]); anything else is clap's message with its tip, naming the command and where
/// its help is. Help and version output are not errors and are not passed here.
pub fn one_line(e: &clap::Error, command: &str) -> String {
    if e.kind() == clap::error::ErrorKind::ValueValidation {
        if let Some(src) = e.source() {
            return src.to_string();
        }
    }
    let rendered = e.render().to_string();
    let mut said = String::new();
    let lines = rendered.lines().take_while(|l| !l.starts_with("Usage:"));
    for l in lines.map(|l| l.trim().trim_start_matches("error: ")) {
        if l.is_empty() || l.starts_with("For more information") {
            continue;
        }
        if !said.is_empty() {
            said += if said.ends_with(':') { " " } else { "; " };
        }
        said += l;
    }
    format!("{command}: {said} (see {command} --help)")
}

/// The one line refusing `--name value`.
pub(crate) fn invalid(name: &str, value: &str, accepts: &str) -> String {
    let blanks = if has_blank_ends(value) {
        ", without blanks around it"
    } else {
        ""
    };
    format!("--{name} {value:?} is invalid: it accepts {accepts}{blanks}")
}

/// Whether `s` starts or ends with a blank (space, tab, newline...).
pub(crate) fn has_blank_ends(s: &str) -> bool {
    s.trim() != s
}

/// The largest `--gb`: the knobs' largest size, 2^47 bytes (128 TiB), in GiB.
pub const MAX_GB: f64 = (MAX_SIZE >> 30) as f64;

/// `--gb F` as bytes, rounded up to whole pages. [`gib_in`] keeps `gb` at most [`MAX_GB`];
/// the cap here only keeps the rounding from overflowing if a caller skipped it.
pub fn gib_bytes(gb: f64) -> usize {
    ((gb * (1u64 << 30) as f64) as usize)
        .min(MAX_SIZE)
        .next_multiple_of(PAGE_SIZE)
}

/// What `--gb` accepts in bench and report: one page up to 128 TiB.
pub(crate) const GB_ACCEPTS: &str =
    "a size in GiB, at least one 4 KiB page and at most 131072 (128 TiB), e.g. 1 or 0.25";

/// A size in GiB of at least `min_bytes` (a multiple of the page size) and at most
/// [`MAX_GB`]: a finite number, no blanks around it.
pub fn gib_in(min_bytes: usize) -> impl Fn(&str) -> Option<f64> + Clone + Send + Sync + 'static {
    debug_assert!(min_bytes > 0 && min_bytes % PAGE_SIZE == 0);
    move |s| positive_f64(s).filter(|gb| *gb <= MAX_GB && *gb * (1u64 << 30) as f64 >= min_bytes as f64)
}

/// A list of integers in `lo..=hi`: `1,2,4`, `1..4` (every integer from 1 to 4) or a mix
/// (`1..3,8`); each value once, at most 256 entries. Blanks are allowed around its commas and
/// `..`, not around the whole list.
pub(crate) fn int_list(lo: u64, hi: u64) -> impl Fn(&str) -> Option<List> + Clone + Send + Sync + 'static {
    move |s| {
        if has_blank_ends(s) {
            return None;
        }
        let mut out = Vec::new();
        for item in s.split(',') {
            let item = item.trim();
            let (a, b) = match item.split_once("..") {
                Some((a, b)) => (a.trim().parse::<u64>().ok()?, b.trim().parse::<u64>().ok()?),
                None => {
                    let v = item.parse::<u64>().ok()?;
                    (v, v)
                }
            };
            if a > b || a < lo || b > hi || out.len() as u64 + (b - a + 1) > 256 {
                return None;
            }
            for v in a..=b {
                if out.contains(&(v as usize)) {
                    return None; // each value once: a row per value
                }
                out.push(v as usize);
            }
        }
        Some(List(out))
    }
}

/// A positive float, finite; no blanks around it.
pub(crate) fn positive_f64(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0)
}

/// An integer in `lo..=hi`; no blanks around it.
pub fn int_in(lo: u64, hi: u64) -> impl Fn(&str) -> Option<u64> + Clone + Send + Sync + 'static {
    move |s| s.parse::<u64>().ok().filter(|v| (lo..=hi).contains(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::args;

    use clap::Parser;

    /// A command with one value flag and one switch, as the subcommands declare theirs.
    #[derive(Parser, Debug)]
    #[command(name = "t")]
    struct T {
        #[arg(long, allow_hyphen_values = true, default_value = "1", value_parser = checked("gb", "a positive size in GiB", positive_f64))]
        gb: f64,
        #[arg(long)]
        quiet: bool,
        #[arg(long, value_parser = checked("threads", "a list", int_list(1, 64)))]
        threads: Option<List>,
    }

    fn t(a: &str) -> Result<T, String> {
        T::try_parse_from(std::iter::once("t".to_string()).chain(args(a))).map_err(|e| one_line(&e, "zerofault t"))
    }

    #[test]
    fn both_value_spellings_and_switches() {
        let p = t("--gb 2 --quiet --threads 1..3").unwrap();
        assert_eq!((p.gb, p.quiet, p.threads), (2.0, true, Some(List(vec![1, 2, 3]))));
        let p = t("--gb=0.5").unwrap();
        assert_eq!((p.gb, p.quiet, p.threads), (0.5, false, None));
    }

    #[test]
    fn errors_are_one_line_and_name_the_flag() {
        for (a, needle) in [
            ("--nope", "unexpected argument '--nope'"),
            ("--gb", "'--gb <GB>'"),
            ("--quiet=1", "--quiet"),
            ("--quite", "a similar argument exists: '--quiet'"),
            ("x", "unexpected argument 'x'"),
        ] {
            let e = t(a).unwrap_err();
            assert!(e.contains(needle) && !e.contains('\n'), "{a}: {e}");
            assert!(
                e.starts_with("zerofault t: ") && e.ends_with("(see zerofault t --help)"),
                "{e}"
            );
        }
        let e = t("--gb -1").unwrap_err();
        assert_eq!(e, "--gb \"-1\" is invalid: it accepts a positive size in GiB");
    }

    #[test]
    fn sizes_in_gib_are_bounded_and_taken_as_written() {
        let gb = gib_in(PAGE_SIZE);
        assert_eq!(gb("0.25"), Some(0.25));
        assert_eq!(gb("131072"), Some(MAX_GB));
        assert_eq!(gb("0.000003814697265625"), Some(PAGE_SIZE as f64 / (1u64 << 30) as f64));
        for bad in [
            "131072.5",
            "1e30",
            "18446744073709551615",
            "inf",
            "0.0000038",
            "0",
            " 1",
            "1 ",
            "1\t",
            "",
        ] {
            assert_eq!(gb(bad), None, "{bad:?}");
        }
        assert_eq!(gib_in(4 << 20)("0.00390625"), Some(0.00390625));
        assert_eq!(gib_in(4 << 20)("0.0039"), None);
        // The largest --gb rounds without overflow; a caller that skipped gib_in is capped.
        assert_eq!(gib_bytes(MAX_GB), MAX_SIZE);
        assert_eq!(gib_bytes(1e30), MAX_SIZE);
        assert_eq!(gib_bytes(1e-9), PAGE_SIZE);
    }

    #[test]
    fn blanks_around_values_are_refused_and_said() {
        assert_eq!(int_in(1, 10)(" 3"), None);
        assert_eq!(int_in(1, 10)("3\n"), None);
        assert_eq!(positive_f64("0.5 "), None);
        let l = int_list(1, 64);
        assert_eq!(l(" 1,2"), None);
        assert_eq!(l("1,2 "), None);
        assert_eq!(l("1, 2"), Some(List(vec![1, 2])), "blanks after a comma are the list's");
        let e = T::try_parse_from(["t", "--gb", " 2"]).unwrap_err();
        assert_eq!(
            one_line(&e, "zerofault t"),
            "--gb \" 2\" is invalid: it accepts a positive size in GiB, without blanks around it"
        );
    }

    #[test]
    fn integer_lists_and_ranges() {
        let l = |s| int_list(1, 64)(s).map(|l| l.0);
        assert_eq!(l("1,8,64"), Some(vec![1, 8, 64]));
        assert_eq!(l("1..4"), Some(vec![1, 2, 3, 4]));
        assert_eq!(l("1..2, 16"), Some(vec![1, 2, 16]));
        for bad in ["0", "65", "1,,2", "4..1", "x", "", "1..65", "-1", "1,1", "1..3,2"] {
            assert_eq!(l(bad), None, "{bad}");
        }
        assert_eq!(int_list(1, 100_000)("1..1000"), None, "too many entries");
    }
}
