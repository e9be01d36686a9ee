//! `ZEROFAULT_STATS=json` and `ZEROFAULT_STATS=<file>`: one JSON object per process that
//! started the engine, and `zerofault stats` adding them up, over a small C project built with
//! `make -j2` under the shim.

mod common;

use common::{run, shim, stderr, stdout, temp_dir, zerofault};
use serde_json::Value;
use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Touches 64 MiB, one byte a page: this process surely serves pages.
const TOUCHER: &str = r#"#include <stdio.h>
#include <stdlib.h>
int main(void) {
    size_t n = 64u << 20;
    volatile char *p = malloc(n);
    if (!p) return 1;
    for (size_t i = 0; i < n; i += 4096) p[i] = 1;
    printf("touched %zu\n", n);
    return 0;
}
"#;

/// Starts the engine (a large mmap) and touches none of it: serves nothing. (A malloc block
/// would have the arena fill its header page.)
const IDLE: &str = r#"#include <stdio.h>
#include <sys/mman.h>
int main(void) {
    size_t n = 4u << 20;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("idle %d\n", p != MAP_FAILED);
    return p == MAP_FAILED || munmap(p, n) != 0;
}
"#;

const MAIN: &str = r#"#include <stdio.h>
int add(int a, int b);
int main(void) { printf("%d\n", add(2, 3)); return 0; }
"#;

const UTIL: &str = "int add(int a, int b) { return a + b; }\n";

const MAKEFILE: &str = "all: app toucher idle\n\t./app\n\t./toucher\n\t./idle\n\
app: main.o util.o\n\t$(CC) -o $@ main.o util.o\n\
%.o: %.c\n\t$(CC) -O2 -c $< -o $@\n\
toucher: toucher.c\n\t$(CC) -O2 -o $@ $<\n\
idle: idle.c\n\t$(CC) -O2 -o $@ $<\n";

fn write_project(dir: &Path) {
    for (name, text) in [
        ("toucher.c", TOUCHER),
        ("idle.c", IDLE),
        ("main.c", MAIN),
        ("util.c", UTIL),
        ("Makefile", MAKEFILE),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// `cmd` under the shim, the engine starting at the first request of 64 KiB (so that the
/// compiler's processes start it too), with `ZEROFAULT_STATS=stats`.
fn under_shim(cmd: &mut Command, stats: &str) -> std::process::Output {
    cmd.env("LD_PRELOAD", shim())
        .env("ZEROFAULT_STATS", stats)
        .env("ZEROFAULT_START_AFTER", "0")
        .env("ZEROFAULT_PRELOAD_THRESHOLD", "64K")
        .env("ZEROFAULT_VERBOSE", "1");
    run(cmd, Duration::from_secs(300))
}

/// The pids of the verbose lines "zerofault: engine started in pid N: ...".
fn started(o: &std::process::Output) -> BTreeSet<u64> {
    stderr(o)
        .lines()
        .filter_map(|l| l.strip_prefix("zerofault: engine started in pid "))
        .map(|l| l.split(':').next().unwrap().parse().unwrap())
        .collect()
}

fn objects(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert!(v.is_object(), "{l}");
            v
        })
        .collect()
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_make_build_writes_one_line_per_process_and_stats_adds_them_up() {
    let dir = temp_dir("stats-make");
    write_project(&dir);
    let file = dir.join("stats.jsonl");
    let o = under_shim(
        Command::new("make").args(["-j2"]).current_dir(&dir),
        file.to_str().unwrap(),
    );
    assert!(o.status.success(), "make: {}", stderr(&o));
    assert!(stdout(&o).contains("touched 67108864"), "{}", stdout(&o));
    let text = std::fs::read_to_string(&file).unwrap();
    let objs = objects(&text);
    let pids: Vec<u64> = objs.iter().map(|v| v["pid"].as_u64().unwrap()).collect();
    let distinct: BTreeSet<u64> = pids.iter().copied().collect();
    assert_eq!(distinct.len(), pids.len(), "one line per process: {pids:?}");
    assert!(objs.len() >= 2, "{text}");
    // Exactly the processes that said they started the engine wrote a line.
    assert_eq!(distinct, started(&o), "{}", stderr(&o));
    let named = |name: &str| {
        let found: Vec<&Value> = objs.iter().filter(|v| v["program"] == name).collect();
        assert_eq!(found.len(), 1, "one {name}: {text}");
        found[0]["pages_served"].as_u64().unwrap()
    };
    assert!(named("toucher") >= 8192, "{text}");
    assert_eq!(
        named("idle"),
        0,
        "a process that served nothing writes its line too: {text}"
    );
    let total: u64 = objs.iter().map(|v| v["pages_served"].as_u64().unwrap()).sum();
    for v in &objs {
        let each: u64 = ["pages_moved", "pages_copied", "pages_zero_mapped"]
            .iter()
            .map(|k| v[k].as_u64().unwrap())
            .sum();
        assert_eq!(v["pages_served"].as_u64(), Some(each), "{v}");
    }

    let sum = run(zerofault().arg("stats").arg(&file), Duration::from_secs(30));
    assert!(sum.status.success(), "{}", stderr(&sum));
    let out = stdout(&sum);
    println!("{}\n{out}", text.lines().next().unwrap());
    let line = |name: &str| -> u64 {
        let l = out.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap();
        l.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert_eq!(line("processes"), objs.len() as u64, "{out}");
    assert_eq!(line("pages_served"), total, "{out}");
    // `-`: stdin (`run` gives its programs none, hence `output`: this one reads a file and ends).
    let json = zerofault()
        .args(["stats", "--format", "json", "-"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    assert!(json.status.success(), "{}", stderr(&json));
    let j: Value = serde_json::from_str(stdout(&json).trim()).unwrap();
    assert_eq!(
        (j["processes"].as_u64(), j["pages_served"].as_u64()),
        (Some(objs.len() as u64), Some(total))
    );
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn json_goes_to_stderr_even_for_a_process_that_served_nothing_and_on_stays_quiet() {
    let dir = temp_dir("stats-json");
    std::fs::write(dir.join("idle.c"), IDLE).unwrap();
    let c = run(
        Command::new("cc")
            .args(["-O2", "-o", "idle", "idle.c"])
            .current_dir(&dir),
        Duration::from_secs(60),
    );
    assert!(c.status.success(), "{}", stderr(&c));
    let o = under_shim(&mut Command::new(dir.join("idle")), "json");
    assert!(o.status.success() && stdout(&o) == "idle 1\n", "{o:?}");
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with('{')).collect();
    let objs = objects(&lines.join("\n"));
    assert_eq!(objs.len(), 1, "{}", stderr(&o));
    assert_eq!(objs[0]["program"], "idle");
    assert_eq!(objs[0]["pages_served"], 0);
    assert_eq!(
        started(&o).into_iter().collect::<Vec<_>>(),
        [objs[0]["pid"].as_u64().unwrap()]
    );
    // `on`: today's text report, which says nothing for a process that served nothing.
    let o = under_shim(&mut Command::new(dir.join("idle")), "on");
    assert!(o.status.success(), "{o:?}");
    let err = stderr(&o);
    assert!(
        err.contains("engine started in pid") && !err.contains("pages_served") && !err.contains('{'),
        "{err}"
    );
}

/// A value the knob does not take: one line naming it and what it takes, and the program runs.
#[test]
fn a_bad_value_is_one_line_and_the_program_runs() {
    for bad in ["stats.jsonl", "maybe"] {
        let o = run(
            Command::new("/bin/echo")
                .arg("hi")
                .env("LD_PRELOAD", shim())
                .env("ZEROFAULT_STATS", bad),
            Duration::from_secs(30),
        );
        assert!(o.status.success() && stdout(&o) == "hi\n", "{o:?}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!(
                "zerofault: ZEROFAULT_STATS={bad:?} is invalid: it accepts off, on"
            )),
            "{err}"
        );
        assert!(
            err.contains("json") && err.contains("a file path containing a /"),
            "{err}"
        );
    }
    // A path that cannot be opened: one line, the program runs.
    let o = run(
        Command::new("/bin/echo")
            .arg("hi")
            .env("LD_PRELOAD", shim())
            .env("ZEROFAULT_STATS", "/nonexistent-dir/stats.jsonl"),
        Duration::from_secs(30),
    );
    assert!(o.status.success() && stdout(&o) == "hi\n", "{o:?}");
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("ZEROFAULT_STATS=\"/nonexistent-dir/stats.jsonl\": cannot open it"),
        "{err}"
    );
    // A FIFO (opening it would wait for a reader, inside the program's first large request)
    // and a path that is not UTF-8: one line each, the program runs.
    let dir = common::temp_dir("stats-fifo");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let not_utf8 = std::ffi::OsStr::from_bytes(b"/tmp/\xff.jsonl");
    for (value, said) in [
        (fifo.as_os_str(), "cannot open it for appending"),
        (not_utf8, "ZEROFAULT_STATS=\"(not UTF-8)\" is invalid"),
    ] {
        let o = run(
            Command::new("/bin/echo")
                .arg("hi")
                .env("LD_PRELOAD", shim())
                .env("ZEROFAULT_PRELOAD_THRESHOLD", "4K")
                .env("ZEROFAULT_STATS", value),
            Duration::from_secs(30),
        );
        assert!(o.status.success() && stdout(&o) == "hi\n", "{o:?}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(said), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
