//! Thread-level syscalls: the wake-up eventfd, poll, scheduling class, CPU affinity, thread CPU
//! time, tid, load average.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An eventfd used to interrupt a thread blocked in [`poll2`].
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd(2) takes an initial count and flags; returns a fresh fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nobody else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the eventfd readable (level-triggered: it stays readable; nobody drains it).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local u64 to our own eventfd.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits until `a` or `b` is readable. Returns `(a_ready, b_ready)`; EINTR reports neither.
pub fn poll2(a: RawFd, b: RawFd) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: `fds` is a valid array of two pollfd structs for the duration of the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok((false, false));
        }
        return Err(e);
    }
    let ready = |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0;
    Ok((ready(&fds[0]), ready(&fds[1])))
}

/// Puts the calling thread in SCHED_IDLE, so that it runs only on otherwise idle CPUs.
/// Where that is refused, falls back to nice 19. Returns which one took effect.
pub fn make_idle() -> &'static str {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
        return "SCHED_IDLE";
    }
    // SAFETY: setpriority on our own thread id.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, gettid() as libc::id_t, 19) } == 0 {
        return "nice 19";
    }
    "normal"
}

/// The kernel thread id of the caller, as userfaultfd reports it with THREAD_ID.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// User and system CPU time of the whole process so far (getrusage RUSAGE_SELF).
pub fn process_cpu_time() -> (Duration, Duration) {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid rusage to write into.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// Number of online CPUs.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

/// The 1-minute load average (from /proc/loadavg), if readable.
pub fn loadavg_1min() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// The CPU-time clock of one thread, readable from any thread while it lives.
#[derive(Clone, Copy, Debug)]
pub struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    /// The clock of the calling thread.
    pub fn current() -> ThreadClock {
        let mut id: libc::clockid_t = libc::CLOCK_THREAD_CPUTIME_ID;
        // SAFETY: pthread_self() is the calling thread, alive during the call; `id` is a valid
        // out-pointer. On failure `id` keeps CLOCK_THREAD_CPUTIME_ID (the reader's own clock).
        unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
        ThreadClock(id)
    }

    /// CPU time used so far. Only meaningful while the thread lives.
    pub fn read(&self) -> Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid timespec to write into; a stale clock id yields EINVAL and
        // leaves `ts` zero.
        unsafe { libc::clock_gettime(self.0, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
}

/// Pins the calling thread to one CPU (`sched_setaffinity`); `cpu` is taken modulo the
/// number of CPUs the mask can hold.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
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

/// Closes a descriptor by number, for a copy that no owner will close (a forked child's copy
/// of a descriptor whose owning object is leaked).
pub fn close_fd(fd: RawFd) {
    // SAFETY: the caller guarantees no live owner will use or close `fd` again.
    unsafe { libc::close(fd) };
}
