//! A program whose only thread starts the engine: glibc must learn that the process has more
//! threads now, or its malloc keeps skipping its arena locks on that thread while engine
//! threads allocate from the same arena (heap corruption, seen in `zerofault verify` before
//! the fix). No test harness here: libtest would start threads of its own, which tells glibc
//! the same thing and hides the bug.

fn main() {
    if zerofault::probe().is_err() {
        if std::env::var_os("ZEROFAULT_REQUIRE_UFFD").is_some() {
            panic!("userfaultfd is required for this test");
        }
        println!("single_thread: userfaultfd unavailable, nothing to check");
        return;
    }
    extern "C" {
        static __libc_single_threaded: libc::c_char;
    }
    // SAFETY: glibc's exported byte, read on the only thread.
    let single = || unsafe { std::ptr::addr_of!(__libc_single_threaded).read_volatile() };
    assert_eq!(single(), 1, "no thread started yet: glibc says single-threaded");
    let e = zerofault::Engine::new(zerofault::Options::default()).expect("engine");
    assert_eq!(single(), 0, "the engine's threads exist: glibc must know");
    // And glibc's own first-thread setup ran before: its set*id signal (33) has its handler,
    // without which the program's first setuid with two threads would kill it.
    let mut old = [0usize; 4];
    // SAFETY: rt_sigaction reads no new action and writes the old one (the kernel's struct,
    // an 8-byte mask) into `old`.
    let r = unsafe { libc::syscall(libc::SYS_rt_sigaction, 33, 0usize, old.as_mut_ptr(), 8usize) };
    assert!(r == 0 && old[0] > 1, "glibc's SIGSETXID handler: {:#x}", old[0]);
    // And the engine's threads allocate while this one does, with nothing going wrong: a
    // region touched and recycled a few times (the scrub and handler allocate meanwhile),
    // this thread allocating all along.
    let mut r = e.map(32 << 20).expect("map");
    let mut keep = Vec::new();
    for round in 0..8u8 {
        for (i, b) in r.as_mut_slice().iter_mut().enumerate().step_by(4096) {
            *b = round | 1;
            if i % (1 << 20) == 0 {
                keep.push(vec![round; 100 + i % 3000]);
            }
        }
        r.recycle(0, 32 << 20).expect("recycle");
        keep.truncate(64);
    }
    assert!(r.as_slice().iter().all(|b| *b == 0));
    drop(r);
    drop(e);
    println!("single_thread: ok");
}
