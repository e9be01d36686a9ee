//! The `zerofault` binary, run as a user would.

use std::process::{Command, Output};

fn zerofault(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zerofault"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run zerofault")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_flags_fail_with_one_line_naming_the_flag() {
    for (args, needle) in [
        (vec!["bench", "--gb", "-1"], "--gb"),
        (vec!["bench", "--threads", "0"], "--threads"),
        (vec!["bench", "--mode", "native,warp"], "--mode"),
        (vec!["bench", "--pattern", "zigzag"], "--pattern"),
        (vec!["bench", "--bogus"], "--bogus"),
        (vec!["verify", "--gb", "x"], "--gb"),
        (vec!["frobnicate"], "frobnicate"),
    ] {
        let o = zerofault(&args, &[]);
        let e = stderr(&o);
        assert!(!o.status.success(), "{args:?}");
        assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: {e}");
        assert!(e.contains(needle), "{args:?}: {e}");
    }
}

#[test]
fn bad_environment_values_are_rejected_with_the_knob_name() {
    for (k, v, accepts) in [
        ("ZEROFAULT_MAX_ORDER", "99", "0..=13"),
        ("ZEROFAULT_POOL", "sometimes", "on/off"),
        ("ZEROFAULT_SCRUB_STOP", "12X", "K/M/G"),
    ] {
        let o = zerofault(&["bench", "--gb", "0.01", "--reps", "1", "--mode", "engine"], &[(k, v)]);
        let e = stderr(&o);
        assert!(!o.status.success());
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
        assert!(e.contains(k) && e.contains(accepts), "{e}");
    }
}

#[test]
fn options_lists_every_knob() {
    let o = zerofault(&["options"], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    for k in zerofault::Options::TABLE {
        assert!(out.contains(&zerofault::options::env_name(k.name)), "{}", k.name);
    }
}

#[test]
fn the_readme_lists_every_knob_as_the_options_table_says() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let (_, rest) = readme
        .split_once("<!-- knobs:begin -->\n")
        .expect("README knobs:begin marker");
    let (table, _) = rest.split_once("<!-- knobs:end -->").expect("README knobs:end marker");
    assert_eq!(
        table,
        zerofault::Options::table_markdown(),
        "README's knob table is stale: regenerate it with `zerofault options --markdown`"
    );
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn bench_json_has_one_row_per_mode_with_the_schema() {
    let o = zerofault(
        &[
            "bench",
            "--gb",
            "0.0625",
            "--reps",
            "1",
            "--threads",
            "2",
            "--mode",
            "native,engine,engine-cold",
            "--format",
            "json",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let rows = rows.as_array().expect("array");
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["native", "engine", "engine-cold"]);
    for r in rows {
        for k in [
            "gb",
            "reps",
            "threads",
            "pattern",
            "touch",
            "user_s",
            "sys_s",
            "wall_s",
            "pages",
            "flt_per_cpu_s",
            "fault_per_wsec",
        ] {
            assert!(r.get(k).is_some(), "{k} missing in {r}");
        }
        assert_eq!(r["pages"], 16384);
        assert!(r["fault_per_wsec"].as_f64().unwrap() > 0.0);
    }
    assert!(
        rows[1]["engine_stats"]["pages_moved"].as_u64().unwrap() > 0,
        "engine used the pool"
    );
    assert!(
        rows[1]["pool_fill_wall_s"].as_f64().is_some(),
        "the fill is reported apart"
    );
    assert!(rows[2].get("pool_fill_wall_s").is_none(), "engine-cold has no fill");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn bench_table_prints_pft_columns_and_ratios() {
    let o = zerofault(&["bench", "--gb", "0.03125", "--reps", "1"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with(" Gb Rep Threads   User      System     Wall flt/cpu/s fault/wsec mode\n"),
        "{out}"
    );
    assert!(out.contains("engine: fault/wsec ") && out.contains("x native"), "{out}");
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn verify_passes_on_every_pattern() {
    let o = zerofault(&["verify", "--gb", "0.0625"], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    for p in [
        "sequential",
        "random",
        "multi-threaded",
        "read-then-write",
        "copy-forced",
        "small-pool",
        "unmap-and-touch-again",
    ] {
        assert!(out.lines().any(|l| l.starts_with(p) && l.ends_with("OK")), "{p}: {out}");
    }
}
