//! `zerofault doctor`, run as a user would: its table, its JSON, its exit code, and what it
//! says to a user without userfaultfd.

mod common;

use common::{run, stderr, stdout, temp_dir};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
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
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    assert!(stderr(&o).contains("--format"), "{}", stderr(&o));
}

/// Why uid 65534 with no group would still have userfaultfd here, if it would.
fn nobody_has_userfaultfd() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    if sysctl.trim() != "0" {
        return Some(format!("vm.unprivileged_userfaultfd={}", sysctl.trim()));
    }
    let m = std::fs::metadata("/dev/userfaultfd").ok()?;
    let open = m.mode() & 0o006 == 0o006 || (m.gid() == 65534 && m.mode() & 0o060 == 0o060);
    open.then(|| format!("/dev/userfaultfd mode {:o} gid {}", m.mode() & 0o777, m.gid()))
}

#[test]
fn without_userfaultfd_it_exits_1_and_names_the_fix() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: dropping to uid 65534 with setpriv needs root");
        return;
    }
    if let Some(why) = nobody_has_userfaultfd() {
        eprintln!("skipped: uid 65534 has userfaultfd here ({why})");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: no setpriv (util-linux) on the PATH");
        return;
    }
    // A copy of the binary in a directory uid 65534 can reach (the build's may not be).
    let dir = temp_dir("doctor-nobody");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.join("zerofault");
    std::fs::copy(env!("CARGO_BIN_EXE_zerofault"), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = run(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .arg("doctor")
            .current_dir(&dir),
        LIMIT,
    );
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{}", stderr(&o));
    assert_eq!(row(&out, "userfaultfd access").map(|r| r.0), Some("missing"), "{out}");
    assert_eq!(row(&out, "self-test").map(|r| r.0), Some("missing"), "{out}");
    for fix in [
        "  $ groupadd -r userfaultfd\n",
        "  $ chgrp userfaultfd /dev/userfaultfd\n",
        "  $ chmod 0660 /dev/userfaultfd\n",
        "/etc/udev/rules.d/60-userfaultfd.rules",
        "KERNEL==\"userfaultfd\", GROUP=\"userfaultfd\", MODE=\"0660\"",
        "  $ sysctl -w vm.unprivileged_userfaultfd=1\n",
    ] {
        assert!(out.contains(fix), "no {fix:?} in:\n{out}");
    }
    assert!(out.contains("engine: cannot run here"), "{out}");
    assert!(stderr(&o).contains("cannot run here"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}
