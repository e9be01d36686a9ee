//! What the shim shares with its front (front/front.c, the file in LD_PRELOAD): the thread's
//! flags, which live in the front's static TLS, and the front's lookup of the next definition
//! of a symbol. Set once by `zerofault_shim_init` (init.rs), read by every hook.

use libc::{c_char, c_void};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// A thread's flags (C `struct zf_flags` in front/front.c).
#[repr(C)]
#[derive(Default)]
pub struct Flags {
    /// Inside a hook (or zerofault_shim_init): nested calls pass straight through.
    pub in_hook: Cell<i32>,
    /// Inside [`crate::next::resolve`].
    pub resolving: Cell<i32>,
}

/// What the front (front/front.c) hands the shim when it has loaded it (C `struct
/// zf_front_api`).
#[repr(C)]
pub struct FrontApi {
    version: u32,
    size: u32,
    flags: extern "C" fn() -> *mut Flags,
    next: extern "C" fn(*const c_char) -> *mut c_void,
    lock_future: i32,
}

const FRONT_VERSION: u32 = 1;

/// The front's `flags` (an `extern "C" fn() -> *mut Flags`), or 0 when the shim was preloaded
/// itself.
static FRONT_FLAGS: AtomicUsize = AtomicUsize::new(0);
/// The front's `next`, likewise.
static FRONT_NEXT: AtomicUsize = AtomicUsize::new(0);

impl FrontApi {
    /// Takes the front's `flags` and `next` if this is the front the shim was built with;
    /// `false` (nothing taken) otherwise.
    pub fn accept(&self) -> bool {
        if self.version != FRONT_VERSION || (self.size as usize) < std::mem::size_of::<FrontApi>() {
            return false;
        }
        FRONT_NEXT.store(self.next as usize, Release);
        FRONT_FLAGS.store(self.flags as usize, Release);
        true
    }

    /// Whether the program called `mlockall(MCL_FUTURE)` before the front loaded the shim.
    pub fn lock_future(&self) -> bool {
        self.lock_future != 0
    }
}

thread_local! {
    /// The flags when there is no front (this library preloaded by itself, uninitialised: its
    /// hooks pass every call through): then its TLS is static, set up by the loader at start,
    /// and touching it allocates nothing.
    static OWN_FLAGS: Flags = const { Flags { in_hook: Cell::new(0), resolving: Cell::new(0) } };
}

/// The calling thread's flags. Under the front they are the front's: this library is
/// dlopen()ed there, so its own thread-locals are dynamic TLS, which glibc allocates, on a
/// thread's first touch, with the process's malloc (possibly from inside that malloc's own
/// mmap, under its lock). No hook touches a thread-local of this library then.
pub fn flags() -> &'static Flags {
    let f = FRONT_FLAGS.load(Acquire);
    if f != 0 {
        // SAFETY: the front's `flags`, set once by zerofault_shim_init: it returns the calling
        // thread's flags, in the front's static TLS, live as long as the thread.
        let f: extern "C" fn() -> *mut Flags = unsafe { std::mem::transmute(f) };
        // SAFETY: as above; used by this thread only (the reference does not leave it).
        return unsafe { &*f() };
    }
    // SAFETY: this thread's own flags, live as long as the thread; the reference does not
    // leave it.
    OWN_FLAGS.with(|f| unsafe { &*(f as *const Flags) })
}

/// The front's lookup of the next definition of `name`, when there is a front.
pub fn front_next(name: &std::ffi::CStr) -> Option<*mut c_void> {
    let f = FRONT_NEXT.load(Acquire);
    // SAFETY: the front's `next`, set once by zerofault_shim_init; takes a C string.
    (f != 0)
        .then(|| unsafe { std::mem::transmute::<usize, extern "C" fn(*const c_char) -> *mut c_void>(f)(name.as_ptr()) })
}
