//! Unmodified programs under the LD_PRELOAD shim, through `zerofault run`: the same output and
//! exit status as without it, and pages served by the engine where they use large blocks.

mod common;

use common::{
    assert_same, both, cc, counter, lib_dir, measured, pages_served, program_stderr, run, stderr, temp_dir, zerofault,
};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The time limit of the runs that are not made by `both` (which has its own).
const LIMIT: Duration = Duration::from_secs(180);

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn python_builds_and_sums_a_bytearray_of_1_gib() {
    let dir = temp_dir("python");
    let script = "b = bytearray(1 << 30)\n\
                  b[::4096] = bytes(range(256)) * 1024\n\
                  print(len(b), sum(b[::4096]), sum(b[1::4096]), b.count(0))\n";
    let (plain, shim) = both("python3", &["-c", script], &dir);
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "1073741824 33423360 0 1073480704\n"
    );
    assert_same(&plain, &shim);
    assert!(
        pages_served(&shim) > 200_000,
        "{}",
        String::from_utf8_lossy(&shim.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// 1 GiB of text lines from a fixed-seed generator.
fn write_lines(path: &Path, bytes: usize) {
    use std::io::Write;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut n = 0;
    while n < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let line = format!("{:016x} {}\n", x, x % 1_000_003);
        f.write_all(line.as_bytes()).unwrap();
        n += line.len();
    }
    f.flush().unwrap();
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    let (mut fa, mut fb) = (std::fs::File::open(a).unwrap(), std::fs::File::open(b).unwrap());
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = fa.read(&mut ba).unwrap();
        let mut nb = 0;
        while nb < na {
            let k = fb.read(&mut bb[nb..na]).unwrap();
            if k == 0 {
                return false;
            }
            nb += k;
        }
        if ba[..na] != bb[..na] {
            return false;
        }
        if na == 0 {
            return fb.read(&mut bb).unwrap() == 0;
        }
    }
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn sort_of_a_1_gib_file_with_a_2_gib_buffer() {
    let dir = temp_dir("sort");
    write_lines(&dir.join("in.txt"), 1 << 30);
    let (plain, shim) = (
        run(
            Command::new("sort")
                .args(["-S", "2G", "in.txt", "-o", "plain.txt"])
                .current_dir(&dir),
            LIMIT,
        ),
        run(
            zerofault()
                .args(["run", "--stats", "--", "sort", "-S", "2G", "in.txt", "-o", "shim.txt"])
                .current_dir(&dir),
            LIMIT,
        ),
    );
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    assert_same(&plain, &shim);
    assert!(
        same_file(&dir.join("plain.txt"), &dir.join("shim.txt")),
        "sorted output differs"
    );
    assert!(
        pages_served(&shim) > 100_000,
        "{}",
        String::from_utf8_lossy(&shim.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// stress-ng's lines name pids and durations: compare them with the digits masked.
fn masked(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect()
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
#[cfg_attr(zerofault_no_stress_ng, ignore = "stress-ng is not installed (.ci/run installs it)")]
fn stress_ng_vm_all_methods_verify() {
    let dir = temp_dir("stress");
    let args = [
        "--vm",
        "2",
        "--vm-bytes",
        "1G",
        "--vm-method",
        "all",
        "--verify",
        "-t",
        "20s",
    ];
    let (plain, shim) = both("stress-ng", &args, &dir);
    assert_eq!(
        plain.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    assert_eq!(plain.status.code(), shim.status.code());
    assert_eq!(
        masked(&String::from_utf8_lossy(&plain.stdout)),
        masked(&String::from_utf8_lossy(&shim.stdout))
    );
    assert_eq!(masked(&program_stderr(&plain)), masked(&program_stderr(&shim)));
    assert!(program_stderr(&shim).contains("successful run completed"));
    assert!(
        pages_served(&shim) > 100_000,
        "{}",
        String::from_utf8_lossy(&shim.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn fork_write_in_parent_and_child_then_exec() {
    let dir = temp_dir("fork");
    let prog = cc("forkexec", &dir, false);
    let (plain, shim) = both(prog.to_str().unwrap(), &[], &dir);
    assert_eq!(
        plain.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let out = String::from_utf8_lossy(&plain.stdout);
    assert!(
        out.contains("exec'd: from the child") && out.contains("exec'd: from a vfork child"),
        "{out}"
    );
    assert_same(&plain, &shim);
    assert!(
        pages_served(&shim) > 10_000,
        "{}",
        String::from_utf8_lossy(&shim.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn threads_and_signals_behave_as_without_the_shim() {
    let dir = temp_dir("threads");
    let prog = cc("threads", &dir, false);
    let (plain, shim) = both(prog.to_str().unwrap(), &[], &dir);
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    let out = String::from_utf8_lossy(&plain.stdout);
    assert!(
        out.ends_with("signals arrived: yes\n") && out.lines().count() == 5,
        "{out}"
    );
    assert_same(&plain, &shim);
    // The threads write about 172,000 pages; how many the engine serves depends on how their
    // faults interleave (a thread whose faults land in another's window misses its prediction,
    // and a span is handed back): 86,000 to 198,000 in runs of the same build. A quarter of them
    // shows the engine served the threads.
    assert!(
        pages_served(&shim) > 43_000,
        "{}",
        String::from_utf8_lossy(&shim.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Freed memory is recycled (free of arena blocks, munmap of whole served mappings) and the
/// program sees what it sees natively: zero where memory is new, its bytes where it kept them,
/// a forked child's copy intact.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn freed_memory_is_recycled_and_reads_as_natively() {
    let dir = temp_dir("recycle");
    let prog = cc("recycle", &dir, false);
    // The fork's block is freed while the child shares its pages: the moves are refused
    // (EBUSY) and its pages discarded, in about 4 runs of 5 here (f4cafac too); in the others
    // the block's pages were not the engine's to move when it was freed (not understood yet:
    // the program's output is the same either way). Up to three runs for that count.
    let mut last = String::new();
    for _ in 0..3 {
        let (plain, shim) = both(prog.to_str().unwrap(), &[], &dir);
        assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stdout));
        assert_same(&plain, &shim);
        let err = String::from_utf8_lossy(&shim.stderr).into_owned();
        let count = |name: &str| -> u64 {
            err.lines()
                .find_map(|l| l.strip_prefix(&format!("zerofault: {name} ")))
                .map_or(0, |v| v.trim().parse().unwrap())
        };
        // 6 frees, 6 whole munmaps of written mappings and 6 of read ones, the fork's free;
        // not the hole.
        assert!(count("recycle_calls") >= 12, "{err}");
        assert!(count("pages_recycled") > 6 * 16384, "{err}");
        if count("recycle_discarded") > 0 {
            std::fs::remove_dir_all(&dir).unwrap();
            return;
        }
        last = err;
    }
    panic!("the fork's pages were never discarded, in 3 runs: {last}");
}

/// Memory goes back when the program does not want it: a program that frees 1 GiB and idles
/// 3 s ends within `scrub_stop` (64 MiB by default) + 8 MiB of its native RSS, the recycled
/// pages given back after `purge_delay` (1 s).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_program_that_frees_1_gib_and_idles_ends_near_its_native_rss() {
    let dir = temp_dir("idle");
    let prog = cc("touch", &dir, false);
    let (plain, shim) = both(prog.to_str().unwrap(), &["idle", "1024", "3"], &dir);
    assert!(plain.status.success() && shim.status.success(), "{}", stderr(&shim));
    let (native, engine) = (measured(&plain, "rss_kb"), measured(&shim, "rss_kb"));
    assert!(
        counter(&shim, "pages_recycled") >= 3 * 1024 * 256 / 4,
        "the freed GiB went through recycling: {}",
        stderr(&shim)
    );
    assert!(
        engine <= native + (64 + 8) * 1024,
        "RSS {engine} kB under the shim, {native} kB natively\n{}",
        stderr(&shim)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_c_api_maps_engine_memory_and_reads_stats() {
    let dir = temp_dir("capi");
    let prog = cc("capi", &dir, true);
    // cargo test sets LD_LIBRARY_PATH, which would win over the program's rpath.
    let o = run(Command::new(&prog).env_remove("LD_LIBRARY_PATH"), LIMIT);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let (first, json) = out.split_once('\n').unwrap();
    assert_eq!(first, "active=1 sum=2088960");
    let stats: serde_json::Value = serde_json::from_str(json.trim()).expect("stats JSON");
    // 16384 pages read before the writes, then 8192 recycled pages read again.
    assert_eq!(
        stats["pages_zero_mapped"],
        16384 + 8192,
        "the reads were served: {stats}"
    );
    assert_eq!(stats["recycle_calls"], 1, "zerofault_recycle recycled: {stats}");
    assert!(stats["pages_recycled"].as_u64().unwrap() >= 8000, "{stats}");

    let o = run(
        Command::new(&prog)
            .env_remove("LD_LIBRARY_PATH")
            .env("ZEROFAULT_DISABLE", "1"),
        LIMIT,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("active=0 sum=2088960\n"), "{out}");
    assert!(out.contains("\"fault_events\":0"), "disabled: nothing served: {out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A refused knob: one line naming it, and the program runs (without the engine) with its own
/// output and status. The same from the environment, with the shim loaded directly.
#[test]
fn a_bad_knob_is_one_line_and_the_program_still_runs() {
    let o = run(
        zerofault().args(["run", "--max_order=99", "--", "sh", "-c", "echo hi; exit 5"]),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("ZEROFAULT_MAX_ORDER") && err.contains("0..=13"), "{err}");

    let o = run(
        Command::new("sh")
            .args(["-c", "echo hi; exit 6"])
            .env("LD_PRELOAD", lib_dir().join("libzerofault.so"))
            .env("ZEROFAULT_POOL_MAX", "lots"),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        (o.status.code(), String::from_utf8_lossy(&o.stdout).as_ref()),
        (Some(6), "hi\n")
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("ZEROFAULT_POOL_MAX"), "{err}");
}

#[test]
fn run_passes_the_exit_status_and_reports_a_missing_program() {
    let o = run(zerofault().args(["run", "--", "sh", "-c", "exit 42"]), LIMIT);
    assert_eq!(o.status.code(), Some(42));
    assert!(o.stderr.is_empty(), "nothing printed unless asked");
    let o = run(zerofault().args(["run", "--", "/nonexistent/program"]), LIMIT);
    assert_eq!(o.status.code(), Some(127));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines().count() == 1 && err.contains("/nonexistent/program"),
        "{err}"
    );
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn disabled_the_shim_passes_everything_through() {
    let o = run(
        zerofault().args([
            "run",
            "--stats",
            "--disable=1",
            "--",
            "python3",
            "-c",
            "b = bytearray(64 << 20); print(b.count(0))",
        ]),
        LIMIT,
    );
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout), "67108864\n");
    assert!(
        o.stderr.is_empty(),
        "disabled: no report: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `zerofault run --verbose`: one line per process saying whether the engine started and, if
/// not, why. Catches a silent shim: a refused userfaultfd (here a seccomp filter), a program
/// that never needed the engine, and one the loader cannot preload into, each named.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn verbose_says_whether_the_engine_started_and_why_not() {
    let dir = temp_dir("verbose");
    let touch = cc("touch", &dir, false);
    let verbose = |args: &[&std::ffi::OsStr]| {
        let mut c = zerofault();
        c.args(["run", "--verbose", "--"]).args(args);
        let o = run(&mut c, Duration::from_secs(120));
        assert!(o.status.success(), "{}", stderr(&o));
        stderr(&o)
    };
    let lines = |s: &str| s.lines().filter(|l| l.starts_with("zerofault:")).count();

    let started = verbose(&[touch.as_os_str(), "cold".as_ref(), "64".as_ref()]);
    assert!(started.contains("zerofault: engine started in pid "), "{started}");
    assert_eq!(lines(&started), 1, "{started}");

    let idle = verbose(&["/bin/true".as_ref()]);
    assert!(
        idle.contains("engine not started") && idle.contains("no request of 2 MiB or more"),
        "{idle}"
    );
    assert_eq!(lines(&idle), 1, "{idle}");

    // seccomp exec: the filter refuses userfaultfd(2) and ioctl(2), then touch starts under it:
    // the engine does not try (a filter may kill the process for a call it refuses), and both
    // processes say why.
    let seccomp = cc("seccomp", &dir, false);
    let refused = verbose(&[
        seccomp.as_os_str(),
        "exec".as_ref(),
        touch.as_os_str(),
        "cold".as_ref(),
        "64".as_ref(),
    ]);
    assert!(
        refused.contains("engine not started") && refused.contains("the process runs under a seccomp filter"),
        "{refused}"
    );

    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../zerofault-preload/tests/c/touch.c");
    let stat = dir.join("touch-static");
    let mut c = Command::new("cc");
    c.args(["-O2", "-static", "-o"]).arg(&stat).arg(&src);
    let o = run(&mut c, Duration::from_secs(120));
    assert!(o.status.success(), "cc -static: {}", stderr(&o));
    let s = verbose(&[stat.as_os_str(), "cold".as_ref(), "8".as_ref()]);
    assert!(s.contains("is statically linked"), "{s}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Threads that make their first large request at once are all served by the engine: the
/// first loads the shim, the others wait for the load (before, they went to the next allocator
/// while it ran: one buffer of four served in 1 run of 3-6). Eight runs.
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn threads_whose_first_large_requests_come_at_once_are_all_served() {
    let dir = temp_dir("first-large");
    let prog = cc("first_large", &dir, false);
    for run in 0..8 {
        let (plain, shim) = both(prog.to_str().unwrap(), &[], &dir);
        assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stdout));
        assert_same(&plain, &shim);
        // 4 threads x 32 MiB, one page each 4 KiB.
        let served = pages_served(&shim);
        assert!(
            served >= 4 * 8192,
            "run {run}: {served} pages served of 32768\n{}",
            String::from_utf8_lossy(&shim.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
