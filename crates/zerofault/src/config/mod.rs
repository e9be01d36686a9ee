//! The configuration: the knobs (`options.rs`, read from `ZEROFAULT_<NAME>`) and the kinds
//! of values they take (`kinds.rs`). It imports nothing of the engine's but `sys`'s page
//! sizes and CPU count.

pub(crate) mod kinds;
pub mod options;
