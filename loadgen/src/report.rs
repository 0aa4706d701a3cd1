//! The end-of-run report: one summary per operation (the `summary.json`
//! schema, `loadgen.summary/v1`), the histograms and time series behind it,
//! and the Tess.IO-style table.
//!
//! Schema (stable field names; times in milliseconds, rates per second):
//! `{schema, target, started_at_unix_ms, duration_s, interrupted, schedule,
//!   operations: [{name, verb, resource, scope, target_rate_per_s, requests,
//!   rate_per_s, ok, dropped, skipped, cancelled, latency_ms: {p50, p75, p90,
//!   p95, p99, p99.9, max, mean}, start_lag_ms: {p99, max}, status_codes:
//!   {"200": n, …}, errors, error_rate, error_classes: {"429","4xx","5xx",
//!   "timeout","connection","protocol"}, rate_429, retries: {first_try_429,
//!   retries, final_429}, rejections_429_body: {status_json, plain_text}, bytes,
//!   server_classes: [{class, source, name?, requests, rejected_429, rate_429, errors,
//!   latency_ms}]}], watches: {watchers, active_at_end, events, bookmarks,
//!   reconnects, relists, gone_410, errors, stream_refusals} | null, nodes: {nodes,
//!   heartbeat_interval_s, lease_renew_interval_s, daemons, pods_bound,
//!   daemon_watches: {…as watches}} | null, server_metrics: [{url,
//!   samples, scrape_errors, cpu_source, cpu_cores_avg, cpu_cores_peak,
//!   memory_source, memory_bytes_avg, memory_bytes_peak}], shard: {index, count} | null}`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::ops::{ListRv, OpKind};
use crate::record::{ms, OpRecorder, OpStats, SecondRow};
use crate::watch::{WatchStats, WatchSummary};
use crate::Config;

/// The `summary.json` schema name and version.
pub const SCHEMA: &str = "loadgen.summary/v1";

/// Everything a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub target: String,
    pub started_at_unix_ms: u64,
    pub duration_s: f64,
    pub interrupted: bool,
    pub schedule: String,
    pub operations: Vec<OperationSummary>,
    pub watches: Option<WatchSummary>,
    /// `--nodes`: the simulated nodes and their daemons' watches.
    #[serde(default)]
    pub nodes: Option<crate::nodes::NodesSummary>,
    /// `--server-metrics` sources.
    #[serde(default)]
    pub server_metrics: Vec<crate::server_metrics::ServerMetricsSummary>,
    /// `--shard i/N`, if this was one shard of a run.
    #[serde(default)]
    pub shard: Option<crate::Shard>,
    /// Latency histograms (µs) by operation name; written as HdrHistogram V2.
    #[serde(skip)]
    pub histograms: BTreeMap<String, Histogram<u64>>,
    /// Per-second rows by operation name.
    #[serde(skip)]
    pub series: Vec<(String, SecondRow)>,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p75: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    #[serde(rename = "p99.9")]
    pub p99_9: f64,
    pub max: f64,
    pub mean: f64,
}

impl Percentiles {
    /// Percentiles of a microsecond histogram.
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let q = |x: f64| ms(h.value_at_quantile(x));
        Percentiles {
            p50: q(0.50),
            p75: q(0.75),
            p90: q(0.90),
            p95: q(0.95),
            p99: q(0.99),
            p99_9: q(0.999),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

/// How late requests left relative to their intended start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StartLag {
    pub p99: f64,
    pub max: f64,
}

/// 429 retry accounting (`--honor-retry-after`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RetryCounts {
    /// Requests whose first attempt was answered 429.
    pub first_try_429: u64,
    /// Retries sent after 429s.
    pub retries: u64,
    /// Requests still 429 after the last attempt.
    pub final_429: u64,
}

/// How 429 bodies were understood.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RejectionBodies {
    pub status_json: u64,
    pub plain_text: u64,
}

/// Requests by server-reported class (tollgate lane or APF priority level UID).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassSummary {
    pub class: String,
    /// `lane` (X-Tollgate-Lane) or `priority-level` (APF priority level UID).
    pub source: String,
    /// For a priority level: its name, read from the flowcontrol API when allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub requests: u64,
    pub rejected_429: u64,
    pub rate_429: f64,
    pub errors: u64,
    pub latency_ms: Percentiles,
}

/// One operation's results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OperationSummary {
    pub name: String,
    pub verb: String,
    pub resource: String,
    pub scope: String,
    pub target_rate_per_s: Option<f64>,
    /// Requests completed (answered or failed), after retries.
    pub requests: u64,
    /// `requests` per second of the scheduling window (`--duration`, or less if interrupted).
    pub rate_per_s: f64,
    pub ok: u64,
    pub dropped: u64,
    pub skipped: u64,
    pub cancelled: u64,
    pub latency_ms: Percentiles,
    pub start_lag_ms: StartLag,
    pub status_codes: BTreeMap<String, u64>,
    pub errors: u64,
    pub error_rate: f64,
    pub error_classes: BTreeMap<String, u64>,
    pub rate_429: f64,
    pub retries: RetryCounts,
    pub rejections_429_body: RejectionBodies,
    pub bytes: u64,
    pub server_classes: Vec<ClassSummary>,
    /// `--schedule steps`: one entry per step, by intended start (Tess.IO's rows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepSummary>,
}

/// One schedule step of one operation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepSummary {
    pub step: u64,
    pub target_rate_per_s: f64,
    pub requests: u64,
    pub error_rate: f64,
    pub rate_429: f64,
    pub latency_ms: Percentiles,
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

impl OperationSummary {
    /// Summarizes `s`; verb/resource/scope/target come from the caller.
    pub fn from_stats(name: &str, s: &OpStats, elapsed: Duration) -> OperationSummary {
        let mut classes: BTreeMap<String, u64> = BTreeMap::new();
        for (code, n) in &s.by_status {
            let key = match code {
                429 => Some("429"),
                400..=499 => Some("4xx"),
                500..=599 => Some("5xx"),
                _ => None,
            };
            if let Some(k) = key {
                *classes.entry(k.to_string()).or_default() += n;
            }
        }
        for (e, n) in &s.by_error {
            let k = serde_json::to_value(e)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{e:?}"));
            *classes.entry(k).or_default() += n;
        }
        OperationSummary {
            name: name.to_string(),
            requests: s.requests,
            rate_per_s: s.requests as f64 / elapsed.as_secs_f64().max(1e-9),
            ok: s.ok,
            dropped: s.dropped,
            skipped: s.skipped,
            cancelled: s.cancelled,
            latency_ms: Percentiles::of(&s.latency),
            start_lag_ms: StartLag {
                p99: if s.start_lag.is_empty() {
                    0.0
                } else {
                    ms(s.start_lag.value_at_quantile(0.99))
                },
                max: if s.start_lag.is_empty() {
                    0.0
                } else {
                    ms(s.start_lag.max())
                },
            },
            status_codes: s
                .by_status
                .iter()
                .map(|(c, n)| (c.to_string(), *n))
                .collect(),
            errors: s.errors(),
            error_rate: ratio(s.errors(), s.requests),
            error_classes: classes,
            rate_429: ratio(s.rejected_429(), s.requests),
            retries: RetryCounts {
                first_try_429: s.first_try_429,
                retries: s.retries,
                final_429: s.retry_exhausted,
            },
            rejections_429_body: RejectionBodies {
                status_json: s.rejections_status_json,
                plain_text: s.rejections_plain_text,
            },
            bytes: s.bytes,
            server_classes: s
                .classes
                .iter()
                .map(|(class, c)| ClassSummary {
                    class: class.clone(),
                    source: match c.source {
                        crate::record::ClassSource::Lane => "lane".into(),
                        crate::record::ClassSource::PriorityLevel => "priority-level".into(),
                    },
                    name: None,
                    requests: c.requests,
                    rejected_429: c.rejected_429,
                    rate_429: ratio(c.rejected_429, c.requests),
                    errors: c.errors,
                    latency_ms: Percentiles::of(&c.latency),
                })
                .collect(),
            ..Default::default()
        }
    }
}

impl Report {
    /// Collects the recorders' results.
    pub fn build(
        config: &Config,
        target: &str,
        started_at_unix_nanos: u128,
        elapsed: Duration,
        interrupted: bool,
        recorders: &[Arc<OpRecorder>],
        watch: &WatchStats,
    ) -> Report {
        let mut report = Report::empty(
            target,
            started_at_unix_nanos,
            elapsed,
            interrupted,
            &config.schedule,
        );
        report.shard = config.shard;
        // Achieved rates over the scheduling window, not the drain after it.
        report.add_operations(
            recorders,
            elapsed.min(config.duration),
            &config.schedule,
            |sum| describe(config, sum),
        );
        if let Some(spec) = &config.watches {
            report.watches = Some(WatchSummary::of(spec.count, watch));
        }
        report
    }

    /// A report with no operations yet: what every run (API or etcd) starts from.
    pub(crate) fn empty(
        target: &str,
        started_at_unix_nanos: u128,
        elapsed: Duration,
        interrupted: bool,
        schedule: &crate::schedule::ScheduleKind,
    ) -> Report {
        Report {
            schema: SCHEMA.to_string(),
            target: target.to_string(),
            started_at_unix_ms: u64::try_from(started_at_unix_nanos / 1_000_000).unwrap_or(0),
            duration_s: elapsed.as_secs_f64(),
            interrupted,
            schedule: schedule_name(schedule),
            operations: Vec::new(),
            watches: None,
            nodes: None,
            server_metrics: Vec::new(),
            shard: None,
            histograms: BTreeMap::new(),
            series: Vec::new(),
        }
    }

    /// Adds each recorder's operation (rates over `window`, per-step rows for a stepped
    /// schedule), its histogram and its time series; `describe` fills verb, resource,
    /// scope and target rate.
    pub(crate) fn add_operations(
        &mut self,
        recorders: &[Arc<OpRecorder>],
        window: Duration,
        schedule: &crate::schedule::ScheduleKind,
        describe: impl Fn(&mut OperationSummary),
    ) {
        for rec in recorders {
            let stats = rec.snapshot();
            let mut sum = OperationSummary::from_stats(rec.name(), &stats, window);
            describe(&mut sum);
            if let crate::schedule::ScheduleKind::Steps { steps, .. } = *schedule {
                let full = sum.target_rate_per_s.unwrap_or(0.0);
                let n = f64::from(steps.max(1));
                sum.steps = stats
                    .slices
                    .iter()
                    .enumerate()
                    .filter(|(_, sl)| sl.requests > 0)
                    .map(|(k, sl)| StepSummary {
                        step: k as u64 + 1,
                        target_rate_per_s: full * ((k as f64 + 1.0).min(n)) / n,
                        requests: sl.requests,
                        error_rate: ratio(sl.requests - sl.ok, sl.requests),
                        rate_429: ratio(sl.rejected_429, sl.requests),
                        latency_ms: Percentiles::of(&sl.latency),
                    })
                    .collect();
            }
            self.operations.push(sum);
            self.histograms
                .insert(rec.name().to_string(), stats.latency.clone());
            self.series.extend(
                stats
                    .series
                    .into_iter()
                    .map(|row| (rec.name().to_string(), row)),
            );
        }
    }

    /// The operation named `name`.
    pub fn operation(&self, name: &str) -> Option<&OperationSummary> {
        self.operations.iter().find(|o| o.name == name)
    }

    /// The end-of-run table, one row per operation, like Tess.IO's.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<14} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>10}",
            "operation", "target/s", "actual/s", "requests", "p50 ms", "p75 ms", "p90 ms", "p95 ms",
            "p99 ms", "p99.9 ms", "max ms", "err %", "429 %", "dropped", "bytes"
        );
        for o in &self.operations {
            let l = &o.latency_ms;
            let target = o
                .target_rate_per_s
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                out,
                "{:<14} {:>9} {:>9.2} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7.2} {:>7.2} {:>7} {:>10}",
                o.name, target, o.rate_per_s, o.requests, l.p50, l.p75, l.p90, l.p95, l.p99, l.p99_9,
                l.max, o.error_rate * 100.0, o.rate_429 * 100.0, o.dropped, o.bytes
            );
            for s in &o.steps {
                let l = &s.latency_ms;
                let _ = writeln!(
                    out,
                    "  step {:<3} {:>9.2}/s requests {:>8}  p50 {:>8.1}  p75 {:>8.1}  p90 {:>8.1}  p95 {:>8.1}  p99 {:>8.1} ms  err {:>6.2}%  429 {:>6.2}%",
                    s.step, s.target_rate_per_s, s.requests, l.p50, l.p75, l.p90, l.p95, l.p99,
                    s.error_rate * 100.0, s.rate_429 * 100.0
                );
            }
            for c in &o.server_classes {
                let _ = writeln!(
                    out,
                    "  {} {:<22} requests {:>8}  429 {:>6.2}%  p99 {:>9.1} ms",
                    c.source,
                    c.name.as_deref().unwrap_or(&c.class),
                    c.requests,
                    c.rate_429 * 100.0,
                    c.latency_ms.p99
                );
            }
        }
        if let Some(w) = &self.watches {
            let _ = writeln!(
                out,
                "watches: {} watchers, {} active at end, {} events, {} bookmarks, {} reconnects, {} relists ({} gone), {} errors",
                w.watchers, w.active_at_end, w.events, w.bookmarks, w.reconnects, w.relists, w.gone_410, w.errors
            );
            if w.stream_refusals > 0 {
                let _ = writeln!(
                    out,
                    "watches: {} streaming lists refused by the apiserver (then LIST and WATCH)",
                    w.stream_refusals
                );
            }
        }
        if let Some(n) = &self.nodes {
            let w = &n.daemon_watches;
            let _ = writeln!(
                out,
                "nodes: {} simulated (status every {}s, lease every {}s), {} pods bound; daemons: {} watchers, {} active at end, {} events, {} relists ({} gone), {} errors",
                n.nodes, n.heartbeat_interval_s, n.lease_renew_interval_s, n.pods_bound,
                w.watchers, w.active_at_end, w.events, w.relists, w.gone_410, w.errors
            );
        }
        for m in &self.server_metrics {
            let cores = |v: Option<f64>| v.map(|c| format!("{c:.2}")).unwrap_or_else(|| "-".into());
            let mib = |v: Option<f64>| {
                v.map(|b| format!("{:.1}", b / 1048576.0))
                    .unwrap_or_else(|| "-".into())
            };
            let _ = writeln!(
                out,
                "server {}: CPU cores avg {} peak {} ({}), memory MiB avg {} peak {} ({}), {} samples, {} scrape errors",
                m.url,
                cores(m.cpu_cores_avg),
                cores(m.cpu_cores_peak),
                m.cpu_source.as_deref().unwrap_or("no CPU series"),
                mib(m.memory_bytes_avg),
                mib(m.memory_bytes_peak),
                m.memory_source.as_deref().unwrap_or("no memory series"),
                m.samples,
                m.scrape_errors
            );
        }
        if self.interrupted {
            let _ = writeln!(out, "(interrupted after {:.1} s)", self.duration_s);
        }
        out
    }
}

/// A stable name for the schedule: `constant`, `poisson(seed=1)`, `steps(5x60s)`.
pub fn schedule_name(kind: &crate::schedule::ScheduleKind) -> String {
    use crate::schedule::ScheduleKind;
    match kind {
        ScheduleKind::Constant => "constant".into(),
        ScheduleKind::Poisson { seed } => format!("poisson(seed={seed})"),
        ScheduleKind::Steps { steps, step } => format!("steps({steps}x{}s)", step.as_secs_f64()),
    }
}

/// Fills verb, resource, scope and target rate from the configured operation.
fn describe(config: &Config, sum: &mut OperationSummary) {
    if let Some(op) = config.operations.iter().find(|o| o.name == sum.name) {
        sum.resource = op.resource.plural.clone();
        sum.target_rate_per_s = Some(op.rate.as_per_second());
        let (verb, scope) = match &op.kind {
            OpKind::List {
                all_namespaces, rv, ..
            } => {
                let scope = if *all_namespaces || !op.resource.namespaced {
                    "cluster"
                } else {
                    "namespace"
                };
                let verb = match rv {
                    ListRv::Consistent => "LIST",
                    ListRv::Cache => "LIST(rv=0)",
                    ListRv::Exact => "LIST(exact)",
                };
                (verb, scope)
            }
            OpKind::Get => ("GET", "resource"),
            OpKind::Patch { target, .. } => {
                if matches!(target, crate::ops::PatchTarget::NodeStatus) {
                    sum.resource = "nodes/status".into();
                }
                ("PATCH", "resource")
            }
            OpKind::Create => ("POST", "namespace"),
            OpKind::Delete => ("DELETE", "resource"),
        };
        sum.verb = verb.to_string();
        sum.scope = scope.to_string();
        return;
    }
    if let Some((verb, resource, scope)) = crate::nodes::describe(&sum.name) {
        sum.verb = verb.into();
        sum.resource = resource.into();
        sum.scope = scope.into();
        if let Some(n) = &config.nodes {
            let nodes = n.indices().count() as f64;
            let every = match sum.name.as_str() {
                crate::nodes::OP_HEARTBEAT => n.heartbeat,
                crate::nodes::OP_LEASE => n.lease_renew,
                _ => std::time::Duration::ZERO,
            };
            if !every.is_zero() {
                sum.target_rate_per_s = Some(nodes / every.as_secs_f64());
            }
        }
        return;
    }
    let (verb, resource, scope) = match sum.name.as_str() {
        "burst-create" => ("POST", "pods", "namespace"),
        "burst-delete" => ("DELETE", "pods", "resource"),
        "watch-event" => ("WATCH", "events-delivered", "-"),
        "watch-list" => ("LIST(rv=0)", "watched", "-"),
        _ => ("-", "-", "-"),
    };
    sum.verb = verb.into();
    sum.resource = resource.into();
    sum.scope = scope.into();
    if sum.resource == "watched" {
        if let Some(w) = &config.watches {
            sum.resource = w.resource.plural.clone();
        }
    }
}
