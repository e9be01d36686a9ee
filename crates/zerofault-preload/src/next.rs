//! The next allocator: the malloc family of whatever comes after the shim in the search order
//! (glibc, or an allocator preloaded after it), found with `dlsym(RTLD_NEXT)` in the
//! constructor.
//!
//! dlsym may itself allocate; while it runs, this thread's allocations come from a static boot
//! buffer and are never freed.

use libc::{c_int, c_void, size_t};
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// One symbol of the next allocator: its name and, once resolved, its address.
pub struct Sym {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Sym {
    const fn new(name: &'static CStr) -> Sym {
        Sym {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    fn resolve(&self) {
        // Under the front, the next definition after the front (this library, dlopen()ed, is
        // last in the search order: its RTLD_NEXT would skip an allocator preloaded after us).
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; a null result is kept as 0.
        let f = crate::front::front_next(self.name)
            .unwrap_or_else(|| unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) });
        self.addr.store(f as usize, Release);
    }

    fn addr(&self) -> usize {
        let a = self.addr.load(Acquire);
        if a != 0 {
            return a;
        }
        resolve();
        self.addr.load(Acquire)
    }
}

macro_rules! symbols {
    ($($name:ident: fn($($arg:ident: $t:ty),*) -> $r:ty = $fallback:expr;)*) => {
        /// One [`Sym`] per function, named after it.
        mod syms {
            use super::*;
            $( #[allow(non_upper_case_globals)] pub static $name: Sym = Sym::new(
                // SAFETY: the literal ends with the NUL concat! adds, and has no other NUL.
                unsafe { CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes()) }
            ); )*
        }

        const ALL: &[&Sym] = &[$(&syms::$name),*];

        $(
            /// Calls the next allocator's function of this name, or returns the fallback when
            /// it has none.
            ///
            /// # Safety
            /// As the C function: pointers must come from the next allocator.
            #[allow(clippy::unused_unit)] // free's `-> ()`
            pub unsafe fn $name($($arg: $t),*) -> $r {
                let a = syms::$name.addr();
                if a == 0 {
                    return $fallback;
                }
                // SAFETY: the address dlsym returned for this symbol, whose C type is this.
                let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(a) };
                // SAFETY: the caller upholds the function's contract.
                unsafe { f($($arg),*) }
            }
        )*
    };
}

symbols! {
    malloc: fn(size: size_t) -> *mut c_void = std::ptr::null_mut();
    calloc: fn(n: size_t, size: size_t) -> *mut c_void = std::ptr::null_mut();
    realloc: fn(p: *mut c_void, size: size_t) -> *mut c_void = std::ptr::null_mut();
    free: fn(p: *mut c_void) -> () = ();
    memalign: fn(align: size_t, size: size_t) -> *mut c_void = std::ptr::null_mut();
    posix_memalign: fn(out: *mut *mut c_void, align: size_t, size: size_t) -> c_int = libc::ENOMEM;
    aligned_alloc: fn(align: size_t, size: size_t) -> *mut c_void = std::ptr::null_mut();
    valloc: fn(size: size_t) -> *mut c_void = std::ptr::null_mut();
    pvalloc: fn(size: size_t) -> *mut c_void = std::ptr::null_mut();
    malloc_usable_size: fn(p: *mut c_void) -> size_t = 0;
}

/// Resolves every symbol (once; later calls are cheap).
pub fn resolve() {
    if syms::malloc.addr.load(Acquire) != 0 {
        return;
    }
    let f = crate::front::flags();
    f.resolving.set(1);
    for s in ALL {
        s.resolve();
    }
    f.resolving.set(0);
}

/// Whether this thread is inside [`resolve`] (its allocations come from the boot buffer).
pub fn resolving() -> bool {
    crate::front::flags().resolving.get() != 0
}

const BOOT_LEN: usize = 1 << 16;
static BOOT: BootBuf = BootBuf(std::cell::UnsafeCell::new([0; BOOT_LEN]), AtomicUsize::new(0));
struct BootBuf(std::cell::UnsafeCell<[u8; BOOT_LEN]>, AtomicUsize);
// SAFETY: disjoint slices are handed out by an atomic bump offset.
unsafe impl Sync for BootBuf {}

/// `n` zero bytes from the boot buffer, or null when it is used up.
pub fn boot_alloc(n: usize) -> *mut c_void {
    let n = n.next_multiple_of(16);
    let at = BOOT.1.fetch_add(n, Relaxed);
    if at + n > BOOT_LEN {
        return std::ptr::null_mut();
    }
    // SAFETY: [at, at + n) is inside the buffer and handed out once; the buffer is zeroed.
    unsafe { (BOOT.0.get() as *mut u8).add(at) as *mut c_void }
}

pub fn in_boot(p: *mut c_void) -> bool {
    let base = BOOT.0.get() as usize;
    (base..base + BOOT_LEN).contains(&(p as usize))
}

/// Bytes of the boot buffer from `p` to its end (what a realloc out of it may copy).
pub fn boot_tail(p: *mut c_void) -> usize {
    BOOT.0.get() as usize + BOOT_LEN - p as usize
}
