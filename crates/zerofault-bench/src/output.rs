//! The forms `zerofault bench` prints its rows in: pft's table, JSON and CSV. Each starts with
//! the machine: kernel, CPU, cores, page size, THP and mTHP settings.

use crate::bench::{native_at, BenchArgs, Point, Row};
use crate::machine::Machine;
use serde_json::{json, Value};
use zerofault::Snapshot;

pub(crate) fn gb_text(gb: f64) -> String {
    if gb.fract() == 0.0 {
        format!("{gb:.0}")
    } else {
        format!("{gb}")
    }
}

/// `fault/wsec` of `r` over the native row at its point.
pub(crate) fn ratio(rows: &[Row], r: &Row) -> Option<f64> {
    native_at(rows, r.at).map(|n| r.fault_per_wsec / n.fault_per_wsec)
}

/// The ratio table: the modes other than native, and per point one `1.23x` cell each (`-`
/// where a mode or the native row is missing). Points in the order of the rows.
pub(crate) fn ratio_grid(rows: &[Row]) -> (Vec<String>, Vec<(Point, Vec<String>)>) {
    let others: Vec<String> = modes(rows).into_iter().filter(|m| m != "native").collect();
    let mut points: Vec<Point> = rows.iter().map(|r| r.at).collect();
    points.dedup();
    let grid = points
        .into_iter()
        .map(|at| {
            let cells = others
                .iter()
                .map(|m| {
                    rows.iter()
                        .find(|r| r.at == at && &r.mode.name() == m)
                        .and_then(|r| ratio(rows, r))
                        .map_or("-".into(), |x| format!("{x:.2}x"))
                })
                .collect();
            (at, cells)
        })
        .collect();
    (others, grid)
}

/// Modes in the order of their first row.
pub(crate) fn modes(rows: &[Row]) -> Vec<String> {
    distinct(rows.iter().map(|r| r.mode.name()))
}

/// The values in the order they first appear, each once.
pub(crate) fn distinct<T: PartialEq>(v: impl Iterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = vec![];
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// What the run was: size, pattern, touch, reps.
pub(crate) fn run_line(a: &BenchArgs) -> String {
    format!(
        "{} GiB per run, pattern {}, touch {}, {} reps{}{}{}: medians, wall min..max over the reps",
        gb_text(a.gb),
        a.pattern.name(),
        a.touch,
        a.reps,
        if a.pin { ", threads pinned round-robin" } else { "" },
        match a.busy {
            0 => String::new(),
            n => format!(
                ", beside {n} CPU hog{} at normal priority",
                if n == 1 { "" } else { "s" }
            ),
        },
        if a.loops > 1 {
            format!(
                ", each thread allocating, touching and freeing its share {} times (native frees with munmap, the engine recycles; scrub CPU counted)",
                a.loops
            )
        } else {
            String::new()
        }
    )
}

pub(crate) const TABLE_HEADER: [&str; 11] = [
    "Gb",
    "Rep",
    "Threads",
    "CLine",
    "User",
    "System",
    "Wall",
    "flt/cpu/s",
    "fault/wsec",
    "wall-min..max",
    "mode",
];

/// pft's table: one per mode (header once each, the seeds' column order: seed 003 adds CLine
/// after Threads), then fault/wsec relative to native, then the pool fills and warnings.
pub(crate) fn table(a: &BenchArgs, m: &Machine, rows: &[Row]) -> String {
    let h = TABLE_HEADER;
    let mut s = format!("# zerofault bench | {}\n# {}\n", m.line(), run_line(a));
    for mode in modes(rows) {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.mode.name() == mode).collect();
        s += &format!("\n{mode}: {}\n", mine[0].mode.base.about());
        s += &format!(
            "{:>4} {:>3} {:>7} {:>5} {:>9} {:>10} {:>8} {:>11} {:>11} {:>15}  {}\n",
            h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10]
        );
        for r in mine {
            s += &format!(
                "{:>4} {:>3} {:>7} {:>5} {:>8.3}s {:>9.3}s {:>7.3}s {:>11.1} {:>11.1} {:>15}  {}\n",
                gb_text(a.gb),
                a.reps,
                r.at.threads,
                r.at.cachelines,
                r.user,
                r.sys,
                r.wall,
                r.flt_per_cpu_s,
                r.fault_per_wsec,
                format!("{:.3}..{:.3}s", r.wall_min, r.wall_max),
                mode
            );
        }
    }
    let (others, grid) = ratio_grid(rows);
    if rows.iter().any(|r| r.mode.is_native()) && !others.is_empty() {
        s += "\nfault/wsec relative to native (native = 1.00x):\n";
        s += &format!("{:>7} {:>5}", "Threads", "CLine");
        for m in &others {
            s += &format!(" {:>w$}", m, w = m.len().max(7));
        }
        s += "\n";
        for (at, cells) in grid {
            s += &format!("{:>7} {:>5}", at.threads, at.cachelines);
            for (m, cell) in others.iter().zip(cells) {
                s += &format!(" {:>w$}", cell, w = m.len().max(7));
            }
            s += "\n";
        }
    }
    let mut notes = String::new();
    for mode in modes(rows) {
        let fills: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.mode.name() == mode)
            .filter_map(|r| r.fill)
            .collect();
        if !fills.is_empty() {
            notes += &format!(
                "{mode}: pool filled before each timed run, not in the rows: wall {}, cpu {}\n",
                span(fills.iter().map(|f| f.0)),
                span(fills.iter().map(|f| f.1))
            );
        }
    }
    // Several NUMA nodes: what each node's pool gave during the last rep (pages), and its
    // level after it, one line per node.
    for r in rows.iter().filter(|r| !r.nodes.is_empty()) {
        for n in &r.nodes {
            notes += &format!(
                "{} threads={}: node {}: hit {}, miss {}, foreign {}, interleave {} pages; pool {} MiB ready{}\n",
                r.mode.name(),
                r.at.threads,
                n.node,
                n.hit,
                n.miss,
                n.foreign,
                n.interleave_hit,
                n.ready_pages / 256,
                if n.low { " (node below its low mark)" } else { "" }
            );
        }
    }
    for r in rows.iter().filter(|r| r.spread_warning()) {
        notes += &format!(
            "warning: {} threads={} cachelines={}: wall varied {:.3}s..{:.3}s over the reps (more than 25%)\n",
            r.mode.name(),
            r.at.threads,
            r.at.cachelines,
            r.wall_min,
            r.wall_max
        );
    }
    if !notes.is_empty() {
        s += "\n";
        s += &notes;
    }
    s
}

/// `0.384s`, or `0.380..0.390s` when the values differ.
fn span(v: impl Iterator<Item = f64>) -> String {
    let v: Vec<f64> = v.collect();
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(0.0, f64::max);
    if format!("{lo:.3}") == format!("{hi:.3}") {
        format!("{lo:.3}s")
    } else {
        format!("{lo:.3}..{hi:.3}s")
    }
}

/// Seconds to the nanosecond, rates to a tenth: no float noise in the files.
fn secs(v: f64) -> Value {
    json!((v * 1e9).round() / 1e9)
}

fn rate(v: f64) -> Value {
    json!((v * 10.0).round() / 10.0)
}

/// One row's fields, in the order of the CSV columns (engine stats apart).
fn fields(a: &BenchArgs, rows: &[Row], r: &Row) -> Vec<(&'static str, Value)> {
    vec![
        ("mode", json!(r.mode.name())),
        ("base", json!(r.mode.base.name())),
        (
            "knobs",
            json!(r
                .mode
                .knobs
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(":")),
        ),
        ("gb", json!(a.gb)),
        ("reps", json!(a.reps)),
        ("threads", json!(r.at.threads)),
        ("cachelines", json!(r.at.cachelines)),
        ("pattern", json!(a.pattern.name())),
        ("touch", json!(a.touch)),
        ("pin", json!(a.pin)),
        ("loops", json!(a.loops)),
        ("busy", json!(a.busy)),
        ("user_s", secs(r.user)),
        ("sys_s", secs(r.sys)),
        ("wall_s", secs(r.wall)),
        ("wall_s_min", secs(r.wall_min)),
        ("wall_s_max", secs(r.wall_max)),
        ("wall_spread_warning", json!(r.spread_warning())),
        ("pages", json!(r.pages)),
        ("flt_per_cpu_s", rate(r.flt_per_cpu_s)),
        ("fault_per_wsec", rate(r.fault_per_wsec)),
        (
            "ratio_to_native",
            json!(ratio(rows, r).map(|x| (x * 1e4).round() / 1e4)),
        ),
        ("pool_fill_wall_s", r.fill.map_or(Value::Null, |f| secs(f.0))),
        ("pool_fill_cpu_s", r.fill.map_or(Value::Null, |f| secs(f.1))),
    ]
}

/// `{"machine": {...}, "rows": [...]}`; each row carries the fields of the table plus the
/// engine's counters of its last rep (`engine_stats`, null for kernel modes).
pub(crate) fn json(a: &BenchArgs, m: &Machine, rows: &[Row]) -> Value {
    json!({
        "machine": m.json(),
        "rows": rows.iter().map(|r| {
            let mut o: serde_json::Map<String, Value> =
                fields(a, rows, r).into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            o.insert(
                "engine_stats".into(),
                r.stats.as_ref().map_or(Value::Null, |st| serde_json::from_str(&st.to_json()).expect("stats JSON")),
            );
            Value::Object(o)
        }).collect::<Vec<_>>(),
    })
}

fn csv_cell(v: &Value) -> String {
    let s = match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// The machine as a `#` comment line, then a header row and one row per line; engine counters
/// are `engine_<name>` columns (empty for kernel modes), window orders space-separated.
pub(crate) fn csv(a: &BenchArgs, m: &Machine, rows: &[Row]) -> String {
    let mut s = format!("# zerofault bench | {}\n", m.line());
    let stat_names: Vec<String> = Snapshot::DOCS
        .iter()
        .map(|(n, _)| format!("engine_{n}"))
        .chain(["engine_window_order".to_string()])
        .collect();
    // The names do not depend on the row.
    let mut head: Vec<String> = fields(a, rows, &rows[0]).iter().map(|(k, _)| k.to_string()).collect();
    head.extend(stat_names);
    s += &head.join(",");
    s += "\n";
    for r in rows {
        let mut cells: Vec<String> = fields(a, rows, r).iter().map(|(_, v)| csv_cell(v)).collect();
        match &r.stats {
            Some(st) => {
                cells.extend(st.fields().iter().map(|(_, v)| v.to_string()));
                cells.push(st.window_order.iter().map(u64::to_string).collect::<Vec<_>>().join(" "));
            }
            None => cells.extend(std::iter::repeat_n(String::new(), Snapshot::DOCS.len() + 1)),
        }
        s += &cells.join(",");
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::parse;
    use crate::fixtures::{args, machine, row};

    fn rows() -> Vec<Row> {
        vec![
            row("native", 1, 1, 1.0),
            row("engine", 1, 1, 0.1),
            row("engine-cold:pool=off", 1, 1, 0.5),
            row("native", 2, 1, 0.5),
            row("engine", 2, 1, 0.1),
            row("engine-cold:pool=off", 2, 1, 0.25),
        ]
    }

    #[test]
    fn table_layout_header_once_per_mode_seed_columns_then_ratios() {
        let a = parse(&args("--reps 3 --threads 1,2")).unwrap();
        let t = table(&a, &machine(), &rows());
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("# zerofault bench | Linux 6.8.0 | Test CPU | 2 CPUs"),
            "{t}"
        );
        assert_eq!(
            lines[1],
            "# 1 GiB per run, pattern seq, touch 1, 3 reps: medians, wall min..max over the reps"
        );
        let headers: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].trim_start().starts_with("Gb "))
            .collect();
        assert_eq!(headers.len(), 3, "one header per mode: {t}");
        assert_eq!(lines[headers[0] - 1], "native: kernel 4 KiB faults (MADV_NOHUGEPAGE)");
        assert_eq!(lines[headers[0]].split_whitespace().collect::<Vec<_>>(), TABLE_HEADER);
        assert_eq!(
            lines[headers[0] + 1].split_whitespace().collect::<Vec<_>>(),
            [
                "1",
                "3",
                "1",
                "1",
                "0.100s",
                "0.200s",
                "1.000s",
                "3333.3",
                "1000.0",
                "1.000..1.100s",
                "native"
            ]
        );
        assert_eq!(
            lines[headers[0] + 2].split_whitespace().nth(2),
            Some("2"),
            "threads=2 row next"
        );
        assert_eq!(
            lines[headers[2] + 1].split_whitespace().last(),
            Some("engine-cold:pool=off"),
            "variant rows named by their knobs"
        );
        let r = t.find("fault/wsec relative to native").expect(&t);
        let ratios: Vec<Vec<&str>> = t[r..]
            .lines()
            .skip(1)
            .take(3)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(ratios[0], ["Threads", "CLine", "engine", "engine-cold:pool=off"]);
        assert_eq!(ratios[1], ["1", "1", "10.00x", "2.00x"]);
        assert_eq!(ratios[2], ["2", "1", "5.00x", "2.00x"]);
        assert!(t.contains("engine: pool filled before each timed run, not in the rows: wall 0.400s, cpu 0.390s"));
        assert!(!t.contains("warning"), "10% spread is no warning");
        let mut noisy = rows();
        noisy[1].wall_max = noisy[1].wall_min * 1.3;
        let t = table(&a, &machine(), &noisy);
        assert!(
            t.contains("warning: engine threads=1 cachelines=1: wall varied 0.100s..0.130s"),
            "{t}"
        );
        assert!(!t.contains("node 0:"), "one node: no per-node line");
        // Several nodes: one line per node of each engine row.
        let mut numa = rows();
        numa[1].nodes = vec![
            zerofault::NodePool {
                node: 0,
                ready_pages: 512,
                hit: 100,
                miss: 0,
                foreign: 7,
                interleave_hit: 0,
                low: true,
            },
            zerofault::NodePool {
                node: 1,
                ready_pages: 256,
                hit: 50,
                miss: 7,
                foreign: 0,
                interleave_hit: 3,
                low: false,
            },
        ];
        let t = table(&a, &machine(), &numa);
        assert!(
            t.contains("engine threads=1: node 0: hit 100, miss 0, foreign 7, interleave 0 pages; pool 2 MiB ready (node below its low mark)"),
            "{t}"
        );
        assert!(
            t.contains("engine threads=1: node 1: hit 50, miss 7, foreign 0, interleave 3 pages; pool 1 MiB ready\n"),
            "{t}"
        );
    }

    #[test]
    fn json_schema_machine_and_rows() {
        let a = parse(&args("--threads 1,2")).unwrap();
        let j = json(&a, &machine(), &rows());
        for k in [
            "kernel",
            "cpu",
            "cpus",
            "page_size",
            "thp_enabled",
            "thp_defrag",
            "mthp",
        ] {
            assert!(j["machine"].get(k).is_some(), "machine.{k}");
        }
        let r = &j["rows"];
        assert_eq!(r.as_array().unwrap().len(), 6);
        for k in [
            "mode",
            "base",
            "knobs",
            "gb",
            "reps",
            "threads",
            "cachelines",
            "pattern",
            "touch",
            "pin",
            "user_s",
            "sys_s",
            "wall_s",
            "wall_s_min",
            "wall_s_max",
            "wall_spread_warning",
            "pages",
            "flt_per_cpu_s",
            "fault_per_wsec",
            "ratio_to_native",
            "pool_fill_wall_s",
            "pool_fill_cpu_s",
            "engine_stats",
        ] {
            assert!(r[0].get(k).is_some() && r[5].get(k).is_some(), "{k}");
        }
        assert_eq!(r[1]["mode"], "engine");
        assert_eq!(r[1]["fault_per_wsec"], 10000.0);
        assert_eq!(r[1]["ratio_to_native"], 10.0);
        assert_eq!(r[1]["pool_fill_wall_s"], 0.4);
        assert_eq!(r[1]["engine_stats"]["pages_moved"], 1000);
        assert!(r[0]["engine_stats"].is_null() && r[0]["pool_fill_wall_s"].is_null());
        assert_eq!(
            (r[5]["base"].as_str(), r[5]["knobs"].as_str()),
            (Some("engine-cold"), Some("pool=off"))
        );
        assert_eq!(r[3]["threads"], 2);
    }

    #[test]
    fn csv_schema_comment_header_and_rows() {
        let a = parse(&args("--threads 1,2")).unwrap();
        let c = csv(&a, &machine(), &rows());
        let lines: Vec<&str> = c.lines().collect();
        assert!(lines[0].starts_with("# zerofault bench | Linux 6.8.0"));
        let head: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(
            &head[..7],
            ["mode", "base", "knobs", "gb", "reps", "threads", "cachelines"]
        );
        assert!(head.contains(&"fault_per_wsec") && head.contains(&"engine_pages_moved"));
        assert_eq!(head.last(), Some(&"engine_window_order"));
        assert_eq!(lines.len(), 2 + 6);
        for l in &lines[2..] {
            assert_eq!(l.split(',').count(), head.len(), "{l}");
        }
        let cell = |row: usize, col: &str| {
            lines[2 + row]
                .split(',')
                .nth(head.iter().position(|h| *h == col).unwrap())
        };
        assert_eq!(cell(1, "mode"), Some("engine"));
        assert_eq!(cell(1, "ratio_to_native"), Some("10.0"));
        assert_eq!(cell(1, "engine_pages_moved"), Some("1000"));
        assert_eq!(cell(0, "engine_pages_moved"), Some(""));
        assert_eq!(csv_cell(&json!("a,b")), "\"a,b\"");
    }
}
