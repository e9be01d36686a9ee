//! Zero bytes: where the copy path takes them from (`source.rs`, the zero page mapped
//! read-only), and the ways the scrub zeroes recycled pages (`methods.rs`, [`ZeroMethod`];
//! Intel DSA's memory fill in `dsa.rs`).

pub(crate) mod choice;
pub(crate) mod dsa;
pub(crate) mod methods;
pub(crate) mod source;

pub use methods::{Unavailable, ZeroMethod};
pub use source::is_zero;
