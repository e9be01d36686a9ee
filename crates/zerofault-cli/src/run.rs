//! `zerofault run [--stats] [--verbose] [--KNOB=VALUE ...] -- PROGRAM ARGS`: runs an
//! unmodified program with the LD_PRELOAD shim, found beside this binary (a cargo build), or
//! else the copy this binary carries, written to a cache directory ([`crate::embedded`]); the
//! program's exit status is ours (the program replaces this process).
//!
//! Fail open: a refused knob value, a shim that cannot be found or written, or a program the
//! dynamic loader will not preload into (static, set-user-ID), is one line on stderr and the
//! program runs without the shim.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use zerofault::options::env_name;
use zerofault::Options;

/// The file that goes in LD_PRELOAD: the shim's front, which loads [`SHIM_PROPER`] from its own
/// directory on a process's first large request.
pub const SHIM: &str = "libzerofault.so";
pub const SHIM_PROPER: &str = "libzerofault_shim.so";

#[derive(Debug, PartialEq)]
pub struct RunArgs {
    pub stats: bool,
    /// The shim says, in each process, whether the engine started and why not.
    pub verbose: bool,
    /// (knob, value) as given.
    pub knobs: Vec<(String, String)>,
    pub program: Vec<OsString>,
}

const USAGE: &str = "zerofault run [--stats] [--verbose] [--KNOB=VALUE ...] -- PROGRAM [ARGS]";

pub fn parse(args: &[OsString]) -> Result<RunArgs, String> {
    let mut a = RunArgs {
        stats: false,
        verbose: false,
        knobs: vec![],
        program: vec![],
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let s = arg.to_string_lossy();
        if s == "--" {
            a.program = it.by_ref().cloned().collect();
            break;
        }
        if s == "--stats" {
            a.stats = true;
        } else if s == "--verbose" {
            a.verbose = true;
        } else if let Some((k, v)) = s.strip_prefix("--").and_then(|b| b.split_once('=')) {
            a.knobs.push((k.to_string(), v.to_string()));
        } else if !s.starts_with('-') {
            // The program without `--`: everything from here on is its.
            a.program.push(arg.clone());
            a.program.extend(it.by_ref().cloned());
            break;
        } else {
            return Err(format!(
                "zerofault run: unknown flag {s}; it accepts --stats, --verbose and --KNOB=VALUE (see zerofault options): {USAGE}"
            ));
        }
    }
    if a.program.is_empty() {
        return Err(format!("zerofault run: no program given: {USAGE}"));
    }
    Ok(a)
}

/// Whether `args` (after `run`) ask for run's help: `-h` or `--help` among its own flags,
/// before the program (`--`, or the first word that is not a flag).
pub fn asks_help(args: &[OsString]) -> bool {
    args.iter()
        .take_while(|a| *a != "--" && a.to_string_lossy().starts_with('-'))
        .any(|a| a == "-h" || a == "--help")
}

/// Where the shim may be, next to the running binary (a cargo build puts it in the same
/// directory or in its `deps/`; an install in `../lib`).
pub fn candidates(exe: &Path) -> Vec<PathBuf> {
    let dir = exe.parent().unwrap_or(Path::new("."));
    vec![
        dir.join(SHIM),
        dir.join("deps").join(SHIM),
        dir.join("../lib").join(SHIM),
        dir.join("../lib/zerofault").join(SHIM),
    ]
}

pub fn find_shim() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let places = candidates(&exe);
    // The newest shim with its front beside it: a cargo build refreshes deps/ and leaves an
    // older copy beside the binary until the shim's own package is built at the top level
    // again.
    let proper = |p: &PathBuf| p.with_file_name(SHIM_PROPER);
    let mtime = |p: &PathBuf| proper(p).metadata().and_then(|m| m.modified()).ok();
    match places
        .iter()
        .filter(|p| p.is_file() && proper(p).is_file())
        .max_by_key(|p| mtime(p))
    {
        Some(p) => Ok(p.clone()),
        None => crate::embedded::install(),
    }
}

/// The file `program` names: itself when it names a directory, else the first of that name on
/// PATH (as exec looks it up).
fn on_path(program: &std::ffi::OsStr) -> Option<PathBuf> {
    let path = Path::new(program);
    if path.components().count() > 1 {
        return Some(path.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(path))
        .find(|p| p.is_file())
}

/// Why the dynamic loader will not preload the shim into `program` (looked up on PATH), if it
/// will not: a set-user-ID or set-group-ID program (LD_PRELOAD is ignored for it), or a
/// statically linked one (no loader at all). None for anything else, scripts included.
pub fn unpreloadable(program: &std::ffi::OsStr) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = on_path(program)?;
    let shown = path.display();
    if path.metadata().ok()?.permissions().mode() & 0o6000 != 0 {
        return Some(format!(
            "{shown} is set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD for it"
        ));
    }
    // The ELF header and program headers are at the start (a program may be large).
    let mut elf = Vec::with_capacity(64 << 10);
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::fs::File::open(&path).ok()?, 64 << 10),
        &mut elf,
    )
    .ok()?;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u64_at = |o: usize| elf.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    // A 64-bit little-endian ELF file (the targets zerofault serves).
    if elf.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return None;
    }
    let (phoff, phentsize, phnum) = (
        usize::try_from(u64_at(0x20)?).ok()?,
        usize::from(u16_at(0x36)?),
        usize::from(u16_at(0x38)?),
    );
    // Program headers beyond what was read (or none at all): no verdict.
    if phnum == 0 || phoff.checked_add(phnum.checked_mul(phentsize)?)? > elf.len() {
        return None;
    }
    const PT_INTERP: u32 = 3;
    let interp = (0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        elf.get(o..o + 4)
            .is_some_and(|b| u32::from_le_bytes(b.try_into().unwrap()) == PT_INTERP)
    });
    (!interp).then(|| format!("{shown} is statically linked: there is no dynamic loader to preload the shim"))
}

/// The sanitizers whose runtime replaces malloc and the mmap family and owns the memory layout
/// (its shadow): ASan, TSan, MSan, HWASan, LSan, MemProf. UBSan alone replaces nothing.
const SANITIZERS: [&str; 6] = ["asan", "tsan", "msan", "hwasan", "lsan", "memprof"];

/// Whether `lib` (a DT_NEEDED name) is a sanitizer's runtime: lib<name>.so... (GCC) or
/// libclang_rt.<name>... (Clang).
fn runtime_library(lib: &[u8]) -> bool {
    let base = lib.rsplit(|&b| b == b'/').next().unwrap_or(lib);
    let Some(rest) = base.strip_prefix(b"libclang_rt.").or_else(|| base.strip_prefix(b"lib")) else {
        return false;
    };
    SANITIZERS.iter().any(|s| {
        rest.strip_prefix(s.as_bytes())
            .is_some_and(|t| matches!(t.first(), Some(b'.' | b'-' | b'_')))
    })
}

/// The file the kernel runs for `path`: the interpreter of a `#!` script (through
/// `/usr/bin/env NAME`, on PATH), to the depth the kernel follows; `path` itself otherwise.
fn executed(path: PathBuf) -> PathBuf {
    let mut path = path;
    for _ in 0..4 {
        let mut head = [0u8; 256];
        let n = std::fs::File::open(&path)
            .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
            .unwrap_or(0);
        let Some(line) = head[..n].strip_prefix(b"#!") else {
            break;
        };
        let line = line.split(|&b| b == b'\n').next().unwrap_or(line);
        let mut words = line
            .split(|&b| b == b' ' || b == b'\t')
            .filter(|w| !w.is_empty())
            .map(std::ffi::OsStr::from_bytes);
        let Some(interp) = words.next() else { break };
        let next = if Path::new(interp).file_name() == Some(std::ffi::OsStr::new("env")) {
            // env's own options and VAR=value words come before the program.
            words
                .find(|w| !w.as_bytes().starts_with(b"-") && !w.as_bytes().contains(&b'='))
                .and_then(on_path)
        } else {
            Some(PathBuf::from(interp))
        };
        match next {
            Some(p) => path = p,
            None => break,
        }
    }
    path
}

/// Reads `len` bytes at `offset` of `f` (at most 64 MiB: a dynamic string table is far smaller).
fn read_at(f: &std::fs::File, offset: u64, len: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    if len > 64 << 20 {
        return None;
    }
    let mut b = vec![0; usize::try_from(len).ok()?];
    f.read_exact_at(&mut b, offset).ok()?;
    Some(b)
}

/// What the dynamic section of a 64-bit little-endian ELF file says: its DT_NEEDED names and
/// its dynamic string table, and whether it defines `malloc` itself (an allocator linked in).
struct Dynamic {
    needed: Vec<Vec<u8>>,
    strings: Vec<u8>,
    defines_malloc: bool,
}

fn le(b: &[u8], at: usize, n: usize) -> Option<u64> {
    let s = b.get(at..at + n)?;
    Some(s.iter().rev().fold(0, |v, &x| v << 8 | u64::from(x)))
}

fn dynamic(path: &Path) -> Option<Dynamic> {
    let f = std::fs::File::open(path).ok()?;
    let h = read_at(&f, 0, 64)?;
    if h.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return None;
    }
    let (phoff, phentsize, phnum) = (le(&h, 0x20, 8)?, le(&h, 0x36, 2)?, le(&h, 0x38, 2)?);
    let ph = read_at(&f, phoff, phentsize.checked_mul(phnum)?)?;
    let phdr = |i: u64| {
        let o = usize::try_from(i * phentsize).ok()?;
        // (type, offset, vaddr, filesz)
        Some((
            le(&ph, o, 4)?,
            le(&ph, o + 8, 8)?,
            le(&ph, o + 16, 8)?,
            le(&ph, o + 32, 8)?,
        ))
    };
    let phdrs: Vec<_> = (0..phnum).filter_map(phdr).collect();
    const PT_LOAD: u64 = 1;
    const PT_DYNAMIC: u64 = 2;
    let &(_, dyn_off, _, dyn_len) = phdrs.iter().find(|p| p.0 == PT_DYNAMIC)?;
    let at = |vaddr: u64| {
        phdrs
            .iter()
            .find(|p| p.0 == PT_LOAD && vaddr >= p.2 && vaddr - p.2 < p.3)
            .map(|p| vaddr - p.2 + p.1)
    };
    let d = read_at(&f, dyn_off, dyn_len)?;
    let (mut needed, mut strtab, mut strsz, mut symtab) = (vec![], None, 0, None);
    for e in d.chunks_exact(16) {
        match (le(e, 0, 8)?, le(e, 8, 8)?) {
            (0, _) => break,
            (1, v) => needed.push(v),
            (5, v) => strtab = Some(v),
            (6, v) => symtab = Some(v),
            (10, v) => strsz = v,
            _ => {}
        }
    }
    let strtab = strtab?;
    let strings = read_at(&f, at(strtab)?, strsz)?;
    let name = |o: u64| {
        let s = strings.get(usize::try_from(o).ok()?..)?;
        Some(&s[..s.iter().position(|&b| b == 0)?])
    };
    let needed = needed.into_iter().filter_map(|o| name(o).map(<[u8]>::to_vec)).collect();
    // The symbol table runs up to the string table (the linkers' order); a defined `malloc`
    // has a section index.
    let defines_malloc = symtab.filter(|&s| s < strtab).is_some_and(|s| {
        at(s)
            .and_then(|o| read_at(&f, o, (strtab - s).min(16 << 20)))
            .is_some_and(|syms| {
                syms.chunks_exact(24).any(|y| {
                    le(y, 6, 2).is_some_and(|shndx| shndx != 0)
                        && le(y, 0, 4).and_then(name) == Some(b"malloc".as_slice())
                })
            })
    });
    Some(Dynamic {
        needed,
        strings,
        defines_malloc,
    })
}

/// Why the shim stays out of `program` (looked up on PATH; a script's interpreter): a
/// sanitizer's runtime replaces malloc and the mmap family (ASan refuses to run at all behind a
/// preloaded library). Found in its DT_NEEDED names (the runtime's own library), its dynamic
/// names (`__asan_init` and the like, which instrumented code calls), or, for a runtime linked
/// in, a `malloc` of its own beside the runtime's `__sanitizer_` names.
pub fn sanitizer(program: &std::ffi::OsStr) -> Option<String> {
    let path = executed(on_path(program)?);
    let d = dynamic(&path)?;
    let lib = d.needed.iter().find(|n| runtime_library(n));
    let names = || d.strings.split(|&b| b == 0);
    let init = names().find(|n| {
        SANITIZERS
            .iter()
            .any(|s| n.strip_prefix(b"__").and_then(|t| t.strip_prefix(s.as_bytes())) == Some(b"_init"))
    });
    let linked_in = d.defines_malloc && names().any(|n| n.starts_with(b"__sanitizer_"));
    let what = match (lib, init) {
        (Some(lib), _) => format!("its runtime {}", String::from_utf8_lossy(lib)),
        (None, Some(init)) => format!("it calls {}; its runtime", String::from_utf8_lossy(init)),
        (None, None) if linked_in => "its runtime, linked in,".to_string(),
        (None, None) => return None,
    };
    Some(format!(
        "{} is built with a sanitizer ({what} replaces malloc and mmap)",
        path.display()
    ))
}

/// Checks the knobs as the shim will read them: the environment, then the flags.
pub fn check_knobs(a: &RunArgs) -> Result<Options, String> {
    let mut o = Options::from_env().map_err(|e| e.to_string())?;
    for (k, v) in &a.knobs {
        o.set(k, v).map_err(|e| e.to_string())?;
    }
    o.validate().map_err(|e| e.to_string())?;
    Ok(o)
}

/// Execs the program; returns only on failure to exec.
pub fn run(a: &RunArgs) -> String {
    let mut cmd = Command::new(&a.program[0]);
    cmd.args(&a.program[1..]);
    let shim = check_knobs(a)
        .map_err(|e| {
            format!(
                "zerofault run: {e}; running {} without the engine",
                a.program[0].to_string_lossy()
            )
        })
        .and_then(|_| {
            find_shim().map_err(|e| {
                format!(
                    "zerofault run: {e}; running {} without the engine",
                    a.program[0].to_string_lossy()
                )
            })
        });
    let shim = shim.and_then(|p| match unpreloadable(&a.program[0]) {
        Some(why) => Err(format!("zerofault run: {why}; it runs without the engine")),
        None => Ok(p),
    });
    // A sanitized program runs as it does natively, stderr included: said only when asked.
    let shim = shim.and_then(|p| match sanitizer(&a.program[0]) {
        Some(why) if a.verbose || a.stats => Err(format!("zerofault run: {why}; it runs without the engine")),
        Some(_) => Err(String::new()),
        None => Ok(p),
    });
    match shim {
        Ok(path) => {
            for (k, v) in &a.knobs {
                cmd.env(env_name(&Options::canonical(k)), v);
            }
            if a.stats {
                cmd.env(env_name("stats"), "on");
            }
            if a.verbose {
                cmd.env(env_name("verbose"), "on");
                // The program keeps this process's pid (exec): only it says that it never
                // needed the engine, not every helper a wrapper script runs.
                cmd.env(env_name("run_pid"), std::process::id().to_string());
            }
            let mut preload = OsString::from(path.as_os_str());
            if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
                preload.push(":");
                preload.push(old);
            }
            cmd.env("LD_PRELOAD", preload);
        }
        Err(line) if line.is_empty() => {}
        Err(line) => eprintln!("{line}"),
    }
    let e = cmd.exec();
    format!("zerofault run: {}: {e}", a.program[0].to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn flags_knobs_and_the_program() {
        let a = parse(&os("--stats --max_order=9 --pool-max=1G -- sort -S 2G x")).unwrap();
        assert!(a.stats);
        assert_eq!(
            a.knobs,
            [("max_order".into(), "9".into()), ("pool-max".into(), "1G".into())]
        );
        assert_eq!(a.program, os("sort -S 2G x"));
        let a = parse(&os("python3 -c 1")).unwrap();
        assert_eq!(a.program, os("python3 -c 1"), "-- may be left out");
        assert!(check_knobs(&parse(&os("--max_order=99 -- x")).unwrap())
            .unwrap_err()
            .contains("ZEROFAULT_MAX_ORDER"));
        for bad in ["", "--stats", "--bogus -- x"] {
            let e = parse(&os(bad)).unwrap_err();
            assert!(!e.contains('\n') && e.starts_with("zerofault run:"), "{e}");
        }
    }

    #[test]
    fn help_is_asked_among_runs_own_flags_only() {
        assert!(asks_help(&os("--help")) && asks_help(&os("--stats -h -- x")));
        assert!(asks_help(&os("--max_order=3 --help x")));
        for not in ["-- -h", "prog --help", "--stats -- prog -h", ""] {
            assert!(!asks_help(&os(not)), "{not}");
        }
    }

    #[test]
    fn sanitizer_runtimes_by_name() {
        for yes in [
            "libasan.so.8",
            "libtsan.so.2",
            "/usr/lib/liblsan.so.0",
            "libhwasan.so",
            "libclang_rt.asan-x86_64.so",
            "libclang_rt.msan.so",
            "libmemprof.so.0",
        ] {
            assert!(runtime_library(yes.as_bytes()), "{yes}");
        }
        for no in [
            "libubsan.so.1",
            "libc.so.6",
            "libasanx.so",
            "libtsanity.so",
            "asan.so",
            "libclang_rt.ubsan_standalone.so",
        ] {
            assert!(!runtime_library(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn the_shim_is_looked_for_beside_the_binary() {
        let c = candidates(Path::new("/opt/zf/bin/zerofault"));
        assert_eq!(c[0], Path::new("/opt/zf/bin/libzerofault.so"));
        assert!(c.contains(&PathBuf::from("/opt/zf/bin/../lib/libzerofault.so")));
    }
}
