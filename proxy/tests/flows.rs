//! Flows, end to end through tollgate on loopback: what a client tollgate
//! cannot verify counts as by its source address.
//!
//! - Per-client heavy limits: LISTs each with a fresh junk bearer token are
//!   held to one client's rate, as the same LISTs without a token are (each
//!   token was its own client: all were forwarded).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use http::{Request, StatusCode};
use tollgate::budget::settings::QuotaMode;
use tollgate::config::Mode;

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
