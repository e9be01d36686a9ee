//! The engine's own allocator: [`EngineAlloc`], a [`GlobalAlloc`] over raw `mmap`.
//!
//! The LD_PRELOAD shim's rule is that nothing on a hook path or on an engine thread calls the
//! program's allocator: the program's malloc may be jemalloc holding its own lock while it calls
//! the `mmap` the shim hooks, and the program's threads may hold its locks while they wait on a
//! fault only the engine can serve. With `#[global_allocator] static A: EngineAlloc =
//! EngineAlloc;` in the shim, every Rust allocation inside libzerofault.so (range tables,
//! queues, strings, `Box`es, `Arc`s) comes from memory the engine mapped itself, through the
//! raw system calls of [`mman`] and [`raw`]: no libc allocation, no `errno` change, no signal
//! mask change, no lock the program could hold, no thread-local (the only per-thread fact it
//! reads is the thread pointer, [`thread_id`]).
//!
//! ## Shape
//! - **Small** requests (size and alignment at most [`MAX_SMALL`], 32 KiB) go to one of 22 size
//!   classes, two per doubling (16, 32, 48, 64, 96, 128, 192, ..., 24 KiB, 32 KiB). A class's
//!   objects are carved in order from chunks of [`CHUNK`] (256 KiB) bytes, each aligned to its
//!   size (carved from one reservation, "The chunk reservation" below, so that they are one
//!   mapping, not one each) with a header (magic, class) at its start; the first object sits past the header,
//!   at a multiple of the class's alignment (the largest power of two dividing its size), so no
//!   object is ever at a chunk-aligned address. Each class has a spin lock, a private free list
//!   and the bump range of its current chunk (under the lock), and a lock-free stack of objects
//!   returned by `dealloc` (pushed without the lock; the lock holder takes the whole stack when
//!   its private list runs dry). First use of a class takes one chunk (an `mprotect`);
//!   after that a small allocation is a lock and a pop, a small free one compare-and-swap.
//! - **Direct** mappings serve everything else: sizes above 32 KiB, alignments above 32 KiB (up
//!   to any power of two, via [`mman::map_aligned`]), and the fallbacks below. A direct mapping
//!   is `size` rounded up to pages, aligned to at least [`CHUNK`], and the pointer is its start.
//!   So `dealloc` tells the two apart by address alone: a chunk-aligned pointer is a direct
//!   mapping of `layout.size()` rounded to pages; any other is a slab object, whose class is in
//!   its chunk's header. `realloc` of a direct mapping shrinks by unmapping the tail, grows with
//!   `mremap` in place, or else moves its pages (`mremap(MREMAP_MAYMOVE | MREMAP_FIXED)`, no
//!   byte copied) onto a fresh chunk-aligned reservation.
//!
//! ## Re-entrancy
//! A program's signal handler may interrupt a thread inside the allocator and, through a hook,
//! allocate again on the same thread. A class lock records its holder's [`thread_id`]; a thread
//! that finds the lock held by itself does not spin (it would wait forever on itself): it is
//! served by a direct mapping instead. A thread that finds it held by another spins, then
//! yields, and after a bounded wait (two threads whose handlers each want the class the other
//! interrupted; a holder that was `longjmp`ed out of) also takes a direct mapping: the
//! allocator never deadlocks, it only spends a page. `dealloc` of a small object takes no lock
//! at all (one push on the class's lock-free stack), so it is safe anywhere. Each thread holds
//! at most one class lock per signal nesting level, and never across a system call other than
//! the mapping of a new chunk (only [`fork_prepare`] holds them all). [`AllocStats`] counts the
//! fallbacks.
//!
//! ## What goes back to the kernel, and when
//! - A direct mapping is unmapped by `dealloc` at once, and the tail of a shrunk one by
//!   `realloc`: big metadata returns its memory to the kernel when it is freed.
//! - Small objects go back to their class's free list and are reused by the next requests of
//!   their class; chunks are never unmapped, so the small-object footprint is the high-water
//!   mark of each class. A chunk's pages become resident as objects are first carved from them,
//!   not before (and never as transparent huge pages: chunks are `MADV_NOHUGEPAGE`).
//!
//! ## fork()
//! A fork taken while another thread holds a class lock would leave that lock held forever in
//! the child (every allocation of the class would then wait its bound and take a page).
//! [`fork_prepare`], [`fork_parent`] and [`fork_child`] take every class lock across the fork
//! and release it on both sides, like the shim's arena lock; the shim's `pthread_atfork`
//! handlers should call them.

use crate::sys::mman::{self, PAGE_SIZE};
use crate::sys::raw;
use crate::sys::thread::thread_id;
use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};

/// Bytes of one slab chunk, and the alignment of every chunk and every direct mapping.
pub(crate) const CHUNK: usize = 256 << 10;
/// The largest size (and alignment) a size class serves; above it, direct mappings.
pub(crate) const MAX_SMALL: usize = 32 << 10;

/// The size classes: two per doubling from 32 B (16 then `3·2^k` between powers of two).
const SIZES: [usize; 22] = [
    16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576,
    32768,
];
const CLASSES: usize = SIZES.len();

/// Bytes kept at the start of every chunk for its header (one cache line).
const HEADER: usize = 64;
/// The first word of a chunk header: "zfalloc!".
const MAGIC: usize = 0x7a66_616c_6c6f_6321;
/// Tries with `spin_loop` before yielding, and yields before falling back to a direct mapping,
/// when another thread holds a class lock.
const SPINS: u32 = 128;
const YIELDS: u32 = 1000;
/// Yields the fork handler waits for each class lock (a fork is rare and may wait longer).
const FORK_YIELDS: u32 = 20_000;

/// What sits at the start of every chunk.
#[repr(C)]
struct ChunkHeader {
    magic: usize,
    class: usize,
}

/// A class's state that only its lock holder touches.
struct Slab {
    /// Private free list: each free object's first word links to the next; 0 ends it.
    free: usize,
    /// The uncarved rest of the current chunk, `[next, end)`.
    next: usize,
    end: usize,
}

#[repr(align(64))]
struct Class {
    /// 0 when free, else the [`thread_id`] of the holder.
    owner: AtomicUsize,
    /// Objects freed and not yet taken by a holder: a lock-free stack (pushed by `dealloc`,
    /// taken whole by the holder, so no ABA).
    returned: AtomicUsize,
    slab: UnsafeCell<Slab>,
}

// SAFETY: `slab` is only reached by the thread that holds `owner` (see `Class::acquire`);
// the other fields are atomics.
unsafe impl Sync for Class {}

/// Why a class lock was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Busy {
    /// Held by the calling thread: a signal handler interrupted it inside the allocator.
    Mine,
    /// Held by another thread past the bounded wait.
    Timeout,
}

impl Class {
    const fn new() -> Class {
        Class {
            owner: AtomicUsize::new(0),
            returned: AtomicUsize::new(0),
            slab: UnsafeCell::new(Slab {
                free: 0,
                next: 0,
                end: 0,
            }),
        }
    }

    /// Takes the lock for `me`, waiting at most `SPINS` spins and `yields` yields for another
    /// holder; never waits on `me` itself.
    fn acquire(&self, me: usize, yields: u32) -> Result<(), Busy> {
        let mut tries = 0u32;
        loop {
            let cur = self.owner.load(Relaxed);
            if cur == 0 {
                if self.owner.compare_exchange(0, me, Acquire, Relaxed).is_ok() {
                    return Ok(());
                }
            } else if cur == me {
                return Err(Busy::Mine);
            }
            tries += 1;
            if tries > SPINS + yields {
                return Err(Busy::Timeout);
            }
            if tries > SPINS {
                sched_yield();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn release(&self) {
        self.owner.store(0, Release);
    }

    /// Pushes the free object at `p` on the returned stack. Lock-free and re-entrant: an
    /// interrupted push whose handler pushes too just retries.
    fn push_returned(&self, p: usize) {
        let mut head = self.returned.load(Relaxed);
        loop {
            // SAFETY: `p` is a free object of this class, at least 16 bytes, 16-aligned, and
            // ours alone until the push below publishes it.
            unsafe { *(p as *mut usize) = head };
            match self.returned.compare_exchange_weak(head, p, Release, Relaxed) {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }
}

static STATE: [Class; CLASSES] = [const { Class::new() }; CLASSES];

static CHUNKS: AtomicUsize = AtomicUsize::new(0);
static DIRECT_MAPS: AtomicUsize = AtomicUsize::new(0);
static DIRECT_BYTES: AtomicUsize = AtomicUsize::new(0);
static REENTERED: AtomicUsize = AtomicUsize::new(0);
static CONTENDED: AtomicUsize = AtomicUsize::new(0);
/// The class locks [`fork_prepare`] took, one bit each.
static FORK_HELD: AtomicU32 = AtomicU32::new(0);

/// Counters of the allocator, for the whole process.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AllocStats {
    /// Slab chunks mapped (never unmapped), [`CHUNK`] bytes each.
    pub chunks: usize,
    /// Direct mappings alive now.
    pub direct_maps: usize,
    /// Their bytes.
    pub direct_bytes: usize,
    /// Small requests served by a direct mapping because the calling thread already held the
    /// class lock (a signal handler allocated inside the allocator).
    pub reentered: usize,
    /// Small requests served by a direct mapping because another thread held the class lock
    /// past the bounded wait.
    pub contended: usize,
}

/// The allocator's counters now.
#[cfg(test)]
pub(crate) fn stats() -> AllocStats {
    AllocStats {
        chunks: CHUNKS.load(Relaxed),
        direct_maps: DIRECT_MAPS.load(Relaxed),
        direct_bytes: DIRECT_BYTES.load(Relaxed),
        reentered: REENTERED.load(Relaxed),
        contended: CONTENDED.load(Relaxed),
    }
}

/// The engine's allocator: see the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineAlloc;

fn sched_yield() {
    // SAFETY: sched_yield has no arguments and no effect on memory.
    let _ = unsafe { raw::call(libc::SYS_sched_yield, [0; 6]) };
}

/// The largest power of two dividing `size`: the alignment of every object of a class.
const fn natural_align(size: usize) -> usize {
    size & size.wrapping_neg()
}

/// The smallest class whose size holds `size` and whose objects are aligned to `align`, or
/// None for a direct mapping.
fn class_of(size: usize, align: usize) -> Option<usize> {
    if size > MAX_SMALL || align > MAX_SMALL {
        return None;
    }
    let mut c = if size <= 16 {
        0
    } else {
        let p = size.next_power_of_two();
        let k = p.trailing_zeros() as usize; // 5..=15
        if k >= 6 && size <= p / 4 * 3 {
            2 * k - 10
        } else {
            2 * k - 9
        }
    };
    while c < CLASSES {
        if natural_align(SIZES[c]) >= align {
            return Some(c);
        }
        c += 1;
    }
    None
}

/// Offset of a class's first object in its chunk: past the header, at the class's alignment.
const fn first_offset(class: usize) -> usize {
    HEADER.next_multiple_of(natural_align(SIZES[class]))
}

/// Bytes of the direct mapping of a block of `size` bytes.
fn direct_len(size: usize) -> Option<usize> {
    size.max(1).checked_next_multiple_of(PAGE_SIZE)
}

/// A new chunk for `class`, its header written; None if the kernel refused. Carved from the
/// reservation first (no new mapping), else mapped alone, else one of the spares.
fn new_chunk(class: usize) -> Option<usize> {
    let chunk = match reserved_chunk() {
        Some(c) => c,
        None => match mman::map_aligned(CHUNK, CHUNK, libc::PROT_READ | libc::PROT_WRITE, false) {
            Ok(c) => {
                // Engine metadata is small: never a 2 MiB page for it, even where
                // neighbouring chunks would cover one. Advice only; a refusal changes nothing.
                // SAFETY: the chunk is our fresh mapping; huge-page advice changes no content.
                let _ = unsafe { mman::madvise(c, CHUNK, mman::MADV_NOHUGEPAGE) };
                c
            }
            Err(_) => spare_chunk()?,
        },
    };
    // SAFETY: the chunk is our fresh read-write mapping, aligned, larger than the header.
    unsafe { (chunk as *mut ChunkHeader).write(ChunkHeader { magic: MAGIC, class }) };
    CHUNKS.fetch_add(1, Relaxed);
    Some(chunk)
}

// ---------------------------------------------------------------------------------------------
// The chunk reservation
//
// Each chunk mapped alone would be a VMA of its own, taken from the program's
// `vm.max_map_count`, and at the limit Rust's allocation-failure handler would abort the
// process. So chunks are carved in order from one reservation made once (`PROT_NONE`,
// `MAP_NORESERVE`: address space only), each made read-write by `mprotect` as it is taken: the
// kernel merges it into the read-write run before it, so the reservation is two VMAs however
// many chunks it holds. A few chunks are made read-write with the reservation and kept as
// spares, for when both a carve and a mapping of its own fail (the commit limit, the map-count
// limit once the reservation is used up). docs/DESIGN.md, "The engine's allocator".

/// Bytes of the chunk reservation (at most: under a finite RLIMIT_AS / RLIMIT_DATA a
/// sixty-fourth of the limit, none under [`RESERVE_MIN`]).
const RESERVE: usize = 512 << 20;
/// The smallest reservation worth making.
const RESERVE_MIN: usize = 16 * CHUNK;
/// Chunks made read-write with the reservation and kept for when no other chunk can be had.
const SPARES: usize = 4;
/// The reservation's base: 0 before it is made, [`RESERVE_BUSY`] while a thread makes it,
/// [`RESERVE_NONE`] if it could not be made.
static RESERVE_BASE: AtomicUsize = AtomicUsize::new(0);
const RESERVE_BUSY: usize = 1;
const RESERVE_NONE: usize = 2;
/// Its length, and the bytes carved from it so far (spares first).
static RESERVE_LEN: AtomicUsize = AtomicUsize::new(0);
static RESERVE_USED: AtomicUsize = AtomicUsize::new(0);
/// Spare chunks handed out (at most [`SPARES`]).
static SPARES_USED: AtomicUsize = AtomicUsize::new(0);

/// The reservation's base, made now if it is not yet; None if it cannot be (or another thread
/// is making it this moment: the caller maps a chunk alone instead).
fn reservation() -> Option<usize> {
    match RESERVE_BASE.load(Acquire) {
        0 => {}
        RESERVE_BUSY | RESERVE_NONE => return None,
        b => return Some(b),
    }
    if RESERVE_BASE.compare_exchange(0, RESERVE_BUSY, AcqRel, Acquire).is_err() {
        let b = RESERVE_BASE.load(Acquire);
        return (b > RESERVE_NONE).then_some(b);
    }
    let len = mman::address_limit().map_or(RESERVE, |l| (l / 64).min(RESERVE)) & !(CHUNK - 1);
    let made = (len >= RESERVE_MIN)
        .then(|| mman::map_aligned(len, CHUNK, libc::PROT_NONE, true).ok())
        .flatten();
    let Some(base) = made else {
        RESERVE_BASE.store(RESERVE_NONE, Release);
        return None;
    };
    // SAFETY: our fresh reservation; huge-page advice changes no content.
    let _ = unsafe { mman::madvise(base, len, mman::MADV_NOHUGEPAGE) };
    // The spares, read-write from the start, at its bottom: the chunks carved later merge
    // with them.
    // SAFETY: the bottom of our fresh reservation, which nothing else uses.
    let spares = unsafe { mman::protect(base, SPARES * CHUNK, libc::PROT_READ | libc::PROT_WRITE) }.is_ok();
    RESERVE_USED.store(if spares { SPARES * CHUNK } else { 0 }, Relaxed);
    SPARES_USED.store(if spares { 0 } else { SPARES }, Relaxed);
    RESERVE_LEN.store(len, Relaxed);
    RESERVE_BASE.store(base, Release);
    Some(base)
}

/// The chunk reservation, `(base, len)`, once made: a program's `mlockall` locks it, and the
/// shim's hook unlocks it.
///
/// # Context
/// Any thread; atomics only.
pub fn reservation_area() -> Option<(usize, usize)> {
    let base = RESERVE_BASE.load(Acquire);
    (base > RESERVE_NONE).then(|| (base, RESERVE_LEN.load(Relaxed)))
}

/// The next chunk of the reservation, made read-write; None when it is used up or the kernel
/// refuses the protection change (the chunk is then lost: it stays `PROT_NONE`).
fn reserved_chunk() -> Option<usize> {
    let base = reservation()?;
    let len = RESERVE_LEN.load(Relaxed);
    let off = RESERVE_USED
        .fetch_update(Relaxed, Relaxed, |u| (u + CHUNK <= len).then_some(u + CHUNK))
        .ok()?;
    let chunk = base + off;
    // SAFETY: a chunk of our reservation that no other caller got (the counter above).
    unsafe { mman::protect(chunk, CHUNK, libc::PROT_READ | libc::PROT_WRITE) }.ok()?;
    // Under mlockall(MCL_FUTURE) the reservation was made locked: not the program's memory.
    let _ = mman::munlock(chunk, CHUNK);
    Some(chunk)
}

/// One of the spare chunks, while any is left.
fn spare_chunk() -> Option<usize> {
    let base = reservation()?;
    let i = SPARES_USED
        .fetch_update(Relaxed, Relaxed, |n| (n < SPARES).then_some(n + 1))
        .ok()?;
    Some(base + i * CHUNK)
}

/// An object of `class` from its slab, or None (lock busy, or no memory for a new chunk).
fn small_alloc(class: usize) -> Option<usize> {
    let c = &STATE[class];
    match c.acquire(thread_id(), YIELDS) {
        Ok(()) => {}
        Err(Busy::Mine) => {
            REENTERED.fetch_add(1, Relaxed);
            return None;
        }
        Err(Busy::Timeout) => {
            CONTENDED.fetch_add(1, Relaxed);
            return None;
        }
    }
    // SAFETY: we hold the class lock: no other reference to the slab exists until release
    // (a signal handler on this thread finds the lock its own and keeps off).
    let slab = unsafe { &mut *c.slab.get() };
    if slab.free == 0 {
        slab.free = c.returned.swap(0, Acquire);
    }
    let got = if slab.free != 0 {
        let p = slab.free;
        // SAFETY: `p` is a free object of this class, taken under the lock; its first word is
        // the link written when it was freed (made visible by the Acquire swap).
        slab.free = unsafe { *(p as *const usize) };
        Some(p)
    } else {
        let size = SIZES[class];
        if slab.end - slab.next < size {
            if let Some(chunk) = new_chunk(class) {
                slab.next = chunk + first_offset(class);
                slab.end = chunk + CHUNK;
            }
        }
        if slab.end - slab.next >= size {
            let p = slab.next;
            slab.next += size;
            Some(p)
        } else {
            None
        }
    };
    c.release();
    got
}

/// Returns a slab object. Takes no lock. A pointer whose chunk has no valid header (not ours:
/// a contract violation) is left alone.
fn small_free(p: usize) {
    let Some(class) = slab_class(p) else { return };
    STATE[class].push_returned(p);
}

/// The class of the slab object at `p`, from its chunk header.
fn slab_class(p: usize) -> Option<usize> {
    let chunk = p & !(CHUNK - 1);
    // SAFETY: `p` is a slab object (not chunk-aligned, handed out by `small_alloc`), so its
    // chunk is one of ours, mapped for good, with a header at its start.
    let h = unsafe { &*(chunk as *const ChunkHeader) };
    let class = h.class;
    let ok = h.magic == MAGIC
        && class < CLASSES
        && p >= chunk + first_offset(class)
        && (p - chunk - first_offset(class)) % SIZES[class] == 0;
    ok.then_some(class)
}

/// A direct mapping for `size` bytes aligned to `align` (at least [`CHUNK`]); 0 on failure.
fn direct_alloc(size: usize, align: usize) -> usize {
    let Some(len) = direct_len(size) else { return 0 };
    match mman::map_aligned(len, align.max(CHUNK), libc::PROT_READ | libc::PROT_WRITE, false) {
        Ok(a) => {
            DIRECT_MAPS.fetch_add(1, Relaxed);
            DIRECT_BYTES.fetch_add(len, Relaxed);
            a
        }
        Err(_) => 0,
    }
}

/// Unmaps the direct mapping at `p` of a block of `size` bytes.
///
/// # Safety
/// `p` is a live direct mapping of this allocator for `size` bytes, freed by its owner.
unsafe fn direct_free(p: usize, size: usize) {
    let Some(len) = direct_len(size) else { return };
    // SAFETY: the caller's contract.
    if unsafe { mman::unmap(p, len) }.is_ok() {
        DIRECT_MAPS.fetch_sub(1, Relaxed);
        DIRECT_BYTES.fetch_sub(len, Relaxed);
    }
}

/// mremap(2) as a system call.
///
/// # Safety
/// `[old, old + old_len)` is a direct mapping we own; with `MREMAP_FIXED`, `[to, to + new_len)`
/// is a reservation we own too (it is replaced).
unsafe fn mremap(
    old: usize,
    old_len: usize,
    new_len: usize,
    flags: libc::c_int,
    to: usize,
) -> Result<usize, raw::Errno> {
    // SAFETY: upheld by the caller.
    unsafe { raw::call(libc::SYS_mremap, [old, old_len, new_len, raw::int_arg(flags), to, 0]) }
}

/// Resizes the direct mapping at `p` from `old_len` to `new_len` bytes (page multiples),
/// keeping its contents and its alignment to `align` (at least [`CHUNK`]). Returns its address
/// (`p` unless it moved), or 0 with the old mapping intact.
///
/// # Safety
/// `p` is a live direct mapping of this allocator of `old_len` bytes, whose owner resizes it.
unsafe fn direct_resize(p: usize, old_len: usize, new_len: usize, align: usize) -> usize {
    if new_len == old_len {
        return p;
    }
    if new_len < old_len {
        // SAFETY: the tail of the caller's mapping, which it gives up.
        if unsafe { mman::unmap(p + new_len, old_len - new_len) }.is_err() {
            return 0;
        }
        DIRECT_BYTES.fetch_sub(old_len - new_len, Relaxed);
        return p;
    }
    // SAFETY: our own direct mapping; without MREMAP_MAYMOVE it grows in place or fails,
    // never touching other mappings.
    if unsafe { mremap(p, old_len, new_len, 0, 0) }.is_ok() {
        DIRECT_BYTES.fetch_add(new_len - old_len, Relaxed);
        return p;
    }
    // The range after it is taken: move the pages onto an aligned reservation (the kernel then
    // unmaps the old range). Without MREMAP_FIXED the kernel would pick an address with no
    // more than page alignment, and `dealloc` would no longer know the block for a direct one.
    let Ok(to) = mman::map_aligned(new_len, align.max(CHUNK), libc::PROT_NONE, true) else {
        return 0;
    };
    // SAFETY: `[to, to + new_len)` is our fresh reservation, disjoint from the old range.
    match unsafe { mremap(p, old_len, new_len, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, to) } {
        Ok(_) => {
            DIRECT_BYTES.fetch_add(new_len - old_len, Relaxed);
            to
        }
        Err(_) => {
            // SAFETY: the reservation made above for the move, which failed.
            let _ = unsafe { mman::unmap(to, new_len) };
            0
        }
    }
}

// SAFETY: every block handed out is `layout.size()` bytes or more, aligned to
// `layout.align()`, inside a mapping of ours that no other block overlaps until it is freed:
// slab objects are disjoint slots of a class's chunks, each handed out once between frees
// (the free list and the returned stack hold only freed slots); direct mappings are the
// kernel's fresh mappings, aligned by `map_aligned`.
unsafe impl GlobalAlloc for EngineAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = class_of(layout.size(), layout.align()).and_then(small_alloc);
        p.unwrap_or_else(|| direct_alloc(layout.size(), layout.align())) as *mut u8
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if let Some(p) = class_of(layout.size(), layout.align()).and_then(small_alloc) {
            // SAFETY: a fresh slab object of at least `layout.size()` bytes.
            unsafe { ptr::write_bytes(p as *mut u8, 0, layout.size()) };
            return p as *mut u8;
        }
        // A fresh anonymous mapping reads zero already (and stays unpopulated).
        direct_alloc(layout.size(), layout.align()) as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let p = ptr as usize;
        if p == 0 {
            return;
        }
        if p % CHUNK == 0 {
            // SAFETY: a chunk-aligned block is a direct mapping of `layout.size()` bytes
            // (GlobalAlloc's contract: `ptr` came from this allocator with `layout`).
            unsafe { direct_free(p, layout.size()) };
        } else {
            small_free(p);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = ptr as usize;
        let align = layout.align();
        if p % CHUNK != 0 {
            // A slab object: stays where it is while the new size fits its class without
            // wasting more than half of it, or the class is the one the new size would get.
            if let Some(class) = slab_class(p) {
                let size = SIZES[class];
                if new_size <= size && (new_size > size / 2 || class_of(new_size, align) == Some(class)) {
                    return ptr;
                }
            }
            return move_block(ptr, layout, new_size);
        }
        // A direct mapping: back to a slab if the new size is small (and the class is free),
        // else resized in place or moved by the kernel.
        let (Some(old_len), Some(new_len)) = (direct_len(layout.size()), direct_len(new_size)) else {
            return ptr::null_mut();
        };
        if let Some(q) = class_of(new_size, align).and_then(small_alloc) {
            // SAFETY: both blocks are ours and disjoint; the old one holds `layout.size()`
            // bytes, the new one `new_size`.
            unsafe { ptr::copy_nonoverlapping(ptr, q as *mut u8, layout.size().min(new_size)) };
            // SAFETY: `p` is a direct mapping of `layout.size()` bytes (chunk aligned), copied
            // out above.
            unsafe { direct_free(p, layout.size()) };
            return q as *mut u8;
        }
        // SAFETY: as above; GlobalAlloc's contract gives the block to this call.
        unsafe { direct_resize(p, old_len, new_len, align) as *mut u8 }
    }
}

/// realloc by allocate, copy, free: the old block is kept if the allocation fails.
fn move_block(ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
    // SAFETY: GlobalAlloc::realloc's contract makes `new_size` with the old alignment a valid
    // layout (non-zero, not overflowing isize when rounded up to the alignment).
    let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
    // SAFETY: a valid non-zero layout.
    let q = unsafe { EngineAlloc.alloc(new) };
    if !q.is_null() {
        // SAFETY: the old block holds `layout.size()` bytes, the new one `new_size`; they are
        // disjoint (the old one is still allocated).
        unsafe { ptr::copy_nonoverlapping(ptr, q, layout.size().min(new_size)) };
        // SAFETY: the old block was allocated by us with `layout` and is freed once.
        unsafe { EngineAlloc.dealloc(ptr, layout) };
    }
    q
}

/// For `pthread_atfork`'s prepare handler: takes every class lock (waiting for other holders a
/// bounded time, skipping any the calling thread holds itself), so that the child's copy of
/// the allocator is consistent.
pub fn fork_prepare() {
    let me = thread_id();
    let mut held = 0u32;
    for (i, c) in STATE.iter().enumerate() {
        if c.acquire(me, FORK_YIELDS).is_ok() {
            held |= 1 << i;
        }
    }
    // Or'ed in, so that no lock taken here is ever forgotten (glibc runs the handlers of one
    // fork at a time anyway).
    FORK_HELD.fetch_or(held, Relaxed);
}

/// For `pthread_atfork`'s parent handler: releases what [`fork_prepare`] took.
pub fn fork_parent() {
    release_fork_locks();
}

/// For `pthread_atfork`'s child handler: releases what [`fork_prepare`] took (the child's only
/// thread is the one that took them).
pub fn fork_child() {
    release_fork_locks();
}

fn release_fork_locks() {
    let mut held = FORK_HELD.swap(0, Relaxed);
    while held != 0 {
        let i = held.trailing_zeros() as usize;
        STATE[i].release();
        held &= held - 1;
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "test data patterns"
)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    fn alloc(l: Layout) -> *mut u8 {
        // SAFETY: tests pass non-zero sizes.
        let p = unsafe { EngineAlloc.alloc(l) };
        assert!(!p.is_null(), "alloc {l:?}");
        assert_eq!(p as usize % l.align(), 0, "alignment of {l:?}");
        p
    }

    fn free(p: *mut u8, l: Layout) {
        // SAFETY: `p` came from EngineAlloc with `l`.
        unsafe { EngineAlloc.dealloc(p, l) }
    }

    fn realloc(p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `p` came from EngineAlloc with `l`; `new_size` is non-zero.
        let q = unsafe { EngineAlloc.realloc(p, l, new_size) };
        assert!(!q.is_null(), "realloc {l:?} to {new_size}");
        assert_eq!(q as usize % l.align(), 0);
        q
    }

    /// Fills `[p, p + len)` with a pattern of `seed` (every byte for small blocks; the ends and
    /// one byte per page for big ones).
    fn fill(p: *mut u8, len: usize, seed: u8) {
        for i in probe_offsets(len) {
            // SAFETY: `i < len` inside a block of ours.
            unsafe { *p.add(i) = seed.wrapping_add((i % 251) as u8) };
        }
    }

    fn check(p: *const u8, len: usize, seed: u8) {
        check_prefix(p, len, len, seed);
    }

    /// Checks what `fill(p, filled, seed)` wrote below `upto` (a realloc keeps that much).
    fn check_prefix(p: *const u8, filled: usize, upto: usize, seed: u8) {
        for i in probe_offsets(filled).filter(|&i| i < upto) {
            // SAFETY: as in `fill`.
            let b = unsafe { *p.add(i) };
            assert_eq!(
                b,
                seed.wrapping_add((i % 251) as u8),
                "byte {i} of {filled} (seed {seed})"
            );
        }
    }

    fn probe_offsets(len: usize) -> impl Iterator<Item = usize> {
        let dense = if len <= 8192 { 0..len } else { 0..256 };
        let tail = len.saturating_sub(256).max(dense.end)..len;
        let pages = (0..len)
            .step_by(PAGE_SIZE)
            .filter(move |&i| i >= 256 && i < len.saturating_sub(256));
        dense.chain(tail).chain(pages)
    }

    fn errno() -> i32 {
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() }
    }

    fn set_errno(v: i32) {
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = v };
    }

    /// mincore(2) of a range: how many pages are resident, or the errno (ENOMEM: not mapped).
    fn mincore(addr: usize, len: usize) -> Result<usize, i32> {
        let mut v = vec![0u8; len.div_ceil(PAGE_SIZE)];
        // SAFETY: one byte per page of the range, as mincore writes.
        match unsafe { raw::call(libc::SYS_mincore, [addr, len, v.as_mut_ptr() as usize, 0, 0, 0]) } {
            Ok(_) => Ok(v.iter().filter(|b| **b & 1 != 0).count()),
            Err(e) => Err(e.0),
        }
    }

    #[test]
    fn size_classes_hold_their_objects_aligned_and_never_at_a_chunk_boundary() {
        for size in 1..=MAX_SMALL + 1 {
            for shift in 0..=16 {
                let align = 1usize << shift;
                let linear = SIZES
                    .iter()
                    .position(|&s| s >= size && natural_align(s) >= align && size <= MAX_SMALL && align <= MAX_SMALL);
                assert_eq!(class_of(size, align), linear, "size {size} align {align}");
            }
        }
        for (c, &size) in SIZES.iter().enumerate() {
            let first = first_offset(c);
            assert!(first >= std::mem::size_of::<ChunkHeader>() && first % natural_align(size) == 0);
            assert!(natural_align(size) >= 16);
            let objects = (CHUNK - first) / size;
            assert!(objects >= 7, "class {size}: {objects} objects per chunk");
            // No object at a chunk-aligned address: the first is past the header, the last ends
            // inside the chunk.
            assert!(first > 0 && first + objects * size <= CHUNK);
        }
        assert_eq!(SIZES[CLASSES - 1], MAX_SMALL);
    }

    #[test]
    fn every_class_and_odd_sizes_with_alignments_up_to_2_mib() {
        let mut sizes: Vec<usize> = SIZES.iter().flat_map(|&s| [s - 1, s, s + 1]).collect();
        sizes.extend([
            1,
            3,
            7,
            17,
            33,
            100,
            1000,
            4095,
            4097,
            40_000,
            100_001,
            (1 << 20) + 3,
            3 << 20,
        ]);
        let mut live = Vec::new();
        for (n, &size) in sizes.iter().enumerate() {
            for shift in 0..=21 {
                let l = layout(size, 1 << shift);
                let p = alloc(l);
                // A class may also fall back to a direct mapping (another test thread holding its
                // lock past the bounded wait), never the other way round.
                match class_of(size, 1 << shift) {
                    None => assert_eq!(p as usize % CHUNK, 0, "direct"),
                    Some(c) if p as usize % CHUNK != 0 => assert_eq!(slab_class(p as usize), Some(c)),
                    Some(_) => {}
                }
                fill(p, size, (n * 31 + shift) as u8);
                live.push((p, l, (n * 31 + shift) as u8));
            }
        }
        // All alive at once: none overlaps another.
        for &(p, l, seed) in &live {
            check(p, l.size(), seed);
        }
        for (p, l, _) in live {
            free(p, l);
        }
        // Alignments above 2 MiB: direct mappings aligned by map_aligned.
        for align in [4 << 20, 8 << 20] {
            let l = layout(24, align);
            let p = alloc(l);
            fill(p, 24, 9);
            check(p, 24, 9);
            free(p, l);
        }
    }

    #[test]
    fn realloc_keeps_contents_from_small_to_large_and_back() {
        let steps = [
            10,
            24,
            100,
            4000,
            32768,
            40_000,
            1 << 20,
            3 << 20,
            5000,
            16,
            7,
            70_000,
            50_000,
            33,
        ];
        for align in [1, 8, 4096, 64 << 10, 2 << 20] {
            let mut l = layout(steps[0], align);
            let mut p = alloc(l);
            fill(p, l.size(), 1);
            for (i, &to) in steps.iter().enumerate().skip(1) {
                let q = realloc(p, l, to);
                check_prefix(q, l.size(), to, i as u8);
                l = layout(to, align);
                p = q;
                fill(p, to, i as u8 + 1);
            }
            check(p, l.size(), steps.len() as u8);
            free(p, l);
        }
    }

    #[test]
    fn a_large_block_moves_its_pages_when_it_cannot_grow_in_place() {
        let l = layout(300 << 10, 8);
        let p = alloc(l);
        assert_eq!(p as usize % CHUNK, 0);
        fill(p, l.size(), 5);
        // Take the address range right after the block, so that it cannot grow in place.
        let after = p as usize + direct_len(l.size()).unwrap();
        // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping: it maps a fresh page or fails
        // (EEXIST: something is there already, which blocks the growth as well).
        let blocker = unsafe {
            raw::call(
                libc::SYS_mmap,
                [
                    after,
                    PAGE_SIZE,
                    libc::PROT_NONE as usize,
                    (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as usize,
                    usize::MAX,
                    0,
                ],
            )
        };
        let q = realloc(p, l, 2 << 20);
        assert_ne!(q, p, "the block moved");
        assert_eq!(q as usize % CHUNK, 0, "and is still a direct mapping");
        check(q, l.size(), 5);
        // The new tail reads zero and is writable.
        // SAFETY: inside the grown block.
        assert_eq!(unsafe { *q.add((2 << 20) - 1) }, 0);
        fill(q, 2 << 20, 6);
        free(q, layout(2 << 20, 8));
        if let Ok(b) = blocker {
            if b == after {
                // SAFETY: the test's own blocker page.
                unsafe { mman::unmap(b, PAGE_SIZE) }.unwrap();
            }
        }
    }

    #[test]
    fn four_threads_of_random_alloc_free_realloc() {
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1).wrapping_mul(0xd1b5_4a32_d192_ed03);
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let mut slots: Vec<Option<(*mut u8, Layout, u8)>> = vec![None; 64];
                    for op in 0..12_000u32 {
                        let r = next();
                        let i = (r % 64) as usize;
                        let size = match (r >> 8) % 100 {
                            0..85 => 1 + (r >> 16) as usize % 4096,
                            85..97 => 4096 + (r >> 16) as usize % (60 << 10),
                            _ => (64 << 10) + (r >> 16) as usize % (1 << 20),
                        };
                        let align = match (r >> 40) % 50 {
                            0 => 2 << 20,
                            1 => 64 << 10,
                            n => 1 << (n % 13),
                        };
                        let seed = (op as u8) ^ (t as u8 * 61);
                        match slots[i].take() {
                            None => {
                                let l = layout(size, align);
                                let p = alloc(l);
                                fill(p, size, seed);
                                slots[i] = Some((p, l, seed));
                            }
                            Some((p, l, s)) => {
                                check(p, l.size(), s);
                                if (r >> 50) % 2 == 0 {
                                    free(p, l);
                                } else {
                                    let q = realloc(p, l, size);
                                    check_prefix(q, l.size(), size, s);
                                    fill(q, size, seed);
                                    slots[i] = Some((q, layout(size, l.align()), seed));
                                }
                            }
                        }
                    }
                    for (p, l, s) in slots.into_iter().flatten() {
                        check(p, l.size(), s);
                        free(p, l);
                    }
                })
            })
            .collect();
        let start = std::time::Instant::now();
        for t in threads {
            t.join().unwrap();
        }
        eprintln!("{:?}: {:?}", start.elapsed(), stats());
    }

    #[test]
    fn a_thread_that_holds_a_class_lock_is_served_by_a_direct_mapping() {
        let l = layout(100, 8);
        let class = class_of(100, 8).unwrap();
        let earlier = alloc(l);
        assert_ne!(earlier as usize % CHUNK, 0, "a slab object");
        let before = stats().reentered;
        // What a signal handler sees when it interrupts this thread inside the allocator.
        STATE[class].acquire(thread_id(), 0).unwrap();
        let p = alloc(l);
        let q = alloc(layout(100, 8));
        // A free takes no lock: it works while the class is held, as in a handler.
        free(earlier, l);
        STATE[class].release();
        assert_eq!(p as usize % CHUNK, 0, "served by a direct mapping");
        assert_eq!(q as usize % CHUNK, 0);
        assert!(stats().reentered >= before + 2);
        fill(p, 100, 3);
        fill(q, 100, 4);
        check(p, 100, 3);
        free(p, l);
        free(q, l);
        // The class works again, from slabs (unless another test thread held it too long).
        let contended = stats().contended;
        let r = alloc(l);
        assert!(r as usize % CHUNK != 0 || stats().contended > contended);
        fill(r, 100, 5);
        free(r, l);
    }

    #[test]
    fn engine_threads_allocate_with_their_own_thread_id() {
        let seen = std::sync::Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        let t = crate::sys::thread::spawn(
            "zf-test-alloc",
            crate::sys::thread::Table::Program,
            Box::new(move || {
                let me = thread_id();
                let mut ok = me != 0;
                for size in [16usize, 200, 5000, 100_000] {
                    let l = layout(size, 8);
                    // SAFETY: a valid layout.
                    let p = unsafe { EngineAlloc.alloc(l) };
                    ok &= !p.is_null();
                    if !p.is_null() {
                        fill(p, size, 3);
                        // SAFETY: `p` came from EngineAlloc with `l`.
                        let q = unsafe { EngineAlloc.realloc(p, l, size * 2) };
                        ok &= !q.is_null();
                        // SAFETY: `q` holds `2 * size` bytes, the first `size` kept from `p`.
                        ok &= unsafe { *q.add(size - 1) } == 3u8.wrapping_add(((size - 1) % 251) as u8);
                        // SAFETY: `q` came from EngineAlloc with the grown layout.
                        unsafe { EngineAlloc.dealloc(q, layout(size * 2, 8)) };
                    }
                }
                s.store(if ok { me } else { usize::MAX }, Relaxed);
            }),
        )
        .unwrap();
        t.join();
        let id = seen.load(Relaxed);
        assert!(id != 0 && id != usize::MAX, "allocations on the engine thread failed");
        assert_ne!(id, thread_id());
    }

    static HANDLED: AtomicUsize = AtomicUsize::new(0);
    static HANDLER_BAD: AtomicBool = AtomicBool::new(false);
    /// Small requests of the handler served by a direct mapping: it interrupted the class.
    static HANDLER_DIRECT: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn allocate_in_handler(_: libc::c_int) {
        for size in [24usize, 100, 3000, 16] {
            // SAFETY: a non-zero size and a power-of-two alignment.
            let l = unsafe { Layout::from_size_align_unchecked(size, 16) };
            // SAFETY: a valid layout; the block is freed below with the same layout.
            let p = unsafe { EngineAlloc.alloc(l) };
            if p.is_null() {
                HANDLER_BAD.store(true, Relaxed);
                continue;
            }
            if p as usize % CHUNK == 0 {
                HANDLER_DIRECT.fetch_add(1, Relaxed);
            }
            // SAFETY: `p` holds `size` bytes.
            unsafe {
                ptr::write_bytes(p, 0xa5, size);
                if *p.add(size - 1) != 0xa5 {
                    HANDLER_BAD.store(true, Relaxed);
                }
                EngineAlloc.dealloc(p, l);
            }
        }
        HANDLED.fetch_add(1, Relaxed);
    }

    #[test]
    fn signal_handlers_that_allocate_never_deadlock() {
        let sig = libc::SIGRTMIN() + 5;
        // SAFETY: an all-zero sigaction is a valid value to fill in.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = allocate_in_handler as *const () as usize;
        // SAFETY: installs a handler for a real-time signal nothing else in the tests uses.
        assert_eq!(unsafe { libc::sigaction(sig, &sa, ptr::null_mut()) }, 0);
        // SAFETY: an all-zero sigevent is a valid value to fill in.
        let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = sig;
        sev.sigev_notify_thread_id = crate::sys::thread::gettid() as libc::c_int;
        let mut timer: libc::timer_t = ptr::null_mut();
        // SAFETY: valid sigevent and timer out-pointer; the timer signals this thread only.
        let made = unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut timer) };
        assert_eq!(made, 0);
        let every = libc::timespec {
            tv_sec: 0,
            tv_nsec: 50_000,
        };
        let spec = libc::itimerspec {
            it_interval: every,
            it_value: every,
        };
        // SAFETY: arms the timer created above.
        assert_eq!(unsafe { libc::timer_settime(timer, 0, &spec, ptr::null_mut()) }, 0);

        let start = std::time::Instant::now();
        let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
        let mut n = 0u32;
        // Until the handler has run often, and has interrupted the allocator holding the class it
        // wanted at least once (a few times in a second, typically).
        let enough = || {
            start.elapsed() > std::time::Duration::from_millis(400)
                && HANDLED.load(Relaxed) >= 100
                && HANDLER_DIRECT.load(Relaxed) >= 1
        };
        while !enough() {
            n += 1;
            let size = [24usize, 100, 3000, 50_000, 16][n as usize % 5];
            let l = layout(size, 16);
            let p = alloc(l);
            fill(p, size, n as u8);
            live.push((p, l, n as u8));
            if live.len() > 32 {
                let (p, l, s) = live.swap_remove((n as usize * 7) % live.len());
                check(p, l.size(), s);
                free(p, l);
            }
            assert!(
                start.elapsed().as_secs() < 60,
                "{} handler runs, {} of them inside the allocator",
                HANDLED.load(Relaxed),
                HANDLER_DIRECT.load(Relaxed)
            );
        }
        // SAFETY: deletes our timer; a signal still pending is handled by the same handler.
        unsafe { libc::timer_delete(timer) };
        for (p, l, s) in live {
            check(p, l.size(), s);
            free(p, l);
        }
        assert!(!HANDLER_BAD.load(Relaxed));
        eprintln!(
            "{} handler runs over {n} allocations in {:?}; {} requests found their class lock held by the \
             thread they interrupted",
            HANDLED.load(Relaxed),
            start.elapsed(),
            HANDLER_DIRECT.load(Relaxed)
        );
    }

    #[test]
    fn a_freed_large_block_goes_back_to_the_kernel() {
        // Another test thread may map something into the freed range at once: retry a few times.
        let mut unmapped = false;
        for _ in 0..10 {
            let size = (3 << 20) + 5 * PAGE_SIZE;
            let l = layout(size, 8);
            let p = alloc(l);
            fill(p, size, 7);
            // SAFETY: touch every page.
            unsafe { ptr::write_bytes(p, 1, size) };
            let len = direct_len(size).unwrap();
            assert_eq!(mincore(p as usize, len), Ok(len / PAGE_SIZE));
            free(p, l);
            if mincore(p as usize, len) == Err(libc::ENOMEM) {
                unmapped = true;
                break;
            }
        }
        assert!(unmapped, "munmap happened");

        // A shrink unmaps the tail.
        let mut tail_gone = false;
        for _ in 0..10 {
            let l = layout(1 << 20, 8);
            let p = alloc(l);
            // SAFETY: touch every page.
            unsafe { ptr::write_bytes(p, 1, 1 << 20) };
            let q = realloc(p, l, (256 << 10) + 1);
            assert_eq!(q, p, "shrunk in place");
            let kept = direct_len((256 << 10) + 1).unwrap();
            let gone = mincore(p as usize + kept, (1 << 20) - kept);
            assert_eq!(mincore(p as usize, kept), Ok(kept / PAGE_SIZE));
            free(q, layout((256 << 10) + 1, 8));
            if gone == Err(libc::ENOMEM) {
                tail_gone = true;
                break;
            }
        }
        assert!(tail_gone, "the tail was unmapped");
    }

    #[test]
    fn errno_is_left_alone() {
        set_errno(4242);
        let small = layout(40, 8);
        let p = alloc(small);
        let p = realloc(p, small, 100_000);
        let big = layout(100_000, 8);
        let p = realloc(p, big, 3 << 20);
        let p = realloc(p, layout(3 << 20, 8), 200_000);
        free(p, layout(200_000, 8));
        // SAFETY: a valid layout.
        let z = unsafe { EngineAlloc.alloc_zeroed(layout(5000, 64)) };
        // SAFETY: 5000 bytes of ours.
        assert!(unsafe { std::slice::from_raw_parts(z, 5000) }.iter().all(|b| *b == 0));
        free(z, layout(5000, 64));
        // A request the kernel refuses: null, and errno untouched.
        let huge = layout(isize::MAX as usize - 2 * PAGE_SIZE, 8);
        // SAFETY: a valid layout.
        assert!(unsafe { EngineAlloc.alloc(huge) }.is_null());
        let q = alloc(layout(10, 1));
        // SAFETY: `q` is ours; a refused realloc keeps it.
        assert!(unsafe { EngineAlloc.realloc(q, layout(10, 1), huge.size()) }.is_null());
        free(q, layout(10, 1));
        assert_eq!(errno(), 4242);
    }

    #[test]
    fn the_fork_handlers_leave_every_class_usable_in_the_child() {
        fork_prepare();
        // SAFETY: the child only calls the allocator and raw system calls, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            fork_child();
            let mut direct = 0;
            for &size in &SIZES {
                let l = layout(size, 1);
                // SAFETY: a valid layout.
                let p = unsafe { EngineAlloc.alloc(l) };
                if p.is_null() {
                    // SAFETY: _exit in the child.
                    unsafe { libc::_exit(100) };
                }
                direct += (p as usize % CHUNK == 0) as i32;
                // SAFETY: `p` holds `size` bytes.
                unsafe { ptr::write_bytes(p, 1, size) };
            }
            // SAFETY: _exit in the child.
            unsafe { libc::_exit(direct) };
        }
        fork_parent();
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waits for our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "classes served by direct mappings in the child"
        );
        // The parent's classes work after the handlers too.
        let l = layout(64, 8);
        let p = alloc(l);
        assert_ne!(p as usize % CHUNK, 0);
        free(p, l);
    }

    #[test]
    fn alloc_zeroed_of_a_large_block_populates_nothing() {
        let l = layout(40_000, 8);
        // SAFETY: a valid layout.
        let p = unsafe { EngineAlloc.alloc_zeroed(l) } as usize;
        assert_eq!(p % CHUNK, 0);
        let len = direct_len(40_000).unwrap();
        assert_eq!(mincore(p, len), Ok(0), "mapped, nothing resident yet");
        // SAFETY: 40,000 bytes of ours.
        assert!(unsafe { std::slice::from_raw_parts(p as *const u8, 40_000) }
            .iter()
            .all(|b| *b == 0));
        free(p as *mut u8, l);
    }
}
