//! The shim at the process's exit: the engine stopped, and the exit report
//! (`ZEROFAULT_STATS`) or the verbose line on an engine never started.

use crate::hook::Hook;
use crate::state::{getpid, say, ASKED, IDLE, OPTIONS, ROOT_PID, SAY_UNUSED, STATE, STATS, UNINIT};
use engine::os::raw;
use engine::StatsOut;
use std::sync::atomic::Ordering::*;

/// The engine's descriptor as a clone child finds it (C `struct zf_clone_fd` in
/// front/front.c): the child closes `fd` if it still names the file `(dev, ino)`.
#[repr(C)]
pub struct CloneFd {
    fd: libc::c_int,
    dev: u64,
    ino: u64,
}

/// Before the program's `clone(CLONE_VM)` without `CLONE_THREAD`: a process that shares the
/// memory and may outlive this one. Without `CLONE_FILES` the child gets a copy of the
/// descriptor table, the engine's userfaultfd in it: that copy would keep every range
/// registered after this process died, even by SIGKILL, and the child's faults there would
/// wait for ever. So the front has the child close its copy first (returns 1 with `out`
/// filled), and this process's death stays the last close, which hands every range back. With
/// `CLONE_FILES` (`shares_files`) the child shares the table itself: nothing it can close, so
/// the engine stops for good before the clone (returns 0).
///
/// # Safety
/// `out` is valid for one write.
///
/// # Context
/// The program thread that calls `clone`, from the front, inside the hook scope (nested calls
/// do nothing); stopping for good waits for the engine's threads to leave.
#[no_mangle]
pub unsafe extern "C" fn zerofault_clone_prepare(shares_files: libc::c_int, out: *mut CloneFd) -> libc::c_int {
    let Some(h) = Hook::enter() else { return 0 };
    if shares_files == 0 {
        let Some((fd, (dev, ino))) = h.running().and_then(engine::Engine::uffd_parts) else {
            return 0;
        };
        // SAFETY: the caller's contract.
        unsafe { out.write(CloneFd { fd, dev, ino }) };
        return 1;
    }
    if let Some(e) = h.switch_off().filter(|e| e.is_active()) {
        e.stop_for_good();
        if e.options().verbose {
            say(&format!(
                "zerofault: engine stopped in pid {}: the program clones a process that shares its \
                 memory and its descriptors; the kernel serves its faults from now on",
                getpid()
            ));
        }
    }
    0
}

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

/// The shim's destructor: stops the engine's scrub (the handlers keep serving until the
/// process ends), then writes the exit report or the verbose line on an engine never started.
///
/// # Context
/// The program thread that runs the process's destructors (the one calling `exit`), inside the
/// hook scope (a call from inside a hook passes through); quiet while it uses the engine,
/// which takes the engine's locks and may wait for a handler (`Engine::stats`, bounded); the
/// report is written as the program's own write, signals not blocked.
extern "C" fn fini() {
    if STATE.load(Acquire) == UNINIT {
        return; // never initialised (see zerofault_shim_init)
    }
    let Some(h) = Hook::enter() else { return };
    if let Some(e) = h.running() {
        // The process is exiting: the scrub fills nothing more and nothing waits for it;
        // the handlers serve later destructors' faults until exit_group ends every thread.
        e.stop_at_exit();
    }
    let Some(o) = OPTIONS.get() else { return };
    // The process that read the knobs, not a fork child of it (which shares its state).
    if o.verbose && SAY_UNUSED.load(Acquire) && STATE.load(Acquire) == IDLE && getpid() == ROOT_PID.load(Acquire) {
        let show = |t: usize| {
            if t % (1 << 20) == 0 {
                format!("{} MiB", t >> 20)
            } else {
                format!("{t} bytes")
            }
        };
        let asked = ASKED.load(Acquire);
        let why = if asked == 0 {
            format!(
                "the program made no request of {} or more (preload_threshold)",
                show(o.preload_threshold)
            )
        } else {
            format!(
                "the program's large requests added up to {}, under {} (start_after)",
                show(asked),
                show(o.start_after)
            )
        };
        say(&format!("zerofault: engine not started in pid {}: {why}", getpid()));
    }
    match o.stats {
        StatsOut::Off => {}
        StatsOut::Text => text_report(&h),
        StatsOut::Json | StatsOut::File(_) => json_report(&h),
    }
}

/// `ZEROFAULT_STATS=on`: the counters of this process and the children it forked, as text, from
/// the process that loaded the shim, if they served anything.
fn text_report(h: &Hook) {
    if getpid() != ROOT_PID.load(Acquire) {
        return;
    }
    let s = STATS.load(Acquire);
    if s.is_null() {
        return;
    }
    // The handlers still run (stop_at_exit leaves them): let one in the middle of a message
    // count it first (Engine::stats waits for that, 50 ms at most). The CPU-time counters
    // may miss the last millisecond.
    if let Some(e) = h.running() {
        let _ = e.stats();
    }
    // SAFETY: see start.rs: a live MAP_SHARED Stats block.
    let snap = unsafe { &*s }.snapshot();
    if snap.pages_served() == 0 && snap.fault_events == 0 {
        return; // served nothing: nothing to say
    }
    let mut out = format!(
        "zerofault: stats of pid {} and the children it forked\nzerofault: pages_served {}\n",
        ROOT_PID.load(Acquire),
        snap.pages_served()
    );
    for line in snap.to_text().lines() {
        out += &format!("zerofault: {line}\n");
    }
    h.outside(|| crate::report::write_report(&out));
}

/// `ZEROFAULT_STATS=json` or a path: this process's own engine's counters as one JSON line,
/// from every process that started an engine, served it anything or not (a fork child's
/// engine is its own: no counter is counted twice).
fn json_report(h: &Hook) {
    let Some(e) = h.running() else { return };
    // Engine::stats waits for a handler in the middle of a message, as in text_report.
    let line = e.stats().process_json(getpid(), &program_name());
    h.outside(|| crate::report::write_report(&line));
}

/// The process's name (its comm, as `ps` shows it).
fn program_name() -> String {
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into the buffer.
    let _ = unsafe {
        raw::call(
            libc::SYS_prctl,
            [libc::PR_GET_NAME as usize, name.as_mut_ptr() as usize, 0, 0, 0, 0],
        )
    };
    let len = name.iter().position(|&b| b == 0).unwrap_or(16);
    String::from_utf8_lossy(&name[..len]).into_owned()
}
