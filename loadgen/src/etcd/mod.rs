//! `loadgen etcd`: load etcd directly, without an apiserver in front — range
//! reads over a prefix (Tess.IO's "avoid queries with large range"), puts of
//! pod-sized values, watches — recorded exactly like the API operations (open
//! loop, latency from each request's intended start, the same `summary.json`,
//! `perfdata.json` and table).
//!
//! # Layout
//! - [`value`]: the values written (stamped with their send time, padded to size).
//! - `connect`: one client (one HTTP/2 connection) per operation, the reachability check, error mapping.
//! - `seed`: preloading N keys under the range prefix before the clock starts.
//! - `drive`: the open-loop driver of ranges and puts.
//! - `watch`: watchers that time each event from the stamp in its value.
//! - `summary`: the [`crate::Report`] of a run.
//!
//! Operation names: `etcd-range`, `etcd-put`, `etcd-watch` (one record per
//! stamped event delivered, per watcher). gRPC outcomes are counted under
//! HTTP status codes (OK → 200, ResourceExhausted → 429, Unavailable → 503,
//! DeadlineExceeded → 504, …, as grpc-gateway maps them) so the report's
//! schema is the API runs' own; a failed connection is a `connection` error.

mod connect;
mod drive;
mod seed;
mod summary;
pub mod value;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::rate::Rate;
use crate::record::OpRecorder;
use crate::report::Report;
use crate::schedule::ScheduleKind;
use crate::window::{write_output, Scraping, Window};

/// Operation names in the report.
pub const OP_RANGE: &str = "etcd-range";
pub const OP_PUT: &str = "etcd-put";
pub const OP_WATCH: &str = "etcd-watch";

/// Where `--seed` keys go, under the range prefix.
pub const SEED_DIR: &str = "loadgen-seed/";

/// A `loadgen etcd` run, typed; built by [`crate::cli::etcd::EtcdArgs::into_config`] or by hand.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// `http://HOST:PORT` client URLs.
    pub endpoints: Vec<String>,
    pub duration: Duration,
    pub schedule: ScheduleKind,
    pub max_in_flight: usize,
    pub timeout: Duration,
    pub drain_timeout: Duration,
    pub ranges: Option<RangeSpec>,
    pub puts: Option<PutSpec>,
    pub watches: Option<WatchSpec>,
    pub seed: Option<SeedSpec>,
    pub output: Option<PathBuf>,
    pub server_metrics: Vec<String>,
    pub server_metrics_interval: Duration,
    pub progress: bool,
}

/// `--ranges`: reads of a whole prefix (or its first `limit` keys).
#[derive(Debug, Clone)]
pub struct RangeSpec {
    pub rate: Rate,
    pub prefix: String,
    /// 0 = no limit.
    pub limit: u64,
    pub serializable: bool,
    pub keys_only: bool,
    pub count_only: bool,
}

/// `--puts`: put `i` writes `prefix` + `i mod keys`, `size` bytes.
#[derive(Debug, Clone)]
pub struct PutSpec {
    pub rate: Rate,
    pub prefix: String,
    pub size: usize,
    pub keys: u64,
}

/// `--watches`: `count` watches on `prefix`.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub count: u64,
    pub prefix: String,
}

/// `--seed`: `count` keys of `size` bytes under `prefix`.
#[derive(Debug, Clone)]
pub struct SeedSpec {
    pub count: u64,
    pub size: usize,
    pub prefix: String,
}

/// Why an etcd run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("--{flag}: {message}")]
    Invalid { flag: &'static str, message: String },
    #[error("nothing to do: give at least one of --ranges, --puts, --watches, --seed")]
    NothingToDo,
    #[error("cannot reach etcd at {endpoints}: {reason}")]
    Unreachable { endpoints: String, reason: String },
    #[error("seeding {prefix}: {reason}")]
    Seed { prefix: String, reason: String },
    #[error("--server-metrics {url}: {reason}")]
    ServerMetrics { url: String, reason: String },
    #[error("interrupted before the load started")]
    Interrupted,
    #[error("writing results to {dir}")]
    Output {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Runs `config` until `--duration` ends or `shutdown` is cancelled and
/// returns what was measured; results are written to `config.output` if set
/// (also after an interruption).
pub async fn run(config: EtcdConfig, shutdown: CancellationToken) -> Result<Report, EtcdError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let check = connect::client(&config.endpoints, config.timeout);
    let first = tokio::select! {
        r = check => r?,
        _ = shutdown.cancelled() => return Err(EtcdError::Interrupted),
    };
    if let Some(spec) = &config.seed {
        tokio::select! {
            r = seed::seed(first.clone(), spec, config.timeout) => {
                let written = r?;
                tracing::info!(prefix = %spec.prefix, written, "seeded");
            }
            _ = shutdown.cancelled() => return Err(EtcdError::Interrupted),
        }
    }
    let scrapers = config
        .server_metrics
        .iter()
        .map(|url| scraper(url))
        .collect::<Result<Vec<_>, _>>()?;

    let watch_stats = Arc::new(crate::watch::WatchStats::default());
    let watch_end = watch::End::default();
    // A signal ends the schedule; `abort` ends what is in flight when the drain times out.
    let abort = CancellationToken::new();
    let tracker = TaskTracker::new();
    let mut recorders = Vec::new();
    // Connected before the clock starts, so the first ticks do not wait for a handshake.
    // Own connections: a 100 MB range must not hold up the puts' responses on a
    // shared HTTP/2 connection (that would be loadgen's contention, not etcd's).
    let range_client = match &config.ranges {
        Some(_) => Some(connect::client(&config.endpoints, config.timeout).await?),
        None => None,
    };
    let put_client = match &config.puts {
        Some(_) => Some(connect::client(&config.endpoints, config.timeout).await?),
        None => None,
    };
    // The recorders' seconds count from `start`, set once the watches are up.
    let mut start = Instant::now();
    if let Some(spec) = &config.watches {
        let watching = start_watches(&config, spec, &watch_stats, &tracker, &watch_end);
        let (started, rec) = tokio::select! {
            r = watching => r?,
            _ = shutdown.cancelled() => return Err(EtcdError::Interrupted),
        };
        start = started;
        recorders.push(rec);
    }
    let started_at = crate::ops::unix_nanos();
    let scraping = Scraping::start(scrapers, config.server_metrics_interval);
    let drivers = start_drivers(
        &config,
        range_client,
        put_client,
        start,
        [&shutdown, &abort],
        &mut recorders,
    );
    tracker.close();
    let window = Window::open(
        start,
        &recorders,
        &watch_stats,
        config.duration,
        config.progress,
        scraping,
    );
    let no_load = config.ranges.is_none() && config.puts.is_none() && config.watches.is_none();
    if !no_load {
        window.hold(config.duration, &shutdown).await;
    }
    window.drain(&drivers, config.drain_timeout, &abort).await;
    if config.watches.is_some() {
        finish_watches(&first, &watch_end, &tracker, shutdown.is_cancelled()).await;
    }
    watch_end.stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), tracker.wait()).await;
    let closed = window.close().await;
    let mut report = summary::build(
        &config,
        started_at,
        closed.elapsed,
        shutdown.is_cancelled(),
        &recorders,
        &watch_stats,
    );
    report.server_metrics = closed.server_metrics;
    write_output(config.output.as_deref(), &report)
        .map_err(|(dir, source)| EtcdError::Output { dir, source })?;
    Ok(report)
}

/// The open-loop drivers of ranges and puts, each on its own connection;
/// their recorders go first in `recorders` (ranges, then puts).
fn start_drivers(
    config: &EtcdConfig,
    range_client: Option<etcd_client::Client>,
    put_client: Option<etcd_client::Client>,
    start: Instant,
    tokens: [&CancellationToken; 2],
    recorders: &mut Vec<Arc<OpRecorder>>,
) -> TaskTracker {
    let drivers = TaskTracker::new();
    if let (Some(spec), Some(client)) = (&config.ranges, &range_client) {
        let rec = Arc::new(OpRecorder::new(OP_RANGE, start));
        recorders.insert(0, rec.clone());
        let op = drive::Op::Range {
            kv: connect::kv(client),
            spec: spec.clone(),
        };
        drivers.spawn(drive::drive(op, spec.rate, ctx(config, start, tokens), rec));
    }
    if let (Some(spec), Some(client)) = (&config.puts, &put_client) {
        let rec = Arc::new(OpRecorder::new(OP_PUT, start));
        let at = usize::from(config.ranges.is_some());
        recorders.insert(at, rec.clone());
        let op = drive::Op::Put {
            kv: connect::kv(client),
            spec: spec.clone(),
        };
        drivers.spawn(drive::drive(op, spec.rate, ctx(config, start, tokens), rec));
    }
    drivers.close();
    drivers
}

/// Starts the watchers on a connection of their own (shared by them, as the
/// apiserver's watch cache would) and waits until they are established, so
/// none misses the first put; then starts the clock. The clock's start and
/// their recorder.
async fn start_watches(
    config: &EtcdConfig,
    spec: &WatchSpec,
    stats: &Arc<crate::watch::WatchStats>,
    tracker: &TaskTracker,
    end: &watch::End,
) -> Result<(Instant, Arc<OpRecorder>), EtcdError> {
    let client = connect::client(&config.endpoints, config.timeout).await?;
    // Set once the clock starts: nothing is timed before the first put.
    let slot = Arc::new(std::sync::OnceLock::new());
    let ready = watch::start(spec, client, slot.clone(), stats.clone(), tracker, end);
    tokio::select! {
        _ = ready => {}
        _ = tokio::time::sleep(config.timeout.min(Duration::from_secs(30))) => {
            tracing::warn!("not every etcd watch was established in time; starting anyway");
        }
    }
    let start = Instant::now();
    let rec = Arc::new(OpRecorder::new(OP_WATCH, start));
    let _ = slot.set(rec.clone());
    Ok((start, rec))
}

/// The last puts' events are on their way: the watchers finish once etcd
/// says they were sent everything up to the final revision (no grace after
/// an interruption).
async fn finish_watches(
    client: &etcd_client::Client,
    end: &watch::End,
    tracker: &TaskTracker,
    interrupted: bool,
) {
    let final_rev = tokio::time::timeout(Duration::from_secs(5), client.clone().status()).await;
    if let Ok(Ok(status)) = final_rev {
        let rev = status.header().map_or(0, |h| h.revision());
        end.revision
            .store(rev, std::sync::atomic::Ordering::Relaxed);
    }
    end.drain.cancel();
    let grace = if interrupted {
        Duration::ZERO
    } else {
        Duration::from_secs(5)
    };
    let _ = tokio::time::timeout(grace, tracker.wait()).await;
}

fn ctx(
    config: &EtcdConfig,
    start: Instant,
    [stop, abort]: [&CancellationToken; 2],
) -> drive::DriveCtx {
    drive::DriveCtx {
        schedule: config.schedule.clone(),
        duration: config.duration,
        max_in_flight: config.max_in_flight,
        timeout: config.timeout,
        start,
        stop: stop.clone(),
        abort: abort.clone(),
    }
}

/// A `--server-metrics` scraper for a plain URL (etcd's /metrics needs no credentials).
fn scraper(url: &str) -> Result<crate::server_metrics::Scraper, EtcdError> {
    let target = crate::target::TargetOptions {
        server: Some(url.to_string()),
        ..Default::default()
    };
    crate::server_metrics::Scraper::new(&target, url, &crate::credentials::Credentials::none())
        .map_err(|e| EtcdError::ServerMetrics {
            url: url.to_string(),
            reason: e.to_string(),
        })
}
