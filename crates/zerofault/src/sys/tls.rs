//! The process's TLS as an engine thread gets it: the layout of the modules with TLS, read
//! once ([`prepare`]), and the copy of it (static and dynamic blocks, DTV, thread control
//! block) filled in for a new thread before its clone. Used by [`super::thread`]'s spawn.

// The clone(2) path is x86-64 only; elsewhere its pieces are unused.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

use super::mman::PAGE_SIZE;
#[cfg(target_arch = "x86_64")]
use super::thread::tcb_word;
use crate::page::index;
use std::sync::OnceLock;

/// TLS vector slots: module ids up to this need no reallocation by glibc.
pub(super) const DTV_SLOTS: usize = 4096;
/// glibc's `TLS_DTV_UNALLOCATED`.
const DTV_UNALLOCATED: usize = usize::MAX;
const MAX_MODULES: usize = 64;

/// One module's TLS block.
#[derive(Clone, Copy, Debug, Default)]
struct TlsModule {
    modid: usize,
    /// Thread pointer minus the block's address (the same on every thread) for a block in
    /// static TLS; 0 for a dynamic one (a dlopen()ed module, this library among them when the
    /// shim's front loaded it), which an engine thread gets in its own mapping instead.
    offset: usize,
    image: usize,
    filesz: usize,
    memsz: usize,
    align: usize,
}

/// The process's TLS, read once (at load, by the shim's constructor, or at the first engine
/// start): the modules with TLS and the size glibc reserves below the thread pointer.
#[derive(Debug)]
pub(super) struct TlsLayout {
    /// Bytes below the thread pointer.
    pub(super) below: usize,
    pub(super) align: usize,
    /// Static modules first (`modules[..n]`), then dynamic ones (`modules[n..n + dynamic]`).
    n: usize,
    dynamic: usize,
    modules: [TlsModule; MAX_MODULES],
}

impl TlsLayout {
    /// Bytes an engine thread needs for the dynamic modules' blocks, each aligned.
    pub(super) fn dynamic_bytes(&self) -> usize {
        self.modules[self.n..self.n + self.dynamic]
            .iter()
            .fold(0usize, |at, m| at.next_multiple_of(m.align) + m.memsz)
            + 64
    }
}

pub(super) static LAYOUT: OnceLock<TlsLayout> = OnceLock::new();

/// Reads the static TLS layout of the process. Call it where the dynamic loader's lock is
/// safe to take (not from inside another allocator's hook): the shim's constructor does.
/// Cheap after the first call.
pub fn prepare() {
    LAYOUT.get_or_init(read_layout);
}

#[cfg(target_arch = "x86_64")]
pub(super) fn read_layout() -> TlsLayout {
    type StaticInfo = unsafe extern "C" fn(*mut usize, *mut usize);
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name; null when absent.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_get_tls_static_info".as_ptr()) };
    let (mut size, mut align) = (0usize, 64usize);
    if !f.is_null() {
        // SAFETY: glibc's _dl_get_tls_static_info(size_t *, size_t *) writes two words.
        unsafe { std::mem::transmute::<*mut libc::c_void, StaticInfo>(f)(&mut size, &mut align) };
    }
    let tp = tcb_word(0);
    let mut l = TlsLayout {
        below: size,
        align: align.max(64),
        n: 0,
        dynamic: 0,
        modules: [TlsModule::default(); MAX_MODULES],
    };
    extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the duration of the call, and `data`
        // is the `(tp, &mut TlsLayout)` pair below.
        let (info, (tp, l)) = unsafe { (&*info, &mut *data.cast::<(usize, &mut TlsLayout)>()) };
        // The calling thread's block of the module: null for a dynamic module this thread has
        // not touched yet.
        let block = info.dlpi_tls_data as usize;
        if info.dlpi_tls_modid == 0 || l.n == MAX_MODULES {
            return 0;
        }
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers of the module.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        if let Some(h) = phdrs.iter().find(|h| h.p_type == libc::PT_TLS) {
            l.modules[l.n] = TlsModule {
                modid: info.dlpi_tls_modid,
                offset: if block != 0 && block < *tp { *tp - block } else { 0 },
                image: index(info.dlpi_addr) + index(h.p_vaddr),
                filesz: index(h.p_filesz),
                memsz: index(h.p_memsz),
                align: index(h.p_align).clamp(1, PAGE_SIZE).next_power_of_two(),
            };
            l.n += 1;
        }
        0
    }
    let mut data = (tp, &mut l);
    // SAFETY: the callback only reads what dl_iterate_phdr hands it and writes `data`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut data).cast::<libc::c_void>()) };
    // Blocks below the thread pointer within glibc's static size are static; the others are
    // dynamic (dlopen()ed modules, allocated elsewhere, or not yet in this thread): an engine
    // thread gets its own copy of each, so that glibc never allocates one for it (through the
    // program's malloc).
    let deepest = l.modules[..l.n].iter().map(|m| m.offset).max().unwrap_or(0);
    if l.below == 0 {
        l.below = deepest + (64 << 10);
    }
    let below = l.below;
    let all = l.n;
    let is_static = |m: &TlsModule| m.offset != 0 && m.offset <= below && m.offset >= m.memsz;
    let mut ordered = [TlsModule::default(); MAX_MODULES];
    let mut k = 0;
    for m in l.modules[..all].iter().filter(|m| is_static(m)) {
        ordered[k] = *m;
        k += 1;
    }
    l.n = k;
    for m in l.modules[..all]
        .iter()
        .filter(|m| !is_static(m) && m.modid <= DTV_SLOTS)
    {
        ordered[k] = *m;
        k += 1;
    }
    l.dynamic = k - l.n;
    l.modules = ordered;
    l
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn read_layout() -> TlsLayout {
    TlsLayout {
        below: 0,
        align: 64,
        n: 0,
        dynamic: 0,
        modules: [TlsModule::default(); MAX_MODULES],
    }
}

/// Fills a new engine thread's TLS, DTV and thread control block (at thread pointer `tp`, the
/// DTV at `dtv`, the dynamic modules' blocks from `dynamic`) from `layout`, as glibc would.
///
/// # Safety
/// The memory below `tp` for the static modules' blocks, the TCB at `tp`, the DTV at `dtv`
/// (`DTV_SLOTS + 2` slots of 16 bytes) and `layout.dynamic_bytes()` from `dynamic` must be a
/// fresh zeroed read-write mapping of the caller's that no one else uses yet.
///
/// # Context
/// The thread spawning an engine thread (from `spawn_impl`), before the clone; takes no lock,
/// does not sleep.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn set_up_tls(layout: &TlsLayout, tp: usize, dtv: usize, dynamic: usize) {
    // SAFETY: every write below lands inside the caller's mapping: static module blocks end
    // at tp (offset >= memsz), the DTV and the tid word are above the TCB, the dynamic blocks
    // above those (dynamic_bytes).
    unsafe {
        for m in &layout.modules[..layout.n] {
            std::ptr::copy_nonoverlapping(m.image as *const u8, (tp - m.offset) as *mut u8, m.filesz);
        }
        let slots = dtv as *mut [usize; 2];
        // dtv[-1].counter: slots allocated.
        (*slots)[0] = DTV_SLOTS;
        // dtv[0].counter: the TLS generation this vector is up to date with. The highest there
        // is: glibc's __tls_get_addr then never updates the vector (which would drop the
        // blocks set below and allocate new ones with malloc); it finds every block here.
        (*slots.add(1))[0] = usize::MAX;
        for i in 1..=DTV_SLOTS {
            (*slots.add(1 + i))[0] = DTV_UNALLOCATED;
        }
        for m in &layout.modules[..layout.n] {
            if m.modid <= DTV_SLOTS {
                *slots.add(1 + m.modid) = [tp - m.offset, 0];
            }
        }
        let mut at = dynamic;
        for m in &layout.modules[layout.n..layout.n + layout.dynamic] {
            at = at.next_multiple_of(m.align);
            std::ptr::copy_nonoverlapping(m.image as *const u8, at as *mut u8, m.filesz);
            // [address, to_free]: nothing for glibc to free.
            *slots.add(1 + m.modid) = [at, 0];
            at += m.memsz;
        }
        let tcb = tp as *mut usize;
        *tcb = tp; // header.tcb
        *tcb.add(1) = dtv + 16; // header.dtv points at dtv[0]
        *tcb.add(2) = tp; // header.self
        *(tp as *mut u32).add(6) = 1; // header.multiple_threads
        *tcb.add(5) = tcb_word(0x28); // header.stack_guard
        *tcb.add(6) = tcb_word(0x30); // header.pointer_guard
    }
}
