//! Zeroing methods (seeds 002/003): the ways the engine can zero memory it owns, behind one
//! interface: the scrub thread zeroes recycled pages with them (`zero_method`), and
//! `zerofault bench-zero` times them where it runs.
//!
//! - `kernel`: `MADV_DONTNEED` then `MADV_POPULATE_WRITE`: the kernel frees the pages and
//!   hands back zero-filled ones.
//! - `stosb`: `rep stosb` (fast with ERMS/FSRM); temporal stores, so the lines stay cached.
//! - `nt`: non-temporal stores (AVX-512 where CPUID has it, else AVX2, else SSE2) that bypass
//!   the caches, then one `sfence` per call: a call is a batch (a fence per page halves the
//!   throughput, shared/notes/uffd-facts.md).
//! - `clzero`: AMD's CLZERO, a cache line zeroed without reading it, then one `sfence`.
//! - `dsa`: Intel DSA's memory fill through a shared work queue (`dsa.rs`), the rest of what
//!   the device leaves finished with `nt`. Not run on hardware: tested against a fake queue.
//!
//! A method the machine lacks is refused with one line naming what is missing.

pub use crate::options::ZeroMethod;
use crate::sys::mman;
use std::{fmt, io};

/// What a zeroing method this machine lacks is missing ([`ZeroMethod::available`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// `clzero`: the CPU has no CLZERO instruction.
    NoClzero,
    /// `dsa`: the CPU has no ENQCMD instruction.
    NoEnqcmd,
    /// `dsa`: no enabled user-type shared work queue of Intel DSA.
    NoWorkQueue,
    /// The method's stores are x86-64's, and this is not x86-64.
    NotX86(ZeroMethod),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unavailable::NoClzero => "clzero needs the CLZERO instruction (AMD; CPUID 0x80000008 EBX bit 0)",
            Unavailable::NoEnqcmd => {
                "dsa needs the ENQCMD instruction (CPUID 7.0 ECX bit 29) and an Intel DSA work queue"
            }
            Unavailable::NoWorkQueue => "dsa needs an enabled user-type shared work queue of Intel DSA (idxd: /sys/bus/dsa/devices/wqX.Y, /dev/dsa/wqX.Y); none found",
            Unavailable::NotX86(ZeroMethod::Stosb) => "stosb needs x86-64",
            Unavailable::NotX86(ZeroMethod::Nt) => "nt needs x86-64 (SSE2/AVX2/AVX-512 non-temporal stores)",
            Unavailable::NotX86(ZeroMethod::Dsa) => "dsa needs x86-64 with Intel DSA",
            Unavailable::NotX86(_) => "clzero needs x86-64 with CLZERO (AMD)",
        })
    }
}

impl std::error::Error for Unavailable {}

/// Whether this machine has each method, and how each zeroes ([`ZeroMethod`] is the
/// `zero_method` knob's value: `options.rs`).
impl ZeroMethod {
    /// `Ok` with the variant used (`nt`: `avx512`, `avx2` or `sse2`), or what is missing.
    ///
    /// # Context
    /// Any thread; atomics only, never sleeps.
    pub fn available(self) -> Result<&'static str, Unavailable> {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                ZeroMethod::Kernel => Ok("MADV_DONTNEED + MADV_POPULATE_WRITE"),
                ZeroMethod::Stosb => Ok("rep stosb"),
                ZeroMethod::Nt if std::arch::is_x86_feature_detected!("avx512f") => Ok("avx512"),
                ZeroMethod::Nt if std::arch::is_x86_feature_detected!("avx2") => Ok("avx2"),
                ZeroMethod::Nt => Ok("sse2"),
                ZeroMethod::Clzero if has_clzero() => Ok("clzero"),
                ZeroMethod::Clzero => Err(Unavailable::NoClzero),
                ZeroMethod::Dsa => crate::pool::zero::dsa::queue().map(|_| "idxd shared work queue"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        match self {
            ZeroMethod::Kernel => Ok("MADV_DONTNEED + MADV_POPULATE_WRITE"),
            m => Err(Unavailable::NotX86(m)),
        }
    }

    /// Zeroes `[ptr, ptr + len)` with this method; when it returns, the zeroes are visible to
    /// every thread (the non-temporal methods fence once, at the end).
    ///
    /// # Safety
    /// The caller owns the range, page aligned and `len` a multiple of the page size, anonymous
    /// private read-write memory that nobody else touches meanwhile, and the method is
    /// [`ZeroMethod::available`].
    ///
    /// # Context
    /// The scrub thread (or `zerofault bench-zero` on a program thread); stores only, or
    /// `MADV_DONTNEED` and a populate for `kernel`.
    pub unsafe fn zero(self, ptr: *mut u8, len: usize) -> io::Result<()> {
        debug_assert!(self.available().is_ok());
        debug_assert!(ptr as usize % crate::page::PAGE_SIZE == 0 && len % crate::page::PAGE_SIZE == 0);
        match self {
            ZeroMethod::Kernel => {
                // SAFETY: the caller owns the range and wants it zero.
                unsafe { mman::madvise(ptr as usize, len, mman::MADV_DONTNEED) }?;
                return mman::populate_write(ptr as usize, len);
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the caller's contract; the method is available (checked by the caller).
            ZeroMethod::Stosb => unsafe { x86::stosb(ptr, len) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            ZeroMethod::Nt => unsafe { x86::nt(ptr, len) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            ZeroMethod::Clzero => unsafe { x86::clzero(ptr, len) },
            #[cfg(target_arch = "x86_64")]
            ZeroMethod::Dsa => {
                let q = crate::pool::zero::dsa::queue().map_err(io::Error::other)?;
                // SAFETY: as above; what the device leaves is finished with non-temporal
                // stores, on the caller's range too.
                unsafe { crate::pool::zero::dsa::zero(q, ptr, len, &|p, n| x86::nt(p, n)) };
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => return Err(io::Error::other(self.available().unwrap_err())),
        }
        Ok(())
    }
}

/// CPUID 0x80000008 EBX bit 0: CLZERO.
#[cfg(target_arch = "x86_64")]
fn has_clzero() -> bool {
    // CPUID exists on every x86-64 processor; leaf 0x80000000 says which extended leaves
    // exist before 0x80000008 is read.
    let max = std::arch::x86_64::__cpuid(0x8000_0000).eax;
    max >= 0x8000_0008 && std::arch::x86_64::__cpuid(0x8000_0008).ebx & 1 != 0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// `[p, p + len)` is writable and the caller's alone.
    ///
    /// # Context
    /// As [`ZeroMethod::zero`].
    pub(super) unsafe fn stosb(p: *mut u8, len: usize) {
        // SAFETY: rep stosb writes `rcx` bytes of `al` from `rdi`, forward (the direction flag
        // is clear by the ABI); the range is the caller's.
        unsafe {
            std::arch::asm!(
                "rep stosb",
                inout("rdi") p => _,
                inout("rcx") len => _,
                in("al") 0u8,
                options(nostack, preserves_flags)
            );
        }
    }

    /// # Safety
    /// As [`stosb`]; `p` 64-byte aligned and `len` a multiple of 64.
    ///
    /// # Context
    /// As [`ZeroMethod::zero`].
    pub(super) unsafe fn nt(p: *mut u8, len: usize) {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present; the caller's range.
            unsafe { nt512(p, len) };
        } else if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 (and so AVX) is present.
            unsafe { nt256(p, len) };
        } else {
            // SAFETY: SSE2 is part of x86-64.
            unsafe { nt128(p, len) };
        }
        // One fence for the whole call: the stores are weakly ordered until it.
        // SAFETY: SSE is part of x86-64.
        unsafe { _mm_sfence() };
    }

    /// In assembly: the AVX-512 intrinsics are stable only since Rust 1.89, after this
    /// workspace's rust-version.
    #[target_feature(enable = "avx512f")]
    unsafe fn nt512(p: *mut u8, len: usize) {
        for off in (0..len).step_by(64) {
            // SAFETY: the statement zeroes zmm0 (declared clobbered) and stores it with
            // vmovntdq to the 64-byte aligned line at `p + off`, inside the caller's range. The
            // zeroing is inside the statement: no register is assumed to keep a value between
            // two.
            unsafe {
                std::arch::asm!(
                    "vpxord zmm0, zmm0, zmm0",
                    "vmovntdq [{p}], zmm0",
                    p = in(reg) p.add(off),
                    out("zmm0") _,
                    options(nostack, preserves_flags)
                );
            }
        }
    }

    #[target_feature(enable = "avx")]
    unsafe fn nt256(p: *mut u8, len: usize) {
        let z = _mm256_setzero_si256();
        for off in (0..len).step_by(32) {
            // SAFETY: 32-byte aligned and inside the caller's range.
            unsafe { _mm256_stream_si256(p.add(off).cast(), z) };
        }
    }

    #[target_feature(enable = "sse2")]
    unsafe fn nt128(p: *mut u8, len: usize) {
        let z = _mm_setzero_si128();
        for off in (0..len).step_by(16) {
            // SAFETY: 16-byte aligned and inside the caller's range.
            unsafe { _mm_stream_si128(p.add(off).cast(), z) };
        }
    }

    /// # Safety
    /// As [`nt`]; CLZERO is present.
    ///
    /// # Context
    /// As [`ZeroMethod::zero`].
    pub(super) unsafe fn clzero(p: *mut u8, len: usize) {
        for off in (0..len).step_by(64) {
            // SAFETY: CLZERO zeroes the 64-byte line holding `rax`, inside the caller's range.
            unsafe { std::arch::asm!("clzero", in("rax") p.add(off), options(nostack, preserves_flags)) };
        }
        // SAFETY: SSE is part of x86-64.
        unsafe { _mm_sfence() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::mman::{Mapping, Thp};

    #[test]
    fn every_available_method_zeroes_every_byte_and_the_rest_say_what_is_missing() {
        let m = Mapping::new(4 << 20, Thp::Default).unwrap();
        let mut used = 0;
        for method in ZeroMethod::ALL {
            match method.available() {
                Ok(_) => {
                    // SAFETY: our own mapping.
                    unsafe { std::ptr::write_bytes(m.as_ptr(), 0x5a, m.len()) };
                    // SAFETY: our own mapping, page aligned; the method is available.
                    unsafe { method.zero(m.as_ptr(), m.len()) }.unwrap();
                    // SAFETY: our mapping, read after the zeroing (fenced).
                    let s = unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) };
                    assert!(
                        crate::pool::zero::source::is_zero(s),
                        "{} left non-zero bytes",
                        method.name()
                    );
                    used += 1;
                }
                Err(why) => {
                    let why = why.to_string();
                    assert!(why.starts_with(method.name()) && !why.contains('\n'), "{why}")
                }
            }
        }
        assert!(used >= 1);
        #[cfg(target_arch = "x86_64")]
        assert!(used >= 3, "kernel, stosb and nt exist on every x86-64");
    }
}
