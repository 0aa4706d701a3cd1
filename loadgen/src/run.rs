//! The run: resolve the target, check it answers, start every operation's
//! open-loop driver (each on a thread of its own, see [`crate::drive`]), the
//! burst, the watchers and the progress line; stop at `--duration` or on
//! shutdown; collect the report.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kubeio::error_chain;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::conn::Conns;
use crate::drive::RunCtx;
use crate::ops::{CreatedPods, OpKind, OpSpec, Planned};
use crate::record::OpRecorder;
use crate::report::Report;
use crate::send;
use crate::target::{ApiClient, Target};
use crate::watch::{self, WatchStats};
use crate::window::{write_output, Scraping, Window};
use crate::{Config, Error};

/// Runs the load described by `config` until `--duration` ends or `shutdown`
/// is cancelled (SIGINT, SIGTERM), lets in-flight requests finish within
/// `--drain-timeout`, and returns what was measured. Results are written to
/// `config.output` if set, also after an interruption.
pub async fn run(mut config: Config, shutdown: CancellationToken) -> Result<Report, Error> {
    // Ignore the error: a provider is already installed (by us or the embedder).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let target = config.target.resolve()?;
    // An empty namespace means: the kubeconfig context's, else `default`.
    let ns = target.namespace.as_deref().unwrap_or("default");
    default_namespace(&mut config, ns);
    let client = ApiClient::new(&target);
    let checks = async {
        preflight(&client, config.send.timeout.min(Duration::from_secs(10))).await?;
        crate::safety::check_namespaces(&client, &config).await
    };
    tokio::select! {
        r = checks => r?,
        _ = shutdown.cancelled() => return Err(Error::Interrupted),
    }
    // Nodes (leases, pods) are registered before the clock starts: at 5,000
    // nodes and 150k pods that takes a while and is not part of the load.
    let sim_nodes = match &config.nodes {
        None => None,
        Some(spec) => tokio::select! {
            r = crate::nodes::kubelet::register(&client, spec) => Some(r?),
            _ = shutdown.cancelled() => return Err(Error::Interrupted),
        },
    };
    // Bound before any load starts, so a busy address fails the run up front.
    let metrics_listener = bind_metrics(config.metrics_listen.as_ref())?;
    let scrapers = config
        .server_metrics
        .iter()
        .map(|url| crate::server_metrics::Scraper::new(&config.target, url, &target.credentials))
        .collect::<Result<Vec<_>, _>>()?;
    let scraping = Scraping::start(scrapers, config.server_metrics_interval);

    let start = Instant::now();
    let started_at = crate::ops::unix_nanos();
    let ctx = Arc::new(RunCtx {
        client,
        config: config.clone(),
        created: CreatedPods::default(),
        creations: std::sync::atomic::AtomicU64::new(0),
        last_rv: Mutex::new(None),
    });
    // A signal (`shutdown`) ends the schedule early, as `--duration` does;
    // what is in flight then still gets the drain. `abort` ends that, when
    // the drain times out.
    let abort = CancellationToken::new();
    let load = start_load(&ctx, &target, sim_nodes, start, &shutdown, &abort);
    let metrics_stop = CancellationToken::new();
    let _stop_metrics = metrics_stop.clone().drop_guard();
    if let Some(listener) = metrics_listener {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(crate::metrics::RunCollector {
            recorders: load.recorders.clone(),
            watch: load.watch_stats.clone(),
        }));
        if let Err(e) = crate::metrics::serve(listener, Arc::new(registry), metrics_stop.clone()) {
            tracing::warn!(error = %e, "--metrics-listen: cannot serve");
        }
    }
    let window = Window::open(
        start,
        &load.recorders,
        &load.watch_stats,
        config.duration,
        config.progress,
        scraping,
    );
    window.hold(config.duration, &shutdown).await;
    load.watch_stop.cancel();
    // Drivers still issue ticks that were due before the end (if they fell
    // behind), and in-flight requests finish, within the drain timeout.
    window
        .drain(&load.tracker, config.drain_timeout, &abort)
        .await;
    let interrupted = shutdown.is_cancelled();
    let closed = window.close().await;
    let mut report = Report::build(
        &config,
        &target.server.to_string(),
        started_at,
        closed.elapsed,
        interrupted,
        &load.recorders,
        &load.watch_stats,
    );
    report.server_metrics = closed.server_metrics;
    report.nodes = config
        .nodes
        .as_ref()
        .map(|spec| load.node_stats.summary(spec));
    name_priority_levels(&ctx.client, &mut report).await;
    write_output(config.output.as_deref(), &report)
        .map_err(|(dir, source)| Error::Output { dir, source })?;
    Ok(report)
}

/// Gives every operation, burst, watch and node simulation without a
/// namespace of its own the run's `ns`.
fn default_namespace(config: &mut Config, ns: &str) {
    for op in &mut config.operations {
        if op.namespace.is_empty() {
            op.namespace = ns.to_string();
        }
    }
    if let Some(b) = config.burst.as_mut().filter(|b| b.namespace.is_empty()) {
        b.namespace = ns.to_string();
    }
    if let Some(w) = config.watches.as_mut() {
        if w.namespace.as_deref() == Some("") {
            w.namespace = Some(ns.to_string());
        }
    }
    if let Some(n) = config.nodes.as_mut().filter(|n| n.namespace.is_empty()) {
        n.namespace = ns.to_string();
    }
}

/// The `--metrics-listen` socket, bound now.
fn bind_metrics(
    listen: Option<&crate::MetricsListen>,
) -> Result<Option<std::net::TcpListener>, Error> {
    Ok(match listen {
        None => None,
        Some(crate::MetricsListen::Addr(a)) => Some(std::net::TcpListener::bind(a).map_err(
            |source| Error::MetricsListen {
                addr: a.to_string(),
                source,
            },
        )?),
        Some(crate::MetricsListen::Listener(l)) => {
            Some(l.try_clone().map_err(|source| Error::MetricsListen {
                addr: format!("{:?}", l.local_addr().ok()),
                source,
            })?)
        }
    })
}

/// The load of one run, started.
struct Load {
    /// Every task of the load; closed, so `wait` ends when they do.
    tracker: TaskTracker,
    recorders: Vec<Arc<OpRecorder>>,
    watch_stats: Arc<WatchStats>,
    /// Ends the watches (and the node daemons' watches) at the end of the window.
    watch_stop: CancellationToken,
    node_stats: crate::nodes::NodesStats,
}

/// Starts every operation's driver, the burst, the watchers and the simulated nodes.
fn start_load(
    ctx: &Arc<RunCtx>,
    target: &Target,
    sim_nodes: Option<Vec<String>>,
    start: Instant,
    stop: &CancellationToken,
    abort: &CancellationToken,
) -> Load {
    let config = &ctx.config;
    let tracker = TaskTracker::new();
    let mut recorders = Vec::new();
    for op in &config.operations {
        let rec = Arc::new(OpRecorder::new(op.name.clone(), start));
        recorders.push(rec.clone());
        let conns = Conns::new(target);
        match crate::drive::spawn(
            Arc::new(op.clone()),
            ctx.clone(),
            rec,
            start,
            stop.clone(),
            abort.clone(),
            conns,
        ) {
            Ok(done) => {
                tracker.spawn(async move {
                    let _ = done.await;
                });
            }
            Err(e) => {
                tracing::error!(operation = %op.name, error = %e, "cannot start the driver thread")
            }
        }
    }
    if let Some(burst) = &config.burst {
        let create = Arc::new(OpRecorder::new("burst-create", start));
        let delete = Arc::new(OpRecorder::new("burst-delete", start));
        recorders.push(create.clone());
        recorders.push(delete.clone());
        // A burst is one wave of creates and deletes: a signal ends it at once.
        let (burst, ctx, stop) = (burst.clone(), ctx.clone(), stop.clone());
        tracker.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = run_burst(&burst, &ctx, &create, &delete) => {}
            }
        });
    }
    let watch_stats = Arc::new(WatchStats::default());
    let watch_stop = CancellationToken::new();
    if let Some(spec) = &config.watches {
        recorders.extend(start_watches(
            spec,
            target,
            config,
            start,
            &watch_stats,
            &tracker,
            &watch_stop,
        ));
    }
    let node_stats = crate::nodes::NodesStats::default();
    if let (Some(spec), Some(nodes)) = (&config.nodes, sim_nodes) {
        // Simulated kubelets beat until the end of the window: a signal
        // ends them as the drain timeout does.
        let abort = &either(stop, abort);
        let nctx = crate::nodes::StartCtx {
            target,
            client: &ctx.client,
            send: &config.send,
            start,
            duration: config.duration,
            max_in_flight: config.max_in_flight,
            tracker: &tracker,
            abort,
            watch_stop: &watch_stop,
        };
        recorders.extend(crate::nodes::start(spec, nodes, nctx, &node_stats));
    }
    tracker.close();
    Load {
        tracker,
        recorders,
        watch_stats,
        watch_stop,
        node_stats,
    }
}

/// A token cancelled when `a` or `b` is.
fn either(a: &CancellationToken, b: &CancellationToken) -> CancellationToken {
    let both = b.child_token();
    let (a, cancel) = (a.clone(), both.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = a.cancelled() => cancel.cancel(),
            _ = cancel.cancelled() => {}
        }
    });
    both
}

/// `--watches N`: the watchers, and their two recorders.
fn start_watches(
    spec: &watch::WatchSpec,
    target: &Target,
    config: &Config,
    start: Instant,
    stats: &Arc<WatchStats>,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) -> [Arc<OpRecorder>; 2] {
    let events = Arc::new(OpRecorder::new("watch-event", start));
    let lists = Arc::new(OpRecorder::new("watch-list", start));
    // Watches get their own clients: over HTTP/2, a connection carries at
    // most the server's stream limit (kube-apiserver: 1000 by default), and
    // long-lived streams should not share the operations' connection.
    let per_conn = spec.per_connection.max(1);
    let mut client = ApiClient::new(target);
    for id in 0..spec.count {
        if id > 0 && id % per_conn == 0 {
            client = ApiClient::new(target);
        }
        let w = watch::Watcher {
            id,
            spec: spec.clone(),
            client: client.clone(),
            send: config.send.clone(),
            events: events.clone(),
            lists: lists.clone(),
            stats: stats.clone(),
        };
        tracker.spawn(w.run(stop.clone()));
    }
    [events, lists]
}

/// Names APF priority levels seen by UID, through the flowcontrol API when
/// readable (RBAC may forbid it; then they stay UIDs).
async fn name_priority_levels(client: &ApiClient, report: &mut Report) {
    let wanted = report
        .operations
        .iter()
        .flat_map(|o| &o.server_classes)
        .any(|c| c.source == "priority-level");
    if !wanted {
        return;
    }
    let path = "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations";
    let fetch = async {
        let req = client.request(http::Method::GET, path, None).ok()?;
        let resp = client.send(req).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .ok()?
            .to_bytes();
        serde_json::from_slice::<serde_json::Value>(&body).ok()
    };
    let Some(list) = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
    else {
        return;
    };
    let names: std::collections::HashMap<&str, &str> = list["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|i| {
            Some((
                i["metadata"]["uid"].as_str()?,
                i["metadata"]["name"].as_str()?,
            ))
        })
        .collect();
    for c in report
        .operations
        .iter_mut()
        .flat_map(|o| o.server_classes.iter_mut())
    {
        if c.source == "priority-level" {
            c.name = names.get(c.class.as_str()).map(|n| n.to_string());
        }
    }
}

/// Fails fast, with the address and the reason, if the server cannot be reached.
/// Any HTTP answer (even 401/404) counts as reachable.
async fn preflight(client: &ApiClient, timeout: Duration) -> Result<(), Error> {
    let planned = Planned {
        method: http::Method::GET,
        path: "/version".into(),
        body: None,
    };
    let req = client
        .request(planned.method, &planned.path, None)
        .map_err(|e| Error::Unreachable {
            server: client.server().to_string(),
            reason: e.to_string(),
        })?;
    match tokio::time::timeout(timeout, client.send(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::Unreachable {
            server: client.server().to_string(),
            reason: error_chain(&e),
        }),
        Err(_) => Err(Error::Unreachable {
            server: client.server().to_string(),
            reason: format!("no answer to GET /version within {timeout:?}"),
        }),
    }
}

/// Tess.IO's first table: `count` pods created in parallel, then deleted in
/// parallel; each latency runs from the moment the whole burst was released.
async fn run_burst(
    burst: &crate::BurstSpec,
    ctx: &RunCtx,
    create: &OpRecorder,
    delete: &OpRecorder,
) {
    let op = OpSpec {
        name: "burst".into(),
        kind: OpKind::Create,
        // Unused by a burst: every request is released at once.
        rate: crate::rate::Rate::per_second(1.0).expect("1/s is a valid rate"),
        resource: burst.resource.clone(),
        namespace: burst.namespace.clone(),
        object_prefix: format!("{}burst-", burst.object_prefix),
        objects: 1,
        run_id: burst.run_id.clone(),
    };
    let opts = &ctx.config.send;
    let before = ctx
        .creations
        .fetch_add(burst.count, std::sync::atomic::Ordering::Relaxed);
    let count = burst
        .count
        .min(ctx.config.max_objects.saturating_sub(before));
    let released = Instant::now();
    let creates = (0..count).map(|i| {
        let op = &op;
        async move {
            let planned = op.plan(i, None, None)?;
            let sent = send::send(&ctx.client, &planned, opts, false).await;
            create.record(&sent.outcome, released.elapsed(), opts.honor_retry_after);
            sent.outcome.is_success().then(|| op.created_name(i))
        }
    });
    let names: Vec<String> = futures_util::future::join_all(creates)
        .await
        .into_iter()
        .flatten()
        .collect();
    let released = Instant::now();
    let deletes = names.iter().map(|name| {
        let op = &op;
        async move {
            let kind = OpSpec {
                kind: OpKind::Delete,
                ..op.clone()
            };
            if let Some(planned) = kind.plan(0, None, Some(name)) {
                let sent = send::send(&ctx.client, &planned, opts, false).await;
                delete.record(&sent.outcome, released.elapsed(), opts.honor_retry_after);
            }
        }
    });
    futures_util::future::join_all(deletes).await;
}
