//! The system calls pft makes itself, apart from the engine's seam: `MADV_POPULATE_WRITE`,
//! pinning a thread to a CPU, the process's CPU time, the CPU count and the page size. Plain
//! kernel memory for the kernel modes (an anonymous mapping, 2 MiB aligned, with its THP
//! advice) is the seam's [`Mapping`] (`zerofault::os::mman`), re-exported here.
//!
//! The engine's seam (`zerofault::os`) makes raw system calls that leave `errno` alone, for a
//! shim inside other programs; pft is a program of its own and calls libc for the rest.

use std::io;
use std::time::Duration;
pub(crate) use zerofault::os::mman::{Mapping, Thp};

/// Allocates and zero-fills every page of `[addr, addr + len)` now, writable
/// (`MADV_POPULATE_WRITE`, Linux 5.14). The range must not be registered with a userfaultfd.
pub(crate) fn populate_write(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: populating faults pages in as a write would; it changes no byte of a page that is
    // already there.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Pins the calling thread to one CPU (`sched_setaffinity`); `cpu` is taken modulo the
/// number of CPUs the mask can hold.
pub(crate) fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let bits = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: the index is below the set's capacity in bits.
    unsafe { libc::CPU_SET(cpu % bits, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// User and system CPU time of the whole process so far (getrusage RUSAGE_SELF): every thread,
/// the engine's included.
pub(crate) fn process_cpu_time() -> (Duration, Duration) {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid rusage to write into.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// The CPUs the calling thread may run on (`sched_getaffinity`), in order.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return (0..online_cpus()).collect();
    }
    let bits = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: each index is below the set's capacity in bits.
    (0..bits).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// CPU hogs for `--busy N`: processes of their own, each spinning at normal priority on
/// arithmetic, until dropped (SIGKILL, then reaped). A hog whose parent dies goes with it
/// (`PR_SET_PDEATHSIG`, which follows the thread that forked it: start hogs from a thread that
/// outlives them).
#[derive(Debug)]
pub struct Hogs(Vec<libc::pid_t>);

impl Hogs {
    pub fn start(n: u32) -> io::Result<Hogs> {
        let mut hogs = Hogs(Vec::with_capacity(n as usize));
        let parent = std::process::id() as libc::pid_t;
        for _ in 0..n {
            // SAFETY: the child calls only async-signal-safe functions (prctl, getppid, _exit)
            // and then spins without allocating or taking a lock.
            match unsafe { libc::fork() } {
                -1 => return Err(io::Error::last_os_error()),
                0 => unsafe {
                    // SAFETY: see above; these change nothing but this child.
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    if libc::getppid() != parent {
                        libc::_exit(0);
                    }
                    hog()
                },
                pid => hogs.0.push(pid),
            }
        }
        Ok(hogs)
    }
}

/// A hog's work: a multiply-add chain the compiler cannot drop.
fn hog() -> ! {
    let mut x: u64 = 1;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: our own child, not reaped yet: the pid still names it.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Number of online CPUs.
pub(crate) fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

/// The system page size, from sysconf.
pub(crate) fn system_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerofault::page::{PAGE_SIZE, PMD_SIZE};

    /// The state letter of process `pid` (/proc/PID/stat), None once it is reaped.
    fn state(pid: libc::pid_t) -> Option<char> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        s[s.rfind(')')? + 2..].chars().next()
    }

    #[test]
    fn hogs_spin_until_dropped_and_are_reaped() {
        let hogs = Hogs::start(2).unwrap();
        let pids = hogs.0.clone();
        assert_eq!(pids.len(), 2);
        std::thread::sleep(Duration::from_millis(50));
        for &p in &pids {
            // Running or waiting for a CPU: never asleep.
            assert_eq!(state(p), Some('R'), "hog {p}");
        }
        drop(hogs);
        for &p in &pids {
            assert_eq!(state(p), None, "hog {p} reaped");
        }
        assert!(Hogs::start(0).unwrap().0.is_empty());
    }

    #[test]
    fn mappings_are_aligned_writable_and_advised() {
        for thp in [Thp::Never, Thp::Always] {
            let m = Mapping::new(3 * PMD_SIZE + 5, thp).unwrap();
            let addr = m.as_ptr() as usize;
            assert_eq!(addr % PMD_SIZE, 0);
            assert_eq!(m.len(), 3 * PMD_SIZE + PAGE_SIZE);
            populate_write(addr, m.len()).unwrap();
            // SAFETY: the last byte of the mapping, which is ours and populated.
            unsafe { ((addr + m.len() - 1) as *mut u8).write_volatile(1) };
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let head = format!("{addr:x}-");
            let vma = smaps.split_once(&head).map(|(_, rest)| rest).unwrap_or_default();
            let flags = vma.lines().find_map(|l| l.strip_prefix("VmFlags:")).unwrap_or_default();
            let want = if thp == Thp::Never { " nh" } else { " hg" };
            assert!(flags.contains(want), "{thp:?}: {flags}");
        }
    }

    #[test]
    fn cpu_time_counts_and_pinning_takes() {
        let (u0, s0) = process_cpu_time();
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            std::hint::black_box(0u64);
        }
        let (u1, s1) = process_cpu_time();
        assert!(u1 + s1 > u0 + s0);
        // SAFETY: sched_getcpu has no preconditions; the CPU it names is one we may run on.
        let here = unsafe { libc::sched_getcpu() };
        assert!(here >= 0);
        std::thread::spawn(move || pin_to_cpu(here as usize).unwrap())
            .join()
            .unwrap();
        assert_eq!(system_page_size(), PAGE_SIZE);
    }
}
