//! `loadgen run SCENARIO.yaml`: load tests kept as files, in the Cluster
//! Loader model — namespaces managed by the run, tuning sets, steps in series
//! whose phases run in parallel (declarative objects from templates, loadgen
//! traffic, direct etcd load) or whose measurements start and gather around
//! later steps, SLO verdicts. The format is documented in `loadgen/SCENARIOS.md`.
//!
//! # Layout
//! - [`file`]: the file as written (YAML/JSON, keys case-insensitive, unknown fields refused).
//! - [`validate`]: every check before anything runs → a [`Scenario`].
//! - [`template`]: the `{{ }}` language of object templates (grammar in its docs).
//! - [`tuning`]: tuning sets → unit start offsets (pure) and the open-loop spreader.
//! - [`reconcile`]: objects created / updated / deleted to the declared replicas.
//! - [`measure`]: APIResponsiveness, ResourceUsage, WatchLatency and their SLOs.
//! - [`namespaces`]: the run's own namespaces, created first and deleted last.
//! - [`run`]: steps in series, phases in parallel, cleanup whatever happens.
//! - [`output`]: `summary.json`, `perfdata.json` per step and for the run; the end table.
//! - `etcd_phase`: an `etcd:` phase through [`crate::etcd`].
//! - [`cluster_size`]: `.Nodes` of ClusterLoader2 configs, counted on the cluster.
//! - [`resource_usage`]: CL2's ResourceUsageSummary and TestMetrics' outside parts,
//!   from the servers' `/metrics`.
//! - [`pods`]: CL2's pod measurements (PodStartupLatency, SchedulingThroughput,
//!   WaitForControlledPodsRunning, WaitForRunningPods), seen through a watch.

pub mod cluster_size;
mod etcd_phase;
pub mod file;
pub mod measure;
pub mod namespaces;
pub mod output;
pub mod pods;
pub mod reconcile;
pub mod resource_usage;
pub mod run;
pub mod template;
pub mod test_metrics;
pub mod tuning;
pub mod validate;

use std::path::PathBuf;

pub use output::{ScenarioReport, Verdict};
pub use run::{connect, run, RunOptions};
pub use validate::{load, Scenario};

/// Why a scenario was refused or could not run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("reading {file}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {path}: {reason}")]
    Invalid {
        file: PathBuf,
        path: String,
        reason: String,
    },
    #[error(transparent)]
    Target(#[from] crate::target::TargetError),
    #[error("cannot reach {server}: {reason}")]
    Unreachable { server: String, reason: String },
    #[error("namespaces: {reason}")]
    Namespaces { reason: String },
    #[error("writing results to {dir}")]
    Output {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Exit status when a declared SLO was missed (0: all met or none declared;
/// 1: the run failed; 64: the scenario was refused).
pub const EXIT_SLO_MISSED: u8 = 3;

/// A one-line-per-step outline (`--validate`).
pub fn outline(s: &Scenario) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "scenario {} ({}): {} namespaces{}\n",
        s.name,
        s.file.display(),
        s.namespaces.len(),
        s.namespaces
            .first()
            .map(|f| format!(" ({f} …)"))
            .unwrap_or_default()
    );
    for part in &s.skipped {
        let _ = writeln!(out, "  skipped: {part}");
    }
    for (i, step) in s.steps.iter().enumerate() {
        match &step.body {
            validate::StepBody::Phases(ps) => {
                let kinds: Vec<String> = ps
                    .iter()
                    .map(|p| match &p.kind {
                        validate::PhaseKind::Objects(o) => format!(
                            "{}: {} × [{}] per namespace",
                            p.name,
                            o.replicas,
                            o.bundle
                                .iter()
                                .map(|b| format!("{} {}", b.basename, b.resource.plural))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        validate::PhaseKind::Load(c) => {
                            format!("{}: loadgen for {:?}", p.name, c.duration)
                        }
                        validate::PhaseKind::Etcd(a) => format!("{}: etcd {}", p.name, a.join(" ")),
                    })
                    .collect();
                let _ = writeln!(out, "  step {i} {}: {}", step.name, kinds.join("; "));
            }
            validate::StepBody::Measurements(ms) => {
                let m: Vec<String> = ms
                    .iter()
                    .map(|m| {
                        let action = match (m.method, m.action) {
                            (validate::Method::Skipped, _) => "skip",
                            (_, validate::Action::Start) => "start",
                            (_, validate::Action::Gather) => "gather",
                            (_, validate::Action::Run) => "run",
                        };
                        let ignored = if m.ignored_params.is_empty() {
                            String::new()
                        } else {
                            format!(" (params not read: {})", m.ignored_params.join(", "))
                        };
                        format!("{action} {}/{}{ignored}", m.method_as_written, m.identifier)
                    })
                    .collect();
                let _ = writeln!(out, "  step {i} {}: {}", step.name, m.join(", "));
            }
        }
    }
    out
}
