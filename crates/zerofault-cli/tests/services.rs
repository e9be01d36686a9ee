//! The systemd recipe of docs/SERVICES.md, as far as it can run without systemd as PID 1: the
//! unit taken from the page as it stands passes `systemd-analyze verify`, and its `ExecStart=`
//! with its `Environment=` runs the program under the engine and writes the stats line.

mod common;

use common::{run, stderr, stdout, temp_dir};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The unit of docs/SERVICES.md: the ```ini block after its `recipe: systemd-unit` marker.
fn unit_from_the_page() -> String {
    let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/SERVICES.md")).unwrap();
    let after = page
        .split_once("<!-- recipe: systemd-unit -->")
        .expect("docs/SERVICES.md marks its systemd unit")
        .1;
    let block = after.split_once("```ini\n").expect("an ini block after the marker").1;
    block.split_once("```").expect("the block ends").0.to_string()
}

/// The values of `key=` lines of `unit`, in order.
fn values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_systemd_unit_verifies_and_its_command_runs_under_the_engine() {
    let dir = temp_dir("services");
    let touch = common::cc("touch", &dir, false);
    let stats = dir.join("zerofault.jsonl");
    // The page's unit with this machine's paths: this build's binary, a program of the suite,
    // the stats file in the test's directory.
    let unit = unit_from_the_page()
        .replace("/usr/local/bin/zerofault", env!("CARGO_BIN_EXE_zerofault"))
        .replace("/usr/local/bin/myapp --serve", &format!("{} cold 256", touch.display()))
        .replace("/var/log/myapp/zerofault.jsonl", stats.to_str().unwrap())
        .replace("/var/log/myapp", dir.to_str().unwrap());
    let file = dir.join("myapp.service");
    std::fs::write(&file, &unit).unwrap();
    let o = run(
        Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&file),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "systemd-analyze verify:\n{}\n{unit}", stderr(&o));
    assert!(!stderr(&o).contains("Unknown key"), "{}", stderr(&o));

    let exec = values(&unit, "ExecStart");
    assert_eq!(exec.len(), 1, "{unit}");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    let mut cmd = Command::new(words[0]);
    cmd.args(&words[1..]);
    for env in values(&unit, "Environment") {
        let (k, v) = env.split_once('=').unwrap();
        cmd.env(k, v);
    }
    let o = run(&mut cmd, Duration::from_secs(120));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("cold touch 256 MiB"), "{}", stdout(&o));
    let lines = std::fs::read_to_string(&stats).unwrap();
    assert_eq!(lines.lines().count(), 1, "one process, one line: {lines}");
    let line: serde_json::Value = serde_json::from_str(lines.trim()).unwrap();
    assert_eq!(line["program"], "touch", "{line}");
    assert!(line["pages_served"].as_u64().unwrap() > 0, "{line}");
    std::fs::remove_dir_all(&dir).unwrap();
}
