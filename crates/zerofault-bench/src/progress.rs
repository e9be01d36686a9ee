//! A progress bar on stderr: drawn only once a run has lasted a second, only when stderr is
//! a terminal, never with `--quiet`; it erases itself when done so the output stays clean.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

struct State {
    total: usize,
    done: AtomicUsize,
    label: Mutex<String>,
    stop: AtomicBool,
}

pub(crate) struct Progress {
    state: Arc<State>,
    drawer: Option<JoinHandle<()>>,
}

const WIDTH: usize = 30;

/// The bar line for `done` of `total` after `elapsed`.
pub(crate) fn render(done: usize, total: usize, elapsed: Duration, label: &str) -> String {
    let total = total.max(1);
    let filled = WIDTH * done.min(total) / total;
    let secs = elapsed.as_secs_f64();
    let eta = if done > 0 {
        format!(", ~{:.0}s left", secs / done as f64 * (total - done.min(total)) as f64)
    } else {
        String::new()
    };
    format!(
        "[{}{}] {done}/{total} runs, {secs:.0}s{eta}  {label}",
        "#".repeat(filled),
        " ".repeat(WIDTH - filled)
    )
}

impl Progress {
    /// A bar over `total` steps; `quiet` or a stderr that is not a terminal turns it off.
    pub(crate) fn new(total: usize, quiet: bool) -> Progress {
        let state = Arc::new(State {
            total,
            done: AtomicUsize::new(0),
            label: Mutex::new(String::new()),
            stop: AtomicBool::new(false),
        });
        let drawer = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let s = state.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut drawn = false;
                while !s.stop.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    if start.elapsed() < Duration::from_secs(1) {
                        continue;
                    }
                    let label = s.label.lock().map(|l| l.clone()).unwrap_or_default();
                    let line = render(s.done.load(Relaxed), s.total, start.elapsed(), &label);
                    // \r and erase-line: the bar stays on one line.
                    eprint!("\r\x1b[2K{line}");
                    let _ = std::io::stderr().flush();
                    drawn = true;
                }
                if drawn {
                    eprint!("\r\x1b[2K");
                }
            })
        });
        Progress { state, drawer }
    }

    /// Names the step now running.
    pub(crate) fn label(&self, text: String) {
        if let Ok(mut l) = self.state.label.lock() {
            *l = text;
        }
    }

    /// One step finished.
    pub(crate) fn step(&self) {
        self.state.done.fetch_add(1, Relaxed);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.state.stop.store(true, Relaxed);
        if let Some(h) = self.drawer.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_fills_with_the_steps() {
        let l = render(0, 4, Duration::from_secs(2), "native");
        assert!(
            l.starts_with(&format!("[{}] 0/4 runs, 2s  native", " ".repeat(WIDTH))),
            "{l}"
        );
        let l = render(2, 4, Duration::from_secs(10), "x");
        assert!(l.contains(&"#".repeat(WIDTH / 2)) && l.contains("~10s left"), "{l}");
        assert!(render(9, 4, Duration::ZERO, "").contains(&"#".repeat(WIDTH)));
    }
}
