//! `zerofault doctor`: what this machine offers zerofault, one line per check (`ok`, `warn` or
//! `missing`), what was found, and for `warn` and `missing` the commands that fix it.
//!
//! The checks read what the kernel shows (/proc, /sys) or ask it: a real userfaultfd for its
//! features (`zerofault::probe`, the engine's own handshake), and a self-test that serves
//! 64 MiB through the engine and reads every byte back. The exit code says whether the engine
//! can run here at all: a userfaultfd opens, and the self-test's engine started, served pages
//! and they read zero. Everything else is advice: without `UFFDIO_MOVE` (Linux < 6.8) the
//! engine still runs, copying every page (`UFFDIO_COPY`) with no pool, and THP, free page
//! reporting, NUMA, the zeroing methods, seccomp and cgroup limits change how fast, not whether.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zerofault::page::PAGE_SIZE;
use zerofault::{is_zero, Engine, Features, Options, StartError, UffdError, ZeroMethod};

/// What a check concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Ok,
    Warn,
    Missing,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Missing => "missing",
        }
    }
}

/// One line of the table.
#[derive(Debug)]
struct Check {
    name: &'static str,
    status: Status,
    found: String,
    /// One command per line, or a `# ` comment; empty for `ok`.
    fix: String,
}

fn ok(name: &'static str, found: impl Into<String>) -> Check {
    Check {
        name,
        status: Status::Ok,
        found: found.into(),
        fix: String::new(),
    }
}

fn not_ok(name: &'static str, status: Status, found: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name,
        status,
        found: found.into(),
        fix: fix.into(),
    }
}

/// Runs every check, prints them to stdout (an aligned table, or with `json` one JSON object:
/// `engine_can_run` and `checks`, each `{name, status, found, fix}`), and returns the exit
/// code: 1 when the engine cannot run here, else 0 (warnings do not fail).
///
/// # Context
/// The command's main thread. The self-test starts an engine (its handler and scrub threads)
/// and stops it before this returns.
pub fn run(json: bool) -> u8 {
    let probe = zerofault::probe();
    let test = self_test();
    let can_run = probe.is_ok() && test.status != Status::Missing;
    let checks = vec![
        kernel(),
        access(&probe),
        uffd_move(&probe),
        thp(),
        mthp(),
        page_reporting(),
        numa(),
        zeroing(),
        seccomp(),
        cgroup_cpu(),
        cgroup_memory(),
        test,
    ];
    let out = if json {
        format!("{}\n", to_json(&checks, can_run))
    } else {
        table(&checks, can_run)
    };
    // A closed or full stdout loses the table, not the verdict: the exit code still says it.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes());
    u8::from(!can_run)
}

// ---- output ----

const WIDTH: usize = 100;
const NAME_W: usize = 21;
const STATUS_W: usize = 9;

fn to_json(checks: &[Check], can_run: bool) -> String {
    let list: Vec<serde_json::Value> = checks
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name,
                "status": c.status.as_str(),
                "found": c.found,
                "fix": if c.fix.is_empty() { None } else { Some(&c.fix) },
            })
        })
        .collect();
    serde_json::json!({ "engine_can_run": can_run, "checks": list }).to_string()
}

/// `text` cut into lines of at most `width` characters at blanks (a longer word stays whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let last = lines.last_mut().expect("one line at least");
        if last.is_empty() {
            last.push_str(word);
        } else if last.chars().count() + 1 + word.chars().count() <= width {
            last.push(' ');
            last.push_str(word);
        } else {
            lines.push(word.to_string());
        }
    }
    lines
}

fn table(checks: &[Check], can_run: bool) -> String {
    let mut s = format!("{:<NAME_W$}{:<STATUS_W$}{}\n", "CHECK", "STATUS", "FOUND");
    let indent = NAME_W + STATUS_W;
    for c in checks {
        for (i, l) in wrap(&c.found, WIDTH - indent).iter().enumerate() {
            if i == 0 {
                let _ = writeln!(s, "{:<NAME_W$}{:<STATUS_W$}{l}", c.name, c.status.as_str());
            } else {
                let _ = writeln!(s, "{:indent$}{l}", "");
            }
        }
        // Commands stay whole (a cut command is worse than a long line); comments wrap.
        for l in c.fix.lines() {
            match l.strip_prefix("# ") {
                Some(note) => wrap(note, WIDTH - 4).iter().for_each(|w| {
                    let _ = writeln!(s, "  # {w}");
                }),
                None => {
                    let _ = writeln!(s, "  $ {l}");
                }
            }
        }
    }
    s.push_str(if can_run {
        "\nengine: can run here (warnings only make it slower)\n"
    } else {
        "\nengine: cannot run here (fix the lines marked missing)\n"
    });
    s
}

// ---- helpers ----

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// The bracketed choice of a sysfs setting (`always [madvise] never` → `madvise`).
fn selected(setting: &str) -> Option<&str> {
    setting
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
}

/// A field of /proc/self/status.
fn status_field(name: &str) -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

fn errno_name(e: i32) -> String {
    match e {
        libc::EACCES => "EACCES".into(),
        libc::EPERM => "EPERM".into(),
        libc::ENOENT => "ENOENT (no such device)".into(),
        libc::ENOSYS => "ENOSYS (no userfaultfd in this kernel)".into(),
        libc::EINVAL => "EINVAL".into(),
        e => format!("errno {e}"),
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn mib(bytes: u64) -> String {
    if bytes >= 10 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

// ---- kernel and userfaultfd ----

/// `6.18.44-fc` → (6, 18).
fn version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
    Some((major, minor.parse().ok()?))
}

fn kernel() -> Check {
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_default();
    match version(&release) {
        Some(v) if v >= (6, 8) => ok("kernel", format!("Linux {release} (6.8 or later: UFFDIO_MOVE)")),
        Some(_) => not_ok(
            "kernel",
            Status::Warn,
            format!(
                "Linux {release}, older than 6.8: no UFFDIO_MOVE, so the engine copies every page \
                 (UFFDIO_COPY) and keeps no pool"
            ),
            "# install Linux 6.8 or later (your distribution's kernel package), then reboot",
        ),
        None => not_ok(
            "kernel",
            Status::Warn,
            format!("cannot read the version from /proc/sys/kernel/osrelease ({release:?})"),
            "# check with: uname -r (zerofault needs Linux 6.8 or later for UFFDIO_MOVE)",
        ),
    }
}

fn feature_names(f: Features) -> String {
    let names = [
        (Features::MOVE, "MOVE"),
        (Features::EVENT_REMAP, "EVENT_REMAP"),
        (Features::EVENT_REMOVE, "EVENT_REMOVE"),
        (Features::EVENT_UNMAP, "EVENT_UNMAP"),
        (Features::THREAD_ID, "THREAD_ID"),
    ];
    let on: Vec<&str> = names.iter().filter(|(b, _)| f.has(*b)).map(|(_, n)| *n).collect();
    if on.is_empty() {
        "none".into()
    } else {
        on.join(", ")
    }
}

fn uffd_move(probe: &Result<Features, UffdError>) -> Check {
    const NAME: &str = "UFFDIO_MOVE";
    match probe {
        Ok(f) if f.has(Features::MOVE) => ok(
            NAME,
            format!(
                "offered by UFFDIO_API; of the features the engine asks for: {}",
                feature_names(*f)
            ),
        ),
        Ok(f) => not_ok(
            NAME,
            Status::Warn,
            format!(
                "not offered by UFFDIO_API (of the engine's features: {}): the engine runs, \
                 copying every page (UFFDIO_COPY), with no pool",
                feature_names(*f)
            ),
            "# install Linux 6.8 or later (built with CONFIG_USERFAULTFD), then reboot",
        ),
        Err(UffdError::Open { .. }) => not_ok(
            NAME,
            Status::Missing,
            "cannot ask: no userfaultfd opens for this user",
            "# give this user userfaultfd first (the userfaultfd access line)",
        ),
        Err(e) => not_ok(
            NAME,
            Status::Missing,
            format!("cannot ask: {e}"),
            "# give this user userfaultfd first (the userfaultfd access line)",
        ),
    }
}

/// capability(7) number of CAP_SYS_PTRACE (bit 19 of `CapEff`).
const CAP_SYS_PTRACE: u32 = 19;

/// The ways this process could open a userfaultfd.
struct Access {
    euid: u32,
    user: String,
    ptrace: bool,
    /// /dev/userfaultfd: owner, group, mode; whether it opened (or the errno).
    dev: Option<(String, String, u32)>,
    dev_open: Result<(), i32>,
    syscall: Result<(), i32>,
    sysctl: Option<String>,
}

/// The name of `id` in /etc/passwd or /etc/group, else the number.
fn id_name(file: &str, id: u32) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)?.parse::<u32>().ok()? == id).then(|| name.to_string())
        })
        .unwrap_or_else(|| id.to_string())
}

fn access_now() -> Access {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let caps = status_field("CapEff").and_then(|c| u64::from_str_radix(&c, 16).ok());
    let dev = std::fs::metadata("/dev/userfaultfd").ok().map(|m| {
        (
            id_name("/etc/passwd", m.uid()),
            id_name("/etc/group", m.gid()),
            m.mode() & 0o7777,
        )
    });
    // SAFETY: open(2) of a NUL-terminated literal; the descriptor is closed at once.
    let fd = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    let dev_open = if fd >= 0 {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(fd) };
        Ok(())
    } else {
        Err(last_errno())
    };
    // SAFETY: userfaultfd(2) takes one int of flags (no UFFD_USER_MODE_ONLY: as the engine
    // asks); the descriptor is closed at once.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
    let syscall = if fd >= 0 {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(fd as i32) };
        Ok(())
    } else {
        Err(last_errno())
    };
    Access {
        euid,
        user: id_name("/etc/passwd", euid),
        ptrace: caps.is_some_and(|c| c & (1 << CAP_SYS_PTRACE) != 0),
        dev,
        dev_open,
        syscall,
        sysctl: read("/proc/sys/vm/unprivileged_userfaultfd"),
    }
}

fn access_found(a: &Access) -> String {
    let who = match (a.euid, a.ptrace) {
        (0, _) => "root (euid 0)".to_string(),
        (u, true) => format!("uid {u} ({}) with CAP_SYS_PTRACE", a.user),
        (u, false) => format!("uid {u} ({}), no CAP_SYS_PTRACE", a.user),
    };
    let dev = match (&a.dev, a.dev_open) {
        (None, _) => "no /dev/userfaultfd (Linux < 6.1)".to_string(),
        (Some((o, g, m)), Ok(())) => format!("/dev/userfaultfd {o}:{g} {m:04o} opens"),
        (Some((o, g, m)), Err(e)) => format!("/dev/userfaultfd {o}:{g} {m:04o}: {}", errno_name(e)),
    };
    let syscall = match a.syscall {
        Ok(()) => "works".to_string(),
        Err(e) => errno_name(e),
    };
    let sysctl = a.sysctl.as_deref().unwrap_or("absent");
    format!("{who}; {dev}; userfaultfd(2) {syscall}; vm.unprivileged_userfaultfd={sysctl}")
}

fn access_fix(user: &str) -> String {
    // usermod takes a name: a uid with none in /etc/passwd (a container's) gets a placeholder.
    let user = if user.parse::<u32>().is_ok() { "USER" } else { user };
    format!(
        "# least privilege: a userfaultfd group owning /dev/userfaultfd, this user in it \
         (log in again after usermod)\n\
         groupadd -r userfaultfd\n\
         chgrp userfaultfd /dev/userfaultfd\n\
         chmod 0660 /dev/userfaultfd\n\
         usermod -aG userfaultfd {user}\n\
         # and a udev rule, /etc/udev/rules.d/60-userfaultfd.rules, so that it stays so after a reboot:\n\
         cd /etc/udev/rules.d\n\
         echo 'KERNEL==\"userfaultfd\", GROUP=\"userfaultfd\", MODE=\"0660\"' >60-userfaultfd.rules\n\
         # broad alternative (opens userfaultfd to every user of the machine):\n\
         sysctl -w vm.unprivileged_userfaultfd=1"
    )
}

fn access(probe: &Result<Features, UffdError>) -> Check {
    const NAME: &str = "userfaultfd access";
    let a = access_now();
    let found = access_found(&a);
    match probe {
        Ok(_) => ok(NAME, found),
        // The open errors are in `found` already; a failed handshake is not.
        Err(UffdError::Open { .. }) => not_ok(NAME, Status::Missing, found, access_fix(&a.user)),
        Err(e) => not_ok(
            NAME,
            Status::Missing,
            format!("{found}; the engine: {e}"),
            access_fix(&a.user),
        ),
    }
}

// ---- memory ----

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

fn thp() -> Check {
    const NAME: &str = "THP";
    let (Some(enabled), Some(defrag)) = (read(format!("{THP}/enabled")), read(format!("{THP}/defrag"))) else {
        return not_ok(
            NAME,
            Status::Warn,
            format!("no {THP}: the pool keeps 4 KiB pages only"),
            "# use a kernel built with CONFIG_TRANSPARENT_HUGEPAGE",
        );
    };
    let e = selected(&enabled).unwrap_or("?");
    let d = selected(&defrag).unwrap_or("?");
    let pmd = read(format!("{THP}/hugepages-2048kB/enabled"));
    thp_check(e, d, pmd.as_deref().and_then(selected))
}

/// The THP line from the settings: `enabled`, `defrag` and `hugepages-2048kB/enabled`.
fn thp_check(e: &str, d: &str, pmd: Option<&str>) -> Check {
    const NAME: &str = "THP";
    let mut found = format!("enabled={e} defrag={d}");
    if let Some(p) = pmd {
        let _ = write!(found, " hugepages-2048kB={p}");
    }
    // Since Linux 6.8 the top-level setting rules only the sizes set to `inherit`.
    let own = pmd.filter(|p| *p != "inherit");
    if own.unwrap_or(e) == "never" {
        found.push_str(": no 2 MiB page is made, the pool keeps 4 KiB pages only (each 2 MiB costs 512 moves)");
        let fix = match own {
            Some(_) => format!("echo madvise >{THP}/hugepages-2048kB/enabled"),
            None => format!("echo madvise >{THP}/enabled"),
        };
        return not_ok(NAME, Status::Warn, found, fix);
    }
    if d == "never" {
        found.push_str(": no compaction for huge pages, the pool falls back to 4 KiB when memory is fragmented");
        return not_ok(NAME, Status::Warn, found, format!("echo madvise >{THP}/defrag"));
    }
    found.push_str(": the pool takes 2 MiB huge pages (MADV_HUGEPAGE)");
    ok(NAME, found)
}

/// The entries of directory `dir` as (name, path); none if it cannot be read.
fn entries(dir: impl AsRef<Path>) -> impl Iterator<Item = (String, PathBuf)> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
}

fn mthp() -> Check {
    const NAME: &str = "mTHP sizes";
    let mut sizes: Vec<(u64, String)> = entries(THP)
        .filter_map(|(name, path)| {
            let kb = name.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
            let setting = read(path.join("enabled"))?;
            Some((kb, selected(&setting)?.to_string()))
        })
        .collect();
    if sizes.is_empty() {
        return ok(NAME, "no per-size controls (hugepages-*kB; Linux < 6.8)");
    }
    sizes.sort();
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for (kb, s) in sizes {
        match groups.iter_mut().find(|(g, _)| *g == s) {
            Some((_, v)) => v.push(format!("{kb}kB")),
            None => groups.push((s, vec![format!("{kb}kB")])),
        }
    }
    let text: Vec<String> = groups.iter().map(|(s, v)| format!("{s}: {}", v.join(" "))).collect();
    ok(NAME, text.join("; "))
}

/// virtio_balloon devices bound to the driver, each with whether it negotiated
/// VIRTIO_BALLOON_F_REPORTING (feature bit 5: the `features` file is one character per bit).
fn balloons() -> Vec<(String, bool)> {
    let dir = "/sys/bus/virtio/drivers/virtio_balloon";
    let mut v: Vec<(String, bool)> = entries(dir)
        .filter_map(|(name, path)| {
            name.starts_with("virtio").then_some(())?;
            let features = read(path.join("features")).unwrap_or_default();
            Some((name, features.as_bytes().get(5) == Some(&b'1')))
        })
        .collect();
    v.sort();
    v
}

fn page_reporting() -> Check {
    const NAME: &str = "free page reporting";
    let params = Path::new("/sys/module/page_reporting/parameters");
    let order = read(params.join("page_reporting_order"));
    let reported = read(params.join("reported_kib")).and_then(|k| k.parse::<u64>().ok());
    let mut extra = String::new();
    if let Some(o) = &order {
        let _ = write!(extra, " (page_reporting_order {o}");
        if let Some(kib) = reported {
            let _ = write!(extra, ", {} reported so far", mib(kib << 10));
        }
        extra.push(')');
    }
    let all = balloons();
    let reporting: Vec<&str> = all.iter().filter(|(_, r)| *r).map(|(n, _)| n.as_str()).collect();
    if let Some(dev) = reporting.first() {
        return not_ok(
            NAME,
            Status::Warn,
            format!(
                "virtio_balloon {} negotiated free page reporting{extra}: memory free for a few \
                 seconds goes back to the host, and a huge page made of it costs ~4 ms of host \
                 faults at its first touch",
                reporting.join(", ")
            ),
            format!(
                "# on the host, turn reporting off on the balloon device (QEMU: -device \
                 virtio-balloon,free-page-reporting=off; other VMMs: their balloon's setting)\n\
                 # or in this guest, giving up the balloon until it is bound again:\n\
                 echo {dev} >/sys/bus/virtio/drivers/virtio_balloon/unbind"
            ),
        );
    }
    if reported.is_some_and(|k| k > 0) {
        return not_ok(
            NAME,
            Status::Warn,
            format!("free pages are reported to the host by a driver other than virtio_balloon{extra}"),
            "# turn free page reporting off in the hypervisor's balloon settings",
        );
    }
    let found = match (all.is_empty(), &order) {
        (false, _) => format!("virtio_balloon {} without free page reporting", all[0].0),
        (true, Some(_)) => format!(
            "no virtio_balloon device; reporting is built in{extra} (other reporting drivers, \
             such as hv_balloon, are not detected)"
        ),
        (true, None) => "no virtio_balloon device, no page_reporting in this kernel".into(),
    };
    ok(NAME, found)
}

fn numa() -> Check {
    const NAME: &str = "NUMA nodes";
    let mut nodes: Vec<(u32, u64)> = entries("/sys/devices/system/node")
        .filter_map(|(name, path)| {
            let id = name.strip_prefix("node")?.parse().ok()?;
            let meminfo = std::fs::read_to_string(path.join("meminfo")).ok()?;
            let kb = meminfo.lines().find_map(|l| {
                let rest = l.split_once("MemTotal:")?.1;
                rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
            })?;
            Some((id, kb << 10))
        })
        .collect();
    nodes.sort();
    if nodes.is_empty() {
        return ok(NAME, "no /sys/devices/system/node: one node assumed, one pool");
    }
    let list: Vec<String> = nodes.iter().map(|(id, b)| format!("node{id} {}", mib(*b))).collect();
    let with_memory = nodes.iter().filter(|(_, b)| *b > 0).count();
    let pools = if with_memory > 1 {
        "a pool per node the process may use"
    } else {
        "one pool"
    };
    let plural = if nodes.len() == 1 { "" } else { "s" };
    ok(
        NAME,
        format!("{} node{plural} ({}): {pools}", nodes.len(), list.join(", ")),
    )
}

fn zeroing() -> Check {
    const NAME: &str = "zeroing methods";
    let (have, lack): (Vec<ZeroMethod>, Vec<ZeroMethod>) =
        ZeroMethod::ALL.into_iter().partition(|m| m.available().is_ok());
    let have: Vec<String> = have
        .iter()
        .map(|m| match m.available() {
            Ok(v) if matches!(m, ZeroMethod::Nt) => format!("nt ({v})"),
            _ => m.name().to_string(),
        })
        .collect();
    let lack: Vec<&str> = lack.iter().map(|m| m.name()).collect();
    let mut found = format!("available: {}", have.join(", "));
    if !lack.is_empty() {
        let _ = write!(found, "; not on this machine: {}", lack.join(", "));
    }
    let wanted = std::env::var("ZEROFAULT_ZERO_METHOD").ok();
    if let Some(m) = wanted
        .as_deref()
        .and_then(|w| ZeroMethod::ALL.into_iter().find(|m| m.name() == w))
    {
        if let Err(why) = m.available() {
            let _ = write!(found, "; ZEROFAULT_ZERO_METHOD={} is not: {why}", m.name());
            return not_ok(NAME, Status::Warn, found, "unset ZEROFAULT_ZERO_METHOD");
        }
    }
    found.push_str(" (zero_method=auto measures them and keeps the fastest)");
    ok(NAME, found)
}

// ---- the process's confinement ----

fn seccomp() -> Check {
    const NAME: &str = "seccomp";
    let mode = status_field("Seccomp");
    let filters = status_field("Seccomp_filters").unwrap_or_else(|| "?".into());
    match mode.as_deref() {
        None => ok(NAME, "no Seccomp field in /proc/self/status (no CONFIG_SECCOMP)"),
        Some("0") => ok(NAME, "no filter on this process"),
        Some(m) => not_ok(
            NAME,
            Status::Warn,
            format!(
                "mode {m} ({filters} filter(s)) on this process: the self-test ran under it, but a \
                 call it refuses later (ioctl, madvise, clone) makes the engine step aside"
            ),
            "# run outside the filter, or allow userfaultfd, ioctl, madvise, mmap, mremap, clone in \
             its profile (docker/podman: --security-opt seccomp=PROFILE.json)",
        ),
    }
}

/// Mount points of cgroup file systems: (fstype, mount point, super options).
fn cgroup_mounts() -> Vec<(String, PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let (fstype, super_opts) = (r.next()?, r.nth(1).unwrap_or(""));
            fstype
                .starts_with("cgroup")
                .then(|| (fstype.to_string(), PathBuf::from(point), super_opts.to_string()))
        })
        .collect()
}

/// The directories of this process's cgroup holding `controller`'s files, each with whether it
/// is cgroup v2, itself first, then its ancestors up to the mount point.
fn cgroup_dirs(controller: &str) -> Vec<(PathBuf, bool)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mounts = cgroup_mounts();
    let v1 = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        ctl.split(',').any(|c| c == controller).then_some(path)
    });
    let (path, mount, v2) = match v1 {
        Some(p) => {
            let m = mounts
                .iter()
                .find(|(t, _, o)| t == "cgroup" && o.split(',').any(|c| c == controller));
            (p, m, false)
        }
        None => {
            let p = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/");
            (p, mounts.iter().find(|(t, _, _)| t == "cgroup2"), true)
        }
    };
    let Some((_, root, _)) = mount else { return Vec::new() };
    let mut dir = root.join(path.trim_start_matches('/'));
    let mut out = Vec::new();
    while dir.starts_with(root) {
        out.push((dir.clone(), v2));
        if !dir.pop() {
            break;
        }
    }
    out
}

/// The lowest CPU quota of the cgroup and its ancestors, in CPUs, and the file that sets it.
fn cpu_quota() -> Option<(f64, PathBuf)> {
    let quota_of = |dir: &Path, v2: bool| -> Option<(f64, PathBuf)> {
        if v2 {
            let file = dir.join("cpu.max");
            let text = read(&file)?;
            let (q, p) = text.split_once(' ')?;
            Some((q.parse::<f64>().ok()? / p.parse::<f64>().ok()?, file))
        } else {
            let file = dir.join("cpu.cfs_quota_us");
            let q = read(&file)?.parse::<f64>().ok().filter(|q| *q > 0.0)?;
            Some((q / read(dir.join("cpu.cfs_period_us"))?.parse::<f64>().ok()?, file))
        }
    };
    cgroup_dirs("cpu")
        .iter()
        .filter_map(|(d, v2)| quota_of(d, *v2))
        .min_by(|a, b| a.0.total_cmp(&b.0))
}

/// The lowest memory limit of the cgroup and its ancestors, bytes, and the file that sets it.
fn memory_limit() -> Option<(u64, PathBuf)> {
    cgroup_dirs("memory")
        .iter()
        .filter_map(|(d, v2)| {
            let file = d.join(if *v2 { "memory.max" } else { "memory.limit_in_bytes" });
            let v = read(&file)?.parse::<u64>().ok().filter(|v| *v < 1 << 60)?;
            Some((v, file))
        })
        .min_by_key(|(v, _)| *v)
}

/// The command that lifts the limit `file` sets.
fn lift(file: &Path) -> String {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let value = match name {
        "cpu.max" => "'max 100000'",
        "memory.max" => "max",
        _ => "-1",
    };
    format!("echo {value} >{}", file.display())
}

fn cgroup_cpu() -> Check {
    const NAME: &str = "cgroup CPU quota";
    // Online CPUs (std's available_parallelism already divides by the quota).
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
    match cpu_quota() {
        Some((q, file)) if q < 2.0 && cpus >= 2 => not_ok(
            NAME,
            Status::Warn,
            format!(
                "{q:.2} CPUs of {cpus} ({}): the scrub thread, which zeroes pages beside the \
                 program, takes from the program's own CPU time",
                file.display()
            ),
            format!(
                "# give the cgroup two CPUs or more, e.g. lift the quota (systemd: systemctl \
                 set-property UNIT CPUQuota=200%):\n{}",
                lift(&file)
            ),
        ),
        Some((q, file)) => ok(NAME, format!("{q:.2} CPUs of {cpus} ({})", file.display())),
        None => ok(NAME, format!("no quota ({cpus} CPUs online)")),
    }
}

fn cgroup_memory() -> Check {
    const NAME: &str = "cgroup memory limit";
    let pool_max = Options::default().pool_max as u64;
    match memory_limit() {
        Some((limit, file)) if limit / 8 < 2 * 2 * 1024 * 1024 => not_ok(
            NAME,
            Status::Warn,
            format!(
                "{} ({}): an eighth of it is under two huge pages, so the engine keeps no pool \
                 and copies every page",
                mib(limit),
                file.display()
            ),
            format!(
                "# raise the limit (systemd: systemctl set-property UNIT MemoryMax=...), or lift it:\n{}",
                lift(&file)
            ),
        ),
        Some((limit, file)) => ok(
            NAME,
            format!(
                "{} ({}): the engine's pool is held to an eighth of it ({} of the default {})",
                mib(limit),
                file.display(),
                mib((limit / 8).min(pool_max)),
                mib(pool_max)
            ),
        ),
        None => ok(NAME, "no limit (cgroup v2 memory.max, v1 memory.limit_in_bytes)"),
    }
}

// ---- self-test ----

/// What the self-test serves, where memory allows.
const TEST_BYTES: usize = 64 << 20;
/// The least it serves: below it, inside a memory cgroup with little room, it is not run.
const TEST_MIN: usize = 4 << 20;

/// What the self-test serves: [`TEST_BYTES`], or inside a memory cgroup with less room a
/// quarter of what it has left (its limit less its usage: the engine's pool and the program's
/// memory share it), in whole 2 MiB; None below [`TEST_MIN`].
fn test_bytes() -> Option<usize> {
    let Some((limit, file)) = memory_limit() else {
        return Some(TEST_BYTES);
    };
    let dir = file.parent().unwrap_or(Path::new("/"));
    let usage = ["memory.current", "memory.usage_in_bytes"]
        .iter()
        .find_map(|f| read(dir.join(f))?.parse::<u64>().ok())
        .unwrap_or(limit);
    let room = usize::try_from(limit.saturating_sub(usage) / 4).unwrap_or(usize::MAX);
    let bytes = TEST_BYTES.min(room / (2 << 20) * (2 << 20));
    (bytes >= TEST_MIN).then_some(bytes)
}

struct TestRun {
    bytes: usize,
    pages: usize,
    /// The engine stepped aside (an unexpected error: the kernel serves from then on), and
    /// the errno of the first.
    fail_opens: u64,
    errno: u64,
    served: u64,
    moved: u64,
    copied: u64,
    bad: usize,
    touch: Duration,
    total: Duration,
}

/// Starts an engine with the environment's knobs, maps `bytes` through it, writes a zero byte
/// to each page (its first touch: a write fault the engine serves), reads every byte, and
/// stops the engine.
fn serve_and_check(bytes: usize) -> Result<TestRun, String> {
    let t0 = Instant::now();
    let opts = Options::from_env().map_err(|e| e.to_string())?;
    let engine = Engine::new(opts).map_err(|e| match e {
        StartError::Uffd(UffdError::Open { .. }) => {
            "the engine did not start: no userfaultfd opens (the userfaultfd access line)".to_string()
        }
        e => format!("the engine did not start: {e}"),
    })?;
    let region = engine.map(bytes).map_err(|e| format!("map: {e}"))?;
    let base = region.as_ptr();
    let pages = bytes / PAGE_SIZE;
    let before = engine.stats();
    let t1 = Instant::now();
    for i in 0..pages {
        // SAFETY: page `i` lies inside the region, ours until it is dropped below.
        unsafe { base.add(i * PAGE_SIZE).write_volatile(0) };
    }
    let touch = t1.elapsed();
    // SAFETY: the whole region, every page written above, read while nobody writes to it.
    let all = unsafe { std::slice::from_raw_parts(base, bytes) };
    let bad = if is_zero(all) {
        0
    } else {
        all.iter().filter(|b| **b != 0).count()
    };
    let s = engine.stats().since(&before);
    drop(region);
    drop(engine);
    Ok(TestRun {
        bytes,
        pages,
        fail_opens: s.fail_opens,
        errno: s.fail_open_errno,
        served: s.pages_served(),
        moved: s.pages_moved,
        copied: s.pages_copied,
        bad,
        touch,
        total: t0.elapsed(),
    })
}

fn self_test() -> Check {
    const NAME: &str = "self-test";
    let fix = "# fix the lines marked missing or warned of above; `zerofault verify --gb 0.25` shows more";
    let Some(bytes) = test_bytes() else {
        return not_ok(
            NAME,
            Status::Warn,
            format!("not run: the memory cgroup has under {} MiB left", 4 * (TEST_MIN >> 20)),
            "# run doctor where the program will run, with room for it",
        );
    };
    let t = match serve_and_check(bytes) {
        Ok(t) => t,
        Err(e) => return not_ok(NAME, Status::Missing, format!("{}: {e}", mib(bytes as u64)), fix),
    };
    let found = format!(
        "{}: {} of {} pages served by the engine ({} moved from the pool, {} copied), {}{}; \
         touch {:.1} ms, all {:.1} ms (engine start and stop included)",
        mib(t.bytes as u64),
        t.served,
        t.pages,
        t.moved,
        t.copied,
        if t.bad == 0 {
            "every byte reads zero".to_string()
        } else {
            format!("{} bytes NOT zero", t.bad)
        },
        match t.fail_opens {
            0 => String::new(),
            _ => format!(
                "; the engine stepped aside ({}): the kernel served the rest",
                errno_name(t.errno as i32)
            ),
        },
        t.touch.as_secs_f64() * 1e3,
        t.total.as_secs_f64() * 1e3,
    );
    // Every page, by the engine: one that stepped aside part of the way cannot run here.
    if t.bad == 0 && t.served >= t.pages as u64 && t.fail_opens == 0 {
        ok(NAME, found)
    } else {
        not_ok(NAME, Status::Missing, found, fix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_settings_parse() {
        assert_eq!(version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(version("6.8.0-rc3"), Some((6, 8)));
        assert_eq!(version("5.15"), Some((5, 15)));
        assert_eq!(version("garbage"), None);
        assert_eq!(selected("always [madvise] never"), Some("madvise"));
        assert_eq!(selected("always madvise never"), None);
    }

    #[test]
    fn the_2_mib_size_follows_its_own_setting_unless_it_inherits() {
        let st = |e, d, pmd| thp_check(e, d, pmd).status;
        assert_eq!(st("madvise", "madvise", Some("inherit")), Status::Ok);
        assert_eq!(
            st("never", "madvise", Some("madvise")),
            Status::Ok,
            "its own setting rules"
        );
        assert_eq!(st("never", "madvise", Some("inherit")), Status::Warn);
        assert_eq!(st("never", "madvise", None), Status::Warn, "before mTHP: the top level");
        let c = thp_check("always", "madvise", Some("never"));
        assert_eq!(c.status, Status::Warn);
        assert!(c.fix.contains("hugepages-2048kB/enabled"), "{}", c.fix);
        assert!(thp_check("never", "madvise", Some("inherit"))
            .fix
            .ends_with("transparent_hugepage/enabled"));
        assert_eq!(st("madvise", "never", Some("inherit")), Status::Warn);
    }

    #[test]
    fn found_text_wraps_at_blanks_and_keeps_long_words() {
        let w = wrap("aaa bbb ccc dddddddddd", 7);
        assert_eq!(w, vec!["aaa bbb", "ccc", "dddddddddd"]);
    }

    #[test]
    fn the_table_keeps_commands_whole_within_100_columns() {
        let c = not_ok(
            "userfaultfd access",
            Status::Missing,
            "x ".repeat(100),
            access_fix("nobody"),
        );
        let t = table(&[c], false);
        assert!(t.lines().all(|l| l.chars().count() <= WIDTH), "{t}");
        assert!(t.contains("  $ usermod -aG userfaultfd nobody\n"), "{t}");
        assert!(t.contains("  $ sysctl -w vm.unprivileged_userfaultfd=1\n"), "{t}");
    }
}
