//! The run: resolve the target, check it answers, start every operation's
//! open-loop driver, the burst, the watchers and the progress line; stop at
//! `--duration` or on shutdown; collect the report.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::ops::{CreatedPods, OpKind, OpSpec, Planned};
use crate::record::{OpRecorder, Outcome};
use crate::report::Report;
use crate::schedule::Ticks;
use crate::send::{self, Sent};
use crate::target::ApiClient;
use crate::watch::{self, WatchStats};
use crate::{Config, Error};

/// Shared by every request task of the run.
struct RunCtx {
    client: ApiClient,
    config: Config,
    created: CreatedPods,
    /// Objects created so far (for `--max-objects`).
    creations: std::sync::atomic::AtomicU64,
    /// The last list revision seen, for `--list-rv exact`.
    last_rv: Mutex<Option<String>>,
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
    let client = ApiClient::new(&target);
    let checks = async {
        preflight(&client, config.send.timeout.min(Duration::from_secs(10))).await?;
        crate::safety::check_namespaces(&client, &config).await
    };
    tokio::select! {
        r = checks => r?,
        _ = shutdown.cancelled() => return Err(Error::Interrupted),
    }

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
        .map(|url| crate::server_metrics::Scraper::new(&config.target, url))
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
        let (op, ctx, abort, t) = (
            Arc::new(op.clone()),
            ctx.clone(),
            abort.clone(),
            tracker.clone(),
        );
        tracker.spawn(drive(op, ctx, rec, start, abort, t));
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

/// How much earlier than intended the tick thread wakes: Linux's default
/// timer slack, by which a sleep overshoots.
const TIMER_SLACK: Duration = Duration::from_micros(50);
/// Longest single sleep of the tick thread, so it notices a stopped run soon.
const MAX_NAP: Duration = Duration::from_millis(100);
/// Shortest time between two wakes of the tick thread: above 1,000/s, ticks
/// due within a millisecond of its last wake leave together (late, never
/// early), so the thread and the runtime are woken at most 1,000 times a
/// second (as often as by tokio's timer), not once per request.
const MIN_WAKE_GAP: Duration = Duration::from_millis(1);

/// The tick thread of one operation: sleeps until each intended start (less
/// [`TIMER_SLACK`]) and hands `(i, offset)` to the async driver. An OS thread,
/// because tokio's timer has millisecond resolution (a deadline is rounded to
/// the next millisecond and fires when a worker polls its time driver): at
/// 1,000/s, requests left 0.3 ms off schedule at the median, measured by the
/// receiving server, against 0.02 ms with this thread, which the kernel's
/// high-resolution timers wake. Ends when the schedule passes `duration` or
/// the driver is gone.
fn tick_thread(
    ticks: Ticks,
    phase: Duration,
    duration: Duration,
    start: std::time::Instant,
    tx: tokio::sync::mpsc::UnboundedSender<(u64, Duration)>,
) {
    // What the thread last slept until (not when it woke: overshoots must not add up).
    let mut last_target: Option<std::time::Instant> = None;
    for (i, offset) in ticks.enumerate() {
        let at = offset + phase;
        if at >= duration {
            return;
        }
        let due = (start + at).checked_sub(TIMER_SLACK).unwrap_or(start);
        // Not yet due: sleep until then, but not sooner than MIN_WAKE_GAP after
        // the last wake. Ticks already due leave at once.
        if std::time::Instant::now() < due {
            let wake = last_target.map_or(due, |t| due.max(t + MIN_WAKE_GAP));
            loop {
                if tx.is_closed() {
                    return;
                }
                let now = std::time::Instant::now();
                if now >= wake {
                    break;
                }
                std::thread::sleep((wake - now).min(MAX_NAP));
            }
            last_target = Some(wake);
        }
        if tx.send((i as u64, offset)).is_err() {
            return;
        }
    }
}

/// One operation's open-loop driver: takes each tick from its tick thread at
/// the intended start and issues the request without waiting for earlier ones;
/// at `--max-in-flight` outstanding requests, the tick is dropped and counted.
async fn drive(
    op: Arc<OpSpec>,
    ctx: Arc<RunCtx>,
    rec: Arc<OpRecorder>,
    start: Instant,
    abort: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Arc::new(Semaphore::new(ctx.config.max_in_flight.max(1)));
    let ticks = Ticks::new(ctx.config.schedule.clone(), op.rate);
    // Shards of a constant schedule interleave: shard i starts i/N of a period late.
    let phase = match ctx.config.shard {
        Some(s) => Duration::from_secs_f64(
            f64::from(s.index) / f64::from(s.count) / op.rate.as_per_second(),
        ),
        None => Duration::ZERO,
    };
    let step = match ctx.config.schedule {
        crate::schedule::ScheduleKind::Steps { step, .. } if !step.is_zero() => Some(step),
        _ => None,
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (duration, std_start) = (ctx.config.duration, start.into_std());
    let spawned = std::thread::Builder::new()
        .name(format!("loadgen-ticks-{}", op.name))
        .spawn(move || tick_thread(ticks, phase, duration, std_start, tx));
    if let Err(e) = spawned {
        tracing::error!(operation = %op.name, error = %e, "cannot start the tick thread");
        return;
    }
    loop {
        let (i, offset) = tokio::select! {
            biased;
            _ = abort.cancelled() => break,
            tick = rx.recv() => match tick {
                Some(tick) => tick,
                None => break,
            },
        };
        let slice = step.map(|s| (offset.as_secs_f64() / s.as_secs_f64()) as usize);
        let intended = start + offset + phase;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            rec.drop_one();
            continue;
        };
        let now = Instant::now();
        rec.record_start_lag(now.saturating_duration_since(intended));
        // Latency runs from the intended start, or from the actual one if the
        // request left early: never shorter than what the server took.
        let intended = intended.min(now);
        let (op, ctx, rec, abort) = (op.clone(), ctx.clone(), rec.clone(), abort.clone());
        tracker.spawn(async move {
            tokio::select! {
                _ = abort.cancelled() => rec.cancel_one(),
                sent = execute(&op, &ctx, i) => match sent {
                    Some(sent) => {
                        let latency = intended.elapsed();
                        rec.record(&sent.outcome, latency, ctx.config.send.honor_retry_after);
                        if let Some(k) = slice {
                            rec.record_slice(k, &sent.outcome, latency);
                        }
                    }
                    None => rec.skip_one(),
                },
            }
            drop(permit);
        });
    }
}

/// Performs the `i`-th request of `op`: a paged LIST follows `continue` to the
/// end and counts as one request. `None` when there is nothing to do.
async fn execute(op: &OpSpec, ctx: &RunCtx, i: u64) -> Option<Sent> {
    let opts = &ctx.config.send;
    match &op.kind {
        OpKind::List { limit, rv, .. } => {
            let want_meta = limit.is_some() || *rv == crate::ops::ListRv::Exact;
            let exact = ctx
                .last_rv
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let mut planned = op.plan(i, exact.as_deref(), None)?;
            let base_path = planned.path.clone();
            let mut total = Outcome::default();
            loop {
                let sent = send::send(&ctx.client, &planned, opts, want_meta).await;
                merge(&mut total, sent.outcome);
                let Some(meta) = sent.list_meta.filter(|_| total.is_success()) else {
                    return Some(Sent {
                        outcome: total,
                        list_meta: None,
                    });
                };
                if !meta.resource_version.is_empty() {
                    *ctx.last_rv.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(meta.resource_version.clone());
                }
                if meta.continue_token.is_empty() || limit.is_none() {
                    return Some(Sent {
                        outcome: total,
                        list_meta: Some(meta),
                    });
                }
                planned.path = continue_path(&base_path, &meta.continue_token);
            }
        }
        OpKind::Delete => {
            let name = ctx.created.pop()?;
            let planned = op.plan(i, None, Some(&name))?;
            Some(send::send(&ctx.client, &planned, opts, false).await)
        }
        OpKind::Create => {
            if ctx
                .creations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                >= ctx.config.max_objects
            {
                return None;
            }
            let planned = op.plan(i, None, None)?;
            let sent = send::send(&ctx.client, &planned, opts, false).await;
            if sent.outcome.is_success() {
                ctx.created.push(op.created_name(i));
            }
            Some(sent)
        }
        OpKind::Get | OpKind::Patch { .. } => {
            let planned = op.plan(i, None, None)?;
            Some(send::send(&ctx.client, &planned, opts, false).await)
        }
    }
}

/// The next page of a LIST: like client-go's pager, `continue` replaces
/// `resourceVersion`/`resourceVersionMatch` (the apiserver refuses both together).
fn continue_path(base: &str, token: &str) -> String {
    let (path, query) = base.split_once('?').unwrap_or((base, ""));
    let mut params: Vec<String> = query
        .split('&')
        .filter(|kv| {
            !kv.is_empty()
                && !kv.starts_with("resourceVersion=")
                && !kv.starts_with("resourceVersionMatch=")
        })
        .map(str::to_string)
        .collect();
    params.push(format!("continue={}", crate::ops::encode(token)));
    format!("{path}?{}", params.join("&"))
}

/// Adds one page's outcome to a paged request's total.
fn merge(total: &mut Outcome, page: Outcome) {
    total.first_try_429 |= page.first_try_429 && total.status.is_none();
    total.status = page.status;
    total.error = page.error;
    total.bytes += page.bytes;
    total.retries += page.retries;
    total.server_class = page.server_class;
    total.rejection = page.rejection;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_drops_the_resource_version() {
        assert_eq!(
            continue_path("/api/v1/pods?labelSelector=a%3Db&resourceVersion=7&resourceVersionMatch=Exact&limit=2", "t/1"),
            "/api/v1/pods?labelSelector=a%3Db&limit=2&continue=t%2F1"
        );
        assert_eq!(
            continue_path("/api/v1/pods", "x"),
            "/api/v1/pods?continue=x"
        );
    }
}
