//! zerofault for a user who is not root: the least-privilege setup of the README (a group
//! owning /dev/userfaultfd, mode 0660), and what happens without it.
//!
//! The test is root and makes the user: a uid and a gid that no account has, taken with
//! `setpriv` (no account is added to /etc/passwd or /etc/group). For the time of the test it
//! gives /dev/userfaultfd that group and mode 0660, and sets vm.unprivileged_userfaultfd to 0
//! if it is not; both are put back when it ends, passed or failed. Root keeps its access
//! throughout (the owner stays root).

mod common;

use common::{pages_served, run, stderr, stdout, temp_dir};
use std::ffi::CString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const DEVICE: &str = "/dev/userfaultfd";
const SYSCTL: &str = "/proc/sys/vm/unprivileged_userfaultfd";
const LIMIT: Duration = Duration::from_secs(120);

/// What the test changed, put back on drop.
struct Restore {
    uid: u32,
    gid: u32,
    mode: u32,
    sysctl: String,
}

impl Restore {
    fn take() -> Restore {
        let m = std::fs::metadata(DEVICE).expect("/dev/userfaultfd (Linux >= 6.1)");
        Restore {
            uid: m.uid(),
            gid: m.gid(),
            mode: m.permissions().mode() & 0o7777,
            sysctl: std::fs::read_to_string(SYSCTL).unwrap().trim().to_string(),
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        chown(DEVICE, self.uid, self.gid);
        std::fs::set_permissions(DEVICE, std::fs::Permissions::from_mode(self.mode)).unwrap();
        std::fs::write(SYSCTL, &self.sysctl).unwrap();
    }
}

fn chown(path: &str, uid: u32, gid: u32) {
    let c = CString::new(path).unwrap();
    // SAFETY: chown with a NUL-terminated path; the result is checked.
    let rc = unsafe { libc::chown(c.as_ptr(), uid, gid) };
    assert_eq!(rc, 0, "chown {path}: {}", std::io::Error::last_os_error());
}

/// A number that no line of `file` (passwd or group) has as its third field.
fn unused_id(file: &str, from: u32) -> u32 {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let taken: Vec<u32> = text.lines().filter_map(|l| l.split(':').nth(2)?.parse().ok()).collect();
    (from..).find(|id| !taken.contains(id)).unwrap()
}

/// `args` as the user `uid`, in group `gid`, with `extra` as its only supplementary group.
fn as_user(uid: u32, gid: u32, extra: Option<u32>, args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}")).arg(format!("--regid={gid}"));
    match extra {
        Some(g) => c.arg(format!("--groups={g}")),
        None => c.arg("--clear-groups"),
    };
    c.arg("--").args(args);
    // The user's own runtime directory does not exist: the shim's machine state goes to
    // /dev/shm, as for a service without a login session.
    c.env_remove("XDG_RUNTIME_DIR").env("HOME", "/");
    c
}

fn zerofault_as(exe: &Path, uid: u32, gid: u32, extra: Option<u32>, args: &[&str]) -> Output {
    let all: Vec<&str> = std::iter::once(exe.to_str().unwrap())
        .chain(args.iter().copied())
        .collect();
    run(&mut as_user(uid, gid, extra, &all), LIMIT)
}

/// This build's binary and shim, copied into `dir` (mode 0755), where the user reaches them
/// (the build's own directory may not be searchable by others); `zerofault run` finds the
/// shim beside the binary, as in an install.
fn install(dir: &Path) -> std::path::PathBuf {
    let exe = dir.join("zerofault");
    std::fs::copy(env!("CARGO_BIN_EXE_zerofault"), &exe).unwrap();
    for lib in [common::shim(), common::shim_proper()] {
        std::fs::copy(&lib, dir.join(lib.file_name().unwrap())).unwrap();
    }
    exe
}

#[test]
#[cfg_attr(any(zerofault_no_uffd, zerofault_not_root), ignore = "needs userfaultfd and root")]
fn a_user_in_the_userfaultfd_group_is_served_and_one_without_runs_on_plain_memory() {
    let dir = temp_dir("nonroot");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = install(&dir);
    let touch = common::cc("touch", &dir, false);
    let touch = touch.to_str().unwrap();
    let uid = unused_id("/etc/passwd", 47100);
    let gid = unused_id("/etc/group", 47100);
    let group = unused_id("/etc/group", gid + 1);
    let _restore = Restore::take();
    chown(DEVICE, 0, group);
    std::fs::set_permissions(DEVICE, std::fs::Permissions::from_mode(0o660)).unwrap();
    std::fs::write(SYSCTL, "0").unwrap();

    // With the group: the engine serves, and doctor says the engine can run.
    let o = zerofault_as(
        &exe,
        uid,
        gid,
        Some(group),
        &["run", "--stats", "--", touch, "cold", "256"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("cold touch 256 MiB"), "{}", stdout(&o));
    assert!(pages_served(&o) > 0, "served with group access: {}", stderr(&o));
    let d = zerofault_as(&exe, uid, gid, Some(group), &["doctor"]);
    assert_eq!(
        d.status.code(),
        Some(0),
        "doctor with group access:\n{}{}",
        stdout(&d),
        stderr(&d)
    );

    // Without it: the same output on plain memory, the reason said, and doctor names the fix.
    let o = zerofault_as(&exe, uid, gid, None, &["run", "--verbose", "--", touch, "cold", "256"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("cold touch 256 MiB"), "{}", stdout(&o));
    let e = stderr(&o);
    assert!(
        e.contains("engine not started") && e.contains("access to /dev/userfaultfd"),
        "the shim says why: {e}"
    );
    assert!(!e.contains("pages_served"), "{e}");
    let d = zerofault_as(&exe, uid, gid, None, &["doctor"]);
    let table = stdout(&d);
    assert_ne!(
        d.status.code(),
        Some(0),
        "doctor without access:\n{table}{}",
        stderr(&d)
    );
    assert_eq!(d.status.code(), Some(1), "{table}");
    let status = |name: &str| {
        let line = table.lines().find(|l| l.starts_with(name)).unwrap_or_default();
        line[name.len()..]
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(status("userfaultfd access"), "missing", "{table}");
    assert_eq!(status("self-test"), "missing", "{table}");
    for fix in [
        "  $ groupadd -r userfaultfd\n",
        "  $ chgrp userfaultfd /dev/userfaultfd\n",
        "  $ chmod 0660 /dev/userfaultfd\n",
        "usermod -aG userfaultfd",
        "/etc/udev/rules.d/60-userfaultfd.rules",
        "KERNEL==\"userfaultfd\", GROUP=\"userfaultfd\", MODE=\"0660\"",
        "  $ sysctl -w vm.unprivileged_userfaultfd=1\n",
    ] {
        assert!(table.contains(fix), "doctor names the fix: no {fix:?} in:\n{table}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
