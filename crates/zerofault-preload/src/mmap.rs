//! The program's memory calls: `mmap` registers large anonymous memory with the engine;
//! `mremap` and `mlockall` are followed so that they give the results they give natively.
//!
//! Every hook makes the real system call first and returns its result and `errno` untouched;
//! what the engine does afterwards runs inside the hook scope ([`Hook`]: errno kept, signals
//! blocked).
//!
//! # Context
//! Every hook here runs on any program thread, inside the hook scope; a call made inside
//! another hook (a signal handler's, or the engine's own) passes straight through.

use crate::hook::Hook;
use crate::state::{self, arena, threshold};
use engine::os::mman::{self, PAGE_SIZE};
use libc::{c_int, c_void, off_t, size_t};

/// The kernel refused the program's call (`refused`) with ENOMEM: where the process is at
/// `vm.max_map_count` (or out of address space) the engine gives its own mappings back, once
/// (`Engine::give_back`), and the caller repeats the call. Enters a hook scope of its own, so
/// `errno` stays the refusal's.
fn gave_back(refused: bool) -> bool {
    if !refused || crate::hook::errno() != libc::ENOMEM {
        return false;
    }
    let Some(h) = Hook::enter() else { return false };
    h.running().is_some_and(give_back)
}

/// [`engine::Engine::give_back`], said under `--verbose`.
fn give_back(e: &engine::Engine) -> bool {
    let gave = e.give_back();
    if gave && e.options().verbose {
        state::say(&format!(
            "zerofault: engine stopped in pid {}: the kernel refused the program a mapping (vm.max_map_count \
             or the address space); the engine's own mappings are given back and the kernel serves its faults \
             from now on",
            state::getpid()
        ));
    }
    gave
}

/// For the front's calls that can be refused at `vm.max_map_count` (the C library's malloc
/// family and thread stacks, `mprotect`): with `errno` ENOMEM, see [`gave_back`]. Returns 1
/// where the call is worth repeating.
///
/// # Context
/// A program thread, from the front, right after the refused call; enters the hook scope.
#[no_mangle]
pub extern "C" fn zerofault_give_back() -> c_int {
    c_int::from(gave_back(true))
}

/// Whether `flags` make anonymous private memory the engine may serve.
fn anon_private(flags: c_int) -> bool {
    flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & (libc::MAP_SHARED | libc::MAP_GROWSDOWN | libc::MAP_HUGETLB) == 0
}

/// After a successful mmap at `p`: large anonymous private mappings are registered (the first
/// starts the engine), and so are small `MAP_FIXED` ones inside or next to served memory.
/// Registration sets a VMA flag; a piece left unregistered between registered ones would stay
/// a VMA of its own where natively they merge, and an `mremap` over them would then fail.
fn after_mmap(p: usize, len: usize, flags: c_int) {
    if !anon_private(flags) {
        return;
    }
    let big = len >= threshold();
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    if !big && !fixed {
        return;
    }
    let Some(h) = Hook::enter() else { return };
    let e = if big { h.engine_for(len) } else { h.running() };
    let Some(e) = e else { return };
    let len = len.next_multiple_of(PAGE_SIZE);
    let beside = e.serves(p.wrapping_sub(PAGE_SIZE)) || e.serves(p + len) || e.serves(p);
    if !(big || beside) {
        return;
    }
    // The program's last mappings were all sparse: this one is left to the kernel (unless it
    // would split a VMA that natively merges with served memory).
    if !fixed && !beside && e.leaves_mapping(len) {
        return;
    }
    // SAFETY: a fresh anonymous private mapping of the program's; the engine fills its missing
    // pages with zeros, as the kernel would, and forgets it on munmap (UNMAP event).
    if unsafe { e.adopt(p, len, true) }.is_ok() && state::thp_always() {
        e.set_huge(p, len, true);
    }
}

/// madvise(2). Huge-page advice on served memory is passed to the engine, which then serves
/// those PMDs with huge pages as the kernel would.
///
/// # Safety
/// As madvise(2): the caller owns the range (`MADV_DONTNEED` discards it).
///
/// # Context
/// Any program thread; the system call as the program made it, the engine's part inside the
/// hook scope.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) } as c_int;
    let mut r = call();
    if gave_back(r != 0) {
        r = call();
    }
    let lasting = [
        libc::MADV_DONTFORK,
        libc::MADV_WIPEONFORK,
        libc::MADV_HUGEPAGE,
        libc::MADV_NOHUGEPAGE,
    ];
    if r == 0 && lasting.contains(&advice) && arena().is_some_and(|a| a.contains(addr as usize)) {
        // A freed block's advice is put back from now on (arena.rs, "Advice").
        crate::arena::ADVISED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if r == 0 && (advice == libc::MADV_HUGEPAGE || advice == libc::MADV_NOHUGEPAGE) {
        if let Some(e) = Hook::enter().as_ref().and_then(Hook::running) {
            e.set_huge(addr as usize, len, advice == libc::MADV_HUGEPAGE);
        }
    }
    // Access advice: a program that says its access is random gets the zero page for its reads.
    let access = [libc::MADV_RANDOM, libc::MADV_NORMAL, libc::MADV_SEQUENTIAL];
    if r == 0 && len > 0 && access.contains(&advice) {
        if let Some(e) = Hook::enter().as_ref().and_then(Hook::running) {
            e.set_random(addr as usize, len, advice == libc::MADV_RANDOM);
        }
    }
    r
}

/// munmap(2). Served memory is recycled first ([`engine::Engine::recycle`]: its pages go to the
/// pool instead of the kernel), but only where the munmap cannot fail afterwards, since the
/// pages are gone once moved (a refused call must change nothing):
/// - no split: the range must begin and end on the borders of registered ranges whose
///   neighbours are not registered, so both ends are VMA borders (registration splits VMAs,
///   and a VMA never spans a registered and an unregistered page) and the munmap splits no
///   VMA, which is where it could fail (ENOMEM at `vm.max_map_count`);
/// - no seal: the kernel is asked first with `mprotect(PROT_READ | PROT_WRITE)` over the range
///   ([`unmap_allowed`]), which it refuses (EPERM) on a sealed VMA (`mseal(2)`) as it refuses
///   the munmap; `UFFDIO_MOVE` and `MADV_DONTNEED` on a sealed writable range are not refused.
///
/// Anything else is the system call alone. The result and errno are the system call's.
///
/// # Safety
/// As munmap(2): the caller gives up the range.
///
/// # Context
/// Any program thread; the system call as the program made it, the engine's part inside the
/// hook scope.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    recycle_before_unmap(addr as usize, len);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int };
    let r = call();
    // A split refused at `vm.max_map_count`.
    if gave_back(r != 0) {
        return call();
    }
    r
}

/// See [`munmap`].
fn recycle_before_unmap(addr: usize, len: usize) {
    if addr % PAGE_SIZE != 0 || len == 0 {
        return;
    }
    let Some(end) = len
        .checked_next_multiple_of(PAGE_SIZE)
        .and_then(|l| addr.checked_add(l))
    else {
        return;
    };
    let Some(h) = Hook::enter() else { return };
    let Some(e) = h.running().filter(|e| e.options().recycle) else {
        return;
    };
    let (Some((first, _)), Some((_, last))) = (e.range_of(addr), e.range_of(end - PAGE_SIZE)) else {
        return;
    };
    if first != addr || last != end || e.serves(addr.wrapping_sub(PAGE_SIZE)) || e.serves(end) {
        return;
    }
    if !unmap_allowed(addr, end - addr) {
        return;
    }
    // SAFETY: the caller unmaps the range right after: its contents are given up.
    let _ = unsafe { e.recycle(addr as *mut u8, end - addr) };
}

/// Whether the kernel lets `[addr, addr + len)` (page aligned, served memory the program is
/// about to unmap) change: `mprotect(PROT_READ | PROT_WRITE)` succeeds. It fails with EPERM
/// where a VMA of the range is sealed (`mseal(2)`: the munmap would fail the same way), and
/// with ENOMEM over a hole. The protection it sets is that of the memory the engine serves
/// (which is also what `UFFDIO_MOVE` wants of a source); the range is unmapped right after.
/// The kernel checks the seal VMA by VMA: VMAs before a sealed one in the range are made
/// read-write before the EPERM (their contents are untouched).
fn unmap_allowed(addr: usize, len: usize) -> bool {
    // SAFETY: protection of memory the caller gives up right after; no content changes.
    unsafe { libc::syscall(libc::SYS_mprotect, addr, len, libc::PROT_READ | libc::PROT_WRITE) == 0 }
}

/// mmap(2) as a system call: MAP_FAILED and errno on failure, like libc's.
unsafe fn sys_mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    // SAFETY: the caller upholds mmap's contract.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

/// mmap(2): a large anonymous private mapping is registered with the engine (served from then on); everything else passes through.
///
/// # Safety
/// As mmap(2): with `MAP_FIXED` the caller owns what the mapping replaces.
///
/// # Context
/// Any program thread; the system call as the program made it, the engine's part inside the
/// hook scope.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { sys_mmap(addr, len, prot, flags, fd, off) };
    let mut p = call();
    if gave_back(p == libc::MAP_FAILED) {
        p = call();
    }
    if p != libc::MAP_FAILED {
        after_mmap(p as usize, len, flags);
    }
    p
}

/// mmap64(2): as `mmap`.
///
/// # Safety
/// As `mmap`.
///
/// # Context
/// Any program thread; the system call as the program made it, the engine's part inside the
/// hook scope.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: as mmap (off_t is 64-bit here).
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// mremap(2) as a system call. `new_addr` is read by the kernel only with MREMAP_FIXED.
unsafe fn sys_mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: the caller upholds mremap's contract.
    unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void }
}

/// mremap(2). C declares it variadic (`new_address` only with MREMAP_FIXED or
/// MREMAP_DONTUNMAP); on the Linux ABIs the variadic integer argument arrives in the same
/// register as a fifth fixed one, and is passed on as it came.
///
/// Registration is a VMA flag: a range the engine serves in part (a piece the program mapped
/// before the engine started, a span handed back to the kernel) is several VMAs where natively
/// it may be one, and the kernel moves several VMAs only when none is registered with a
/// userfaultfd; it may even move the first ones before it refuses a later one (seen on 6.18).
/// So memory the engine serves is handed back to the kernel before the call (its pieces merge
/// as they would natively) and the kernel does exactly what it would do without the shim; the
/// engine then serves what the program has afterwards: the result (moved, grown or shrunk) and
/// the source of a MREMAP_DONTUNMAP (still mapped, now empty).
///
/// # Safety
/// As mremap(2): the caller owns both ranges, and the old one is not used after a move.
///
/// # Context
/// Any program thread; the system call as the program made it, the engine's part inside the
/// hook scope.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let hook = Hook::enter();
    let e = hook.as_ref().and_then(Hook::running);
    if let Some(r) = e.and_then(|e| grow_in_place(e, old, old_len, new_len, flags)) {
        return r;
    }
    // Released even where the table knows nothing: a registration the table lost (an unmap
    // event read after another thread mapped the same addresses again; rare, see
    // `unknown_faults`) would otherwise make a move of several VMAs fail with EFAULT. An
    // unregister where nothing is registered changes nothing.
    // The advice moves with the VMA (the kernel keeps it in the VMA's flags); the engine's,
    // forgotten with the release, is given again where the memory is afterwards.
    let mut advice = engine::Advice::default();
    let served = e.filter(|e| {
        let served = e.serves_any(old as usize, old_len);
        advice = e.advice(old as usize, old_len);
        e.release(old as usize, old_len.next_multiple_of(PAGE_SIZE));
        served
    });
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { sys_mremap(old, old_len, new_len, flags, new_addr) };
    let again = || match &hook {
        Some(h) => h.outside(call),
        None => call(),
    };
    let mut r = again();
    // Refused at `vm.max_map_count` (a move or a shrink splits): the engine's mappings go first.
    if r == libc::MAP_FAILED && crate::hook::errno() == libc::ENOMEM && e.is_some_and(give_back) {
        r = again();
    }
    if let (Some(e), true) = (served, r == libc::MAP_FAILED) {
        // Refused (no room to grow, a bad flag): the mapping is where it was, as it was; the
        // engine serves it again (errno is the kernel's, kept by the hook scope).
        // SAFETY: as below: the program's own anonymous private memory, unchanged.
        let _ = unsafe { e.adopt(old as usize, old_len.next_multiple_of(PAGE_SIZE), false) };
        e.advise(old as usize, old_len, advice);
    }
    if let (Some(e), true) = (served, r != libc::MAP_FAILED) {
        let (kept, grown) = (old_len.next_multiple_of(PAGE_SIZE), new_len.next_multiple_of(PAGE_SIZE));
        // Taken back whole: a mapping grown in steps that had to move here grows in place
        // from now on (`grow_in_place`), until it fills the room it moved into.
        // SAFETY: memory the program now owns as anonymous private memory at these
        // addresses; the engine fills missing pages with zeros as the kernel would.
        let adopted = unsafe { e.adopt(r as usize, grown, false) }.is_ok();
        e.advise(r as usize, grown, advice);
        e.tables_as_seen(r as usize, grown);
        // The part a growth added, which the program writes next.
        if adopted && grown > kept {
            e.fill_grown(r as usize + kept, grown - kept);
        }
        if flags & libc::MREMAP_DONTUNMAP != 0 {
            // SAFETY: as above: the source of a DONTUNMAP move stays mapped, empty.
            let _ = unsafe { e.adopt(old as usize, old_len.next_multiple_of(PAGE_SIZE), false) };
            e.advise(old as usize, old_len, advice);
        }
    }
    r
}

/// A growth of a served mapping, tried in place first with the registration kept: the kernel
/// grows a VMA in place with its flags, so the part added is registered already, and the
/// engine takes it as a range of its own and fills its start in the call (`Engine::fill_grown`)
/// with no unregister, no move event and no fault. Returns the result when it grew; `None`
/// (nothing changed: a failed in-place mremap changes nothing) leaves the call to the general
/// path, which gives the kernel's own answer: the mapping may be several VMAs here where
/// natively it is one (growing in place then fails with EFAULT here only), or have no room
/// after it (ENOMEM, then a move where `MREMAP_MAYMOVE` allows one). Growing in place is what
/// the kernel does first whenever it can, so the result is the kernel's. Why: docs/DESIGN.md,
/// "Blocks that grow in small steps".
///
/// # Context
/// A program thread, from [`mremap`], inside the hook scope, quiet (`e` came from it); takes
/// the engine's registration lock.
fn grow_in_place(
    e: &engine::Engine,
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
) -> Option<*mut c_void> {
    let at = old as usize;
    let (kept, grown) = (
        old_len.checked_next_multiple_of(PAGE_SIZE)?,
        new_len.checked_next_multiple_of(PAGE_SIZE)?,
    );
    if flags & !libc::MREMAP_MAYMOVE != 0 || at % PAGE_SIZE != 0 || kept == 0 || grown <= kept {
        return None;
    }
    let end = at.checked_add(kept)?;
    // The whole old span served, and nothing served right after it (which would be another
    // mapping: in-place growth fails there anyway).
    if e.range_of(at).is_none() || e.range_of(end - PAGE_SIZE).is_none() || e.serves(end) {
        return None;
    }
    // SAFETY: the caller's mapping, grown in place or left as it was (no flag that moves).
    let r = unsafe { sys_mremap(old, old_len, new_len, 0, std::ptr::null_mut()) };
    if r != old {
        return None;
    }
    // SAFETY: the part the kernel just added to the program's mapping, registered with the
    // VMA; no page there yet.
    match unsafe { e.adopt_grown(end, grown - kept) } {
        Ok(()) => {
            // The VMA's advice covers what it grew by.
            e.advise(end, grown - kept, e.advice(at, kept));
            e.fill_grown(end, grown - kept);
        }
        // Registered by the kernel but not taken: handed back, the kernel's faults serve it.
        Err(_) => e.release(end, grown - kept),
    }
    Some(r)
}

/// mlockall(2). `MCL_CURRENT` would lock and populate every mapping, the engine's pool and
/// staging reservations and the arena's free space among them: those are made `PROT_NONE`
/// first (never populated), and the engine's own mappings unlocked afterwards. `MCL_FUTURE`
/// is remembered, so that new arena blocks are locked as a native mapping would be.
///
/// # Safety
/// As mlockall(2): no pointer is passed; unsafe as the C symbol the program calls.
///
/// # Context
/// Any program thread; the system call as the program made it, the engine's part inside the
/// hook scope.
#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    // Nested in another hook, the engine is left alone but the arena is still unlocked.
    let h = Hook::enter_or_nest();
    let current = flags & libc::MCL_CURRENT != 0;
    let e = if current && h.outer() { h.running() } else { None };
    if let Some(e) = e {
        e.before_mlockall();
    }
    // SAFETY: mlockall takes one int of flags.
    let r = h.outside(|| unsafe { libc::syscall(libc::SYS_mlockall, flags) } as c_int);
    if current {
        h.quiet(); // the arena's lock, below
        if let Some(e) = e {
            e.after_mlockall();
        }
        // The engine's allocator's reservation (the shim's metadata, made before any engine).
        if let Some((addr, len)) = engine::os::alloc::reservation_area() {
            let _ = mman::munlock(addr, len);
        }
        if let Some(a) = arena() {
            a.each_free(|addr, len| {
                let _ = mman::munlock(addr, len);
            });
            let (live, len) = a.live_area();
            let _ = mman::munlock(live, len);
        }
    }
    if r == 0 && h.outer() {
        set_lock_future(&h, flags & libc::MCL_FUTURE != 0);
    }
    r
}

/// Remembers whether new memory is locked (`mlockall(MCL_FUTURE)`), and pauses the pool
/// meanwhile (see [`engine::Engine::pause_pool`]).
fn set_lock_future(h: &Hook, on: bool) {
    state::set_lock_future(on);
    if let Some(e) = h.running() {
        e.pause_pool(on);
    }
}

/// munlockall(2): passed through, and the engine's pool is refilled again.
///
/// # Safety
/// As munlockall(2): no pointer is passed; unsafe as the C symbol the program calls.
///
/// # Context
/// Any program thread; the system call as the program made it, the engine's part inside the
/// hook scope.
#[no_mangle]
pub unsafe extern "C" fn munlockall() -> c_int {
    // SAFETY: munlockall takes no argument.
    let r = unsafe { libc::syscall(libc::SYS_munlockall) } as c_int;
    if r == 0 {
        if let Some(h) = Hook::enter() {
            set_lock_future(&h, false);
        }
    }
    r
}

// ---------------------------------------------------------------------------------------------
// gperftools' MallocHook
//
// tcmalloc defines mmap, munmap, mremap and sbrk itself (raw system calls behind its MallocHook
// API): preloaded before the shim, it shadows our hooks, and its own memory never reaches
// them. Its hook API reports every such call after it returns; the shim listens there too.
// Registering memory twice is harmless, so both paths may see one call.

type MmapHook = extern "C" fn(*const c_void, *const c_void, size_t, c_int, c_int, c_int, off_t);
type MremapHook = extern "C" fn(*const c_void, *const c_void, size_t, size_t, c_int, *const c_void);
type SbrkHook = extern "C" fn(*const c_void, isize);

/// # Context
/// Any program thread, from gperftools' MallocHook after its call; the engine's part inside the
/// hook scope.
extern "C" fn tc_mmap(
    result: *const c_void,
    _: *const c_void,
    size: size_t,
    _: c_int,
    flags: c_int,
    _: c_int,
    _: off_t,
) {
    if !std::ptr::eq(result, libc::MAP_FAILED) {
        after_mmap(result as usize, size, flags);
    }
}

/// # Context
/// Any program thread, from gperftools' MallocHook after its call; the engine's part inside the
/// hook scope.
extern "C" fn tc_mremap(
    result: *const c_void,
    old: *const c_void,
    old_size: size_t,
    new_size: size_t,
    flags: c_int,
    _: *const c_void,
) {
    if std::ptr::eq(result, libc::MAP_FAILED) {
        return;
    }
    let Some(h) = Hook::enter() else { return };
    let Some(e) = h.running() else { return };
    let (at, old_len, new_len) = (
        result as usize,
        old_size.next_multiple_of(PAGE_SIZE),
        new_size.next_multiple_of(PAGE_SIZE),
    );
    if !e.serves(at) {
        return;
    }
    // SAFETY: as in mremap: memory the program now owns there, registered by the kernel.
    unsafe {
        if flags & libc::MREMAP_DONTUNMAP != 0 {
            let _ = e.adopt(old as usize, old_len, false);
        }
        if new_len > old_len {
            let _ = e.adopt(at + old_len, new_len - old_len, true);
        }
    }
}

/// # Context
/// Any program thread, from gperftools' MallocHook after its call; the engine's part inside the
/// hook scope.
extern "C" fn tc_sbrk(result: *const c_void, increment: isize) {
    if result as isize == -1 || increment < threshold() as isize {
        return;
    }
    let Some(h) = Hook::enter() else { return };
    let Some(e) = h.engine_for(increment as usize) else {
        return;
    };
    // The heap grew from the old break `result`: the whole pages past it are new.
    let start = (result as usize).next_multiple_of(PAGE_SIZE);
    let end = (result as usize + increment as usize).next_multiple_of(PAGE_SIZE);
    if end > start {
        // SAFETY: fresh anonymous private heap memory of the program's.
        let _ = unsafe { e.adopt(start, end - start, true) };
    }
}

/// Adds the hooks above where gperftools' MallocHook API is loaded. Call from the constructor
/// (dlsym takes the loader's lock).
pub fn listen_to_malloc_hooks() {
    fn add<T>(name: &std::ffi::CStr, hook: T) {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name; null when absent.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        if !f.is_null() {
            // SAFETY: gperftools' `int MallocHook_AddXHook(XHook)` takes one function pointer of
            // the hook type T (all pointer-sized).
            let add: extern "C" fn(T) -> c_int = unsafe { std::mem::transmute_copy(&f) };
            add(hook);
        }
    }
    add::<MmapHook>(c"MallocHook_AddMmapHook", tc_mmap);
    add::<MremapHook>(c"MallocHook_AddMremapHook", tc_mremap);
    add::<SbrkHook>(c"MallocHook_AddSbrkHook", tc_sbrk);
}
