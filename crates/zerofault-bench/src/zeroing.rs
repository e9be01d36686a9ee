//! `zerofault bench-zero`: how fast each zeroing method of the engine ([`ZeroMethod`]) zeroes
//! memory on this machine, in 4 KiB and 2 MiB calls (one call is one batch: the non-temporal
//! methods fence once per call), on cold memory (1 GiB, far beyond the caches) and on cached
//! memory (16 MiB written just before). Seed 003's rule is that cold memory wants stores that
//! bypass the caches and cached memory wants temporal ones; this table says where that holds
//! here. Every result is checked to read zero.

use crate::sys::{Mapping, Thp};
use std::time::{Duration, Instant};
use zerofault::ZeroMethod;

const COLD: usize = 1 << 30;
const CACHED: usize = 16 << 20;
/// Passes over the cold buffer (the median is shown), and over the cached one (summed).
const COLD_PASSES: usize = 3;
const CACHED_PASSES: usize = 32;

/// One method at one call size.
struct Row {
    method: &'static str,
    variant: &'static str,
    chunk: usize,
    cold_gbs: f64,
    cached_gbs: f64,
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
pub fn run_bench_zero(rest: &[String]) -> Result<(), String> {
    if let Some(a) = rest.first() {
        return Err(format!("zerofault bench-zero: unknown argument {a}; it takes none"));
    }
    let map = |len| Mapping::new(len, Thp::Never).map_err(|e| format!("zerofault bench-zero: mmap: {e}"));
    let (cold, cached) = (map(COLD)?, map(CACHED)?);
    let fill = |p: *mut u8, len: usize| {
        // SAFETY: our own mapping.
        unsafe { std::ptr::write_bytes(p, 0x5a, len) }
    };
    let mut rows = vec![];
    for m in ZeroMethod::ALL {
        let variant = match m.available() {
            Ok(v) => v,
            Err(why) => {
                println!("{:<7} not measured: {why}", m.name());
                continue;
            }
        };
        for chunk in [4096, 2 << 20] {
            let mut cold_t = vec![];
            for _ in 0..COLD_PASSES {
                fill(cold.as_ptr(), COLD);
                cold_t.push(zero_in_chunks(m, cold.as_ptr(), COLD, chunk)?);
                check_zero(cold.as_ptr(), COLD, m.name())?;
            }
            cold_t.sort();
            let mut cached_t = Duration::ZERO;
            for _ in 0..CACHED_PASSES {
                fill(cached.as_ptr(), CACHED);
                cached_t += zero_in_chunks(m, cached.as_ptr(), CACHED, chunk)?;
                check_zero(cached.as_ptr(), CACHED, m.name())?;
            }
            rows.push(Row {
                method: m.name(),
                variant,
                chunk,
                cold_gbs: gbs(COLD, cold_t[COLD_PASSES / 2]),
                cached_gbs: gbs(CACHED * CACHED_PASSES, cached_t),
            });
        }
    }
    print!("{}", table(&rows));
    Ok(())
}

/// The rows as text, each with its ratio to `stosb` at the same call size.
fn table(rows: &[Row]) -> String {
    let stosb = |chunk: usize| rows.iter().find(|r| r.method == "stosb" && r.chunk == chunk);
    let mut s = format!(
        "{:<7} {:<34} {:>6} {:>10} {:>12} {:>12} {:>14}\n",
        "method", "variant", "call", "cold GB/s", "cached GB/s", "cold/stosb", "cached/stosb"
    );
    for r in rows {
        let ratio = |x: f64, base: Option<f64>| base.map_or("-".to_string(), |b| format!("{:.2}x", x / b));
        let base = stosb(r.chunk);
        s += &format!(
            "{:<7} {:<34} {:>6} {:>10.2} {:>12.2} {:>12} {:>14}\n",
            r.method,
            r.variant,
            if r.chunk == 4096 { "4K" } else { "2M" },
            r.cold_gbs,
            r.cached_gbs,
            ratio(r.cold_gbs, base.map(|b| b.cold_gbs)),
            ratio(r.cached_gbs, base.map(|b| b.cached_gbs)),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_each_method_its_ratio_to_stosb_at_the_same_call_size() {
        let row = |method, chunk, cold_gbs, cached_gbs| Row {
            method,
            variant: "v",
            chunk,
            cold_gbs,
            cached_gbs,
        };
        let t = table(&[
            row("stosb", 4096, 4.0, 20.0),
            row("nt", 4096, 10.0, 10.0),
            row("nt", 2 << 20, 12.0, 9.0),
        ]);
        let nt4k = t.lines().find(|l| l.starts_with("nt") && l.contains(" 4K ")).unwrap();
        assert!(nt4k.contains("2.50x") && nt4k.contains("0.50x"), "{t}");
        let nt2m = t.lines().find(|l| l.contains(" 2M ")).unwrap();
        assert!(nt2m.ends_with('-'), "no stosb row at 2M to compare with: {t}");
    }
}
