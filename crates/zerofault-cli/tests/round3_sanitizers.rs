//! Programs built with a sanitizer (crates/zerofault-preload/tests/c/sanitized.c). ASan, TSan,
//! LSan and the others replace malloc and the mmap family with their runtime's and own the
//! memory layout; ASan refuses to run behind any preloaded library unless told not to check.
//! Such a program runs as it does natively: `zerofault run` leaves LD_PRELOAD alone for it
//! (one line under --verbose or --stats), and the front, preloaded by hand or into a script's
//! child, finds the runtime at its first call and passes every call on to it, for good. UBSan
//! alone replaces nothing: its programs keep the engine.
//!
//! Each test builds the program with the sanitizer (GCC's runtimes come with GCC: libasan,
//! libtsan, liblsan, libubsan), runs it natively, checks what it does there, then runs it under
//! the shim (three times: a crash at start under the shim was not every run's) and asserts the
//! same exit status and output. Every run has a time limit and a memory cap.

mod common;

use common::{counter, shim, stderr, stdout, temp_dir, zerofault, Running};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The time limit of one run: the program ends in seconds natively (TSan's slower).
const LIMIT: Duration = Duration::from_secs(120);

/// The memory cap of one run: far above what the program needs with a sanitizer (ASan's
/// quarantine keeps 256 MiB of freed blocks), far below the machine's.
const RSS_CAP: u64 = 4 << 30;

/// What the program prints natively, whatever the sanitizer.
const CHECKSUM: &str = "checksum 12828672\n";

/// How many times each run under the shim is repeated.
const RUNS: usize = 3;

/// The sanitizers whose runtime replaces malloc and mmap, as GCC builds them: (name, flags).
const REPLACING: [(&str, &[&str]); 5] = [
    ("asan", &["-fsanitize=address"]),
    ("tsan", &["-fsanitize=thread"]),
    ("lsan", &["-fsanitize=leak"]),
    ("asan-static", &["-fsanitize=address", "-static-libasan"]),
    ("tsan-static", &["-fsanitize=thread", "-static-libtsan"]),
];

fn go(cmd: &mut Command) -> Output {
    Running::start(cmd, LIMIT)
        .rss_cap(RSS_CAP)
        .finish()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Builds sanitized.c with `flags` as `dir/name`; a runtime missing fails the test.
fn build(name: &str, flags: &[&str], dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../zerofault-preload/tests/c/sanitized.c");
    let out = dir.join(name);
    let o = go(Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src));
    assert!(
        o.status.success(),
        "cc {flags:?} (GCC's sanitizer runtimes: libasan8, libtsan2, liblsan0, libubsan1): {}",
        stderr(&o)
    );
    out
}

/// The program with a clean environment: no ZEROFAULT_ knob, no ASAN_OPTIONS or LD_PRELOAD
/// of the caller's.
fn clean(mut c: Command) -> Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("ZEROFAULT_") || k.starts_with("ASAN_") || k.starts_with("TSAN_") || k == "LD_PRELOAD" {
            c.env_remove(&*k);
        }
    }
    c
}

fn native(prog: &Path, args: &[&str]) -> Command {
    let mut c = clean(Command::new(prog));
    c.args(args);
    c
}

/// `zerofault run FLAGS -- prog args`.
fn under_run(flags: &[&str], prog: impl AsRef<OsStr>, args: &[&str]) -> Command {
    let mut c = clean(zerofault());
    c.arg("run").args(flags).arg("--").arg(prog).args(args);
    c
}

/// The front preloaded by hand.
fn by_hand(prog: &Path, args: &[&str]) -> Command {
    let mut c = native(prog, args);
    c.env("LD_PRELOAD", shim());
    c
}

/// The same exit status, stdout and stderr as natively (the sanitizer's reports carry pids
/// and addresses: with `report`, stderr must hold that line in both instead).
fn assert_like(what: &str, native: &Output, shim: &Output, report: Option<&str>) {
    assert_eq!(
        (native.status, stdout(native)),
        (shim.status, stdout(shim)),
        "{what}: natively (left) and under the shim (right); stderr under the shim:\n{}",
        stderr(shim)
    );
    match report {
        None => assert_eq!(
            stderr(native),
            stderr(shim),
            "{what}: stderr natively (left), under the shim (right)"
        ),
        Some(line) => assert!(
            stderr(native).contains(line) && stderr(shim).contains(line),
            "{what}: the sanitizer's report ({line}) natively:\n{}\nunder the shim:\n{}",
            stderr(native),
            stderr(shim)
        ),
    }
}

/// `zerofault run`, with and without --stats and --verbose, and the front by hand (with a knob
/// set by hand too, which loads the shim at start in any other process): the same as natively,
/// each three times.
#[test]
fn sanitized_programs_run_as_natively_under_the_shim() {
    let dir = temp_dir("sanitizers");
    for (name, flags) in REPLACING {
        let prog = build(name, flags, &dir);
        let env: &[(&str, &str)] = if name.starts_with("asan") {
            &[("ASAN_OPTIONS", ""), ("ASAN_OPTIONS", "verify_asan_link_order=0")]
        } else {
            &[("ASAN_OPTIONS", "")]
        };
        for &(k, v) in env {
            let what = format!("{name} ({k}={v})");
            let plain = go(native(&prog, &[]).env(k, v));
            assert_eq!(
                (plain.status.code(), stdout(&plain).as_str(), stderr(&plain).as_str()),
                (Some(0), CHECKSUM, ""),
                "{what} natively"
            );
            for _ in 0..RUNS {
                assert_like(
                    &format!("{what}: zerofault run"),
                    &plain,
                    &go(under_run(&[], &prog, &[]).env(k, v)),
                    None,
                );
                assert_like(
                    &format!("{what}: by hand"),
                    &plain,
                    &go(by_hand(&prog, &[]).env(k, v)),
                    None,
                );
                let knob = go(by_hand(&prog, &[]).env(k, v).env("ZEROFAULT_STATS", "on"));
                assert_like(&format!("{what}: by hand, ZEROFAULT_STATS=on"), &plain, &knob, None);
            }
            for flag in ["--verbose", "--stats"] {
                let o = go(under_run(&[flag], &prog, &[]).env(k, v));
                assert_eq!((o.status, stdout(&o)), (plain.status, stdout(&plain)), "{what} {flag}");
                let err = stderr(&o);
                assert!(
                    err.lines().count() == 1
                        && err.contains("is built with a sanitizer")
                        && err.contains("without the engine"),
                    "{what} {flag}: one line saying the shim stays out, and no report, but:\n{err}"
                );
            }
            let o = go(by_hand(&prog, &[]).env(k, v).env("ZEROFAULT_VERBOSE", "on"));
            assert_eq!(
                (o.status, stdout(&o)),
                (plain.status, stdout(&plain)),
                "{what} by hand, verbose"
            );
            assert_eq!(
                stderr(&o),
                "zerofault: a sanitizer's runtime is in this process (it replaces malloc and mmap); running without the engine\n",
                "{what} by hand, ZEROFAULT_VERBOSE=on"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The program found on PATH, run through a `#!` line (its interpreter, directly and through
/// env) and from a shell script (a child of a process the front is in): the same as natively.
#[test]
fn sanitized_programs_on_path_and_behind_scripts() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("sanitizers-scripts");
    for (name, flags) in [REPLACING[0], REPLACING[1]] {
        let prog = build(name, flags, &dir);
        let plain = go(&mut native(&prog, &[]));
        assert_eq!(
            (plain.status.code(), stdout(&plain).as_str()),
            (Some(0), CHECKSUM),
            "{name} natively"
        );
        let script = |file: &str, text: String| {
            let p = dir.join(file);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let interp = script(&format!("{name}-interp"), format!("#!{}\n", prog.display()));
        let env = script(&format!("{name}-env"), format!("#!/usr/bin/env {name}\n"));
        let sh = script(&format!("{name}-sh"), format!("#!/bin/sh\nexec {}\n", prog.display()));
        let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
        for _ in 0..RUNS {
            for (what, target) in [
                ("on PATH", OsStr::new(name)),
                ("#! the program", interp.as_os_str()),
                ("#!/usr/bin/env", env.as_os_str()),
                ("a shell script", sh.as_os_str()),
            ] {
                let o = go(under_run(&[], target, &[]).env("PATH", &path));
                assert_like(&format!("{name}, {what}"), &plain, &o, None);
            }
        }
        // Where zerofault run sees the program itself, it says so; behind the shell, the front.
        let o = go(under_run(&["--verbose"], OsStr::new(name), &[]).env("PATH", &path));
        assert!(
            stderr(&o).contains(&format!("{} is built with a sanitizer", prog.display())),
            "{}",
            stderr(&o)
        );
        let o = go(under_run(&["--verbose"], &sh, &[]).env("PATH", &path));
        assert!(
            stderr(&o).contains("a sanitizer's runtime is in this process"),
            "{}",
            stderr(&o)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The sanitizer still does its work behind the front: ASan reports the write past a block
/// and exits 1, TSan reports the race and exits 66, as natively.
#[test]
fn the_sanitizer_still_reports_behind_the_front() {
    let dir = temp_dir("sanitizers-bug");
    for (name, flags, report) in [
        ("asan", REPLACING[0].1, "ERROR: AddressSanitizer: heap-buffer-overflow"),
        ("tsan", REPLACING[1].1, "WARNING: ThreadSanitizer: data race"),
    ] {
        let prog = build(name, flags, &dir);
        let plain = go(&mut native(&prog, &["bug"]));
        assert!(
            !plain.status.success() && stderr(&plain).contains(report),
            "{name} bug natively: {}",
            stderr(&plain)
        );
        assert_like(
            &format!("{name} bug: zerofault run"),
            &plain,
            &go(&mut under_run(&[], &prog, &["bug"])),
            Some(report),
        );
        assert_like(
            &format!("{name} bug: by hand"),
            &plain,
            &go(&mut by_hand(&prog, &["bug"])),
            Some(report),
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// UBSan's runtime replaces nothing: its program keeps the engine, which serves its large
/// blocks (the shim is not turned away from every program with a sanitizer's name in it).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn ubsan_programs_keep_the_engine() {
    let dir = temp_dir("sanitizers-ubsan");
    for (name, flags) in [
        ("ubsan", &["-fsanitize=undefined"][..]),
        ("ubsan-static", &["-fsanitize=undefined", "-static-libubsan"][..]),
    ] {
        let prog = build(name, flags, &dir);
        let plain = go(&mut native(&prog, &[]));
        assert_eq!(
            (plain.status.code(), stdout(&plain).as_str()),
            (Some(0), CHECKSUM),
            "{name} natively"
        );
        let o = go(&mut under_run(&["--stats"], &prog, &[]));
        assert_eq!(
            (o.status, stdout(&o)),
            (plain.status, stdout(&plain)),
            "{name} under the shim"
        );
        assert!(
            counter(&o, "pages_served") > 0,
            "{name}: the engine served nothing:\n{}",
            stderr(&o)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
