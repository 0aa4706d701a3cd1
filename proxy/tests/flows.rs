//! Flows, end to end through tollgate on loopback: what a client tollgate
//! cannot verify counts as by its source address.
//!
//! - Fairness inside a light lane: anonymous clients behind one address
//!   sending slow request bodies hold at most their flow's share of the
//!   workload lane; a verified user and an anonymous client from another
//!   address are served at once (they waited out `maxWaitSeconds`, then 429).
//! - Per-client heavy limits: LISTs each with a fresh junk bearer token are
//!   held to one client's rate, as the same LISTs without a token are (each
//!   token was its own client: all were forwarded).
#![allow(clippy::unwrap_used)]

mod common;

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use tollgate::budget::settings::QuotaMode;
use tollgate::config::Mode;
use tollgate::enforce::settings::LaneRule;
use tollgate::enforce::Lane;

const FLOOD: usize = 12;
const WORKLOAD_SLOTS: usize = 8;

/// An HTTP/1.1 client whose connections come from `source`.
fn client_from(source: &str) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(source.parse::<IpAddr>().unwrap()));
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector)
}

/// A request body that stays open until its sender is dropped.
fn slow_body() -> (mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>, TestBody) {
    let (tx, rx) = mpsc::channel(1);
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    (tx, StreamBody::new(frames).boxed())
}

/// A GET's status and its time to the response head.
async fn timed_get(
    client: &HttpClient,
    url: &str,
    token: Option<&str>,
) -> (StatusCode, Duration, Option<String>) {
    let mut req = Request::get(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let started = std::time::Instant::now();
    let resp = client
        .request(req.body(body(Bytes::new())).unwrap())
        .await
        .unwrap();
    let took = started.elapsed();
    let lane = resp
        .headers()
        .get("x-tollgate-lane")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    (status, took, lane)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_anonymous_bodies_from_one_address_leave_the_lane_to_others() {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.mode = Mode::Enforce;
    c.lanes.max_inflight.workload = WORKLOAD_SLOTS;
    c.lanes.max_wait_seconds = 3.0;
    c.token_review.enabled = true;
    // The reviewed node's configmap GETs go to `system` (which shows it is
    // verified); everything else, its pod GETs included, is `workload`.
    c.lanes.rules = vec![LaneRule {
        lane: Lane::System,
        users: vec!["system:node:n1".into()],
        resources: vec!["configmaps".into()],
        ..LaneRule::default()
    }];
    let tg = start(c).await;
    let local = h1_client();

    // The node's token is reviewed (in the background) before the flood.
    let configmap = tg.url("http", "/api/v1/namespaces/d/configmaps/c");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, lane) = timed_get(&local, &configmap, Some("node-token")).await;
        if lane.as_deref() == Some("system") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the token was never reviewed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Anonymous clients from 127.0.0.1, each on its own connection, each
    // sending a body that does not end and keeping the echo unread: each
    // holds its slot until `done`.
    let done = tokio_util::sync::CancellationToken::new();
    let mut bodies = Vec::new();
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        let (tx, slow) = slow_body();
        bodies.push(tx);
        let req = Request::post(tg.url("http", "/echo")).body(slow).unwrap();
        let (client, done) = (h1_client(), done.clone());
        flood.push(tokio::spawn(async move {
            let resp = client.request(req).await;
            done.cancelled().await;
            resp.map(|r| r.status())
        }));
    }
    let echoes = || up.seen().iter().filter(|s| s.path == "/echo").count();
    eventually("the flood holds slots", Duration::from_secs(10), || {
        echoes() >= WORKLOAD_SLOTS / 2
    })
    .await;

    // The verified node and an anonymous client at another address.
    let pod = tg.url("http", "/api/v1/namespaces/d/pods/p");
    let elsewhere = client_from("127.0.0.2");
    for _ in 0..5 {
        let (status, took, lane) = timed_get(&local, &pod, Some("node-token")).await;
        assert_eq!(lane.as_deref(), Some("workload"));
        assert_eq!(status, StatusCode::OK, "the verified user after {took:?}");
        assert!(
            took < Duration::from_secs(1),
            "the verified user waited {took:?}"
        );
        let (status, took, _) = timed_get(&elsewhere, &pod, None).await;
        assert_eq!(status, StatusCode::OK, "another address after {took:?}");
        assert!(
            took < Duration::from_secs(1),
            "another address waited {took:?}"
        );
    }
    // The flood's flow held its share, half the lane, and no more.
    assert_eq!(echoes(), WORKLOAD_SLOTS / 2);
    assert_eq!(
        tg.gateway.admission().slots().inflight(Lane::Workload),
        WORKLOAD_SLOTS / 2
    );

    done.cancel();
    drop(bodies);
    for f in flood {
        let _ = f.await.unwrap();
    }
    tg.stop().await;
}

/// Enforcing, every LIST heavy, one heavy request a second per client (a
/// burst of 3), the pool never the limit.
fn heavy_rate_config(upstream: &str) -> tollgate::Config {
    let mut c = config(&[upstream]);
    c.mode = Mode::Enforce;
    c.quota.mode = QuotaMode::Static;
    c.lanes.heavy_threshold_bytes = 0.0;
    c.quota.per_client.requests_per_second = 1.0;
    c.quota.per_client.burst = 3;
    c
}

/// Statuses of `n` LISTs sent one after another, with `token(i)` as the
/// bearer token of the i-th (none if `None`).
async fn lists(tg: &Running, n: usize, token: impl Fn(usize) -> Option<String>) -> Vec<StatusCode> {
    let client = h1_client();
    let mut statuses = Vec::new();
    for i in 0..n {
        let mut req = Request::get(tg.url("http", "/api/v1/pods"));
        if let Some(t) = token(i) {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = client
            .request(req.body(body(bytes::Bytes::new())).unwrap())
            .await
            .unwrap();
        statuses.push(resp.status());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_junk_tokens_do_not_escape_the_per_client_heavy_rate() {
    let up = Upstream::start(None).await;
    let tg = start(heavy_rate_config(&up.url)).await;
    let refused = |s: &[StatusCode]| {
        s.iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count()
    };

    // Without a token: one client (anonymous) past its burst.
    let plain = lists(&tg, 12, |_| None).await;
    assert!(refused(&plain) >= 5, "without a token: {plain:?}");

    // A fresh junk token each: still one client, its source address. The
    // anonymous client's rate has refilled by at most a few requests.
    let seed = std::process::id();
    let rotating = lists(&tg, 12, |i| Some(format!("junk-{seed}-{i}"))).await;
    assert!(
        refused(&rotating) >= 5,
        "a fresh junk token per LIST escaped the per-client rate: {rotating:?}"
    );
    tg.stop().await;
}
