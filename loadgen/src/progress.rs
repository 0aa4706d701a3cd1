//! The live progress line (indicatif): elapsed, achieved rate, p99, errors and
//! 429s per operation. Hidden when stdout is not a terminal.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::record::{ms, OpRecorder};
use crate::watch::WatchStats;

/// A running progress line; `finish` clears it.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    task: JoinHandle<()>,
}

impl Progress {
    /// Stops updating and clears the line.
    pub fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

/// Starts updating once a second; draws nothing unless `enabled` and stdout is a tty.
pub fn spawn(
    recorders: Vec<Arc<OpRecorder>>,
    watch: Arc<WatchStats>,
    start: Instant,
    duration: Duration,
    enabled: bool,
) -> Progress {
    let bar = ProgressBar::new(duration.as_secs().max(1));
    if !(enabled && std::io::stdout().is_terminal()) {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} {elapsed_precise}/{duration_precise} {msg}")
    {
        bar.set_style(style);
    }
    let b = bar.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let secs = start.elapsed().as_secs_f64().max(1e-3);
            let mut parts = Vec::new();
            for r in &recorders {
                let s = r.snapshot();
                let p99 = if s.latency.is_empty() {
                    0.0
                } else {
                    ms(s.latency.value_at_quantile(0.99))
                };
                parts.push(format!(
                    "{} {:.1}/s p99 {:.0}ms err {} 429 {}",
                    r.name(),
                    s.requests as f64 / secs,
                    p99,
                    s.errors(),
                    s.rejected_429()
                ));
            }
            let active = watch.active.load(Ordering::Relaxed);
            if active > 0 {
                parts.push(format!("watches {active}"));
            }
            b.set_position(start.elapsed().as_secs());
            b.set_message(parts.join(" | "));
        }
    });
    Progress { bar, task }
}
