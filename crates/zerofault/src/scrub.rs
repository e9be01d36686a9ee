//! The scrub thread (seeds 002/003's kscrubd): keeps the pool between its watermarks, using only
//! CPU nobody else wants.
//!
//! States, like mm/page_reporting.c's worker: **idle** (asleep on a condition variable, or on a
//! one-second timer), **requested** (a handler saw the pool below `scrub_start` and kicked it),
//! **active** (populating one 2 MiB chunk at a time until the pool holds `scrub_stop`).
//!
//! - It runs at `SCHED_IDLE` (nice 19 where that is refused): on a busy machine it yields to
//!   everything, which is the seed's "run on the most idle CPU". The faulting thread never
//!   waits for it; an empty pool means the handler copies from the zero source instead.
//! - `scrub_load` (seed 003, off by default): no scrubbing while the one-minute load average
//!   per CPU is above it. Checked before each chunk; a skipped round is counted and retried on
//!   the next timer tick.
//! - It stops at `scrub_stop`, and it starts only once a sequential writer was seen (the first
//!   predicted write fault) or the pool was prefilled: a program whose faults are random or
//!   read-only pays for no pool at all.

use crate::page::pages;
use crate::stats::{nanos, Stats};
use crate::sys::thread;
use crate::Shared;
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How the handler and the engine talk to the scrub thread.
#[derive(Debug, Default)]
pub(crate) struct ScrubCtl {
    requested: Mutex<bool>,
    cv: Condvar,
}

impl ScrubCtl {
    /// Asks for a refill. Cheap when a request is already pending.
    pub(crate) fn kick(&self) {
        let mut r = self.requested.lock().unwrap_or_else(|e| e.into_inner());
        if !*r {
            *r = true;
            self.cv.notify_one();
        }
    }

    /// Waits for a request, or for `timeout`. Returns whether a request was pending.
    fn wait(&self, timeout: Duration) -> bool {
        let r = self.requested.lock().unwrap_or_else(|e| e.into_inner());
        let (mut r, _) = self
            .cv
            .wait_timeout_while(r, timeout, |r| !*r)
            .unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *r, false)
    }
}

/// Whether the load gate lets the scrub run now.
fn load_allows(limit: Option<f64>) -> bool {
    match (limit, thread::loadavg_1min()) {
        (Some(limit), Some(load)) => load / thread::online_cpus() as f64 <= limit,
        _ => true,
    }
}

/// The thread's body.
pub(crate) fn run(shared: Arc<Shared>) {
    let _ = thread::make_idle();
    let clock = thread::ThreadClock::current();
    let mut counted = Duration::ZERO;
    let Some(pool) = shared.pool.as_ref() else { return };
    let start = pages(shared.opts.scrub_start);
    let stop = pages(shared.opts.scrub_stop);
    let stopping = || shared.stopping.load(Acquire) || shared.failed.load(Acquire);
    while !stopping() {
        let requested = shared.scrub.wait(Duration::from_secs(1));
        if stopping() {
            break;
        }
        // Refill when asked, or on a timer tick that finds the pool low (after a load-gated
        // round, or before any handler noticed).
        if !shared.streaming.load(Acquire)
            || shared.pool_paused.load(Acquire)
            || !(requested || pool.available() < start)
        {
            continue;
        }
        while !stopping() && pool.available() < stop {
            if !load_allows(shared.opts.scrub_load) {
                Stats::add(&shared.stats.scrub_load_skips, 1);
                break;
            }
            match pool.fill_step(stop - pool.available(), &shared.stats) {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => {
                    // Out of memory or a refused populate: the handlers copy instead; try again
                    // on a later tick.
                    break;
                }
            }
        }
        let now = clock.read();
        Stats::add(&shared.stats.scrub_cpu_ns, nanos(now - counted));
        counted = now;
    }
    let now = clock.read();
    Stats::add(&shared.stats.scrub_cpu_ns, nanos(now.saturating_sub(counted)));
}
