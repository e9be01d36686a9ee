//! `bench --procs N`: N bench processes at once, each running the same sweep, each timed
//! run of every process started together. Several processes under the shim share the machine
//! the way a build farm's or a server's do; what matters to the user is the slowest one.
//!
//! The parent starts N copies of itself (`zerofault bench`, the same flags, JSON out) with
//! [`SYNC_ENV`] set; before each timed run a child says [`READY`] on stderr and waits for a
//! line on stdin, which the parent writes to all of them once all are ready. So the timed
//! parts of the processes start together, each in the same mode (setup, such as the engine's
//! prefill, comes before), and the modes still alternate rep by rep.
//! The parent prints each process's wall (median over its reps) per mode, the slowest, and the
//! slowest's ratio to native's slowest (above 1: faster than native).

use crate::bench::{BenchArgs, Format, Point};
use crate::progress::Progress;
use crate::sys::Hogs;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;

/// Set in a child: wait for the parent before each timed run.
pub(crate) const SYNC_ENV: &str = "ZEROFAULT_BENCH_SYNC";
/// What a child writes on stderr when it is ready for its next timed run.
const READY: &str = "zerofault-bench-sync: ready";

/// In a child of `--procs`: says ready and waits for the go (a line on stdin), right before
/// a timed part (after its setup: an engine's prefill, the floor's populate). Elsewhere returns
/// at once. A parent gone away (stdin closed) lets it run on; its output then goes nowhere.
pub(crate) fn wait_for_go() {
    if std::env::var_os(SYNC_ENV).is_none() {
        return;
    }
    eprintln!("{READY}");
    let _ = std::io::stdin().read_line(&mut String::new());
}

struct Proc {
    child: Child,
    stdin: ChildStdin,
    /// Lines of its stderr, as they come; the channel closes when it ends.
    lines: mpsc::Receiver<String>,
    /// Its stderr other than the handshakes.
    said: Vec<String>,
    stdout: std::thread::JoinHandle<String>,
}

impl Proc {
    fn start(args: &[String]) -> Result<Proc, String> {
        let exe = std::env::current_exe().map_err(|e| format!("--procs: {e}"))?;
        let mut child = Command::new(exe)
            .arg("bench")
            .args(args)
            .env(SYNC_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("--procs: starting a bench process: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let mut out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        Ok(Proc {
            child,
            stdin,
            lines,
            said: vec![],
            stdout,
        })
    }

    /// Waits for its next READY; false when it ended first.
    fn ready(&mut self) -> bool {
        while let Ok(l) = self.lines.recv() {
            if l == READY {
                return true;
            }
            self.said.push(l);
        }
        false
    }

    /// Its JSON, once it ended well; else its stderr, as an error.
    fn finish(mut self, i: usize) -> Result<Value, String> {
        drop(self.stdin);
        let status = self.child.wait().map_err(|e| format!("--procs: {e}"))?;
        self.said.extend(self.lines.iter().filter(|l| l != READY));
        let out = self.stdout.join().unwrap_or_default();
        if !status.success() {
            return Err(format!(
                "--procs: process {} failed ({status}): {}",
                i + 1,
                self.said.join(" | ")
            ));
        }
        serde_json::from_str(&out).map_err(|e| format!("--procs: process {}: its JSON: {e}", i + 1))
    }
}

/// One mode at one point, over the processes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    pub(crate) at: Point,
    pub(crate) mode: String,
    /// Each process's median wall, in seconds.
    pub(crate) walls: Vec<f64>,
}

impl Row {
    pub(crate) fn slowest(&self) -> f64 {
        self.walls.iter().copied().fold(0.0, f64::max)
    }
}

/// Runs the sweep in `a.procs` processes at once (see the module's docs) and prints the result.
pub(crate) fn run(a: &BenchArgs) -> Result<(), String> {
    crate::bench::preflight(&a.modes)?;
    let progress = Progress::new(a.runs(), a.quiet);
    let rows = measure(a, &progress)?;
    drop(progress);
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&to_json(a, &rows)).expect("JSON")),
        _ => print!("{}", table(a, &rows)),
    }
    Ok(())
}

/// The flags of `a`'s sweep as `zerofault bench` takes them, without what the parent keeps
/// (`--procs`, `--busy`, `--format`, `--plot`, `--quiet`).
pub(crate) fn flags(a: &BenchArgs) -> Vec<String> {
    let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let mut f = vec![
        "--gb".into(),
        crate::output::gb_text(a.gb),
        "--reps".into(),
        a.reps.to_string(),
        "--threads".into(),
        list(&a.threads),
        "--cachelines".into(),
        list(&a.cachelines),
        "--pattern".into(),
        a.pattern.name(),
        "--touch".into(),
        a.touch.to_string(),
        "--mode".into(),
        a.modes
            .iter()
            .map(crate::bench::Mode::name)
            .collect::<Vec<_>>()
            .join(","),
    ];
    if a.loops > 1 {
        f.extend(["--loop".into(), a.loops.to_string()]);
    }
    if a.pin {
        f.push("--pin".into());
    }
    f
}

/// The flags a child of [`measure`] runs with: the sweep's, JSON out, quiet.
pub(crate) fn child_args(a: &BenchArgs) -> Vec<String> {
    let mut f = flags(a);
    f.extend(["--format", "json", "--quiet"].map(String::from));
    f
}

/// The sweep in `a.procs` processes at once; one step of `progress` per timed run.
pub(crate) fn measure(a: &BenchArgs, progress: &Progress) -> Result<Vec<Row>, String> {
    crate::bench::check_memory(a)?;
    let _hogs = Hogs::start(a.busy).map_err(|e| format!("--busy: starting a CPU hog: {e}"))?;
    let args = child_args(a);
    let mut procs = (0..a.procs)
        .map(|_| Proc::start(&args))
        .collect::<Result<Vec<_>, _>>()?;
    for _ in 0..a.runs() {
        if !procs.iter_mut().all(Proc::ready) {
            break; // one ended early: its error comes below
        }
        for p in &mut procs {
            // A child that went away is reported by finish().
            let _ = p.stdin.write_all(b"go\n").and_then(|()| p.stdin.flush());
        }
        progress.step();
    }
    let results = procs
        .into_iter()
        .enumerate()
        .map(|(i, p)| p.finish(i))
        .collect::<Result<Vec<_>, _>>()?;
    gather(&results)
}

/// Each process's rows, matched by point and mode (the first process's order).
pub(crate) fn gather(results: &[Value]) -> Result<Vec<Row>, String> {
    let rows_of = |v: &Value| -> Result<Vec<(Point, String, f64)>, String> {
        let rows = v["rows"].as_array().ok_or("--procs: a process printed no rows")?;
        rows.iter()
            .map(|r| {
                let n = |k: &str| r[k].as_u64().map(|x| x as usize);
                match (n("threads"), n("cachelines"), r["mode"].as_str(), r["wall_s"].as_f64()) {
                    (Some(threads), Some(cachelines), Some(mode), Some(wall)) => {
                        Ok((Point { threads, cachelines }, mode.to_string(), wall))
                    }
                    _ => Err(format!(
                        "--procs: a row without threads, cachelines, mode or wall_s: {r}"
                    )),
                }
            })
            .collect()
    };
    let all = results.iter().map(rows_of).collect::<Result<Vec<_>, _>>()?;
    let first = all.first().ok_or("--procs: no process")?;
    first
        .iter()
        .map(|(at, mode, _)| {
            let walls = all
                .iter()
                .map(|rows| {
                    rows.iter()
                        .find(|(p, m, _)| p == at && m == mode)
                        .map(|r| r.2)
                        .ok_or_else(|| format!("--procs: a process has no {mode} row"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Row {
                at: *at,
                mode: mode.clone(),
                walls,
            })
        })
        .collect()
}

/// Native's slowest over this row's slowest at the same point (above 1: faster than native).
pub(crate) fn ratio(rows: &[Row], r: &Row) -> Option<f64> {
    let native = rows.iter().find(|n| n.at == r.at && n.mode == "native")?;
    Some(native.slowest() / r.slowest())
}

pub(crate) fn table(a: &BenchArgs, rows: &[Row]) -> String {
    let mut s = format!(
        "{} processes at once, each: {}\n\n",
        a.procs,
        crate::output::run_line(a)
    );
    let heads: Vec<String> = (1..=a.procs).map(|i| format!("proc {i}")).collect();
    s += &format!(
        "{:>7} {:>5}  {:<24} {}  {:>9}  {}\n",
        "Threads",
        "CLine",
        "mode",
        heads.iter().map(|h| format!("{h:>9}")).collect::<Vec<_>>().join(" "),
        "slowest",
        "slowest vs native's"
    );
    for r in rows {
        s += &format!(
            "{:>7} {:>5}  {:<24} {}  {:>8.3}s  {}\n",
            r.at.threads,
            r.at.cachelines,
            r.mode,
            r.walls
                .iter()
                .map(|w| format!("{w:>8.3}s"))
                .collect::<Vec<_>>()
                .join(" "),
            r.slowest(),
            ratio(rows, r).map_or("-".into(), |x| format!("{x:.2}x"))
        );
    }
    s += "\nwall: each process's median over its reps; each timed run of every process started together\n";
    s
}

pub(crate) fn to_json(a: &BenchArgs, rows: &[Row]) -> Value {
    json!({
        "procs": a.procs,
        "busy": a.busy,
        "gb": a.gb,
        "reps": a.reps,
        "loops": a.loops,
        "pattern": a.pattern.name(),
        "rows": rows.iter().map(|r| json!({
            "mode": r.mode,
            "threads": r.at.threads,
            "cachelines": r.at.cachelines,
            "wall_s": r.walls,
            "slowest_s": r.slowest(),
            "ratio_to_native": ratio(rows, r),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_child_gets_the_flags_less_the_parents_own() {
        let a = crate::bench::parse(&args(
            "--gb 0.5 --procs 4 --loop 10 --busy=2 --format json --quiet --mode native,engine --pin --threads 1,2",
        ))
        .unwrap();
        let c = child_args(&a);
        assert_eq!(
            c,
            args(
                "--gb 0.5 --reps 3 --threads 1,2 --cachelines 1 --pattern seq --touch 1 \
                 --mode native,engine --loop 10 --pin --format json --quiet"
            )
        );
        // What a child is given parses back to the same sweep, less the parent's own flags.
        let back = crate::bench::parse(&c).unwrap();
        assert_eq!(
            (back.threads, back.loops, back.pin, back.gb),
            (a.threads, a.loops, a.pin, a.gb)
        );
        assert_eq!((back.modes, back.procs, back.busy), (a.modes, 1, 0));
    }

    #[test]
    fn rows_are_matched_by_point_and_mode_and_the_slowest_compared() {
        let proc_json = |walls: [f64; 2]| {
            json!({"rows": [
                {"mode": "native", "threads": 1, "cachelines": 1, "wall_s": walls[0]},
                {"mode": "engine", "threads": 1, "cachelines": 1, "wall_s": walls[1]},
            ]})
        };
        let rows = gather(&[proc_json([2.0, 1.0]), proc_json([3.0, 0.5])]).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].walls, [2.0, 3.0]);
        assert_eq!(rows[1].walls, [1.0, 0.5]);
        assert_eq!(ratio(&rows, &rows[1]), Some(3.0));
        assert_eq!(ratio(&rows, &rows[0]), Some(1.0));
        let e = gather(&[proc_json([1.0, 1.0]), json!({"rows": []})]).unwrap_err();
        assert!(e.contains("no native row"), "{e}");
        assert!(gather(&[json!({})]).unwrap_err().contains("no rows"));
    }
}
