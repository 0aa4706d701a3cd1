//! The steps every run shares, API ([`crate::run`]) and etcd
//! ([`crate::etcd::run`]): scrape the servers' `/metrics` while the run
//! lasts, draw the progress line, hold the load for its duration (or until
//! interrupted), drain what is in flight, and at the end collect the scrapes
//! and write the result files. Each kind of run only starts its own load
//! between [`Window::open`] and [`Window::hold`], and builds its own report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::progress::Progress;
use crate::record::OpRecorder;
use crate::report::Report;
use crate::server_metrics::{Scraper, ServerMetricsSummary};
use crate::watch::WatchStats;

/// How long abandoned work may take to notice it was cancelled.
const ABANDON_GRACE: Duration = Duration::from_secs(5);

/// `--server-metrics` scrapers, running until [`Scraping::finish`].
pub(crate) struct Scraping {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<ServerMetricsSummary>>,
}

impl Scraping {
    /// Scrapes every `interval` from now on.
    pub(crate) fn start(scrapers: Vec<Scraper>, interval: Duration) -> Scraping {
        let stop = CancellationToken::new();
        let tasks = scrapers
            .into_iter()
            .map(|s| tokio::spawn(s.run(interval, stop.clone())))
            .collect();
        Scraping { stop, tasks }
    }

    /// One last scrape each, and what each saw.
    async fn finish(self) -> Vec<ServerMetricsSummary> {
        self.stop.cancel();
        let mut out = Vec::new();
        for task in self.tasks {
            if let Ok(summary) = task.await {
                out.push(summary);
            }
        }
        out
    }
}

/// A run's load window, from the clock's start to its summary.
pub(crate) struct Window {
    start: Instant,
    progress: Progress,
    scraping: Scraping,
}

/// What a window measured, for the report.
pub(crate) struct Closed {
    pub(crate) elapsed: Duration,
    pub(crate) server_metrics: Vec<ServerMetricsSummary>,
}

impl Window {
    /// The clock started at `start`; the progress line shows `recorders`.
    pub(crate) fn open(
        start: Instant,
        recorders: &[Arc<OpRecorder>],
        watch: &Arc<WatchStats>,
        duration: Duration,
        progress: bool,
        scraping: Scraping,
    ) -> Window {
        let progress =
            crate::progress::spawn(recorders.to_vec(), watch.clone(), start, duration, progress);
        Window {
            start,
            progress,
            scraping,
        }
    }

    /// Waits out the load's `duration`, or until `abort`.
    pub(crate) async fn hold(&self, duration: Duration, abort: &CancellationToken) {
        tokio::select! {
            _ = tokio::time::sleep(duration) => {}
            _ = abort.cancelled() => {}
        }
    }

    /// Lets late ticks leave and in-flight requests finish within `timeout`;
    /// then (or on `abort`) abandons them, counted as cancelled.
    pub(crate) async fn drain(
        &self,
        tracker: &TaskTracker,
        timeout: Duration,
        abort: &CancellationToken,
    ) {
        let drained = tokio::select! {
            _ = tracker.wait() => true,
            _ = tokio::time::sleep(timeout) => false,
            _ = abort.cancelled() => false,
        };
        if !drained {
            abort.cancel();
            let _ = tokio::time::timeout(ABANDON_GRACE, tracker.wait()).await;
        }
    }

    /// Clears the progress line and collects the scrapes.
    pub(crate) async fn close(self) -> Closed {
        self.progress.finish();
        let elapsed = self.start.elapsed();
        let server_metrics = self.scraping.finish().await;
        Closed {
            elapsed,
            server_metrics,
        }
    }
}

/// Writes `report` to `dir`, if a directory was asked for.
pub(crate) fn write_output(
    dir: Option<&Path>,
    report: &Report,
) -> Result<(), (PathBuf, std::io::Error)> {
    match dir {
        Some(dir) => crate::output::write_all(dir, report).map_err(|e| (dir.to_path_buf(), e)),
        None => Ok(()),
    }
}
