//! Tests in Linux VMs with several NUMA nodes (issue 11; this machine has one node).
//!
//! QEMU under TCG (nested KVM fails in the kernel's decompressor here) boots Debian's 6.12
//! kernel from bookworm-backports (it has UFFDIO_MOVE), with `-numa node` options, and an
//! initramfs made here: a static `/init` (crates/zerofault-preload/tests/c/vminit.c) that
//! mounts proc, sysfs and devtmpfs, runs one command, prints `VMTEST rc=N` on the serial
//! console and powers off; the `zerofault` binary of this build; and the libraries it links,
//! at their paths. The test reads the console.
//!
//! The kernel is downloaded once (one `apt-get download` from the system's own Debian mirror,
//! with the backports suite in a sources list of the test's own: the system's apt sources are
//! not touched) and cached in `$ZEROFAULT_VM_CACHE`, else `$XDG_CACHE_HOME/zerofault-vm`, else
//! `~/.cache/zerofault-vm`: only its `vmlinuz` is kept. Where `qemu-system-x86_64` is not
//! installed the tests are marked ignored, except under `ZEROFAULT_REQUIRE_UFFD=1` (CI), where
//! they run and fail; `.ci/run` installs `qemu-system-x86`.
//!
//! The VM runs the debug build `cargo test` made: at TCG speed, `zerofault verify --gb 0.25`
//! takes about a minute there.

mod common;

use common::{run, temp_dir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long one VM may run: boot (~3 s under TCG), the command, power off.
const VM_LIMIT: Duration = Duration::from_secs(600);

fn cache_dir() -> PathBuf {
    let dir = std::env::var_os("ZEROFAULT_VM_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("zerofault-vm")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/zerofault-vm")))
        .unwrap_or_else(|| std::env::temp_dir().join("zerofault-vm"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot make the VM cache {}: {e}", dir.display()));
    dir
}

/// The cached 6.12 kernel image, if any.
fn cached_kernel(dir: &Path) -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-6.12."))
        })
        .collect();
    v.sort();
    v.pop()
}

/// The system's Debian mirror (the first `deb` source whose suites hold the release's
/// codename) and that codename, from /etc/apt and /etc/os-release.
fn debian_mirror() -> (String, String) {
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let codename = os
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("/etc/os-release names no VERSION_CODENAME: the VM tests fetch Debian's kernel"));
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(d) = std::fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(d.filter_map(|e| e.ok().map(|e| e.path())));
    }
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        // One-line style: deb [options] URI suite components...
        for l in text.lines() {
            let words: Vec<&str> = l.split_whitespace().filter(|w| !w.starts_with('[')).collect();
            if words.len() >= 3 && words[0] == "deb" && words[2] == codename {
                return (words[1].to_string(), codename);
            }
        }
        // deb822 style: stanzas with URIs: and Suites:.
        for stanza in text.split("\n\n") {
            let field = |name: &str| {
                stanza
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_string())
            };
            let (Some(uris), Some(suites)) = (field("URIs:"), field("Suites:")) else {
                continue;
            };
            if field("Types:").is_none_or(|t| t.split_whitespace().any(|t| t == "deb"))
                && suites.split_whitespace().any(|s| s == codename)
            {
                if let Some(uri) = uris.split_whitespace().next() {
                    return (uri.to_string(), codename);
                }
            }
        }
    }
    panic!("no Debian source for {codename} in /etc/apt: the VM tests fetch Debian's 6.12 kernel from it");
}

/// The kernel to boot: cached, or downloaded (see the module's docs). One download at a time
/// in this process (the tests of this file run in parallel).
fn kernel() -> PathBuf {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache_dir();
    if let Some(k) = cached_kernel(&cache) {
        return k;
    }
    let (uri, codename) = debian_mirror();
    let work = temp_dir("vm-kernel");
    let lists = work.join("lists");
    std::fs::create_dir_all(lists.join("partial")).unwrap();
    std::fs::create_dir_all(work.join("cache/archives/partial")).unwrap();
    let sources = work.join("sources.list");
    std::fs::write(&sources, format!("deb {uri} {codename}-backports main\n")).unwrap();
    let apt = |tool: &str| {
        let mut c = Command::new(tool);
        c.arg("-q")
            .arg(format!("-o=Dir::Etc::sourcelist={}", sources.display()))
            .arg("-o=Dir::Etc::sourceparts=-")
            .arg(format!("-o=Dir::State::Lists={}", lists.display()))
            .arg(format!("-o=Dir::Cache={}", work.join("cache").display()))
            .arg("-o=Debug::NoLocking=1")
            .arg("-o=APT::Sandbox::User=root")
            .current_dir(&work);
        c
    };
    let o = run(apt("apt-get").arg("update"), Duration::from_secs(300));
    assert!(
        o.status.success(),
        "apt-get update of {uri} {codename}-backports: {}",
        common::stderr(&o)
    );
    let o = run(
        apt("apt-cache").args(["pkgnames", "linux-image-6.12."]),
        Duration::from_secs(60),
    );
    // linux-image-6.12.<patch>+deb<N>-amd64-unsigned: the plain image, newest patch level.
    let name = common::stdout(&o)
        .lines()
        .filter(|n| n.ends_with("-amd64-unsigned") && !n.contains("-rt-") && !n.contains("-cloud-"))
        .max_by_key(|n| {
            n.trim_start_matches("linux-image-6.12.")
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|p| p.parse::<u32>().ok())
                .unwrap_or(0)
        })
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no linux-image-6.12.*-amd64-unsigned in {uri} {codename}-backports"));
    let o = run(apt("apt-get").args(["download", &name]), Duration::from_secs(600));
    assert!(o.status.success(), "apt-get download {name}: {}", common::stderr(&o));
    let deb = std::fs::read_dir(&work)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .unwrap_or_else(|| panic!("apt-get download {name} left no .deb in {}", work.display()));
    let o = run(
        Command::new("sh")
            .arg("-c")
            .arg("dpkg-deb --fsys-tarfile \"$1\" | tar -x -C \"$2\" --wildcards './boot/vmlinuz-*'")
            .arg("sh")
            .arg(&deb)
            .arg(&work),
        Duration::from_secs(120),
    );
    assert!(
        o.status.success(),
        "extracting the kernel from {}: {}",
        deb.display(),
        common::stderr(&o)
    );
    let image = std::fs::read_dir(work.join("boot"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .next()
        .expect("a vmlinuz in the package");
    let cached = cache.join(image.file_name().unwrap());
    // Renamed into place, so that a test running beside this one never boots half a file.
    let tmp = cache.join(format!(".vmlinuz.{}", std::process::id()));
    std::fs::copy(&image, &tmp).unwrap();
    std::fs::rename(&tmp, &cached).unwrap();
    std::fs::remove_dir_all(&work).unwrap();
    cached
}

/// An initramfs in the kernel's `newc` cpio format (what `cpio -H newc` writes).
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            0,
            0,
            name.len() as u32 + 1,
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.out.len() % 4 != 0 {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | mode, data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// The shared libraries `bin` links, and the dynamic loader, as `ldd` lists them.
fn libs_of(bin: &Path) -> Vec<PathBuf> {
    let o = run(Command::new("ldd").arg(bin), Duration::from_secs(60));
    assert!(o.status.success(), "ldd {}: {}", bin.display(), common::stderr(&o));
    common::stdout(&o)
        .lines()
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Boots a VM of `nodes` NUMA nodes (one CPU and `mib_per_node` MiB each) that runs
/// `zerofault args...`; returns the console output and the command's exit code.
fn boot(nodes: usize, mib_per_node: usize, args: &[&str]) -> (String, Option<i32>) {
    boot_with(nodes, mib_per_node, &[], "/zerofault", args)
}

/// [`boot`], with `extra` files (name in the VM's root, file here) and the command `cmd`.
fn boot_with(
    nodes: usize,
    mib_per_node: usize,
    extra: &[(&str, &Path)],
    cmd: &str,
    args: &[&str],
) -> (String, Option<i32>) {
    static BOOTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BOOTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = temp_dir(&format!("vm{nodes}-{n}"));
    let init = dir.join("init");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../zerofault-preload/tests/c/vminit.c");
    let o = run(
        Command::new("cc")
            .args(["-static", "-O2", "-Wall", "-Werror", "-o"])
            .arg(&init)
            .arg(&src),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "cc -static vminit.c: {}", common::stderr(&o));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_zerofault"));
    let mut cpio = Cpio::default();
    let mut dirs: Vec<String> = ["proc", "sys", "dev", "tmp"].map(String::from).to_vec();
    let mut files: Vec<(String, PathBuf)> = vec![("zerofault".into(), bin.clone())];
    files.extend(extra.iter().map(|(n, p)| (n.to_string(), p.to_path_buf())));
    for lib in libs_of(&bin) {
        let name = lib.to_string_lossy().trim_start_matches('/').to_string();
        let parts: Vec<&str> = name.split('/').collect();
        for i in 1..parts.len() {
            dirs.push(parts[..i].join("/"));
        }
        files.push((name, lib));
    }
    dirs.sort();
    dirs.dedup();
    for d in &dirs {
        cpio.dir(d);
    }
    cpio.file("init", 0o755, &std::fs::read(&init).unwrap());
    let argv: String = std::iter::once(cmd)
        .chain(args.iter().copied())
        .map(|a| format!("{a}\n"))
        .collect();
    cpio.file("args", 0o644, argv.as_bytes());
    for (name, path) in &files {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        cpio.file(name, 0o755, &data);
    }
    let initrd = dir.join("initramfs.cpio");
    std::fs::write(&initrd, cpio.finish()).unwrap();

    let mut q = Command::new("qemu-system-x86_64");
    q.args([
        "-M",
        "q35",
        "-accel",
        "tcg,thread=single",
        "-cpu",
        "max",
        "-nographic",
        "-no-reboot",
    ])
    .args(["-smp", &nodes.to_string()])
    .args(["-m", &format!("{}M", nodes * mib_per_node)]);
    for n in 0..nodes {
        q.arg("-object")
            .arg(format!("memory-backend-ram,id=m{n},size={mib_per_node}M"))
            .arg("-numa")
            .arg(format!("node,nodeid={n},cpus={n},memdev=m{n}"));
    }
    q.arg("-kernel")
        .arg(kernel())
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 rdinit=/init quiet panic=-1"]);
    let t0 = Instant::now();
    let o = run(&mut q, VM_LIMIT);
    let console = common::stdout(&o);
    eprintln!("{nodes}-node VM: {:.1} s", t0.elapsed().as_secs_f64());
    std::fs::remove_dir_all(&dir).unwrap();
    let rc = console
        .lines()
        .find_map(|l| l.trim().strip_prefix("VMTEST rc="))
        .and_then(|r| r.split_whitespace().next()?.parse().ok());
    (console, rc)
}

/// `zerofault verify` (every pattern, at a quarter GiB each: TCG is slow) passes in a 2-node and
/// a 4-node VM, whose kernel shows it the nodes.
#[test]
#[cfg_attr(
    zerofault_no_qemu,
    ignore = "qemu-system-x86_64 is not installed (.ci/run installs qemu-system-x86)"
)]
fn verify_passes_in_two_and_four_node_vms() {
    for (nodes, online) in [(2, "0-1"), (4, "0-3")] {
        let (console, rc) = boot(nodes, 2048 / nodes, &["verify", "--gb", "0.25", "--threads", "2"]);
        let seen = console
            .lines()
            .any(|l| l.trim_end().ends_with(&format!("VMTEST nodes={online}")));
        assert!(seen, "the VM's kernel shows nodes {online}:\n{console}");
        assert_eq!(
            rc,
            Some(0),
            "zerofault verify in the {nodes}-node VM:\n{}",
            console
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(console.contains("verify: all patterns passed"), "{console}");
    }
}

/// The harness reports the command's own exit code: a command that fails fails the VM's run
/// (it cannot pass by running nothing).
#[test]
#[cfg_attr(
    zerofault_no_qemu,
    ignore = "qemu-system-x86_64 is not installed (.ci/run installs qemu-system-x86)"
)]
fn the_vm_reports_the_command_exit_code() {
    let args = ["verify", "--no-such-flag"];
    let host = run(common::zerofault().args(args), Duration::from_secs(60));
    assert_ne!(host.status.code(), Some(0));
    let (console, rc) = boot(2, 512, &args);
    assert_eq!(rc, host.status.code(), "{console}");
}

/// One line of `numa_suite.c`'s output that starts with `what `, as its `key=value` pairs.
fn suite_lines<'c>(console: &'c str, what: &str) -> Vec<Vec<(&'c str, u64)>> {
    console
        .lines()
        .filter_map(|l| {
            // Not a value: "stats step=local ..." is no `local` line.
            let at = l.find(&format!("{what} "))?;
            if l[..at].ends_with('=') {
                return None;
            }
            let l = &l[at..];
            l.split_whitespace()
                .skip(1)
                .map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k, v.trim().parse().ok()?))
                })
                .collect::<Option<Vec<_>>>()
        })
        .collect()
}

fn field(line: &[(&str, u64)], key: &str) -> u64 {
    line.iter()
        .find(|(k, _)| *k == key)
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        .1
}

/// The engine's counters during step `step` of the suite.
fn step_stats<'c>(console: &'c str, step: &str) -> Vec<(&'c str, u64)> {
    let tag = format!("stats step={step} ");
    console
        .lines()
        .find_map(|l| {
            let l = &l[l.find(&tag)? + tag.len()..];
            l.split_whitespace()
                .map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k, v.trim().parse().ok()?))
                })
                .collect::<Option<Vec<_>>>()
        })
        .unwrap_or_else(|| panic!("no stats for step {step}:\n{console}"))
}

/// Where pages land (issue 11), `numa_suite.c` in a 2-node VM (natively, then under the shim)
/// and a 4-node VM (under the shim):
/// - **local**: one thread pinned to each CPU writes 256 MiB after a warm pool: at least 99%
///   of each thread's pages are on its node (natively all). Before per-node pools, with a warm
///   pool, the thread on node 1 got 15359 of 16384 pages from node 0.
/// - **bind**: a range bound to the last node gets that node's pages from a thread on node 0.
/// - **interleave**: a range interleaved over every node alternates as the kernel's would.
/// - **full**: with node 0 filled by another process, a thread on node 0 gets other nodes'
///   pages; under the shim from their pools (`numa_miss`), node 0 found full and marked
///   (`zlc_marks`) and skipped (`zlc_skips`) by the faults after; once node 0 has memory again
///   and the marks are zapped, its pages are local again.
#[test]
#[cfg_attr(
    zerofault_no_qemu,
    ignore = "qemu-system-x86_64 is not installed (.ci/run installs qemu-system-x86)"
)]
fn pages_land_on_the_nodes_the_kernel_would_pick_natively_and_under_the_shim() {
    let dir = temp_dir("vm-numa-suite");
    let prog = common::cc("numa_suite", &dir, false);
    let extra = [("numa_suite", prog.as_path())];
    let mib = 256u64;
    let pages = mib * 256;
    let arg = mib.to_string();
    for (nodes, per_node, shim) in [(2usize, 1024usize, false), (2, 1024, true), (4, 768, true)] {
        let how = if shim { "under the shim" } else { "natively" };
        let args: Vec<&str> = if shim {
            vec!["run", "--stats", "--", "/numa_suite", &arg]
        } else {
            vec![&arg]
        };
        let cmd = if shim { "/zerofault" } else { "/numa_suite" };
        let (console, rc) = boot_with(nodes, per_node, &extra, cmd, &args);
        let ctx = format!("{nodes} nodes, {how}");
        assert_eq!(rc, Some(0), "{ctx}:\n{console}");
        assert!(
            console.contains(&format!("suite nodes={nodes} shim={}", u8::from(shim))),
            "{ctx}: the suite sees the nodes and the shim:\n{console}"
        );
        let at_least = |got: u64, of: u64, pct: u64, what: &str| {
            eprintln!("{ctx}: {what}: {got} of {of}");
            assert!(
                got * 100 >= of * pct,
                "{ctx}: {what}: {got} of {of}, below {pct}%\n{console}"
            );
        };
        // local
        let threads = suite_lines(&console, "local");
        assert_eq!(threads.len(), nodes, "{ctx}: one line per CPU:\n{console}");
        let on: std::collections::BTreeSet<u64> = threads.iter().map(|t| field(t, "node")).collect();
        assert_eq!(on.len(), nodes, "{ctx}: one thread on each node: {threads:?}");
        for t in &threads {
            let (local, remote) = (field(t, "local"), field(t, "remote"));
            assert_eq!(local + remote, pages, "{ctx}: {t:?}");
            let what = format!(
                "local: cpu {} (node {}) pages on its node",
                field(t, "cpu"),
                field(t, "node")
            );
            at_least(local, pages, if shim { 99 } else { 100 }, &what);
        }
        // bind
        let bind = &suite_lines(&console, "bind")[0];
        assert_eq!(field(bind, "target"), nodes as u64 - 1);
        at_least(
            field(bind, "on"),
            field(bind, "of"),
            99,
            "bind: pages on the bound node",
        );
        // interleave
        let il = &suite_lines(&console, "interleave")[0];
        at_least(
            field(il, "match"),
            field(il, "of"),
            99,
            "interleave: pages on the interleave's node",
        );
        // full, then after
        let full = suite_lines(&console, "full")
            .into_iter()
            .find(|l| l.iter().any(|(k, _)| *k == "other"));
        let full = full.unwrap_or_else(|| panic!("{ctx}: no full line:\n{console}"));
        let after = &suite_lines(&console, "after")[0];
        at_least(
            field(after, "local"),
            field(after, "of"),
            99,
            "after: node 0 pages again",
        );
        if shim {
            // Pool pages were there to get wrong: copies alone, which the kernel places by the
            // steered or the mapping's policy, would pass the placement checks.
            let s = step_stats(&console, "local");
            at_least(
                field(&s, "numa_hit"),
                pages * nodes as u64,
                25,
                "local: pool pages (numa_hit)",
            );
            let s = step_stats(&console, "bind");
            at_least(
                field(&s, "numa_hit"),
                field(bind, "of"),
                25,
                "bind: pool pages (numa_hit)",
            );
            let s = step_stats(&console, "interleave");
            let hits = field(&s, "interleave_hit");
            at_least(hits, field(il, "of"), 5, "interleave: pool pages (interleave_hit)");
            let s = step_stats(&console, "full");
            eprintln!(
                "{ctx}: full: {} of {} pages off node 0; {s:?}",
                field(&full, "other"),
                field(&full, "of")
            );
            assert!(field(&full, "other") > 0, "{ctx}: {full:?}");
            for k in ["numa_miss", "zlc_marks", "zlc_skips"] {
                assert!(field(&s, k) > 0, "{ctx}: full: {k} is 0: {s:?}\n{console}");
            }
        } else {
            at_least(field(&full, "other"), field(&full, "of"), 90, "full: pages off node 0");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
