//! The machine-wide state under `zerofault run`: made where it is missing, shared when it is
//! good, and left alone (the engine working as if alone, the program as it would) when it is
//! corrupt, another user's, or open to others (docs/DESIGN.md, "Several processes").

mod common;

use common::{cc, run, served, stderr, stdout, temp_dir, zerofault};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

/// `exits loop 64 2` (map 64 MiB, write it, unmap; twice) under `zerofault run --verbose
/// --stats` with `XDG_RUNTIME_DIR=dir`: its output, and the engine's line on the machine state.
fn under(dir: &Path, prog: &Path) -> (String, String) {
    let o = run(
        zerofault()
            .args(["run", "--verbose", "--stats", "--"])
            .arg(prog)
            .args(["loop", "64", "2"])
            .env("XDG_RUNTIME_DIR", dir),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{o:?}");
    assert!(served(&o).is_some_and(|n| n > 0), "the engine served:\n{}", stderr(&o));
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.contains("engine started in pid"))
        .unwrap_or_else(|| panic!("no start line:\n{err}"))
        .to_string();
    (stdout(&o), line)
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn the_machine_state_is_made_shared_or_left_alone_and_the_program_runs_either_way() {
    let dir = temp_dir("machine-state");
    let prog = cc("exits", &dir, false);
    let rt = dir.join("runtime");
    std::fs::create_dir(&rt).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o700)).unwrap();
    let file = rt.join("zerofault-3.machine");
    let native = run(
        std::process::Command::new(&prog).args(["loop", "64", "2"]),
        Duration::from_secs(60),
    );
    let expected = stdout(&native);

    // Missing: made, private, one page.
    let (out, line) = under(&rt, &prog);
    assert_eq!(out, expected);
    assert!(line.contains("machine state shared"), "{line}");
    let md = std::fs::metadata(&file).unwrap();
    assert_eq!((md.len(), md.mode() & 0o777), (4096, 0o600));

    // Good (made by the run before): shared again.
    let (_, line) = under(&rt, &prog);
    assert!(line.contains("machine state shared"), "{line}");

    // Corrupt, open to others, another user's: alone, the file untouched.
    // (what the refusal names, the file's bytes, its mode)
    let cases = [
        ("header", vec![0x5au8; 4096], 0o600),
        ("mode", vec![0u8; 4096], 0o666),
        ("bytes long", b"short".to_vec(), 0o600),
    ];
    for (why, bytes, mode) in &cases {
        let _ = std::fs::remove_file(&file);
        std::fs::write(&file, bytes).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*mode)).unwrap();
        let before = std::fs::read(&file).unwrap();
        let (out, line) = under(&rt, &prog);
        assert_eq!(out, expected, "{why}");
        assert!(
            line.contains("machine state alone") && line.contains(why),
            "{why}: {line}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), before, "{why}: left as it was");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let _ = std::fs::remove_file(&file);
        std::fs::write(&file, vec![0u8; 4096]).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        let (out, line) = under(&rt, &prog);
        assert_eq!(out, expected);
        assert!(
            line.contains("machine state alone") && line.contains("uid 65534"),
            "{line}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
