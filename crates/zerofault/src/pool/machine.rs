//! The machine-wide state: what the engines of this user's processes tell one another, so that
//! N processes under the shim on fewer CPUs do not each run a scrub and polling handlers as if
//! each were alone (docs/DESIGN.md, "Several processes").
//!
//! One page, mapped shared from a file of the user's (`sys::machine` finds and checks it): a
//! header, then one slot per process, claimed at start. A slot says how many of its process's
//! scrub threads are in a step and how many handlers poll, each count with its heartbeat; a
//! count whose beat is more than [`STALE`] away counts for nothing (a process killed in the
//! middle of a step). The rules, on `cpus` online CPUs:
//! - **Scrubs.** At most `cpus - 1` scrub threads step at once on the machine (at least one):
//!   a CPU stays for the programs' own threads. A scrub that finds the other processes' at
//!   that number rests a moment, as it does on a busy machine.
//! - **Polling handlers.** A handler polls only while other processes' stepping scrubs and
//!   polling handlers, with its own process's busy threads, fit the CPUs.
//!
//! Fail open: no file, a file refused, a full table or a corrupt header give
//! [`Machine::alone`], and every rule then allows what the engine did alone.

use crate::page::PAGE_SIZE;
use crate::sys::machine::{self as file, Refused};
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering::*};
use std::time::Duration;

/// "ZFMACH03", little-endian (02 had no ledger of pool pages). Its version is in the file's
/// name too (`sys::machine::path`).
const MAGIC: u64 = u64::from_le_bytes(*b"ZFMACH03");

/// A count whose beat is further than this from now counts for nothing.
pub(crate) const STALE: Duration = Duration::from_secs(1);
/// [`STALE`] in the beats' unit.
const STALE_NS: u64 = STALE.as_secs() * 1_000_000_000 + STALE.subsec_nanos() as u64;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    /// Slots that follow: [`SLOTS`].
    slots: AtomicU32,
    _reserved: AtomicU32,
}

#[repr(C)]
struct Slot {
    /// The process that claimed it; 0: free.
    pid: AtomicI32,
    /// Its scrub threads in a step now.
    working: AtomicU32,
    /// Its handlers polling now.
    polling: AtomicU32,
    /// Pages its pools hold (ready and recycled), in the ledger of cgroup `cgroup`.
    pooled: AtomicU32,
    /// CLOCK_MONOTONIC nanoseconds of the last step a scrub of it began: `working` counts
    /// only while this is fresh.
    beat: AtomicU64,
    /// The same for `polling`: the last poll a handler of it began.
    poll_beat: AtomicU64,
    /// The memory cgroup whose ledger `pooled` and `claim` are in (`MemoryCgroup::key`); 0:
    /// none.
    cgroup: AtomicU32,
    /// Pages a refill of its is populating now, not charged yet.
    claim: AtomicU32,
    /// The same for `pooled` and `claim`: when the process last wrote them.
    ledger_beat: AtomicU64,
}

/// Slots in the page.
const SLOTS: usize = (PAGE_SIZE - size_of::<Header>()) / size_of::<Slot>();
/// [`SLOTS`] as the header holds it.
#[allow(clippy::cast_possible_truncation, reason = "a page holds fewer than 2^32 slots")]
const SLOTS_U32: u32 = SLOTS as u32;

#[repr(C)]
struct Page {
    header: Header,
    slots: [Slot; SLOTS],
}

const _: () = assert!(size_of::<Page>() <= PAGE_SIZE);
// 85 slots: a process and its children by the dozen fit.
const _: () = assert!(size_of::<Slot>() == 48);

/// CLOCK_MONOTONIC in nanoseconds (the same clock in every process).
fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec; CLOCK_MONOTONIC cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// This process's view of the machine-wide state.
#[derive(Debug)]
pub(crate) struct Machine {
    /// The mapped page and our slot in it; `None`: alone.
    at: Option<(usize, usize)>,
    cpus: u32,
    /// Set by [`Machine::release`]: the slot may be another process's now, and nothing of
    /// ours reads or writes it any more (alone from then on).
    released: AtomicBool,
}

impl Machine {
    /// Working as if alone: every rule allows.
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn alone() -> Machine {
        Machine {
            at: None,
            cpus: 0,
            released: AtomicBool::new(false),
        }
    }

    /// The user's state (`runtime_dir`: `XDG_RUNTIME_DIR`, read by the caller), with a slot
    /// claimed for this process; or why not.
    ///
    /// # Context
    /// The program thread starting the engine. Opens, checks and maps the file (system calls
    /// that may sleep); takes no lock of the process's.
    pub(crate) fn open(runtime_dir: Option<&str>, cpus: u32) -> Result<Machine, Refused> {
        Machine::open_at(&file::path(runtime_dir).ok_or(Refused::NoPlace)?, cpus)
    }

    /// [`Machine::open`] of the file at `path`.
    ///
    /// # Context
    /// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
    pub(crate) fn open_at(path: &CString, cpus: u32) -> Result<Machine, Refused> {
        let addr = file::open(path, &init, &valid)?;
        // SAFETY: `valid` checked the magic of a page-sized shared mapping that lives until this
        // Machine drops; every field is an atomic, so any bytes are a valid Page.
        let page = unsafe { &*(addr as *const Page) };
        let pid = file::getpid();
        let slot = claim(page, pid).ok_or(Refused::Full)?;
        Ok(Machine {
            at: Some((addr, slot)),
            cpus,
            released: AtomicBool::new(false),
        })
    }

    fn page(&self) -> Option<(&Page, &Slot)> {
        if self.released.load(Acquire) {
            return None;
        }
        let (addr, slot) = self.at?;
        // SAFETY: as in open_at: a shared page of atomics, mapped while `at` is set.
        let page = unsafe { &*(addr as *const Page) };
        Some((page, &page.slots[slot]))
    }

    /// Other processes' (scrubs stepping, handlers polling), from fresh slots.
    fn others(&self) -> (u32, u32) {
        let Some((page, mine)) = self.page() else { return (0, 0) };
        let now = now_ns();
        let (mut working, mut polling) = (0u32, 0u32);
        let me = mine.pid.load(Relaxed);
        for s in &page.slots {
            // Other processes only: several engines of one process (tests) do not gate each
            // other.
            let pid = s.pid.load(Relaxed);
            if std::ptr::eq(s, mine) || pid == 0 || pid == me {
                continue;
            }
            // abs_diff: a beat in the future (a corrupt slot) is not fresh for ever.
            if now.abs_diff(s.beat.load(Relaxed)) <= STALE_NS {
                working = working.saturating_add(s.working.load(Relaxed).min(64));
            }
            if now.abs_diff(s.poll_beat.load(Relaxed)) <= STALE_NS {
                polling = polling.saturating_add(s.polling.load(Relaxed).min(64));
            }
        }
        (working, polling)
    }

    /// Whether a scrub of ours may step now: other processes' stepping scrubs leave a CPU to
    /// programs. Always when alone.
    ///
    /// # Context
    /// A scrub thread, before each step; takes no lock and never sleeps (atomics on the shared page).
    pub(crate) fn scrub_may_step(&self) -> bool {
        if self.page().is_none() {
            return true;
        }
        let (working, _) = self.others();
        working < self.cpus.saturating_sub(1).max(1)
    }

    /// Whether a handler of ours may poll, with `busy` of our own threads at work (the poller
    /// and the thread whose faults it waits for among them): with other processes' stepping
    /// scrubs and polling handlers they still fit the CPUs, as `busy` alone must.
    ///
    /// # Context
    /// A handler, before it polls; takes no lock and never sleeps (atomics on the shared page).
    pub(crate) fn handler_may_poll(&self, busy: u32) -> bool {
        if self.page().is_none() {
            return true;
        }
        let (working, polling) = self.others();
        working.saturating_add(polling).saturating_add(busy) <= self.cpus
    }

    /// A scrub of ours starts (`true`) or stops stepping.
    ///
    /// # Context
    /// A scrub thread; takes no lock and never sleeps (atomics on the shared page).
    pub(crate) fn scrub_stepping(&self, on: bool) {
        if let Some((_, s)) = self.page() {
            change(&s.working, on);
            self.scrub_beat();
        }
    }

    /// A scrub of ours takes one more step: its count stays fresh.
    ///
    /// # Context
    /// A scrub thread; takes no lock and never sleeps (atomics on the shared page).
    pub(crate) fn scrub_beat(&self) {
        if let Some((_, s)) = self.page() {
            s.beat.store(now_ns(), Relaxed);
        }
    }

    /// A handler of ours starts or ends a poll.
    ///
    /// # Context
    /// A handler; takes no lock and never sleeps (atomics on the shared page).
    pub(crate) fn handler_polling(&self, on: bool) {
        if let Some((_, s)) = self.page() {
            change(&s.polling, on);
            s.poll_beat.store(now_ns(), Relaxed);
        }
    }

    /// The process is leaving (`Engine::stop_at_exit`): its slot is free now, whatever its
    /// threads still do (a slot without a pid counts for nothing).
    ///
    /// # Context
    /// The program thread running the process's exit handlers; takes no lock and never sleeps (atomics on the shared page).
    pub(crate) fn release(&self) {
        if let Some((_, s)) = self.page() {
            self.released.store(true, Release);
            s.working.store(0, Relaxed);
            s.polling.store(0, Relaxed);
            s.pooled.store(0, Relaxed);
            s.claim.store(0, Relaxed);
            s.cgroup.store(0, Relaxed);
            s.pid.store(0, Release);
        }
    }

    /// Writes our line of cgroup `key`'s ledger: our pools hold `pooled` pages.
    ///
    /// # Context
    /// A scrub thread; takes no lock and never sleeps (atomics on the shared page).
    pub(crate) fn ledger_hold(&self, key: u32, pooled: u64) {
        if let Some((_, s)) = self.page() {
            s.cgroup.store(key, SeqCst);
            s.pooled.store(u32::try_from(pooled).unwrap_or(u32::MAX), Relaxed);
            s.ledger_beat.store(now_ns(), SeqCst);
        }
    }

    /// A refill of ours is about to populate `n` pages in cgroup `key` (`claim`), or has
    /// populated them (`!claim`: they are charged, and in our pools' count). A claim is
    /// published before the caller reads the cgroup's usage and the others' lines
    /// ([`Machine::ledger_others`]): of two refills deciding at once, the later sees the
    /// earlier's claim, or its pages charged.
    ///
    /// # Context
    /// A scrub thread; takes no lock and never sleeps (atomics on the shared page).
    pub(crate) fn ledger_claim(&self, key: u32, n: u64, claim: bool) {
        if let Some((_, s)) = self.page() {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            if claim {
                s.cgroup.store(key, SeqCst);
                s.claim.fetch_add(n, SeqCst);
            } else {
                let _ = s.claim.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(n)));
            }
            s.ledger_beat.store(now_ns(), SeqCst);
        }
    }

    /// The other processes' lines of cgroup `key`'s ledger, fresh ones only (a process killed
    /// leaves its line, and the kernel has taken its pages back): (pages their pools hold,
    /// pages their refills are populating). Other engines of this process count too: they
    /// share the cgroup.
    ///
    /// # Context
    /// A scrub thread; takes no lock and never sleeps (atomics on the shared page).
    pub(crate) fn ledger_others(&self, key: u32) -> Ledger {
        let Some((page, mine)) = self.page() else {
            return Ledger::default();
        };
        let now = now_ns();
        let mut l = Ledger::default();
        for s in &page.slots {
            if std::ptr::eq(s, mine) || s.pid.load(Relaxed) == 0 || s.cgroup.load(SeqCst) != key {
                continue;
            }
            if now.abs_diff(s.ledger_beat.load(SeqCst)) <= STALE_NS {
                l.pooled = l.pooled.saturating_add(u64::from(s.pooled.load(Relaxed)));
                l.claims = l.claims.saturating_add(u64::from(s.claim.load(SeqCst)));
            }
        }
        l
    }

    /// Whether the state is shared (a slot claimed).
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub(crate) fn is_shared(&self) -> bool {
        self.page().is_some()
    }
}

/// Other processes' lines of one cgroup's ledger ([`Machine::ledger_others`]), in pages.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ledger {
    /// What their pools hold.
    pub(crate) pooled: u64,
    /// What their refills are populating now.
    pub(crate) claims: u64,
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.release();
        if let Some((addr, _)) = self.at.take() {
            file::unmap(addr);
        }
    }
}

fn change(c: &AtomicU32, on: bool) {
    if on {
        c.fetch_add(1, Relaxed);
    } else {
        // Never below zero, whatever another process wrote there.
        let _ = c.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(1)));
    }
}

/// Writes the header of a page whose header is all zero (just made, by us or by a process that
/// died before it wrote the header, or that is writing it now: the same bytes, so it does
/// not matter who wins).
fn init(addr: usize) {
    // SAFETY: a shared page of ours; atomics over any bytes.
    let page = unsafe { &*(addr as *const Page) };
    if page.header.magic.load(Acquire) != 0 {
        return;
    }
    let _ = page.header.slots.compare_exchange(0, SLOTS_U32, Relaxed, Relaxed);
    let _ = page.header.magic.compare_exchange(0, MAGIC, Release, Relaxed);
}

/// Whether the page holds our header (after [`init`], which writes it where it is all zero).
fn valid(addr: usize) -> bool {
    // SAFETY: a page-sized shared mapping; atomics over any bytes.
    let page = unsafe { &*(addr as *const Page) };
    page.header.magic.load(Acquire) == MAGIC && page.header.slots.load(Relaxed) == SLOTS_U32
}

/// Claims a free slot, or one whose process is gone, for `pid`; `None` when all are taken.
fn claim(page: &Page, pid: i32) -> Option<usize> {
    for (i, s) in page.slots.iter().enumerate() {
        let p = s.pid.load(Acquire);
        // Our own pid is another engine of this process (or of the image before an exec):
        // its slot stays until the process is gone.
        if (p == 0 || (p > 0 && p != pid && !file::alive(p))) && take(s, p, pid) {
            return Some(i);
        }
    }
    None
}

fn take(s: &Slot, was: i32, pid: i32) -> bool {
    if s.pid.compare_exchange(was, pid, AcqRel, Acquire).is_err() {
        return false;
    }
    s.working.store(0, Relaxed);
    s.polling.store(0, Relaxed);
    s.beat.store(0, Relaxed);
    s.poll_beat.store(0, Relaxed);
    s.pooled.store(0, Relaxed);
    s.claim.store(0, Relaxed);
    s.cgroup.store(0, Relaxed);
    s.ledger_beat.store(0, Relaxed);
    true
}

/// `XDG_RUNTIME_DIR`, as an embedder living inside another program read it where reading the
/// environment is safe ([`set_runtime_dir`]); else read now.
static RUNTIME_DIR: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Gives the engine `XDG_RUNTIME_DIR` (the LD_PRELOAD shim, in its constructor: an engine
/// started later, inside a hook, must not read an environment another thread may be changing).
///
/// # Context
/// A program thread, before the engine starts (the shim's start); no lock.
pub fn set_runtime_dir(dir: Option<&str>) {
    let _ = RUNTIME_DIR.set(dir.map(str::to_owned));
}

/// [`set_runtime_dir`]'s, or the environment's now.
///
/// # Context
/// The program thread starting the engine (`Engine::start`); maps memory, takes no lock.
pub(crate) fn runtime_dir() -> Option<String> {
    RUNTIME_DIR
        .get()
        .cloned()
        .unwrap_or_else(|| std::env::var("XDG_RUNTIME_DIR").ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::{Path, PathBuf};

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("zf-machine-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn c(p: &Path) -> CString {
        CString::new(p.to_str().unwrap()).unwrap()
    }

    #[test]
    fn a_missing_file_is_made_private_and_one_page_with_our_header() {
        let d = dir("missing");
        let f = d.join("zerofault-3.machine");
        let m = Machine::open_at(&c(&f), 2).unwrap();
        assert!(m.is_shared());
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!(md.len(), PAGE_SIZE as u64);
        assert_eq!(md.mode() & 0o077, 0, "{:o}", md.mode());
        let bytes = std::fs::read(&f).unwrap();
        assert_eq!(&bytes[..8], b"ZFMACH03");
        // A second engine of this process (another process would map the same) takes another
        // slot.
        let m2 = Machine::open_at(&c(&f), 2).unwrap();
        assert_ne!(m.at.unwrap().1, m2.at.unwrap().1);
        drop((m, m2));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_page_left_without_its_header_gets_it() {
        // A process that made the file and died (or is still writing) before its header: the
        // next one writes the same header, and both work.
        let d = dir("noheader");
        let f = d.join("m");
        std::fs::write(&f, vec![0u8; PAGE_SIZE]).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let m = Machine::open_at(&c(&f), 2).unwrap();
        assert_eq!(&std::fs::read(&f).unwrap()[..8], b"ZFMACH03");
        drop(m);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_runtime_directory_is_used_only_when_private() {
        let d = dir("runtime");
        let p = file::path(Some(d.to_str().unwrap())).unwrap();
        assert_eq!(p.to_str().unwrap(), d.join("zerofault-3.machine").to_str().unwrap());
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = file::path(Some(d.to_str().unwrap())).unwrap();
        assert!(p.to_str().unwrap().starts_with("/dev/shm/zerofault-"), "{p:?}");
        let p = file::path(Some("relative/dir")).unwrap();
        assert!(p.to_str().unwrap().starts_with("/dev/shm/"), "{p:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn bad_files_are_refused_and_left_as_they_are() {
        let d = dir("bad");
        // Corrupt: our size, not our header.
        let f = d.join("corrupt");
        std::fs::write(&f, vec![7u8; PAGE_SIZE]).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Machine::open_at(&c(&f), 2).unwrap_err(), Refused::Header);
        assert_eq!(std::fs::read(&f).unwrap(), vec![7u8; PAGE_SIZE], "left as it was");
        // Another size.
        let f = d.join("short");
        std::fs::write(&f, b"ZFMACH01").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Machine::open_at(&c(&f), 2).unwrap_err(), Refused::Size(8));
        // World-writable, and group-readable.
        for mode in [0o666, 0o640, 0o602] {
            let f = d.join(format!("mode{mode:o}"));
            std::fs::write(&f, vec![0u8; PAGE_SIZE]).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(
                Machine::open_at(&c(&f), 2).unwrap_err(),
                Refused::Mode(mode),
                "{mode:o}"
            );
        }
        // A symbolic link to a good file.
        let good = d.join("good");
        drop(Machine::open_at(&c(&good), 2).unwrap());
        let link = d.join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert_eq!(Machine::open_at(&c(&link), 2).unwrap_err(), Refused::Link);
        // A directory, a FIFO, a second name of a good file.
        let sub = d.join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert_eq!(
            Machine::open_at(&c(&sub), 2).unwrap_err(),
            Refused::Call("open", libc::EISDIR)
        );
        let fifo = c(&d.join("fifo"));
        // SAFETY: a NUL-terminated path in our own directory.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(Machine::open_at(&fifo, 2).unwrap_err(), Refused::NotFile);
        let second = d.join("second");
        std::fs::hard_link(&good, &second).unwrap();
        assert_eq!(Machine::open_at(&c(&second), 2).unwrap_err(), Refused::Links(2));
        // Another user's, as root: a file given to nobody, which root may open. (Another user
        // cannot make a file of someone else's: there, root's /etc/passwd is refused at open.)
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let f = d.join("foreign");
            std::fs::write(&f, vec![0u8; PAGE_SIZE]).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
            assert_eq!(Machine::open_at(&c(&f), 2).unwrap_err(), Refused::Owner(65534));
            assert_eq!(std::fs::metadata(&f).unwrap().uid(), 65534, "left as it was");
        } else {
            let e = Machine::open_at(&c(Path::new("/etc/passwd")), 2).unwrap_err();
            assert_eq!(e, Refused::Call("open", libc::EACCES));
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn scrubs_leave_a_cpu_and_polls_count_the_whole_machine() {
        let d = dir("rules");
        let f = c(&d.join("m"));
        let a = Machine::open_at(&f, 2).unwrap();
        // Another process (pid 1 stands for it): a slot of its own, written as its engine would.
        let (page, _) = a.page().unwrap();
        let other = page.slots.iter().find(|s| s.pid.load(Relaxed) == 0).unwrap();
        other.pid.store(1, Relaxed);
        let beat = || other.beat.store(now_ns(), Relaxed);
        let poll_beat = || other.poll_beat.store(now_ns(), Relaxed);
        assert!(a.scrub_may_step());
        // Alone on two CPUs, a poller and the thread it serves fit, as without the state.
        assert!(a.handler_may_poll(2) && !a.handler_may_poll(3));
        // Two CPUs: one scrub steps at a time on the machine.
        other.working.store(1, Relaxed);
        beat();
        assert!(!a.scrub_may_step());
        assert!(a.handler_may_poll(1));
        assert!(
            !a.handler_may_poll(2),
            "its scrub, our poller and our faulting thread: three"
        );
        other.working.store(0, Relaxed);
        assert!(a.scrub_may_step());
        other.polling.store(1, Relaxed);
        poll_beat();
        assert!(!a.handler_may_poll(2));
        assert!(a.scrub_may_step(), "polls do not hold scrubs back");
        // A fresh poll beat keeps no scrub count alive: each count has its own beat.
        other.working.store(1, Relaxed);
        other.beat.store(now_ns() - 2 * STALE_NS, Relaxed);
        assert!(a.scrub_may_step());
        // Nor is a beat in the future fresh for ever.
        other.beat.store(now_ns() + 10 * STALE_NS, Relaxed);
        assert!(a.scrub_may_step());
        other.working.store(0, Relaxed);
        other.polling.store(0, Relaxed);
        // Our own counts are in our slot, and another engine of this process is not gated.
        a.scrub_stepping(true);
        a.handler_polling(true);
        let (_, mine) = a.page().unwrap();
        assert_eq!((mine.working.load(Relaxed), mine.polling.load(Relaxed)), (1, 1));
        let b = Machine::open_at(&f, 2).unwrap();
        assert!(b.scrub_may_step() && b.handler_may_poll(2));
        a.scrub_stepping(false);
        a.handler_polling(false);
        a.handler_polling(false);
        assert_eq!(
            (mine.working.load(Relaxed), mine.polling.load(Relaxed)),
            (0, 0),
            "never below 0"
        );
        // A process leaving frees its slot at once, whatever its threads still count.
        b.scrub_stepping(true);
        let (_, b_slot) = b.page().unwrap();
        b.release();
        assert_eq!((b_slot.pid.load(Relaxed), b_slot.working.load(Relaxed)), (0, 0));
        // Its threads still at work write nothing there any more (the slot may be another
        // process's by now).
        b_slot.pid.store(1, Relaxed);
        b.scrub_stepping(true);
        b.handler_polling(true);
        assert_eq!((b_slot.working.load(Relaxed), b_slot.polling.load(Relaxed)), (0, 0));
        assert!(b.scrub_may_step() && !b.is_shared());
        b_slot.pid.store(0, Relaxed);
        // Alone: everything allowed.
        let alone = Machine::alone();
        assert!(alone.scrub_may_step() && alone.handler_may_poll(100));
        other.pid.store(0, Relaxed);
        drop((a, b));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_cgroups_ledger_sums_the_other_processes_fresh_lines() {
        let d = dir("ledger");
        let f = c(&d.join("m"));
        let (a, b, x) = (
            Machine::open_at(&f, 2).unwrap(),
            Machine::open_at(&f, 2).unwrap(),
            Machine::open_at(&f, 2).unwrap(),
        );
        let none = Ledger::default();
        assert_eq!(a.ledger_others(7), none);
        // b holds 100 pages in cgroup 7 and populates 512 more; x is in another cgroup.
        b.ledger_hold(7, 100);
        b.ledger_claim(7, 512, true);
        x.ledger_hold(8, 1000);
        a.ledger_hold(7, 50);
        assert_eq!(
            a.ledger_others(7),
            Ledger {
                pooled: 100,
                claims: 512
            }
        );
        assert_eq!(
            b.ledger_others(7),
            Ledger { pooled: 50, claims: 0 },
            "its own line left out"
        );
        assert_eq!(
            a.ledger_others(8),
            Ledger {
                pooled: 1000,
                claims: 0
            }
        );
        // Two claims of one process (a pool per node), one withdrawn.
        b.ledger_claim(7, 512, true);
        b.ledger_claim(7, 512, false);
        assert_eq!(a.ledger_others(7).claims, 512);
        b.ledger_claim(7, 512, false);
        b.ledger_claim(7, 512, false);
        assert_eq!(a.ledger_others(7).claims, 0, "never below 0");
        // A line not written for a second (a process killed: the kernel took its pages).
        let (page, _) = b.page().unwrap();
        let bs = &page.slots[b.at.unwrap().1];
        bs.ledger_beat.store(now_ns() - 2 * STALE_NS, Relaxed);
        assert_eq!(a.ledger_others(7), none);
        b.ledger_hold(7, 100);
        assert_eq!(a.ledger_others(7).pooled, 100);
        // A process leaving takes its line with it; alone, there is no ledger.
        b.release();
        assert_eq!(a.ledger_others(7), none);
        let alone = Machine::alone();
        alone.ledger_hold(7, 5);
        alone.ledger_claim(7, 5, true);
        assert_eq!(alone.ledger_others(7), none);
        assert_eq!(a.ledger_others(7), none);
        drop((a, b, x));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_slot_of_a_dead_process_is_taken_again_and_a_full_table_works_alone() {
        let d = dir("slots");
        let f = c(&d.join("m"));
        let m = Machine::open_at(&f, 2).unwrap();
        let (page, _) = m.page().unwrap();
        // Every slot held by a live process (pid 1).
        for s in &page.slots {
            s.pid.store(1, Relaxed);
        }
        assert_eq!(Machine::open_at(&f, 2).unwrap_err(), Refused::Full);
        // A dead pid's slot is taken (a child that has exited and been reaped).
        let child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id() as i32;
        let mut child = child;
        child.wait().unwrap();
        page.slots[3].pid.store(dead, Relaxed);
        let n = Machine::open_at(&f, 2).unwrap();
        assert_eq!(n.at.unwrap().1, 3);
        std::fs::remove_dir_all(&d).unwrap();
        std::mem::forget((m, n)); // their slots point into the file's page, still mapped
    }
}
