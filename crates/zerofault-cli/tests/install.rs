//! `cargo install` gives a `zerofault` whose `run` works with nothing beside it: the binary
//! carries the shim and writes it to a per-user cache directory.

mod common;

use common::{pages_served, run, stderr, stdout};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Installs this workspace's command into a scratch root (a debug build, in a target directory
/// of its own that later runs reuse), then runs Python under it with an empty cache. Catches a
/// binary that carries no shim, writes it nowhere the program can load it, or quietly finds
/// the development tree's copy instead (there is none beside the installed binary, and the
/// cache must be where the shim came from).
#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn an_installed_zerofault_carries_its_shim_and_serves_pages() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let root = tmp.join(format!("install-root-{}", std::process::id()));
    let cache = tmp.join(format!("install-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&cache);
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut install = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    install
        .args(["install", "--debug", "--locked", "--path"])
        .arg(&workspace)
        .arg("--root")
        .arg(&root)
        .arg("--target-dir")
        .arg(tmp.join("install-target"));
    let o = run(&mut install, Duration::from_secs(900));
    assert!(o.status.success(), "cargo install: {}", stderr(&o));
    let bin = root.join("bin/zerofault");
    let beside: Vec<_> = std::fs::read_dir(root.join("bin"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside, ["zerofault"], "nothing but the binary is installed");

    let script = "b = bytearray(64 << 20)\n\
                  b[::4096] = b'x' * (len(b) // 4096)\n\
                  print(sum(b) // ord('x'))\n";
    let mut c = Command::new(&bin);
    c.args(["run", "--stats", "--", "python3", "-c", script])
        .env("XDG_CACHE_HOME", &cache)
        .env_remove("LD_PRELOAD");
    let o = run(&mut c, Duration::from_secs(120));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "16384\n");
    assert!(pages_served(&o) > 10_000, "{}", stderr(&o));

    // The shim came from the cache: one directory named after its contents, both files in it.
    let dirs: Vec<PathBuf> = std::fs::read_dir(cache.join("zerofault"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    for f in ["libzerofault.so", "libzerofault_shim.so"] {
        assert!(dirs[0].join(f).is_file(), "{f} not in {}", dirs[0].display());
    }
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::remove_dir_all(&cache).unwrap();
}
