//! Simulated nodes through the real API: the load a cluster's own nodes put
//! on its control plane (Tess.IO's baseline), from one process.
//!
//! Per node: a Node object (created, or adopted by label), node status
//! heartbeats every `--heartbeat`, Lease renewals every `--lease-renew`, and
//! `--daemons-per-node` informer-like daemons that LIST (resourceVersion=0)
//! then WATCH the node's pods (`fieldSelector=spec.nodeName=NODE`). With
//! `--bind`, a trivial binder puts the namespace's pending pods on the nodes.
//!
//! # Layout
//! - [`beats`]: when each node heartbeats (pure) and the one pacer for all of them.
//! - [`kubelet`]: registration, the heartbeat requests, the heartbeat thread.
//! - [`bind`]: `--bind`, round robin onto the simulated nodes.
//! - [`preset`]: `--preset tess-5k|modern-5k|tess-1k|modern-1k`.
//! - this file: the spec, and starting it all inside a run.
//!
//! Operations in the report: `node-heartbeat` (the headline: PATCH
//! nodes/status latency), `lease-renew`, `daemon-list`, `daemon-event`,
//! `pod-bind`.

pub mod beats;
pub mod bind;
pub mod kubelet;
pub mod preset;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::conn::Conns;
use crate::ops::Resource;
use crate::record::OpRecorder;
use crate::target::{ApiClient, Target};
use crate::watch::{WatchSpec, WatchStats, Watcher};

/// Operation names in the report.
pub const OP_HEARTBEAT: &str = "node-heartbeat";
pub const OP_LEASE: &str = "lease-renew";
pub const OP_DAEMON_LIST: &str = "daemon-list";
pub const OP_DAEMON_EVENT: &str = "daemon-event";
pub const OP_BIND: &str = "pod-bind";

/// What `--nodes N` (or `loadgen nodes --count N`) simulates.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSimSpec {
    /// Nodes, before `--shard` takes its part.
    pub count: u64,
    /// `--adopt-nodes SELECTOR`: use existing nodes matching it instead of creating `{prefix}node-K`.
    pub adopt_selector: Option<String>,
    pub object_prefix: String,
    /// Namespace of `--pods-per-node` pods and of the pods `--bind` binds
    /// (empty: the run's namespace).
    pub namespace: String,
    /// Node status heartbeat interval (0: none).
    pub heartbeat: Duration,
    /// Lease renewal interval (0: no leases).
    pub lease_renew: Duration,
    pub daemons_per_node: u64,
    /// Pods created per node at registration, bound to it.
    pub pods_per_node: u64,
    /// `--bind`: bind pending pods of the namespace to the simulated nodes.
    pub bind: bool,
    pub bind_interval: Duration,
    /// Daemon watches sharing one HTTP/2 connection.
    pub watches_per_connection: u64,
    /// Server-side timeout of each daemon watch (`None`: 5–10 min at random, as client-go).
    pub daemon_watch_timeout: Option<Duration>,
    /// `--shard i/N`: this process simulates nodes `K` with `K mod N == i`.
    pub shard: Option<crate::Shard>,
    /// `--stages`, `--time-scale`: kwok Stages driving the nodes and their pods.
    pub stages: crate::stages::StagesSpec,
}

impl NodeSimSpec {
    /// The status heartbeat interval loadgen itself keeps: none when a
    /// loaded Stage heartbeats the nodes (never patched twice).
    pub fn own_heartbeat(&self) -> Duration {
        match &self.stages.loaded {
            Some(set) if set.has_node_heartbeat() => Duration::ZERO,
            _ => self.heartbeat,
        }
    }

    /// The node indices `K` this process simulates.
    pub fn indices(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.count).filter(move |k| match self.shard {
            Some(s) => k % u64::from(s.count) == u64::from(s.index),
            None => true,
        })
    }
}

/// Why the simulated nodes could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error("registering simulated nodes: creating {what} {path}: {reason}")]
    Register {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("--adopt-nodes {selector}: {reason}")]
    Adopt { selector: String, reason: String },
}

/// Counters of the simulated nodes, for the report.
#[derive(Debug, Default)]
pub struct NodesStats {
    pub nodes: AtomicU64,
    pub daemons: AtomicU64,
    pub bound: Arc<AtomicU64>,
    /// The daemons' watch counters (kept apart from `--watches`).
    pub watch: Arc<WatchStats>,
    /// The Stage engine's counters, with `--stages`.
    pub stages: std::sync::OnceLock<Arc<crate::stages::engine::EngineStats>>,
}

/// `summary.json` → `nodes`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NodesSummary {
    pub nodes: u64,
    pub heartbeat_interval_s: f64,
    pub lease_renew_interval_s: f64,
    pub daemons: u64,
    pub pods_bound: u64,
    /// The daemons' watches: `{watchers, active_at_end, events, …}`.
    pub daemon_watches: crate::watch::WatchSummary,
    /// With `--stages`: Stages applied by name, failed requests, render errors, dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<crate::stages::engine::StagesSummary>,
}

impl NodesStats {
    pub fn summary(&self, spec: &NodeSimSpec) -> NodesSummary {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NodesSummary {
            nodes: get(&self.nodes),
            heartbeat_interval_s: spec.own_heartbeat().as_secs_f64(),
            lease_renew_interval_s: spec.lease_renew.as_secs_f64(),
            daemons: get(&self.daemons),
            pods_bound: get(&self.bound),
            daemon_watches: crate::watch::WatchSummary::of(get(&self.daemons), &self.watch),
            stages: self.stages.get().map(|s| s.summary()),
        }
    }
}

/// Everything [`start`] needs from the run.
pub(crate) struct StartCtx<'a> {
    pub target: &'a Target,
    pub client: &'a ApiClient,
    pub send: &'a crate::send::SendOptions,
    pub start: Instant,
    pub duration: Duration,
    pub max_in_flight: usize,
    pub tracker: &'a TaskTracker,
    /// Ends the heartbeats early (Ctrl-C, drain timeout).
    pub abort: &'a CancellationToken,
    /// Ends the daemons and the binder (at the end of the duration).
    pub watch_stop: &'a CancellationToken,
}

/// Starts heartbeats, daemons and the binder for the registered `nodes`;
/// returns the recorders to report.
pub(crate) fn start(
    spec: &NodeSimSpec,
    nodes: Vec<String>,
    ctx: StartCtx<'_>,
    stats: &NodesStats,
) -> Vec<Arc<OpRecorder>> {
    let nodes = Arc::new(nodes);
    stats.nodes.store(nodes.len() as u64, Ordering::Relaxed);
    let mut recorders = Vec::new();
    if let Some(set) = &spec.stages.loaded {
        let sctx = crate::stages::StartCtx {
            target: ctx.target,
            timeout: ctx.send.timeout,
            start: ctx.start,
            max_in_flight: ctx.max_in_flight,
            tracker: ctx.tracker,
            stop: ctx.watch_stop,
        };
        let (recs, counters) =
            crate::stages::start(set.clone(), spec.stages.time_scale, &nodes, sctx);
        recorders.extend(recs);
        let _ = stats.stages.set(counters);
    }
    let own = NodeSimSpec {
        heartbeat: spec.own_heartbeat(),
        ..spec.clone()
    };
    let spec = &own;
    recorders.extend(start_heartbeats(spec, &nodes, &ctx));
    if spec.daemons_per_node > 0 {
        recorders.extend(start_daemons(spec, &nodes, &ctx, stats));
    }
    if spec.bind {
        let rec = Arc::new(OpRecorder::new(OP_BIND, ctx.start));
        recorders.push(rec.clone());
        let binder = bind::Binder::new(
            ctx.client.clone(),
            spec.namespace.clone(),
            nodes,
            spec.bind_interval,
            ctx.send.clone(),
            rec,
        );
        let mut binder = binder;
        binder.bound = stats.bound.clone();
        ctx.tracker.spawn(binder.run(ctx.watch_stop.clone()));
    }
    recorders
}

/// The kubelets' status heartbeats and lease renewals, on a thread of their
/// own; the recorders of those that are on.
fn start_heartbeats(
    spec: &NodeSimSpec,
    nodes: &Arc<Vec<String>>,
    ctx: &StartCtx<'_>,
) -> Vec<Arc<OpRecorder>> {
    let mut recorders = Vec::new();
    let status = Arc::new(OpRecorder::new(OP_HEARTBEAT, ctx.start));
    let lease = Arc::new(OpRecorder::new(OP_LEASE, ctx.start));
    if !spec.heartbeat.is_zero() {
        recorders.push(status.clone());
    }
    if !spec.lease_renew.is_zero() {
        recorders.push(lease.clone());
    }
    if !spec.heartbeat.is_zero() || !spec.lease_renew.is_zero() {
        let hb = kubelet::Heartbeats {
            nodes: nodes.clone(),
            conns: Conns::new(ctx.target),
            send: ctx.send.clone(),
            recorders: kubelet::BeatRecorders { status, lease },
            start: ctx.start,
            duration: ctx.duration,
            max_in_flight: ctx.max_in_flight,
            abort: ctx.abort.clone(),
        };
        let spawned = kubelet::spawn_heartbeats(hb, spec);
        match spawned {
            Ok(done) => {
                ctx.tracker.spawn(async move {
                    let _ = done.await;
                });
            }
            Err(e) => tracing::error!(error = %e, "cannot start the heartbeat thread"),
        }
    }
    recorders
}

/// `--daemons-per-node` informer-like daemons per node, each watching the
/// node's pods; their two recorders.
fn start_daemons(
    spec: &NodeSimSpec,
    nodes: &Arc<Vec<String>>,
    ctx: &StartCtx<'_>,
    stats: &NodesStats,
) -> [Arc<OpRecorder>; 2] {
    let lists = Arc::new(OpRecorder::new(OP_DAEMON_LIST, ctx.start));
    let events = Arc::new(OpRecorder::new(OP_DAEMON_EVENT, ctx.start));
    let pods: Resource = Resource {
        group: String::new(),
        version: "v1".into(),
        plural: "pods".into(),
        namespaced: true,
    };
    // Many watches per connection, but fewer than the server's
    // concurrent-stream limit (kube-apiserver: 1000 per HTTP/2 connection).
    let per_conn = spec.watches_per_connection.max(1);
    let mut client = ApiClient::new(ctx.target);
    let mut id = 0u64;
    for node in nodes.iter() {
        let watch = WatchSpec {
            count: 1,
            resource: pods.clone(),
            namespace: None,
            label_selector: None,
            field_selector: Some(format!("spec.nodeName={node}")),
            per_connection: per_conn,
            timeout: spec.daemon_watch_timeout,
            initial: crate::watch::InitialList::List,
        };
        for _ in 0..spec.daemons_per_node {
            if id > 0 && id.is_multiple_of(per_conn) {
                client = ApiClient::new(ctx.target);
            }
            let w = Watcher {
                id,
                spec: watch.clone(),
                client: client.clone(),
                send: ctx.send.clone(),
                events: events.clone(),
                lists: lists.clone(),
                stats: stats.watch.clone(),
            };
            ctx.tracker.spawn(w.run(ctx.watch_stop.clone()));
            id += 1;
        }
    }
    stats.daemons.store(id, Ordering::Relaxed);
    [lists, events]
}

/// Verb, resource and scope of the nodes' operations in the report.
pub fn describe(name: &str) -> Option<(&'static str, &'static str, &'static str)> {
    Some(match name {
        OP_HEARTBEAT => ("PATCH", "nodes/status", "resource"),
        OP_LEASE => ("PATCH", "leases", "resource"),
        OP_DAEMON_LIST => ("LIST(rv=0)", "pods", "cluster"),
        OP_DAEMON_EVENT => ("WATCH", "events-delivered", "-"),
        OP_BIND => ("POST", "pods/binding", "resource"),
        "stage-status" => ("PATCH", "status (Stages)", "resource"),
        "stage-delete" => ("DELETE", "Stages", "resource"),
        "stage-event" => ("POST", "events (Stages)", "namespace"),
        "stage-finalizers" => ("PATCH", "finalizers (Stages)", "resource"),
        "stage-patch" => ("PATCH", "Stages patches", "resource"),
        _ => return None,
    })
}
