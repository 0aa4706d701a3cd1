//! The command line. Every flag has help and its default; `into_config`
//! checks the combination and builds the typed [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::ops::{ListRv, OpKind, OpSpec, PatchTarget, PatchType, Resource};
use crate::rate::Rate;
use crate::schedule::ScheduleKind;
use crate::send::SendOptions;
use crate::target::{HttpVersion, TargetOptions};
use crate::watch::WatchSpec;
use crate::{BurstSpec, Config};

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
    Seed(crate::seed::SeedArgs),
    /// Delete exactly the objects loadgen created (label app.kubernetes.io/managed-by=loadgen).
    Cleanup(crate::seed::CleanupArgs),
    /// Simulate nodes: a run whose load is --count nodes' heartbeats, leases and daemons (any run flag applies).
    Nodes(Box<NodesCommand>),
    /// Load etcd directly: range reads over a prefix, puts, watches (see `loadgen etcd --help`).
    Etcd(Box<crate::etcd::EtcdArgs>),
    /// Run a scenario file: steps in series, phases in parallel, measurements and SLO verdicts (loadgen/SCENARIOS.md).
    Run(Box<crate::scenario::ScenarioArgs>),
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

/// How to reach the API server (shared by runs, seed and cleanup).
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// API server URL (e.g. https://127.0.0.1:6443); without it the kubeconfig is used.
    #[arg(long, help_heading = "Target")]
    pub server: Option<String>,
    /// Kubeconfig file [default: $KUBECONFIG, else ~/.kube/config]; exec credential plugins are run.
    #[arg(long, help_heading = "Target")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context [default: current-context].
    #[arg(long, help_heading = "Target")]
    pub context: Option<String>,
    /// PEM CA bundle to verify the server [default: the kubeconfig's].
    #[arg(long, help_heading = "Target")]
    pub certificate_authority: Option<PathBuf>,
    /// PEM client certificate (with --client-key) [default: the kubeconfig's].
    #[arg(long, help_heading = "Target")]
    pub client_certificate: Option<PathBuf>,
    /// PEM client private key [default: the kubeconfig's].
    #[arg(long, help_heading = "Target")]
    pub client_key: Option<PathBuf>,
    /// Bearer token [default: the kubeconfig's].
    #[arg(long, help_heading = "Target")]
    pub token: Option<String>,
    /// Do not verify the server certificate [default: false].
    #[arg(long, help_heading = "Target")]
    pub insecure_skip_tls_verify: bool,
    /// Server name to verify the certificate against [default: the URL's host].
    #[arg(long, help_heading = "Target")]
    pub tls_server_name: Option<String>,
    /// HTTP version: auto = HTTP/2 over TLS when offered, else HTTP/1.1 (client-go's behaviour).
    #[arg(long, value_enum, default_value_t = HttpVersion::Auto, help_heading = "Target")]
    pub http_version: HttpVersion,
    /// Shorthand for --http-version 2.
    #[arg(long, help_heading = "Target")]
    pub http2: bool,
}

impl TargetArgs {
    /// The target options these flags describe.
    pub fn options(&self) -> TargetOptions {
        TargetOptions {
            server: self.server.clone(),
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            certificate_authority: self.certificate_authority.clone(),
            client_certificate: self.client_certificate.clone(),
            client_key: self.client_key.clone(),
            token: self.token.clone(),
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            tls_server_name: self.tls_server_name.clone(),
            http: if self.http2 {
                HttpVersion::Http2
            } else {
                self.http_version
            },
        }
    }
}

/// The flags of a run.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    // --- run ---
    /// How long to schedule requests (e.g. 30s, 5m, 1h).
    #[arg(long, default_value = "60s", value_parser = parse_duration, help_heading = "Run")]
    pub duration: Duration,
    /// Arrival schedule of every rate.
    #[arg(long, value_enum, default_value_t = ScheduleArg::Constant, help_heading = "Run")]
    pub schedule: ScheduleArg,
    /// Number of steps for --schedule steps.
    #[arg(long, default_value_t = 5, help_heading = "Run")]
    pub steps: u32,
    /// Length of each step for --schedule steps.
    #[arg(long, default_value = "60s", value_parser = parse_duration, help_heading = "Run")]
    pub step_duration: Duration,
    /// Seed for --schedule poisson.
    #[arg(long, default_value_t = 1, help_heading = "Run")]
    pub seed: u64,
    /// Outstanding requests per operation; ticks beyond it are dropped and counted.
    #[arg(long, default_value_t = 1000, help_heading = "Run")]
    pub max_in_flight: usize,
    /// HTTP/1.1 connections each operation keeps open at most (like wrk's -c); beyond it
    /// requests wait for a connection, their latency still counted from the intended start.
    /// 0: one per request in flight, up to --max-in-flight. HTTP/2 multiplexes and ignores it.
    #[arg(long, default_value_t = 0, help_heading = "Run")]
    pub max_connections: usize,
    /// Per-attempt timeout, from sending to the end of the body.
    #[arg(long, default_value = "60s", value_parser = parse_duration, help_heading = "Run")]
    pub timeout: Duration,
    /// After --duration, how long in-flight requests may still finish.
    #[arg(long, default_value = "30s", value_parser = parse_duration, help_heading = "Run")]
    pub drain_timeout: Duration,
    /// Retry 429s after their Retry-After (header or Status details), like client-go [default: false].
    #[arg(long, help_heading = "Run")]
    pub honor_retry_after: bool,
    /// Retries per request with --honor-retry-after.
    #[arg(long, default_value_t = 3, help_heading = "Run")]
    pub max_retries: u32,
    /// Longest Retry-After honoured; longer waits are cut to this.
    #[arg(long, default_value = "10s", value_parser = parse_duration, help_heading = "Run")]
    pub max_retry_wait: Duration,
    /// Namespace for namespaced operations [default: the kubeconfig context's, else "default"].
    #[arg(long, short = 'n', help_heading = "Run")]
    pub namespace: Option<String>,
    /// Name prefix of the objects GETs and PATCHes address ({prefix}pod-K, {prefix}node-K).
    #[arg(long, default_value = "loadgen-", help_heading = "Run")]
    pub object_prefix: String,
    /// GETs and PATCHes cycle over this many objects (K = i mod N).
    #[arg(long, default_value_t = 100, help_heading = "Run")]
    pub objects: u64,
    /// Write summary.json, perfdata.json, timeseries.csv and histograms/ here.
    #[arg(long, help_heading = "Run")]
    pub output: Option<PathBuf>,
    /// Do not draw the progress line (it is never drawn when stdout is not a terminal).
    #[arg(long, help_heading = "Run")]
    pub no_progress: bool,
    /// Prometheus /metrics URLs (apiserver, etcd, simulator) to scrape for CPU and memory.
    #[arg(long, num_args = 1.., help_heading = "Run")]
    pub server_metrics: Vec<String>,
    /// How often to scrape --server-metrics.
    #[arg(long, default_value = "5s", value_parser = parse_duration, help_heading = "Run")]
    pub server_metrics_interval: Duration,
    /// Namespaces writes may go to even if not labelled as loadgen's (repeat or comma-separate).
    #[arg(long, value_delimiter = ',', help_heading = "Safety")]
    pub namespace_allow: Vec<String>,
    /// Most objects one run creates (creates and burst); further creates are skipped.
    #[arg(long, default_value_t = 10_000, help_heading = "Safety")]
    pub max_objects: u64,
    /// Print what would be sent, then exit without contacting the server.
    #[arg(long, help_heading = "Safety")]
    pub dry_run: bool,
    /// Serve loadgen's own live metrics (loadgen_*) at http://ADDR/metrics during the run.
    #[arg(long, help_heading = "Run")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Run as shard i of N (e.g. 0/4): every rate and count is divided by N; merge with `loadgen merge`.
    #[arg(long, help_heading = "Run")]
    pub shard: Option<crate::Shard>,

    // --- operations ---
    /// LIST rate (N/s, N/min, N/h).
    #[arg(long, help_heading = "Operations")]
    pub lists: Option<Rate>,
    /// Resource to LIST: PLURAL, VERSION/PLURAL or GROUP/VERSION/PLURAL.
    #[arg(long, default_value = "pods", help_heading = "Operations")]
    pub list_resource: String,
    /// LIST across all namespaces instead of --namespace [default: false].
    #[arg(long, short = 'A', help_heading = "Operations")]
    pub all_namespaces: bool,
    /// Label selector for LISTs (e.g. app=web).
    #[arg(long, short = 'l', help_heading = "Operations")]
    pub label_selector: Option<String>,
    /// Field selector for LISTs (e.g. spec.nodeName=node-1).
    #[arg(long, help_heading = "Operations")]
    pub field_selector: Option<String>,
    /// LIST consistency: consistent (rv unset), cache (rv=0) or exact (rvMatch=Exact).
    #[arg(long, value_enum, default_value_t = ListRv::Consistent, help_heading = "Operations")]
    pub list_rv: ListRv,
    /// Page size for LISTs (follows `continue`; a paged LIST counts as one request) [default: unpaged].
    #[arg(long, help_heading = "Operations")]
    pub list_limit: Option<u32>,
    /// GET rate.
    #[arg(long, help_heading = "Operations")]
    pub gets: Option<Rate>,
    /// Resource to GET.
    #[arg(long, default_value = "pods", help_heading = "Operations")]
    pub get_resource: String,
    /// PATCH rate.
    #[arg(long, help_heading = "Operations")]
    pub patches: Option<Rate>,
    /// What PATCHes change: node-status heartbeats or pod-labels.
    #[arg(long, value_enum, default_value_t = PatchTarget::NodeStatus, help_heading = "Operations")]
    pub patch_target: PatchTarget,
    /// PATCH content type.
    #[arg(long, value_enum, default_value_t = PatchType::Strategic, help_heading = "Operations")]
    pub patch_type: PatchType,
    /// Pod create rate.
    #[arg(long, help_heading = "Operations")]
    pub creates: Option<Rate>,
    /// Pod delete rate (deletes pods this run created, oldest first).
    #[arg(long, help_heading = "Operations")]
    pub deletes: Option<Rate>,
    /// Create N pods in parallel, then delete them in parallel (Tess.IO's first table).
    #[arg(long, help_heading = "Operations")]
    pub burst: Option<u64>,
    /// Concurrent long-lived watches (informer-like).
    #[arg(long, help_heading = "Operations")]
    pub watches: Option<u64>,
    /// Resource to watch.
    #[arg(long, default_value = "pods", help_heading = "Operations")]
    pub watch_resource: String,
    /// Watch across all namespaces instead of --namespace [default: false].
    #[arg(long, help_heading = "Operations")]
    pub watch_all_namespaces: bool,
    /// Watches per HTTP/2 connection (HTTP/1.1 always uses one connection per watch).
    #[arg(long, default_value_t = 100, help_heading = "Operations")]
    pub watches_per_connection: u64,
    /// Label selector for watches.
    #[arg(long, help_heading = "Operations")]
    pub watch_label_selector: Option<String>,
    /// Field selector for watches.
    #[arg(long, help_heading = "Operations")]
    pub watch_field_selector: Option<String>,

    // --- simulated nodes ---
    #[command(flatten)]
    pub node_args: crate::nodes::preset::NodeArgs,
}

/// Why the flags do not make a run.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("nothing to do: give at least one of --lists, --gets, --patches, --creates, --deletes, --burst, --watches, --nodes, --preset")]
    NoOperations,
    #[error("--{flag}: {message}")]
    Invalid { flag: &'static str, message: String },
}

fn resource(flag: &'static str, s: &str) -> Result<Resource, CliError> {
    s.parse()
        .map_err(|message| CliError::Invalid { flag, message })
}

impl RunArgs {
    /// Checks the flags and builds the run's [`Config`]. An empty namespace
    /// means "the kubeconfig context's, else default" (resolved by [`crate::run`]).
    pub fn into_config(self) -> Result<Config, CliError> {
        let namespace = self.namespace.clone().unwrap_or_default();
        let run_id = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        if self.duration.is_zero() {
            return Err(CliError::Invalid {
                flag: "duration",
                message: "must be greater than zero".into(),
            });
        }
        let base = |name: &str, kind: OpKind, rate: Rate, res: Resource| OpSpec {
            name: name.to_string(),
            kind,
            rate,
            resource: res,
            namespace: namespace.clone(),
            object_prefix: self.object_prefix.clone(),
            objects: self.objects.max(1),
            run_id: run_id.clone(),
        };
        let pods = resource("list-resource", "pods")?;
        let mut operations = Vec::new();
        if let Some(rate) = self.lists {
            let kind = OpKind::List {
                label_selector: self.label_selector.clone(),
                field_selector: self.field_selector.clone(),
                rv: self.list_rv,
                limit: self.list_limit,
                all_namespaces: self.all_namespaces,
            };
            operations.push(base(
                "list",
                kind,
                rate,
                resource("list-resource", &self.list_resource)?,
            ));
        }
        if let Some(rate) = self.gets {
            operations.push(base(
                "get",
                OpKind::Get,
                rate,
                resource("get-resource", &self.get_resource)?,
            ));
        }
        if let Some(rate) = self.patches {
            let kind = OpKind::Patch {
                target: self.patch_target,
                patch_type: self.patch_type,
            };
            operations.push(base("patch", kind, rate, pods.clone()));
        }
        if let Some(rate) = self.creates {
            operations.push(base("create", OpKind::Create, rate, pods.clone()));
        }
        if let Some(rate) = self.deletes {
            operations.push(base("delete", OpKind::Delete, rate, pods.clone()));
        }
        let watches = match self.watches {
            Some(count) if count > 0 => Some(WatchSpec {
                count,
                resource: resource("watch-resource", &self.watch_resource)?,
                namespace: (!self.watch_all_namespaces).then(|| namespace.clone()),
                label_selector: self.watch_label_selector.clone(),
                field_selector: self.watch_field_selector.clone(),
                per_connection: self.watches_per_connection.max(1),
                timeout: None,
            }),
            _ => None,
        };
        let burst = self.burst.filter(|n| *n > 0).map(|count| BurstSpec {
            count,
            resource: pods.clone(),
            namespace: namespace.clone(),
            object_prefix: self.object_prefix.clone(),
            run_id: run_id.clone(),
        });
        let mut nodes = self.node_args.spec(&namespace, &self.object_prefix);
        if let Some(n) = nodes.as_mut() {
            n.shard = self.shard;
            n.stages =
                crate::stages::StagesSpec::load(&self.node_args.stages, self.node_args.time_scale)
                    .map_err(|e| CliError::Invalid {
                        flag: "stages",
                        message: e.to_string(),
                    })?;
        }
        if nodes.is_none() && !self.node_args.stages.is_empty() {
            return Err(CliError::Invalid {
                flag: "stages",
                message: "Stages drive simulated nodes: give --nodes, --preset or `loadgen nodes --count N`".into(),
            });
        }
        if operations.is_empty() && watches.is_none() && burst.is_none() && nodes.is_none() {
            return Err(CliError::NoOperations);
        }
        let schedule = match self.schedule {
            ScheduleArg::Constant => ScheduleKind::Constant,
            ScheduleArg::Poisson => ScheduleKind::Poisson { seed: self.seed },
            ScheduleArg::Steps => ScheduleKind::Steps {
                steps: self.steps.max(1),
                step: self.step_duration,
            },
        };
        let (mut operations, mut watches, mut burst, mut schedule) =
            (operations, watches, burst, schedule);
        if let Some(shard) = self.shard {
            for op in &mut operations {
                op.rate = op.rate.divided(shard.count);
            }
            if let Some(w) = watches.as_mut() {
                w.count = shard.part(w.count);
            }
            watches = watches.filter(|w| w.count > 0);
            if let Some(b) = burst.as_mut() {
                b.count = shard.part(b.count);
            }
            burst = burst.filter(|b| b.count > 0);
            if let ScheduleKind::Poisson { seed } = &mut schedule {
                *seed = seed.wrapping_add(u64::from(shard.index));
            }
        }
        Ok(Config {
            target: self.target.options(),
            duration: self.duration,
            schedule,
            max_in_flight: self.max_in_flight.max(1),
            max_connections: self.max_connections,
            send: SendOptions {
                timeout: self.timeout,
                honor_retry_after: self.honor_retry_after,
                max_retries: self.max_retries,
                max_retry_wait: self.max_retry_wait,
            },
            operations,
            watches,
            burst,
            nodes,
            output: self.output,
            progress: !self.no_progress,
            drain_timeout: self.drain_timeout,
            server_metrics: self.server_metrics,
            server_metrics_interval: self.server_metrics_interval,
            shard: self.shard,
            namespace_allow: self.namespace_allow,
            max_objects: self.max_objects,
            dry_run: self.dry_run,
            metrics_listen: self.metrics_listen.map(crate::MetricsListen::Addr),
        })
    }
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
