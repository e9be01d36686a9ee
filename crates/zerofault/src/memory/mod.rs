//! The memory the engine serves: the registered ranges and the [`region::Region`] handle
//! (`region.rs`), each range's per-page state (`pagemap.rs`) and per-PMD state (`pmds.rs`).
//! It imports no other subsystem's folder: the fault path, the pool and the give-back read and
//! change these records.

pub(crate) mod nodes;
pub(crate) mod pagemap;
pub(crate) mod pmds;
pub(crate) mod ranges;
pub(crate) mod region;
