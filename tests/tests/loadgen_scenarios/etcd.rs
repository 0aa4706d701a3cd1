//! `loadgen etcd` and the shipped etcd scenarios through loadgen's library,
//! against a real etcd (`/usr/bin/etcd`, Debian's etcd-server, or `$ETCD_BIN`)
//! on loopback with its own ports and data dir: rates are kept (counted, not
//! timed), ranges read exactly what the prefix holds, the seed is idempotent,
//! watch events are recorded; and the shipped etcd scenarios
//! (`loadgen/scenarios/etcd-*.yaml`, Tess.IO's "large range vs puts" and
//! "separate pods into their own etcd") at CI scale. The scenario runner checks
//! that its API target answers, so the simulator stands in for it there (etcd
//! phases never touch it). Moved here from loadgen's own tests so that loadgen
//! does not depend on `bench` for its test etcd.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::path::Path;

use bench::sim::etcd_server::EtcdServer;
use clap::Parser;
use etcd_client::{Client, GetOptions};
use loadgen::cli::etcd::EtcdArgs;
use loadgen::etcd::{EtcdConfig, EtcdError};
use loadgen::scenario::{self, RunOptions, ScenarioReport};
use tests::SimProcess;
use tokio_util::sync::CancellationToken;

/// A real etcd on free loopback ports, killed on drop.
async fn etcd() -> EtcdServer {
    tokio::task::spawn_blocking(|| {
        EtcdServer::start()
            .unwrap_or_else(|e| panic!("cannot start etcd (install Debian's etcd-server): {e}"))
    })
    .await
    .unwrap()
}

#[derive(Debug, Parser)]
struct Wrap {
    #[command(flatten)]
    args: EtcdArgs,
}

fn config(args: &[&str]) -> Result<EtcdConfig, EtcdError> {
    let mut all = vec!["loadgen-etcd", "--no-progress"];
    all.extend_from_slice(args);
    Wrap::try_parse_from(all).unwrap().args.into_config()
}

async fn run(args: &[&str]) -> loadgen::Report {
    loadgen::etcd::run(config(args).unwrap(), CancellationToken::new())
        .await
        .unwrap()
}

/// Bytes etcd holds under `prefix` (keys and values), the first `limit` keys if > 0.
async fn prefix_bytes(c: &mut Client, prefix: &str, limit: i64) -> (u64, u64) {
    let resp = c
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_limit(limit)),
        )
        .await
        .unwrap();
    let bytes = resp
        .kvs()
        .iter()
        .map(|kv| (kv.key().len() + kv.value().len()) as u64)
        .sum();
    (resp.kvs().len() as u64, bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rates_are_kept_and_ranges_read_the_seeded_prefix() {
    let e = etcd().await;
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let report = run(&[
        "--endpoints",
        &e.url,
        "--seed",
        "200",
        "--seed-size",
        "500",
        "--range-prefix",
        "/t/pods/",
        "--ranges",
        "20/s",
        "--puts",
        "50/s",
        "--put-prefix",
        "/t/puts/",
        "--put-keys",
        "30",
        "--put-size",
        "300",
        "--duration",
        "2s",
        "--output",
        out_dir,
    ])
    .await;
    let mut c = Client::connect([e.url.as_str()], None).await.unwrap();

    // The seed is in place, under RANGE-PREFIX/loadgen-seed/.
    let (seeded, seed_bytes) = prefix_bytes(&mut c, "/t/pods/loadgen-seed/", 0).await;
    assert_eq!(seeded, 200);
    // Every tick of a 2 s schedule was sent and answered: 20/s → 40, 50/s → 100.
    let range = report.operation("etcd-range").unwrap();
    let put = report.operation("etcd-put").unwrap();
    assert_eq!(
        (range.requests, range.ok, range.dropped),
        (40, 40, 0),
        "{range:?}"
    );
    assert_eq!(
        (put.requests, put.ok, put.dropped),
        (100, 100, 0),
        "{put:?}"
    );
    assert_eq!(range.verb, "RANGE");
    assert_eq!(range.target_rate_per_s, Some(20.0));
    // Each range read the whole prefix: exactly the seed's bytes each time.
    let (all_keys, all_bytes) = prefix_bytes(&mut c, "/t/pods/", 0).await;
    assert_eq!((all_keys, all_bytes), (200, seed_bytes));
    assert_eq!(range.bytes, 40 * all_bytes);
    // The puts cycled over 30 keys of 300-byte values.
    let (put_keys, _) = prefix_bytes(&mut c, "/t/puts/", 0).await;
    assert_eq!(put_keys, 30);
    let one = c.get("/t/puts/7", None).await.unwrap();
    assert_eq!(one.kvs()[0].value().len(), 300);
    assert!(range.latency_ms.p50 > 0.0 && put.latency_ms.p99 > 0.0);

    // The same files as an API run.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    let names: Vec<_> = summary["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["etcd-range", "etcd-put"]);
    assert_eq!(summary["operations"][1]["status_codes"]["200"], 100);
    assert!(out.path().join("perfdata.json").is_file());
    assert!(out.path().join("histograms/etcd-put.hdr").is_file());

    // Seeding again writes nothing (the revision stays); a limited, keys-only,
    // serializable range reads exactly the first 50 keys.
    let before = c.status().await.unwrap().header().unwrap().revision();
    let report = run(&[
        "--endpoints",
        &e.url,
        "--seed",
        "200",
        "--range-prefix",
        "/t/pods/",
        "--ranges",
        "10/s",
        "--range-limit",
        "50",
        "--keys-only",
        "--serializable",
        "--duration",
        "1s",
    ])
    .await;
    let after = c.status().await.unwrap().header().unwrap().revision();
    assert_eq!(
        before, after,
        "a seed already in place is not written again"
    );
    let range = report.operation("etcd-range").unwrap();
    assert_eq!((range.requests, range.ok), (10, 10));
    assert_eq!(range.verb, "RANGE(serializable)");
    let keys = c
        .get(
            "/t/pods/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_limit(50)
                    .with_keys_only(),
            ),
        )
        .await
        .unwrap();
    let key_bytes: u64 = keys.kvs().iter().map(|kv| kv.key().len() as u64).sum();
    assert_eq!(keys.kvs().len(), 50);
    assert_eq!(range.bytes, 10 * key_bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_events_are_recorded() {
    let e = etcd().await;
    let report = run(&[
        "--endpoints",
        &e.url,
        "--puts",
        "20/s",
        "--put-prefix",
        "/w/",
        "--watches",
        "2",
        "--duration",
        "1s",
    ])
    .await;
    let put = report.operation("etcd-put").unwrap();
    assert_eq!((put.requests, put.ok), (20, 20));
    // Both watchers saw every put, and each event was timed.
    let watch = report.operation("etcd-watch").unwrap();
    assert_eq!(watch.requests, 40, "{watch:?}");
    assert_eq!(watch.target_rate_per_s, Some(40.0));
    assert!(watch.latency_ms.max > 0.0);
    let w = report.watches.as_ref().unwrap();
    assert_eq!((w.watchers, w.events, w.errors), (2, 40, 0), "{w:?}");
}

// === the shipped scenarios ===

async fn run_scenario(file: &str, params: &[(&str, &str)], etcd: &str) -> ScenarioReport {
    let api = tokio::task::spawn_blocking(|| SimProcess::start(&[]))
        .await
        .unwrap()
        .unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../loadgen/scenarios")
        .join(file);
    let params: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let s = scenario::load(&path, &params).unwrap();
    let mut opts = RunOptions {
        etcd_endpoints: Some(etcd.to_string()),
        ..RunOptions::default()
    };
    opts.target.server = Some(api.url.clone());
    scenario::run(&s, &opts, CancellationToken::new())
        .await
        .unwrap()
}

/// Requests of `verb` gathered by measurement `id`.
fn calls(r: &ScenarioReport, id: &str, verb: &str) -> (u64, u64) {
    let m = r
        .measurements
        .iter()
        .find(|m| m.identifier == id)
        .unwrap_or_else(|| panic!("no measurement {id}"));
    m.calls
        .iter()
        .filter(|c| c.verb == verb)
        .fold((0, 0), |(n, ok), c| (n + c.requests, ok + c.ok))
}

async fn count(url: &str, prefix: &str) -> i64 {
    let mut c = Client::connect([url], None).await.unwrap();
    c.get(
        prefix,
        Some(GetOptions::new().with_prefix().with_count_only()),
    )
    .await
    .unwrap()
    .count()
}

const CI: &[(&str, &str)] = &[("Pods", "200"), ("StepDuration", "2s"), ("PutRate", "20/s")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_range_vs_puts() {
    let e = etcd().await;
    let r = run_scenario("etcd-large-range-vs-puts.yaml", CI, &e.url).await;
    assert_eq!(r.error, None, "{r:#?}");
    assert!(r.steps.iter().all(|s| s.error.is_none()), "{:#?}", r.steps);
    assert_eq!(count(&e.url, "/registry/pods/loadgen-seed/").await, 200);
    // Every step kept its put rate (20/s for 2 s); the range steps ranged at 1/s and 4/s.
    for id in ["puts-alone", "ranges-1", "ranges-4"] {
        assert_eq!(calls(&r, id, "PUT"), (40, 40), "{id}");
    }
    assert_eq!(calls(&r, "puts-alone", "RANGE"), (0, 0));
    assert_eq!(calls(&r, "ranges-1", "RANGE"), (2, 2));
    assert_eq!(calls(&r, "ranges-4", "RANGE"), (8, 8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_pods_into_their_own_etcd() {
    let (pods, nodes) = tokio::join!(etcd(), etcd());
    let mut params = CI.to_vec();
    params.push(("PodsEtcd", &pods.url));
    params.push(("NodesEtcd", &nodes.url));
    let r = run_scenario("etcd-separate-pods.yaml", &params, &pods.url).await;
    assert_eq!(r.error, None, "{r:#?}");
    assert!(r.steps.iter().all(|s| s.error.is_none()), "{:#?}", r.steps);
    for id in ["one-etcd", "two-etcds"] {
        assert_eq!(calls(&r, id, "PUT"), (40, 40), "{id}");
        assert_eq!(calls(&r, id, "RANGE"), (4, 4), "{id}");
    }
    // The pods stayed on their etcd; the heartbeats went to both in turn.
    assert_eq!(count(&pods.url, "/registry/pods/").await, 200);
    assert_eq!(count(&nodes.url, "/registry/pods/").await, 0);
    assert!(count(&pods.url, "/loadgen/nodes/").await > 0);
    assert!(count(&nodes.url, "/loadgen/nodes/").await > 0);
}
