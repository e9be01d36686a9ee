//! The knobs: one table, read from `ZEROFAULT_<NAME>` environment variables.
//!
//! Each row of the `options!` table declares a knob's name, its kind (what it accepts), its default and
//! its documentation; the struct, the parser, the printed table and the README's list are all
//! generated from it, so they never disagree. Booleans accept 1/true/yes/on and 0/false/no/off;
//! sizes accept a byte count with an optional K, M or G (binary) suffix, at most [`MAX_SIZE`].
//! No kind accepts blanks around a value: `" 64M"` is refused, not trimmed.
//!
//! A bad value is an [`OptionError`] whose message is one line naming the variable and what it
//! accepts.

use std::fmt;

pub use super::kinds::*;
use crate::sys::mman::{PAGE_SIZE, PMD_SIZE};

/// A knob value that was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionError(String);

/// The known name closest to `name` (edit distance at most a third of its length, and 1 at
/// least), for "did you mean": a misspelt knob.
fn nearest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let most = (name.len() / 3).max(1);
    known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over bytes (knob names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (diag + usize::from(ca != cb)).min(up + 1).min(row[j] + 1);
            diag = up;
        }
    }
    row[b.len()]
}

impl OptionError {
    fn bad_value(name: &str, value: &str, accepts: &str) -> OptionError {
        let blanks = if value.trim() != value {
            ", without blanks around it"
        } else {
            ""
        };
        OptionError(format!(
            "{}={value:?} is invalid: it accepts {accepts}{blanks}",
            env_name(name)
        ))
    }
    pub(crate) fn conflict(msg: String) -> OptionError {
        OptionError(msg)
    }
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OptionError {}

/// `auto` and the zeroing methods this machine has, for messages.
fn available_methods() -> String {
    let mut v = vec!["auto"];
    v.extend(
        ZeroMethod::ALL
            .into_iter()
            .filter(|m| m.available().is_ok())
            .map(|m| m.name()),
    );
    v.join(", ")
}

/// The environment variable of a knob: `max_order` -> `ZEROFAULT_MAX_ORDER`.
pub fn env_name(knob: &str) -> String {
    format!("ZEROFAULT_{}", knob.to_ascii_uppercase())
}

/// One row of the table, for printing.
#[derive(Clone, Debug)]
pub struct KnobInfo {
    /// The knob's name (`max_order`; its variable is `ZEROFAULT_MAX_ORDER`).
    pub name: &'static str,
    /// Its default value, as text.
    pub default: &'static str,
    /// What it accepts, for messages and the table.
    pub accepts: &'static str,
    /// What it does.
    pub doc: &'static str,
}

macro_rules! options {
    ($( $(#[doc = $doc:literal])+ $name:ident : $kind:ident = $default:literal, )*) => {
        /// Every knob of the engine, with its current value.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Options {
            $( $(#[doc = $doc])+ pub $name: <$kind as Kind>::Value, )*
        }

        impl Default for Options {
            fn default() -> Options {
                Options {
                    $( $name: <$kind as Kind>::parse($default).expect(concat!("default of ", stringify!($name))), )*
                }
            }
        }

        impl Options {
            /// The table: name, default, what it accepts, doc.
            pub const TABLE: &'static [KnobInfo] = &[
                $( KnobInfo {
                    name: stringify!($name),
                    default: $default,
                    accepts: <$kind as Kind>::ACCEPTS,
                    doc: concat!($($doc, "\n"),+),
                }, )*
            ];

            /// Sets one knob by name (`max_order`, `max-order` or `ZEROFAULT_MAX_ORDER`).
            pub fn set(&mut self, name: &str, value: &str) -> Result<(), OptionError> {
                match Options::canonical(name).as_str() {
                    $( stringify!($name) => {
                        self.$name = <$kind as Kind>::parse(value).ok_or_else(|| {
                            OptionError::bad_value(stringify!($name), value, <$kind as Kind>::ACCEPTS)
                        })?;
                    } )*
                    other => {
                        let known: Vec<&str> = vec![$(stringify!($name)),*];
                        let near = nearest(other, &known)
                            .map(|k| format!(" (did you mean {k}?)"))
                            .unwrap_or_default();
                        return Err(OptionError(format!(
                            "unknown knob {name:?}{near}: known knobs are {}", known.join(", ")
                        )));
                    }
                }
                Ok(())
            }

            /// Current values as (name, shown value) pairs, in table order.
            pub fn values(&self) -> Vec<(&'static str, String)> {
                vec![ $( (stringify!($name), <$kind as Kind>::show(&self.$name)), )* ]
            }

            /// Reads every `ZEROFAULT_<NAME>` through `lookup`, starting from the defaults.
            pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Options, OptionError> {
                Options::from_knobs(|knob| lookup(&env_name(knob)))
            }

            /// As [`Options::from_lookup`], with `lookup` asked by knob name (`max_order`), and
            /// no allocation unless a value is refused: the LD_PRELOAD shim reads its options in
            /// every process it is loaded into, before `main`.
            pub fn from_knobs<S: AsRef<str>>(lookup: impl Fn(&str) -> Option<S>) -> Result<Options, OptionError> {
                let mut o = Options::default();
                $( if let Some(v) = lookup(stringify!($name)) {
                    let v = v.as_ref();
                    o.$name = <$kind as Kind>::parse(v).ok_or_else(|| {
                        OptionError::bad_value(stringify!($name), v, <$kind as Kind>::ACCEPTS)
                    })?;
                } )*
                o.validate()?;
                Ok(o)
            }
        }
    };
}

options! {
    /// Serve write faults with UFFDIO_MOVE from the pre-zeroed pool. Off forces the
    /// UFFDIO_COPY path (pages zero-filled on the faulting critical path).
    pool: Bool = "on",
    /// Hard cap on the pool: address space reserved for pre-zeroed pages, the scrub's own
    /// and those recycled from memory the program freed (the most the pool keeps; it holds
    /// `scrub_stop` when the program frees nothing, and gives recycled pages back after
    /// `purge_delay`). Per node: where several NUMA nodes have memory, each has a pool of its
    /// own, and this and the scrub watermarks below apply to each.
    pool_max: Size = "2G",
    /// Serve the whole 2 MiB-aligned parts of write windows with transparent huge pages: the
    /// scrub prepares most of the pool as 2 MiB huge pages and the handler moves each with one
    /// PMD move (or prepares one itself when none is ready), where the kernel would make one
    /// (memory advised `MADV_HUGEPAGE`, any memory under THP `always`, an `Engine::map`
    /// region). Off: 4 KiB pages only. Has no effect where the system's THP setting is `never`.
    pool_thp: Bool = "on",
    /// The scrub thread starts refilling when the pool holds less than this (per node, see
    /// pool_max).
    scrub_start: Size = "32M",
    /// The scrub thread stops refilling when the pool holds this much (per node).
    scrub_stop: Size = "64M",
    /// No scrubbing while the 1-minute load average per CPU is above this (seed 003's
    /// scrub_load).
    scrub_load: Load = "off",
    /// Share the machine with this user's other processes under the shim through a state of
    /// one page in `$XDG_RUNTIME_DIR` (or /dev/shm): a scrub steps only while other processes'
    /// stepping scrubs leave a CPU to programs (at most one fewer than the CPUs step at once),
    /// and a handler polls only while other processes' stepping scrubs and polling handlers,
    /// with its own process's busy threads, fit the CPUs. A state that is missing, corrupt or not this user's
    /// alone is left alone, and the engine works as if alone. `off`: alone.
    machine: Bool = "on",
    /// Keep the pages of memory the program frees (the shim's free and munmap,
    /// `Engine::recycle`): moved into the pool, zeroed by the scrub thread, handed out again.
    /// Off: freed memory goes back to the kernel (MADV_DONTNEED).
    recycle: Bool = "on",
    /// How the scrub thread zeroes recycled pages that are not cache-hot: `kernel`
    /// (MADV_DONTNEED then MADV_POPULATE_WRITE), `stosb` (rep stosb), `nt` (non-temporal
    /// AVX-512/AVX2/SSE2 stores), `clzero` (AMD CLZERO), `dsa` (Intel DSA memory fill through a
    /// shared work queue; not run on hardware yet); `auto` measures those the machine has on
    /// the first batches and keeps the fastest. Pages freed moments ago while the
    /// backlog fits in the last-level cache are zeroed with rep stosb whatever this says
    /// (their lines are cached).
    zero_method: Method = "auto",
    /// Recycled pages the program did not take again within this long go back to the kernel,
    /// as do pool pages above scrub_stop (jemalloc's dirty decay, mimalloc's purge delay).
    purge_delay: Millis = "1s",
    /// Window order of a new sequential stream: its first fault installs 2^order pages.
    start_order: Order = "4",
    /// Orders added on each predicted (sequential) fault: the window grows 2^step times.
    order_step: Step = "2",
    /// Largest window order: at most 2^order pages are installed per fault.
    max_order: Order = "11",
    /// Windows ahead: once a stream's window has reached max_order, its faults also install
    /// the whole PMDs after the window (huge pages; zero pages for reads), as many pages as
    /// the stream has written so far, up to 2^ahead_order. `fault`: with the fault's window,
    /// before the thread is woken; `wake`: after it, while the thread writes (each huge page
    /// moved then interrupts the writer's CPU, which costs a virtual machine an exit: see
    /// docs/DESIGN.md, "Windows ahead"; with several handlers, `wake` works as `fault`).
    ahead: Ahead = "fault",
    /// Largest window ahead: 2^order pages (at least one max_order window; 15: 128 MiB).
    ahead_order: AheadOrder = "15",
    /// Unpredicted faults in a row, in one region, after which the part of the region they
    /// fell in is handed back to the kernel (unregistered); half as many, and at least 5, when
    /// one thread made them all, each 8 MiB or more from the one before (random access), and
    /// then the whole region of `Engine::map` when they spread over a quarter of it. 0 never
    /// hands back (sparse streams neither: see `probe`).
    handback_misses: Count = "8",
    /// Sparse streams go to the kernel: a new stream's first window leaves out the page after
    /// the fault's; a writer of every page faults there once more and is taken for a stream,
    /// one that goes past it untouched (twice) writes every other page or fewer. Such a stream,
    /// or one missing 5 times in a row at one stride (or going down), has its way ahead (256
    /// MiB at least) handed back to the kernel, so that its memory stays as resident as
    /// natively. `off`: first windows whole, no sparse streams (a strided first touch then
    /// fills pages it never writes).
    probe: Bool = "on",
    /// Reads before writes take pool pages: a read fault in memory the program went on to
    /// write (two pages of each read window are left on the zero page and looked at when the
    /// thread's next read fault comes past them) is served as a write would be: pool pages,
    /// huge ones for whole PMDs. Elsewhere (memory only read, read-only mappings, a range's
    /// first read window) reads map the zero page as natively. `off`: the zero page always.
    read_pool: Bool = "on",
    /// Fault handler threads reading the one userfaultfd; each serves whichever fault it
    /// reads. `auto`: one per 8 CPUs the process may run on (its affinity when the engine
    /// starts), at least 1, at most 8 (docs/SCALING.md has the measurements behind it).
    handlers: Threads = "auto",
    /// How long an idle handler keeps polling the userfaultfd after a burst of faults before
    /// it sleeps, when the burst came soon after the one before (faults close together) and
    /// the threads writing fresh memory, the handlers and the scrub threads at work leave a CPU
    /// the process may use. A handler asleep on an idle virtual CPU takes a wake-up of that CPU
    /// per fault (docs/DESIGN.md, "A short poll"); polling saves one of the two (random first
    /// touches before their hand-back, a cold stream). 0: sleep at once.
    handler_spin: Micros = "50us",
    /// Starved streams go to the kernel: when this many threads fault at once (each within
    /// 10 ms) and the huge ring could not fill the last 8 write windows of 2 MiB or more, the range being
    /// faulted is lent to the kernel (unregistered), where the kernel's own fault takes huge
    /// pages (the program's advice, or a region of `Engine::map`, advised for the loan); it
    /// is taken back once the pool holds half of scrub_stop again. `auto`: the faulting
    /// threads that outrun the engine's producers (handlers and scrubs, at most one per CPU)
    /// making each page at 1.6 times the kernel's CPU cost (docs/SCALING.md). `off`: never.
    lend_threads: Lend = "auto",
    /// Lending waits for the kernel to make huge pages fast: the handler's last staging
    /// populate (one 2 MiB huge page, within the last second) took at most this long (wall
    /// time less time spent runnable). Slower means memory a virtual machine's host took
    /// back, where the kernel's own huge-page faults are as slow and the engine stays the
    /// faster one (docs/SCALING.md, "The hand-back rule for T >= N: lending").
    lend_populate_max: Millis = "1ms",
    /// Testing only: the (first) fault handler panics on this fault event of its own (0 =
    /// never), to exercise fail-open.
    panic_after: Count = "0",
    /// LD_PRELOAD shim: anonymous private mmaps and malloc-family blocks at least this large
    /// are served by the engine; smaller ones go to the system untouched. At least one page
    /// (4K).
    preload_threshold: Size = "2M",
    /// LD_PRELOAD shim: the engine starts once the program's large requests add up to this
    /// much (or one is this large); those before it go to the system untouched, as natively.
    /// Below it the engine's start and exit cost a short program more than its faults save
    /// (docs/DESIGN.md, "A short program"). 0: at the first large request.
    start_after: Size = "16M",
    /// LD_PRELOAD shim: address space reserved (not memory used) for large malloc blocks. 0:
    /// no arena (large malloc blocks go to the next allocator); otherwise at least one block:
    /// a 4K header page plus the threshold, rounded up to 2M (4M for the default threshold).
    preload_arena: Size = "64G",
    /// LD_PRELOAD shim: the engine's counters at exit. `on`: as text on stderr, from the
    /// process that loaded the shim, for it and the children it forked, when they served
    /// something. `json`: one JSON object on one line on stderr from each process that started
    /// the engine, even one that served nothing: `{"pid":..,"program":"<comm>","pages_served":..`
    /// and every counter. A path (any value with a `/`; a relative one is resolved against
    /// the working directory of each process as it starts: use an absolute path for a fleet
    /// that changes directory): the same lines appended to that file, one write each, so
    /// that the processes of a fleet can share it; `zerofault stats FILE` adds them up. The
    /// file is opened when the report is written, with the rights the process holds then, and
    /// closed at once: a process that dropped its privileges or entered a chroot after
    /// start-up and can no longer open it writes no line and says so once on stderr. Only a
    /// regular file, never through a symbolic link (`O_NOFOLLOW`), and in a sticky directory
    /// others may write to (/tmp) only a file of the process's own user with a single link:
    /// for a file shared by several users, use a directory that is not sticky. Written at
    /// exit: a process that ends with `_exit`, a signal or an exec writes none.
    stats: StatsKind = "off",
    /// LD_PRELOAD shim: pass every call through; the program runs as without the shim.
    disable: Bool = "off",
    /// LD_PRELOAD shim: one line on stderr per process saying whether the engine started and,
    /// if not, why (userfaultfd refused, a knob refused, no request large enough).
    verbose: Bool = "off",
}

impl Options {
    /// The fault handler threads to start: `handlers`, or for `auto` one per 8 CPUs the
    /// calling thread may run on, 1 to 8.
    pub fn handler_count(&self) -> usize {
        match self.handlers {
            ThreadCount::Auto => (crate::sys::thread::allowed_cpus() / 8).clamp(1, 8),
            ThreadCount::Exactly(n) => usize::from(n),
        }
    }

    /// The faulting threads at which a starved stream is lent to the kernel (`lend_threads`),
    /// for `producers` threads making pages (handlers and scrubs) on `cpus` CPUs; `None`: never.
    /// `auto`: the engine's producers make pages at `min(producers, cpus)` CPUs' worth, each
    /// page at 8/5 of the kernel's CPU cost (docs/SCALING.md, "The hand-back rule for T >= N:
    /// lending"), while the kernel makes them on every faulting thread's CPU: it wins from
    /// `ceil(min(producers, cpus) * 5 / 8)` threads on.
    pub fn lend_at(&self, producers: usize, cpus: usize) -> Option<usize> {
        match self.lend_threads {
            LendAt::Off => None,
            LendAt::Threads(n) => Some(usize::from(n)),
            LendAt::Auto => Some((producers.min(cpus).max(1) * 5).div_ceil(8)),
        }
    }

    /// A knob's table name from any accepted spelling: `max-order`, `MAX_ORDER`,
    /// `ZEROFAULT_MAX_ORDER` -> `max_order`.
    pub fn canonical(name: &str) -> String {
        let key = name.trim().to_ascii_lowercase().replace('-', "_");
        key.strip_prefix("zerofault_").map(str::to_string).unwrap_or(key)
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Options, OptionError> {
        Options::from_lookup(|k| std::env::var(k).ok())
    }

    /// Checks the relations between knobs.
    pub fn validate(&self) -> Result<(), OptionError> {
        if self.scrub_start > self.scrub_stop {
            return Err(OptionError::conflict(format!(
                "ZEROFAULT_SCRUB_START={} is above ZEROFAULT_SCRUB_STOP={}: it accepts a size at most scrub_stop",
                show_size(self.scrub_start),
                show_size(self.scrub_stop)
            )));
        }
        if self.scrub_stop > self.pool_max {
            return Err(OptionError::conflict(format!(
                "ZEROFAULT_SCRUB_STOP={} is above ZEROFAULT_POOL_MAX={}: it accepts a size at most pool_max",
                show_size(self.scrub_stop),
                show_size(self.pool_max)
            )));
        }
        if self.start_order > self.max_order {
            return Err(OptionError::conflict(format!(
                "ZEROFAULT_START_ORDER={} is above ZEROFAULT_MAX_ORDER={}: it accepts an order at most max_order",
                self.start_order, self.max_order
            )));
        }
        if self.preload_threshold < PAGE_SIZE {
            return Err(OptionError::conflict(format!(
                "ZEROFAULT_PRELOAD_THRESHOLD={} is below one page: it accepts a size of at least 4K",
                show_size(self.preload_threshold)
            )));
        }
        if let Some(m) = self.zero_method {
            if let Err(why) = m.available() {
                return Err(OptionError::conflict(format!(
                    "ZEROFAULT_ZERO_METHOD={} is not available here: {why}; it accepts {}",
                    m.name(),
                    available_methods()
                )));
            }
        }
        let least = Options::least_preload_arena(self.preload_threshold);
        if self.preload_arena != 0 && self.preload_arena < least {
            return Err(OptionError::conflict(format!(
                "ZEROFAULT_PRELOAD_ARENA={} cannot hold one block of ZEROFAULT_PRELOAD_THRESHOLD={}: \
                 it accepts 0 (no arena) or a size of at least {} (a 4K header page plus the \
                 threshold, rounded up to 2M)",
                show_size(self.preload_arena),
                show_size(self.preload_threshold),
                show_size(least)
            )));
        }
        Ok(())
    }

    /// The smallest arena that holds one block of `threshold` bytes, the smallest request it
    /// serves: a header page plus the threshold in whole pages (see the shim's
    /// `arena::layout`), rounded up to 2 MiB as the shim rounds the arena. Cannot overflow:
    /// `threshold` is at most [`MAX_SIZE`].
    pub fn least_preload_arena(threshold: usize) -> usize {
        (PAGE_SIZE + threshold.next_multiple_of(PAGE_SIZE)).next_multiple_of(PMD_SIZE)
    }

    /// The table as Markdown, for the README (a test keeps the README's copy equal to this).
    pub fn table_markdown() -> String {
        let mut s = String::from("| variable | default | accepts | what it does |\n|---|---|---|---|\n");
        for k in Options::TABLE {
            let doc = k.doc.split_whitespace().collect::<Vec<_>>().join(" ");
            s += &format!("| `{}` | `{}` | {} | {doc} |\n", env_name(k.name), k.default, k.accepts);
        }
        s
    }

    /// The table as aligned text: one knob a line, for `zerofault options`.
    pub fn table_text() -> String {
        let mut s = String::new();
        for k in Options::TABLE {
            let doc = k.doc.split_whitespace().collect::<Vec<_>>().join(" ");
            s += &format!(
                "{:<28} default {:<6} {doc} Accepts {}.\n",
                env_name(k.name),
                k.default,
                k.accepts
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Options, OptionError> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Options::from_lookup(|k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn defaults_parse_and_validate() {
        let o = Options::default();
        o.validate().unwrap();
        assert!(o.pool);
        assert_eq!(o.scrub_stop, 64 << 20);
        assert_eq!(env(&[]).unwrap(), o);
    }

    #[test]
    fn env_values_are_read() {
        let o = env(&[
            ("ZEROFAULT_MAX_ORDER", "9"),
            ("ZEROFAULT_POOL", "off"),
            ("ZEROFAULT_SCRUB_LOAD", "0.5"),
        ])
        .unwrap();
        assert_eq!(o.max_order, 9);
        assert!(!o.pool);
        assert_eq!(o.scrub_load, Some(0.5));
    }

    #[test]
    fn bad_values_name_the_knob_and_what_it_accepts_on_one_line() {
        for (k, v, accepts) in [
            ("ZEROFAULT_MAX_ORDER", "14", "0..=13"),
            ("ZEROFAULT_MAX_ORDER", "x", "0..=13"),
            ("ZEROFAULT_POOL", "maybe", "on/off"),
            ("ZEROFAULT_POOL_MAX", "12Q", "K/M/G"),
            ("ZEROFAULT_SCRUB_LOAD", "-1", "off, or a load"),
            ("ZEROFAULT_HANDBACK_MISSES", "-3", "non-negative integer"),
        ] {
            let e = env(&[(k, v)]).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{k}=")), "{e}");
            assert!(e.contains(accepts), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn durations_and_methods_parse_and_show_back() {
        use std::time::Duration;
        for (text, ms, shown) in [
            ("1s", 1000, "1s"),
            ("250ms", 250, "250ms"),
            ("0", 0, "0ms"),
            ("1500", 1500, "1500ms"),
        ] {
            let v = Millis::parse(text).unwrap();
            assert_eq!(v, Duration::from_millis(ms), "{text}");
            assert_eq!(Millis::show(&v), shown);
            assert_eq!(Millis::parse(&Millis::show(&v)), Some(v));
        }
        for bad in ["", "s", "-1s", "1.5s", "1 s", "86401s", "1m"] {
            assert_eq!(Millis::parse(bad), None, "{bad:?}");
        }
        for (text, us, shown) in [
            ("50us", 50, "50us"),
            ("1ms", 1000, "1ms"),
            ("1s", 1_000_000, "1s"),
            ("0", 0, "0"),
            ("1500", 1500, "1500us"),
        ] {
            let v = Micros::parse(text).unwrap();
            assert_eq!(v, Duration::from_micros(us), "{text}");
            assert_eq!(Micros::show(&v), shown);
            assert_eq!(Micros::parse(&Micros::show(&v)), Some(v));
        }
        for bad in ["", "us", "-1us", "1.5ms", "2s", "1000001us", "1m"] {
            assert_eq!(Micros::parse(bad), None, "{bad:?}");
        }
        assert_eq!(Method::parse("auto"), Some(None));
        assert_eq!(Method::parse("NT"), Some(Some(ZeroMethod::Nt)));
        assert_eq!(Method::parse("dsa"), Some(Some(ZeroMethod::Dsa)));
        assert_eq!(Method::parse("warp"), None);
        assert_eq!(Method::show(&None), "auto");
    }

    #[test]
    fn relations_between_knobs_are_checked() {
        let e = env(&[("ZEROFAULT_SCRUB_START", "128M")]).unwrap_err().to_string();
        assert!(e.contains("ZEROFAULT_SCRUB_START") && e.contains("scrub_stop"), "{e}");
        let e = env(&[("ZEROFAULT_SCRUB_STOP", "4G")]).unwrap_err().to_string();
        assert!(e.contains("ZEROFAULT_POOL_MAX"), "{e}");
        // A zeroing method the machine lacks: one line naming the knob, what is missing, and
        // what it accepts here.
        for m in ZeroMethod::ALL {
            match (m.available(), env(&[("ZEROFAULT_ZERO_METHOD", m.name())])) {
                (Ok(_), r) => assert_eq!(r.unwrap().zero_method, Some(m)),
                (Err(why), r) => {
                    let e = r.unwrap_err().to_string();
                    assert!(
                        e.starts_with("ZEROFAULT_ZERO_METHOD=") && e.contains(&why.to_string()),
                        "{e}"
                    );
                    assert!(e.contains("it accepts auto, kernel") && !e.contains('\n'), "{e}");
                }
            }
        }
        let e = env(&[("ZEROFAULT_START_ORDER", "12")]).unwrap_err().to_string();
        assert!(e.contains("ZEROFAULT_MAX_ORDER"), "{e}");
    }

    #[test]
    fn set_accepts_three_spellings_and_rejects_unknown_knobs() {
        let mut o = Options::default();
        o.set("max-order", "3").unwrap();
        o.set("ZEROFAULT_START_ORDER", "1").unwrap();
        o.set("pool", "0").unwrap();
        assert_eq!((o.max_order, o.start_order, o.pool), (3, 1, false));
        let e = o.set("max_ordr", "3").unwrap_err().to_string();
        assert!(e.contains("unknown knob") && e.contains("max_order"), "{e}");
        let e = Options::default().set("max_ordr", "3").unwrap_err().to_string();
        assert!(
            e.starts_with("unknown knob \"max_ordr\" (did you mean max_order?): known knobs are "),
            "{e}"
        );
        let e = Options::default().set("zzz", "3").unwrap_err().to_string();
        assert!(e.starts_with("unknown knob \"zzz\": known knobs are "), "{e}");
        assert_eq!(edit_distance("pool_mx", "pool_max"), 1);
        assert_eq!(
            nearest("scrub_stat", &["scrub_start", "scrub_stop"]),
            Some("scrub_start")
        );
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("2MiB"), Some(2 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("1.5G"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("131072G"), Some(MAX_SIZE));
        assert_eq!(parse_size(&MAX_SIZE.to_string()), Some(MAX_SIZE));
        assert_eq!(show_size(64 << 20), "64M");
        assert_eq!(show_size(1000), "1000");
    }

    #[test]
    fn sizes_beyond_the_address_space_are_refused() {
        for v in [
            "18446744073709551615", // usize::MAX: would overflow when rounded up to 2 MiB
            "99999999999999999999G",
            "17179869184G", // 2^64 bytes: the multiplication overflows
            "131073G",
            "1048576G",        // 1 PiB
            "140737488355329", // 2^47 + 1
        ] {
            assert_eq!(parse_size(v), None, "{v}");
            for k in ["ZEROFAULT_PRELOAD_ARENA", "ZEROFAULT_POOL_MAX"] {
                let e = env(&[(k, v)]).unwrap_err().to_string();
                assert_eq!(
                    e,
                    format!("{k}={v:?} is invalid: it accepts a size in bytes with optional K/M/G suffix (e.g. 64M), at most 131072G (128 TiB)")
                );
            }
        }
        // The largest accepted size survives every rounding done with it later.
        let o = env(&[("ZEROFAULT_PRELOAD_ARENA", "131072G")]).unwrap();
        assert_eq!(o.preload_arena, MAX_SIZE);
        assert_eq!(MAX_SIZE.next_multiple_of(PMD_SIZE), MAX_SIZE);
        assert!(MAX_SIZE.checked_add(PMD_SIZE).is_some());
        assert_eq!(Options::least_preload_arena(MAX_SIZE), MAX_SIZE + PMD_SIZE);
    }

    #[test]
    fn blanks_around_a_value_are_refused_for_every_kind() {
        for (k, v) in [
            ("ZEROFAULT_POOL", "on "),
            ("ZEROFAULT_POOL", " off"),
            ("ZEROFAULT_POOL_MAX", " 64M"),
            ("ZEROFAULT_POOL_MAX", "64M\n"),
            ("ZEROFAULT_START_ORDER", "4\t"),
            ("ZEROFAULT_ORDER_STEP", " 2"),
            ("ZEROFAULT_HANDBACK_MISSES", "4\t"),
            ("ZEROFAULT_SCRUB_LOAD", " off"),
            ("ZEROFAULT_SCRUB_LOAD", "0.5 "),
        ] {
            let e = env(&[(k, v)]).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{k}={v:?} is invalid: it accepts ")), "{e}");
            assert!(e.ends_with(", without blanks around it") && !e.contains('\n'), "{e}");
        }
        // Blanks inside are refused too, as they always were for numbers.
        for (k, v) in [("ZEROFAULT_POOL_MAX", "64 M"), ("ZEROFAULT_MAX_ORDER", "1 1")] {
            let e = env(&[(k, v)]).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{k}={v:?} is invalid: it accepts ")), "{e}");
        }
        let mut o = Options::default();
        assert!(o.set("pool_max", "\t64M").is_err());
        assert!(Size::parse("64M ").is_none() && Bool::parse(" yes").is_none());
        assert!(Order::parse(" 4").is_none() && Step::parse("2 ").is_none());
        assert!(Count::parse(" 8").is_none() && Load::parse("off\t").is_none());
    }

    #[test]
    fn the_arena_holds_one_block_of_the_threshold() {
        // Default threshold 2M: a block is a 4K header page plus 2M, so the arena is 0 or 4M+.
        let e = env(&[("ZEROFAULT_PRELOAD_ARENA", "2M")]).unwrap_err().to_string();
        assert_eq!(
            e,
            "ZEROFAULT_PRELOAD_ARENA=2M cannot hold one block of ZEROFAULT_PRELOAD_THRESHOLD=2M: \
             it accepts 0 (no arena) or a size of at least 4M (a 4K header page plus the threshold, \
             rounded up to 2M)"
        );
        assert!(env(&[("ZEROFAULT_PRELOAD_ARENA", "4194303")]).is_err());
        assert_eq!(env(&[("ZEROFAULT_PRELOAD_ARENA", "0")]).unwrap().preload_arena, 0);
        assert_eq!(
            env(&[("ZEROFAULT_PRELOAD_ARENA", "4M")]).unwrap().preload_arena,
            4 << 20
        );
        // A larger threshold needs a larger arena.
        let big = [("ZEROFAULT_PRELOAD_THRESHOLD", "1G"), ("ZEROFAULT_PRELOAD_ARENA", "1G")];
        let e = env(&big).unwrap_err().to_string();
        assert!(
            e.contains("ZEROFAULT_PRELOAD_THRESHOLD=1G") && e.contains("at least 1026M"),
            "{e}"
        );
        assert!(env(&[
            ("ZEROFAULT_PRELOAD_THRESHOLD", "1G"),
            ("ZEROFAULT_PRELOAD_ARENA", "1026M")
        ])
        .is_ok());
        // The smallest threshold, a page: its blocks are two pages, and one 2M arena holds them.
        assert_eq!(Options::least_preload_arena(4096), 2 << 20);
        assert_eq!(Options::least_preload_arena(4097), 2 << 20);
        assert!(env(&[("ZEROFAULT_PRELOAD_THRESHOLD", "4K"), ("ZEROFAULT_PRELOAD_ARENA", "2M")]).is_ok());
    }

    #[test]
    fn the_threshold_is_at_least_a_page() {
        for v in ["0", "4095", "1K"] {
            let e = env(&[("ZEROFAULT_PRELOAD_THRESHOLD", v)]).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("ZEROFAULT_PRELOAD_THRESHOLD={v} is below one page: ")),
                "{e}"
            );
            assert!(e.ends_with("it accepts a size of at least 4K"), "{e}");
        }
        assert_eq!(
            env(&[("ZEROFAULT_PRELOAD_THRESHOLD", "4096")])
                .unwrap()
                .preload_threshold,
            4096
        );
    }

    #[test]
    fn stats_takes_the_bool_spellings_json_or_a_path() {
        for (v, want) in [
            ("on", StatsOut::Text),
            ("1", StatsOut::Text),
            ("YES", StatsOut::Text),
            ("true", StatsOut::Text),
            ("off", StatsOut::Off),
            ("0", StatsOut::Off),
            ("no", StatsOut::Off),
            ("false", StatsOut::Off),
            ("json", StatsOut::Json),
            ("JSON", StatsOut::Json),
            ("/tmp/zf.jsonl", StatsOut::File("/tmp/zf.jsonl".into())),
            ("./stats", StatsOut::File("./stats".into())),
            ("out/on", StatsOut::File("out/on".into())),
        ] {
            let o = env(&[("ZEROFAULT_STATS", v)]).unwrap();
            assert_eq!(o.stats, want, "{v}");
            assert_eq!(StatsKind::parse(&StatsKind::show(&o.stats)), Some(want), "{v}");
        }
        assert!(!StatsOut::Text.per_process() && StatsOut::Json.per_process());
        for bad in ["stats.jsonl", "", "jsonl", " /tmp/x", "/tmp/x "] {
            let e = env(&[("ZEROFAULT_STATS", bad)]).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("ZEROFAULT_STATS={bad:?} is invalid: it accepts off, on")),
                "{e}"
            );
            assert!(
                e.contains("json") && e.contains("containing a /") && !e.contains('\n'),
                "{e}"
            );
        }
    }

    #[test]
    fn every_knob_is_in_the_table_text() {
        let t = Options::table_text();
        for (name, _) in Options::default().values() {
            assert!(t.contains(&env_name(name)), "{name}");
        }
    }
}
