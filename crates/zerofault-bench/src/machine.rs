//! What a benchmark table needs to say about the machine it was made on, so tables from two
//! machines can be told apart: kernel, CPU, core count, page size, THP and mTHP settings.

use serde_json::{json, Value};
use std::fs;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Machine {
    pub(crate) kernel: String,
    pub(crate) cpu: String,
    pub(crate) cpus: usize,
    pub(crate) page_size: usize,
    /// `/sys/kernel/mm/transparent_hugepage/enabled`, the selected word.
    pub(crate) thp_enabled: String,
    /// `.../transparent_hugepage/defrag`, the selected word.
    pub(crate) thp_defrag: String,
    /// Each mTHP size (`hugepages-<size>/enabled`) with its selected word, smallest first.
    pub(crate) mthp: Vec<(String, String)>,
}

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

/// The bracketed choice of a sysfs selector (`always [madvise] never` -> `madvise`).
fn selected(text: &str) -> Option<String> {
    let start = text.find('[')?;
    let end = text[start..].find(']')? + start;
    Some(text[start + 1..end].to_string())
}

fn read_selected(path: &str) -> String {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| selected(&s))
        .unwrap_or_else(|| "unknown".into())
}

impl Machine {
    pub(crate) fn read() -> Machine {
        let cpu = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let mut mthp: Vec<(usize, String, String)> = fs::read_dir(THP)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let size = name.strip_prefix("hugepages-")?.to_string();
                let kb: usize = size.strip_suffix("kB")?.parse().ok()?;
                // Sizes offered to shmem only have no `enabled` file: not anonymous mTHP.
                let enabled = fs::read_to_string(format!("{THP}/{name}/enabled")).ok()?;
                Some((kb, size, selected(&enabled)?))
            })
            .collect();
        mthp.sort();
        Machine {
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            cpu,
            cpus: crate::sys::online_cpus(),
            page_size: crate::sys::system_page_size(),
            thp_enabled: read_selected(&format!("{THP}/enabled")),
            thp_defrag: read_selected(&format!("{THP}/defrag")),
            mthp: mthp.into_iter().map(|(_, s, v)| (s, v)).collect(),
        }
    }

    /// mTHP sizes that are not `never`, or `none` when all are.
    pub(crate) fn mthp_text(&self) -> String {
        let on: Vec<String> = self
            .mthp
            .iter()
            .filter(|(_, v)| v != "never")
            .map(|(s, v)| format!("{s}={v}"))
            .collect();
        if self.mthp.is_empty() {
            "not offered".into()
        } else if on.is_empty() {
            "all never".into()
        } else {
            format!("{} (others never)", on.join(" "))
        }
    }

    /// One line: `Linux 6.8.0 | CPU | 2 CPUs | page 4096 B | THP ... | mTHP ...`.
    pub(crate) fn line(&self) -> String {
        format!(
            "Linux {} | {} | {} CPUs | page {} B | THP enabled={} defrag={} | mTHP {}",
            self.kernel,
            self.cpu,
            self.cpus,
            self.page_size,
            self.thp_enabled,
            self.thp_defrag,
            self.mthp_text()
        )
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "kernel": self.kernel,
            "cpu": self.cpu,
            "cpus": self.cpus,
            "page_size": self.page_size,
            "thp_enabled": self.thp_enabled,
            "thp_defrag": self.thp_defrag,
            "mthp": self.mthp.iter().map(|(s, v)| (s.clone(), Value::from(v.clone()))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_selector() {
        assert_eq!(selected("always [madvise] never\n").as_deref(), Some("madvise"));
        assert_eq!(selected("always madvise never"), None);
    }

    #[test]
    fn the_line_names_everything() {
        let m = Machine {
            kernel: "6.8.0".into(),
            cpu: "Xeon".into(),
            cpus: 2,
            page_size: 4096,
            thp_enabled: "madvise".into(),
            thp_defrag: "defer".into(),
            mthp: vec![("64kB".into(), "never".into()), ("2048kB".into(), "inherit".into())],
        };
        assert_eq!(
            m.line(),
            "Linux 6.8.0 | Xeon | 2 CPUs | page 4096 B | THP enabled=madvise defrag=defer | mTHP 2048kB=inherit (others never)"
        );
        assert_eq!(m.json()["mthp"]["64kB"], "never");
        let live = Machine::read();
        assert!(live.cpus >= 1 && live.page_size >= 4096 && !live.kernel.is_empty());
    }
}
