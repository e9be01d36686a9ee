//! The scrub's choice of stores for a dirty batch ([`MethodChoice`]): temporal ones for a batch freed
//! moments ago ([`HOT`]) while the dirty backlog fits in the last-level cache, else the cold
//! method, `zero_method` or, for `auto`, the fastest measured on the first cold batches; and the
//! stats that say what it measured and chose (see `scrub.rs`'s module docs, step 1).

use crate::pool::zero::methods::ZeroMethod;
use crate::stats::Stats;
use std::time::Duration;

/// A batch freed this recently is hot (seed 003: "moments ago"): its lines may still be in
/// the cache, if the backlog fits there.
pub(crate) const HOT: Duration = Duration::from_millis(10);

/// Bytes of cold batches `auto` zeroes with each method before it keeps the fastest.
const TRIAL_BYTES: u64 = 8 << 20;

/// The method for cold batches: the knob's, or `auto`'s measurement (see the module's docs).
#[derive(Debug)]
pub(crate) struct MethodChoice {
    chosen: Option<ZeroMethod>,
    /// `auto` only: (method, bytes zeroed, CPU time) per available method.
    trials: Vec<(ZeroMethod, u64, Duration)>,
    /// Bytes of dirty backlog that still count as cache-hot.
    llc: usize,
}

impl MethodChoice {
    /// # Context
    /// The scrub thread.
    pub(crate) fn new(knob: Option<ZeroMethod>, llc: usize, stats: &Stats) -> MethodChoice {
        let trials = match knob {
            Some(m) => {
                Stats::set_once(&stats.zero_method, code(m));
                vec![]
            }
            None => ZeroMethod::ALL
                .into_iter()
                .filter(|m| m.available().is_ok())
                .map(|m| (m, 0, Duration::ZERO))
                .collect(),
        };
        MethodChoice {
            chosen: knob,
            trials,
            llc,
        }
    }

    /// The method for the next cold batch.
    ///
    /// # Context
    /// The scrub thread.
    pub(crate) fn cold(&self) -> ZeroMethod {
        self.chosen.unwrap_or_else(|| {
            self.trials
                .iter()
                .min_by_key(|t| t.1)
                .map_or(ZeroMethod::Stosb, |t| t.0)
        })
    }

    /// A cold batch of `bytes` took `cpu` with `m`. Once every method has had its share,
    /// `auto` keeps the fastest and the stats say what each did.
    ///
    /// # Context
    /// The scrub thread.
    pub(crate) fn record(&mut self, m: ZeroMethod, bytes: u64, cpu: Duration, stats: &Stats) {
        if self.chosen.is_some() {
            return;
        }
        if let Some(t) = self.trials.iter_mut().find(|t| t.0 == m) {
            t.1 += bytes;
            t.2 += cpu;
        }
        if self.trials.iter().any(|t| t.1 < TRIAL_BYTES) {
            return;
        }
        let mbps = |t: &(ZeroMethod, u64, Duration)| t.1 as f64 / t.2.as_secs_f64().max(1e-9) / 1e6;
        for t in &self.trials {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "MB/s, small")]
            let v = mbps(t) as u64;
            Stats::set_once(
                match t.0 {
                    ZeroMethod::Kernel => &stats.zero_mbps_kernel,
                    ZeroMethod::Stosb => &stats.zero_mbps_stosb,
                    ZeroMethod::Nt => &stats.zero_mbps_nt,
                    ZeroMethod::Clzero => &stats.zero_mbps_clzero,
                    ZeroMethod::Dsa => &stats.zero_mbps_dsa,
                },
                v,
            );
        }
        let best = self
            .trials
            .iter()
            .max_by(|a, b| mbps(a).total_cmp(&mbps(b)))
            .map_or(ZeroMethod::Stosb, |t| t.0);
        Stats::set_once(&stats.zero_method, code(best));
        self.chosen = Some(best);
    }

    /// Whether a batch stamped `age` ago, with `backlog` dirty bytes in all, is hot.
    ///
    /// # Context
    /// The scrub thread.
    pub(crate) fn is_hot(&self, age: Duration, backlog: usize) -> bool {
        age < HOT && backlog <= self.llc
    }
}

/// The `zero_method` counter's code of a method.
fn code(m: ZeroMethod) -> u64 {
    match m {
        ZeroMethod::Kernel => 1,
        ZeroMethod::Stosb => 2,
        ZeroMethod::Nt => 3,
        ZeroMethod::Clzero => 4,
        ZeroMethod::Dsa => 5,
    }
}
