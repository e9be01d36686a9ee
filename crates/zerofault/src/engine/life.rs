//! The engine around the program's life-cycle calls: fork, `mlockall`, the calls that
//! change the process's rights (pause and resume), exit, and the engine's drop.

use super::Engine;
use crate::state::ring_doorbells;
use crate::stats::Stats;
use crate::sys;
use crate::sys::mman::{self, PAGE_SIZE};
use crate::sys::thread::EngineThread;
use std::sync::atomic::Ordering::*;

impl Engine {
    /// For the child of a fork(): this engine belongs to the parent (its threads were not
    /// copied, its userfaultfd serves the parent's memory). Closes the child's copy of the
    /// descriptor, so that the parent failing open is never held up by it, and forgets the
    /// rest without touching the threads or any lock they may have held at the fork.
    ///
    /// # Context
    /// The child of a fork, in the shim's at-fork handler: one thread, atomics and one close(2).
    pub fn forget_after_fork(self) {
        self.close_after_fork();
        std::mem::forget(self);
    }

    /// The descriptor half of [`Engine::forget_after_fork`], for a fork handler that holds the
    /// engine by reference and leaks it itself: only atomics and one close(2), so it is safe
    /// in the child of a multi-threaded fork.
    ///
    /// # Context
    /// The child of a fork, in the shim's at-fork handler: one thread, atomics and one close(2).
    pub fn close_after_fork(&self) {
        // No lock is touched: the parent's handlers hold read guards for their whole lives,
        // and a fail-open may have been waiting for the write lock at the fork. The number is
        // closed if it still names the engine's file (the parent may have closed it, and the
        // number been reused, before the fork); the engine is leaked, so that nothing closes
        // it twice.
        if let Some(id) = self.shared.uffd_identity {
            // SAFETY: the engine is leaked right after (see above): nothing closes or uses the
            // child's copy of the descriptor again.
            unsafe { id.close_if_same() };
        }
    }
    /// Every mapping the engine made for itself (pool rings, staging area, zero source,
    /// doorbell, thread stacks), as (address, length).
    ///
    /// # Context
    /// Any thread; takes the threads' lock.
    pub fn own_mappings(&self) -> Vec<(usize, usize)> {
        let bells = self.shared.handlers() * PAGE_SIZE;
        let mut v = vec![self.shared.zero.area()];
        // Gone with the rings once given back (`Engine::give_back`): the program may map there.
        if !self.shared.given_back.load(Acquire) {
            v.push((self.shared.doorbell, bells));
        }
        for p in &self.shared.pools {
            v.extend(p.areas());
        }
        v.extend(self.shared.stage.iter().map(|m| (m.as_ptr() as usize, m.len())));
        let t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        v.extend(t.handlers.iter().chain(&t.scrubbers).map(|t| t.area()));
        v
    }

    /// Before the program's `mlockall(MCL_CURRENT)`: the engine's read-write reservations
    /// (pool rings, staging area) become `PROT_NONE`, which mlockall never populates, so that it
    /// does not fill them with locked zero pages. Until [`Engine::after_mlockall`] the handler
    /// copies instead of moving.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes every pool's work lock (waits for a
    /// scrub's step to end), then `mprotect`s.
    pub fn before_mlockall(&self) {
        // No give-back meanwhile: its unmapped rings could be the program's memory by the time
        // they are protected (the same below for the unlocks).
        let _one = self.giving_back.lock().unwrap_or_else(|e| e.into_inner());
        // Between two steps of the scrub, which leaves protected rings alone (it writes the
        // dirty ones).
        let _work: Vec<_> = self
            .shared
            .pools
            .iter()
            .map(|p| {
                let g = p.work.lock().unwrap_or_else(|e| e.into_inner());
                p.protected.store(true, Release);
                g
            })
            .collect();
        for (a, l) in self.rw_reservations() {
            // SAFETY: the engine's own reservations; the handler copies instead of moving
            // until after_mlockall (see above), and the scrub leaves them alone while they
            // are protected, so nothing reads or writes them meanwhile.
            let _ = unsafe { mman::protect(a, l, libc::PROT_NONE) };
        }
    }

    /// After the program's `mlockall`: unlocks every engine mapping (they are not the
    /// program's memory) and gives the reservations their protection back.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes every pool's work lock, then
    /// `munlock`s and `mprotect`s.
    pub fn after_mlockall(&self) {
        let _one = self.giving_back.lock().unwrap_or_else(|e| e.into_inner());
        for (a, l) in self.own_mappings() {
            let _ = mman::munlock(a, l);
        }
        let _work: Vec<_> = self
            .shared
            .pools
            .iter()
            .map(|p| p.work.lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        for (a, l) in self.rw_reservations() {
            // SAFETY: the engine's own reservations, given their protection back.
            let _ = unsafe { mman::protect(a, l, libc::PROT_READ | libc::PROT_WRITE) };
        }
        for p in &self.shared.pools {
            p.protected.store(false, Release);
        }
    }

    /// Empties the pool and stops refilling it (`true`), or lets the scrub refill it again.
    /// For a program under `mlockall(MCL_FUTURE)`: its new memory is locked, and the kernel
    /// moves no page between a locked and an unlocked mapping, so pool pages could only be
    /// copied; keeping them would be memory populated for nothing.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes every pool's work lock to empty it.
    pub fn pause_pool(&self, paused: bool) {
        self.shared.pool_paused.store(paused, Release);
        for p in &self.shared.pools {
            if paused {
                p.release_all();
            } else {
                p.scrub.kick();
            }
        }
    }

    /// For tests: stops every scrub thread in the middle of its next step, holding its pool's
    /// work lock (as a scrub the scheduler never runs would), or lets them go on (`false`).
    /// Returns whether every scrub thread is parked (waits at most 5 s), or, for `false`,
    /// true at once. The fault path must make progress all the while (rule 7).
    ///
    /// # Context
    /// A test's thread; sleeps up to 5 s waiting for the scrubs to park.
    #[doc(hidden)]
    pub fn park_scrub(&self, parked: bool) -> bool {
        self.shared.scrub_parked.store(parked, Release);
        if !parked {
            return true;
        }
        let want = u32::try_from(self.threads.lock().unwrap_or_else(|e| e.into_inner()).scrubbers.len()).unwrap_or(0);
        let t0 = std::time::Instant::now();
        while self.shared.scrubs_parked.load(Acquire) < want {
            if t0.elapsed() > std::time::Duration::from_secs(5) {
                return false;
            }
            self.shared.kick_scrubs();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    fn rw_reservations(&self) -> Vec<(usize, usize)> {
        let mut v = vec![];
        for p in &self.shared.pools {
            v.extend(p.areas());
        }
        v.extend(self.shared.stage.iter().map(|m| (m.as_ptr() as usize, m.len())));
        v
    }
    /// Stops the engine's threads, and returns once none of them is left in the process: for a
    /// call that must find the process as the program made it (`setuid` and the rest of the
    /// credential calls, `unshare` and `setns`, which need a one-threaded process for a user
    /// namespace, `PR_SET_NO_NEW_PRIVS`), after which [`Engine::resume`] starts them again from
    /// the calling thread, which hands them the new credentials, namespaces and flags, as
    /// `clone(2)` does. Registered memory stays registered: until then a fault there waits
    /// (a program thread's fault, or a `MADV_DONTNEED` of served memory, waits for the resume),
    /// so the caller resumes right after its call. The scrub threads stop first: a discard of
    /// theirs in a registered pool ring waits for a handler to read its event.
    /// Callers nest: the threads come back at the last [`Engine::resume`] (two threads changing
    /// their rights at once both find the engine stopped for their calls). Returns true: the
    /// caller must resume. DESIGN.md, "The program's rights".
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; takes the threads' lock; sleeps until
    /// the threads have left (they need no lock the caller holds).
    pub fn pause(&self) -> bool {
        let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        t.holders += 1;
        if t.holders > 1 {
            return true;
        }
        self.shared.stopping.store(true, Release);
        self.shared.kick_scrubs();
        let tids: Vec<u32> = t.handlers.iter().chain(&t.scrubbers).map(EngineThread::tid).collect();
        for s in t.scrubbers.drain(..) {
            s.join();
        }
        let handlers = std::mem::take(&mut t.handlers);
        ring_doorbells(&self.shared, handlers.len());
        for h in handlers {
            h.join();
        }
        sys::thread::wait_gone(&tids);
        true
    }

    /// Starts the threads [`Engine::pause`] stopped, from the calling thread, once no caller
    /// holds them stopped any more. Where a thread cannot be started, the engine fails open
    /// (the kernel serves every fault from then on).
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked, right after its call; takes the
    /// threads' lock.
    pub fn resume(&self) {
        let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        t.holders = t.holders.saturating_sub(1);
        if t.holders > 0 {
            return;
        }
        if self.shared.failed.load(Acquire) {
            // Failed before or during the pause: a handler reading what was queued left at the
            // pause; the program's copy goes now (every range is unregistered already).
            drop(t);
            self.shared.close_uffd();
            return;
        }
        // The program closed the engine's descriptor meanwhile: a thread started now would take
        // whatever file has the number in the program's table. The kernel serves from here (the
        // last copies went with the stopped threads).
        if self.shared.uffd_identity.is_some_and(|id| !id.present()) {
            drop(t);
            self.fail_open_paused();
            return;
        }
        self.shared.stopping.store(false, Release);
        // The doorbells the pause rang hold zero pages: missing again for the next stop (a
        // registered range: the handler just started reads the REMOVE event).
        let rearm = || {
            let bells = self.shared.handlers() * PAGE_SIZE;
            // SAFETY: the engine's own doorbell pages, read by nobody but a stop.
            let _ = unsafe { mman::madvise(self.shared.doorbell, bells, libc::MADV_DONTNEED) };
        };
        let started = Engine::spawn_handlers(&self.shared, &mut t, &rearm);
        if started
            .and_then(|()| Engine::spawn_scrubbers(&self.shared, &mut t))
            .is_err()
        {
            drop(t);
            self.stop_for_good();
        }
    }

    /// A program thread's CPUs changed (`sched_setaffinity`, `pthread_setaffinity_np`): every
    /// engine thread is given the process's (its main thread's) now, so that none runs where
    /// the program may not; each takes them again at its next look, within its NUMA node's.
    ///
    /// # Context
    /// A program thread, inside a hook, after the call; takes the threads' lock; does not sleep.
    pub fn follow_cpus(&self) {
        let Some(cpus) = sys::sched::process_cpus() else { return };
        let t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        for th in t.handlers.iter().chain(&t.scrubbers) {
            sys::sched::set_cpus(th.tid() as usize, &cpus);
        }
        sys::sched::cpus_moved();
    }

    /// A program thread's way into the engine: once a failed handler took the descriptor,
    /// the program's copy is closed here (see `Shared::tidy`). One atomic load otherwise.
    ///
    /// # Context
    /// A program thread, inside a hook; never waits.
    pub fn tidy(&self) {
        self.shared.tidy();
    }

    /// Hands every fault to the kernel for the rest of the process's life, the threads stopped:
    /// before a call whose consequences the engine cannot follow (a seccomp filter, which may
    /// refuse the calls an engine thread makes).
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked; as [`Engine::pause`].
    pub fn stop_for_good(&self) {
        self.pause();
        if !self.shared.failed.load(Acquire) {
            Stats::add(&self.shared.stats.steps_aside, 1);
        }
        self.fail_open_paused();
    }

    /// The kernel refused the program a call with ENOMEM (an mmap, a split, a malloc). Where the
    /// process is at `vm.max_map_count` (or out of address space), the engine hands every fault
    /// to the kernel for good, as [`Engine::stop_for_good`], and unmaps what it made for itself:
    /// the pool rings and the doorbells (the threads' stacks went with the threads; the
    /// unregistered ranges merge back with their neighbours). Returns whether it gave anything
    /// back now, so that the caller repeats the refused call once. The program's memory (the
    /// regions, the arena) and the engine's own small allocations stay.
    ///
    /// # Context
    /// A program thread, inside a hook, signals blocked, right after the refused call; as
    /// [`Engine::pause`] the first time, one probe mapping otherwise.
    pub fn give_back(&self) -> bool {
        // Given back before this caller's call was refused: the refusal is the program's own.
        if self.shared.given_back.load(Acquire) {
            return false;
        }
        let _one = self.giving_back.lock().unwrap_or_else(|e| e.into_inner());
        if self.shared.given_back.load(Acquire) {
            // Given back since the refusal (another thread, refused at the same moment, held
            // the lock): the call is worth repeating.
            return true;
        }
        if !sys::mman::near_map_limit() {
            return false;
        }
        self.stop_for_good();
        // Set first: from here nothing names the rings or the doorbells (`own_mappings`).
        self.shared.given_back.store(true, Release);
        for p in &self.shared.pools {
            p.retire();
        }
        let bells = self.shared.handlers() * PAGE_SIZE;
        // SAFETY: the doorbells are the engine's own pages; every thread is stopped and the
        // descriptor closed, so nobody rings them again (`given_back` keeps the drop away).
        let _ = unsafe { mman::unmap(self.shared.doorbell, bells) };
        true
    }

    /// The process is exiting (`exit`, or a return from `main`): the scrub threads leave at
    /// their next look and fill nothing more; nothing waits for them. The handlers serve on,
    /// so that a later destructor's faults are answered, until `exit_group` ends every thread.
    /// Whichever thread is last out tears the address space down at the program's own
    /// priority (no engine thread is ever SCHED_IDLE), and nothing is unmapped or closed here
    /// that the kernel's teardown would not do anyway (DESIGN.md, "Exit"). Every range is
    /// unregistered, as the last close would: from here on the kernel serves the faults.
    ///
    /// # Context
    /// The exiting program thread (a library destructor), signals blocked; takes the
    /// descriptor's and the range table's read locks, and the unregister ioctls sleep on the
    /// mmap lock; waits for no engine thread.
    pub fn stop_at_exit(&self) {
        self.shared.exiting.store(true, Release);
        self.shared.machine.release();
        self.shared.kick_scrubs();
        // A process sharing the memory (clone(CLONE_VM) without CLONE_THREAD) may outlive
        // this one, holding a copy of the descriptor: the ranges are handed back now, so that
        // its faults never wait for handlers that die with this process.
        let held = self.shared.uffd_here();
        let uffd = held.as_deref().and_then(Option::as_ref);
        if let Some(u) = uffd.as_ref() {
            self.shared.unregister_all(u);
        }
    }

    /// With no thread running: fails open (the descriptor closed, the pools emptied).
    fn fail_open_paused(&self) {
        self.shared.failed.store(true, Release);
        self.shared.close_uffd();
        for p in &self.shared.pools {
            p.release_all();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Release);
        self.shared.kick_scrubs();
        let t = self.threads.get_mut().unwrap_or_else(|e| e.into_inner());
        // The scrubs first, as in a pause: a MADV_DONTNEED of theirs on a pool ring (registered,
        // see pool/mod.rs) waits for its REMOVE event to be read, which the handlers still do.
        for s in t.scrubbers.drain(..) {
            s.join();
        }
        let handlers = std::mem::take(&mut t.handlers);
        ring_doorbells(&self.shared, handlers.len());
        for h in handlers {
            h.join();
        }
        // Every range unregistered, and the program's copy closed: the engine threads' copies
        // went with them.
        self.shared.close_uffd();
        // Regions may outlive the engine and keep `Shared` alive: free the pools' pages now.
        for p in &self.shared.pools {
            p.release_all();
        }
        if !self.shared.given_back.load(Acquire) {
            let bells = self.shared.handlers() * PAGE_SIZE;
            // SAFETY: the doorbells are the engine's own pages; every thread is joined.
            let _ = unsafe { mman::unmap(self.shared.doorbell, bells) };
        }
    }
}
