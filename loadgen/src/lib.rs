//! loadgen: an open-loop load generator for the Kubernetes API
//! (`loadgen --lists 500/min`) that measures latency from each request's
//! *intended* start, so a stalled server cannot hide (no coordinated omission).
//!
//! # Layout
//! - [`cli`]: the command line (clap), turned into a typed [`Config`].
//! - [`rate`]: `N/s`, `N/min`, `N/h`.
//! - [`schedule`]: when each request is meant to start (constant, Poisson, steps); pure.
//! - [`credentials`]: the bearer token or plugin credential, kept fresh (tokenFile, expiry, 401).
//! - [`target`]: server URL, TLS (rustls + ring), HTTP/1.1 or HTTP/2, the pooled client.
//! - [`conn`]: a driver's own connections (hyper's per-connection senders, no pool).
//! - [`ops`]: the operations (LIST, GET, PATCH, create, delete) and their requests.
//! - [`send`]: one request with timeout, body accounting, 429 understanding, Retry-After.
//! - [`watch`]: informer-like watchers (list → watch → reconnect / relist, backoff).
//! - [`record`]: per-operation HDR histograms, counts, per-class split, time series.
//! - [`run`]: the API run itself — preflight, drivers, burst, watchers, nodes, report.
//! - `window`: what every run shares (API and etcd): scraping, progress, hold, drain, results.
//! - `drive`: one operation's open-loop driver on a thread of its own.
//! - [`report`]: the `summary.json` schema and the end table.
//! - [`merge`]: `loadgen merge` of `--shard i/N` results (histograms merged).
//! - [`metrics`]: `--metrics-listen`, loadgen's own `loadgen_` metrics.
//! - [`output`]: `--output DIR` files (summary, perfdata, timeseries.csv, histograms).
//! - [`progress`]: the live indicatif line.
//! - [`scenario`]: `loadgen run SCENARIO.yaml`: steps, phases, tuning sets, templates, measurements, SLO verdicts.
//! - [`safety`]: namespace allow-list, object cap, `--dry-run` plan.
//! - [`nodes`]: `--nodes N` / `loadgen nodes`: simulated kubelets (heartbeats, leases), daemons, `--bind`, presets.
//! - [`stages`]: kwok-compatible Stages: pod and node lifecycles driven by watch events (`--stages`).
//! - [`signal`]: SIGINT and SIGTERM stop a run (drained, results written, exit 128 + signal).
//! - [`seed`]: `loadgen seed` / `cleanup` (fake nodes and pods, removed by label).
//! - [`server_metrics`]: `--server-metrics` scraping (CPU and memory of the server).
//! - [`etcd`]: `loadgen etcd`: direct etcd load (ranges, puts, watches) recorded like the API operations.
#![forbid(unsafe_code)]

pub mod cli;
pub mod conn;
pub mod credentials;
mod drive;
pub mod etcd;
pub mod merge;
pub mod metrics;
pub mod nodes;
pub mod ops;
pub mod output;
pub mod progress;
pub mod rate;
pub mod record;
pub mod report;
pub mod run;
pub mod safety;
pub mod scenario;
pub mod schedule;
pub mod seed;
pub mod send;
pub mod server_metrics;
pub mod signal;
pub mod stages;
pub mod target;
pub mod watch;
mod window;

use std::path::PathBuf;
use std::time::Duration;

pub use report::Report;
pub use run::run;

/// A whole run, typed; built by [`cli::Cli::into_config`] or by hand (tests, bench).
#[derive(Debug, Clone)]
pub struct Config {
    pub target: target::TargetOptions,
    /// How long requests are scheduled.
    pub duration: Duration,
    pub schedule: schedule::ScheduleKind,
    /// Outstanding requests allowed per operation; ticks beyond it are dropped and counted.
    pub max_in_flight: usize,
    /// HTTP/1.1 connections per operation at most (0: as many as requests in flight).
    pub max_connections: usize,
    pub send: send::SendOptions,
    pub operations: Vec<ops::OpSpec>,
    pub watches: Option<watch::WatchSpec>,
    pub burst: Option<BurstSpec>,
    /// `--nodes N` / `--preset`: simulated kubelets and their daemons.
    pub nodes: Option<nodes::NodeSimSpec>,
    /// Where to write results, if anywhere.
    pub output: Option<PathBuf>,
    /// Draw the progress line (only on a terminal).
    pub progress: bool,
    /// After `duration`, how long in-flight requests may still finish.
    pub drain_timeout: Duration,
    /// Prometheus `/metrics` URLs to scrape during the run.
    pub server_metrics: Vec<String>,
    pub server_metrics_interval: Duration,
    /// `--metrics-listen`: where to serve loadgen's own metrics during the run.
    pub metrics_listen: Option<MetricsListen>,
    /// Namespaces writes may go to besides those labelled as loadgen's.
    pub namespace_allow: Vec<String>,
    /// Most objects one run creates (creates and burst); further creates are skipped.
    pub max_objects: u64,
    /// Print the plan instead of running (handled by the binary).
    pub dry_run: bool,
    /// `--shard i/N`: this process is shard `i` of `N` (rates and counts already divided).
    pub shard: Option<Shard>,
}

/// Where `--metrics-listen` serves.
#[derive(Debug, Clone)]
pub enum MetricsListen {
    /// Bind this address at the start of the run.
    Addr(std::net::SocketAddr),
    /// Use this already bound listener (tests, embedders).
    Listener(std::sync::Arc<std::net::TcpListener>),
}

/// One shard of a distributed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl std::str::FromStr for Shard {
    type Err = String;

    /// `i/N` with `0 <= i < N`.
    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("invalid shard `{s}`: expected i/N with 0 <= i < N (e.g. 0/4)");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl Shard {
    /// This shard's part of `total` items (the first `total % N` shards take one more).
    pub fn part(&self, total: u64) -> u64 {
        let n = u64::from(self.count);
        total / n + u64::from(u64::from(self.index) < total % n)
    }
}

/// `--burst N`: N pods created in parallel, then deleted in parallel.
#[derive(Debug, Clone)]
pub struct BurstSpec {
    pub count: u64,
    pub resource: ops::Resource,
    pub namespace: String,
    pub object_prefix: String,
    pub run_id: String,
}

/// Why a run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Target(#[from] target::TargetError),
    #[error("cannot reach {server}: {reason}")]
    Unreachable { server: String, reason: String },
    #[error("refusing to write into namespace `{namespace}`: {why}; create it with `loadgen seed --namespaces` or allow it with --namespace-allow {namespace}")]
    NamespaceNotAllowed { namespace: String, why: String },
    #[error(transparent)]
    Nodes(#[from] nodes::NodesError),
    #[error("interrupted before the load started")]
    Interrupted,
    #[error("--metrics-listen {addr}")]
    MetricsListen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing results to {dir}")]
    Output {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
