//! ClusterLoader2's pod measurements, measured from outside as CL2 measures
//! them: by what a watch of the pods sees.
//!
//! - [`PodTracker`]: one list-then-watch of pods (a label selector, all
//!   namespaces) recording, per pod, when the watch first saw it (`create`),
//!   first saw it bound to a node (`schedule`) and first saw it `Running`
//!   (`run`, which CL2 also reports as `watch`). PodStartupLatency's
//!   transitions and SchedulingThroughput's per-interval rates come from it.
//! - [`wait_controlled`]: WaitForControlledPodsRunning's gather — every
//!   matched controller has its desired pods running (CL2's counts: `replicas`,
//!   a Job's `parallelism` — its pods count once Succeeded too, since a
//!   simulated kubelet finishes them —, a DaemonSet's schedulable nodes matching
//!   its nodeSelector), and the pods of controllers deleted since the last
//!   gather are gone.
//! - [`wait_running`]: WaitForRunningPods — `desiredPodCount` matching pods running.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apimodel::selector::LabelSelector;
use http::Method;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ops::encode;
use crate::target::ApiClient;
use crate::watch::informer::{self, AfterFailure, BackoffPolicy, EventType, Handler, ListWatch};

/// Pods tracked at most: past it, new pods are counted as dropped, not timed.
const MAX_PODS: usize = 1_000_000;

/// When the watch saw each phase of one pod (from the tracker's start).
#[derive(Debug, Clone, Default)]
struct PodTimes {
    create: Option<Duration>,
    schedule: Option<Duration>,
    run: Option<Duration>,
    stateless: bool,
}

#[derive(Debug, Default)]
struct Seen {
    pods: HashMap<String, PodTimes>,
    dropped: u64,
}

/// One watch of pods and what it saw.
pub struct PodTracker {
    seen: Arc<Mutex<Seen>>,
    listed: Arc<AtomicBool>,
    start: Instant,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

struct Recorder {
    seen: Arc<Mutex<Seen>>,
    listed: Arc<AtomicBool>,
    start: Instant,
    timeout: Duration,
}

impl Recorder {
    fn observe(&self, pod: &Value) {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let now = self.start.elapsed();
        let mut s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let key = format!("{ns}/{name}");
        if !s.pods.contains_key(&key) && s.pods.len() >= MAX_PODS {
            s.dropped += 1;
            return;
        }
        let t = s.pods.entry(key).or_default();
        t.stateless = is_stateless(pod);
        t.create.get_or_insert(now);
        if pod["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
        {
            t.schedule.get_or_insert(now);
        }
        if pod["status"]["phase"] == "Running" {
            t.run.get_or_insert(now);
        }
    }
}

/// CL2's `isPodStateless`: only emptyDir, downwardAPI, configMap, secret or projected volumes.
fn is_stateless(pod: &Value) -> bool {
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|v| {
            [
                "emptyDir",
                "downwardAPI",
                "configMap",
                "secret",
                "projected",
            ]
            .iter()
            .any(|k| v.get(*k).is_some())
        })
}

impl Handler for Recorder {
    async fn list(&mut self, lw: &ListWatch, path: String) -> Option<String> {
        let v = get_json(&lw.client, &path, self.timeout).await.ok()?;
        for pod in v["items"].as_array().into_iter().flatten() {
            self.observe(pod);
        }
        self.listed.store(true, Ordering::Relaxed);
        v["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string)
    }

    async fn event(&mut self, kind: EventType, object: Value, _line_bytes: usize) -> bool {
        if kind != EventType::Deleted {
            self.observe(&object);
        }
        true
    }
}

/// A GET answered 200 with JSON, or why not.
async fn get_json(client: &ApiClient, path: &str, timeout: Duration) -> Result<Value, String> {
    let req = client
        .request(Method::GET, path, None)
        .map_err(|e| format!("GET {path}: {e}"))?;
    let resp = tokio::time::timeout(timeout, client.send(req))
        .await
        .map_err(|_| format!("GET {path}: no answer within {timeout:?}"))?
        .map_err(|e| format!("GET {path}: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("GET {path}: {e}"))?
        .to_bytes();
    if status != 200 {
        return Err(format!("GET {path}: HTTP {status}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("GET {path}: {e}"))
}

fn selector_query(label_selector: Option<&str>) -> Vec<String> {
    label_selector
        .filter(|s| !s.trim().is_empty())
        .map(|s| vec![format!("labelSelector={}", encode(s))])
        .unwrap_or_default()
}

impl PodTracker {
    /// Starts watching pods matching `label_selector` in every namespace.
    pub fn start(
        client: &ApiClient,
        label_selector: Option<&str>,
        timeout: Duration,
    ) -> PodTracker {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let start = Instant::now();
        let stop = CancellationToken::new();
        let lw = ListWatch {
            client: client.clone(),
            collection: "/api/v1/pods".into(),
            filters: selector_query(label_selector),
            request_timeout: timeout,
            watch_timeout: Some(Duration::from_secs(300)),
            id: 0,
            backoff: BackoffPolicy::CLIENT_GO,
            after_failure: AfterFailure::Relist,
            initial: informer::InitialList::List,
        };
        let listed = Arc::new(AtomicBool::new(false));
        let rec = Recorder {
            seen: seen.clone(),
            listed: listed.clone(),
            start,
            timeout,
        };
        let task = tokio::spawn(informer::run(lw, rec, stop.clone()));
        PodTracker {
            seen,
            listed,
            start,
            stop,
            task,
        }
    }

    /// Whether the first LIST is in (CL2 waits for its informer to sync, so
    /// pods created after the start are timed from their creation).
    pub fn synced(&self) -> bool {
        self.listed.load(Ordering::Relaxed)
    }

    /// Stops the watch.
    pub async fn stop(self) -> PodsSeen {
        self.stop.cancel();
        let _ = self.task.await;
        let s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        PodsSeen {
            pods: s.pods.values().cloned().collect(),
            dropped: s.dropped,
            span: self.start.elapsed(),
        }
    }
}

/// What a tracker saw, once stopped.
pub struct PodsSeen {
    pods: Vec<PodTimes>,
    pub dropped: u64,
    span: Duration,
}

/// CL2's `LatencyMetric`: the 50th, 90th and 99th of sorted samples (nearest rank).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub perc50: Duration,
    pub perc90: Duration,
    pub perc99: Duration,
    pub count: usize,
}

fn nearest_rank<T: Copy>(sorted: &[T], p: usize) -> T {
    let i = (sorted.len() * p).div_ceil(100).max(1) - 1;
    sorted[i.min(sorted.len() - 1)]
}

impl Latency {
    fn of(mut v: Vec<Duration>) -> Option<Latency> {
        if v.is_empty() {
            return None;
        }
        v.sort();
        Some(Latency {
            perc50: nearest_rank(&v, 50),
            perc90: nearest_rank(&v, 90),
            perc99: nearest_rank(&v, 99),
            count: v.len(),
        })
    }
}

/// PodStartupLatency's transitions, by CL2's names.
pub const TRANSITIONS: &[&str] = &[
    "create_to_schedule",
    "schedule_to_run",
    "run_to_watch",
    "schedule_to_watch",
    "pod_startup",
    "create_to_run",
];

impl PodsSeen {
    /// Each transition's latency over the pods `filter` keeps (a transition
    /// no pod made is absent).
    pub fn transitions(&self, stateless: Option<bool>) -> BTreeMap<&'static str, Latency> {
        let mut out = BTreeMap::new();
        for name in TRANSITIONS {
            let lags: Vec<Duration> = self
                .pods
                .iter()
                .filter(|p| stateless.is_none_or(|s| p.stateless == s))
                .filter_map(|p| {
                    // `watch` is `run` (CL2: "now equivalent to runPhase").
                    let (from, to) = match *name {
                        "create_to_schedule" => (p.create, p.schedule),
                        "schedule_to_run" => (p.schedule, p.run),
                        "run_to_watch" => (p.run, p.run),
                        "schedule_to_watch" => (p.schedule, p.run),
                        "pod_startup" | "create_to_run" => (p.create, p.run),
                        _ => (None, None),
                    };
                    Some(to?.saturating_sub(from?))
                })
                .collect();
            if let Some(l) = Latency::of(lags) {
                out.insert(*name, l);
            }
        }
        out
    }

    /// SchedulingThroughput: pods newly bound per second in each `interval`
    /// since the start (CL2 samples its pod store every `interval`), as
    /// CL2's `{perc50, perc90, perc99, max}`.
    pub fn throughput(&self, interval: Duration) -> Value {
        let n = (self.span.as_secs_f64() / interval.as_secs_f64()).floor() as usize;
        let mut per = vec![0u64; n];
        for p in &self.pods {
            if let Some(t) = p.schedule {
                let i = (t.as_secs_f64() / interval.as_secs_f64()) as usize;
                if let Some(c) = per.get_mut(i) {
                    *c += 1;
                }
            }
        }
        let mut rates: Vec<f64> = per
            .iter()
            .map(|c| *c as f64 / interval.as_secs_f64())
            .collect();
        rates.sort_by(f64::total_cmp);
        if rates.is_empty() {
            return json!({"perc50": 0.0, "perc90": 0.0, "perc99": 0.0, "max": 0.0});
        }
        json!({
            "perc50": nearest_rank(&rates, 50),
            "perc90": nearest_rank(&rates, 90),
            "perc99": nearest_rank(&rates, 99),
            "max": rates[rates.len() - 1],
        })
    }
}

/// A CL2 LatencyMetric map as PerfData (`LatencyMapToPerfData`).
pub fn latency_perfdata(m: &BTreeMap<&'static str, Latency>) -> Value {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let items: Vec<Value> = m
        .iter()
        .map(|(name, l)| {
            json!({
                "data": {"Perc50": ms(l.perc50), "Perc90": ms(l.perc90), "Perc99": ms(l.perc99)},
                "unit": "ms",
                "labels": {"Metric": name},
            })
        })
        .collect();
    json!({"version": "1.0", "dataItems": items})
}

// === WaitForControlledPodsRunning ===

/// One controller: where, its pod selector, and how many pods it wants.
#[derive(Debug, Clone, PartialEq)]
pub struct Controller {
    pub namespace: String,
    pub name: String,
    selector: serde_json::Map<String, Value>,
    pub desired: u64,
    /// A DaemonSet's pod template nodeSelector.
    node_selector: serde_json::Map<String, Value>,
    /// A Job's pods count once they ran to completion too.
    finished_counts: bool,
}

impl Controller {
    fn of(kind: &str, o: &Value) -> Controller {
        let spec = &o["spec"];
        let selector = spec["selector"]["matchLabels"]
            .as_object()
            .or_else(|| {
                spec["selector"]
                    .as_object()
                    .filter(|_| kind == "ReplicationController")
            })
            .or_else(|| spec["template"]["metadata"]["labels"].as_object())
            .cloned()
            .unwrap_or_default();
        // As CL2's tryAcquireReplicasFromUnstructuredSpec: a missing field is 0;
        // a DaemonSet's count is set from the nodes (in `wait_controlled`).
        let desired = match kind {
            "DaemonSet" => 0,
            "Job" => spec["parallelism"].as_u64().unwrap_or(0),
            _ => spec["replicas"].as_u64().unwrap_or(0),
        };
        Controller {
            namespace: o["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .into(),
            name: o["metadata"]["name"].as_str().unwrap_or_default().into(),
            selector,
            desired,
            node_selector: spec["template"]["spec"]["nodeSelector"]
                .as_object()
                .cloned()
                .unwrap_or_default(),
            finished_counts: kind == "Job",
        }
    }

    fn owns(&self, pod: &Value) -> bool {
        pod["metadata"]["namespace"] == self.namespace.as_str()
            && !self.selector.is_empty()
            && pod["metadata"]["labels"].as_object().is_some_and(|l| {
                self.selector
                    .iter()
                    .all(|(k, v)| l.get(k).is_some_and(|have| have == v))
            })
    }
}

/// What WaitForControlledPodsRunning wants: which controllers, and how long to wait.
#[derive(Debug, Clone)]
pub struct ControlledSpec {
    pub api_version: String,
    pub kind: String,
    pub label_selector: Option<String>,
    pub timeout: Duration,
}

/// The result of one gather.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ControlledOutcome {
    pub controllers: usize,
    pub pods_running: u64,
    pub pods_desired: u64,
    /// Controllers deleted since the previous gather whose pods are all gone.
    pub deleted_controllers: usize,
    pub waited_s: f64,
    /// Controllers not running all their pods (or deleted ones with pods left) at the deadline.
    pub not_ready: Vec<String>,
}

/// Waits until every controller `spec` matches runs its desired pods and the
/// controllers gone since `previous` have no pods left; returns the
/// controllers seen (for the next gather) and the outcome (`not_ready`
/// non-empty: timed out).
pub async fn wait_controlled(
    client: &ApiClient,
    spec: &ControlledSpec,
    previous: &[Controller],
) -> Result<(Vec<Controller>, ControlledOutcome), String> {
    let plural = crate::scenario::validate::plural(&spec.kind);
    let base = if spec.api_version.contains('/') {
        format!("/apis/{}/{plural}", spec.api_version)
    } else {
        format!("/api/{}/{plural}", spec.api_version)
    };
    let q = selector_query(spec.label_selector.as_deref());
    let path = if q.is_empty() {
        base
    } else {
        format!("{base}?{}", q.join("&"))
    };
    let started = Instant::now();
    let deadline = started + spec.timeout;
    let per_call = Duration::from_secs(60);
    loop {
        let list = get_json(client, &path, per_call).await?;
        let mut controllers: Vec<Controller> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| Controller::of(&spec.kind, o))
            .collect();
        if spec.kind == "DaemonSet" {
            // CL2 counts the schedulable nodes its nodeSelector matches.
            let nodes = get_json(client, "/api/v1/nodes", per_call).await?;
            let nodes: Vec<&Value> = nodes["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["spec"]["unschedulable"] != true)
                .collect();
            for c in &mut controllers {
                c.desired = nodes
                    .iter()
                    .filter(|n| {
                        c.node_selector.iter().all(|(k, v)| {
                            n["metadata"]["labels"].get(k).is_some_and(|have| have == v)
                        })
                    })
                    .count() as u64;
            }
        }
        let pods = get_json(client, "/api/v1/pods", per_call).await?;
        let pods: Vec<&Value> = pods["items"].as_array().into_iter().flatten().collect();
        let mut not_ready = Vec::new();
        let (mut running, mut desired) = (0, 0);
        for c in &controllers {
            let n = pods
                .iter()
                .filter(|p| {
                    let phase = &p["status"]["phase"];
                    c.owns(p)
                        && (phase == "Running" || (c.finished_counts && phase == "Succeeded"))
                        && p["metadata"]["deletionTimestamp"].is_null()
                })
                .count() as u64;
            running += n.min(c.desired);
            desired += c.desired;
            // A Job's finished pods pile up past its parallelism.
            let ready = if c.finished_counts {
                n >= c.desired
            } else {
                n == c.desired
            };
            if !ready {
                not_ready.push(format!(
                    "{}/{} (running {n} of {})",
                    c.namespace, c.name, c.desired
                ));
            }
        }
        let gone: Vec<&Controller> = previous
            .iter()
            .filter(|p| {
                !controllers
                    .iter()
                    .any(|c| c.namespace == p.namespace && c.name == p.name)
            })
            .collect();
        for g in &gone {
            let left = pods.iter().filter(|p| g.owns(p)).count();
            if left > 0 {
                not_ready.push(format!(
                    "{}/{} (deleted; {left} pods left)",
                    g.namespace, g.name
                ));
            }
        }
        let outcome = ControlledOutcome {
            controllers: controllers.len(),
            pods_running: running,
            pods_desired: desired,
            deleted_controllers: gone.len(),
            waited_s: started.elapsed().as_secs_f64(),
            not_ready,
        };
        if outcome.not_ready.is_empty() || Instant::now() >= deadline {
            return Ok((controllers, outcome));
        }
        tokio::time::sleep(
            Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now())),
        )
        .await;
    }
}

/// WaitForRunningPods: waits until `desired` pods matching the selector (in
/// `namespace`, or all) are `Running`; the count reached and whether in time.
pub async fn wait_running(
    client: &ApiClient,
    label_selector: Option<&str>,
    namespace: Option<&str>,
    desired: u64,
    timeout: Duration,
) -> Result<(u64, bool), String> {
    let base = match namespace {
        Some(ns) => format!("/api/v1/namespaces/{ns}/pods"),
        None => "/api/v1/pods".into(),
    };
    let q = selector_query(label_selector);
    let path = if q.is_empty() {
        base
    } else {
        format!("{base}?{}", q.join("&"))
    };
    // Checked here, not by the server, so a bad selector names itself.
    if let Some(s) = label_selector {
        LabelSelector::parse(s).map_err(|e| format!("labelSelector `{s}`: {e}"))?;
    }
    let deadline = Instant::now() + timeout;
    loop {
        let v = get_json(client, &path, Duration::from_secs(60)).await?;
        let n = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| {
                p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
            })
            .count() as u64;
        if n == desired {
            return Ok((n, true));
        }
        if Instant::now() >= deadline {
            return Ok((n, false));
        }
        tokio::time::sleep(
            Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now())),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(create: u64, schedule: Option<u64>, run: Option<u64>) -> PodTimes {
        PodTimes {
            create: Some(Duration::from_millis(create)),
            schedule: schedule.map(Duration::from_millis),
            run: run.map(Duration::from_millis),
            stateless: true,
        }
    }

    #[test]
    fn transitions_use_cl2s_nearest_rank() {
        let seen = PodsSeen {
            pods: (1..=10)
                .map(|i| pod(0, Some(i * 10), Some(i * 100)))
                .chain([pod(0, None, None)])
                .collect(),
            dropped: 0,
            span: Duration::from_secs(10),
        };
        let t = seen.transitions(None);
        let s = t["create_to_schedule"];
        assert_eq!(s.count, 10, "an unscheduled pod has no transition");
        assert_eq!(s.perc50, Duration::from_millis(50));
        assert_eq!(s.perc90, Duration::from_millis(90));
        assert_eq!(s.perc99, Duration::from_millis(100));
        assert_eq!(t["pod_startup"].perc50, Duration::from_millis(500));
        assert_eq!(t["run_to_watch"].perc99, Duration::ZERO);
        assert!(seen.transitions(Some(false)).is_empty(), "no stateful pods");
        let perf = latency_perfdata(&t);
        assert_eq!(perf["dataItems"].as_array().map(Vec::len), Some(6));
        assert_eq!(perf["dataItems"][0]["unit"], "ms");
    }

    #[test]
    fn throughput_is_pods_bound_per_second_per_interval() {
        // 10 pods bound in the first second, 5 in the third; 4 intervals of 1 s.
        let pods = (0..10)
            .map(|i| pod(0, Some(100 + i), None))
            .chain((0..5).map(|i| pod(0, Some(2_100 + i), None)))
            .collect();
        let seen = PodsSeen {
            pods,
            dropped: 0,
            span: Duration::from_millis(4_200),
        };
        let t = seen.throughput(Duration::from_secs(1));
        assert_eq!(t["max"], 10.0);
        assert_eq!(t["perc50"], 0.0);
        assert_eq!(t["perc90"], 10.0);
    }

    #[test]
    fn controllers_own_pods_by_selector_and_namespace() {
        let d = json!({"metadata": {"namespace": "a", "name": "d"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "x"}}}});
        let c = Controller::of("Deployment", &d);
        assert_eq!(c.desired, 3);
        assert!(
            c.owns(&json!({"metadata": {"namespace": "a", "labels": {"app": "x", "more": "y"}}}))
        );
        assert!(!c.owns(&json!({"metadata": {"namespace": "b", "labels": {"app": "x"}}})));
        assert!(!c.owns(&json!({"metadata": {"namespace": "a", "labels": {"app": "z"}}})));
        let rc = json!({"metadata": {"namespace": "a", "name": "r"},
            "spec": {"selector": {"name": "r"}}});
        let c = Controller::of("ReplicationController", &rc);
        assert_eq!(c.desired, 0, "CL2: no replicas field, no pods awaited");
        assert!(c.owns(&json!({"metadata": {"namespace": "a", "labels": {"name": "r"}}})));
        let stateful = json!({"spec": {"volumes": [{"persistentVolumeClaim": {}}]}});
        assert!(!is_stateless(&stateful));
        assert!(is_stateless(
            &json!({"spec": {"volumes": [{"configMap": {}}]}})
        ));
    }
}
