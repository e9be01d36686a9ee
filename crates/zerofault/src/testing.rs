//! Helpers the engine's unit tests share.

use crate::fault::window::Tuning;

/// The window knobs' defaults (start order 4, step 2, max order 11).
pub(crate) const TUNING: Tuning = Tuning {
    start_order: 4,
    order_step: 2,
    max_order: 11,
};

/// A small deterministic generator (a 64-bit LCG, Knuth's constants; no dependencies).
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    /// The next value (the state's high bits).
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 17
    }

    /// A value below `n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
