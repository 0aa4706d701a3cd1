//! `--watch-list`: watches that start with a streaming list
//! (`sendInitialEvents=true`), recorded as the LIST they replace; a stream
//! cut before its last object starts over; an apiserver that refuses it
//! gets LIST then WATCH.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use common::{channel_body, config, full, json};
use hyper::Response;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const PODS: u64 = 3;

#[derive(Default)]
struct Seen {
    streams: AtomicU64,
    lists: AtomicU64,
    watches: AtomicU64,
}

fn added(i: u64) -> Bytes {
    let pod = json!({"kind":"Pod","metadata":{"name":format!("p{i}"),"resourceVersion":(i + 1).to_string()}});
    Bytes::from(json!({"type":"ADDED","object":pod}).to_string() + "\n")
}

/// A streaming list's objects, its end-of-initial-events bookmark, then an
/// open watch; the first stream of all is cut after one object.
async fn stream(seen: &Seen) -> Response<common::Body> {
    let n = seen.streams.fetch_add(1, Ordering::Relaxed);
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        for i in 0..PODS {
            if tx.send(added(i)).await.is_err() || (n == 0 && i == 0) {
                return;
            }
        }
        let end = json!({"type":"BOOKMARK","object":{"kind":"Pod","metadata":{
            "resourceVersion": PODS.to_string(),
            "annotations": {"k8s.io/initial-events-end": "true"}}}});
        if tx.send(Bytes::from(end.to_string() + "\n")).await.is_ok() {
            tx.closed().await;
        }
    });
    Response::new(body)
}

async fn serve(supports: bool) -> (common::TestServer, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let server = common::serve(move |req| {
        let seen = s.clone();
        async move {
            let query = req.uri().query().unwrap_or("").to_string();
            if req.uri().path() == "/version" {
                return Response::new(full("{}"));
            }
            if query.contains("sendInitialEvents=true") {
                assert!(query.contains("watch=1"), "{query}");
                assert!(
                    query.contains("resourceVersionMatch=NotOlderThan"),
                    "{query}"
                );
                assert!(!query.contains("resourceVersion="), "{query}");
                if !supports {
                    seen.streams.fetch_add(1, Ordering::Relaxed);
                    return json(
                        400,
                        json!({"kind":"Status","status":"Failure","reason":"BadRequest","code":400,
                               "message":"resourceVersionMatch is forbidden for watch"}),
                    );
                }
                return stream(&seen).await;
            }
            if query.contains("watch=1") {
                seen.watches.fetch_add(1, Ordering::Relaxed);
                let (tx, body) = channel_body();
                tokio::spawn(async move { tx.closed().await });
                return Response::new(body);
            }
            seen.lists.fetch_add(1, Ordering::Relaxed);
            json(
                200,
                json!({"kind":"PodList","metadata":{"resourceVersion":"9"},"items":[]}),
            )
        }
    })
    .await;
    (server, seen)
}

async fn run(url: &str) -> loadgen::Report {
    let args = [
        "--watches",
        "2",
        "--watch-list",
        "--duration",
        "4s",
        "--drain-timeout",
        "1s",
    ];
    loadgen::run(config(url, &args), CancellationToken::new())
        .await
        .expect("run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_replaces_the_list_and_starts_over_when_cut_short() {
    let (server, seen) = serve(true).await;
    let report = run(&server.url()).await;
    let w = report.watches.as_ref().expect("watches");
    // The cut stream started over: three streams for two watchers, no LIST.
    assert_eq!(seen.streams.load(Ordering::Relaxed), 3);
    assert_eq!(seen.lists.load(Ordering::Relaxed), 0);
    assert_eq!(w.stream_refusals, 0);
    assert_eq!(
        w.events,
        1 + 2 * PODS,
        "the cut stream's object, then each watcher's"
    );
    assert_eq!(w.active_at_end, 2, "the streams go on as watches");
    // Recorded as the LISTs they replace, once each watcher has all.
    let lists = report.operation("watch-list").expect("watch-list");
    assert_eq!(lists.requests, 2);
    assert!(lists.bytes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_that_refuses_it_gets_list_then_watch() {
    let (server, seen) = serve(false).await;
    let report = run(&server.url()).await;
    let w = report.watches.as_ref().expect("watches");
    assert_eq!(seen.streams.load(Ordering::Relaxed), 2, "asked once each");
    assert_eq!(w.stream_refusals, 2);
    assert_eq!(seen.lists.load(Ordering::Relaxed), 2);
    assert_eq!(seen.watches.load(Ordering::Relaxed), 2);
    assert_eq!(report.operation("watch-list").expect("list").requests, 2);
}
