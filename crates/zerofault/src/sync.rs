//! The atomics of the lock-free parts (the pool's ring indices, the page-state map's words):
//! std's, or loom's under `cfg(loom)`, so that the same code is model-checked (`RUSTFLAGS="--cfg
//! loom"`, see `.ci/run`). Syscalls stay outside what loom models: under loom the ring is
//! checked through its index alone, and the page map only with its bits inline.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize};
