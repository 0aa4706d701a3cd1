//! Informer-like watches: 410 Gone → relist, clean stream ends → re-watch from
//! the last revision with no missed or repeated events, and event delivery
//! latency from the annotation loadgen's own PATCHes write.

mod common;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{body_bytes, channel_body, config, full, json};
use hyper::Response;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Events after each revision, replayed to watches that start from an older one.
#[derive(Default)]
struct Store {
    rv: u64,
    history: Vec<(u64, String)>,
    watch_requests: u64,
}

struct Sim {
    store: Mutex<Store>,
    changed: tokio::sync::watch::Sender<u64>,
}

/// Each watch stream ends after this many events (like a server timeout).
const EVENTS_PER_STREAM: usize = 5;

async fn handle(
    sim: Arc<Sim>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Response<common::Body> {
    let query = req.uri().query().unwrap_or("").to_string();
    let path = req.uri().path().to_string();
    if req.method() == hyper::Method::PATCH {
        let body: serde_json::Value =
            serde_json::from_slice(&body_bytes(req).await).unwrap_or_default();
        let stamp = body["metadata"]["annotations"]["loadgen.tollgate.dev/written-at"].clone();
        let name = path.rsplit('/').next().unwrap_or("").to_string();
        let mut st = sim.store.lock().expect("lock");
        st.rv += 1;
        let rv = st.rv;
        let object = json!({"kind":"Pod","metadata":{"name":name,"resourceVersion":rv.to_string(),
                             "annotations":{"loadgen.tollgate.dev/written-at":stamp}}});
        let event = json!({"type":"MODIFIED","object":object}).to_string() + "\n";
        st.history.push((rv, event));
        drop(st);
        sim.changed.send_replace(rv);
        return json(200, object);
    }
    if !query.contains("watch=1") {
        // Every list reports the state at revision 0 (no pods): later events replay on watch.
        return json(
            200,
            json!({"kind":"PodList","metadata":{"resourceVersion":"0"},"items":[]}),
        );
    }
    let from: u64 = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("resourceVersion="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let first = {
        let mut st = sim.store.lock().expect("lock");
        st.watch_requests += 1;
        st.watch_requests == 1
    };
    let (tx, body) = channel_body();
    if first {
        let gone = json!({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure",
                          "reason":"Expired","message":"too old resource version","code":410}});
        let _ = tx.send(Bytes::from(gone.to_string() + "\n")).await;
        return Response::new(body);
    }
    let mut changed = sim.changed.subscribe();
    tokio::spawn(async move {
        let mut cursor = from;
        let mut sent = 0;
        let bookmark = json!({"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":from.to_string()}}});
        if tx
            .send(Bytes::from(bookmark.to_string() + "\n"))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let pending: Vec<(u64, String)> = {
                let st = sim.store.lock().expect("lock");
                st.history
                    .iter()
                    .filter(|(rv, _)| *rv > cursor)
                    .cloned()
                    .collect()
            };
            for (rv, event) in pending {
                if tx.send(Bytes::from(event)).await.is_err() {
                    return;
                }
                cursor = rv;
                sent += 1;
                if sent == EVENTS_PER_STREAM {
                    return; // ends the stream: the watcher must re-watch from `cursor`
                }
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    });
    Response::new(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_relist_reconnect_and_measure_delivery() {
    watch_run(&[]).await;
}

/// The same over HTTP/2 (h2c), two watches per connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_over_http2() {
    watch_run(&["--http2", "--watches-per-connection", "2"]).await;
}

async fn watch_run(extra: &[&str]) {
    let sim = Arc::new(Sim {
        store: Mutex::new(Store::default()),
        changed: tokio::sync::watch::channel(0).0,
    });
    let s = sim.clone();
    let server = common::serve(move |req| {
        let s = s.clone();
        async move {
            if req.uri().path() == "/version" {
                return Response::new(full("{}"));
            }
            handle(s, req).await
        }
    })
    .await;
    let mut args: Vec<&str> = vec![
        "--watches",
        "3",
        "--patches",
        "20/s",
        "--patch-target",
        "pod-labels",
        "--patch-type",
        "merge",
        "--duration",
        "2s",
        "--namespace-allow",
        "default",
        "--drain-timeout",
        "5s",
    ];
    args.extend_from_slice(extra);
    let cfg = config(&server.url(), &args);
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let patches = report.operation("patch").expect("patch");
    assert_eq!(patches.ok, 40);
    let w = report.watches.as_ref().expect("watches");
    assert_eq!((w.gone_410, w.relists), (1, 1));
    assert!(
        w.reconnects >= 3 * (40 / EVENTS_PER_STREAM as u64) - 3,
        "reconnects {}",
        w.reconnects
    );
    assert!(w.bookmarks >= 3);
    // Every watcher sees every event exactly once (the last may still be in flight at the end).
    assert!(w.events <= 3 * 40, "duplicates: {} events", w.events);
    assert!(w.events >= 3 * 39, "missed events: {} of 120", w.events);
    let delivery = report.operation("watch-event").expect("watch-event");
    assert_eq!(delivery.requests, w.events);
    assert!(
        delivery.latency_ms.p99 < 1000.0,
        "delivery p99 {}",
        delivery.latency_ms.p99
    );
    assert_eq!(
        report.operation("watch-list").expect("watch-list").requests,
        4
    );
}
