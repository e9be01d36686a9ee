//! What glibc's malloc does with large blocks, as far as the shim follows it: the mmap
//! threshold its frees raise, the size it compares with it, and the environment that fixes it
//! (`malloc.rs` says why the shim follows it).

/// glibc's `DEFAULT_MMAP_THRESHOLD_MAX` on 64-bit: the largest mmap threshold its frees set.
pub const THRESHOLD_MAX: usize = 32 << 20;

/// glibc's size for a request of `size` bytes (`checked_request2size`: 8 bytes of header,
/// 16-byte aligned), which it compares with the mmap threshold: at or above it, a mapping.
pub fn request(size: usize) -> usize {
    size.saturating_add(8 + 15) & !15
}

/// glibc's mmap threshold once the program freed a mapped block of `usable` bytes: the
/// block's chunk (the request and its header, rounded up to pages), if at most
/// [`THRESHOLD_MAX`]; `None` where glibc leaves the threshold alone. (glibc raises it only
/// above its current value: the caller keeps the larger.)
pub fn threshold_after_free(usable: usize) -> Option<usize> {
    let chunk = (request(usable) + 8).next_multiple_of(engine::os::mman::PAGE_SIZE);
    (chunk <= THRESHOLD_MAX).then_some(chunk)
}

/// Whether the environment fixes glibc's mmap threshold: what glibc's `ptmalloc_init` reads,
/// each of which sets its `no_dyn_threshold` (`MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`, `MALLOC_MMAP_MAX_`, or the same in
/// `GLIBC_TUNABLES`). `var` looks a variable up.
pub fn fixed_threshold(var: impl Fn(&str) -> Option<String>) -> bool {
    const KNOBS: [&str; 4] = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "TOP_PAD", "MMAP_MAX"];
    let tunables = var("GLIBC_TUNABLES").unwrap_or_default();
    KNOBS.iter().any(|k| {
        var(&format!("MALLOC_{k}_")).is_some() || tunables.contains(&format!("glibc.malloc.{}=", k.to_lowercase()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a threshold the program fixed through the environment being raised anyway: its
    /// blocks below it would then go to glibc, which maps them every time.
    #[test]
    fn the_environment_that_fixes_glibcs_threshold_is_seen() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert!(!fixed_threshold(env(&[])));
        assert!(!fixed_threshold(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.tcache_count=0"
        )])));
        assert!(fixed_threshold(env(&[("MALLOC_MMAP_THRESHOLD_", "1048576")])));
        assert!(fixed_threshold(env(&[("MALLOC_TOP_PAD_", "0")])));
        assert!(fixed_threshold(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.check=0:glibc.malloc.mmap_max=0"
        )])));
        assert!(fixed_threshold(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.trim_threshold=1"
        )])));
    }

    /// Catches a threshold that would send the freed block's own size back to the arena, or
    /// one raised past glibc's maximum.
    #[test]
    fn a_freed_blocks_size_is_glibcs_next_threshold() {
        assert_eq!(threshold_after_free(4 << 20), Some((4 << 20) + 4096));
        assert!(
            request(4 << 20) < threshold_after_free(4 << 20).unwrap(),
            "the same request goes to the heap"
        );
        assert!(request((4 << 20) - 100) < threshold_after_free((4 << 20) - 100).unwrap());
        assert_eq!(
            threshold_after_free(32 << 20),
            None,
            "a 32 MiB block is mapped every time, as in glibc"
        );
        assert!(threshold_after_free((32 << 20) - 4096).is_some());
    }
}
