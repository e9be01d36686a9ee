//! The hook scope: the one way from a hook into the engine.
//!
//! A [`Hook`] marks the thread as inside the shim (nested calls, from a signal handler or from
//! the engine's own work, pass straight through), and hands out the engine. While it holds
//! the engine it is quiet: `errno` is put back as it was when the scope ends, and every signal
//! is blocked, so that a signal handler that maps memory or touches served memory cannot find
//! the engine's locks held by the very thread it interrupted (lib.rs, rule 2). A scope that
//! never reaches a running engine costs no system call.

use crate::front::{flags, Flags};
use crate::{start, state};
use engine::Engine;
use std::cell::Cell;

/// Marks the thread as inside the shim until dropped.
struct Guard(&'static Flags);

/// `None` if the thread already is inside the shim.
fn guard() -> Option<Guard> {
    let f = flags();
    if f.in_hook.get() != 0 {
        None
    } else {
        f.in_hook.set(1);
        Some(Guard(f))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.in_hook.set(0);
    }
}

/// While the engine works on a program thread from a hook: `errno` is put back as it was,
/// and every signal is blocked, so that a signal handler that maps memory cannot find the
/// engine's locks held by the very thread it interrupted.
struct Quiet {
    errno: i32,
    _signals: engine::os::thread::Blocked,
}

impl Quiet {
    fn new() -> Quiet {
        Quiet {
            errno: errno(),
            _signals: engine::os::thread::Blocked::all(),
        }
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        // The signal mask is put back right after, by the field's own drop.
        set_errno(self.errno);
    }
}

pub fn errno() -> i32 {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: i32) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// A hook's scope: the re-entry guard, and once it hands out the engine (or is asked to,
/// [`Hook::quiet`]), `errno` kept and every signal blocked until it ends. The engine it hands
/// out lives no longer than the scope.
///
/// # Context
/// Any program thread, from a hook or a C API call. On an engine thread it hands out no
/// engine (`state::running`), so an engine thread never reaches the engine through a hook.
pub struct Hook {
    // Dropped first, as the fields are declared: errno and the signal mask come back while
    // the thread is still marked inside the shim.
    quiet: Cell<Option<Quiet>>,
    /// `None` for a scope entered inside another ([`Hook::enter_or_nest`]): the outer one
    /// holds the guard.
    _guard: Option<Guard>,
}

impl Hook {
    /// The scope of a hook; `None` if the thread already is inside the shim (the call passes
    /// straight through).
    pub fn enter() -> Option<Hook> {
        guard().map(|g| Hook {
            quiet: Cell::new(None),
            _guard: Some(g),
        })
    }

    /// A scope even if the thread already is inside the shim (then the outer scope keeps the
    /// guard): for the C API's questions, which answer inside a hook too, and for `mlockall`,
    /// which unlocks the arena either way.
    pub fn enter_or_nest() -> Hook {
        Hook {
            quiet: Cell::new(None),
            _guard: guard(),
        }
    }

    /// Whether this scope holds the guard (it is not nested in another).
    pub fn outer(&self) -> bool {
        self._guard.is_some()
    }

    /// From now until the scope ends: `errno` kept, every signal blocked. Once is enough;
    /// the engine's accessors below do it themselves.
    pub fn quiet(&self) {
        let q = self.quiet.take().unwrap_or_else(Quiet::new);
        self.quiet.set(Some(q));
    }

    /// The engine, if it runs in this process and this thread may use it; never starts it.
    /// The scope is quiet from here when it does.
    pub fn running(&self) -> Option<&Engine> {
        let e = state::running()?;
        self.quiet();
        Some(e)
    }

    /// The engine, started now if this is the first large request (see [`start::engine`]).
    /// The scope is quiet from here, the start included.
    pub fn engine(&self) -> Option<&Engine> {
        // Off for good (refused, switched off): no start to quieten, no system call.
        if state::is_off() {
            return None;
        }
        self.quiet();
        start::engine()
    }

    /// The engine for a large request of `len` bytes (see [`start::engine_for`]). The scope is
    /// quiet from here, a start included.
    pub fn engine_for(&self, len: usize) -> Option<&Engine> {
        if state::is_off() {
            return None;
        }
        self.quiet();
        start::engine_for(len)
    }

    /// From now on no engine starts in this process or its fork children: this process's
    /// engine, if it runs, for the caller to stop (see [`state::switch_off`]). The scope is
    /// quiet from here.
    pub fn switch_off(&self) -> Option<&Engine> {
        self.quiet();
        state::switch_off()
    }

    /// The program's own system call `call`, made inside the scope as without the shim: with
    /// the program's signal mask, and `errno` as the call leaves it. A quiet scope is quiet
    /// again afterwards, keeping that `errno`.
    pub fn outside<R>(&self, call: impl FnOnce() -> R) -> R {
        // Dropped here: errno and the signal mask are the program's for the call.
        let was = self.quiet.take();
        let was_quiet = was.is_some();
        drop(was);
        let r = call();
        if was_quiet {
            self.quiet();
        }
        r
    }
}
