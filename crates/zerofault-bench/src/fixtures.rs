//! Fixtures the unit tests share: a machine, a row as pft would make it, arguments from a
//! string.

use crate::bench::{Base, Mode, Point, Row};
use crate::machine::Machine;
use zerofault::Snapshot;

/// Command-line arguments, split at blanks.
pub(crate) fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// A fixed machine, for the lines that name it.
pub(crate) fn machine() -> Machine {
    Machine {
        kernel: "6.8.0".into(),
        cpu: "Test CPU".into(),
        cpus: 2,
        page_size: 4096,
        thp_enabled: "madvise".into(),
        thp_defrag: "madvise".into(),
        mthp: vec![],
    }
}

/// A row of `mode` at (threads, cache lines): 1000 pages in `wall` seconds, 0.3 s of CPU;
/// engine modes carry stats, `engine` a pool fill.
pub(crate) fn row(mode: &str, threads: usize, cachelines: usize, wall: f64) -> Row {
    let mode = Mode::parse(mode).unwrap();
    let engine = matches!(mode.base, Base::Engine | Base::EngineCold);
    Row {
        fill: (mode.base == Base::Engine).then_some((0.4, 0.39)),
        stats: engine.then(|| Snapshot {
            pages_moved: 1000,
            ..Default::default()
        }),
        mode,
        at: Point { threads, cachelines },
        user: 0.1,
        sys: 0.2,
        wall,
        wall_min: wall,
        wall_max: wall * 1.1,
        pages: 1000,
        flt_per_cpu_s: 1000.0 / 0.3,
        fault_per_wsec: 1000.0 / wall,
        nodes: Vec::new(),
    }
}
