//! `zerofault stats FILE...`: the lines `ZEROFAULT_STATS=<path>` (or `json`) wrote, one JSON
//! object per process, added up: every counter summed, except those that are not sums
//! (`zerofault::Snapshot::MAXIMA`: the largest), `window_order` order by order.

use serde_json::{Map, Value};
use std::io::BufRead;

/// The fields of a process's line that are not counters.
const NOT_COUNTERS: [&str; 2] = ["pid", "program"];

/// Where a counter goes in the sum: `pages_served`, the engine's counters in their order, the
/// rest after.
fn rank(name: &str) -> usize {
    let docs = zerofault::Snapshot::DOCS;
    if name == "pages_served" {
        return 0;
    }
    docs.iter()
        .position(|(n, _)| *n == name)
        .map_or(docs.len() + 1, |i| i + 1)
}

/// The counters of several processes added up.
#[derive(Debug, Default, PartialEq)]
pub struct Sum {
    /// Objects added.
    pub processes: u64,
    /// Each counter and its total: `pages_served`, then the engine's counters in their order,
    /// then any other (a line from another version) by name.
    pub counters: Vec<(String, u64)>,
    /// `window_order`, order by order.
    pub window_order: Vec<u64>,
}

impl Sum {
    /// Adds one process's object; an error (without the place) if it is not one.
    pub fn add(&mut self, obj: &Map<String, Value>) -> Result<(), String> {
        // A sum made before (`zerofault stats --format json`) stands for its processes.
        let processes = match obj.get("processes") {
            None => 1,
            Some(v) => v.as_u64().ok_or_else(|| format!("processes is not a count: {v}"))?,
        };
        for (name, v) in obj {
            if NOT_COUNTERS.contains(&name.as_str()) || name == "processes" {
                continue;
            }
            if name == "window_order" {
                let orders = v.as_array().ok_or("window_order is not an array")?;
                if self.window_order.len() < orders.len() {
                    self.window_order.resize(orders.len(), 0);
                }
                for (i, n) in orders.iter().enumerate() {
                    let n = n.as_u64().ok_or("window_order holds something other than counts")?;
                    self.window_order[i] = self.window_order[i].saturating_add(n);
                }
                continue;
            }
            let n = v.as_u64().ok_or_else(|| format!("{name} is not a count: {v}"))?;
            let max = zerofault::Snapshot::MAXIMA.contains(&name.as_str());
            match self.counters.iter_mut().find(|(k, _)| k == name) {
                Some((_, total)) if max => *total = (*total).max(n),
                Some((_, total)) => *total = total.saturating_add(n),
                None => {
                    self.counters.push((name.clone(), n));
                    self.counters.sort_by_key(|(k, _)| rank(k));
                }
            }
        }
        self.processes = self.processes.saturating_add(processes);
        Ok(())
    }

    /// Adds every line of `input` (one object each; blank lines skipped); an error names
    /// `file:line`.
    pub fn add_lines(&mut self, file: &str, input: impl BufRead) -> Result<(), String> {
        for (i, line) in input.lines().enumerate() {
            let at = || format!("zerofault stats: {file}:{}", i + 1);
            let line = line.map_err(|e| format!("{}: {e}", at()))?;
            if line.trim().is_empty() {
                continue;
            }
            let obj = match serde_json::from_str::<Value>(&line) {
                Ok(Value::Object(o)) => o,
                Ok(_) => return Err(format!("{}: not a JSON object", at())),
                Err(e) => return Err(format!("{}: not a JSON object: {e}", at())),
            };
            self.add(&obj).map_err(|e| format!("{}: {e}", at()))?;
        }
        Ok(())
    }

    /// One total by name.
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<u64> {
        self.counters.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }

    /// `processes N`, then `name value` lines as the shim's text report.
    pub fn to_text(&self) -> String {
        let mut s = format!("{:<20} {}\n", "processes", self.processes);
        for (name, v) in &self.counters {
            s += &format!("{name:<20} {v}\n");
        }
        let orders: Vec<String> = self.window_order.iter().map(u64::to_string).collect();
        s += &format!("{:<20} {}\n", "window_order", orders.join(" "));
        s
    }

    /// One JSON object: `processes`, then the counters in the order of the lines.
    pub fn to_json(&self) -> String {
        let mut parts = vec![format!("\"processes\":{}", self.processes)];
        for (name, v) in &self.counters {
            parts.push(format!("{}:{v}", Value::String(name.clone())));
        }
        let orders: Vec<String> = self.window_order.iter().map(u64::to_string).collect();
        parts.push(format!("\"window_order\":[{}]", orders.join(",")));
        format!("{{{}}}", parts.join(","))
    }
}

/// Reads `files` (`-`: stdin), prints their sum.
///
/// # Context
/// The command's main thread.
pub fn run(files: &[String], json: bool) -> Result<(), String> {
    let mut sum = Sum::default();
    for f in files {
        if f == "-" {
            sum.add_lines("-", std::io::stdin().lock())?;
        } else {
            let file = std::fs::File::open(f).map_err(|e| format!("zerofault stats: {f}: {e}"))?;
            sum.add_lines(f, std::io::BufReader::new(file))?;
        }
    }
    if json {
        println!("{}", sum.to_json());
    } else {
        print!("{}", sum.to_text());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(text: &str) -> Result<Sum, String> {
        let mut s = Sum::default();
        s.add_lines("f", text.as_bytes()).map(|()| s)
    }

    #[test]
    fn counters_add_up_and_maxima_take_the_largest() {
        let s = sum(concat!(
            r#"{"pid":1,"program":"cc1","pages_served":10,"pages_moved":7,"zero_method":2,"zero_mbps_nt":900,"fail_open_errno":0,"window_order":[1,2]}"#,
            "\n\n  \n",
            r#"{"pid":2,"program":"as","pages_served":5,"pages_moved":0,"zero_method":3,"zero_mbps_nt":700,"fail_open_errno":14,"window_order":[0,1,4]}"#,
            "\n",
        ))
        .unwrap();
        assert_eq!(s.processes, 2);
        assert_eq!(s.get("pages_served"), Some(15));
        assert_eq!(s.get("pages_moved"), Some(7));
        assert_eq!(s.get("zero_method"), Some(3));
        assert_eq!(s.get("zero_mbps_nt"), Some(900));
        assert_eq!(s.get("fail_open_errno"), Some(14));
        assert_eq!(s.get("pid"), None);
        assert_eq!(s.window_order, [1, 3, 4]);
        let text = s.to_text();
        assert!(
            text.starts_with("processes            2\npages_served         15\n"),
            "{text}"
        );
        assert!(text.ends_with("window_order         1 3 4\n"), "{text}");
        let j: Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(j["processes"], 2);
        assert_eq!(j["pages_served"], 15);
        assert_eq!(j["zero_mbps_nt"], 900);
        assert_eq!(j["window_order"], serde_json::json!([1, 3, 4]));
        // A sum fed back in stands for its processes, and its keys stay one each.
        let again = sum(&format!("{}\n{}\n", s.to_json(), r#"{"pid":3,"pages_served":1}"#)).unwrap();
        assert_eq!((again.processes, again.get("pages_served")), (3, Some(16)));
        assert_eq!(again.get("processes"), None);
        assert_eq!(again.to_json().matches("\"processes\"").count(), 1);
    }

    /// Every `[max]` counter is taken as the largest, every other as a sum, whatever the
    /// order of the lines.
    #[test]
    fn every_counter_of_the_engine_is_summed_or_maxed() {
        let mut a = zerofault::Snapshot::default();
        let mut b = zerofault::Snapshot::default();
        a.zero_method = 5;
        b.zero_method = 2;
        a.pages_moved = 1;
        b.pages_moved = 2;
        let text = format!("{}{}", b.process_json(2, "b"), a.process_json(1, "a"));
        let s = sum(&text).unwrap();
        for (name, _) in a.fields() {
            let (x, y) = (a.fields(), b.fields());
            let (va, vb) = (
                x.iter().find(|f| f.0 == name).unwrap().1,
                y.iter().find(|f| f.0 == name).unwrap().1,
            );
            let want = if zerofault::Snapshot::MAXIMA.contains(&name) {
                va.max(vb)
            } else {
                va + vb
            };
            assert_eq!(s.get(name), Some(want), "{name}");
        }
        assert_eq!((s.get("zero_method"), s.get("pages_moved")), (Some(5), Some(3)));
    }

    #[test]
    fn a_line_that_is_not_an_object_names_file_and_line() {
        let good = r#"{"pid":1,"pages_served":1}"#;
        for (bad, why) in [
            ("[1,2]", "not a JSON object"),
            ("{\"pid\":1,", "not a JSON object"),
            ("zerofault: pages_served 3", "not a JSON object"),
            (r#"{"pages_served":-1}"#, "pages_served is not a count"),
            (r#"{"window_order":3}"#, "window_order is not an array"),
        ] {
            let e = sum(&format!("{good}\n\n{bad}\n{good}\n")).unwrap_err();
            assert!(e.starts_with("zerofault stats: f:3: "), "{e}");
            assert!(e.contains(why), "{e}");
        }
    }
}
