//! The runs of `summary.json`: what every run shared, each run with loadgen's summary, and
//! the headline figures read off them.

use serde::{Deserialize, Serialize};

use crate::report::loadgen::LoadgenRun;

/// What every run shared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Setup {
    pub nodes: u64,
    pub pods: u64,
    pub heartbeat_nodes: u64,
    pub patches_per_second: f64,
    pub lists_per_minute: f64,
    pub duration_seconds: f64,
    /// The protected run's hand-set static pool; none: tollgate's default adaptive budget.
    pub quota_bytes_per_second: Option<u64>,
    /// The static pools' burst (and the hand-set pool's).
    pub quota_burst_bytes: u64,
    /// Static pools the demo tries for the best one (0: not measured).
    #[serde(default)]
    pub static_pools: usize,
    pub sim_args: Vec<String>,
    pub tollgate_args: Vec<String>,
    pub loadgen_args: Vec<String>,
}

/// One run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// `baseline`, `baseline-tollgate`, `unprotected`, `protected`, `static-<bytes/s>`.
    pub name: String,
    pub title: String,
    pub through_tollgate: bool,
    pub list_storm: bool,
    /// The run's directory, relative to the demo's.
    pub dir: String,
    /// Modeled OOM kills of the simulated apiserver during the run.
    pub sim_restarts: u64,
    /// tollgate's flags in this run (besides addresses), if it ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tollgate_args: Vec<String>,
    /// loadgen's `summary.json` for this run, as it wrote it.
    pub loadgen: serde_json::Value,
}

/// The figures a reader compares first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Headline {
    pub run: String,
    pub title: String,
    pub patch_p50_ms: Option<f64>,
    pub patch_p99_ms: Option<f64>,
    pub list_p99_ms: Option<f64>,
    /// LISTs answered 2xx per minute: the goodput.
    pub lists_served_per_minute: f64,
    pub rejected_429: u64,
    pub errors: u64,
    /// Heartbeat PATCHes not answered 2xx (429s and errors).
    #[serde(default)]
    pub heartbeat_failures: u64,
    pub sim_crashes: u64,
    /// Heartbeats within tollgate's default adaptive target (see [`judge`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within_target: Option<bool>,
}

impl Headline {
    pub fn of(run: &RunSummary, lg: &LoadgenRun) -> Headline {
        let ops: Vec<String> = lg.summary["operations"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| o["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        Headline {
            run: run.name.clone(),
            title: run.title.clone(),
            patch_p50_ms: lg.latency_ms("patch", "p50"),
            patch_p99_ms: lg.latency_ms("patch", "p99"),
            list_p99_ms: lg.latency_ms("list", "p99"),
            lists_served_per_minute: lg.ok_per_minute("list"),
            rejected_429: ops.iter().map(|o| lg.status_count(o, "429")).sum(),
            errors: ops.iter().map(|o| lg.errors(o)).sum(),
            heartbeat_failures: lg.errors("patch") + lg.status_count("patch", "429"),
            sim_crashes: run.sim_restarts,
            within_target: None,
        }
    }
}
