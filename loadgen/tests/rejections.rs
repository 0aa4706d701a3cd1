//! 429s: both body kinds understood, server classes split, Retry-After retries
//! counted as first-try 429s, retries and final failures.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::{config, full, json, serve};
use hyper::Response;
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn status_429() -> serde_json::Value {
    json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
           "reason":"TooManyRequests","message":"too many","details":{"retryAfterSeconds":0},"code":429})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_429_bodies_and_server_classes() {
    let server = serve(|req| async move {
        let path = req.uri().path().to_string();
        if path == "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations" {
            return json(
                200,
                json!({"kind":"PriorityLevelConfigurationList","items":[
                    {"metadata":{"name":"global-default","uid":"uid-global-default"}}]}),
            );
        }
        if path.ends_with("/loadgen-pod-0") {
            let mut r = json(429, status_429());
            r.headers_mut()
                .insert("x-tollgate-lane", "workload-low".parse().expect("hv"));
            r.headers_mut()
                .insert("retry-after", "1".parse().expect("hv"));
            r
        } else if path.ends_with("/loadgen-pod-1") {
            let mut r = Response::new(full("Too many requests, please try again later.\n"));
            *r.status_mut() = hyper::StatusCode::TOO_MANY_REQUESTS;
            r.headers_mut().insert(
                "x-kubernetes-pf-prioritylevel-uid",
                "uid-global-default".parse().expect("hv"),
            );
            r
        } else {
            let mut r = Response::new(full("{\"kind\":\"Pod\"}"));
            r.headers_mut()
                .insert("x-tollgate-lane", "workload-low".parse().expect("hv"));
            r
        }
    })
    .await;
    let cfg = config(
        &server.url(),
        &["--gets", "30/s", "--duration", "1s", "--objects", "3"],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let get = report.operation("get").expect("get");
    assert_eq!(get.requests, 30);
    assert_eq!(get.status_codes.get("429"), Some(&20));
    assert_eq!(get.status_codes.get("200"), Some(&10));
    assert_eq!(get.rejections_429_body.status_json, 10);
    assert_eq!(get.rejections_429_body.plain_text, 10);
    assert_eq!(get.error_classes.get("429"), Some(&20));
    assert!((get.rate_429 - 20.0 / 30.0).abs() < 1e-9);
    assert_eq!(get.retries.first_try_429, 20);
    assert_eq!(get.retries.retries, 0);
    let lane = get
        .server_classes
        .iter()
        .find(|c| c.class == "workload-low")
        .expect("lane");
    assert_eq!((lane.requests, lane.rejected_429), (20, 10));
    let apf = get
        .server_classes
        .iter()
        .find(|c| c.class == "uid-global-default")
        .expect("apf");
    assert_eq!((apf.requests, apf.rejected_429), (10, 10));
    assert_eq!(
        (apf.source.as_str(), apf.name.as_deref()),
        ("priority-level", Some("global-default"))
    );
    assert_eq!((lane.source.as_str(), lane.name.as_deref()), ("lane", None));
}

/// pod-0 is always rejected; pod-1 is rejected on every other request, so each
/// of its requests succeeds on the first retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_and_counted() {
    let seen: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let s = seen.clone();
    let server = serve(move |req| {
        let s = s.clone();
        async move {
            let path = req.uri().path().to_string();
            let n = {
                let mut m = s.lock().expect("lock");
                let e = m.entry(path.clone()).or_default();
                *e += 1;
                *e
            };
            let reject = path.ends_with("/loadgen-pod-0")
                || (path.ends_with("/loadgen-pod-1") && n % 2 == 1);
            if reject {
                // Retry-After comes from the Status body (0 s) here, not a header.
                json(429, status_429())
            } else {
                Response::new(full("{}"))
            }
        }
    })
    .await;
    let cfg = config(
        &server.url(),
        &[
            "--gets",
            "10/s",
            "--duration",
            "2s",
            "--objects",
            "2",
            "--honor-retry-after",
            "--max-retries",
            "2",
        ],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let get = report.operation("get").expect("get");
    assert_eq!(get.requests, 20);
    assert_eq!(get.retries.first_try_429, 20);
    assert_eq!(get.retries.final_429, 10);
    assert_eq!(get.retries.retries, 10 * 2 + 10);
    assert_eq!(get.ok, 10);
    let total: u64 = seen.lock().expect("lock").values().sum();
    assert_eq!(
        total,
        20 + 30 + 1,
        "requests seen by the server, with /version"
    );
}
