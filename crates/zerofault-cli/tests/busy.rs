//! A busy machine: processes under the shim end as fast as natively beside CPU hogs at
//! normal priority (issue 28's exit; DESIGN.md, "Exit"). Each test alternates native and
//! shim runs and compares medians with a factor of two: these are tests of the exit, not
//! benchmarks (a teardown left to a starved thread took 20-80 s where natively it took 0.2 s).

mod common;

use common::{cc, run, temp_dir, zerofault, Running};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use zerofault_bench::Hogs;

/// The tests of this file one at a time: each wants two hogs, not four.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

const PAIRS: usize = 3;

/// A map, write, unmap loop of 256 MiB, ten rounds, beside two hogs: its whole life, exit
/// included (`finish` returns once the process is a zombie, its memory torn down).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_map_write_unmap_loop_beside_two_hogs_ends_within_twice_its_native_time() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("busy-loop");
    let prog = cc("exits", &dir, false);
    let _hogs = Hogs::start(2).expect("hogs");
    let limit = Duration::from_secs(120);
    let (mut native, mut shim) = (vec![], vec![]);
    for _ in 0..PAIRS {
        let t0 = Instant::now();
        let o = run(Command::new(&prog).args(["loop", "256", "10"]), limit);
        native.push(t0.elapsed().as_secs_f64());
        assert!(o.status.success(), "{o:?}");
        let t0 = Instant::now();
        let o = run(
            zerofault().args(["run", "--"]).arg(&prog).args(["loop", "256", "10"]),
            limit,
        );
        shim.push(t0.elapsed().as_secs_f64());
        assert!(o.status.success(), "{o:?}");
    }
    let (n, s) = (median(native.clone()), median(shim.clone()));
    assert!(
        s <= 2.0 * n,
        "under the shim {s:.2} s (runs {shim:.2?}), natively {n:.2} s (runs {native:.2?})"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SIGKILL to a process holding 1 GiB it wrote, a second after two hogs started: from the
/// kill to the process gone, its memory torn down. Within twice native, and half a second
/// (native is ~0.1 s, mostly noise).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn a_sigkilled_process_beside_two_hogs_is_gone_within_twice_its_native_time() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("busy-kill");
    let prog = cc("exits", &dir, false);
    let killed = |cmd: &mut Command| -> f64 {
        let mut r = Running::start(cmd, Duration::from_secs(120));
        r.wait_for_stdout("ready").unwrap();
        let hogs = Hogs::start(2).expect("hogs");
        std::thread::sleep(Duration::from_secs(1));
        let t0 = Instant::now();
        // SAFETY: kill(2) of our own running child (`zerofault run` execs the program).
        unsafe { libc::kill(r.pid(), libc::SIGKILL) };
        let o = r.finish().unwrap();
        let t = t0.elapsed().as_secs_f64();
        drop(hogs);
        assert!(o.status.code().is_none(), "killed: {o:?}");
        t
    };
    let (mut native, mut shim) = (vec![], vec![]);
    for _ in 0..PAIRS {
        native.push(killed(Command::new(&prog).args(["hold", "1024"])));
        shim.push(killed(
            zerofault().args(["run", "--"]).arg(&prog).args(["hold", "1024"]),
        ));
    }
    let (n, s) = (median(native.clone()), median(shim.clone()));
    assert!(
        s <= 2.0 * n + 0.5,
        "under the shim {s:.2} s (runs {shim:.2?}), natively {n:.2} s (runs {native:.2?})"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
