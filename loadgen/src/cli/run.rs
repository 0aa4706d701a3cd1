//! A run's flags ([`RunArgs`]) and their checks, turned into the run's [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use super::nodes::NodeArgs;
use super::target::TargetArgs;
use super::{parse_duration, resource, CliError, ScheduleArg};
use crate::ops::{ListRv, OpKind, OpSpec, PatchTarget, PatchType, Resource};
use crate::rate::Rate;
use crate::schedule::ScheduleKind;
use crate::send::SendOptions;
use crate::watch::{InitialList, WatchSpec};
use crate::{BurstSpec, Config, Shard};

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
    /// After --duration, SIGTERM or SIGINT, how long in-flight requests may still finish.
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
    /// Watches start with a streaming list (sendInitialEvents=true, client-go's WatchListClient) instead of LIST then WATCH; where the apiserver refuses it, LIST then WATCH [default: false].
    #[arg(long, help_heading = "Operations")]
    pub watch_list: bool,

    // --- simulated nodes ---
    #[command(flatten)]
    pub node_args: NodeArgs,
}

/// What every operation of one run shares.
struct OpBase {
    namespace: String,
    object_prefix: String,
    objects: u64,
    run_id: String,
}

impl OpBase {
    fn op(&self, name: &str, kind: OpKind, rate: Rate, resource: Resource) -> OpSpec {
        OpSpec {
            name: name.to_string(),
            kind,
            rate,
            resource,
            namespace: self.namespace.clone(),
            object_prefix: self.object_prefix.clone(),
            objects: self.objects,
            run_id: self.run_id.clone(),
        }
    }
}

/// What a run does, before it is divided among shards.
struct Work {
    operations: Vec<OpSpec>,
    watches: Option<WatchSpec>,
    burst: Option<BurstSpec>,
    schedule: ScheduleKind,
}

impl Work {
    /// This shard's part: rates divided, counts split, its own Poisson seed.
    fn shard(mut self, shard: Shard) -> Work {
        for op in &mut self.operations {
            op.rate = op.rate.divided(shard.count);
        }
        if let Some(w) = self.watches.as_mut() {
            w.count = shard.part(w.count);
        }
        self.watches = self.watches.filter(|w| w.count > 0);
        if let Some(b) = self.burst.as_mut() {
            b.count = shard.part(b.count);
        }
        self.burst = self.burst.filter(|b| b.count > 0);
        if let ScheduleKind::Poisson { seed } = &mut self.schedule {
            *seed = seed.wrapping_add(u64::from(shard.index));
        }
        self
    }
}

impl RunArgs {
    /// Checks the flags and builds the run's [`Config`]. An empty namespace
    /// means "the kubeconfig context's, else default" (resolved by [`crate::run`]).
    pub fn into_config(self) -> Result<Config, CliError> {
        if self.duration.is_zero() {
            return Err(CliError::Invalid {
                flag: "duration",
                message: "must be greater than zero".into(),
            });
        }
        let base = OpBase {
            namespace: self.namespace.clone().unwrap_or_default(),
            object_prefix: self.object_prefix.clone(),
            objects: self.objects.max(1),
            run_id: format!("{:06x}", rand::random::<u32>() & 0xff_ffff),
        };
        let operations = self.operations(&base)?;
        let watches = self.watches(&base.namespace)?;
        let burst = self.burst(&base)?;
        let nodes = self.nodes(&base.namespace)?;
        if operations.is_empty() && watches.is_none() && burst.is_none() && nodes.is_none() {
            return Err(CliError::NoOperations);
        }
        let mut work = Work {
            operations,
            watches,
            burst,
            schedule: self.schedule(),
        };
        if let Some(shard) = self.shard {
            work = work.shard(shard);
        }
        Ok(Config {
            target: self.target.options(),
            duration: self.duration,
            schedule: work.schedule,
            max_in_flight: self.max_in_flight.max(1),
            max_connections: self.max_connections,
            send: SendOptions {
                timeout: self.timeout,
                honor_retry_after: self.honor_retry_after,
                max_retries: self.max_retries,
                max_retry_wait: self.max_retry_wait,
            },
            operations: work.operations,
            watches: work.watches,
            burst: work.burst,
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

    /// The rate-driven operations, in the order their flags are listed.
    fn operations(&self, base: &OpBase) -> Result<Vec<OpSpec>, CliError> {
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
            let listed = resource("list-resource", &self.list_resource)?;
            operations.push(base.op("list", kind, rate, listed));
        }
        if let Some(rate) = self.gets {
            let got = resource("get-resource", &self.get_resource)?;
            operations.push(base.op("get", OpKind::Get, rate, got));
        }
        if let Some(rate) = self.patches {
            let kind = OpKind::Patch {
                target: self.patch_target,
                patch_type: self.patch_type,
            };
            operations.push(base.op("patch", kind, rate, pods.clone()));
        }
        if let Some(rate) = self.creates {
            operations.push(base.op("create", OpKind::Create, rate, pods.clone()));
        }
        if let Some(rate) = self.deletes {
            operations.push(base.op("delete", OpKind::Delete, rate, pods));
        }
        Ok(operations)
    }

    fn watches(&self, namespace: &str) -> Result<Option<WatchSpec>, CliError> {
        Ok(match self.watches {
            Some(count) if count > 0 => Some(WatchSpec {
                count,
                resource: resource("watch-resource", &self.watch_resource)?,
                namespace: (!self.watch_all_namespaces).then(|| namespace.to_string()),
                label_selector: self.watch_label_selector.clone(),
                field_selector: self.watch_field_selector.clone(),
                per_connection: self.watches_per_connection.max(1),
                timeout: None,
                initial: if self.watch_list {
                    InitialList::Stream
                } else {
                    InitialList::List
                },
            }),
            _ => None,
        })
    }

    fn burst(&self, base: &OpBase) -> Result<Option<BurstSpec>, CliError> {
        let pods = resource("list-resource", "pods")?;
        Ok(self.burst.filter(|n| *n > 0).map(|count| BurstSpec {
            count,
            resource: pods,
            namespace: base.namespace.clone(),
            object_prefix: base.object_prefix.clone(),
            run_id: base.run_id.clone(),
        }))
    }

    /// The simulated nodes, with their Stages loaded and checked.
    fn nodes(&self, namespace: &str) -> Result<Option<crate::nodes::NodeSimSpec>, CliError> {
        let mut nodes = self.node_args.spec(namespace, &self.object_prefix);
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
        Ok(nodes)
    }

    fn schedule(&self) -> ScheduleKind {
        match self.schedule {
            ScheduleArg::Constant => ScheduleKind::Constant,
            ScheduleArg::Poisson => ScheduleKind::Poisson { seed: self.seed },
            ScheduleArg::Steps => ScheduleKind::Steps {
                steps: self.steps.max(1),
                step: self.step_duration,
            },
        }
    }
}
