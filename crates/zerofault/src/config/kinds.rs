//! The kinds of knob values: how each is parsed, shown and described ([`Kind`]), the enums
//! some knobs take, and the size bounds and parser they share. The table of knobs itself is
//! `options.rs`.

use std::fmt;

/// One kind of knob value: how it is parsed, shown, and described.
pub trait Kind {
    /// The parsed value.
    type Value: Clone + fmt::Debug + PartialEq;
    /// What the knob accepts, for error messages and the table ("an integer 0..=13").
    const ACCEPTS: &'static str;
    /// Parses a value, or `None` when it is not one this kind accepts.
    fn parse(s: &str) -> Option<Self::Value>;
    /// A value as the table shows it (and as `parse` accepts it back).
    fn show(v: &Self::Value) -> String;
}

/// on/off.
pub struct Bool;
impl Kind for Bool {
    type Value = bool;
    const ACCEPTS: &'static str = "on/off (1/0, true/false, yes/no)";
    fn parse(s: &str) -> Option<bool> {
        const ON: [&str; 4] = ["1", "true", "yes", "on"];
        const OFF: [&str; 4] = ["0", "false", "no", "off"];
        let is = |words: [&str; 4]| words.iter().any(|w| w.eq_ignore_ascii_case(s));
        // No allocation: the shim parses its options in every process it is loaded into.
        if is(ON) {
            Some(true)
        } else if is(OFF) {
            Some(false)
        } else {
            None
        }
    }
    fn show(v: &bool) -> String {
        if *v { "on" } else { "off" }.into()
    }
}

/// A byte size, page aligned on use, at most [`MAX_SIZE`].
pub struct Size;
impl Kind for Size {
    type Value = usize;
    const ACCEPTS: &'static str = "a size in bytes with optional K/M/G suffix (e.g. 64M), at most 131072G (128 TiB)";
    fn parse(s: &str) -> Option<usize> {
        parse_size(s)
    }
    fn show(v: &usize) -> String {
        show_size(*v)
    }
}

/// A window order: 2^order pages.
pub struct Order;
impl Kind for Order {
    type Value = u8;
    const ACCEPTS: &'static str = "an integer order 0..=13 (a window of 2^order pages)";
    fn parse(s: &str) -> Option<u8> {
        s.parse::<u8>().ok().filter(|o| *o <= MAX_ORDER)
    }
    fn show(v: &u8) -> String {
        v.to_string()
    }
}

/// The order of a window ahead: up to 2^18 pages (1 GiB).
pub struct AheadOrder;
impl Kind for AheadOrder {
    type Value = u8;
    const ACCEPTS: &'static str = "an integer order 0..=18 (a window ahead of 2^order pages, at most 1 GiB)";
    fn parse(s: &str) -> Option<u8> {
        s.parse::<u8>().ok().filter(|o| *o <= MAX_AHEAD_ORDER)
    }
    fn show(v: &u8) -> String {
        v.to_string()
    }
}

/// Orders added per predicted fault.
pub struct Step;
impl Kind for Step {
    type Value = u8;
    const ACCEPTS: &'static str = "an integer 0..=13 (orders added per predicted fault)";
    fn parse(s: &str) -> Option<u8> {
        Order::parse(s)
    }
    fn show(v: &u8) -> String {
        v.to_string()
    }
}

/// A non-negative count.
pub struct Count;
impl Kind for Count {
    type Value = u64;
    const ACCEPTS: &'static str = "a non-negative integer";
    fn parse(s: &str) -> Option<u64> {
        s.parse().ok()
    }
    fn show(v: &u64) -> String {
        v.to_string()
    }
}

/// How many threads to start: chosen from the CPUs the process may run on, or a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadCount {
    /// Chosen from the CPUs the process may run on.
    Auto,
    /// This many, 1 to 32.
    Exactly(u8),
}

/// A thread count, or `auto` ([`ThreadCount`]).
pub struct Threads;
impl Kind for Threads {
    type Value = ThreadCount;
    const ACCEPTS: &'static str = "auto, or an integer 1..=32";
    fn parse(s: &str) -> Option<ThreadCount> {
        if s.eq_ignore_ascii_case("auto") {
            return Some(ThreadCount::Auto);
        }
        s.parse::<u8>()
            .ok()
            .filter(|n| (1..=32).contains(n))
            .map(ThreadCount::Exactly)
    }
    fn show(v: &ThreadCount) -> String {
        match v {
            ThreadCount::Auto => "auto".into(),
            ThreadCount::Exactly(n) => n.to_string(),
        }
    }
}

/// From how many threads faulting at once a starved stream is lent to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LendAt {
    /// From the model in docs/SCALING.md ("The hand-back rule for T >= N: lending").
    Auto,
    /// Never.
    Off,
    /// From this many threads, 1 to 4096.
    Threads(u16),
}

/// A count of faulting threads, `auto` or `off` ([`LendAt`]).
pub struct Lend;
impl Kind for Lend {
    type Value = LendAt;
    const ACCEPTS: &'static str = "auto, off, or an integer 1..=4096 (threads faulting at once)";
    fn parse(s: &str) -> Option<LendAt> {
        if s.eq_ignore_ascii_case("auto") {
            return Some(LendAt::Auto);
        }
        if s.eq_ignore_ascii_case("off") {
            return Some(LendAt::Off);
        }
        s.parse::<u16>()
            .ok()
            .filter(|n| (1..=4096).contains(n))
            .map(LendAt::Threads)
    }
    fn show(v: &LendAt) -> String {
        match v {
            LendAt::Auto => "auto".into(),
            LendAt::Off => "off".into(),
            LendAt::Threads(n) => n.to_string(),
        }
    }
}

/// A load-average threshold per CPU, or off.
pub struct Load;
impl Kind for Load {
    type Value = Option<f64>;
    const ACCEPTS: &'static str = "off, or a load average per CPU greater than 0 (e.g. 0.8)";
    fn parse(s: &str) -> Option<Option<f64>> {
        if s.eq_ignore_ascii_case("off") {
            return Some(None);
        }
        s.parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0).map(Some)
    }
    fn show(v: &Option<f64>) -> String {
        v.map_or("off".into(), |x| x.to_string())
    }
}

/// Digits followed by the first of `units` (suffix, base units it stands for) that `s` ends
/// with, or bare digits in base units; at most `max` base units.
fn scaled(s: &str, units: &[(&str, u64)], max: u64) -> Option<u64> {
    let (digits, scale) = units
        .iter()
        .find_map(|&(unit, scale)| s.strip_suffix(unit).map(|d| (d, scale)))
        .unwrap_or((s, 1));
    let n: u64 = digits.parse().ok()?;
    n.checked_mul(scale).filter(|v| *v <= max)
}

/// A duration: milliseconds (`500ms`, `500`) or seconds (`2s`), at most a day.
pub struct Millis;
impl Kind for Millis {
    type Value = std::time::Duration;
    const ACCEPTS: &'static str = "a duration in ms or s (e.g. 500ms, 2s, 0), at most 86400s";
    fn parse(s: &str) -> Option<std::time::Duration> {
        scaled(s, &[("ms", 1), ("s", 1_000)], 86_400_000).map(std::time::Duration::from_millis)
    }
    fn show(v: &std::time::Duration) -> String {
        let ms = v.as_millis();
        if ms != 0 && ms % 1000 == 0 {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    }
}

/// A short duration: microseconds (`30us`), milliseconds (`1ms`) or seconds (`1s`), at most a
/// second.
pub struct Micros;
impl Kind for Micros {
    type Value = std::time::Duration;
    const ACCEPTS: &'static str = "a duration in us, ms or s (e.g. 30us, 1ms, 0), at most 1s";
    fn parse(s: &str) -> Option<std::time::Duration> {
        scaled(s, &[("us", 1), ("ms", 1_000), ("s", 1_000_000)], 1_000_000).map(std::time::Duration::from_micros)
    }
    fn show(v: &std::time::Duration) -> String {
        let us = v.as_micros();
        match us {
            0 => "0".into(),
            _ if us % 1_000_000 == 0 => format!("{}s", us / 1_000_000),
            _ if us % 1_000 == 0 => format!("{}ms", us / 1_000),
            _ => format!("{us}us"),
        }
    }
}

/// When a confirmed stream's window ahead goes in (see `fault/ahead.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AheadMode {
    /// No window ahead: every window is at most 2^max_order pages.
    Off,
    /// With the fault's own window, before the thread is woken.
    Fault,
    /// After the thread is woken, while it writes.
    Wake,
}

/// A [`AheadMode`].
pub struct Ahead;
impl Kind for Ahead {
    type Value = AheadMode;
    const ACCEPTS: &'static str = "off, fault (with the fault's window, before the wake) or wake (after it)";
    fn parse(s: &str) -> Option<AheadMode> {
        [AheadMode::Off, AheadMode::Fault, AheadMode::Wake]
            .into_iter()
            .find(|m| Ahead::show(m).eq_ignore_ascii_case(s))
    }
    fn show(v: &AheadMode) -> String {
        match v {
            AheadMode::Off => "off",
            AheadMode::Fault => "fault",
            AheadMode::Wake => "wake",
        }
        .into()
    }
}

/// One way of zeroing memory (the `zero_method` knob's value; what each does and whether
/// the machine has it: `pool/zero/methods.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroMethod {
    /// The kernel frees and repopulates the pages.
    Kernel,
    /// `rep stosb`.
    Stosb,
    /// Non-temporal vector stores, one fence per call.
    Nt,
    /// AMD CLZERO, one fence per call.
    Clzero,
    /// Intel DSA memory fill through a shared work queue (`pool/zero/dsa.rs`; not run on hardware).
    Dsa,
}

impl ZeroMethod {
    /// Every method, in the order tables show them.
    pub const ALL: [ZeroMethod; 5] = [
        ZeroMethod::Kernel,
        ZeroMethod::Stosb,
        ZeroMethod::Nt,
        ZeroMethod::Clzero,
        ZeroMethod::Dsa,
    ];

    /// The method's name, as `zero_method` will accept it.
    pub fn name(self) -> &'static str {
        match self {
            ZeroMethod::Kernel => "kernel",
            ZeroMethod::Stosb => "stosb",
            ZeroMethod::Nt => "nt",
            ZeroMethod::Clzero => "clzero",
            ZeroMethod::Dsa => "dsa",
        }
    }
}

/// A zeroing method for recycled pages, or `auto` (`None`): each timed, the fastest kept.
pub struct Method;
impl Kind for Method {
    type Value = Option<ZeroMethod>;
    const ACCEPTS: &'static str = "auto, kernel, stosb, nt, clzero or dsa (where the machine has it)";
    fn parse(s: &str) -> Option<Self::Value> {
        if s.eq_ignore_ascii_case("auto") {
            return Some(None);
        }
        ZeroMethod::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .map(Some)
    }
    fn show(v: &Self::Value) -> String {
        v.map_or("auto", |m| m.name()).into()
    }
}

/// Where the LD_PRELOAD shim reports the engine's counters at exit (the `stats` knob).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatsOut {
    /// No report.
    Off,
    /// `on`: text on stderr, from the process that loaded the shim, for it and the children it
    /// forked, when they served something.
    Text,
    /// `json`: one JSON object on one line on stderr, from each process that started the engine.
    Json,
    /// A path: one JSON object a line appended to this file, from each process that started
    /// the engine.
    File(String),
}

impl StatsOut {
    /// Whether any report is asked for.
    pub fn is_on(&self) -> bool {
        *self != StatsOut::Off
    }

    /// Whether each process reports its own counters as one JSON line (`json` or a file).
    pub fn per_process(&self) -> bool {
        matches!(self, StatsOut::Json | StatsOut::File(_))
    }
}

/// A [`StatsOut`]: the on/off spellings of [`Bool`] (on is the text report), `json`, or a path
/// (anything with a `/`).
pub struct StatsKind;
impl Kind for StatsKind {
    type Value = StatsOut;
    const ACCEPTS: &'static str = "off, on (1/0, true/false, yes/no: the text report), json (one JSON line \
         a process on stderr) or a file path containing a / (e.g. ./stats.jsonl or /tmp/zf.jsonl: one JSON \
         line a process appended to it)";
    fn parse(s: &str) -> Option<StatsOut> {
        if s.eq_ignore_ascii_case("json") {
            return Some(StatsOut::Json);
        }
        if let Some(on) = Bool::parse(s) {
            return Some(if on { StatsOut::Text } else { StatsOut::Off });
        }
        // A path: allocated only when one is given. No blanks around it, as for every kind.
        (s.contains('/') && s.trim() == s && !s.contains('\0')).then(|| StatsOut::File(s.to_string()))
    }
    fn show(v: &StatsOut) -> String {
        match v {
            StatsOut::Off => "off".into(),
            StatsOut::Text => "on".into(),
            StatsOut::Json => "json".into(),
            StatsOut::File(p) => p.clone(),
        }
    }
}

/// The largest order start_order and max_order accept: 8192 pages, 32 MiB (ahead_order has its
/// own, [`MAX_AHEAD_ORDER`]).
pub const MAX_ORDER: u8 = 13;
/// The largest `ahead_order`: 2^18 pages, 1 GiB.
pub const MAX_AHEAD_ORDER: u8 = 18;

/// The largest size any knob accepts: 2^47 bytes (128 TiB), the whole user address space of
/// x86-64 with 4-level page tables. A multiple of 2 MiB, so rounding an accepted size up to
/// pages or to 2 MiB cannot overflow (nor can adding a 2 MiB alignment slack to it).
pub const MAX_SIZE: usize = 1 << 47;

/// Parses `123`, `64K`, `2M`, `1G` (binary units, optional trailing `B`/`iB`), at most
/// [`MAX_SIZE`]; no blanks anywhere.
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.strip_suffix("iB").or_else(|| s.strip_suffix('B')).unwrap_or(s);
    let (digits, shift) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 10),
        'm' | 'M' => (&s[..s.len() - 1], 20),
        'g' | 'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: usize = digits.parse().ok()?;
    n.checked_mul(1usize << shift).filter(|&v| v <= MAX_SIZE)
}

/// Shows a size with the largest exact binary suffix.
pub fn show_size(v: usize) -> String {
    for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] {
        if v != 0 && v % (1 << shift) == 0 {
            return format!("{}{suffix}", v >> shift);
        }
    }
    v.to_string()
}
