//! Processes sharing one memory cgroup (DESIGN.md, "The pool's memory budget"): the pools of
//! all the engines in it together stay within its headroom, and give their pages back when the
//! programs' own faults bring it near its limit. crates/zerofault-preload/tests/c/forkbomb.c
//! forks 16 children that each write 32 MiB and wait, then 16 more that do the same: 1 GiB of
//! blocks in a 1100 MiB cgroup. Natively none is killed; with each engine budgeting against
//! the cgroup's limit as if it were alone, the first sixteen's pools filled the headroom and
//! the cgroup's OOM killer killed late children (1 to 4 of 32, every run).

mod common;

use common::{cc, counter, run, stderr, stdout, temp_dir, zerofault};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// A memory cgroup of its own: a child of this process's memory cgroup (v1's memory hierarchy
/// where it is mounted, else v2's), removed when dropped, also when the test fails.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn new(name: &str, limit: u64) -> Cgroup {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let v1 = own.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
            ctl.split(',').any(|c| c == "memory").then(|| path.to_string())
        });
        let (v2, parent) = match v1 {
            Some(p) => (
                false,
                Path::new("/sys/fs/cgroup/memory").join(p.trim_start_matches('/')),
            ),
            None => {
                let p = own.lines().find_map(|l| l.strip_prefix("0::")).expect("a cgroup");
                (true, Path::new("/sys/fs/cgroup").join(p.trim_start_matches('/')))
            }
        };
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let cg = Cgroup { dir, v2 };
        let file = if v2 { "memory.max" } else { "memory.limit_in_bytes" };
        std::fs::write(cg.dir.join(file), limit.to_string()).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (v2: is the memory controller on?)",
                cg.dir.join(file).display()
            )
        });
        cg
    }

    /// Runs `cmd` inside the cgroup (the child moves itself in before exec), within 120 s.
    fn run(&self, cmd: &mut Command) -> Output {
        use std::os::unix::process::CommandExt;
        let procs = std::ffi::CString::new(self.dir.join("cgroup.procs").to_str().unwrap()).unwrap();
        // SAFETY: the child writes "0" (itself) to cgroup.procs with open/write/close only.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            })
        };
        run(cmd, Duration::from_secs(120))
    }

    /// Times the kernel's OOM killer killed in the cgroup so far.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The most the cgroup ever used, MiB (v2 kernels before 5.19 have no memory.peak: 0).
    fn peak_mib(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .map_or(0, |b| b >> 20)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Its processes have exited or been killed (the time limit kills the whole group):
        // the kernel may take a moment to let them go.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

const ARGS: [&str; 4] = ["16", "16", "32", "300"];
const OK: &str = "children 32: ok 32, killed 0 (last signal 0), other 0\n";

#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn processes_sharing_a_memory_cgroup_fit_it_under_the_shim_as_natively() {
    let dir = temp_dir("round3-cgroup");
    let prog = cc("forkbomb", &dir, false);
    let cg = Cgroup::new("zerofault-test-forkbomb", 1100 << 20);
    let native = cg.run(Command::new(&prog).args(ARGS));
    assert_eq!(
        (native.status.code(), stdout(&native).as_str(), cg.oom_kills()),
        (Some(0), OK, 0),
        "natively, the children must fit the cgroup (peak {} MiB): {}",
        cg.peak_mib(),
        stderr(&native)
    );
    for round in 0..3 {
        let shim = cg.run(zerofault().args(["run", "--stats", "--"]).arg(&prog).args(ARGS));
        assert_eq!(
            (shim.status.code(), stdout(&shim).as_str(), cg.oom_kills()),
            (Some(0), OK, 0),
            "round {round}: a child OOM-killed under the shim (peak {} MiB): {}",
            cg.peak_mib(),
            stderr(&shim)
        );
        // The engines served the children, and their pools filled: the ledger was at work.
        for c in ["fault_events", "pool_pages_filled"] {
            assert!(counter(&shim, c) > 0, "round {round}: {c} 0: {}", stderr(&shim));
        }
    }
    drop(cg);
    std::fs::remove_dir_all(&dir).unwrap();
}
