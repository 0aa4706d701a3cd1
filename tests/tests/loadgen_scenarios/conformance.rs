//! ClusterLoader2's own test configs (`perf-tests/`: kubernetes/perf-tests'
//! `clusterloader2/testing/`, unmodified, at the commit its README names) read by
//! `loadgen run` unchanged:
//!
//! - every config validates (`--validate`), or is refused for the exact reason the
//!   conformance list in `loadgen/SCENARIOS.md` gives;
//! - `density` and `load` run against the simulator at a small scale set only through
//!   CL2's own mechanism (`--testoverrides` files in `cl2-small/`), and write the files
//!   ClusterLoader2 writes, under the names perfdash looks for — TestMetrics' too
//!   (ResourceUsageSummary, and EtcdMetrics where etcd's /metrics is sampled), its other
//!   parts listed as skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tests::{fresh_workspace_binary, SimProcess};

use super::{loadgen_run, read_json};

fn testing_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/loadgen_scenarios/perf-tests/clusterloader2/testing")
}

fn small_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/loadgen_scenarios/cl2-small")
}

/// What `--validate --nodes 100` says of each config (with the overrides files, from
/// the config's directory, that its perf-tests suite passes): `None`, it validates;
/// `Some(text)`, it is refused with a message containing `text`. The same list, with
/// what each config skips, is in loadgen/SCENARIOS.md.
const CONFIGS: &[(&str, &[&str], Option<&str>)] = &[
    ("access-tokens/config.yaml", &[], None),
    (
        "agentic-sandbox/agent-sandbox-continuous-burst.yaml",
        &[],
        Some("object kind `SandboxTemplate` is not supported"),
    ),
    (
        "agentic-sandbox/agent-sandbox-rapid-burst.yaml",
        &[],
        Some("object kind `SandboxTemplate` is not supported"),
    ),
    ("batch/config.yaml", &[], None),
    ("density/config.yaml", &[], None),
    ("density/high-density-config.yaml", &[], None),
    (
        "density/scheduler/custom-scheduler-metrics/config-custom-schd-sample.yaml",
        &[],
        Some("deployment-sample.yaml: No such file or directory"),
    ),
    ("dra-baseline/config.yaml", &[], None),
    ("dra/config.yaml", &[], None),
    (
        "experimental/storage/pod-startup/config.yaml",
        &[
            "volume-types/configmap/override.yaml",
            "max_volumes_per_pod/override.yaml",
        ],
        None,
    ),
    ("huge-service/config.yaml", &[], None),
    ("l4ilb/config-ilb-recovery.yaml", &[], None),
    ("l4ilb/config.yaml", &[], None),
    ("l4lb-class/config.yaml", &[], None),
    ("l4lb/config.yaml", &[], None),
    ("list/config.yaml", &[], None),
    (
        "load/config.yaml",
        &["../overrides/load_throughput.yaml"],
        None,
    ),
    ("neg/config.yaml", &[], None),
    ("network/config.yaml", &[], None),
    ("node-throughput/config.yaml", &[], None),
    ("pod-startup-latency/config.yaml", &[], None),
    ("request-benchmark/config.yaml", &[], None),
    ("scheduler-throughput/config.yaml", &[], None),
    ("watch-list/config.yaml", &[], None),
    ("windows-tests/config.yaml", &[], None),
    ("write-throughput/config.yaml", &[], None),
];

/// The test configs in the fixture: YAML files with a top-level `steps:` outside `modules/`.
fn configs_in(dir: &Path, base: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "modules") {
                configs_in(&p, base, out)?;
            }
        } else if p.extension().is_some_and(|x| x == "yaml") {
            let text = std::fs::read_to_string(&p)?;
            if text.lines().any(|l| l.starts_with("steps:")) {
                out.push(p.strip_prefix(base)?.to_string_lossy().into_owned());
            }
        }
    }
    Ok(())
}

#[test]
fn every_cl2_config_validates_or_is_refused_for_its_listed_reason() -> anyhow::Result<()> {
    let dir = testing_dir();
    let mut found = Vec::new();
    configs_in(&dir, &dir, &mut found)?;
    found.sort();
    let mut listed: Vec<String> = CONFIGS.iter().map(|(p, _, _)| p.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "the list covers every config of the fixture");
    let loadgen = fresh_workspace_binary("loadgen", &["loadgen", "kubeio", "apimodel"]);
    let mut wrong = Vec::new();
    for (path, overrides, expect) in CONFIGS {
        let config = dir.join(path);
        let base = config.parent().unwrap_or(&dir);
        let mut cmd = Command::new(&loadgen);
        cmd.arg("run").arg(&config);
        for o in *overrides {
            cmd.arg("--testoverrides").arg(base.join(o));
        }
        let out = cmd
            .args(["--validate", "--nodes", "100"])
            .env_remove("KUBECONFIG")
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        match expect {
            None if out.status.success() => {
                // The outline names every step; skipped parts are listed, never silent.
                assert!(stdout.contains("step 0"), "{path}: {stdout}");
            }
            Some(why) if out.status.code() == Some(64) && stderr.contains(why) => {}
            _ => wrong.push(format!(
                "{path}: expected {}, got {}: {}",
                expect.map_or("valid".to_string(), |w| format!("refused with `{w}`")),
                out.status,
                stderr.trim()
            )),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}

/// The files a run wrote: name → content.
fn written(out: &Path) -> anyhow::Result<Vec<(String, Value)>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(out)? {
        let p = e?.path();
        if p.is_file() {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.ends_with(".json") {
                v.push((name, read_json(&p)?));
            }
        }
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}

/// `{summary}_{test}_{RFC 3339}.json`, as ClusterLoader2 names it: the file's content.
fn perfdash_file<'a>(files: &'a [(String, Value)], summary: &str, test: &str) -> Option<&'a Value> {
    let prefix = format!("{summary}_{test}_");
    files.iter().find_map(|(n, v)| {
        let time = n.strip_prefix(&prefix)?.strip_suffix(".json")?;
        // 2026-11-27T18:00:00Z: Go's time.RFC3339 of a UTC time.
        let ok = time.len() == 20
            && time.ends_with('Z')
            && time.as_bytes()[10] == b'T'
            && time[..4].chars().all(|c| c.is_ascii_digit());
        ok.then_some(v)
    })
}

/// CL2's PerfData: `{"version", "dataItems": [{"data": {"Perc50", "Perc90", "Perc99"}, "unit", "labels"}]}`.
fn assert_perfdata(what: &str, v: &Value) {
    assert!(v["version"].is_string(), "{what}: {v:#}");
    let items = v["dataItems"].as_array().expect("dataItems");
    for i in items {
        for p in ["Perc50", "Perc90", "Perc99"] {
            assert!(i["data"][p].is_number(), "{what}: {i:#}");
        }
        assert_eq!(i["unit"], "ms", "{what}: {i:#}");
    }
}

/// CL2's ResourceUsageSummary (`gatherers.ResourceUsageSummary`, as perfdash's
/// `parseResourceUsageData` reads it): `{"50"|"90"|"99"|"100": [{"Name", "CPU", "Mem"}]}`,
/// names `{pod}/{container}`. Returns the containers named.
fn assert_resource_usage(v: &Value) -> Vec<String> {
    let m = v.as_object().unwrap_or_else(|| panic!("an object: {v:#}"));
    let mut keys: Vec<&str> = m.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["100", "50", "90", "99"], "{v:#}");
    let mut names = Vec::new();
    for (p, items) in m {
        let items = items.as_array().unwrap_or_else(|| panic!("{p}: {v:#}"));
        assert!(!items.is_empty(), "{p}: a process was sampled: {v:#}");
        for i in items {
            let name = i["Name"].as_str().unwrap_or_else(|| panic!("Name: {i:#}"));
            let (_, container) = name.split_once('/').unwrap_or_else(|| panic!("{name}"));
            assert!(i["CPU"].as_f64().is_some_and(|c| c >= 0.0), "{i:#}");
            assert!(
                i["Mem"].as_u64().is_some_and(|m| m > 0),
                "resident memory: {i:#}"
            );
            names.push(container.to_string());
        }
    }
    // Percentiles rise: p50 <= p100 for each process's memory.
    for (lo, hi) in v["50"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(v["100"].as_array().into_iter().flatten())
    {
        assert!(lo["Mem"].as_u64() <= hi["Mem"].as_u64(), "{lo:#} {hi:#}");
    }
    names.sort();
    names.dedup();
    names
}

/// TestMetrics' parts that cannot be measured from outside are listed as skipped, by name.
fn assert_test_metrics_parts_skipped(summary: &Value) {
    let skipped = summary["skipped"].to_string();
    for part in [
        "SchedulingMetrics",
        "MetricsForE2E",
        "CPUProfile",
        "SystemPodMetrics",
        "ClusterOOMsTracker",
    ] {
        assert!(
            skipped.contains(part),
            "{part} is listed as skipped: {skipped}"
        );
    }
}

/// Runs `config` unchanged with `overrides` against a simulator with kubelets and a
/// scheduler (`--nodes`), and returns the files it wrote and its summary. With an
/// `etcd`, the simulator stores in it and loadgen samples both `/metrics`.
fn run_small(
    config: &str,
    overrides: &str,
    nodes: &str,
    etcd: Option<&str>,
) -> anyhow::Result<(Vec<(String, Value)>, Value)> {
    let mut sim_args = vec!["--kubelet", "--nodes", nodes];
    if let Some(url) = etcd {
        sim_args.extend(["--store", "etcd", "--etcd-endpoints", url]);
    }
    let sim = SimProcess::start(&sim_args)?;
    let out = tempfile::tempdir()?;
    let o = small_dir().join(overrides);
    let metrics: Vec<String> = etcd
        .map(|e| vec![format!("{}/metrics", sim.url), format!("{e}/metrics")])
        .unwrap_or_default();
    let mut args = vec![
        "--testoverrides",
        o.to_str().unwrap_or_default(),
        "--nodes",
        nodes,
    ];
    if !metrics.is_empty() {
        args.push("--server-metrics");
        args.extend(metrics.iter().map(String::as_str));
    }
    let run = loadgen_run(&sim, &testing_dir().join(config), out.path(), &args)?;
    let summary = run.passed_summary(config, out.path())?;
    Ok((written(out.path())?, summary))
}

/// The small-scale overrides act through CL2's own mechanism: density and load, read
/// unchanged with `cl2-small/` and `--nodes 2`, declare one namespace and a handful of
/// pods, and keep every measurement they run (the skipped ones named).
#[test]
fn the_small_overrides_scale_density_and_load_down_through_cl2s_mechanism() -> anyhow::Result<()> {
    use loadgen::scenario::validate::{load_with, LoadOptions, PhaseKind, StepBody};
    // load adds a namespace for its scheduler-throughput pods (one on a small cluster).
    for (config, overrides, namespaces) in [
        ("density/config.yaml", "density.yaml", 1),
        ("load/config.yaml", "load.yaml", 2),
    ] {
        let s = load_with(
            &testing_dir().join(config),
            &LoadOptions {
                overrides: vec![small_dir().join(overrides)],
                nodes: Some(2),
                ..LoadOptions::default()
            },
        )?;
        assert_eq!(
            s.namespaces.len(),
            namespaces,
            "{config}: {:?}",
            s.namespaces
        );
        let mut deployments = 0u64;
        let mut measured = Vec::new();
        for step in &s.steps {
            match &step.body {
                StepBody::Phases(ps) => {
                    for p in ps {
                        if let PhaseKind::Objects(o) = &p.kind {
                            let n =
                                o.bundle.iter().filter(|b| b.kind == "Deployment").count() as u64;
                            deployments = deployments.max(n * u64::from(o.replicas));
                        }
                    }
                }
                StepBody::Measurements(ms) => {
                    measured.extend(ms.iter().map(|m| m.method_as_written.clone()))
                }
            }
        }
        assert!(
            (1..=10).contains(&deployments),
            "{config}: {deployments} deployments in a phase"
        );
        for m in [
            "APIResponsivenessPrometheus",
            "WaitForControlledPodsRunning",
            "PodStartupLatency",
        ] {
            assert!(
                measured.iter().any(|x| x == m),
                "{config}: {m} in {measured:?}"
            );
        }
        // TestMetrics runs (its ResourceUsageSummary and EtcdMetrics); its other parts are
        // listed as skipped, by name.
        assert!(
            measured.iter().any(|x| x == "TestMetrics"),
            "{config}: {measured:?}"
        );
        assert!(
            s.skipped
                .iter()
                .any(|x| x.contains("TestMetrics") && x.contains("SchedulingMetrics")),
            "{config}: {:?}",
            s.skipped
        );
    }
    Ok(())
}

// The two runs below need the simulator to run what the configs create (Deployments
// → ReplicaSets → Pods, StatefulSets, DaemonSets, Jobs: its workload controllers, on with
// `--kubelet`); without them their WaitForControlledPodsRunning gathers would wait out CL2's
// operationTimeout.
#[test]
fn density_runs_unchanged_on_the_simulator_and_writes_cl2s_files() -> anyhow::Result<()> {
    // Stored in a real etcd, whose /metrics loadgen samples with the simulator's.
    let etcd = bench::sim::etcd_server::EtcdServer::start()?;
    let (files, summary) = run_small("density/config.yaml", "density.yaml", "2", Some(&etcd.url))?;
    let skipped = summary["skipped"].to_string();
    for m in ["InClusterNetworkLatency", "DnsLookupLatency"] {
        assert!(skipped.contains(m), "{m} is listed as skipped: {skipped}");
    }
    assert_test_metrics_parts_skipped(&summary);
    // TestMetrics' ResourceUsageSummary: the simulator's process and etcd's, CL2's shape,
    // under the name perfdash's DensityResources reads.
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let usage = perfdash_file(&files, "ResourceUsageSummary", "density")
        .unwrap_or_else(|| panic!("ResourceUsageSummary_density_<time>.json in {names:?}"));
    assert_eq!(
        assert_resource_usage(usage),
        ["etcd", "tollgate-sim"],
        "{usage:#}"
    );
    // TestMetrics' EtcdMetrics, in CL2's shape: etcd's histograms, cumulative, and the
    // database size (the run wrote to etcd, so its WAL was fsynced).
    let etcd_metrics = perfdash_file(&files, "EtcdMetrics", "density")
        .unwrap_or_else(|| panic!("EtcdMetrics_density_<time>.json in {names:?}"));
    for k in [
        "backendCommitDuration",
        "snapshotSaveTotalDuration",
        "peerRoundTripTime",
        "walFsyncDuration",
    ] {
        assert!(etcd_metrics[k].is_array(), "{k}: {etcd_metrics:#}");
    }
    assert!(
        etcd_metrics["maxDatabaseSize"]
            .as_f64()
            .is_some_and(|s| s > 0.0),
        "{etcd_metrics:#}"
    );
    let wal = &etcd_metrics["walFsyncDuration"][0];
    assert_eq!(
        wal["labels"]["__name__"], "etcd_disk_wal_fsync_duration_seconds_bucket",
        "{etcd_metrics:#}"
    );
    assert!(
        wal["buckets"]["+Inf"].as_i64().is_some_and(|n| n > 0),
        "{etcd_metrics:#}"
    );
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    for summary_name in [
        "APIResponsivenessPrometheus",
        "APIResponsivenessPrometheus_simple",
        "PodStartupLatency_PodStartupLatency",
        "StatelessPodStartupLatency_PodStartupLatency",
        "PodStartupLatency_SaturationPodStartupLatency",
    ] {
        let v = perfdash_file(&files, summary_name, "density")
            .unwrap_or_else(|| panic!("{summary_name}_density_<time>.json in {names:?}"));
        assert_perfdata(summary_name, v);
    }
    // The API calls the run made, per verb/resource/scope, with perfdash's labels.
    let api = perfdash_file(&files, "APIResponsivenessPrometheus", "density").expect("api");
    let posts = api["dataItems"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["labels"]["Verb"] == "POST" && i["labels"]["Resource"] == "deployments")
        .unwrap_or_else(|| panic!("POST deployments: {api:#}"));
    assert!(
        posts["labels"]["Count"].as_str().is_some_and(|c| c != "0"),
        "{posts:#}"
    );
    // Pods ran: their startup was timed, every transition measured.
    let startup = perfdash_file(
        &files,
        "PodStartupLatency_SaturationPodStartupLatency",
        "density",
    )
    .expect("saturation startup");
    let metrics: Vec<&str> = startup["dataItems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["labels"]["Metric"].as_str())
        .collect();
    for m in ["create_to_schedule", "schedule_to_run", "pod_startup"] {
        assert!(metrics.contains(&m), "{m} in {metrics:?}");
    }
    let throughput = perfdash_file(&files, "SchedulingThroughput", "density").expect("throughput");
    // CL2's shape; a rate per whole 5 s interval (none in a run shorter than that).
    for k in ["perc50", "perc90", "perc99", "max"] {
        assert!(throughput[k].is_number(), "{throughput:#}");
    }
    Ok(())
}

#[test]
fn load_runs_unchanged_on_the_simulator_and_writes_cl2s_files() -> anyhow::Result<()> {
    let (files, summary) = run_small("load/config.yaml", "load.yaml", "2", None)?;
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    // TestMetrics' ResourceUsageSummary, of the target's own /metrics (no --server-metrics),
    // under the name perfdash's LoadResources reads; no etcd sampled, so no EtcdMetrics file,
    // and that part is said to be skipped.
    let usage = perfdash_file(&files, "ResourceUsageSummary", "load")
        .unwrap_or_else(|| panic!("ResourceUsageSummary_load_<time>.json in {names:?}"));
    assert_eq!(assert_resource_usage(usage), ["tollgate-sim"], "{usage:#}");
    assert!(
        perfdash_file(&files, "EtcdMetrics", "load").is_none(),
        "{names:?}"
    );
    assert_test_metrics_parts_skipped(&summary);
    let skipped = summary["skipped"].to_string();
    assert!(
        skipped.contains("gathered in step") && skipped.contains("EtcdMetrics (no etcd /metrics"),
        "{skipped}"
    );
    for summary_name in [
        "APIResponsivenessPrometheus",
        "APIResponsivenessPrometheus_simple",
        "PodStartupLatency_CreatePhasePodStartupLatency",
    ] {
        let v = perfdash_file(&files, summary_name, "load")
            .unwrap_or_else(|| panic!("{summary_name}_load_<time>.json in {names:?}"));
        assert_perfdata(summary_name, v);
    }
    // Every step ran, modules spliced in (reconcile-objects creates, scales, deletes).
    let steps = summary["steps"].as_array().map_or(0, Vec::len);
    assert!(steps > 10, "{summary:#}");
    assert_eq!(
        summary["cleanup"]["errors"],
        Value::Array(vec![]),
        "{summary:#}"
    );
    Ok(())
}
