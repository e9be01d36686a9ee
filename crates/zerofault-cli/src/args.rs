//! A small flag parser whose every error is one line naming the flag and what it accepts.

use std::collections::BTreeMap;

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
    pub positional: Vec<String>,
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
    pub fn raw(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether the switch `--name` was given.
    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// The value of `--name` parsed by `parse`, or `default`; a refusal names the flag and
    /// what it accepts.
    pub fn get<T>(
        &self,
        name: &str,
        default: T,
        accepts: &str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Result<T, String> {
        match self.values.get(name) {
            None => Ok(default),
            Some(v) => parse(v).ok_or_else(|| format!("--{name} {v:?} is invalid: it accepts {accepts}")),
        }
    }
}

/// `--gb F` as bytes, rounded up to whole pages.
pub fn gib_bytes(gb: f64) -> usize {
    ((gb * (1u64 << 30) as f64) as usize).next_multiple_of(zerofault::sys::mman::PAGE_SIZE)
}

/// A list of integers in `lo..=hi`: `1,2,4`, `1..4` (every integer from 1 to 4) or a mix
/// (`1..3,8`); each value once, at most 256 entries.
pub fn int_list(lo: u64, hi: u64) -> impl Fn(&str) -> Option<Vec<usize>> {
    move |s| {
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

/// A positive float, finite.
pub fn positive_f64(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0)
}

/// An integer in `lo..=hi`.
pub fn int_in(lo: u64, hi: u64) -> impl Fn(&str) -> Option<u64> {
    move |s| s.trim().parse::<u64>().ok().filter(|v| (lo..=hi).contains(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: Spec = Spec {
        command: "t",
        flags: &[("gb", true), ("quiet", false)],
        positional: true,
    };

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

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
