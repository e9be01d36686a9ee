//! Build script shared by the crates whose tests need userfaultfd.
//!
//! Tests that serve real faults carry
//! `#[cfg_attr(zerofault_no_uffd, ignore = "...")]`. This script sets `zerofault_no_uffd` when
//! this machine cannot open a userfaultfd, so `cargo test` reports those tests as *ignored*
//! (never as passed). With `ZEROFAULT_REQUIRE_UFFD=1` (CI) the flag is never set: the tests run
//! and fail with the reason when userfaultfd is missing.
//!
//! Likewise `zerofault_no_stress_ng` when `stress-ng` is not on the PATH (one test runs it),
//! and `zerofault_no_qemu` when `qemu-system-x86_64` is not (the multi-node VM tests).
//!
//! For the shim (`zerofault-preload`) it also links GCC's unwinder into the library
//! ([`static_unwinder`]).

use std::io::Error;

/// `_IO(0xAA, 0x00)`: ask /dev/userfaultfd for a new userfaultfd.
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xAA00;
/// `_IOWR(0xAA, 0x3F, struct uffdio_api)`.
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;

fn probe() -> Result<(), String> {
    // SAFETY: open() with a NUL-terminated literal path; the result is checked.
    let dev = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    let fd = if dev >= 0 {
        // SAFETY: ioctl on the fd we just opened; USERFAULTFD_IOC_NEW takes an int flag argument.
        let fd = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW, libc::O_CLOEXEC) };
        let err = Error::last_os_error();
        // SAFETY: closing the fd we opened above, once.
        unsafe { libc::close(dev) };
        if fd < 0 {
            return Err(format!("/dev/userfaultfd: {err}"));
        }
        fd
    } else {
        // SAFETY: the userfaultfd syscall takes one int flags argument.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as i32;
        if fd < 0 {
            return Err(format!("userfaultfd(2): {}", Error::last_os_error()));
        }
        fd
    };
    let mut api = [0xAAu64, 0, 0];
    // SAFETY: UFFDIO_API reads and writes a 24-byte struct uffdio_api, which `api` is.
    let rc = unsafe { libc::ioctl(fd, UFFDIO_API, api.as_mut_ptr()) };
    let err = Error::last_os_error();
    // SAFETY: closing the userfaultfd we created, once.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(format!("UFFDIO_API: {err}"));
    }
    Ok(())
}

/// Whether `program` is on the PATH.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// The shim is loaded into every process started under it, most of which never use it: its
/// cost there is loading it. Rust's std links the unwinder from `libgcc_s.so.1`, a second
/// library to map and relocate whose constructor runs CPUID a few dozen times (each a VM exit
/// in a virtual machine): about 60 µs of the 0.6 ms of a `/bin/true` here. The same unwinder
/// from `libgcc_eh.a` (what `gcc -static-libgcc` links into shared libraries) comes inside
/// the shim instead, its symbols hidden by the library's version script; `libgcc_s` is then
/// not needed (cargo links with `--as-needed`). Where the compiler has no `libgcc_eh.a`, the
/// shim simply keeps `libgcc_s`.
fn static_unwinder() {
    let gnu_linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if std::env::var("CARGO_PKG_NAME").as_deref() != Ok("zerofault-preload") || !gnu_linux {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let Ok(out) = std::process::Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let path = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    // Not found, the compiler prints the bare name back.
    if let (true, Some(dir)) = (path.is_absolute() && path.is_file(), path.parent()) {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static:+whole-archive=gcc_eh");
    }
}

/// The shim's front (`front/front.c`, see there): a small C library, the one that goes in
/// LD_PRELOAD as `libzerofault.so`, which loads the Rust shim (`libzerofault_shim.so`) only
/// when the process makes its first large request. Built with the C compiler here and put where
/// cargo puts the shim: the profile directory and its `deps/` (a dependency's cdylib lands in
/// `deps/` only; a top-level build copies it up too).
///
/// Linked for a cheap load (measured: +36 µs per process against +56 µs): two segments
/// (`-z noseparate-code`), lazy binding, no RELRO (an mprotect per process; with lazy
/// binding and the front's own function pointers writable anyway it would protect little), no
/// library but libc. A failure to build it fails the build: without it the shim cannot be
/// preloaded.
fn front() {
    if std::env::var("CARGO_PKG_NAME").as_deref() != Ok("zerofault-preload") {
        return;
    }
    let src = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("front/front.c");
    println!("cargo:rerun-if-changed={}", src.display());
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let built = out.join("libzerofault.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = std::process::Command::new(&cc)
        .args([
            "-O2",
            "-g",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .args([
            "-Wl,-z,noseparate-code",
            "-Wl,-z,lazy",
            "-Wl,-z,norelro",
            "-Wl,--as-needed",
        ])
        .arg("-Wl,-soname,libzerofault.so")
        .arg("-o")
        .arg(&built)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc} for the shim's front: {e}"));
    assert!(status.success(), "{cc} failed on {}", src.display());
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    let profile = out.ancestors().nth(3).expect("OUT_DIR inside a cargo target directory");
    for dir in [profile.to_path_buf(), profile.join("deps")] {
        let _ = std::fs::create_dir_all(&dir);
        // Replaced by a rename, so that a process loading the old file keeps a whole one.
        let tmp = dir.join(format!(".libzerofault.so.{}", std::process::id()));
        std::fs::copy(&built, &tmp)
            .and_then(|_| std::fs::rename(&tmp, dir.join("libzerofault.so")))
            .unwrap_or_else(|e| panic!("cannot put the shim's front in {}: {e}", dir.display()));
    }
}

/// For the `zerofault` command: builds the shim (the front and the shim proper) with a cargo of
/// its own, in a target directory under OUT_DIR (the outer build holds its own directory's
/// lock), with the same profile, and hands the two files to the binary, which carries them
/// (`include_bytes!`, see crates/zerofault-cli/src/embedded.rs). So a `zerofault` installed
/// with `cargo install` needs nothing beside it. The nested cargo shares the outer one's job
/// slots (it reads CARGO_MAKEFLAGS) and its flags (CARGO_ENCODED_RUSTFLAGS).
fn embed_shim() {
    if std::env::var("CARGO_PKG_NAME").as_deref() != Ok("zerofault-cli") {
        return;
    }
    let manifest = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let crates = manifest.parent().expect("crates/");
    let preload = crates.join("zerofault-preload");
    for p in [
        preload.join("src"),
        preload.join("front"),
        preload.join("Cargo.toml"),
        crates.join("zerofault/src"),
        crates.join("zerofault/Cargo.toml"),
        crates.join("../build/uffd_probe.rs"),
        crates.join("../Cargo.lock"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let target = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("shim");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(&cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(preload.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target);
    if release {
        cmd.arg("--release");
    }
    for var in ["CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR", "CARGO_PRIMARY_PACKAGE"] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cargo} to build the shim the command carries: {e}"));
    assert!(status.success(), "building the shim the command carries failed");
    let dir = target.join(if release { "release" } else { "debug" });
    for (var, file) in [
        ("ZEROFAULT_EMBED_FRONT", "libzerofault.so"),
        ("ZEROFAULT_EMBED_SHIM", "libzerofault_shim.so"),
    ] {
        let path = dir.join(file);
        assert!(path.is_file(), "the shim build left no {}", path.display());
        println!("cargo:rustc-env={var}={}", path.display());
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=CC");
    static_unwinder();
    front();
    embed_shim();
    println!("cargo:rustc-check-cfg=cfg(zerofault_no_uffd)");
    println!("cargo:rustc-check-cfg=cfg(zerofault_no_stress_ng)");
    println!("cargo:rustc-check-cfg=cfg(zerofault_no_qemu)");
    println!("cargo:rustc-check-cfg=cfg(zerofault_not_root)");
    println!("cargo:rustc-check-cfg=cfg(zerofault_no_gdb)");
    println!("cargo:rerun-if-env-changed=ZEROFAULT_REQUIRE_UFFD");
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rerun-if-changed=/proc/sys/vm/unprivileged_userfaultfd");
    println!("cargo:rerun-if-changed=/dev/userfaultfd");
    println!("cargo:rerun-if-changed=/usr/bin/stress-ng");
    println!("cargo:rerun-if-changed=/usr/bin/qemu-system-x86_64");
    println!("cargo:rerun-if-changed=/usr/bin/gdb");
    if std::env::var("ZEROFAULT_REQUIRE_UFFD").as_deref() == Ok("1") {
        return;
    }
    if !on_path("qemu-system-x86_64") {
        println!("cargo:rustc-cfg=zerofault_no_qemu");
        println!(
            "cargo:warning=qemu-system-x86_64 is not installed: the multi-node VM tests are marked \
             ignored (apt-get install qemu-system-x86; .ci/run installs it)"
        );
    }
    if !on_path("gdb") {
        println!("cargo:rustc-cfg=zerofault_no_gdb");
        println!(
            "cargo:warning=gdb is not installed: the debugger tests are marked ignored (apt-get \
             install gdb; .ci/run installs it)"
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("cargo:rustc-cfg=zerofault_not_root");
        println!(
            "cargo:warning=not root: the tests of privilege drops, namespaces and memory cgroups \
             are marked ignored (.ci/run runs as root)"
        );
    }
    if !on_path("stress-ng") {
        println!("cargo:rustc-cfg=zerofault_no_stress_ng");
        println!(
            "cargo:warning=stress-ng is not installed: the shim's stress-ng test is marked ignored \
             (apt-get install stress-ng; .ci/run installs it)"
        );
    }
    if let Err(why) = probe() {
        println!("cargo:rustc-cfg=zerofault_no_uffd");
        println!(
            "cargo:warning=userfaultfd unavailable ({why}): tests that serve real faults are marked \
             ignored; run as root, grant /dev/userfaultfd or set vm.unprivileged_userfaultfd=1"
        );
    }
}
