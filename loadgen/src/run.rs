//! The run: resolve the target, check it answers, start every operation's
//! open-loop driver (each on a thread of its own, see [`crate::drive`]), the
//! burst, the watchers and the progress line; stop at `--duration` or on
//! shutdown; collect the report.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::conn::Conns;
use crate::ops::{CreatedPods, OpKind, OpSpec, Planned};
use crate::record::OpRecorder;
use crate::report::Report;
use crate::send;
use crate::target::ApiClient;
use crate::watch::{self, WatchStats};
use crate::{Config, Error};

/// Shared by every driver and request of the run.
pub(crate) struct RunCtx {
    /// The pooled client, for the burst and the checks around the run.
    pub(crate) client: ApiClient,
    pub(crate) config: Config,
    pub(crate) created: CreatedPods,
    /// Objects created so far (for `--max-objects`).
    pub(crate) creations: std::sync::atomic::AtomicU64,
    /// The last list revision seen, for `--list-rv exact`.
    pub(crate) last_rv: Mutex<Option<String>>,
}

/// Runs the load described by `config` until `--duration` ends or `shutdown`
/// is cancelled (Ctrl-C), and returns what was measured. Results are written
/// to `config.output` if set, also after an interruption.
pub async fn run(mut config: Config, shutdown: CancellationToken) -> Result<Report, Error> {
    // Ignore the error: a provider is already installed (by us or the embedder).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let target = config.target.resolve()?;
    // An empty namespace means: the kubeconfig context's, else `default`.
    let ns = target
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    for op in &mut config.operations {
        if op.namespace.is_empty() {
            op.namespace = ns.clone();
        }
    }
    if let Some(b) = config.burst.as_mut().filter(|b| b.namespace.is_empty()) {
        b.namespace = ns.clone();
    }
    if let Some(w) = config.watches.as_mut() {
        if w.namespace.as_deref() == Some("") {
            w.namespace = Some(ns.clone());
        }
    }
    if let Some(n) = config.nodes.as_mut().filter(|n| n.namespace.is_empty()) {
        n.namespace = ns.clone();
    }
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
    let metrics_listener = match &config.metrics_listen {
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
    };
    let scrapers = config
        .server_metrics
        .iter()
        .map(|url| crate::server_metrics::Scraper::new(&config.target, url, &target.credentials))
        .collect::<Result<Vec<_>, _>>()?;
    let scrape_stop = CancellationToken::new();
    let scraping: Vec<_> = scrapers
        .into_iter()
        .map(|s| tokio::spawn(s.run(config.server_metrics_interval, scrape_stop.clone())))
        .collect();

    let start = Instant::now();
    let started_at = crate::ops::unix_nanos();
    let ctx = Arc::new(RunCtx {
        client,
        config: config.clone(),
        created: CreatedPods::default(),
        creations: std::sync::atomic::AtomicU64::new(0),
        last_rv: Mutex::new(None),
    });
    // Cancelled on Ctrl-C (via `shutdown`) or when the drain times out.
    let abort = shutdown.child_token();
    let tracker = TaskTracker::new();
    let mut recorders = Vec::new();

    for op in &config.operations {
        let rec = Arc::new(OpRecorder::new(op.name.clone(), start));
        recorders.push(rec.clone());
        let conns = Conns::new(&target);
        match crate::drive::spawn(
            Arc::new(op.clone()),
            ctx.clone(),
            rec,
            start,
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
        let (burst, ctx, abort) = (burst.clone(), ctx.clone(), abort.clone());
        tracker.spawn(async move {
            tokio::select! {
                _ = abort.cancelled() => {}
                _ = run_burst(&burst, &ctx, &create, &delete) => {}
            }
        });
    }
    let watch_stats = Arc::new(WatchStats::default());
    let watch_stop = CancellationToken::new();
    if let Some(spec) = &config.watches {
        let events = Arc::new(OpRecorder::new("watch-event", start));
        let lists = Arc::new(OpRecorder::new("watch-list", start));
        recorders.push(events.clone());
        recorders.push(lists.clone());
        // Watches get their own clients: over HTTP/2, a connection carries at
        // most the server's stream limit (kube-apiserver: 1000 by default), and
        // long-lived streams should not share the operations' connection.
        let per_conn = spec.per_connection.max(1);
        let mut client = ApiClient::new(&target);
        for id in 0..spec.count {
            if id > 0 && id % per_conn == 0 {
                client = ApiClient::new(&target);
            }
            let w = watch::Watcher {
                id,
                spec: spec.clone(),
                client: client.clone(),
                send: config.send.clone(),
                events: events.clone(),
                lists: lists.clone(),
                stats: watch_stats.clone(),
            };
            tracker.spawn(w.run(watch_stop.clone()));
        }
    }
    let node_stats = crate::nodes::NodesStats::default();
    if let (Some(spec), Some(nodes)) = (&config.nodes, sim_nodes) {
        let ctx = crate::nodes::StartCtx {
            target: &target,
            client: &ctx.client,
            send: &config.send,
            start,
            duration: config.duration,
            max_in_flight: config.max_in_flight,
            tracker: &tracker,
            abort: &abort,
            watch_stop: &watch_stop,
        };
        recorders.extend(crate::nodes::start(spec, nodes, ctx, &node_stats));
    }
    tracker.close();
    let metrics_stop = CancellationToken::new();
    let _stop_metrics = metrics_stop.clone().drop_guard();
    if let Some(listener) = metrics_listener {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(crate::metrics::RunCollector {
            recorders: recorders.clone(),
            watch: watch_stats.clone(),
        }));
        if let Err(e) = crate::metrics::serve(listener, Arc::new(registry), metrics_stop.clone()) {
            tracing::warn!(error = %e, "--metrics-listen: cannot serve");
        }
    }
    let progress = crate::progress::spawn(
        recorders.clone(),
        watch_stats.clone(),
        start,
        config.duration,
        config.progress,
    );

    // Run for the duration, or until interrupted.
    tokio::select! {
        _ = tokio::time::sleep(config.duration) => {}
        _ = abort.cancelled() => {}
    };
    watch_stop.cancel();
    // Drivers still issue ticks that were due before the end (if they fell
    // behind), and in-flight requests finish, within the drain timeout. Ctrl-C
    // or the drain timeout abandons them; they are counted as cancelled.
    let drained = tokio::select! {
        _ = tracker.wait() => true,
        _ = tokio::time::sleep(config.drain_timeout) => false,
        _ = abort.cancelled() => false,
    };
    if !drained {
        abort.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
    }
    let interrupted = shutdown.is_cancelled();
    progress.finish();
    let elapsed = start.elapsed();
    scrape_stop.cancel();
    let mut server_metrics = Vec::new();
    for task in scraping {
        if let Ok(summary) = task.await {
            server_metrics.push(summary);
        }
    }
    let mut report = Report::build(
        &config,
        &target.server.to_string(),
        started_at,
        elapsed,
        interrupted,
        &recorders,
        &watch_stats,
    );
    report.server_metrics = server_metrics;
    report.nodes = config.nodes.as_ref().map(|spec| node_stats.summary(spec));
    name_priority_levels(&ctx.client, &mut report).await;
    if let Some(dir) = &config.output {
        crate::output::write_all(dir, &report).map_err(|source| Error::Output {
            dir: dir.clone(),
            source,
        })?;
    }
    Ok(report)
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
