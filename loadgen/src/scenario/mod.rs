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

mod etcd_phase;
pub mod file;
pub mod measure;
pub mod namespaces;
pub mod output;
pub mod reconcile;
pub mod run;
pub mod template;
pub mod tuning;
pub mod validate;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

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

/// `loadgen run SCENARIO [FLAGS]`.
#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {
    /// The scenario file (YAML or JSON); templates are read relative to it.
    pub file: PathBuf,
    #[command(flatten)]
    pub target: crate::cli::TargetArgs,
    /// Override a scenario parameter: --param NAME=VALUE (repeat) [default: the file's params].
    #[arg(long = "param", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// Write step-NN-<name>/summary.json, perfdata.json and the run's summary.json here [default: nothing written].
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// etcd client URL for `etcd:` phases that do not name --endpoints themselves.
    #[arg(long)]
    pub etcd_endpoints: Option<String>,
    /// Prometheus /metrics URLs for ResourceUsage measurements that name none.
    #[arg(long, num_args = 1..)]
    pub server_metrics: Vec<String>,
    /// Per-request timeout of the object calls.
    #[arg(long, default_value = "60s", value_parser = crate::cli::parse_duration)]
    pub timeout: Duration,
    /// Seed for RAND in templates and the random tuning sets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Check the scenario (fields, tuning sets, templates, flags), print its steps and exit.
    #[arg(long)]
    pub validate: bool,
}

fn parse_param(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.trim().is_empty())
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .ok_or_else(|| format!("invalid --param `{s}`: expected NAME=VALUE"))
}

impl ScenarioArgs {
    /// The run options these flags describe.
    pub fn options(&self) -> RunOptions {
        let mut o = RunOptions {
            target: self.target.options(),
            output: self.output.clone(),
            etcd_endpoints: self.etcd_endpoints.clone(),
            server_metrics: self.server_metrics.clone(),
            seed: self.seed,
            ..RunOptions::default()
        };
        o.send.timeout = self.timeout;
        o
    }
}

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
                        format!(
                            "{} {}/{}",
                            if m.action == validate::Action::Start {
                                "start"
                            } else {
                                "gather"
                            },
                            measure::method_name(m.method),
                            m.identifier
                        )
                    })
                    .collect();
                let _ = writeln!(out, "  step {i} {}: {}", step.name, m.join(", "));
            }
        }
    }
    out
}

/// The `loadgen run` command: load, run, print, and exit by the verdict.
pub fn cli_main(args: ScenarioArgs) -> ExitCode {
    let scenario = match load(&args.file, &args.params) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("loadgen run: {}", error_chain(&e));
            return ExitCode::from(64);
        }
    };
    if args.validate {
        print!("{}", outline(&scenario));
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen run: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let opts = args.options();
    let result = rt.block_on(async {
        let shutdown = CancellationToken::new();
        let on_signal = shutdown.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                tracing::warn!("interrupted: stopping, cleaning up and writing results");
                on_signal.cancel();
            }
        });
        run(&scenario, &opts, shutdown).await
    });
    match result {
        Err(e) => {
            eprintln!("loadgen run: {}", error_chain(&e));
            ExitCode::from(1)
        }
        Ok(report) => {
            print!("{}", report.table());
            if report.error.is_some() {
                ExitCode::from(1)
            } else if report.verdict == Verdict::Fail {
                ExitCode::from(EXIT_SLO_MISSED)
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}
