//! Fair shares in a light lane, end to end (issue 34): abusive flows —
//! anonymous clients behind one address each, every one sending request
//! bodies that never end, each holding its slot — cannot take the lane
//! from a well-behaved client at another address, with two of them (one
//! after the other) or ten (flooding together). With a fixed cap of half
//! the lane per flow, two flows took all of it and everyone else waited
//! out `lanes.maxWaitSeconds` for a 429.
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
use tokio_util::sync::CancellationToken;
use tollgate::config::Mode;
use tollgate::enforce::Lane;

/// An HTTP/1.1 client whose connections come from `source`.
fn client_from(source: &str) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(source.parse::<IpAddr>().unwrap()));
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector)
}

type Sender = mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;

/// One slow upload from `source`: a POST whose body stays open until its
/// sender is dropped, the echo left unread until `done`.
fn slow_upload(
    tg: &Running,
    source: &str,
    done: &CancellationToken,
) -> (Sender, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(1);
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    let req = Request::post(tg.url("http", "/echo"))
        .body(StreamBody::new(frames).boxed())
        .unwrap();
    let (client, done) = (client_from(source), done.clone());
    let task = tokio::spawn(async move {
        let resp = client.request(req).await;
        done.cancelled().await;
        drop(resp);
    });
    (tx, task)
}

/// Enforcing, a workload lane of `slots`, 2 s of waiting at most.
async fn tollgate(slots: usize) -> (Upstream, Running) {
    let up = Upstream::start(None).await;
    let mut c = config(&[&up.url]);
    c.mode = Mode::Enforce;
    c.lanes.max_inflight.workload = slots;
    c.lanes.max_wait_seconds = 2.0;
    let tg = start(c).await;
    (up, tg)
}

/// A well-behaved client at 127.0.0.200: five GETs one after another,
/// each answered 200 within a second.
async fn well_behaved_is_served(tg: &Running, what: &str) {
    let client = client_from("127.0.0.200");
    let url = tg.url("http", "/api/v1/namespaces/d/pods/p");
    for i in 0..5 {
        let started = std::time::Instant::now();
        let resp = client
            .request(Request::get(&url).body(body(Bytes::new())).unwrap())
            .await
            .unwrap();
        let took = started.elapsed();
        eprintln!("{what}: GET {i}: {} after {took:?}", resp.status());
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "{what}: GET {i} after {took:?}"
        );
        assert!(
            took < Duration::from_secs(1),
            "{what}: GET {i} waited {took:?}"
        );
        let _ = resp.into_body().collect().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_abusive_flows_one_after_the_other_leave_room_for_others() {
    const SLOTS: usize = 12;
    let (up, tg) = tollgate(SLOTS).await;
    let done = CancellationToken::new();
    let echoes = || up.seen().iter().filter(|s| s.path == "/echo").count();
    let mut held = Vec::new();
    // The first flow, alone: half the lane; the second leaves a share of
    // ⌊12/3⌋ = 4 free, so it gets 2.
    for (source, expect) in [("127.0.0.2", 6), ("127.0.0.3", 6 + 2)] {
        for _ in 0..30 {
            held.push(slow_upload(&tg, source, &done));
        }
        eventually("the flow holds its share", Duration::from_secs(10), || {
            echoes() >= expect
        })
        .await;
    }
    well_behaved_is_served(&tg, "two abusive flows").await;
    // The abusers hold no more than their shares.
    assert_eq!(echoes(), 8);
    assert_eq!(tg.gateway.admission().slots().inflight(Lane::Workload), 8);
    done.cancel();
    for (tx, task) in held {
        drop(tx);
        task.await.unwrap();
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_abusive_flows_flooding_together_leave_room_for_others() {
    const SLOTS: usize = 40;
    let (up, tg) = tollgate(SLOTS).await;
    let done = CancellationToken::new();
    let echoes = || up.seen().iter().filter(|s| s.path == "/echo").count();
    let sources: Vec<String> = (10..20).map(|i| format!("127.0.0.{i}")).collect();
    let mut held = Vec::new();
    // One upload of each flow, then 29 more of each at once.
    for s in &sources {
        held.push(slow_upload(&tg, s, &done));
    }
    eventually("each flow holds a slot", Duration::from_secs(10), || {
        echoes() >= 10
    })
    .await;
    for _ in 0..29 {
        for s in &sources {
            held.push(slow_upload(&tg, s, &done));
        }
    }
    // Ten flows present: a share is ⌊40/11⌋ = 3 slots each.
    eventually(
        "the flows hold their shares",
        Duration::from_secs(10),
        || echoes() >= 30,
    )
    .await;
    well_behaved_is_served(&tg, "ten abusive flows").await;
    assert_eq!(echoes(), 30, "no abuser past its share");
    done.cancel();
    for (tx, task) in held {
        drop(tx);
        task.await.unwrap();
    }
    tg.stop().await;
}
