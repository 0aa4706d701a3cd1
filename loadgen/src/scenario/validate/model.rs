//! The checked scenario: what [`super::load`] returns and [`crate::scenario::run`] runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::ops::Resource;
use crate::scenario::template::ObjectTemplate;
use crate::scenario::tuning::TuningSet;

/// A checked scenario, ready to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Method {
    #[serde(rename = "APIResponsiveness")]
    ApiResponsiveness,
    ResourceUsage,
    WatchLatency,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Start,
    Gather,
}

#[derive(Debug, Clone)]
pub struct MeasurementAction {
    pub method: Method,
    /// The method as the file spells it (CL2's `APIResponsivenessPrometheus`):
    /// the perfdash file name starts with it.
    pub method_as_written: String,
    pub identifier: String,
    pub action: Action,
    pub resource: Resource,
    pub watches: u64,
    pub urls: Vec<String>,
    pub interval: Duration,
    pub thresholds: Option<Thresholds>,
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
