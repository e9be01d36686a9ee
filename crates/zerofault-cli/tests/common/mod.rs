//! Helpers shared by the tests that run programs under the shim: the binary and the shim of
//! this build, the C programs of crates/zerofault-preload/tests/c, running a program with a time
//! limit (a hang fails the test, with what the program printed), and reading the shim's report.
#![allow(dead_code)] // each test file uses its own part

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub fn zerofault() -> Command {
    Command::new(env!("CARGO_BIN_EXE_zerofault"))
}

/// The directory holding this build's shim: its front libzerofault.so and the shim proper
/// libzerofault_shim.so (cargo puts them in `deps/`).
pub fn lib_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_zerofault"));
    let dir = exe.parent().unwrap().to_path_buf();
    let mtime = |d: &PathBuf| {
        d.join("libzerofault_shim.so")
            .metadata()
            .and_then(|m| m.modified())
            .ok()
    };
    [dir.clone(), dir.join("deps")]
        .into_iter()
        .filter(|d| d.join("libzerofault.so").is_file() && d.join("libzerofault_shim.so").is_file())
        .max_by_key(mtime)
        .expect("libzerofault.so and libzerofault_shim.so built beside the zerofault binary")
}

/// The shim of this build (its front), to put in LD_PRELOAD by hand.
pub fn shim() -> PathBuf {
    lib_dir().join("libzerofault.so")
}

/// The shim proper, which the front loads on the first large request; to preload it directly
/// (as before the front existed).
pub fn shim_proper() -> PathBuf {
    lib_dir().join("libzerofault_shim.so")
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zerofault-run-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles one of the C programs of crates/zerofault-preload/tests/c.
pub fn cc(name: &str, dir: &Path, link_api: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../zerofault-preload/tests/c")
        .join(format!("{name}.c"));
    let out = dir.join(name);
    let mut c = Command::new("cc");
    c.args(["-O2", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&out)
        .arg(&src);
    if link_api {
        let lib = lib_dir();
        c.arg("-I")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../zerofault-preload/include"))
            .arg("-L")
            .arg(&lib)
            .arg("-lzerofault")
            .arg(format!("-Wl,-rpath,{}", lib.display()));
    }
    let o = run(&mut c, Duration::from_secs(120));
    assert!(o.status.success(), "cc {name}: {}", String::from_utf8_lossy(&o.stderr));
    out
}

/// How long each of the two runs of [`both`] may last.
pub const BOTH_LIMIT: Duration = Duration::from_secs(180);

/// `program args` plainly, and under `zerofault run --stats`, each within [`BOTH_LIMIT`].
pub fn both(program: &str, args: &[&str], dir: &Path) -> (Output, Output) {
    let plain = run(Command::new(program).args(args).current_dir(dir), BOTH_LIMIT);
    let shim = run(
        zerofault()
            .args(["run", "--stats", "--", program])
            .args(args)
            .current_dir(dir),
        BOTH_LIMIT,
    );
    (plain, shim)
}

/// Runs `cmd` to its end, its output captured; panics (with that output) if it is still running
/// after `limit`, having killed it and its process group.
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    try_run(cmd, limit).unwrap_or_else(|e| panic!("{e}"))
}

/// [`run`], with the failure as an error instead of a panic.
pub fn try_run(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    Running::start(cmd, limit).finish()
}

/// A program started with a time limit, in a process group of its own (so that everything it
/// starts is killed with it), its stdout and stderr collected as they come.
pub struct Running {
    child: Child,
    what: String,
    limit: Duration,
    deadline: Instant,
    rss_cap: Option<u64>,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

/// How often a running program is looked at.
const POLL: Duration = Duration::from_millis(5);

fn collect(pipe: impl Read + Send + 'static, into: &Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    let into = Arc::clone(into);
    std::thread::spawn(move || {
        let mut pipe = pipe;
        let mut buf = [0u8; 1 << 16];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    })
}

/// VmRSS of a process in bytes (None once it has exited).
fn rss_of(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    Some(kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? << 10)
}

/// The last 16 KiB of some output, as text.
fn tail(b: &[u8]) -> String {
    let from = b.len().saturating_sub(16 << 10);
    let t = String::from_utf8_lossy(&b[from..]);
    if from > 0 {
        format!("[... {from} bytes before]\n{t}")
    } else {
        t.into_owned()
    }
}

impl Running {
    pub fn start(cmd: &mut Command, limit: Duration) -> Running {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let (out, err) = (Arc::default(), Arc::default());
        let readers = vec![
            collect(child.stdout.take().unwrap(), &out),
            collect(child.stderr.take().unwrap(), &err),
        ];
        Running {
            child,
            what,
            limit,
            deadline: Instant::now() + limit,
            rss_cap: None,
            out,
            err,
            readers,
        }
    }

    /// Kills the program (and fails) if its resident memory goes above `bytes`: for programs
    /// that, when wrong, would take all the machine's memory.
    pub fn rss_cap(mut self, bytes: u64) -> Running {
        self.rss_cap = Some(bytes);
        self
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stdout_so_far(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Whether the program has exited (it is left unreaped, so that its process group cannot be
    /// reused); an error, the program killed, past the time limit or the memory cap.
    fn exited(&mut self) -> Result<bool, String> {
        // SAFETY: a zeroed siginfo_t is valid; waitid writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child, with a valid siginfo_t; WNOWAIT leaves it a zombie.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                self.child.id(),
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: waitid filled `info` (or left it zeroed: si_pid 0, still running).
        if rc == 0 && unsafe { info.si_pid() } != 0 {
            return Ok(true);
        }
        if Instant::now() >= self.deadline {
            return Err(self.kill(&format!("still running after {:?}", self.limit)));
        }
        if let (Some(cap), Some(rss)) = (self.rss_cap, rss_of(self.pid())) {
            if rss > cap {
                return Err(self.kill(&format!(
                    "resident memory {} MiB, above the test's cap of {} MiB",
                    rss >> 20,
                    cap >> 20
                )));
            }
        }
        Ok(false)
    }

    /// Kills the process group, reaps the program and describes the failure with its output.
    fn kill(&mut self, why: &str) -> String {
        // SAFETY: kill(2) of our child's process group (the child is not reaped yet).
        unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
        let status = match self.child.wait() {
            Ok(s) => s.to_string(),
            Err(e) => format!("not reaped: {e}"),
        };
        let (out, err) = self.drain();
        format!(
            "{}: {why} (process group killed; the program's end: {status})\n--- stdout:\n{}\n--- stderr:\n{}",
            self.what,
            tail(&out),
            tail(&err)
        )
    }

    /// What the program printed, once its pipes are closed (or after 10 s more: something it
    /// started holds them).
    fn drain(&mut self) -> (Vec<u8>, Vec<u8>) {
        let until = Instant::now() + Duration::from_secs(10);
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
            std::thread::sleep(POLL);
        }
        for r in std::mem::take(&mut self.readers) {
            if r.is_finished() {
                r.join().unwrap();
            }
        }
        (
            std::mem::take(&mut *self.out.lock().unwrap()),
            std::mem::take(&mut *self.err.lock().unwrap()),
        )
    }

    /// Waits until the program's stdout contains `needle`; an error if it exits first or runs
    /// out of time.
    pub fn wait_for_stdout(&mut self, needle: &str) -> Result<(), String> {
        loop {
            if self.stdout_so_far().contains(needle) {
                return Ok(());
            }
            if self.exited()? {
                return Err(self.kill(&format!("exited before printing {needle:?}")));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits for the program's end and returns its status and output.
    pub fn finish(mut self) -> Result<Output, String> {
        while !self.exited()? {
            std::thread::sleep(POLL);
        }
        // SAFETY: kill(2) of our child's process group: what it started and left behind (the
        // child itself is an unreaped zombie, so the group's id is not anyone else's).
        unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
        let status = self.child.wait().unwrap();
        let (stdout, stderr) = self.drain();
        Ok(Output { status, stdout, stderr })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A test that panicked with the program still running: leave nothing behind.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) of our unreaped child's process group.
            unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

/// stderr without the shim's report.
pub fn program_stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| !l.starts_with("zerofault: "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `pages_served` of the report of the process `zerofault run` started (the last one printed:
/// helper processes a program execs report first).
pub fn pages_served(o: &Output) -> u64 {
    let err = String::from_utf8_lossy(&o.stderr);
    err.lines()
        .filter_map(|l| l.strip_prefix("zerofault: pages_served "))
        .map(|v| v.trim().parse::<u64>().unwrap())
        .max()
        .unwrap_or_else(|| panic!("no stats report in stderr:\n{err}"))
}

/// `pages_served` of the last report in stderr, if there is a report.
pub fn served(o: &Output) -> Option<u64> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("zerofault: pages_served "))
        .map(|v| v.trim().parse::<u64>().unwrap())
        .next_back()
}

/// One counter of the last report in stderr (`zerofault: NAME   VALUE`).
pub fn counter(o: &Output, name: &str) -> u64 {
    let err = String::from_utf8_lossy(&o.stderr);
    err.lines()
        .filter_map(|l| l.strip_prefix("zerofault: "))
        .filter_map(|l| l.split_once(char::is_whitespace))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().parse::<u64>().unwrap())
        .next_back()
        .unwrap_or_else(|| panic!("no {name} in the report in stderr:\n{err}"))
}

/// A `KEY=N` line the program printed to stderr (the last one).
pub fn measured(o: &Output, key: &str) -> i64 {
    let err = String::from_utf8_lossy(&o.stderr);
    err.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.trim().parse::<i64>().unwrap())
        .next_back()
        .unwrap_or_else(|| panic!("no {key}= line in stderr:\n{err}"))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn assert_same(plain: &Output, shim: &Output) {
    assert_eq!(plain.status.code(), shim.status.code(), "exit status");
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&shim.stdout),
        "stdout"
    );
    assert_eq!(program_stderr(plain), program_stderr(shim), "stderr");
}

/// A memory cgroup of its own: a child of this process's memory cgroup (v1's memory hierarchy
/// where it is mounted, else v2's), removed when dropped, also when the test fails (tests/memory.rs,
/// tests/round3_cgroup.rs).
pub struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    pub fn new(name: &str, limit: u64) -> Cgroup {
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
    pub fn run(&self, cmd: &mut Command) -> Output {
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
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The most the cgroup ever used, MiB (v2 kernels before 5.19 have no memory.peak: 0).
    pub fn peak_mib(&self) -> u64 {
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
