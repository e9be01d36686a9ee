//! The shim this binary carries (built with it, see build/uffd_probe.rs `embed_shim`), for a
//! `zerofault` that has nothing beside it (`cargo install`).
//!
//! The program loads the shim from a file, and the front loads the shim proper from its own
//! directory, so both are written into a per-user cache directory named after their contents:
//! `$XDG_CACHE_HOME/zerofault/<hash>/`, else `$HOME/.cache/zerofault/<hash>/`, else
//! `/tmp/zerofault-<uid>/<hash>/`. A directory is used only if this user owns it and nobody
//! else may write it; a file already there is used only if it holds exactly the carried bytes.
//! Files are written under a temporary name and renamed, so a program starting meanwhile loads
//! a whole one.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::run::{SHIM, SHIM_PROPER};

static FRONT: &[u8] = include_bytes!(env!("ZEROFAULT_EMBED_FRONT"));
static PROPER: &[u8] = include_bytes!(env!("ZEROFAULT_EMBED_SHIM"));

/// FNV-1a over both files: names the cache directory, so that two builds never share one.
fn key() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in FRONT.iter().chain(PROPER) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The cache bases, in order of preference.
fn bases() -> Vec<PathBuf> {
    let abs = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    let mut v = vec![];
    if let Some(x) = abs(std::env::var_os("XDG_CACHE_HOME")) {
        v.push(x.join("zerofault"));
    }
    if let Some(h) = abs(std::env::var_os("HOME")) {
        v.push(h.join(".cache").join("zerofault"));
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    v.push(std::env::temp_dir().join(format!("zerofault-{uid}")));
    v
}

/// Creates `dir` (and its parents), mode 0700 for what it creates, and checks that this user
/// owns it and that nobody else may write it.
fn private_dir(dir: &Path) -> Result<(), String> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let m = fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        return Err(format!(
            "{}: not a directory of uid {uid} that only it may write",
            dir.display()
        ));
    }
    Ok(())
}

/// Makes `path` hold exactly `bytes`, executable, unless it does already.
fn put(path: &Path, bytes: &[u8]) -> Result<(), String> {
    if fs::read(path).is_ok_and(|b| b == bytes) {
        return Ok(());
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(0o755))?;
        fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        format!("{}: {e}", path.display())
    })
}

/// Writes the carried shim into the first cache directory that takes it; returns the path of
/// its front (the file for LD_PRELOAD).
pub fn install() -> Result<PathBuf, String> {
    let key = key();
    let mut why = vec![];
    for base in bases() {
        let dir = base.join(&key);
        let done = private_dir(&base)
            .and_then(|_| private_dir(&dir))
            .and_then(|_| put(&dir.join(SHIM_PROPER), PROPER))
            .and_then(|_| put(&dir.join(SHIM), FRONT));
        match done {
            Ok(()) => return Ok(dir.join(SHIM)),
            Err(e) => why.push(e),
        }
    }
    Err(format!(
        "cannot write the shim this binary carries ({})",
        why.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_carried_shim_is_the_front_and_the_shim_proper() {
        // ELF shared objects; the front calls the entry the shim proper defines, and only the
        // shim proper holds the engine.
        for b in [FRONT, PROPER] {
            assert_eq!(&b[..4], b"\x7fELF");
            assert!(b.windows(19).any(|w| w == b"zerofault_shim_init"));
        }
        let engine = b"ZEROFAULT_PANIC_AFTER=";
        assert!(PROPER.windows(engine.len()).any(|w| w == engine));
        assert!(!FRONT.windows(engine.len()).any(|w| w == engine));
    }

    #[test]
    fn a_cache_file_with_other_bytes_is_replaced_and_a_shared_directory_refused() {
        let dir = std::env::temp_dir().join(format!("zf-embedded-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        private_dir(&dir).unwrap();
        let f = dir.join("x.so");
        fs::write(&f, b"stale").unwrap();
        put(&f, b"fresh").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"fresh");
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o777, 0o755);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(private_dir(&dir).unwrap_err().contains("only it may write"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
