//! The open-loop promise: requests leave on schedule whatever the server
//! does, and latency counts from the intended start (no coordinated omission).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{config, full, serve};
use hyper::Response;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Runs `rate`/s for `secs` against a server that records arrival times, and
/// returns (requests reported, p99 and max |arrival - intended| in ms), the
/// schedule anchored at the first arrival.
async fn timing_error(rate: u32, secs: u32) -> (u64, usize, f64, f64) {
    let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let a = arrivals.clone();
    let server = serve(move |req| {
        let a = a.clone();
        async move {
            if req.uri().path() != "/version" {
                a.lock().expect("lock").push(Instant::now());
            }
            Response::new(full("{}"))
        }
    })
    .await;
    let rate_s = format!("{rate}/s");
    let dur = format!("{secs}s");
    let cfg = config(&server.url(), &["--gets", &rate_s, "--duration", &dur]);
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let get = report.operation("get").expect("get");
    println!(
        "requests {} ok {} dropped {} cancelled {} errors {:?} start lag p99 {} ms",
        get.requests, get.ok, get.dropped, get.cancelled, get.error_classes, get.start_lag_ms.p99
    );
    let arrivals = arrivals.lock().expect("lock").clone();
    let t0 = arrivals[0];
    let mut errors: Vec<f64> = arrivals
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (t.duration_since(t0).as_secs_f64() - i as f64 / f64::from(rate)).abs() * 1000.0
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    let p99 = errors[(errors.len() * 99).div_ceil(100) - 1];
    let max = errors[errors.len() - 1];
    (
        report.operation("get").expect("get").requests,
        arrivals.len(),
        p99,
        max,
    )
}

/// 1,000 requests/s: the timing error measured outside loadgen. The strict
/// 1 ms goal belongs to the release-mode benchmark; this debug-mode test on a
/// shared 2-core machine checks for gross errors and prints the figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timing_error_at_1000_per_second() {
    let (requests, arrived, p99, max) = timing_error(1000, 2).await;
    println!("1000/s: {arrived} arrivals, timing error p99 {p99:.3} ms, max {max:.3} ms");
    assert_eq!(requests, 2000);
    assert_eq!(arrived, 2000);
    assert!(p99 < 50.0, "p99 timing error {p99:.2} ms");
}

/// A test server records arrival times; they are compared with the intended
/// schedule `t0 + i / rate` (anchored at the first arrival).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrivals_keep_the_schedule() {
    let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let a = arrivals.clone();
    let server = serve(move |req| {
        let a = a.clone();
        async move {
            if req.uri().path() != "/version" {
                a.lock().expect("lock").push(Instant::now());
            }
            Response::new(full(
                r#"{"kind":"PodList","metadata":{"resourceVersion":"1"},"items":[]}"#,
            ))
        }
    })
    .await;
    let cfg = config(&server.url(), &["--lists", "200/s", "--duration", "2s"]);
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let list = report.operation("list").expect("list");
    // Rate accuracy: exactly the scheduled 400 requests were sent and answered.
    assert_eq!(list.requests, 400);
    assert_eq!(list.dropped, 0);
    let arrivals = arrivals.lock().expect("lock").clone();
    assert_eq!(arrivals.len(), 400);
    let t0 = arrivals[0];
    let mut errors: Vec<f64> = arrivals
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let intended = i as f64 / 200.0;
            (t.duration_since(t0).as_secs_f64() - intended).abs() * 1000.0
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    let p99 = errors[(errors.len() * 99) / 100 - 1];
    // Loose: debug build on a shared 2-core machine; the benchmark holds the 1 ms target.
    println!("200/s: timing error p99 {p99:.3} ms");
    assert!(p99 < 50.0, "p99 timing error {p99:.2} ms");
}

/// A server that stalls every request arriving in [0.5 s, 1.5 s) after its
/// first request until 1.5 s.
async fn stalling_server() -> common::TestServer {
    let stall: Arc<Mutex<Option<(Instant, Instant)>>> = Arc::default();
    serve(move |req| {
        let s = stall.clone();
        async move {
            if req.uri().path() != "/version" {
                let now = Instant::now();
                let window = *s.lock().expect("lock").get_or_insert_with(|| {
                    (
                        now + Duration::from_millis(500),
                        now + Duration::from_millis(1500),
                    )
                });
                if now >= window.0 && now < window.1 {
                    tokio::time::sleep_until(window.1).await;
                }
            }
            Response::new(full("{}"))
        }
    })
    .await
}

/// What a closed-loop client (send, wait for the answer, send the next; latency
/// from the actual send) reports against the same stall: (requests, slow ones).
async fn closed_loop_slow_count(url: &str, rate: f64, secs: f64) -> (u64, u64) {
    let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let uri: hyper::Uri = format!("{url}/api/v1/namespaces/default/pods/x")
        .parse()
        .expect("uri");
    let start = Instant::now();
    let (mut n, mut slow) = (0u64, 0u64);
    let mut next = start;
    while next.duration_since(start).as_secs_f64() < secs {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        let resp = client.get(uri.clone()).await.expect("closed-loop request");
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        n += 1;
        if sent.elapsed() > Duration::from_millis(100) {
            slow += 1;
        }
        // The next request waits for this one: the stall hides behind it.
        next = (next + Duration::from_secs_f64(1.0 / rate)).max(Instant::now());
    }
    (n, slow)
}

/// The whole server stalls for 1 s once. Requests due during the stall still
/// leave on time and count their wait, so p99 shows ~1 s and about a third of
/// the requests are slow. A closed-loop client against the same stall sends
/// one request during it and reports a single slow request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shows_in_p99() {
    let server = stalling_server().await;
    let cfg = config(&server.url(), &["--gets", "100/s", "--duration", "3s"]);
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let get = report.operation("get").expect("get");
    assert_eq!(get.requests, 300);
    assert!(get.latency_ms.p99 > 900.0, "p99 {} ms", get.latency_ms.p99);
    let hist = report.histograms.get("get").expect("histogram");
    let slow = hist.count_between(100_000, u64::MAX);
    assert!((80..=110).contains(&slow), "{slow} requests over 100 ms");
    assert!(get.latency_ms.p50 < 100.0, "p50 {} ms", get.latency_ms.p50);

    let other = stalling_server().await;
    let (closed_n, closed_slow) = closed_loop_slow_count(&other.url(), 100.0, 3.0).await;
    println!("open loop: {slow} of 300 slow; closed loop: {closed_slow} of {closed_n} slow");
    assert!(
        closed_slow <= 2,
        "closed loop saw {closed_slow} slow requests"
    );
    assert!(
        closed_n < 300,
        "closed loop sent {closed_n}: fewer, since it waited out the stall"
    );
    assert!(slow >= 40 * closed_slow.max(1));
}

/// At `--max-in-flight`, ticks are dropped and counted, not delayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drops_are_counted_at_max_in_flight() {
    let server = serve(|req| async move {
        if req.uri().path() != "/version" {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        Response::new(full("{}"))
    })
    .await;
    let cfg = config(
        &server.url(),
        &["--gets", "50/s", "--duration", "1s", "--max-in-flight", "2"],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let get = report.operation("get").expect("get");
    assert_eq!(get.requests, 2);
    assert_eq!(get.dropped, 48);
    assert!(get.latency_ms.max >= 1400.0);
}

/// `--schedule steps`: each step's rate and percentiles, Tess.IO's table rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_report_one_row_per_rate() {
    let server = serve(|_req| async move { Response::new(full("{}")) }).await;
    let cfg = config(
        &server.url(),
        &[
            "--gets",
            "20/s",
            "--schedule",
            "steps",
            "--steps",
            "2",
            "--step-duration",
            "1s",
            "--duration",
            "3s",
        ],
    );
    let report = loadgen::run(cfg, CancellationToken::new())
        .await
        .expect("run");
    let get = report.operation("get").expect("get");
    let rows: Vec<(u64, f64, u64)> = get
        .steps
        .iter()
        .map(|s| (s.step, s.target_rate_per_s, s.requests))
        .collect();
    assert_eq!(rows, vec![(1, 10.0, 10), (2, 20.0, 20), (3, 20.0, 20)]);
    assert_eq!(get.requests, 50);
    assert!(report.table().contains("step 2"));
}
