//! The malloc family: large blocks from the arena, everything else from the next allocator.
//!
//! # Context
//! Every hook here runs on any program thread; what reaches the engine does so inside the
//! hook scope ([`Hook`]), and a call made inside another hook (a signal handler's, or the
//! shim's own) passes straight through to the next allocator.

use crate::arena::ADVISED;
use crate::glibc;
use crate::hook::{set_errno, Hook};
use crate::next;
use crate::state::{self, abort_invalid, arena, threshold};
use engine::os::mman::PAGE_SIZE;
use libc::{c_int, c_void, size_t};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

/// A realloc that shrinks a block by at least this many pages gives them back.
const SHRINK_MIN_PAGES: u64 = 256;

/// glibc's mmap threshold as it would stand natively, 0 until raised: requests below it are
/// left to the next allocator, whose heap serves them with their pages in place (see
/// [`note_freed`]).
static HEAP_BELOW: AtomicUsize = AtomicUsize::new(0);

/// Set where glibc's threshold does not move: the program fixed it, or one of the values that
/// stop glibc from moving it, through the environment (`MALLOC_MMAP_THRESHOLD_` and the three
/// others, or their `GLIBC_TUNABLES`). glibc then maps every block above the threshold, and the
/// arena keeps serving them. Read at the shim's start (`glibc::fixed_threshold`); a `mallopt`
/// call is not seen.
pub(crate) static FIXED_THRESHOLD: AtomicBool = AtomicBool::new(false);

/// The program freed a large block of `usable` bytes. Natively glibc mapped it, and its free
/// raises glibc's mmap threshold to the block's size (its chunk: the request and its header,
/// rounded up to pages) when that is above the threshold and at most 32 MiB: from then on
/// requests of that size come from glibc's heap, where a freed block is reused with its pages
/// in place (no fault, no zeroing; glibc's trim threshold follows at twice as much). So here:
/// such requests go to the next allocator from now on, which does natively what it would do
/// (glibc's own threshold rises at its first free of one). A realloc that moves a block does
/// not raise it (glibc frees the old chunk without the check), nor does a free of a block above
/// 32 MiB. The arena keeps what glibc would map: blocks above the threshold, where a fresh
/// mapping and the engine's recycling beat the kernel.
///
/// # Context
/// A program thread, in `free`, after the arena took the block back; one atomic.
fn note_freed(usable: u64) {
    if FIXED_THRESHOLD.load(Relaxed) {
        return;
    }
    if let Some(t) = glibc::threshold_after_free(usable as usize) {
        HEAP_BELOW.fetch_max(t, Relaxed);
    }
}

/// A zero block of `size` bytes aligned to `align` from the arena, if the request is large and
/// the engine (which makes the arena) is up.
///
/// # Context
/// Any program thread, inside the hook scope (quiet from the engine's start on); takes the
/// arena's lock and, for the header page, the engine's.
fn large(size: usize, align: usize) -> Option<*mut c_void> {
    if glibc::request(size) < HEAP_BELOW.load(Relaxed) {
        return None;
    }
    arena_block(size, align)
}

/// [`large`] whatever glibc's threshold: for a block that grows out of an arena block, which
/// natively stays mapped (glibc moves a mapped chunk with mremap, whatever its threshold).
///
/// # Context
/// As [`large`].
fn arena_block(size: usize, align: usize) -> Option<*mut c_void> {
    if size < threshold() || !align.is_power_of_two() || align > (1 << 30) {
        return None;
    }
    prime_next();
    let h = Hook::enter()?;
    h.engine_for(size)?;
    // A new block's header page, installed alone before the arena writes the header: its
    // fault would bring a window of the block's pages with it, which the program did not
    // touch.
    let header_page = |page: usize| {
        if let Some(e) = h.running() {
            e.fill_page(page);
        }
    };
    arena()?
        .alloc(size, align, state::lock_future(), &header_page)
        .map(|p| p as *mut c_void)
}

/// Set once the next allocator has been called (see [`prime_next`]).
static NEXT_PRIMED: AtomicBool = AtomicBool::new(false);

/// Calls the next allocator once, at the first large request: natively the program's first
/// malloc, of any size, sets the C library's heap up (glibc's first call grows its heap with
/// brk, a new mapping, and puts its thread cache there). A program whose first requests are
/// large, all served by the arena, would otherwise get its heap at its first small request,
/// which may come when no new mapping can be made: at `vm.max_map_count`, malloc(1000) and
/// fopen failed under the shim where they work natively.
///
/// # Context
/// Any program thread, in a malloc-family hook (the program called the allocator: none of its
/// locks is held), before the hook scope; once per process.
fn prime_next() {
    if !NEXT_PRIMED.load(Relaxed) && !NEXT_PRIMED.swap(true, Relaxed) {
        // SAFETY: a block of the next allocator, freed by it at once.
        unsafe { next::free(next::malloc(1)) };
    }
}

/// malloc(3): a large request (at least the `preload_threshold` knob) gets an arena block the engine serves; the rest goes to the next allocator.
///
/// # Safety
/// As C's: none beyond the C runtime's (the block is freed with this library's `free`).
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    if next::resolving() {
        return next::boot_alloc(size);
    }
    if let Some(p) = large(size, 16) {
        return p;
    }
    // SAFETY: the next allocator's malloc, with the caller's argument.
    unsafe { next::malloc(size) }
}

/// calloc(3): as `malloc`; an arena block is zero already (fresh memory, or discarded when freed).
///
/// # Safety
/// As C's: none beyond the C runtime's.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    if next::resolving() {
        return n.checked_mul(size).map_or(std::ptr::null_mut(), next::boot_alloc);
    }
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // Arena blocks are proved zero (see arena.rs): no memset.
    if let Some(p) = large(total, 16) {
        return p;
    }
    // SAFETY: the next allocator's calloc, with the caller's arguments.
    unsafe { next::calloc(n, size) }
}

/// free(3): an arena block goes back to the arena (its pages discarded); anything else to the next allocator.
///
/// # Safety
/// `p` is null, or a block this process's allocator returned and nobody freed (a bad pointer into the arena aborts with one line, as glibc does).
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || next::in_boot(p) {
        return;
    }
    if let Some(a) = arena().filter(|a| a.contains(p as usize)) {
        let Ok(h) = a.block(p as usize) else {
            abort_invalid("free", p)
        };
        if a.free(p as usize, &recycle).is_err() {
            abort_invalid("free", p);
        }
        note_freed(h.usable);
        return;
    }
    // SAFETY: p came from the next allocator (it is neither ours nor the boot buffer's).
    unsafe { next::free(p) }
}

/// `free` of an arena block without [`note_freed`]: realloc's end of an old block.
///
/// # Safety
/// `p` is a live arena block, no longer used.
unsafe fn free_moved(a: &crate::arena::Arena, p: *mut c_void) {
    if a.free(p as usize, &recycle).is_err() {
        abort_invalid("realloc", p);
    }
}

/// Offers a freed block's pages to the engine's pool (`ZEROFAULT_RECYCLE`): `true` when they
/// were recycled and the block reads zero (the recycle's own discard succeeded). Signals
/// blocked and errno kept meanwhile (the hook scope): the recycle takes the engine's locks.
///
/// # Context
/// A program thread, from `free` (the arena calls it with its lock released), inside the hook
/// scope, quiet.
fn recycle(addr: usize, len: usize) -> bool {
    let Some(h) = Hook::enter() else { return false };
    h.quiet(); // the shim's lock of foreign spans, below
    if crate::rights::renew_foreign(&h, addr, len) {
        return true;
    }
    if ADVISED.load(Relaxed) {
        if let Some(e) = h.running() {
            e.forget_huge_advice(addr, len);
        }
    }
    let Some(e) = h.running().filter(|e| e.options().recycle && e.serves_any(addr, len)) else {
        return false;
    };
    // SAFETY: a block the program freed: its pages are given up (the arena makes them
    // PROT_NONE right after).
    unsafe { e.recycle(addr as *mut u8, len) }.is_ok()
}

/// The pages a shrinking block gives back: mapped afresh where the program had registered
/// them with a userfaultfd of its own (else discarded by the arena).
///
/// # Context
/// A program thread, from `realloc`, inside the hook scope, quiet.
fn renew_tail(addr: usize, len: usize) -> bool {
    let Some(h) = Hook::enter() else { return false };
    h.quiet(); // the shim's lock of foreign spans
    crate::rights::renew_foreign(&h, addr, len)
}

/// The part a block grew by, filled now from this thread: the program writes it next (a
/// vector's next elements, a string's next bytes), and a fault per step of growth cost more
/// than the kernel's faults (`Engine::fill_grown`). Signals blocked and errno kept meanwhile.
///
/// # Context
/// A program thread, from `realloc`, inside the hook scope, quiet.
fn fill_grown(tail: usize, len: usize) {
    if let Some(e) = Hook::enter().as_ref().and_then(Hook::running) {
        e.fill_grown(tail, len);
    }
}

/// Moves `len` bytes (whole pages) from arena block `p` to fresh arena block `q`: the pages
/// themselves where the engine can move them (no byte copied), the rest copied.
///
/// # Safety
/// Both are live arena blocks of at least `len` bytes; `q` was never written.
///
/// # Context
/// A program thread, from `realloc`, inside the hook scope, quiet while the engine moves the
/// pages; inside another hook everything is copied.
unsafe fn move_block(q: usize, p: usize, len: usize) {
    let moved = match Hook::enter().as_ref().and_then(Hook::running) {
        // SAFETY: both ranges are ours and served by the engine; q has no page yet.
        Some(e) => unsafe { e.move_pages(q, p, engine::page::page_start(len)) },
        None => 0,
    };
    // SAFETY: both blocks hold `len` bytes; the pages moved are at q now, the rest still at p.
    unsafe { std::ptr::copy_nonoverlapping((p + moved) as *const u8, (q + moved) as *mut u8, len - moved) };
}

/// realloc(3): arena blocks shrink in place, and grow in place where the arena has room, else
/// move (pages moved, not copied, where the engine can); a block of the next allocator that
/// grows past `preload_threshold` moves into the arena, once.
///
/// # Safety
/// As `free` for `p`; the old block is not used after a successful call.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    if p.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n).
        return unsafe { malloc(size) };
    }
    if next::in_boot(p) {
        // SAFETY: a real block, then the copy of what fits; boot blocks are never freed.
        let q = unsafe { malloc(size) };
        if !q.is_null() {
            // SAFETY: both ranges are valid for the copied length.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, size.min(next::boot_tail(p))) };
        }
        return q;
    }
    if let Some(a) = arena().filter(|a| a.contains(p as usize)) {
        let at = p as usize;
        let Ok(h) = a.block(at) else {
            abort_invalid("realloc", p)
        };
        if size == 0 {
            // glibc frees and returns NULL.
            // SAFETY: p is a live arena block.
            unsafe { free(p) };
            return std::ptr::null_mut();
        }
        if size as u64 <= h.usable {
            a.shrink(at, h, size, SHRINK_MIN_PAGES, &renew_tail);
            return p;
        }
        if let Some((_, tail, grown)) = a.grow_in_place(at, h, size, state::lock_future()) {
            fill_grown(tail, grown);
            return p;
        }
        // A new block, the pages moved into it, the old one freed; with the engine off, or no
        // room in the arena, a copy (the old block stays valid on failure, as realloc requires).
        // SAFETY: malloc with the caller's size.
        let q = arena_block(size, 16).unwrap_or_else(|| unsafe { malloc(size) });
        if q.is_null() {
            return q;
        }
        let len = h.usable as usize;
        // A sealed block keeps its pages (its free leaves it whole, as natively): copied.
        if a.contains(q as usize) && !crate::arena::sealed(at, len) {
            // SAFETY: p and q are live arena blocks, q fresh and larger than p's usable bytes.
            unsafe { move_block(q as usize, at, len) };
        } else {
            // SAFETY: q holds `size` > len bytes, p holds len.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, len) };
        }
        // SAFETY: p is a live arena block, no longer used.
        unsafe { free_moved(a, p) };
        return q;
    }
    if size >= threshold() {
        // A block of the next allocator grows large: into the arena, once.
        // SAFETY: p came from the next allocator.
        let old = unsafe { next::malloc_usable_size(p) };
        if old > 0 {
            if let Some(q) = large(size, 16) {
                // SAFETY: q has `size` bytes, p has `old` usable bytes.
                unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size)) };
                // SAFETY: p came from the next allocator and is no longer used.
                unsafe { next::free(p) };
                return q;
            }
        }
    }
    // SAFETY: p came from the next allocator.
    unsafe { next::realloc(p, size) }
}

/// reallocarray(3): glibc's calls its own realloc, which would not know an arena block.
///
/// # Safety
/// As `realloc`.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // SAFETY: realloc with the caller's pointer.
    unsafe { realloc(p, total) }
}

/// posix_memalign(3): as `malloc`, aligned.
///
/// # Safety
/// `out` is valid for the write of one pointer.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: size_t, size: size_t) -> c_int {
    if align.is_power_of_two() && align % std::mem::size_of::<usize>() == 0 {
        if let Some(p) = large(size, align) {
            // SAFETY: the caller passes a valid out-pointer.
            unsafe { *out = p };
            return 0;
        }
    }
    // SAFETY: the next allocator's posix_memalign, with the caller's arguments.
    unsafe { next::posix_memalign(out, align, size) }
}

/// aligned_alloc(3): as `malloc`, aligned.
///
/// # Safety
/// As C's: none beyond the C runtime's.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if let Some(p) = large(size, align) {
        return p;
    }
    // SAFETY: the next allocator's aligned_alloc, with the caller's arguments.
    unsafe { next::aligned_alloc(align, size) }
}

/// memalign(3): as `malloc`, aligned.
///
/// # Safety
/// As C's: none beyond the C runtime's.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    if let Some(p) = large(size, align) {
        return p;
    }
    // SAFETY: the next allocator's memalign, with the caller's arguments.
    unsafe { next::memalign(align, size) }
}

/// valloc(3): as `malloc`, page aligned.
///
/// # Safety
/// As C's: none beyond the C runtime's.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    if let Some(p) = large(size, PAGE_SIZE) {
        return p;
    }
    // SAFETY: the next allocator's valloc.
    unsafe { next::valloc(size) }
}

/// pvalloc(3): as `malloc`, page aligned and rounded up to pages.
///
/// # Safety
/// As C's: none beyond the C runtime's.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    // A size that cannot be rounded to pages goes to the next allocator, which refuses it.
    if let Some(p) = size
        .checked_next_multiple_of(PAGE_SIZE)
        .and_then(|s| large(s, PAGE_SIZE))
    {
        return p;
    }
    // SAFETY: the next allocator's pvalloc.
    unsafe { next::pvalloc(size) }
}

/// malloc_usable_size(3): an arena block's usable bytes, or the next allocator's answer.
///
/// # Safety
/// `p` is null or a live block of this process's allocator.
///
/// # Context
/// Any program thread; what reaches the engine does so inside the hook scope.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() || next::in_boot(p) {
        return 0;
    }
    if let Some(a) = arena().filter(|a| a.contains(p as usize)) {
        return a.block(p as usize).map_or(0, |h| h.usable as size_t);
    }
    // SAFETY: p came from the next allocator.
    unsafe { next::malloc_usable_size(p) }
}
