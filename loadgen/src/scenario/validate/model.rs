//! The checked scenario: what [`super::load`] returns and [`crate::scenario::run`] runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::ops::Resource;
pub use crate::scenario::resource_usage::Constraint;
use crate::scenario::template::ObjectTemplate;
use crate::scenario::tuning::TuningSet;

/// A checked scenario, ready to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    /// Parts of a ClusterLoader2 config loadgen accepts but does not run
    /// (dependencies, chaosMonkey, measurements it does not implement, …):
    /// warned about at the start and listed in the summary.
    pub skipped: Vec<String>,
    pub file: PathBuf,
    pub params: BTreeMap<String, Value>,
    /// The managed namespaces, `<basename>-1..N`, created before the steps.
    pub namespaces: Vec<String>,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    pub body: StepBody,
}

#[derive(Debug, Clone)]
pub enum StepBody {
    /// Run in parallel.
    Phases(Vec<Phase>),
    Measurements(Vec<MeasurementAction>),
}

#[derive(Debug, Clone)]
pub struct Phase {
    pub name: String,
    pub kind: PhaseKind,
}

#[derive(Debug, Clone)]
pub enum PhaseKind {
    Objects(ObjectPhase),
    /// loadgen's traffic operations; the target is `loadgen run`'s.
    Load(Box<crate::Config>),
    /// `loadgen etcd` flags (with `--duration`), parsed when the phase runs.
    Etcd(Vec<String>),
}

/// Declarative objects: `replicas` of each bundle object in each namespace.
#[derive(Debug, Clone)]
pub struct ObjectPhase {
    /// `None`: cluster-scoped objects.
    pub namespaces: Option<Vec<String>>,
    pub replicas: u32,
    pub tuning: Option<TuningSet>,
    pub bundle: Vec<ObjectSet>,
}

#[derive(Debug, Clone)]
pub struct ObjectSet {
    pub basename: String,
    pub template_path: PathBuf,
    pub template: ObjectTemplate,
    pub resource: Resource,
    pub api_version: String,
    pub kind: String,
}

impl ObjectSet {
    /// What names one replicated set in a namespace: its type and basename
    /// (CL2 keys its state by kind and basename, so a ServiceAccount and a
    /// Secret may share one), as `group/plural/basename`.
    pub fn key(&self) -> String {
        format!(
            "{}/{}/{}",
            self.resource.group, self.resource.plural, self.basename
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Method {
    /// Also CL2's `APIResponsivenessPrometheus` (and `…Simple`).
    #[serde(rename = "APIResponsiveness")]
    ApiResponsiveness,
    ResourceUsage,
    WatchLatency,
    /// CL2's: every matched controller has its desired pods running.
    WaitForControlledPodsRunning,
    /// CL2's: `desiredPodCount` matching pods running (one shot).
    WaitForRunningPods,
    /// CL2's: create → schedule → run → watch, per pod.
    PodStartupLatency,
    /// CL2's: pods scheduled per second.
    SchedulingThroughput,
    /// CL2's: the servers' CPU and memory percentiles, from their `/metrics`.
    ResourceUsageSummary,
    /// CL2's bundle: its ResourceUsageSummary and EtcdMetrics parts (the rest
    /// cannot be measured from outside and is listed as skipped).
    TestMetrics,
    /// CL2's: waits `duration` (one shot).
    Sleep,
    /// A method loadgen does not implement: accepted with its params, skipped
    /// with a warning naming it and listed as skipped in the summary.
    Skipped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Start,
    Gather,
    /// A one-shot measurement (Sleep, WaitForRunningPods) runs where it stands.
    Run,
}

#[derive(Debug, Clone)]
pub struct MeasurementAction {
    pub method: Method,
    /// The method as the file spells it (CL2's `APIResponsivenessPrometheus`):
    /// the perfdash file name starts with it unless `summary_name` is given.
    pub method_as_written: String,
    pub identifier: String,
    pub action: Action,
    /// The action as written (a skipped measurement's may be anything).
    pub action_as_written: String,
    pub resource: Resource,
    pub watches: u64,
    pub urls: Vec<String>,
    pub interval: Duration,
    pub thresholds: Option<Thresholds>,
    /// CL2's params that loadgen reads, checked.
    pub cl2: Cl2Params,
    /// From a CL2 config (whose defaults differ: enableViolations).
    pub cl2_dialect: bool,
    /// Params given that loadgen does not read (named in `--validate`'s outline).
    pub ignored_params: Vec<String>,
}

/// The ClusterLoader2 measurement params loadgen implements (each default is CL2's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cl2Params {
    /// The perfdash file's prefix [default: the method, as CL2 names it].
    pub summary_name: Option<String>,
    /// APIResponsiveness: a missed SLO fails the run only when true [CL2: false;
    /// loadgen's own format: always].
    pub enable_violations: Option<bool>,
    /// APIResponsiveness: calls over their SLO that are still allowed [default: 0].
    pub allowed_slow_calls: u64,
    /// APIResponsiveness: CL2's choice of Prometheus query; loadgen measures each
    /// call itself, so both give the same exact percentiles.
    pub use_simple_latency_query: bool,
    /// The objects' label selector (`a=b,c!=d`).
    pub label_selector: Option<String>,
    /// WaitForControlledPodsRunning: the controllers' `apiVersion` and `kind`.
    pub api_version: Option<String>,
    pub kind: Option<String>,
    /// WaitForControlledPodsRunning: how long a gather may wait [CL2 default: 10m];
    /// WaitForRunningPods: `timeout` [CL2 default: 60m].
    pub timeout: Option<Duration>,
    /// WaitForRunningPods: how many pods must be running.
    pub desired_pod_count: Option<u64>,
    /// WaitForRunningPods: only this namespace [default: all].
    pub namespace: Option<String>,
    /// PodStartupLatency: the startup SLO (p50, p90, p99) [CL2 default: 5s each].
    pub threshold: Option<Duration>,
    /// Sleep: how long.
    pub duration: Option<Duration>,
    /// ResourceUsageSummary and TestMetrics: CL2's `resourceConstraints` file,
    /// read (container → limits on its 99th percentile).
    pub resource_constraints: Option<BTreeMap<String, Constraint>>,
}

/// SLO thresholds (p99 latencies and the 429 share).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Thresholds {
    pub mutating: Duration,
    pub read_single: Duration,
    pub read_namespace: Duration,
    pub read_cluster: Duration,
    pub max_429_rate: Option<f64>,
    pub watch_p99: Option<Duration>,
}

impl Default for Thresholds {
    /// The Kubernetes API call latency SLOs (p99).
    fn default() -> Self {
        Thresholds {
            mutating: Duration::from_secs(1),
            read_single: Duration::from_secs(1),
            read_namespace: Duration::from_secs(30),
            read_cluster: Duration::from_secs(30),
            max_429_rate: None,
            watch_p99: None,
        }
    }
}
