//! The cost model (`--cost-model modeled`, issue 5) over HTTP: what a LIST
//! costs depends on what it reads, not what it returns; a modeled OOM kill
//! drops every connection, refuses new ones for the restart, and the clients'
//! relists show in the request metrics; a cold cache answers rv=0 LISTs with
//! 503 under `--reject-until-cache-ready`.
//! The load scenario of the issue is in `sim_model_load.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use common::{sim, Http};
use std::time::Duration;
use tokio::time::Instant;

/// A metric's value from the Prometheus text (0 when absent): the sum over
/// the series whose labels contain every `want` pair.
pub fn metric(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let series = l.split_whitespace().next().unwrap_or("");
            let base = series.split('{').next().unwrap_or("");
            base == name
                && want
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum()
}

async fn timed_list(h: &Http, path: &str) -> (f64, usize) {
    let t = Instant::now();
    let r = h.get(path).await;
    assert_eq!(
        r.status,
        200,
        "{path}: {}",
        String::from_utf8_lossy(&r.body)
    );
    let n = r.json()["items"].as_array().unwrap().len();
    (t.elapsed().as_secs_f64(), n)
}

#[tokio::test]
async fn a_list_costs_what_it_reads_not_what_it_returns() {
    // A tenth of a core for the apiserver and for etcd: the modeled times, ten
    // times the defaults', dwarf what the (debug-built) simulator really spends.
    let s = sim(&[
        "--cost-model",
        "modeled",
        "--virtual-cpus",
        "0.1",
        "--model-set",
        "etcd_cpus=0.1",
        "--nodes",
        "50",
        "--pods",
        "5000",
    ])
    .await;
    let h = Http::new(&s.url);
    let (full, n_full) = timed_list(&h, "/api/v1/pods").await;
    assert_eq!(n_full, 5000);
    let (etcd_sel, n_sel) =
        timed_list(&h, "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-7").await;
    assert_eq!(n_sel, 100);
    let (cache_sel, _) = timed_list(
        &h,
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-7&resourceVersion=0",
    )
    .await;
    let (cache_full, _) = timed_list(&h, "/api/v1/pods?resourceVersion=0").await;
    // Returning 2% of the pods, the consistent LIST still reads and decodes them all …
    assert!(
        etcd_sel > 0.4 * full,
        "spec.nodeName from etcd {etcd_sel:.3}s vs all pods {full:.3}s"
    );
    // … while the cache's node-name index makes the same LIST cheap, and a
    // full LIST from the cache skips etcd and decoding.
    assert!(
        cache_sel < 0.25 * etcd_sel,
        "from the cache {cache_sel:.3}s vs from etcd {etcd_sel:.3}s"
    );
    assert!(
        cache_full < 0.8 * full,
        "all pods from the cache {cache_full:.3}s vs from etcd {full:.3}s"
    );
    // The storage metrics say the same: everything evaluated on the etcd path,
    // only the node's pods from the cache.
    let m = String::from_utf8(h.get("/metrics").await.body.to_vec()).unwrap();
    let etcd = [("resource", "pods"), ("storage", "etcd")];
    let cache = [("resource", "pods"), ("storage", "watchcache")];
    assert_eq!(
        metric(&m, "apiserver_storage_list_evaluated_objects_total", &etcd),
        10_000.0
    );
    assert_eq!(
        metric(&m, "apiserver_storage_list_returned_objects_total", &etcd),
        5_100.0
    );
    assert_eq!(
        metric(&m, "apiserver_storage_list_evaluated_objects_total", &cache),
        5_100.0
    );
    assert!(
        metric(
            &m,
            "tollgate_sim_virtual_cpu_seconds_total",
            &[("component", "apiserver")]
        ) > 0.0
    );
    assert!(
        metric(
            &m,
            "tollgate_sim_virtual_cpu_seconds_total",
            &[("component", "etcd")]
        ) > 0.0
    );
    assert!(metric(&m, "tollgate_sim_virtual_memory_bytes", &[]) > 100e6);
}

#[tokio::test]
async fn consistent_reads_from_cache_skip_etcd() {
    let s = sim(&[
        "--cost-model",
        "modeled",
        "--consistent-reads-from-cache",
        "--nodes",
        "10",
        "--pods",
        "500",
    ])
    .await;
    let h = Http::new(&s.url);
    timed_list(&h, "/api/v1/pods").await;
    let m = String::from_utf8(h.get("/metrics").await.body.to_vec()).unwrap();
    let cache = [("resource", "pods"), ("storage", "watchcache")];
    assert_eq!(
        metric(&m, "apiserver_storage_list_returned_objects_total", &cache),
        500.0
    );
    // Only the watch cache's initial LIST at start read etcd.
    assert_eq!(
        metric(&m, "apiserver_storage_list_total", &[("resource", "pods")]),
        1.0
    );
}

/// An informer: LIST rv=0, WATCH from there until the stream ends, again.
/// Counts its successful LISTs and the watches that ended.
async fn informer(base: String, lists: tokio::sync::watch::Sender<(u32, u32)>) {
    let h = Http::new(&base);
    loop {
        let r = match tokio::time::timeout(
            Duration::from_secs(10),
            try_get(&h, "/api/v1/pods?resourceVersion=0"),
        )
        .await
        {
            Ok(Some(r)) if r.status == 200 => r,
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let rv = r.json()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        lists.send_modify(|(l, _)| *l += 1);
        if let Some(mut w) =
            try_watch(&h, &format!("/api/v1/pods?watch=1&resourceVersion={rv}")).await
        {
            while w.next(Duration::from_secs(60)).await.is_some() {}
            lists.send_modify(|(_, ended)| *ended += 1);
        }
    }
}

/// A GET that reports a failed connection as `None` instead of panicking.
async fn try_get(h: &Http, path: &str) -> Option<common::Reply> {
    let h2 = Http::new(&h.base);
    let path = path.to_string();
    tokio::spawn(async move { h2.get(&path).await }).await.ok()
}

async fn try_watch(h: &Http, path: &str) -> Option<common::Watch> {
    let h2 = Http::new(&h.base);
    let path = path.to_string();
    tokio::spawn(async move { h2.watch(&path).await })
        .await
        .ok()
}

async fn poll<F: FnMut() -> bool>(what: &str, within: Duration, mut f: F) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn metrics_text(base: &str) -> Option<String> {
    let r = try_get(&Http::new(base), "/metrics").await?;
    String::from_utf8(r.body.to_vec()).ok()
}

#[tokio::test]
async fn an_oom_kill_drops_every_connection_and_the_relists_show() {
    let s = sim(&[
        "--cost-model",
        "modeled",
        "--nodes",
        "10",
        "--pods",
        "2000",
        // One consistent LIST of the 4 MB of pods then holds ~400 MB: past the limit.
        "--memory-limit",
        "400Mi",
        "--model-set",
        "etcd_list_memory_per_byte=100",
        "--model-set",
        "restart_seconds=1",
        // A cache fill that takes a few seconds, so the cold cache is seen.
        "--model-set",
        "decode_per_object=0.001",
        "--reject-until-cache-ready",
    ])
    .await;
    let before = metrics_text(&s.url).await.unwrap();
    let started_before = metric(&before, "process_start_time_seconds", &[]);
    let (tx, rx) = tokio::sync::watch::channel((0u32, 0u32));
    const INFORMERS: u32 = 5;
    let tasks: Vec<_> = (0..INFORMERS)
        .map(|_| tokio::spawn(informer(s.url.clone(), tx.clone())))
        .collect();
    poll(
        "the informers' first LISTs",
        Duration::from_secs(30),
        || rx.borrow().0 >= INFORMERS,
    )
    .await;
    let lists_before = metric(
        &metrics_text(&s.url).await.unwrap(),
        "apiserver_request_total",
        &[("verb", "LIST"), ("code", "200")],
    );

    // The consistent LIST that kills it: its connection is dropped, no answer.
    let h = Http::new(&s.url);
    let killer = try_get(&h, "/api/v1/pods").await;
    assert!(
        killer.is_none(),
        "the LIST that passed the limit was answered"
    );

    // Every watch ends, and new connections are refused while it restarts.
    poll("the watches to end", Duration::from_secs(10), || {
        rx.borrow().1 >= INFORMERS
    })
    .await;
    let refused = tokio::net::TcpStream::connect(s.addr).await;
    assert!(
        refused.is_err(),
        "a connection was accepted during the restart"
    );

    // Back up with a cold cache: rv=0 LISTs get 503 until it is filled …
    a_cold_cache_answers_503_until_filled(&h).await;

    // … then the informers relist: a storm of LISTs in the request metrics.
    poll("the informers to relist", Duration::from_secs(30), || {
        rx.borrow().0 >= 2 * INFORMERS
    })
    .await;
    let after = metrics_text(&s.url).await.unwrap();
    one_restart_and_the_relists_in_the_metrics(&after, lists_before, started_before, INFORMERS);
    for t in tasks {
        t.abort();
    }
}

/// After the restart, rv=0 LISTs get 503 until the cache is filled, then 200.
async fn a_cold_cache_answers_503_until_filled(h: &Http) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut saw_503 = false;
    loop {
        if let Some(r) = try_get(h, "/api/v1/namespaces/default/configmaps?resourceVersion=0").await
        {
            if r.status == 503 {
                saw_503 = true;
            } else if r.status == 200 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "never served from the cache again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(saw_503, "no 503 while the cache was cold");
}

/// One restart, the informers' relists (and the 503s) counted, a new process start time.
fn one_restart_and_the_relists_in_the_metrics(
    after: &str,
    lists_before: f64,
    started_before: f64,
    informers: u32,
) {
    assert_eq!(metric(after, "tollgate_sim_restarts_total", &[]), 1.0);
    assert!(
        metric(
            after,
            "apiserver_request_total",
            &[("verb", "LIST"), ("code", "200")]
        ) >= lists_before + f64::from(informers),
        "{after}"
    );
    assert!(
        metric(
            after,
            "apiserver_request_total",
            &[("verb", "LIST"), ("code", "503")]
        ) >= 1.0
    );
    let started_after = metric(after, "process_start_time_seconds", &[]);
    assert!(
        started_after > started_before,
        "process_start_time_seconds {started_before} → {started_after}"
    );
}
