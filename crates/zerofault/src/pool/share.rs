//! The scrub's share of the CPUs ([`Share`]): whether it may take its next step, from its own
//! scheduling (its CPU time and its wait for a CPU) and the machine-wide state of other
//! processes' scrubs, and how long it rests when not (see `scrub.rs`'s module docs).

use crate::pool::machine::Machine;
use crate::stats::{nanos, Stats};
use crate::sys::thread;
use std::time::{Duration, Instant};

/// The scrub's share of the CPUs: it works at the program's own priority (`SCHED_OTHER`),
/// and only while it finds a CPU to itself. Before each step it looks at its own scheduling
/// (its CPU time, and its wait for a CPU in `/proc/thread-self/schedstat`): over the last
/// [`SAMPLE`] of running and waiting, if it
/// waited for a CPU more than a quarter of the time it ran, the machine has no idle CPU for it
/// and it rests [`REST_MIN`], doubling up to [`REST_MAX`] while that lasts; the handlers copy
/// meanwhile, as the kernel would zero. Never `SCHED_IDLE`: a thread at `SCHED_IDLE` that
/// SIGKILL finds at work on a busy machine may be the process's last thread out and then runs
/// the address space's teardown at almost no CPU (`shared/repro/round2/k_hold.c`, beside CPU
/// hogs: DESIGN.md, "Exit" and "A busy machine").
#[derive(Debug)]
pub(super) struct Share {
    /// (ran, waited) when the current sample began.
    mark: Option<(u64, u64)>,
    rest: Duration,
    until: Option<Instant>,
    /// Counted as stepping in the machine-wide state: from a step allowed to the end of the
    /// round, a step refused, or a wait for the program to be quiet. (A scrub that dies in a
    /// step stops refreshing its count, which then goes stale: `machine::STALE`.)
    stepping: bool,
}

/// Running plus waiting time a verdict needs.
const SAMPLE: Duration = Duration::from_millis(4);
const REST_MIN: Duration = Duration::from_millis(4);
const REST_MAX: Duration = Duration::from_millis(32);
/// How long a scrub waits before it looks again when other processes' scrubs hold the CPUs
/// the machine-wide state allows scrubs.
const MACHINE_REST: Duration = Duration::from_millis(2);

impl Share {
    /// # Context
    /// The scrub thread.
    pub(super) fn new() -> Share {
        Share {
            mark: None,
            rest: REST_MIN,
            until: None,
            stepping: false,
        }
    }

    /// The round is over: no longer stepping, for the machine-wide state.
    ///
    /// # Context
    /// The scrub thread.
    pub(super) fn idle(&mut self, machine: &Machine) {
        if std::mem::take(&mut self.stepping) {
            machine.scrub_stepping(false);
        }
    }

    /// Whether the scrub may take its next step now (`clock`: the scrub's CPU time): it has a
    /// CPU to itself, and other processes' scrubs leave it one (`machine`; a refusal there is
    /// a rest of [`MACHINE_REST`]).
    ///
    /// # Context
    /// The scrub thread. Reads its own run delay (a file of /proc).
    pub(super) fn allows(&mut self, clock: &thread::ThreadClock, stats: &Stats, machine: &Machine) -> bool {
        let now = Instant::now();
        // The file is read only when a rest is over.
        if self.until.is_some_and(|t| now < t) {
            return false;
        }
        // Its CPU time from the clock: schedstat's lags by up to a scheduler tick, as long as
        // a sample.
        let times = thread::run_delay().map(|w| (nanos(clock.read()), w));
        if !self.decide(times, now) {
            Stats::add(&stats.scrub_rests, 1);
            self.idle(machine);
            return false;
        }
        if !machine.scrub_may_step() {
            Stats::add(&stats.scrub_machine_waits, 1);
            self.idle(machine);
            self.until = Some(now + MACHINE_REST);
            return false;
        }
        if std::mem::replace(&mut self.stepping, true) {
            machine.scrub_beat();
        } else {
            machine.scrub_stepping(true);
        }
        true
    }

    /// How long the current rest still lasts, if resting.
    ///
    /// # Context
    /// The scrub thread.
    pub(super) fn resting_for(&self, now: Instant) -> Option<Duration> {
        self.until.map(|t| t.saturating_duration_since(now))
    }

    /// [`Share::allows`], given the thread's (ran, waited) now, if known (no schedstat: always).
    fn decide(&mut self, times: Option<(u64, u64)>, now: Instant) -> bool {
        if let Some(t) = self.until {
            if now < t {
                return false;
            }
            self.until = None;
            self.mark = None;
        }
        let Some((ran, waited)) = times else {
            return true;
        };
        let Some((r0, w0)) = self.mark else {
            self.mark = Some((ran, waited));
            return true;
        };
        match verdict(ran.saturating_sub(r0), waited.saturating_sub(w0)) {
            None => true,
            Some(true) => {
                self.until = Some(now + self.rest);
                self.rest = (self.rest * 2).min(REST_MAX);
                false
            }
            Some(false) => {
                self.rest = REST_MIN;
                self.mark = Some((ran, waited));
                true
            }
        }
    }
}

/// Over a sample of `ran` ns on a CPU and `waited` ns runnable: `None` while it is shorter
/// than [`SAMPLE`], else whether the machine is busy (waited more than a quarter of ran).
fn verdict(ran: u64, waited: u64) -> Option<bool> {
    (ran + waited >= nanos(SAMPLE)).then_some(waited * 4 > ran)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_scrub_is_busy_when_it_waited_more_than_a_quarter_of_what_it_ran() {
        assert_eq!(verdict(2 * MS, MS), None, "a sample under 4 ms gives no verdict");
        assert_eq!(verdict(4 * MS, 0), Some(false));
        assert_eq!(verdict(4 * MS, MS), Some(false), "a quarter exactly is not busy");
        assert_eq!(verdict(4 * MS, MS + 1), Some(true));
        assert_eq!(
            verdict(2 * MS, 2 * MS),
            Some(true),
            "a CPU shared half and half is busy"
        );
    }

    #[test]
    fn the_scrub_rests_longer_while_the_machine_stays_busy_and_starts_over_when_not() {
        let t0 = Instant::now();
        let mut s = Share::new();
        assert!(s.decide(None, t0), "no schedstat: always");
        assert!(s.decide(Some((0, 0)), t0), "the first look marks");
        assert!(s.decide(Some((MS, 0)), t0), "no verdict yet");
        // Waited as long as it ran: rests REST_MIN, then twice that, up to REST_MAX.
        assert!(!s.decide(Some((4 * MS, 4 * MS)), t0));
        assert!(!s.decide(Some((4 * MS, 4 * MS)), t0 + REST_MIN / 2), "still resting");
        let mut at = t0 + REST_MIN;
        let mut times = (4 * MS, 4 * MS);
        assert!(s.decide(Some(times), at), "the rest is over: a new mark");
        let mut rest = REST_MIN * 2;
        for _ in 0..10 {
            times = (times.0 + 4 * MS, times.1 + 4 * MS);
            assert!(!s.decide(Some(times), at));
            assert!(!s.decide(Some(times), at + rest - Duration::from_micros(1)));
            at += rest;
            assert!(s.decide(Some(times), at));
            rest = (rest * 2).min(REST_MAX);
        }
        assert_eq!(s.rest, REST_MAX);
        // A sample with a CPU to itself: the next rest is short again.
        times = (times.0 + 8 * MS, times.1);
        assert!(s.decide(Some(times), at));
        assert_eq!(s.rest, REST_MIN);
    }

    #[test]
    fn this_thread_reads_how_long_it_waited_for_a_cpu() {
        let a = thread::run_delay().expect("/proc/thread-self/schedstat");
        std::thread::yield_now();
        assert!(thread::run_delay().unwrap() >= a);
    }
}
