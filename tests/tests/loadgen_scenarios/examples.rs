//! The shipped example scenarios at reduced scale: against the simulated apiserver, and the
//! etcd ones against real etcd (no API server).

use std::path::Path;

use anyhow::Context;
use serde_json::Value;
use tests::SimProcess;

use super::{loadgen_run, loadgen_run_with, wait_gone};

// ---------------------------------------------------------------------------------------------
// The shipped examples at reduced scale

fn example(name: &str, params: &[&str]) -> anyhow::Result<()> {
    let sim = SimProcess::start(&[])?;
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../loadgen/scenarios")
        .join(name);
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("out");
    let metrics = format!("{}/metrics", sim.url);
    let mut args = vec!["--server-metrics", metrics.as_str()];
    for p in params {
        args.extend(["--param", p]);
    }
    let done = loadgen_run(&sim, &file, &out, &args)?;
    let summary = done.passed_summary(name, &out)?;
    assert!(done.stdout.contains("verdict: pass"), "{}", done.stdout);
    let slos = summary["slos"].as_array().cloned().unwrap_or_default();
    assert!(
        !slos.is_empty() && slos.iter().all(|s| s["met"] == true),
        "{slos:#?}"
    );
    let scenario = loadgen::scenario::load(&file, &[])?;
    let steps = summary["steps"].as_array().cloned().unwrap_or_default();
    assert_eq!(steps.len(), scenario.steps.len());
    for s in &steps {
        let d = out.join(s["dir"].as_str().unwrap_or_default());
        assert!(
            d.join("summary.json").is_file() && d.join("perfdata.json").is_file(),
            "{}",
            d.display()
        );
    }
    let managed: Vec<String> = summary["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    assert_eq!(
        summary["cleanup"]["namespaces_deleted"],
        serde_json::json!(managed)
    );
    wait_gone(&sim, &managed)
}

#[test]
fn example_pod_burst() -> anyhow::Result<()> {
    example("pod-burst.yaml", &["Pods=40"])
}

#[test]
fn example_watchers_updates() -> anyhow::Result<()> {
    example(
        "watchers-updates.yaml",
        &["Pods=20", "Watchers=5", "UpdateRate=10", "Duration=3s"],
    )
}

#[test]
fn example_list_updates() -> anyhow::Result<()> {
    example(
        "list-updates.yaml",
        &["Pods=30", "ListRate=60/min", "UpdateRate=10", "Duration=3s"],
    )
}

#[test]
fn example_node_heartbeats() -> anyhow::Result<()> {
    example(
        "node-heartbeats.yaml",
        &["Nodes=20", "Heartbeat=1s", "Duration=3s"],
    )
}

#[test]
fn example_churn() -> anyhow::Result<()> {
    example(
        "churn.yaml",
        &["Replicas=6", "Half=3", "Namespaces=2", "Qps=50"],
    )
}

#[test]
fn example_tess_list_steps() -> anyhow::Result<()> {
    example(
        "tess-list-steps.yaml",
        &["Nodes=20", "Heartbeat=1s", "Pods=30", "StepDuration=2s"],
    )
}

// ---------------------------------------------------------------------------------------------
// The etcd examples, against real etcd (no API server: etcd phases only)

/// Runs an etcd example at reduced scale and returns its summary.json (verdict checked).
fn etcd_example(name: &str, args: &[&str]) -> anyhow::Result<Value> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../loadgen/scenarios")
        .join(name);
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("out");
    let done = loadgen_run_with(&file, &out, args)?;
    done.passed_summary(name, &out)
}

/// The etcd PUT calls one measurement saw: (requests, p99 ms).
fn puts(summary: &Value, id: &str) -> Option<(u64, f64)> {
    summary["measurements"]
        .as_array()?
        .iter()
        .find(|m| m["identifier"] == id)?["calls"]
        .as_array()?
        .iter()
        .find(|c| c["verb"] == "PUT")
        .map(|c| {
            (
                c["requests"].as_u64().unwrap_or(0),
                c["latency_ms"]["p99"].as_f64().unwrap_or(0.0),
            )
        })
}

#[test]
fn example_etcd_large_range_vs_puts() -> anyhow::Result<()> {
    let etcd = bench::sim::etcd_server::EtcdServer::start()?;
    let summary = etcd_example(
        "etcd-large-range-vs-puts.yaml",
        &[
            "--etcd-endpoints",
            &etcd.url,
            "--param",
            "Pods=200",
            "--param",
            "StepDuration=2s",
            "--param",
            "PutRate=20/s",
        ],
    )?;
    for id in ["puts-alone", "ranges-1", "ranges-4"] {
        let (n, _) = puts(&summary, id).with_context(|| format!("{id}: no PUT calls"))?;
        // 20/s for 2 s, give or take the last tick.
        assert!((38..=41).contains(&n), "{id}: {n} puts");
    }
    let ranges = summary["measurements"][1]["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["verb"] == "RANGE")
        .context("ranges-1: no RANGE calls")?;
    assert_eq!(ranges["requests"], 2, "1/s for 2 s");
    Ok(())
}

#[test]
fn example_etcd_separate_pods() -> anyhow::Result<()> {
    let pods = bench::sim::etcd_server::EtcdServer::start()?;
    let nodes = bench::sim::etcd_server::EtcdServer::start()?;
    let pods_param = format!("PodsEtcd={}", pods.url);
    let nodes_param = format!("NodesEtcd={}", nodes.url);
    let summary = etcd_example(
        "etcd-separate-pods.yaml",
        &[
            "--param",
            &pods_param,
            "--param",
            &nodes_param,
            "--param",
            "Pods=200",
            "--param",
            "StepDuration=2s",
            "--param",
            "PutRate=20/s",
        ],
    )?;
    for id in ["one-etcd", "two-etcds"] {
        let (n, _) = puts(&summary, id).with_context(|| format!("{id}: no PUT calls"))?;
        assert!((38..=41).contains(&n), "{id}: {n} puts");
    }
    Ok(())
}
