//! `loadgen run SCENARIO [FLAGS]`: its flags → [`RunOptions`], and the
//! command itself (load, run, print, exit by the verdict).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kubeio::error_chain;

use super::parse_duration;
use super::target::TargetArgs;
use crate::scenario::validate::{dialect_of, load_with, Dialect, LoadOptions};
use crate::scenario::{outline, run, RunOptions, Verdict, EXIT_SLO_MISSED};

/// `loadgen run SCENARIO [FLAGS]`.
#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {
    /// The scenario file (YAML or JSON); templates are read relative to it.
    pub file: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    /// Override a scenario parameter: --param NAME=VALUE (repeat) [default: the file's params].
    #[arg(long = "param", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// ClusterLoader2 overrides file (YAML `key: value`; repeat, later files win); implies --format cl2 [default: none].
    #[arg(long = "testoverrides", alias = "test-overrides")]
    pub testoverrides: Vec<PathBuf>,
    /// The file's format: loadgen's scenario format, a ClusterLoader2 config, or auto (CL2 if it has CL2's `namespace:` key, template variables or helpers).
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub format: Format,
    /// Write step-NN-<name>/summary.json, perfdata.json and the run's summary.json here [default: nothing written].
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// etcd client URL for `etcd:` phases that do not name --endpoints themselves.
    #[arg(long)]
    pub etcd_endpoints: Option<String>,
    /// Prometheus /metrics URLs for ResourceUsage measurements that name none.
    #[arg(long, num_args = 1..)]
    pub server_metrics: Vec<String>,
    /// After SIGTERM/SIGINT, how long the current step's requests in flight may still finish (a load phase's own --drain-timeout may be shorter).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// Per-request timeout of the object calls.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Seed for RAND in templates and the random tuning sets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Check the scenario (fields, tuning sets, templates, flags), print its steps and exit.
    #[arg(long)]
    pub validate: bool,
    /// ClusterLoader2's `--nodes`: the `.Nodes` a CL2 config sees, instead of counting the cluster's schedulable nodes (an overrides file or --param Nodes=N still wins) [default: counted; with --validate, required unless given otherwise].
    #[arg(long)]
    pub nodes: Option<u64>,
}

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Auto,
    Loadgen,
    Cl2,
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
            drain_timeout: self.drain_timeout,
            ..RunOptions::default()
        };
        o.send.timeout = self.timeout;
        o
    }
}

/// The `loadgen run` command: load, run, print, and exit by the verdict (or
/// 128 + the signal's number when SIGINT/SIGTERM ended it early).
pub fn main(args: ScenarioArgs) -> ExitCode {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen run: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut load_options = LoadOptions {
        params: args.params.clone(),
        overrides: args.testoverrides.clone(),
        dialect: match args.format {
            Format::Auto => None,
            Format::Loadgen => Some(Dialect::Loadgen),
            Format::Cl2 => Some(Dialect::Cl2),
        },
        nodes: args.nodes,
    };
    let opts = args.options();
    // CL2's `.Nodes` is the cluster's size unless given; --validate sends nothing.
    let text = std::fs::read_to_string(&args.file).unwrap_or_default();
    if !args.validate
        && args.nodes.is_none()
        && dialect_of(&text, &load_options) == Dialect::Cl2
        && !args.params.iter().any(|(k, _)| k == "Nodes")
    {
        let counted = rt.block_on(async {
            let (_, client) = crate::scenario::connect(&opts.target)
                .await
                .map_err(|e| error_chain(&e))?;
            crate::scenario::cluster_size::schedulable_nodes(&client).await
        });
        match counted {
            Ok(n) => load_options.nodes = Some(n),
            Err(e) => {
                eprintln!("loadgen run: counting the cluster's nodes for .Nodes (or give --param Nodes=N): {e}");
                return ExitCode::from(1);
            }
        }
    }
    let scenario = match load_with(&args.file, &load_options) {
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
    let (result, interrupted) = rt.block_on(async {
        let interrupts = crate::signal::Interrupts::listen("cleaning up and writing results");
        let result = run(&scenario, &opts, interrupts.token()).await;
        (result, interrupts.exit_code())
    });
    match result {
        Err(e) => {
            eprintln!("loadgen run: {}", error_chain(&e));
            ExitCode::from(1)
        }
        Ok(report) => {
            print!("{}", report.table());
            if let Some(code) = interrupted {
                ExitCode::from(code)
            } else if report.error.is_some() {
                ExitCode::from(1)
            } else if report.verdict == Verdict::Fail {
                ExitCode::from(EXIT_SLO_MISSED)
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}
