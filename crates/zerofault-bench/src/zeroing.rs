//! `zerofault bench-zero`: how fast each zeroing method of the engine ([`ZeroMethod`]) zeroes
//! memory on this machine, in 4 KiB and 2 MiB calls (one call is one batch: the non-temporal
//! methods fence once per call), on cold memory (1 GiB, far beyond the caches) and on cached
//! memory (16 MiB written just before). Seed 003's rule is that cold memory wants stores that
//! bypass the caches and cached memory wants temporal ones; this table says where that holds
//! here. Every result is checked to read zero.

use crate::sys::{Mapping, Thp};
use std::time::{Duration, Instant};
use zerofault::ZeroMethod;

/// The cold buffer of `bench-zero`: far beyond the caches.
pub(crate) const COLD: usize = 1 << 30;
const CACHED: usize = 16 << 20;
/// Passes over the cold buffer (the median is shown), and over the cached one (summed).
const COLD_PASSES: usize = 3;
const CACHED_PASSES: usize = 32;

/// One method at one call size.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    pub(crate) method: &'static str,
    pub(crate) variant: &'static str,
    pub(crate) chunk: usize,
    pub(crate) cold_gbs: f64,
    pub(crate) cached_gbs: f64,
}

/// What `bench-zero` measured: a row per available method and call size, and for each method
/// the machine lacks, why; `error` if the measuring stopped (the rows before it stand).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Table {
    pub(crate) rows: Vec<Row>,
    pub(crate) missing: Vec<(&'static str, String)>,
    /// Bytes of the cold buffer.
    pub(crate) cold_bytes: usize,
    pub(crate) error: Option<String>,
}

/// Zeroes `[p, p + len)` in calls of `chunk` bytes with `m`; the time it took.
fn zero_in_chunks(m: ZeroMethod, p: *mut u8, len: usize, chunk: usize) -> Result<Duration, String> {
    let t0 = Instant::now();
    for off in (0..len).step_by(chunk) {
        // SAFETY: inside our own mapping, page aligned; the method is available (checked).
        unsafe { m.zero(p.add(off), chunk.min(len - off)) }.map_err(|e| format!("{}: {e}", m.name()))?;
    }
    Ok(t0.elapsed())
}

fn check_zero(p: *mut u8, len: usize, what: &str) -> Result<(), String> {
    // SAFETY: our own mapping, read after the zeroing returned (and fenced).
    let s = unsafe { std::slice::from_raw_parts(p, len) };
    if zerofault::is_zero(s) {
        Ok(())
    } else {
        Err(format!("zerofault bench-zero: {what} left non-zero bytes"))
    }
}

fn gbs(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

/// `zerofault bench-zero`: the table of every available method; one line for each method the
/// machine lacks.
///
/// # Context
/// The command's main thread.
pub fn run_bench_zero() -> Result<(), String> {
    let t = measure(COLD);
    print!("{}", t.text());
    t.error.map_or(Ok(()), Err)
}

/// Measures every method the machine has on a cold buffer of `cold` bytes (about half a
/// minute at 1 GiB: each pass writes it twice). A failure ends the measuring and is kept in
/// the table's `error`, so that a report still writes everything else.
pub(crate) fn measure(cold: usize) -> Table {
    let mut t = Table {
        cold_bytes: cold,
        ..Table::default()
    };
    if let Err(e) = measure_into(&mut t) {
        t.error = Some(e);
    }
    t
}

fn measure_into(t: &mut Table) -> Result<(), String> {
    let cold_len = t.cold_bytes;
    let map = |len| Mapping::new(len, Thp::Never).map_err(|e| format!("zerofault bench-zero: mmap: {e}"));
    let (cold, cached) = (map(cold_len)?, map(CACHED)?);
    let fill = |p: *mut u8, len: usize| {
        // SAFETY: our own mapping.
        unsafe { std::ptr::write_bytes(p, 0x5a, len) }
    };
    for m in ZeroMethod::ALL {
        let variant = match m.available() {
            Ok(v) => v,
            Err(why) => {
                t.missing.push((m.name(), why.to_string()));
                continue;
            }
        };
        for chunk in [4096, 2 << 20] {
            let mut cold_t = vec![];
            for _ in 0..COLD_PASSES {
                fill(cold.as_ptr(), cold_len);
                cold_t.push(zero_in_chunks(m, cold.as_ptr(), cold_len, chunk)?);
                check_zero(cold.as_ptr(), cold_len, m.name())?;
            }
            cold_t.sort();
            let mut cached_t = Duration::ZERO;
            for _ in 0..CACHED_PASSES {
                fill(cached.as_ptr(), CACHED);
                cached_t += zero_in_chunks(m, cached.as_ptr(), CACHED, chunk)?;
                check_zero(cached.as_ptr(), CACHED, m.name())?;
            }
            t.rows.push(Row {
                method: m.name(),
                variant,
                chunk,
                cold_gbs: gbs(cold_len, cold_t[COLD_PASSES / 2]),
                cached_gbs: gbs(CACHED * CACHED_PASSES, cached_t),
            });
        }
    }
    Ok(())
}

fn call(chunk: usize) -> &'static str {
    if chunk == 4096 {
        "4K"
    } else {
        "2M"
    }
}

impl Table {
    /// `r`'s ratio to `stosb` at the same call size, cold and cached, as text (`-`: no stosb row).
    fn ratios(&self, r: &Row) -> (String, String) {
        let base = self.rows.iter().find(|b| b.method == "stosb" && b.chunk == r.chunk);
        let ratio = |x: f64, b: Option<f64>| b.map_or("-".to_string(), |b| format!("{:.2}x", x / b));
        (
            ratio(r.cold_gbs, base.map(|b| b.cold_gbs)),
            ratio(r.cached_gbs, base.map(|b| b.cached_gbs)),
        )
    }

    /// What `zerofault bench-zero` prints: a line per missing method, then the table.
    pub(crate) fn text(&self) -> String {
        let mut s = String::new();
        for (name, why) in &self.missing {
            s += &format!("{name:<7} not measured: {why}\n");
        }
        s += &format!(
            "{:<7} {:<34} {:>6} {:>10} {:>12} {:>12} {:>14}\n",
            "method", "variant", "call", "cold GB/s", "cached GB/s", "cold/stosb", "cached/stosb"
        );
        for r in &self.rows {
            let (cold, cached) = self.ratios(r);
            s += &format!(
                "{:<7} {:<34} {:>6} {:>10.2} {:>12.2} {:>12} {:>14}\n",
                r.method,
                r.variant,
                call(r.chunk),
                r.cold_gbs,
                r.cached_gbs,
                cold,
                cached,
            );
        }
        if let Some(e) = &self.error {
            s += &format!("measuring stopped: {e}\n");
        }
        s
    }

    /// The report's section body: the table in markdown, then a line per missing method.
    pub(crate) fn markdown(&self) -> String {
        let mut s = String::from(
            "| method | variant | call | cold GB/s | cached GB/s | cold / stosb | cached / stosb |\n\
             |---|---|---|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            let (cold, cached) = self.ratios(r);
            s += &format!(
                "| `{}` | {} | {} | {:.2} | {:.2} | {cold} | {cached} |\n",
                r.method,
                r.variant,
                call(r.chunk),
                r.cold_gbs,
                r.cached_gbs
            );
        }
        if let Some(e) = &self.error {
            s += &format!("\n**Measuring stopped:** {e}\n");
        }
        if !self.missing.is_empty() {
            s += "\nNot measured on this machine:\n\n";
            for (name, why) in &self.missing {
                s += &format!("- `{name}`: {why}\n");
            }
        }
        s
    }

    /// The rows for `benchmarks.json`.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "rows": self.rows.iter().map(|r| serde_json::json!({
                "method": r.method,
                "variant": r.variant,
                "chunk_bytes": r.chunk,
                "cold_gb_per_s": r.cold_gbs,
                "cached_gb_per_s": r.cached_gbs,
            })).collect::<Vec<_>>(),
            "not_measured": self.missing.iter().map(|(name, why)| serde_json::json!({
                "method": name,
                "why": why,
            })).collect::<Vec<_>>(),
            "cold_bytes": self.cold_bytes,
            "error": self.error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(method: &'static str, chunk: usize, cold_gbs: f64, cached_gbs: f64) -> Row {
        Row {
            method,
            variant: "v",
            chunk,
            cold_gbs,
            cached_gbs,
        }
    }

    fn sample() -> Table {
        Table {
            rows: vec![
                row("stosb", 4096, 4.0, 20.0),
                row("nt", 4096, 10.0, 10.0),
                row("nt", 2 << 20, 12.0, 9.0),
            ],
            missing: vec![("dsa", "no idxd work queue".to_string())],
            cold_bytes: 1 << 30,
            error: None,
        }
    }

    #[test]
    fn the_table_gives_each_method_its_ratio_to_stosb_at_the_same_call_size() {
        let t = sample().text();
        assert!(t.starts_with("dsa     not measured: no idxd work queue\n"), "{t}");
        let nt4k = t.lines().find(|l| l.starts_with("nt") && l.contains(" 4K ")).unwrap();
        assert!(nt4k.contains("2.50x") && nt4k.contains("0.50x"), "{t}");
        let nt2m = t.lines().find(|l| l.contains(" 2M ")).unwrap();
        assert!(nt2m.ends_with('-'), "no stosb row at 2M to compare with: {t}");
    }

    #[test]
    fn the_markdown_and_json_carry_the_same_rows_and_missing_methods() {
        let md = sample().markdown();
        assert!(md.contains("| `nt` | v | 4K | 10.00 | 10.00 | 2.50x | 0.50x |"), "{md}");
        assert!(md.contains("| `nt` | v | 2M | 12.00 | 9.00 | - | - |"), "{md}");
        assert!(md.contains("- `dsa`: no idxd work queue"), "{md}");
        let j = sample().json();
        assert_eq!(j["rows"].as_array().unwrap().len(), 3);
        assert_eq!(j["rows"][2]["chunk_bytes"], 2 << 20);
        assert_eq!(j["not_measured"][0]["method"], "dsa");
        assert!(j["error"].is_null());
    }

    #[test]
    fn a_measuring_that_stopped_keeps_its_rows_and_says_why() {
        let t = Table {
            error: Some("zerofault bench-zero: mmap: ENOMEM".into()),
            ..sample()
        };
        let md = t.markdown();
        assert!(
            md.contains("| `nt` | v | 4K |")
                && md.contains("**Measuring stopped:** zerofault bench-zero: mmap: ENOMEM"),
            "{md}"
        );
        assert!(t
            .text()
            .ends_with("measuring stopped: zerofault bench-zero: mmap: ENOMEM\n"));
        assert_eq!(t.json()["error"], "zerofault bench-zero: mmap: ENOMEM");
    }

    #[test]
    fn measuring_a_small_cold_buffer_checks_every_method_it_has() {
        let t = measure(4 << 20);
        assert_eq!(t.error, None);
        assert_eq!(t.cold_bytes, 4 << 20);
        assert!(
            t.rows.iter().any(|r| r.method == "stosb" && r.chunk == 2 << 20),
            "{t:?}"
        );
        assert!(t.rows.iter().all(|r| r.cold_gbs > 0.0 && r.cached_gbs > 0.0), "{t:?}");
    }
}
