//! Measurements, started in one step and gathered in a later one (the
//! Cluster Loader's start/gather): what happened in the steps between.
//!
//! - `APIResponsiveness`: latency of the API calls the scenario made, per
//!   (verb, resource, scope), with percentiles, the 429 share and the
//!   Kubernetes API call SLOs (p99: mutating single-object calls ≤ 1 s,
//!   single-object reads ≤ 1 s, namespace- and cluster-scoped LISTs ≤ 30 s).
//!   Calls are counted by phase: a phase that ran in a step between start and
//!   gather is counted whole.
//! - `ResourceUsage`: the servers' CPU and memory from their `/metrics`.
//! - CL2's `ResourceUsageSummary` and `TestMetrics` (its parts measurable
//!   from outside): see [`super::resource_usage`].
//! - `WatchLatency`: how long the objects the scenario wrote took to reach a
//!   watcher (loadgen stamps each write; see [`crate::watch`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::pods::{
    latency_perfdata, wait_controlled, ControlledOutcome, ControlledSpec, Controller, PodTracker,
};
use super::resource_usage::{self, Sampled};
use super::test_metrics;
use super::validate::{Cl2Params, MeasurementAction, Method, Thresholds};
use crate::record::{new_histogram, OpRecorder, Outcome};
use crate::report::{Percentiles, Report};
use crate::server_metrics::{Scraper, ServerMetricsSummary};
use crate::target::{ApiClient, Target, TargetOptions};
use crate::watch::{WatchSpec, WatchStats, Watcher};

/// What a call was: `POST pods namespace`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CallKey {
    pub verb: String,
    pub resource: String,
    pub scope: String,
}

#[derive(Debug, Clone)]
struct CallStats {
    latency: Histogram<u64>,
    requests: u64,
    ok: u64,
    rejected_429: u64,
    by_status: BTreeMap<String, u64>,
}

impl Default for CallStats {
    fn default() -> Self {
        CallStats {
            latency: new_histogram(),
            requests: 0,
            ok: 0,
            rejected_429: 0,
            by_status: BTreeMap::new(),
        }
    }
}

/// API calls by (verb, resource, scope); shared by a phase's units.
#[derive(Debug, Default)]
pub struct ApiCalls(Mutex<BTreeMap<CallKey, CallStats>>);

/// One (verb, resource, scope) in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallSummary {
    pub verb: String,
    pub resource: String,
    pub scope: String,
    pub requests: u64,
    pub ok: u64,
    pub errors: u64,
    pub error_rate: f64,
    pub rejected_429: u64,
    pub rate_429: f64,
    pub latency_ms: Percentiles,
    pub status_codes: BTreeMap<String, u64>,
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

impl ApiCalls {
    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<CallKey, CallStats>) -> R) -> R {
        // A panic while holding the lock only loses that one record.
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Records one finished call.
    pub fn record(&self, key: &CallKey, outcome: &Outcome, latency: Duration) {
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        self.with(|m| {
            let s = m.entry(key.clone()).or_default();
            s.latency.saturating_record(us);
            s.requests += 1;
            s.ok += u64::from(outcome.is_success());
            s.rejected_429 += u64::from(outcome.status == Some(429));
            let status = match (outcome.status, outcome.error) {
                (Some(code), _) => code.to_string(),
                (None, Some(e)) => format!("{e:?}").to_ascii_lowercase(),
                (None, None) => "none".into(),
            };
            *s.by_status.entry(status).or_default() += 1;
        });
    }

    /// Adds the calls of a loadgen or etcd run (watch event deliveries are not calls).
    pub fn add_report(&self, report: &Report) {
        self.with(|m| {
            for op in &report.operations {
                if op.verb == "WATCH" || op.verb == "-" {
                    continue;
                }
                let key = CallKey {
                    verb: op.verb.clone(),
                    resource: op.resource.clone(),
                    scope: op.scope.clone(),
                };
                let s = m.entry(key).or_default();
                if let Some(h) = report.histograms.get(&op.name) {
                    let _ = s.latency.add(h);
                }
                s.requests += op.requests;
                s.ok += op.ok;
                s.rejected_429 += op.status_codes.get("429").copied().unwrap_or(0);
                for (code, n) in &op.status_codes {
                    *s.by_status.entry(code.clone()).or_default() += n;
                }
                for (class, n) in &op.error_classes {
                    if class != "429" && class != "4xx" && class != "5xx" {
                        *s.by_status.entry(class.clone()).or_default() += n;
                    }
                }
            }
        });
    }

    /// Adds everything `other` recorded.
    pub fn merge(&self, other: &ApiCalls) {
        let theirs = other.with(|m| m.clone());
        self.with(|m| {
            for (k, o) in theirs {
                let s = m.entry(k).or_default();
                let _ = s.latency.add(&o.latency);
                s.requests += o.requests;
                s.ok += o.ok;
                s.rejected_429 += o.rejected_429;
                for (code, n) in o.by_status {
                    *s.by_status.entry(code).or_default() += n;
                }
            }
        });
    }

    pub fn summaries(&self) -> Vec<CallSummary> {
        self.with(|m| {
            m.iter()
                .map(|(k, s)| CallSummary {
                    verb: k.verb.clone(),
                    resource: k.resource.clone(),
                    scope: k.scope.clone(),
                    requests: s.requests,
                    ok: s.ok,
                    errors: s.requests - s.ok.min(s.requests),
                    error_rate: ratio(s.requests - s.ok.min(s.requests), s.requests),
                    rejected_429: s.rejected_429,
                    rate_429: ratio(s.rejected_429, s.requests),
                    latency_ms: Percentiles::of(&s.latency),
                    status_codes: s.by_status.clone(),
                })
                .collect()
        })
    }
}

/// One SLO checked at gather.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SloCheck {
    /// `APIResponsiveness/api`.
    pub measurement: String,
    /// `p99 POST pods namespace`, `429 rate`, `p99 watch delivery`.
    pub subject: String,
    pub threshold: f64,
    pub observed: f64,
    /// `ms` or `ratio`.
    pub unit: String,
    pub met: bool,
    /// Whether a miss fails the run: CL2's APIResponsivenessPrometheus fails
    /// only with `enableViolations: true`, and forgives `allowedSlowCalls`.
    #[serde(default = "yes")]
    pub enforced: bool,
}

fn yes() -> bool {
    true
}

/// The watch delivery latency a WatchLatency measurement saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchLatencySummary {
    pub resource: String,
    pub watchers: u64,
    /// Events whose delivery was timed (writes stamped by loadgen).
    pub timed_events: u64,
    pub events: u64,
    pub errors: u64,
    pub latency_ms: Percentiles,
}

/// What one measurement found between its start and gather.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasurementResult {
    pub method: String,
    /// The method as the scenario file spells it (names the perfdash file).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub method_as_written: String,
    pub identifier: String,
    pub started_in_step: usize,
    /// `None` when the run ended (failed or interrupted) before the gather step.
    pub gathered_in_step: Option<usize>,
    pub duration_s: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallSummary>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_metrics: Vec<ServerMetricsSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchLatencySummary>,
    /// ClusterLoader2's pod measurements: what they saw (pods timed,
    /// controllers waited for, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<serde_json::Value>,
    pub slos: Vec<SloCheck>,
    /// ResourceUsageSummary and TestMetrics: the `/metrics` sampled (URL,
    /// component, scrapes and scrape errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<serde_json::Value>,
    /// The parts of this measurement loadgen skipped, each with why
    /// (TestMetrics' parts that cannot be measured from outside).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// The files ClusterLoader2 writes for this measurement: each its summary
    /// name (`{name}_{test}_{time}.json`, perfdash's prefix) and content.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub summaries: Vec<Cl2Summary>,
}

/// One file as ClusterLoader2 names and fills it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cl2Summary {
    pub name: String,
    pub content: serde_json::Value,
}

/// A started measurement.
pub struct Active {
    pub method: Method,
    method_as_written: String,
    pub identifier: String,
    started_in_step: usize,
    started: Instant,
    thresholds: Option<Thresholds>,
    kind: ActiveKind,
    cl2: Cl2Params,
    /// Read from a CL2 config (its defaults differ: enableViolations).
    cl2_dialect: bool,
    /// The perfdash file's prefix: `summaryName`, else the method as CL2 names it.
    summary_name: String,
}

enum ActiveKind {
    Api(Arc<ApiCalls>),
    Usage {
        stop: CancellationToken,
        tasks: Vec<JoinHandle<ServerMetricsSummary>>,
    },
    Watch {
        stop: CancellationToken,
        tasks: Vec<JoinHandle<()>>,
        events: Arc<OpRecorder>,
        stats: Arc<WatchStats>,
        resource: String,
        watchers: u64,
    },
    /// ResourceUsageSummary (and TestMetrics'): the servers' /metrics, sampled.
    UsageSummary {
        stop: CancellationToken,
        tasks: Vec<JoinHandle<Sampled>>,
        test_metrics: bool,
    },
    /// PodStartupLatency and SchedulingThroughput: a watch of the pods.
    Pods(PodTracker),
    /// WaitForControlledPodsRunning: what to wait for, and the controllers
    /// the last gather saw (their pods must go when they go).
    Controlled {
        spec: ControlledSpec,
        previous: Vec<Controller>,
        gathers: Vec<ControlledOutcome>,
    },
}

/// What starting a measurement needs.
pub struct MeasureCtx<'a> {
    pub target: &'a Target,
    pub target_options: &'a TargetOptions,
    /// `loadgen run --server-metrics`, used when the measurement names no URLs.
    pub server_metrics: &'a [String],
    pub send: &'a crate::send::SendOptions,
}

/// Which SLO applies to a call: `(name, threshold)`, or none (watches). An etcd
/// `PUT` of one key is held to the mutating limit and a prefix `RANGE` to the
/// cluster-scoped LIST one, the API calls they serve.
fn slo_for(key: &CallKey, t: &Thresholds) -> Option<(&'static str, Duration)> {
    match key.verb.as_str() {
        "POST" | "PUT" | "PATCH" | "DELETE" => Some(("mutating", t.mutating)),
        v if v.starts_with("GET") => Some(("read single", t.read_single)),
        v if v.starts_with("LIST") => match key.scope.as_str() {
            "namespace" => Some(("read namespace", t.read_namespace)),
            "cluster" => Some(("read cluster", t.read_cluster)),
            // A watcher's (re)list names no scope in the report; a LIST is
            // never a single-object read, so the wider limit applies.
            _ => Some(("read list", t.read_cluster)),
        },
        v if v.starts_with("RANGE") => Some(("etcd range", t.read_cluster)),
        _ => None,
    }
}

impl Active {
    /// Starts `m` (its action is `start`) in step `step`.
    pub fn start(
        m: &MeasurementAction,
        step: usize,
        ctx: &MeasureCtx<'_>,
    ) -> Result<Active, String> {
        let kind = match m.method {
            Method::ApiResponsiveness => ActiveKind::Api(Arc::new(ApiCalls::default())),
            Method::ResourceUsage => {
                let urls = if m.urls.is_empty() {
                    ctx.server_metrics
                } else {
                    &m.urls
                };
                if urls.is_empty() {
                    // Said, not failed: the same file runs where no /metrics is reachable.
                    tracing::warn!(identifier = %m.identifier, "ResourceUsage: no params.urls and no `loadgen run --server-metrics URL`: nothing to scrape");
                }
                let stop = CancellationToken::new();
                let mut tasks = Vec::new();
                for url in urls {
                    let s = Scraper::new(ctx.target_options, url, &ctx.target.credentials)
                        .map_err(|e| format!("{url}: {e}"))?;
                    tasks.push(tokio::spawn(s.run(m.interval, stop.clone())));
                }
                ActiveKind::Usage { stop, tasks }
            }
            Method::WatchLatency => {
                let stop = CancellationToken::new();
                let start = Instant::now();
                let events = Arc::new(OpRecorder::new("watch-event", start));
                let lists = Arc::new(OpRecorder::new("watch-list", start));
                let stats = Arc::new(WatchStats::default());
                let spec = WatchSpec {
                    count: m.watches,
                    resource: m.resource.clone(),
                    namespace: None,
                    label_selector: Some(format!(
                        "{}={}",
                        crate::ops::MANAGED_BY.0,
                        crate::ops::MANAGED_BY.1
                    )),
                    field_selector: None,
                    per_connection: 100,
                    timeout: None,
                    initial: crate::watch::InitialList::List,
                };
                let client = ApiClient::new(ctx.target);
                let tasks = (0..m.watches)
                    .map(|id| {
                        let w = Watcher {
                            id,
                            spec: spec.clone(),
                            client: client.clone(),
                            send: ctx.send.clone(),
                            events: events.clone(),
                            lists: lists.clone(),
                            stats: stats.clone(),
                        };
                        tokio::spawn(w.run(stop.clone()))
                    })
                    .collect();
                ActiveKind::Watch {
                    stop,
                    tasks,
                    events,
                    stats,
                    resource: m.resource.plural.clone(),
                    watchers: m.watches,
                }
            }
            Method::PodStartupLatency | Method::SchedulingThroughput => {
                ActiveKind::Pods(PodTracker::start(
                    &ApiClient::new(ctx.target),
                    m.cl2.label_selector.as_deref(),
                    ctx.send.timeout,
                ))
            }
            Method::WaitForControlledPodsRunning => ActiveKind::Controlled {
                spec: ControlledSpec {
                    api_version: m
                        .cl2
                        .api_version
                        .clone()
                        .unwrap_or_else(|| "apps/v1".into()),
                    kind: m.cl2.kind.clone().unwrap_or_default(),
                    label_selector: m.cl2.label_selector.clone(),
                    // CL2's default operationTimeout.
                    timeout: m.cl2.timeout.unwrap_or(Duration::from_secs(600)),
                },
                previous: Vec::new(),
                gathers: Vec::new(),
            },
            Method::ResourceUsageSummary | Method::TestMetrics => usage_summary(m, ctx)?,
            Method::WaitForRunningPods | Method::Sleep | Method::Skipped => {
                return Err(format!("{} has no start", m.method_as_written))
            }
        };
        Ok(Active {
            method: m.method,
            method_as_written: m.method_as_written.clone(),
            identifier: m.identifier.clone(),
            started_in_step: step,
            started: Instant::now(),
            thresholds: m.thresholds.clone(),
            kind,
            cl2: m.cl2.clone(),
            cl2_dialect: m.cl2_dialect,
            summary_name: summary_name(m),
        })
    }

    /// Counts a finished phase's calls, if this measures API calls.
    pub fn add_calls(&self, calls: &ApiCalls) {
        if let ActiveKind::Api(mine) = &self.kind {
            mine.merge(calls);
        }
    }

    /// For a watch measurement: true once every watcher has listed and is watching.
    pub fn watching(&self) -> bool {
        match &self.kind {
            ActiveKind::Watch {
                stats, watchers, ..
            } => stats.active.load(std::sync::atomic::Ordering::Relaxed) >= *watchers,
            ActiveKind::Pods(t) => t.synced(),
            _ => true,
        }
    }

    /// Stops the measurement and evaluates its SLOs; `gather` is the gather
    /// action (its thresholds win over the start's), `None` if the run ended first.
    pub async fn gather(
        mut self,
        gather: Option<(&MeasurementAction, usize)>,
    ) -> MeasurementResult {
        // CL2 configs give most params at gather: they win over the start's.
        if let Some((m, _)) = gather {
            let g = &m.cl2;
            let c = &mut self.cl2;
            c.enable_violations = g.enable_violations.or(c.enable_violations);
            c.allowed_slow_calls = c.allowed_slow_calls.max(g.allowed_slow_calls);
            c.threshold = g.threshold.or(c.threshold);
            if g.resource_constraints.is_some() {
                c.resource_constraints = g.resource_constraints.clone();
            }
            if g.summary_name.is_some() {
                c.summary_name = g.summary_name.clone();
                self.summary_name = summary_name(m);
            }
        }
        let thresholds = gather
            .and_then(|(m, _)| m.thresholds.clone())
            .or(self.thresholds.clone());
        let name = format!("{}/{}", method_name(self.method), self.identifier);
        let mut result = MeasurementResult {
            method: method_name(self.method).into(),
            method_as_written: self.method_as_written.clone(),
            identifier: self.identifier.clone(),
            started_in_step: self.started_in_step,
            gathered_in_step: gather.map(|(_, s)| s),
            duration_s: self.started.elapsed().as_secs_f64(),
            calls: Vec::new(),
            server_metrics: Vec::new(),
            watch: None,
            pods: None,
            sources: None,
            skipped: Vec::new(),
            slos: Vec::new(),
            summaries: Vec::new(),
        };
        match self.kind {
            ActiveKind::Api(calls) => {
                result.calls = calls.summaries();
                // APIResponsiveness always checks the API call SLOs.
                let t = thresholds.unwrap_or_default();
                let (mut all, mut rejected) = (0, 0);
                for c in &result.calls {
                    all += c.requests;
                    rejected += c.rejected_429;
                    let key = CallKey {
                        verb: c.verb.clone(),
                        resource: c.resource.clone(),
                        scope: c.scope.clone(),
                    };
                    if let Some((class, limit)) = slo_for(&key, &t).filter(|_| c.requests > 0) {
                        let limit_ms = limit.as_secs_f64() * 1000.0;
                        result.slos.push(SloCheck {
                            measurement: name.clone(),
                            subject: format!("p99 {} {} {} ({class})", c.verb, c.resource, c.scope),
                            threshold: limit_ms,
                            observed: c.latency_ms.p99,
                            unit: "ms".into(),
                            met: c.latency_ms.p99 <= limit_ms,
                            enforced: true,
                        });
                    }
                }
                if let Some(max) = t.max_429_rate {
                    let observed = ratio(rejected, all);
                    result.slos.push(SloCheck {
                        measurement: name.clone(),
                        subject: "429 rate".into(),
                        threshold: max,
                        observed,
                        unit: "ratio".into(),
                        met: observed <= max,
                        enforced: true,
                    });
                }
                // CL2: violations fail the test only when enabled, and up to
                // `allowedSlowCalls` slow call kinds are forgiven.
                let slow = result
                    .slos
                    .iter()
                    .filter(|s| !s.met && s.unit == "ms")
                    .count() as u64;
                let enforce = self.cl2.enable_violations.unwrap_or(!self.cl2_dialect)
                    && slow > self.cl2.allowed_slow_calls;
                for s in &mut result.slos {
                    s.enforced = enforce || s.unit == "ratio";
                }
                result.summaries.push(Cl2Summary {
                    name: self.summary_name.clone(),
                    content: api_perfdata(&result.calls, &t),
                });
            }
            ActiveKind::Usage { stop, tasks } => {
                stop.cancel();
                for t in tasks {
                    if let Ok(s) = t.await {
                        result.server_metrics.push(s);
                    }
                }
            }
            ActiveKind::Watch {
                stop,
                tasks,
                events,
                stats,
                resource,
                watchers,
            } => {
                stop.cancel();
                for t in tasks {
                    let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
                }
                let snap = events.snapshot();
                let latency = Percentiles::of(&snap.latency);
                if let Some(limit) = thresholds.and_then(|t| t.watch_p99) {
                    let limit_ms = limit.as_secs_f64() * 1000.0;
                    result.slos.push(SloCheck {
                        measurement: name.clone(),
                        subject: format!("p99 watch delivery {resource}"),
                        threshold: limit_ms,
                        observed: latency.p99,
                        unit: "ms".into(),
                        // No timed event at all is a failed measurement, not a pass.
                        met: snap.requests > 0 && latency.p99 <= limit_ms,
                        enforced: true,
                    });
                }
                result.watch = Some(WatchLatencySummary {
                    resource,
                    watchers,
                    timed_events: snap.requests,
                    events: stats.events.load(std::sync::atomic::Ordering::Relaxed),
                    errors: stats.errors.load(std::sync::atomic::Ordering::Relaxed),
                    latency_ms: latency,
                });
            }
            ActiveKind::UsageSummary {
                stop,
                tasks,
                test_metrics,
            } => {
                stop.cancel();
                let mut sampled = Vec::new();
                for t in tasks {
                    if let Ok(s) = t.await {
                        sampled.push(s);
                    }
                }
                gather_usage(
                    &mut result,
                    &sampled,
                    test_metrics,
                    self.cl2.resource_constraints.as_ref(),
                );
            }
            ActiveKind::Pods(tracker) => {
                let seen = tracker.stop().await;
                if self.method == Method::SchedulingThroughput {
                    // CL2's default measurmentInterval.
                    let t = seen.throughput(Duration::from_secs(5));
                    result.pods =
                        Some(serde_json::json!({"throughput": t.clone(), "dropped": seen.dropped}));
                    result.summaries.push(Cl2Summary {
                        name: self.summary_name.clone(),
                        content: t,
                    });
                } else {
                    let threshold = self.cl2.threshold.unwrap_or(Duration::from_secs(5));
                    let all = seen.transitions(None);
                    if let Some(l) = all.get("pod_startup") {
                        let limit_ms = threshold.as_secs_f64() * 1000.0;
                        let p99 = l.perc99.as_secs_f64() * 1000.0;
                        result.slos.push(SloCheck {
                            measurement: name.clone(),
                            subject: "p99 pod_startup".into(),
                            threshold: limit_ms,
                            observed: p99,
                            unit: "ms".into(),
                            met: p99 <= limit_ms,
                            enforced: true,
                        });
                    }
                    result.pods = Some(serde_json::json!({
                        "pods_timed": all.get("pod_startup").map_or(0, |l| l.count),
                        "dropped": seen.dropped,
                    }));
                    // CL2 writes all pods, then the stateless and stateful ones.
                    for (prefix, filter) in [
                        ("", None),
                        ("Stateless", Some(true)),
                        ("Stateful", Some(false)),
                    ] {
                        result.summaries.push(Cl2Summary {
                            name: format!("{prefix}{}", self.summary_name),
                            content: latency_perfdata(&seen.transitions(filter)),
                        });
                    }
                }
            }
            ActiveKind::Controlled { gathers, .. } => {
                result.pods = Some(serde_json::json!({ "gathers": gathers }));
            }
        }
        result
    }

    /// WaitForControlledPodsRunning's gather: waits (up to its
    /// operationTimeout) and stays started, for the next gather. `Err`: the
    /// wait timed out or could not list.
    pub async fn wait_controlled(
        &mut self,
        client: &ApiClient,
    ) -> Result<ControlledOutcome, String> {
        let ActiveKind::Controlled {
            spec,
            previous,
            gathers,
        } = &mut self.kind
        else {
            return Err(format!(
                "{} is not WaitForControlledPodsRunning",
                self.identifier
            ));
        };
        let (seen, outcome) = wait_controlled(client, spec, previous).await?;
        *previous = seen;
        gathers.push(outcome.clone());
        if outcome.not_ready.is_empty() {
            Ok(outcome)
        } else {
            let n = outcome.not_ready.len();
            Err(format!(
                "WaitForControlledPodsRunning `{}`: {n} {} not running their pods after {:.0}s: {}",
                self.identifier,
                spec.kind,
                outcome.waited_s,
                outcome
                    .not_ready
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }
}

/// ResourceUsageSummary's file, its constraints checked (a miss fails the
/// run, as CL2's violation error does), and for TestMetrics EtcdMetrics'
/// file and the parts skipped.
fn gather_usage(
    result: &mut MeasurementResult,
    sampled: &[Sampled],
    test_metrics: bool,
    constraints: Option<&BTreeMap<String, resource_usage::Constraint>>,
) {
    let content = resource_usage::summary(sampled);
    if let Some(c) = constraints {
        for check in resource_usage::constraint_checks(&content, c) {
            result.slos.push(SloCheck {
                measurement: format!("{}/{}", result.method, result.identifier),
                subject: check.subject,
                threshold: check.limit,
                observed: check.used,
                unit: check.unit.into(),
                met: check.met,
                enforced: true,
            });
        }
    }
    result.sources = Some(serde_json::Value::Array(
        sampled
            .iter()
            .map(|s| {
                serde_json::json!({
                    "url": s.url,
                    "name": s.name(),
                    "scrapes": s.scrapes,
                    "scrape_errors": s.scrape_errors,
                })
            })
            .collect(),
    ));
    if sampled.iter().all(|s| s.scrapes == 0) {
        tracing::warn!(identifier = %result.identifier, "{}: no /metrics could be scraped: its ResourceUsageSummary is empty", result.method);
    }
    result.summaries.push(Cl2Summary {
        name: "ResourceUsageSummary".into(),
        content,
    });
    if !test_metrics {
        return;
    }
    let parts = [
        ("EtcdMetrics", "etcd", test_metrics::etcd_metrics(sampled)),
        (
            "SchedulingMetrics",
            "kube-scheduler",
            test_metrics::scheduling_metrics(sampled),
        ),
    ];
    for (name, server, content) in parts {
        match content {
            Some(content) => result.summaries.push(Cl2Summary {
                name: name.into(),
                content,
            }),
            None => result.skipped.push(format!(
                "{name} (no {server} /metrics among the scraped URLs; name it with --server-metrics)"
            )),
        }
    }
    for (part, why) in test_metrics::TEST_METRICS_SKIPPED {
        result.skipped.push(format!("{part} ({why})"));
    }
    for s in &result.skipped {
        tracing::warn!(identifier = %result.identifier, "TestMetrics: skipped {s}");
    }
}

/// Starts sampling the `/metrics` of `params.urls`, else `--server-metrics`,
/// else the target's own (the server loadgen loads: kube-apiserver, or
/// tollgate in front of it), every CL2 control-plane period.
fn usage_summary(m: &MeasurementAction, ctx: &MeasureCtx<'_>) -> Result<ActiveKind, String> {
    let urls: Vec<String> = if !m.urls.is_empty() {
        m.urls.clone()
    } else if !ctx.server_metrics.is_empty() {
        ctx.server_metrics.to_vec()
    } else {
        vec![format!(
            "{}/metrics",
            ctx.target.server.to_string().trim_end_matches('/')
        )]
    };
    if !m.ignored_params.is_empty() {
        tracing::warn!(
            identifier = %m.identifier,
            "{}: params not used (loadgen reads the servers' /metrics, not kubelets or system pods): {}",
            m.method_as_written,
            m.ignored_params.join(", ")
        );
    }
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for url in urls {
        let s = Scraper::new(ctx.target_options, &url, &ctx.target.credentials)
            .map_err(|e| format!("{url}: {e}"))?;
        tasks.push(tokio::spawn(resource_usage::sample(
            s,
            url,
            resource_usage::INTERVAL,
            stop.clone(),
        )));
    }
    Ok(ActiveKind::UsageSummary {
        stop,
        tasks,
        test_metrics: m.method == Method::TestMetrics,
    })
}

/// The perfdash file prefix of `m`: its `summaryName`, else the name CL2
/// gives the method's summary (PodStartupLatency's carries the identifier;
/// CL2 has no `APIResponsivenessPrometheusSimple` method, only the identifier).
fn summary_name(m: &MeasurementAction) -> String {
    match m.method {
        // Only CL2's APIResponsivenessPrometheus reads `summaryName`.
        Method::ApiResponsiveness if m.cl2.summary_name.is_some() => {
            m.cl2.summary_name.clone().unwrap_or_default()
        }
        Method::ApiResponsiveness
            if m.method_as_written
                .to_ascii_lowercase()
                .starts_with("apiresponsivenessprometheus") =>
        {
            "APIResponsivenessPrometheus".into()
        }
        Method::PodStartupLatency => format!("PodStartupLatency_{}", m.identifier),
        Method::SchedulingThroughput => "SchedulingThroughput".into(),
        _ => m.method_as_written.clone(),
    }
}

/// CL2's APIResponsiveness PerfData: per call kind, p50/p90/p99 in ms and
/// the labels perfdash reads (`SlowCount`: 1 when the kind's p99 misses its SLO).
fn api_perfdata(calls: &[CallSummary], t: &Thresholds) -> serde_json::Value {
    let items: Vec<serde_json::Value> = calls
        .iter()
        .map(|c| {
            let key = CallKey {
                verb: c.verb.clone(),
                resource: c.resource.clone(),
                scope: c.scope.clone(),
            };
            let slow = slo_for(&key, t)
                .is_some_and(|(_, limit)| c.latency_ms.p99 > limit.as_secs_f64() * 1000.0);
            serde_json::json!({
                "data": {"Perc50": c.latency_ms.p50, "Perc90": c.latency_ms.p90, "Perc99": c.latency_ms.p99},
                "unit": "ms",
                "labels": {
                    "Verb": c.verb,
                    "Resource": c.resource,
                    "Subresource": "",
                    "Scope": c.scope,
                    "Count": c.requests.to_string(),
                    "SlowCount": u64::from(slow).to_string(),
                },
            })
        })
        .collect();
    serde_json::json!({"version": "v1", "dataItems": items})
}

pub fn method_name(m: Method) -> &'static str {
    match m {
        Method::ApiResponsiveness => "APIResponsiveness",
        Method::ResourceUsage => "ResourceUsage",
        Method::WatchLatency => "WatchLatency",
        Method::WaitForControlledPodsRunning => "WaitForControlledPodsRunning",
        Method::WaitForRunningPods => "WaitForRunningPods",
        Method::PodStartupLatency => "PodStartupLatency",
        Method::SchedulingThroughput => "SchedulingThroughput",
        Method::ResourceUsageSummary => "ResourceUsageSummary",
        Method::TestMetrics => "TestMetrics",
        Method::Sleep => "Sleep",
        Method::Skipped => "Skipped",
    }
}

/// ClusterLoader2 PerfData items for API calls, labelled with `labels`.
pub fn perf_items(calls: &[CallSummary], labels: &[(&str, &str)]) -> Vec<serde_json::Value> {
    calls
        .iter()
        .map(|c| {
            let mut l = serde_json::Map::new();
            for (k, v) in labels {
                l.insert((*k).into(), (*v).into());
            }
            l.insert("Verb".into(), c.verb.clone().into());
            l.insert("Resource".into(), c.resource.clone().into());
            l.insert("Scope".into(), c.scope.clone().into());
            l.insert("Count".into(), c.requests.to_string().into());
            l.insert("Rate429".into(), format!("{:.6}", c.rate_429).into());
            serde_json::json!({
                "data": {
                    "Perc50": c.latency_ms.p50,
                    "Perc90": c.latency_ms.p90,
                    "Perc99": c.latency_ms.p99,
                },
                "unit": "ms",
                "labels": l,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(status: u16) -> Outcome {
        Outcome {
            status: Some(status),
            ..Outcome::default()
        }
    }

    #[tokio::test]
    async fn api_slos_follow_the_kubernetes_classes() {
        let calls = ApiCalls::default();
        let post = CallKey {
            verb: "POST".into(),
            resource: "pods".into(),
            scope: "namespace".into(),
        };
        let list = CallKey {
            verb: "LIST".into(),
            resource: "pods".into(),
            scope: "cluster".into(),
        };
        for _ in 0..10 {
            calls.record(&post, &ok(201), Duration::from_millis(1500));
            calls.record(&list, &ok(200), Duration::from_secs(2));
        }
        calls.record(&list, &ok(429), Duration::from_millis(1));
        let m = MeasurementAction {
            method: Method::ApiResponsiveness,
            method_as_written: "APIResponsiveness".into(),
            identifier: "api".into(),
            action: super::super::validate::Action::Start,
            resource: "pods".parse().expect("resource"),
            watches: 1,
            urls: vec![],
            interval: Duration::from_secs(1),
            thresholds: None,
            action_as_written: "start".into(),
            cl2: Cl2Params::default(),
            cl2_dialect: false,
            ignored_params: Vec::new(),
        };
        let active = api_active(
            &m,
            Some(Thresholds {
                max_429_rate: Some(0.01),
                ..Thresholds::default()
            }),
        );
        active.add_calls(&calls);
        let r = active.gather(Some((&m, 2))).await;
        let by: BTreeMap<&str, bool> = r.slos.iter().map(|s| (s.subject.as_str(), s.met)).collect();
        assert_eq!(
            by.get("p99 POST pods namespace (mutating)"),
            Some(&false),
            "{by:?}"
        );
        assert_eq!(
            by.get("p99 LIST pods cluster (read cluster)"),
            Some(&true),
            "{by:?}"
        );
        assert_eq!(by.get("429 rate"), Some(&false), "{by:?}");
        assert_eq!(r.gathered_in_step, Some(2));
    }

    fn api_active(m: &MeasurementAction, thresholds: Option<Thresholds>) -> Active {
        Active {
            method: m.method,
            method_as_written: m.method_as_written.clone(),
            identifier: m.identifier.clone(),
            started_in_step: 0,
            started: Instant::now(),
            thresholds,
            kind: ActiveKind::Api(Arc::new(ApiCalls::default())),
            cl2: m.cl2.clone(),
            cl2_dialect: m.cl2_dialect,
            summary_name: summary_name(m),
        }
    }

    /// CL2's APIResponsivenessPrometheus: a slow call fails the run only with
    /// enableViolations, beyond allowedSlowCalls; the file is named by summaryName.
    #[tokio::test]
    async fn cl2_api_responsiveness_enforces_only_when_enabled() {
        let slow = CallKey {
            verb: "POST".into(),
            resource: "pods".into(),
            scope: "namespace".into(),
        };
        let calls = ApiCalls::default();
        calls.record(&slow, &ok(201), Duration::from_millis(1500));
        let action = |cl2: Cl2Params| MeasurementAction {
            method: Method::ApiResponsiveness,
            method_as_written: "APIResponsivenessPrometheus".into(),
            identifier: "APIResponsivenessPrometheusSimple".into(),
            action: super::super::validate::Action::Gather,
            action_as_written: "gather".into(),
            resource: "pods".parse().expect("resource"),
            watches: 1,
            urls: vec![],
            interval: Duration::from_secs(1),
            thresholds: None,
            cl2,
            cl2_dialect: true,
            ignored_params: Vec::new(),
        };
        let enforced = |cl2: Cl2Params| {
            let m = action(cl2);
            let a = api_active(&m, None);
            a.add_calls(&calls);
            async move {
                let r = a.gather(Some((&m, 1))).await;
                assert!(r.slos.iter().any(|s| !s.met), "the call is slow");
                (r.slos.iter().any(|s| !s.met && s.enforced), r.summaries)
            }
        };
        let (e, summaries) = enforced(Cl2Params::default()).await;
        assert!(!e, "CL2's default: violations not enabled");
        assert_eq!(summaries[0].name, "APIResponsivenessPrometheus");
        let labels = &summaries[0].content["dataItems"][0]["labels"];
        assert_eq!(labels["SlowCount"], "1");
        assert_eq!(labels["Count"], "1");
        assert_eq!(labels["Subresource"], "");
        let (e, summaries) = enforced(Cl2Params {
            enable_violations: Some(true),
            summary_name: Some("APIResponsivenessPrometheus_simple".into()),
            ..Cl2Params::default()
        })
        .await;
        assert!(e, "enabled: the slow call fails the run");
        assert_eq!(summaries[0].name, "APIResponsivenessPrometheus_simple");
        let (e, _) = enforced(Cl2Params {
            enable_violations: Some(true),
            allowed_slow_calls: 1,
            ..Cl2Params::default()
        })
        .await;
        assert!(!e, "one slow call kind is allowed");
    }

    fn empty_result(method: &str) -> MeasurementResult {
        MeasurementResult {
            method: method.into(),
            method_as_written: method.into(),
            identifier: method.into(),
            started_in_step: 0,
            gathered_in_step: Some(1),
            duration_s: 1.0,
            calls: Vec::new(),
            server_metrics: Vec::new(),
            watch: None,
            pods: None,
            sources: None,
            skipped: Vec::new(),
            slos: Vec::new(),
            summaries: Vec::new(),
        }
    }

    /// A constraint over its container's 99th percentile fails the run (CL2's
    /// violation error); TestMetrics adds no file for parts it could not sample and
    /// says each skipped part by name.
    #[test]
    fn usage_constraints_fail_the_run_and_test_metrics_says_what_it_skipped() {
        let sampled = Sampled {
            url: "http://127.0.0.1:6443/metrics".into(),
            component: Some("kube-apiserver"),
            scrapes: 2,
            cpu_cores: vec![3.0],
            memory_bytes: vec![1 << 30, 1 << 30],
            ..Sampled::default()
        };
        let mut limits = BTreeMap::new();
        limits.insert(
            "kube-apiserver".to_string(),
            resource_usage::Constraint {
                cpu_constraint: 2.0,
                memory_constraint: 0,
            },
        );
        let mut r = empty_result("ResourceUsageSummary");
        gather_usage(&mut r, std::slice::from_ref(&sampled), false, Some(&limits));
        assert_eq!(r.slos.len(), 1, "{:?}", r.slos);
        assert!(!r.slos[0].met && r.slos[0].enforced, "{:?}", r.slos);
        let names: Vec<&str> = r.summaries.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["ResourceUsageSummary"]);
        assert!(r.skipped.is_empty());

        let mut r = empty_result("TestMetrics");
        gather_usage(&mut r, &[sampled], true, None);
        assert!(r.slos.is_empty());
        let names: Vec<&str> = r.summaries.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["ResourceUsageSummary"]);
        let skipped = r.skipped.join("\n");
        for part in [
            "EtcdMetrics",
            "SchedulingMetrics",
            "MetricsForE2E",
            "CPUProfile",
            "SystemPodMetrics",
            "ClusterOOMsTracker",
        ] {
            assert!(skipped.contains(part), "{part}: {skipped}");
        }
    }
}
