//! The command line: the clap argument structs live here, and each turns
//! into the plain config the library takes. Every flag has help and its
//! default; `into_config` checks the combination.
//!
//! # Layout
//! - this file: [`Cli`] and its subcommands, [`CliError`], durations.
//! - [`run`]: a run's flags ([`run::RunArgs`]) → [`Config`].
//! - [`target`]: how to reach the API server → [`crate::target::TargetOptions`].
//! - [`nodes`]: the simulated-node flags → [`crate::nodes::NodeSimSpec`].
//! - [`seed`]: `loadgen seed` / `cleanup` → [`crate::seed::SeedConfig`], [`crate::seed::CleanupConfig`].
//! - [`etcd`]: `loadgen etcd` (and a scenario's `etcd:` phase) → [`crate::etcd::EtcdConfig`].
//! - [`scenario`]: `loadgen run SCENARIO` → [`crate::scenario::RunOptions`], and its main.

pub mod etcd;
pub mod nodes;
pub mod run;
pub mod scenario;
pub mod seed;
pub mod target;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::ops::Resource;
use crate::Config;
use run::RunArgs;

/// Arrival shape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum ScheduleArg {
    /// Evenly spaced requests.
    #[default]
    Constant,
    /// Exponentially distributed gaps (Poisson arrivals), seeded by --seed.
    Poisson,
    /// --steps equal steps of --step-duration, ramping each rate up to its target.
    Steps,
}

/// Open-loop load for the Kubernetes API, measured from each request's intended start.
///
/// `loadgen [RUN FLAGS]` runs load; `loadgen merge|seed|cleanup` are the other tools.
#[derive(Debug, Parser)]
#[command(name = "loadgen", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// The tools besides a run.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Merge the --output directories of `--shard i/N` runs (histograms merged, not averaged).
    Merge(MergeArgs),
    /// Create fake nodes and pods, labelled as loadgen's.
    Seed(seed::SeedArgs),
    /// Delete exactly the objects loadgen created (label app.kubernetes.io/managed-by=loadgen).
    Cleanup(seed::CleanupArgs),
    /// Simulate nodes: a run whose load is --count nodes' heartbeats, leases and daemons (any run flag applies).
    Nodes(Box<NodesCommand>),
    /// Load etcd directly: range reads over a prefix, puts, watches (see `loadgen etcd --help`).
    Etcd(Box<etcd::EtcdArgs>),
    /// Run a scenario file: steps in series, phases in parallel, measurements and SLO verdicts (loadgen/SCENARIOS.md).
    Run(Box<scenario::ScenarioArgs>),
}

/// `loadgen nodes --count N [RUN FLAGS]`: `loadgen --nodes N [RUN FLAGS]`.
#[derive(Debug, clap::Args)]
pub struct NodesCommand {
    /// Nodes to simulate (same as --nodes) [default: the preset's].
    #[arg(long)]
    pub count: Option<u64>,
    #[command(flatten)]
    pub run: RunArgs,
}

impl NodesCommand {
    /// The run's [`Config`].
    pub fn into_config(mut self) -> Result<Config, CliError> {
        if self.count.is_some() {
            self.run.node_args.nodes = self.count;
        }
        if self.run.node_args.nodes.is_none() && self.run.node_args.preset.is_none() {
            return Err(CliError::Invalid {
                flag: "count",
                message: "give --count N or --preset".into(),
            });
        }
        self.run.into_config()
    }
}

/// `loadgen merge`.
#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// Shard output directories to merge.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Where to write the merged summary.json, perfdata.json, timeseries.csv and histograms/.
    #[arg(long)]
    pub output: PathBuf,
}

impl Cli {
    /// The run's [`Config`] (for `loadgen` without a subcommand).
    pub fn into_config(self) -> Result<Config, CliError> {
        self.run.into_config()
    }
}

/// Why the flags do not make a run.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("nothing to do: give at least one of --lists, --gets, --patches, --creates, --deletes, --burst, --watches, --nodes, --preset")]
    NoOperations,
    #[error("--{flag}: {message}")]
    Invalid { flag: &'static str, message: String },
}

pub(crate) fn resource(flag: &'static str, s: &str) -> Result<Resource, CliError> {
    s.parse()
        .map_err(|message| CliError::Invalid { flag, message })
}

/// `500ms`, `30s`, `5m`, `1h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration `{s}`: expected e.g. 500ms, 30s, 5m, 1h"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration `{s}`: unknown unit `{unit}` (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration `{s}`: out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::HttpVersion;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("3 weeks").is_err());
    }

    #[test]
    fn bad_rate_is_refused_with_the_reason() {
        let err =
            Cli::try_parse_from(["loadgen", "--lists", "500/fortnight"]).expect_err("bad unit");
        let text = err.to_string();
        assert!(text.contains("unknown unit `fortnight`"), "{text}");
    }

    #[test]
    fn builds_operations() {
        let cli = Cli::try_parse_from([
            "loadgen",
            "--server",
            "http://127.0.0.1:1",
            "--lists",
            "500/min",
            "--patches",
            "10/s",
            "--list-rv",
            "cache",
            "--watches",
            "3",
            "--http2",
        ])
        .expect("parse");
        let config = cli.into_config().expect("config");
        assert_eq!(config.operations.len(), 2);
        assert_eq!(config.target.http, HttpVersion::Http2);
        assert_eq!(config.watches.as_ref().map(|w| w.count), Some(3));
        let none = Cli::try_parse_from(["loadgen"])
            .expect("parse")
            .into_config();
        assert!(matches!(none, Err(CliError::NoOperations)));
        let sharded = Cli::try_parse_from([
            "loadgen",
            "--lists",
            "10/s",
            "--watches",
            "5",
            "--shard",
            "1/4",
        ])
        .expect("parse")
        .into_config()
        .expect("config");
        assert!((sharded.operations[0].rate.as_per_second() - 2.5).abs() < 1e-9);
        assert_eq!(sharded.watches.map(|w| w.count), Some(1));
        assert!(Cli::try_parse_from(["loadgen", "--lists", "1/s", "--shard", "4/4"]).is_err());
        let merge =
            Cli::try_parse_from(["loadgen", "merge", "a", "b", "--output", "c"]).expect("merge");
        assert!(matches!(merge.command, Some(Command::Merge(_))));
    }
}
