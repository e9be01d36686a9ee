//! `zerofault doctor`, run as a user would: its table, its JSON, its exit code, and what it
//! says to a user without userfaultfd.

mod common;

use common::{run, stderr, stdout};
use std::process::Output;
use std::time::Duration;

/// Every check, in the table's order.
const CHECKS: [&str; 12] = [
    "kernel",
    "userfaultfd access",
    "UFFDIO_MOVE",
    "THP",
    "mTHP sizes",
    "free page reporting",
    "NUMA nodes",
    "zeroing methods",
    "seccomp",
    "cgroup CPU quota",
    "cgroup memory limit",
    "self-test",
];

const STATUSES: [&str; 3] = ["ok", "warn", "missing"];

/// The self-test serves 64 MiB in about a second at most; the limit leaves room for a busy
/// machine running the other tests.
const LIMIT: Duration = Duration::from_secs(60);

fn doctor(args: &[&str]) -> Output {
    run(common::zerofault().arg("doctor").args(args), LIMIT)
}

/// The table's row of `name`: its status and the first line of what it found.
fn row<'a>(table: &'a str, name: &str) -> Option<(&'a str, &'a str)> {
    table.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        // The name column is padded with blanks: a longer name sharing the prefix is not it.
        if !rest.starts_with("  ") {
            return None;
        }
        let rest = rest.trim_start();
        let (status, found) = rest.split_once(' ').unwrap_or((rest, ""));
        Some((status, found.trim_start()))
    })
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_table_has_every_check_and_the_self_test_passes() {
    let o = doctor(&[]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr(&o));
    for name in CHECKS {
        let (status, _) = row(&out, name).unwrap_or_else(|| panic!("no {name} row:\n{out}"));
        assert!(STATUSES.contains(&status), "{name}: {status}\n{out}");
    }
    assert_eq!(row(&out, "userfaultfd access").unwrap().0, "ok", "{out}");
    let (status, found) = row(&out, "self-test").unwrap();
    assert_eq!(status, "ok", "{out}");
    assert!(found.starts_with("64 MiB: "), "{out}");
    // "N of 16384 pages served by the engine": N read back from the engine's counters.
    let served: u64 = found["64 MiB: ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no page count: {out}"));
    assert!(served > 0 && served <= 16384, "{out}");
    assert!(out.contains("every byte reads zero"), "{out}");
    assert!(out.contains("engine: can run here"), "{out}");
    for l in out.lines() {
        // Commands (`  $ `) stay whole; every other line fits 100 columns.
        assert!(l.starts_with("  $ ") || l.chars().count() <= 100, "{l:?}");
    }
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn json_is_one_object_with_every_check() {
    let o = doctor(&["--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(stdout(&o).trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(&o)));
    assert_eq!(v["engine_can_run"], serde_json::Value::Bool(true), "{v}");
    let checks = v["checks"].as_array().expect("checks: an array");
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().expect("name")).collect();
    assert_eq!(names, CHECKS, "{v}");
    for c in checks {
        let status = c["status"].as_str().expect("status");
        assert!(STATUSES.contains(&status), "{c}");
        assert!(!c["found"].as_str().expect("found").is_empty(), "{c}");
        // A fix exactly where the status asks for one.
        assert_eq!(c["fix"].is_string(), status != "ok", "{c}");
    }
    let test = &checks[CHECKS.len() - 1];
    assert_eq!(test["status"], "ok", "{test}");
}

#[test]
fn a_bad_format_is_refused() {
    let o = doctor(&["--format", "xml"]);
    assert_eq!(o.status.code(), Some(2), "a usage error");
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    assert!(stderr(&o).contains("--format"), "{}", stderr(&o));
}
