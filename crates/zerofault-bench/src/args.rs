//! A small flag parser whose every error is one line naming the flag and what it accepts.
//!
//! Values are taken as written: blanks around a value (`--gb " 1"`) make it invalid, as for the
//! `ZEROFAULT_*` knobs. Lists allow blanks after their commas (`1..2, 16`).

use std::collections::BTreeMap;
use zerofault::options::MAX_SIZE;
use zerofault::page::PAGE_SIZE;

/// Flags of one subcommand: name -> whether it takes a value.
pub struct Spec {
    pub command: &'static str,
    pub flags: &'static [(&'static str, bool)],
    /// Whether arguments other than flags are accepted.
    pub positional: bool,
}

/// Parsed flags (last one wins) and positional arguments.
#[derive(Debug, Default)]
pub struct Parsed {
    values: BTreeMap<String, String>,
    pub(crate) positional: Vec<String>,
}

impl Spec {
    /// Parses `--flag value`, `--flag=value` and bare `--switch`; `--` ends the flags.
    pub fn parse(&self, args: &[String]) -> Result<Parsed, String> {
        let mut p = Parsed::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--" {
                p.positional.extend(it.by_ref().cloned());
                break;
            }
            let Some(body) = a.strip_prefix("--") else {
                p.positional.push(a.clone());
                continue;
            };
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            let Some(&(_, takes_value)) = self.flags.iter().find(|(n, _)| *n == name) else {
                let known: Vec<String> = self.flags.iter().map(|(n, _)| format!("--{n}")).collect();
                return Err(format!(
                    "zerofault {}: unknown flag --{name}; it accepts {}",
                    self.command,
                    known.join(", ")
                ));
            };
            let value = if takes_value {
                match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| format!("zerofault {}: --{name} needs a value", self.command))?,
                }
            } else {
                if inline.is_some() {
                    return Err(format!("zerofault {}: --{name} takes no value", self.command));
                }
                String::new()
            };
            p.values.insert(name.to_string(), value);
        }
        if let (false, Some(extra)) = (self.positional, p.positional.first()) {
            return Err(format!("zerofault {}: unexpected argument {extra:?}", self.command));
        }
        Ok(p)
    }
}

impl Parsed {
    /// The raw value of `--name`, if given (`""` for a switch).
    pub(crate) fn raw(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether the switch `--name` was given.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// The value of `--name` parsed by `parse`, or `default`; a refusal names the flag and
    /// what it accepts (and says so when the value has blanks around it).
    pub fn get<T>(
        &self,
        name: &str,
        default: T,
        accepts: &str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Result<T, String> {
        match self.values.get(name) {
            None => Ok(default),
            Some(v) => parse(v).ok_or_else(|| invalid(name, v, accepts)),
        }
    }
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
pub fn gib_in(min_bytes: usize) -> impl Fn(&str) -> Option<f64> {
    debug_assert!(min_bytes > 0 && min_bytes % PAGE_SIZE == 0);
    move |s| positive_f64(s).filter(|gb| *gb <= MAX_GB && *gb * (1u64 << 30) as f64 >= min_bytes as f64)
}

/// A list of integers in `lo..=hi`: `1,2,4`, `1..4` (every integer from 1 to 4) or a mix
/// (`1..3,8`); each value once, at most 256 entries. Blanks are allowed around its commas and
/// `..`, not around the whole list.
pub(crate) fn int_list(lo: u64, hi: u64) -> impl Fn(&str) -> Option<Vec<usize>> {
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
        Some(out)
    }
}

/// A positive float, finite; no blanks around it.
pub(crate) fn positive_f64(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0)
}

/// An integer in `lo..=hi`; no blanks around it.
pub fn int_in(lo: u64, hi: u64) -> impl Fn(&str) -> Option<u64> {
    move |s| s.parse::<u64>().ok().filter(|v| (lo..=hi).contains(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::args;

    const SPEC: Spec = Spec {
        command: "t",
        flags: &[("gb", true), ("quiet", false)],
        positional: true,
    };

    #[test]
    fn both_value_spellings_and_switches() {
        let p = SPEC.parse(&args("--gb 2 --quiet x")).unwrap();
        assert!(p.positional.len() == 1);
        assert_eq!(p.get("gb", 1.0, "", positive_f64).unwrap(), 2.0);
        assert_eq!(p.positional, vec!["x"]);
        let p = SPEC.parse(&args("--gb=0.5 -- --gb 3")).unwrap();
        assert_eq!(p.get("gb", 1.0, "", positive_f64).unwrap(), 0.5);
        assert_eq!(p.positional, vec!["--gb", "3"]);
    }

    #[test]
    fn errors_are_one_line_and_name_the_flag() {
        for (a, needle) in [
            ("--nope", "--nope"),
            ("--gb", "--gb needs a value"),
            ("--quiet=1", "--quiet takes no value"),
        ] {
            let e = SPEC.parse(&args(a)).unwrap_err();
            assert!(e.contains(needle) && !e.contains('\n'), "{e}");
        }
        let p = SPEC.parse(&args("--gb -1")).unwrap();
        let e = p.get("gb", 1.0, "a positive size in GiB", positive_f64).unwrap_err();
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
        assert_eq!(l("1, 2"), Some(vec![1, 2]), "blanks after a comma are the list's");
        let p = SPEC.parse(&["--gb".to_string(), " 2".to_string()]).unwrap();
        let e = p.get("gb", 1.0, "a size in GiB", positive_f64).unwrap_err();
        assert_eq!(
            e,
            "--gb \" 2\" is invalid: it accepts a size in GiB, without blanks around it"
        );
    }

    #[test]
    fn integer_lists_and_ranges() {
        let l = int_list(1, 64);
        assert_eq!(l("1,8,64"), Some(vec![1, 8, 64]));
        assert_eq!(l("1..4"), Some(vec![1, 2, 3, 4]));
        assert_eq!(l("1..2, 16"), Some(vec![1, 2, 16]));
        for bad in ["0", "65", "1,,2", "4..1", "x", "", "1..65", "-1", "1,1", "1..3,2"] {
            assert_eq!(l(bad), None, "{bad}");
        }
        assert_eq!(int_list(1, 100_000)("1..1000"), None, "too many entries");
    }
}
