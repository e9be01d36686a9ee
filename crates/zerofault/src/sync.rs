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
