//! `zero_method=dsa`: zeroing with the memory fill of Intel's Data Streaming Accelerator, as
//! Intel's DTO library drives it: find an enabled user-type shared work queue in sysfs
//! (`/sys/bus/dsa/devices/wqX.Y`), map its portal (`/dev/dsa/wqX.Y`), submit one 64-byte
//! descriptor per chunk with ENQCMD, poll its completion record, and finish on the CPU what
//! the device did not do: the rest of a chunk after a partial completion (a page fault with
//! block-on-fault off), a chunk the queue kept refusing (full), a chunk that ended in error.
//!
//! **Not run on hardware**: this project's machines have no DSA. The descriptor building and
//! the completion handling run in the tests against a fake work queue ([`Portal`]) that
//! completes, completes in part, refuses and fails as scripted; the ENQCMD submission and the
//! sysfs discovery have only met machines without a device (where the method is refused
//! with one line naming what is missing).

use crate::pool::zero::methods::Unavailable;
use std::sync::atomic::{compiler_fence, Ordering::SeqCst};

/// `DSA_OPCODE_MEMFILL`.
const OPCODE_MEMFILL: u64 = 4;
/// `IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR`: a completion record, at the address given, always
/// written. No `IDXD_OP_FLAG_CC`: the zeroes go to memory, not to the cache (cold pages), and
/// no `IDXD_OP_FLAG_BOF`: a page fault ends the descriptor in part instead of blocking it.
const FLAGS: u64 = 0x0004 | 0x0008;
/// `DSA_COMP_SUCCESS`, `DSA_COMP_PAGE_FAULT_NOBOF`, `DSA_COMP_STATUS_MASK`.
const COMP_SUCCESS: u8 = 1;
const COMP_PAGE_FAULT_NOBOF: u8 = 3;
const COMP_STATUS_MASK: u8 = 0x7f;
/// ENQCMD attempts on a full queue before the chunk is zeroed on the CPU (DTO's retry limit).
pub(crate) const ENQ_RETRIES: u32 = 1000;

/// One work descriptor (`struct dsa_hw_desc`), 64 bytes, 64-byte aligned as ENQCMD wants.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Descriptor(pub(crate) [u64; 8]);

impl Descriptor {
    /// A memory fill of `len` bytes at `dst` with the pattern 0, completion into `comp`.
    ///
    /// # Context
    /// The scrub thread; spins on the descriptor's completion record.
    pub(crate) fn fill_zero(dst: usize, len: u32, comp: *mut Completion) -> Descriptor {
        let mut w = [0u64; 8];
        // Bytes 0-3: PASID and privilege, filled by ENQCMD from the process's PASID. Bytes
        // 4-7: flags (24 bits) then the opcode.
        w[0] = (FLAGS << 32) | (OPCODE_MEMFILL << 56);
        w[1] = comp as u64;
        w[2] = 0; // the pattern
        w[3] = dst as u64;
        w[4] = u64::from(len); // transfer size; interrupt handle 0
        Descriptor(w)
    }

    /// # Context
    /// Any thread; arithmetic only.
    #[cfg(test)]
    pub(crate) fn opcode(&self) -> u64 {
        self.0[0] >> 56
    }

    /// # Context
    /// Any thread; arithmetic only.
    #[cfg(test)]
    pub(crate) fn dst(&self) -> usize {
        usize::try_from(self.0[3]).unwrap_or(usize::MAX)
    }

    /// # Context
    /// Any thread; arithmetic only.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.0[4] & 0xffff_ffff).unwrap_or(0)
    }

    /// # Context
    /// Any thread; arithmetic only.
    #[cfg(test)]
    pub(crate) fn completion(&self) -> *mut Completion {
        usize::try_from(self.0[1]).unwrap_or(0) as *mut Completion
    }
}

/// A completion record (`struct dsa_completion_record`, its first 32 bytes), 32-byte aligned.
/// The device writes it; the CPU polls `status`.
#[repr(C, align(32))]
#[derive(Debug, Default)]
pub(crate) struct Completion {
    pub(crate) status: u8,
    pub(crate) result: u8,
    pub(crate) rsvd: u16,
    pub(crate) bytes_completed: u32,
    pub(crate) fault_addr: u64,
    pub(crate) rest: [u64; 2],
}

/// Where descriptors go: a work queue's portal (ENQCMD), or a fake in the tests.
pub(crate) trait Portal {
    /// Submits `d`; `false` when the queue did not take it (full: try again).
    fn submit(&self, d: &Descriptor) -> bool;
    /// The queue's largest transfer, in bytes.
    fn max_transfer(&self) -> usize;
}

/// What one zeroing did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Done {
    /// Bytes the device zeroed.
    pub(crate) device: usize,
    /// Bytes the CPU zeroed (partial completions, a full queue, errors).
    pub(crate) cpu: usize,
}

/// Zeroes `[ptr, ptr + len)` through `portal`, chunk by chunk, with `cpu` zeroing what the
/// device did not. Waits for every descriptor's completion before it looks at the next: the
/// device must be done writing before the pages move anywhere.
///
/// # Safety
/// As [`crate::ZeroMethod::zero`]: the caller owns the range.
///
/// # Context
/// The scrub thread; submits with `ENQCMD` and spins on the completion record.
pub(crate) unsafe fn zero(portal: &dyn Portal, ptr: *mut u8, len: usize, cpu: &dyn Fn(*mut u8, usize)) -> Done {
    let mut done = Done::default();
    let chunk = portal.max_transfer().clamp(4096, u32::MAX as usize);
    let mut off = 0;
    while off < len {
        let n = chunk.min(len - off);
        let dst = ptr as usize + off;
        // Written by the device through the raw pointer; read here only through it (volatile).
        let mut comp = Completion::default();
        let cp: *mut Completion = &mut comp;
        let d = Descriptor::fill_zero(dst, u32::try_from(n).unwrap_or(u32::MAX), cp);
        // The completion record's zero status is written before the device can see the
        // descriptor (DTO: sfence before ENQCMD; the portal's submit fences too).
        compiler_fence(SeqCst);
        let mut tries = 0;
        let taken = loop {
            if portal.submit(&d) {
                break true;
            }
            tries += 1;
            if tries >= ENQ_RETRIES {
                break false;
            }
            std::hint::spin_loop();
        };
        if !taken {
            cpu(dst as *mut u8, n);
            done.cpu += n;
            off += n;
            continue;
        }
        // SAFETY: `cp` points at the live record above.
        let status = unsafe { wait(cp) };
        match status & COMP_STATUS_MASK {
            COMP_SUCCESS => done.device += n,
            COMP_PAGE_FAULT_NOBOF => {
                // SAFETY: the device is done with the record (status written).
                let k = usize::try_from(unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*cp).bytes_completed)) })
                    .unwrap_or(0)
                    .min(n);
                done.device += k;
                cpu((dst + k) as *mut u8, n - k);
                done.cpu += n - k;
            }
            _ => {
                cpu(dst as *mut u8, n);
                done.cpu += n;
            }
        }
        off += n;
    }
    done
}

/// Polls `comp` until the device wrote a status: spinning first, then yielding the CPU.
///
/// # Safety
/// `comp` points at a live completion record.
unsafe fn wait(comp: *const Completion) -> u8 {
    let mut spins = 0u32;
    loop {
        // SAFETY: the caller's record; the device writes it (volatile read).
        let s = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*comp).status)) };
        if s != 0 {
            std::sync::atomic::fence(SeqCst);
            return s;
        }
        spins += 1;
        if spins < 4096 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// A real work queue's portal.
#[derive(Debug)]
pub(crate) struct WorkQueue {
    portal: usize,
    max_transfer: usize,
}

impl Portal for WorkQueue {
    fn submit(&self, d: &Descriptor) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let retry: u8;
            // SAFETY: ENQCMD (encoded by hand: `enqcmd rax, [rdx]`) copies the 64-byte
            // descriptor at rdx to the portal at rax, a live mapping of a shared work queue;
            // ZF says the queue did not take it. Only found where CPUID has ENQCMD.
            unsafe {
                std::arch::asm!(
                    "sfence",
                    ".byte 0xf2, 0x0f, 0x38, 0xf8, 0x02",
                    "setz {r}",
                    r = out(reg_byte) retry,
                    in("rax") self.portal,
                    in("rdx") d as *const Descriptor,
                    options(nostack)
                );
            }
            retry == 0
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = d;
            false
        }
    }

    fn max_transfer(&self) -> usize {
        self.max_transfer
    }
}

/// The machine's queue, found once: an enabled user-type shared work queue, with ENQCMD.
///
/// # Context
/// Any thread, once (then cached): reads sysfs and maps the portal.
pub(crate) fn queue() -> Result<&'static WorkQueue, Unavailable> {
    static Q: std::sync::OnceLock<Result<WorkQueue, Unavailable>> = std::sync::OnceLock::new();
    Q.get_or_init(find).as_ref().map_err(|e| *e)
}

fn find() -> Result<WorkQueue, Unavailable> {
    if !has_enqcmd() {
        return Err(Unavailable::NoEnqcmd);
    }
    let queues = crate::sys::dsa::shared_queues().map_err(|_| Unavailable::NoWorkQueue)?;
    for q in queues {
        if let Ok(portal) = crate::sys::mman::map_portal(&format!("/dev/dsa/{}", q.name)) {
            return Ok(WorkQueue {
                portal,
                max_transfer: q.max_transfer,
            });
        }
    }
    Err(Unavailable::NoWorkQueue)
}

#[cfg(target_arch = "x86_64")]
fn has_enqcmd() -> bool {
    std::arch::x86_64::__cpuid_count(7, 0).ecx & (1 << 29) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn has_enqcmd() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::VecDeque;

    /// What the fake queue does with the next descriptor.
    #[derive(Clone, Copy, Debug)]
    enum Act {
        /// Takes it and zeroes it all.
        Complete,
        /// Takes it, zeroes this many bytes and reports a page fault there.
        Partial(u32),
        /// Refuses it (queue full) this many times, then takes it and zeroes it all.
        Full(u32),
        /// Takes it and ends in an error status, zeroing nothing.
        Error,
        /// Takes it and completes it from another thread a little later.
        Late,
    }

    struct Fake {
        script: RefCell<VecDeque<Act>>,
        max: usize,
        seen: RefCell<Vec<Descriptor>>,
        refusals: RefCell<u32>,
    }

    impl Fake {
        fn new(max: usize, acts: &[Act]) -> Fake {
            Fake {
                script: RefCell::new(acts.iter().copied().collect()),
                max,
                seen: RefCell::new(vec![]),
                refusals: RefCell::new(0),
            }
        }
    }

    /// Writes what a device writes: zeroes, then the record (bytes, then the status last).
    fn device(d: Descriptor, bytes: usize, status: u8) {
        // SAFETY: the test owns the buffer the descriptor names.
        unsafe { std::ptr::write_bytes(d.dst() as *mut u8, 0, bytes) };
        let c = d.completion();
        // SAFETY: the record lives on the zeroing's stack until its status is seen.
        unsafe {
            std::ptr::write_volatile(
                std::ptr::addr_of_mut!((*c).bytes_completed),
                u32::try_from(bytes).unwrap(),
            );
            std::sync::atomic::fence(SeqCst);
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*c).status), status);
        }
    }

    impl Portal for Fake {
        fn submit(&self, d: &Descriptor) -> bool {
            let act = *self.script.borrow().front().unwrap_or(&Act::Complete);
            if let Act::Full(n) = act {
                let mut r = self.refusals.borrow_mut();
                if *r < n {
                    *r += 1;
                    return false;
                }
                *r = 0;
            }
            self.script.borrow_mut().pop_front();
            self.seen.borrow_mut().push(*d);
            let d = *d;
            match act {
                Act::Complete | Act::Full(_) => device(d, d.len(), COMP_SUCCESS),
                Act::Partial(k) => device(d, k as usize, COMP_PAGE_FAULT_NOBOF | 0x80),
                Act::Error => {
                    let c = d.completion();
                    // SAFETY: as in `device`.
                    unsafe { std::ptr::write_volatile(std::ptr::addr_of_mut!((*c).status), 0x13) };
                }
                Act::Late => {
                    std::thread::spawn(move || {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        device(d, d.len(), COMP_SUCCESS);
                    });
                }
            }
            true
        }

        fn max_transfer(&self) -> usize {
            self.max
        }
    }

    /// A dirty buffer, `pages` 4 KiB pages, 64-byte aligned.
    fn dirty(pages: usize) -> Vec<u64> {
        vec![0x5a5a_5a5a_5a5a_5a5a; pages * 512]
    }

    fn run(fake: &Fake, buf: &mut [u64]) -> (Done, usize) {
        let cpu_calls = RefCell::new(0);
        let cpu = |p: *mut u8, n: usize| {
            *cpu_calls.borrow_mut() += 1;
            // SAFETY: inside the test's buffer.
            unsafe { std::ptr::write_bytes(p, 0, n) };
        };
        // SAFETY: the test's own buffer.
        let done = unsafe { zero(fake, buf.as_mut_ptr().cast(), buf.len() * 8, &cpu) };
        assert!(buf.iter().all(|w| *w == 0), "every byte zero");
        let calls = *cpu_calls.borrow();
        (done, calls)
    }

    #[test]
    fn descriptors_are_memory_fills_of_the_chunks_with_a_completion_record() {
        let fake = Fake::new(8192, &[]);
        let mut buf = dirty(5); // 20 KiB in 8 KiB chunks: 8, 8, 4
        let (done, calls) = run(&fake, &mut buf);
        assert_eq!((done.device, done.cpu, calls), (20480, 0, 0));
        let seen = fake.seen.borrow();
        assert_eq!(seen.len(), 3);
        let base = buf.as_ptr() as usize;
        for (i, d) in seen.iter().enumerate() {
            assert_eq!(d.opcode(), 4, "memory fill");
            assert_eq!((d.0[0] >> 32) & 0xff_ffff, 0x0c, "CRAV and RCR, no BOF, no CC");
            assert_eq!(d.0[0] & 0xffff_ffff, 0, "PASID left to ENQCMD");
            assert_eq!(d.0[2], 0, "pattern zero");
            assert_eq!(d.dst(), base + i * 8192);
            assert_eq!(d.len(), if i < 2 { 8192 } else { 4096 });
            assert_eq!(d.completion() as usize % 32, 0, "completion record aligned");
        }
        assert_eq!(std::mem::size_of::<Descriptor>(), 64);
        assert_eq!(std::mem::align_of::<Descriptor>(), 64);
    }

    #[test]
    fn a_partial_completion_is_finished_on_the_cpu() {
        let fake = Fake::new(16384, &[Act::Partial(4096), Act::Complete]);
        let mut buf = dirty(8);
        let (done, calls) = run(&fake, &mut buf);
        assert_eq!((done.device, done.cpu, calls), (4096 + 16384, 12288, 1));
    }

    #[test]
    fn a_full_queue_is_retried_then_left_to_the_cpu() {
        let fake = Fake::new(4096, &[Act::Full(5), Act::Full(ENQ_RETRIES + 10)]);
        let mut buf = dirty(2);
        let (done, calls) = run(&fake, &mut buf);
        assert_eq!((done.device, done.cpu, calls), (4096, 4096, 1));
    }

    #[test]
    fn an_error_status_leaves_the_chunk_to_the_cpu() {
        let fake = Fake::new(4096, &[Act::Complete, Act::Error, Act::Complete]);
        let mut buf = dirty(3);
        let (done, calls) = run(&fake, &mut buf);
        assert_eq!((done.device, done.cpu, calls), (8192, 4096, 1));
    }

    #[test]
    fn a_late_completion_is_waited_for() {
        let fake = Fake::new(1 << 20, &[Act::Late]);
        let mut buf = dirty(16);
        let t = std::time::Instant::now();
        let (done, calls) = run(&fake, &mut buf);
        assert_eq!((done.device, done.cpu, calls), (65536, 0, 0));
        assert!(t.elapsed() >= std::time::Duration::from_millis(20));
    }

    #[test]
    fn without_a_device_the_method_says_what_is_missing() {
        if let Err(why) = queue() {
            let why = why.to_string();
            assert!(why.starts_with("dsa needs ") && !why.contains('\n'), "{why}");
        }
    }
}
