//! Recycling after fork: pages shared with a child do not move (EBUSY); they are discarded
//! instead, and the child keeps its copy. Its own test binary, because a fork shares every
//! anonymous page of the process, and the other recycle tests' pages would stop moving too.

use zerofault::os::mman::PAGE_SIZE;
use zerofault::{is_zero, Engine, Options, Region};

const MIB: usize = 1 << 20;

fn fill_secret(r: &mut Region, seed: u8) {
    for (i, b) in r.as_mut_slice().iter_mut().enumerate().step_by(64) {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed) | 1;
    }
}

fn engine() -> Engine {
    if let Err(e) = zerofault::probe() {
        panic!("userfaultfd is required for this test: {e}");
    }
    Engine::new(Options::default()).expect("engine")
}

#[test]
#[cfg_attr(zerofault_no_uffd, ignore = "userfaultfd unavailable on this machine")]
fn pages_shared_with_a_forked_child_are_discarded_and_the_child_keeps_its_copy() {
    let e = engine();
    let len = 8 * MIB;
    let mut r = e.map(len).unwrap();
    fill_secret(&mut r, 3);
    let expect: Vec<u8> = r.as_slice().to_vec();
    let (rd, wr) = {
        let mut fds = [0; 2];
        // SAFETY: a pipe into a valid array of two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    };
    // SAFETY: the child only reads memory, sleeps on a pipe and exits with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut b = [0u8; 1];
        // SAFETY: a read into our buffer, then _exit.
        unsafe {
            libc::read(rd, b.as_mut_ptr().cast(), 1);
            let same = std::slice::from_raw_parts(r.as_ptr(), len) == &expect[..];
            libc::_exit(if same { 0 } else { 1 });
        }
    }
    let done = r.recycle(0, len).unwrap();
    assert!(done.discarded > 0, "after fork the moves are refused (EBUSY): {done:?}");
    assert!(
        r.as_slice().chunks(PAGE_SIZE).all(is_zero),
        "the parent's range reads zero"
    );
    // SAFETY: a write of one byte from our buffer, then reaping our child.
    let status = unsafe {
        libc::write(wr, b"x".as_ptr().cast(), 1);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        st
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child lost its copy"
    );
    fill_secret(&mut r, 4);
    assert!(
        r.as_slice().iter().step_by(64).all(|b| *b != 0),
        "the range is served again"
    );
}
