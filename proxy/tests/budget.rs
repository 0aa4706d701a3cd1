//! The adaptive budget end to end, against a fake apiserver whose health
//! probes slow down with the LISTs it serves at once (a model of a real
//! apiserver whose memory and garbage collector pay for what it holds):
//!
//! - a flood of 2 MB LISTs (charged 6 MB: consistent, read from etcd) from
//!   six clients, with nothing set but `mode: enforce`: the budget grows
//!   from its cold start (one LIST at a time) while the probes stay fast
//!   until two run at once, and the LISTs the
//!   apiserver serves at once never pass what the in-flight budget allows;
//! - then the apiserver turns sensitive (each LIST in flight adds 80 ms to
//!   every probe): the probes' p99 passes the 50 ms target and the budget
//!   comes down.
//!
//! And a cold start against an apiserver that has not counted its objects
//! yet (kube-apiserver 1.20 reports 0 for its first minute): the first LIST
//! of the pattern still runs alone; the LISTs of a pattern that turns out
//! small (a kubelet's LIST of its own pods) then run together, not one by
//! one in the heavy lane.
#![allow(clippy::unwrap_used)]

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tollgate::config::Mode;

const LIST_BYTES: usize = 2_000_000;
const LIST_TIME: Duration = Duration::from_millis(600);

/// The fake apiserver's state.
#[derive(Default)]
struct Apiserver {
    lists: AtomicUsize,
    most_lists: AtomicUsize,
    served: AtomicUsize,
    /// Each LIST in flight adds 80 ms to every other request.
    sensitive: AtomicBool,
    /// The most LISTs in flight at once before the first one was served.
    most_before_first: AtomicUsize,
    /// Selective LISTs (a field selector) in flight, and the most at once.
    selective: AtomicUsize,
    most_selective: AtomicUsize,
}

const SELECTIVE_TIME: Duration = Duration::from_millis(400);

async fn serve(state: Arc<Apiserver>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() == "/api/v1/pods"
        && req.uri().query().is_some_and(|q| q.contains("Selector="))
    {
        let now = state.selective.fetch_add(1, Ordering::SeqCst) + 1;
        state.most_selective.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(SELECTIVE_TIME).await;
        state.selective.fetch_sub(1, Ordering::SeqCst);
        return Response::new(Full::new(Bytes::from_static(
            b"{\"kind\":\"PodList\",\"items\":[]}",
        )));
    }
    if req.uri().path() == "/api/v1/pods" {
        let now = state.lists.fetch_add(1, Ordering::SeqCst) + 1;
        state.most_lists.fetch_max(now, Ordering::SeqCst);
        if state.served.load(Ordering::SeqCst) == 0 {
            state.most_before_first.fetch_max(now, Ordering::SeqCst);
        }
        tokio::time::sleep(LIST_TIME).await;
        state.lists.fetch_sub(1, Ordering::SeqCst);
        state.served.fetch_add(1, Ordering::SeqCst);
        return Response::new(Full::new(Bytes::from(vec![b' '; LIST_BYTES])));
    }
    if req.uri().path() == "/metrics" {
        // kube-apiserver 1.20 before its first count: every resource at 0.
        return Response::new(Full::new(Bytes::from_static(
            b"etcd_object_counts{resource=\"pods\"} 0\n",
        )));
    }
    let lists = state.lists.load(Ordering::SeqCst) as u64;
    let extra = if state.sensitive.load(Ordering::SeqCst) {
        80 * lists
    } else {
        0
    };
    tokio::time::sleep(Duration::from_millis(5 + extra)).await;
    Response::new(Full::new(Bytes::from_static(b"ok")))
}

async fn start_apiserver(state: Arc<Apiserver>, stop: CancellationToken) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                _ = stop.cancelled() => return,
                a = listener.accept() => a.unwrap(),
            };
            let state = state.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(serve(state, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    url
}

/// `/debug/budget` as JSON.
async fn budget(client: &HttpClient, tg: &Running) -> serde_json::Value {
    let (status, text) = get_text(client, &tg.admin_url("/debug/budget")).await;
    assert_eq!(status, StatusCode::OK);
    serde_json::from_str(&text).unwrap()
}

/// Waits until tollgate has scraped the fake apiserver's count (0 pods).
async fn scraped_zero_pods(client: &HttpClient, tg: &Running) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = get_text(client, &tg.admin_url("/metrics")).await;
        if m.contains("tollgate_resource_objects{resource=\"pods\"} 0") {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "no scrape: {m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The fake apiserver and tollgate in front of it in enforce mode with the
/// default (adaptive) budget, and a client.
async fn setup() -> (CancellationToken, Arc<Apiserver>, Running, HttpClient) {
    let stop = CancellationToken::new();
    let state = Arc::new(Apiserver::default());
    let url = start_apiserver(state.clone(), stop.clone()).await;
    let mut c = config(&[&url]);
    c.mode = Mode::Enforce;
    // Health-check hiccups on a busy machine must not start a warm-up.
    c.relist_guard.enabled = false;
    c.quota.per_client.requests_per_second = 0.0;
    (stop, state, start(c).await, h1_client())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_bytes_stay_bounded_and_the_budget_falls_when_probes_slow_down() {
    let (stop, state, tg, client) = setup().await;

    // Health probes (exempt: a protected lane) at ~20/s, and a LIST flood.
    let probes = {
        let (client, url, stop) = (client.clone(), tg.url("http", "/healthz"), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let (status, _) = get_text(&client, &url).await;
                assert_eq!(status, StatusCode::OK);
                tokio::time::sleep(Duration::from_millis(45)).await;
            }
        })
    };
    let refused = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::new();
    for _ in 0..6 {
        let (client, url, stop) = (client.clone(), tg.url("http", "/api/v1/pods"), stop.clone());
        let refused = refused.clone();
        flood.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let (status, _) = get_text(&client, &url).await;
                if status == StatusCode::TOO_MANY_REQUESTS {
                    refused.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }

    // The budget as it moves, polled far faster than it can change (each
    // level lasts at least the controller's 2 s of evidence).
    let seen = Arc::new(Mutex::new(Vec::<serde_json::Value>::new()));
    let poller = {
        let (client, seen, stop) = (client.clone(), seen.clone(), stop.clone());
        let admin = tg.admin_url("/debug/budget");
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let (_, text) = get_text(&client, &admin).await;
                seen.lock()
                    .unwrap()
                    .push(serde_json::from_str(&text).unwrap());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let max_budget = |seen: &Mutex<Vec<serde_json::Value>>| {
        seen.lock()
            .unwrap()
            .iter()
            .map(|b| b["inflightBytes"].as_f64().unwrap())
            .fold(0.0, f64::max)
    };

    let cold = budget(&client, &tg).await;
    assert_eq!(cold["mode"], "adaptive");
    assert_eq!(cold["controller"]["state"], "startup");
    let start_inflight = cold["inflightBytes"].as_f64().unwrap();
    // Healthy: the budget grows until the apiserver serves two LISTs at once.
    eventually("two LISTs at once", Duration::from_secs(60), || {
        state.most_lists.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(max_budget(&seen) > start_inflight);
    assert_eq!(
        cold["targetSeconds"], 0.05,
        "no baseline yet: the 50 ms floor"
    );

    // Overloaded: each LIST in flight slows every probe by 80 ms.
    state.sensitive.store(true, Ordering::SeqCst);
    let peak = max_budget(&seen);
    let peak_level = seen
        .lock()
        .unwrap()
        .iter()
        .map(|b| b["controller"]["bytesPerSecond"].as_f64().unwrap())
        .fold(0.0, f64::max);
    // The rate falls to under half its peak (two cuts of 30%), and the
    // in-flight budget under its own (paced by the service time, it may
    // have peaked near its 8 MiB floor, which it cannot go under).
    let mut fell = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        let b = budget(&client, &tg).await;
        if b["controller"]["decreases"].as_u64().unwrap() >= 1
            && b["controller"]["bytesPerSecond"].as_f64().unwrap() < peak_level / 2.0
            && b["inflightBytes"].as_f64().unwrap() < peak
        {
            fell = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    let last = budget(&client, &tg).await;
    assert!(
        fell,
        "the rate did not fall below half its peak {peak_level}, or the in-flight budget below its peak {peak}: {last}"
    );

    // The LISTs the apiserver held at once never passed what the largest
    // in-flight budget allowed (6 MB each once learned; an unlearned or
    // oversized one alone). Without the budget, 32 heavy slots would have
    // let all six clients in at once.
    let most = state.most_lists.load(Ordering::SeqCst);
    let allowed = ((max_budget(&seen) / 6e6).floor() as usize).max(1);
    assert!(most <= allowed, "{most} LISTs at once, {allowed} allowed");
    assert!(state.served.load(Ordering::SeqCst) >= 2);

    let (_, metrics) = get_text(&client, &tg.admin_url("/metrics")).await;
    for name in [
        "tollgate_budget_bytes_per_second ",
        "tollgate_budget_inflight_bytes ",
        "tollgate_budget_signal_seconds ",
        "tollgate_budget_target_seconds 0.05",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
    poller.await.unwrap();
    probes.await.unwrap();
    for f in flood {
        f.await.unwrap();
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unlearned_list_runs_alone_even_when_the_apiserver_counts_zero_objects() {
    let (stop, state, tg, client) = setup().await;
    scraped_zero_pods(&client, &tg).await;
    // Priced by that count (0 objects: 0 bytes), the six would all start at once.
    let lists: Vec<_> = (0..6)
        .map(|_| {
            let (client, url) = (client.clone(), tg.url("http", "/api/v1/pods"));
            tokio::spawn(async move { get_text(&client, &url).await.0 })
        })
        .collect();
    for l in lists {
        let status = l.await.unwrap();
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "{status}"
        );
    }
    assert!(state.served.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        state.most_before_first.load(Ordering::SeqCst),
        1,
        "LISTs of an unlearned pattern ran together before the first was served"
    );
    stop.cancel();
    tg.stop().await;
}

/// Sends eight LISTs of `path_of(i)` at once; their lanes, all answered 200.
async fn eight_at_once(
    client: &HttpClient,
    tg: &Running,
    path_of: fn(usize) -> String,
) -> Vec<String> {
    let lists: Vec<_> = (0..8)
        .map(|i| {
            let (client, url) = (client.clone(), tg.url("http", &path_of(i)));
            tokio::spawn(async move {
                let resp = client
                    .request(Request::get(url).body(body(Bytes::new())).unwrap())
                    .await
                    .unwrap();
                let lane = resp
                    .headers()
                    .get(tollgate::admit::LANE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                (resp.status(), lane)
            })
        })
        .collect();
    let mut lanes = Vec::new();
    for l in lists {
        let (status, lane) = l.await.unwrap();
        assert_eq!(status, StatusCode::OK, "lanes so far: {lanes:?}");
        lanes.push(lane);
    }
    lanes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lists_of_a_pattern_learned_small_while_they_waited_run_together() {
    let (stop, state, tg, client) = setup().await;
    scraped_zero_pods(&client, &tg).await;
    // A LIST by label without a limit looks heavy until learned: the first
    // runs alone in the heavy lane, and it answers a few bytes.
    let lanes = eight_at_once(&client, &tg, |i| {
        format!("/api/v1/pods?labelSelector=app%3Dweb-{i}")
    })
    .await;
    assert_eq!(
        lanes.iter().filter(|l| *l == "heavy").count(),
        1,
        "only the first should be heavy: {lanes:?}"
    );
    assert!(
        state.most_selective.load(Ordering::SeqCst) >= 2,
        "the seven after the first ran one by one"
    );
    // Kubelets LIST their own pods from the watch cache: narrow, never heavy.
    let lanes = eight_at_once(&client, &tg, |i| {
        format!("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-{i}&resourceVersion=0")
    })
    .await;
    assert!(lanes.iter().all(|l| l != "heavy"), "{lanes:?}");
    stop.cancel();
    tg.stop().await;
}
