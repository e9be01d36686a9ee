//! Counters, declared once.
//!
//! The `counters!` list below generates the live struct of relaxed atomics ([`Stats`]), the
//! plain snapshot ([`Snapshot`]), its text form (one `name value` line each, like vmstat) and
//! its JSON form. Counters are only ever added to; relaxed ordering is enough because nobody
//! derives a decision from them, they are read for reporting.
//!
//! Most counters are sums: the counters of several processes add up (`zerofault stats`). Those
//! marked `[max]` are not (a method chosen, a measurement, an errno): taken together, the
//! largest stands for them all ([`Snapshot::MAXIMA`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Window orders counted separately: 0..=options::MAX_ORDER.
pub(crate) const ORDERS: usize = crate::options::MAX_ORDER as usize + 1;

macro_rules! counters {
    ($( $(#[doc = $doc:literal])+ $([$max:ident])? $name:ident, )*) => {
        /// Live counters of one engine.
        #[derive(Debug, Default)]
        pub struct Stats {
            $( $(#[doc = $doc])+ pub $name: AtomicU64, )*
            /// Windows installed, by order (2^order pages asked for).
            pub window_order: [AtomicU64; ORDERS],
        }

        /// A copy of the counters at one moment.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Snapshot {
            $( $(#[doc = $doc])+ pub $name: u64, )*
            /// Windows installed, by order (2^order pages asked for).
            pub window_order: [u64; ORDERS],
        }

        impl Stats {
            /// The counters now (each read on its own: not one atomic moment).
            ///
            /// # Context
            /// Any thread; atomic loads only.
            pub fn snapshot(&self) -> Snapshot {
                Snapshot {
                    $( $name: self.$name.load(Relaxed), )*
                    window_order: std::array::from_fn(|i| self.window_order[i].load(Relaxed)),
                }
            }
        }

        impl Snapshot {
            /// Every scalar counter as (name, value), in declaration order.
            ///
            /// # Context
            /// Any thread; reads a snapshot.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }

            /// Each counter minus the same counter of `earlier`.
            ///
            /// # Context
            /// Any thread; arithmetic only.
            pub fn since(&self, earlier: &Snapshot) -> Snapshot {
                Snapshot {
                    $( $name: self.$name.saturating_sub(earlier.$name), )*
                    window_order: std::array::from_fn(|i| self.window_order[i].saturating_sub(earlier.window_order[i])),
                }
            }

            /// The counters that are not sums (marked `[max]`): added up over processes, each
            /// takes the largest value instead.
            pub const MAXIMA: &'static [&'static str] = &[
                $( $( only_max!($max, $name), )? )*
            ];

            /// The documentation of each counter, by name.
            pub const DOCS: &'static [(&'static str, &'static str)] = &[
                $( (stringify!($name), concat!($($doc),+)), )*
            ];
        }
    };
}

/// `[max]`, the one mark a counter takes; anything else does not compile.
macro_rules! only_max {
    (max, $name:ident) => {
        stringify!($name)
    };
}

counters! {
    /// Page-fault messages read from the userfaultfd.
    fault_events,
    /// Of those, write faults.
    write_faults,
    /// Of those, read faults.
    read_faults,
    /// Pages installed with UFFDIO_MOVE from the pre-zeroed pool.
    pages_moved,
    /// Of those, 2 MiB huge pages moved whole from the pool's huge ring (one PMD each).
    huge_moves,
    /// 2 MiB huge pages the handler prepared itself and moved whole, the huge ring being empty.
    huge_made,
    /// Windows ahead begun: a confirmed stream's fault answered, pages installed ahead of it.
    ahead_windows,
    /// Pages installed ahead (whole huge pages for writes, zero pages for reads).
    ahead_pages,
    /// Windows ahead that stopped early: a fault waiting to be served, no huge page ready, a
    /// PMD holding a page table or pages already claimed, the end of the mapping, or a stop.
    ahead_stops,
    /// Whole-PMD installs that ended in 4 KiB pages (a page already present, a move refused,
    /// or the handler's own huge pages resting after a slow one): those PMDs get 4 KiB pages
    /// from then on.
    huge_fallbacks,
    /// Pages installed with UFFDIO_COPY from the zero source.
    pages_copied,
    /// Pages mapped to the shared zero page (read faults).
    pages_zero_mapped,
    /// Growths of a block (the shim's realloc, mremap) whose new part was filled from the
    /// program's thread (`Engine::fill_grown`).
    grow_fills,
    /// Pages installed so.
    grow_pages,
    /// Read windows served as writes, with pool pages (the program writes what it reads:
    /// fault/reads.rs).
    read_windows_pool,
    /// Pages those windows asked for.
    read_pages_pool,
    /// Sample pages of pool-served read windows found written when the next read fault came
    /// past them: the choice was right.
    read_samples_written,
    /// ... found still the zero page: the choice was wrong (the range's reads map the zero
    /// page again).
    read_samples_unwritten,
    /// Faults that started a new sequential stream (first fault of a thread there).
    predict_starts,
    /// Faults the predictor expected: the window grew.
    predict_hits,
    /// Faults the predictor did not expect: the window was reset.
    predict_misses,
    /// Faults on the page a new stream's first window left out (the stream writes densely).
    predict_probes,
    /// Streams found sparse (past their probe untouched, or misses at one stride): their way
    /// ahead went back to the kernel.
    sparse_streams,
    /// The program's new mappings left to the kernel, the ranges before them having all been
    /// sparse (`Engine::leaves_mapping`).
    mappings_left,
    /// Faults on a page that was already installed (a second thread on the same page, or a
    /// stale message): answered by a wake, or by a one-page install that found the page.
    already_present,
    /// Install ioctls that stopped at a page that was present without the map knowing it.
    partial_installs,
    /// Runs of the pool populated by the scrub thread (or by a prefill).
    pool_refills,
    /// Pages populated into the pool.
    pool_pages_filled,
    /// Recycle calls (`Engine::recycle`, the shim's free and munmap of served memory).
    recycle_calls,
    /// Pages moved from the program into the pool's dirty rings by those calls.
    pages_recycled,
    /// Of those, whole 2 MiB huge pages (one PMD move each).
    huge_recycled,
    /// Pages the engine had installed that a recycle discarded instead (MADV_DONTNEED): a
    /// move refused (pages shared with a forked child, an mlocked range) or the pool full.
    recycle_discarded,
    /// Recycled pages the scrub zeroed and moved into the clean rings.
    pages_scrubbed,
    /// Of those, zeroed with temporal stores because they were freed moments ago and the
    /// backlog fit in the last-level cache (seed 003's hot rule).
    pages_scrubbed_hot,
    /// CPU time the scrub spent zeroing recycled pages, in ns.
    scrub_zero_ns,
    /// Pages given back to the kernel because nobody took them within purge_delay: recycled
    /// pages that found the pool full, and pool pages above scrub_stop.
    pages_purged,
    /// Dirty 2 MiB batches of recycled 4 KiB pages traded for a huge page: given back to the
    /// kernel (counted in pages_purged too) and a huge page populated into the huge ring
    /// instead, because the handler had found that ring empty and the small ring was full
    /// enough.
    huge_traded,
    /// The method zeroing cold recycled pages: 1 kernel, 2 stosb, 3 nt, 4 clzero, 5 dsa (0 until the
    /// first batch; with zero_method=auto, the fastest timed).
    [max] zero_method,
    /// zero_method=auto's timing of `kernel` on the process's cold recycled pages, MB/s.
    [max] zero_mbps_kernel,
    /// The same for `stosb`.
    [max] zero_mbps_stosb,
    /// The same for `nt`.
    [max] zero_mbps_nt,
    /// The same for `clzero` (0 where the machine lacks it).
    [max] zero_mbps_clzero,
    /// The same for `dsa` (0 where the machine has no DSA work queue).
    [max] zero_mbps_dsa,
    /// Windows that found the pool empty (or short) and fell back to UFFDIO_COPY.
    pool_empty,
    /// Pages copied because the pool was empty.
    copy_pool_empty,
    /// Pages copied because moving is off (pool=off, the kernel has no UFFDIO_MOVE, or the pool
    /// is paused while the program runs under mlockall(MCL_FUTURE)).
    copy_no_move,
    /// Pages copied because UFFDIO_MOVE refused the pool pages (EBUSY after fork, EINVAL).
    copy_move_refused,
    /// Parts of regions handed back to the kernel after random faults.
    handbacks,
    /// Pages in the parts handed back.
    pages_handed_back,
    /// Hand-backs not made because the program released, cut or replaced the range since the
    /// fault that called for them.
    handbacks_stale,
    /// Ranges lent to the kernel while starved (`lend_threads`: as many threads faulting as
    /// the engine's producers could not outrun, and the huge ring short of their windows).
    lends,
    /// Pages in the ranges lent.
    pages_lent,
    /// Lent ranges taken back (registered again) once the pool had refilled.
    retakes,
    /// Lent ranges not taken back: the program unmapped or replaced them meanwhile, or they
    /// are no longer anonymous private memory, or registering them failed.
    retakes_dropped,
    /// UFFD_EVENT_REMOVE messages (madvise DONTNEED/FREE/REMOVE).
    events_remove,
    /// UFFD_EVENT_UNMAP messages (munmap, mmap MAP_FIXED over a region).
    events_unmap,
    /// UFFD_EVENT_REMAP messages (mremap).
    events_remap,
    /// Page states cleared by those events.
    pages_forgotten,
    /// Installs retried after reading pending events (EAGAIN from mmap_changing).
    drained_for_events,
    /// Windows refused whole because they ran past the end of the mapping (or into its
    /// PROT_NONE neighbour), then installed in pieces that fit (memory committed piece by
    /// piece with mprotect).
    windows_clipped,
    /// Times the handler failed open on an errno no install expects (then the kernel serves
    /// every fault).
    fail_opens,
    /// The errno of the first such failure (0 if none; with several engines sharing these
    /// counters, the first engine's).
    [max] fail_open_errno,
    /// Times the engine handed every fault to the kernel for good because the process came
    /// under a tracer (a debugger attached: it reads and writes memory the kernel must fill) or
    /// installed a seccomp filter.
    steps_aside,
    /// One-page installs (a fault outside every window: unknown memory, or a page already
    /// claimed) that found the memory unmapped, moved, unregistered or of other protection by
    /// then: a munmap, mremap, mprotect or hand-back raced the fault. The thread was woken and
    /// faults again (served natively, or its SIGSEGV as natively).
    installs_raced_unmap,
    /// One-page installs given up after the mappings changed under them at every retry (a
    /// stream of munmap/madvise/mremap events): the thread was woken and faults again.
    installs_raced_events,
    /// One-page installs that failed for any other reason (none is expected).
    install_errors,
    /// Faults outside every known region, served one page at a time.
    unknown_faults,
    /// CPU time of the scrub thread, in nanoseconds.
    scrub_cpu_ns,
    /// CPU time of the fault handler threads, in nanoseconds (summed over them).
    handler_cpu_ns,
    /// Bursts of messages after which a handler polled for the next (`handler_spin`).
    handler_spins,
    /// Those polls that found a message before the handler would have slept.
    handler_spin_hits,
    /// Fault events served by handlers other than the first (`handlers` above 1): how much
    /// of the work the others took.
    faults_on_other_handlers,
    /// Times a handler made a faulting thread's node its preferred one (several NUMA nodes
    /// only): its copies and huge pages then come from that node.
    numa_steers,
    /// Pool pages taken from the pool of the node a fault wanted (its policy's first node;
    /// several NUMA nodes only, like the kernel's `numa_hit`).
    numa_hit,
    /// Pool pages taken from another node's pool, the wanted node being full (`numa_miss`;
    /// each also counts as the wanted node's `foreign`, see `Engine::node_pools`).
    numa_miss,
    /// Of the hits, pages an interleave policy placed (`interleave_hit`).
    interleave_hit,
    /// Nodes a pool scan skipped because they were found full within the last second (seed
    /// 001's zonelist cache).
    zlc_skips,
    /// Nodes a pool scan found full (ring empty, node below its low mark) and marked.
    zlc_marks,
    /// Refill steps whose populate found the pool's node full (the kernel gave another node's
    /// pages, discarded) or out of memory: several NUMA nodes only.
    scrub_node_full,
    /// Windows an install stopped in, from the faulting page on (the rest left to the next
    /// fault, which the predictor expects there).
    windows_cut,
    /// Faults read by one handler on a page in the window another was installing: it waited
    /// for that install instead of putting a 4 KiB page there.
    faults_in_other_windows,
    /// Scrub rounds skipped because the load average was above scrub_load.
    scrub_load_skips,
    /// Times the scrub found no CPU to itself (it waited to run more than a quarter of the
    /// time it ran) and rested instead of working.
    scrub_rests,
    /// Times (1 ms each) the scrub put its refill off because the program was growing blocks
    /// (`grow_fills`): a populate would make each growth's `mremap` or `mprotect` wait.
    scrub_grow_waits,
    /// Times the scrub put a step off because other processes' scrubs held the CPUs the
    /// machine-wide state allows scrubs (`crate::pool::machine`).
    scrub_machine_waits,
    /// Refill steps refused because the memory cgroup's headroom, with every pool of its
    /// processes, was too small (`crate::pool::budget`).
    scrub_cgroup_skips,
    /// Times a handler did not poll because the machine's stepping scrubs and polling handlers
    /// (every process's) left no CPU beside it.
    poll_machine_skips,
    /// Handler threads that panicked (the engine then failed open).
    handler_panics,
}

/// Where an engine keeps its counters: its own, or a block the embedder hands in and may
/// share (the LD_PRELOAD shim puts one in `MAP_SHARED` memory, so that the engines of forked
/// children add to the counters their parent prints).
#[derive(Debug)]
pub(crate) enum StatsHome {
    /// The engine's own.
    Own(Box<Stats>),
    /// A block the embedder lent (see [`crate::Engine::with_stats`]).
    Lent(&'static Stats),
}

impl std::ops::Deref for StatsHome {
    type Target = Stats;
    fn deref(&self) -> &Stats {
        match self {
            StatsHome::Own(s) => s,
            StatsHome::Lent(s) => s,
        }
    }
}

/// A duration in nanoseconds, for the `*_ns` counters (saturating: 584 years).
///
/// # Context
/// Any thread; arithmetic only.
pub(crate) fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Stats {
    /// Adds `n` to a counter.
    ///
    /// # Context
    /// Any thread (a handler, a scrub, a program thread); one relaxed atomic add, never sleeps.
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Records a figure that is not a sum (a `[max]` counter: a code, a measurement, an
    /// errno): the first to record one sets it, later ones leave it.
    ///
    /// # Context
    /// Any thread; one atomic compare-exchange, never sleeps.
    #[inline]
    pub(crate) fn set_once(counter: &AtomicU64, v: u64) {
        let _ = counter.compare_exchange(0, v, Relaxed, Relaxed);
    }
}

impl Snapshot {
    /// All pages installed by the engine, whatever the method.
    ///
    /// # Context
    /// Any thread; arithmetic only.
    pub fn pages_served(&self) -> u64 {
        self.pages_moved + self.pages_copied + self.pages_zero_mapped
    }

    /// One `name value` line per counter, then the window orders.
    ///
    /// # Context
    /// A program thread (the shim's exit report, the CLI); allocates (from the engine's allocator under the shim).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for (name, v) in self.fields() {
            s += &format!("{name:<20} {v}\n");
        }
        let orders: Vec<String> = self.window_order.iter().map(u64::to_string).collect();
        s += &format!("{:<20} {}\n", "window_order", orders.join(" "));
        s
    }

    /// One process's line for `ZEROFAULT_STATS=json` or a file, newline included:
    /// `{"pid":..,"program":"..","pages_served":..,` then every counter of [`Snapshot::to_json`].
    /// `program` is escaped (a process names itself as it likes).
    ///
    /// # Context
    /// A program thread (the shim's exit report); allocates (from the engine's allocator under the shim).
    pub fn process_json(&self, pid: i32, program: &str) -> String {
        let mut name = String::with_capacity(program.len());
        for c in program.chars() {
            match c {
                '"' => name += "\\\"",
                '\\' => name += "\\\\",
                c if u32::from(c) < 0x20 || c == '\u{7f}' => name += &format!("\\u{:04x}", u32::from(c)),
                c => name.push(c),
            }
        }
        let counters = self.to_json();
        format!(
            "{{\"pid\":{pid},\"program\":\"{name}\",\"pages_served\":{},{}\n",
            self.pages_served(),
            &counters[1..]
        )
    }

    /// A JSON object with every counter and `window_order` as an array indexed by order.
    ///
    /// # Context
    /// A program thread (the shim's exit report, the CLI); allocates (from the engine's allocator under the shim).
    pub fn to_json(&self) -> String {
        let mut parts: Vec<String> = self.fields().iter().map(|(n, v)| format!("\"{n}\":{v}")).collect();
        let orders: Vec<String> = self.window_order.iter().map(u64::to_string).collect();
        parts.push(format!("\"window_order\":[{}]", orders.join(",")));
        format!("{{{}}}", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_text_and_json_carry_every_counter() {
        let s = Stats::default();
        Stats::add(&s.pages_moved, 3);
        Stats::add(&s.window_order[2], 1);
        let snap = s.snapshot();
        assert_eq!(snap.pages_moved, 3);
        let json = snap.to_json();
        let text = snap.to_text();
        for (name, _) in snap.fields() {
            assert!(json.contains(&format!("\"{name}\":")), "{name}");
            assert!(text.contains(name), "{name}");
        }
        assert!(json.contains("\"pages_moved\":3"));
        assert!(json.contains("\"window_order\":[0,0,1,"));
        assert_eq!(Snapshot::DOCS.len(), snap.fields().len());
    }

    #[test]
    fn a_process_line_is_one_json_object_with_its_name_escaped() {
        let s = Stats::default();
        Stats::add(&s.pages_moved, 3);
        Stats::add(&s.pages_zero_mapped, 2);
        let line = s.snapshot().process_json(42, "a\"b\\c\td");
        assert!(line.ends_with("}\n") && line.matches('\n').count() == 1, "{line}");
        assert!(
            line.starts_with("{\"pid\":42,\"program\":\"a\\\"b\\\\c\\u0009d\",\"pages_served\":5,\"fault_events\":0,"),
            "{line}"
        );
        assert!(
            line.contains("\"pages_moved\":3,") && line.contains("\"window_order\":[0,"),
            "{line}"
        );
    }

    /// The `[max]` counters are counters, and the ones that are not sums: a method, the
    /// measurements, an errno.
    #[test]
    fn maxima_are_the_counters_that_are_not_sums() {
        let names: Vec<&str> = Snapshot::DOCS.iter().map(|(n, _)| *n).collect();
        assert!(Snapshot::MAXIMA.iter().all(|m| names.contains(m)));
        let mut m = Snapshot::MAXIMA.to_vec();
        m.sort_unstable();
        assert_eq!(
            m,
            [
                "fail_open_errno",
                "zero_mbps_clzero",
                "zero_mbps_dsa",
                "zero_mbps_kernel",
                "zero_mbps_nt",
                "zero_mbps_stosb",
                "zero_method"
            ]
        );
    }

    #[test]
    fn since_subtracts() {
        let s = Stats::default();
        Stats::add(&s.fault_events, 5);
        let a = s.snapshot();
        Stats::add(&s.fault_events, 2);
        assert_eq!(s.snapshot().since(&a).fault_events, 2);
    }

    /// The engine's code outside this file and outside tests, comments stripped.
    fn engine_code() -> String {
        fn walk(dir: &std::path::Path, out: &mut String) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs")
                    && !p.ends_with("stats.rs")
                    && !p.ends_with("tests.rs")
                {
                    let text = std::fs::read_to_string(&p).unwrap();
                    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
                    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                        *out += line.trim();
                        *out += " ";
                    }
                }
            }
        }
        let mut out = String::new();
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
        out
    }

    /// Firecracker's `test_unused_metrics`: a counter that nothing adds to reads 0 for ever and
    /// misleads whoever reads the stats. Each must appear in a `Stats::add` (directly, or in a
    /// `match` choosing the counter) somewhere in the engine.
    #[test]
    fn every_counter_is_added_to_somewhere() {
        let code = engine_code();
        let added = |name: &str| {
            let needle = format!(".{name}");
            code.match_indices(&needle).any(|(i, _)| {
                let after = code[i + needle.len()..].chars().next();
                let whole = !after.is_some_and(|c| c.is_alphanumeric() || c == '_');
                let before = &code[i.saturating_sub(300)..i];
                whole
                    && (before.contains("Stats::add(")
                        || before.contains("set_once(")
                        || code[i + needle.len()..].starts_with(".fetch_add"))
            })
        };
        let unused: Vec<&str> = Snapshot::DOCS.iter().map(|(n, _)| *n).filter(|n| !added(n)).collect();
        assert!(unused.is_empty(), "counters nothing adds to: {unused:?}");
        assert!(added("window_order"), "window_order");
    }
}
