//! The atomics of the lock-free parts (the pool's ring indices, the page-state map's words, the
//! dirty rings' indices, the recent-faulters table, the handlers' windows in flight and their
//! `message_seq` brackets): std's, or loom's under `cfg(loom)`, so that the same code is
//! model-checked (`RUSTFLAGS="--cfg loom"`, see `.ci/run`). Syscalls stay outside what loom
//! models: under loom the rings are checked through their indices alone, and the page map only
//! with its bits inline.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize};

/// Runs a loom model of every interleaving of `f`'s threads, preempting each at most three
/// times (the bound every model of the crate uses: deep enough for the races they check, and
/// quick).
#[cfg(all(test, loom))]
pub(crate) fn loom_model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}
