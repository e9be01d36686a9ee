//! The calling thread's scheduling and the CPUs it runs on: its scheduling class (a short
//! slice, leaving a real-time policy), the CPUs it may use and the last-level cache, its CPU
//! time and how long it waited for a CPU, the load average.

use super::raw;
use super::thread::gettid;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::Duration;

/// `struct sched_attr`, its first version (48 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

const SCHED_ATTR_SIZE: u32 = 48;
const _: () = assert!(std::mem::size_of::<SchedAttr>() == SCHED_ATTR_SIZE as usize);
/// `SCHED_FLAG_RESET_ON_FORK`: the one flag carried over.
const RESET_ON_FORK: u64 = 1;

/// The calling thread's scheduling attributes (`sched_getattr`).
fn sched_attr() -> Option<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: sched_getattr of the calling thread (0) into a buffer of the size passed.
    unsafe {
        raw::call(
            libc::SYS_sched_getattr,
            [
                0,
                &mut attr as *mut SchedAttr as usize,
                SCHED_ATTR_SIZE as usize,
                0,
                0,
                0,
            ],
        )
    }
    .ok()?;
    Some(attr)
}

fn set_sched_attr(attr: &SchedAttr) -> bool {
    // SAFETY: sched_setattr on the calling thread (0) with a valid, sized attribute.
    unsafe {
        raw::call(
            libc::SYS_sched_setattr,
            [0, attr as *const SchedAttr as usize, 0, 0, 0, 0],
        )
    }
    .is_ok()
}

/// Asks the scheduler for the shortest time slice it grants (EEVDF's custom slice, Linux
/// 6.12: `sched_runtime` at its minimum, 100 us) at the thread's own policy and nice: a thread
/// that wakes with a shorter slice has an earlier deadline and runs at once where one with the
/// default slice waits behind the thread on the CPU. Its share of the CPU stays what its nice gives.
/// For a thread that runs briefly each time it wakes (a fault handler). Only a thread at
/// `SCHED_OTHER` or `SCHED_BATCH`: any other policy is the program's choice (real-time, idle,
/// sched_ext) and is left as it is. Whether the call was accepted (a kernel before 6.12
/// accepts the attribute and ignores it).
pub(crate) fn short_slice() -> bool {
    let Some(now) = sched_attr() else { return false };
    if now.policy != libc::SCHED_OTHER as u32 && now.policy != libc::SCHED_BATCH as u32 {
        return false;
    }
    set_sched_attr(&SchedAttr {
        size: SCHED_ATTR_SIZE,
        policy: now.policy,
        flags: now.flags & RESET_ON_FORK,
        nice: now.nice,
        runtime: 100_000,
        ..SchedAttr::default()
    })
}

/// Leaves a real-time policy (`SCHED_FIFO`, `SCHED_RR`) the thread inherited from the
/// program's thread that started it, for `SCHED_OTHER` at its nice: for a thread that works
/// in the background (the scrub), which at a real-time priority would take the CPU from
/// every normal thread, the program's included. Any other policy is left as it is.
pub(crate) fn leave_realtime() {
    let Some(now) = sched_attr() else { return };
    if now.policy == libc::SCHED_FIFO as u32 || now.policy == libc::SCHED_RR as u32 {
        set_sched_attr(&SchedAttr {
            size: SCHED_ATTR_SIZE,
            policy: libc::SCHED_OTHER as u32,
            flags: now.flags & RESET_ON_FORK,
            nice: now.nice,
            ..SchedAttr::default()
        });
    }
}

/// Number of CPUs the calling thread may run on (sched_getaffinity, up to 4096 CPUs; the
/// online CPUs if the call fails). A raw system call: no libc path that could allocate.
pub(crate) fn allowed_cpus() -> usize {
    let mut mask = [0u64; 64];
    // SAFETY: the kernel writes at most `size_of_val(&mask)` bytes into `mask`.
    let r = unsafe {
        raw::call(
            libc::SYS_sched_getaffinity,
            [0, std::mem::size_of_val(&mask), mask.as_mut_ptr() as usize, 0, 0, 0],
        )
    };
    match r {
        Ok(_) => (mask.iter().map(|w| w.count_ones() as usize).sum::<usize>()).max(1),
        Err(_) => online_cpus(),
    }
}

/// A CPU mask as sched_getaffinity writes it, up to 4096 CPUs.
pub(crate) type CpuMask = [u64; 64];

/// The CPUs thread `tid` may run on (0: the calling thread; the process's id: its main
/// thread), with a raw system call (no /proc path: it works in a chroot, under Landlock).
fn cpus_of(tid: usize) -> Option<CpuMask> {
    let mut mask = [0u64; 64];
    // SAFETY: the kernel writes at most `size_of_val(&mask)` bytes into `mask`.
    unsafe {
        raw::call(
            libc::SYS_sched_getaffinity,
            [tid, std::mem::size_of_val(&mask), mask.as_mut_ptr() as usize, 0, 0, 0],
        )
    }
    .ok()?;
    Some(mask)
}

/// The CPUs the process's main thread may run on: what `taskset -p` and a one-threaded
/// program's `sched_setaffinity` change, and what the engine's threads are given.
///
/// # Context
/// Any thread; one system call.
pub(crate) fn process_cpus() -> Option<CpuMask> {
    cpus_of(getpid())
}

/// The process's id, as a system call argument.
fn getpid() -> usize {
    // SAFETY: getpid has no arguments and no side effect.
    usize::try_from(unsafe { raw::syscall(libc::SYS_getpid, [0; 6]) }).unwrap_or(0)
}

/// Gives thread `tid` (0: the calling thread) the CPUs of `mask` (the kernel keeps them within
/// the thread's cpuset). Whether it was accepted.
///
/// # Context
/// Any thread of the process (a program thread in a hook, for the engine's threads); one
/// system call.
pub(crate) fn set_cpus(tid: usize, mask: &CpuMask) -> bool {
    // SAFETY: sched_setaffinity reads `size_of_val(mask)` bytes from `mask`.
    unsafe {
        raw::call(
            libc::SYS_sched_setaffinity,
            [tid, std::mem::size_of_val(mask), mask.as_ptr() as usize, 0, 0, 0],
        )
    }
    .is_ok()
}

/// Bumped each time the process's CPUs were found changed: an engine thread that sees it
/// moved takes the process's CPUs itself ([`follow_process_cpus`]).
static CPUS_MOVED: AtomicU64 = AtomicU64::new(0);

/// Says that the process's CPUs changed: every engine thread takes them at its next look.
///
/// # Context
/// Any thread; one atomic add.
pub(crate) fn cpus_moved() {
    CPUS_MOVED.fetch_add(1, Release);
}

/// Whether the process's CPUs changed since `seen` (which is brought up to date): one atomic
/// load, for a thread's loop.
fn cpus_moved_since(seen: &mut u64) -> bool {
    let now = CPUS_MOVED.load(Acquire);
    std::mem::replace(seen, now) != now
}

/// The CPUs the calling thread may run on.
///
/// # Context
/// Any thread; one system call.
pub(crate) fn own_cpus() -> Option<CpuMask> {
    cpus_of(0)
}

/// Whether the process's CPUs differ from `last` (which is brought up to date); for the
/// engine's periodic look, which sees what no hook does (`taskset -p` from outside).
fn process_cpus_changed(last: &mut Option<CpuMask>) -> bool {
    let now = process_cpus();
    now.is_some() && std::mem::replace(last, now) != now
}

/// Gives the calling thread the CPUs of the process's main thread, or those of them within
/// `within` (a NUMA node's, for a thread bound to one) when there are any.
fn follow_process_cpus(within: Option<&CpuMask>) {
    let Some(mut main) = process_cpus() else { return };
    if let Some(w) = within {
        let mut both = main;
        both.iter_mut().zip(w).for_each(|(m, w)| *m &= w);
        if both.iter().any(|&m| m != 0) {
            main = both;
        }
    }
    if cpus_of(0) != Some(main) {
        set_cpus(0, &main);
    }
}

/// An engine thread's place among the CPUs: the process's (its main thread's), within those
/// of the thread's NUMA node when it is bound to one, taken again whenever they change.
pub(crate) struct Placement {
    within: Option<CpuMask>,
    seen: u64,
    process: Option<CpuMask>,
}

impl Placement {
    /// For the calling thread, at its start: it takes the process's CPUs (within `within`).
    ///
    /// # Context
    /// An engine thread, at its start; two or three system calls.
    pub(crate) fn start(within: Option<CpuMask>) -> Placement {
        let mut p = Placement {
            within,
            seen: 0,
            process: process_cpus(),
        };
        let _ = cpus_moved_since(&mut p.seen);
        follow_process_cpus(p.within.as_ref());
        p
    }

    /// The periodic look of one engine thread: a change of the process's CPUs no hook saw
    /// (`taskset -p` from outside) is told to every engine thread.
    ///
    /// # Context
    /// An engine thread (the first scrub, every `LOOK_EVERY`); one system call.
    pub(crate) fn look(&mut self) {
        if process_cpus_changed(&mut self.process) {
            cpus_moved();
        }
    }

    /// In the thread's loop: one atomic load; the process's CPUs taken again if they moved.
    ///
    /// # Context
    /// An engine thread, in its loop; no lock, no sleep.
    pub(crate) fn follow(&mut self) {
        if cpus_moved_since(&mut self.seen) {
            follow_process_cpus(self.within.as_ref());
        }
    }
}

/// Whether the process's main thread has a real-time policy (`SCHED_FIFO`, `SCHED_RR`,
/// `SCHED_DEADLINE`), looked at where no hook sees the program's threads change it (`chrt -p` from outside).
///
/// # Context
/// Any thread; two system calls.
pub(crate) fn process_realtime() -> bool {
    // SAFETY: sched_getscheduler takes no pointer.
    let policy = unsafe { raw::syscall(libc::SYS_sched_getscheduler, [getpid(), 0, 0, 0, 0, 0]) };
    let policy = i32::try_from(policy).unwrap_or(-1) & !libc::SCHED_RESET_ON_FORK;
    matches!(policy, libc::SCHED_FIFO | libc::SCHED_RR | SCHED_DEADLINE)
}

/// `SCHED_DEADLINE`.
const SCHED_DEADLINE: i32 = 6;

/// Number of online CPUs.
pub(crate) fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n.max(1)).unwrap_or(1)
}

/// The size of CPU 0's last-level cache in bytes (the highest `level` under
/// /sys/devices/system/cpu/cpu0/cache), if sysfs says.
pub(crate) fn llc_bytes() -> Option<usize> {
    let mut best: Option<(u32, usize)> = None;
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let Ok(level) = super::file::read_to_string(format!("{dir}/level")) else {
            break;
        };
        let Ok(size) = super::file::read_to_string(format!("{dir}/size")) else {
            continue;
        };
        let (Ok(level), Some(size)) = (level.trim().parse::<u32>(), cache_size(size.trim())) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, size));
        }
    }
    best.map(|(_, s)| s)
}

/// A cache size as sysfs writes it: a count with a binary suffix (`48K`, `36608K`, `2M`).
fn cache_size(s: &str) -> Option<usize> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 10),
        b'M' => (&s[..s.len() - 1], 20),
        b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// How long, in all, the calling thread waited runnable for a CPU, in ns (the second field
/// of `/proc/thread-self/schedstat`, CONFIG_SCHED_INFO; `None` without it), read with raw
/// system calls. Opened for each read: a descriptor kept open is one a program that closes
/// every descriptor it did not open (a daemon starting up) would close under us, and its
/// number reused for the program's own file.
pub(crate) fn run_delay() -> Option<u64> {
    let mut buf = [0u8; 128];
    let n = super::file::read_small(b"/proc/thread-self/schedstat\0", &mut buf)?;
    std::str::from_utf8(&buf[..n])
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The 1-minute load average (from /proc/loadavg), if readable.
pub(crate) fn loadavg_1min() -> Option<f64> {
    let s = super::file::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// The CPU-time clock of one thread, readable from any thread while it lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    /// The clock of the calling thread, by its tid (the kernel's CPUCLOCK_PERTHREAD encoding,
    /// as glibc's pthread_getcpuclockid computes it), so that it works on engine threads too.
    pub(crate) fn current() -> ThreadClock {
        let tid = gettid() as libc::clockid_t;
        ThreadClock((!tid << 3) | 4 | 2)
    }

    /// CPU time used so far. Only meaningful while the thread lives.
    pub(crate) fn read(&self) -> Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid timespec to write into; a stale clock id yields EINVAL and
        // leaves `ts` zero.
        let _ = unsafe {
            raw::call(
                libc::SYS_clock_gettime,
                [
                    raw::int_arg(self.0),
                    &mut ts as *mut libc::timespec as usize,
                    0,
                    0,
                    0,
                    0,
                ],
            )
        };
        Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(cache_size("48K"), Some(48 << 10));
        assert_eq!(cache_size("36608K"), Some(36608 << 10));
        assert_eq!(cache_size("2M"), Some(2 << 20));
        assert_eq!(cache_size("512"), Some(512));
        assert_eq!(cache_size("K"), None);
        assert_eq!(cache_size(""), None);
    }
}
