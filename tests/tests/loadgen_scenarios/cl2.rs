//! A ClusterLoader2-shaped config (`cl2/config.yaml`: CL2's helpers and spellings, an
//! overrides file, object templates of their own) read, rendered and run against the
//! simulator; what loadgen does not implement is refused by name before anything runs.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::Value;
use tests::SimProcess;

use loadgen::scenario::measure::ApiCalls;
use loadgen::scenario::reconcile::{render as render_object, ReconcileCtx};
use loadgen::scenario::validate::{load_with, LoadOptions, PhaseKind, StepBody};

use super::{loadgen_run, read_json, wait_gone};

fn cl2_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/loadgen_scenarios/cl2")
}

/// The objects phase of step `step`.
fn objects(
    s: &loadgen::scenario::Scenario,
    step: usize,
) -> anyhow::Result<&loadgen::scenario::validate::ObjectPhase> {
    match &s.steps.get(step).context("step")?.body {
        StepBody::Phases(p) => match &p.first().context("phase")?.kind {
            PhaseKind::Objects(o) => Ok(o),
            _ => anyhow::bail!("step {step} is not an objects phase"),
        },
        StepBody::Measurements(_) => anyhow::bail!("step {step} has no phases"),
    }
}

/// Renders bundle entry 0 of step `step` for replica `n` in `ns`, as the run does.
fn render(s: &loadgen::scenario::Scenario, step: usize, ns: &str, n: u64) -> anyhow::Result<Value> {
    let set = &objects(s, step)?.bundle[0];
    // Never contacted: rendering needs a client only to be a ReconcileCtx.
    let target = loadgen::target::TargetOptions {
        server: Some("http://127.0.0.1:1".into()),
        ..Default::default()
    }
    .resolve()?;
    let client = loadgen::target::ApiClient::new(&target);
    let calls = ApiCalls::default();
    let send = loadgen::send::SendOptions::default();
    let ctx = ReconcileCtx {
        client: &client,
        send: &send,
        scenario: &s.name,
        params: &s.params,
        seed: 1,
        calls: &calls,
    };
    render_object(set, ns, n, &ctx).map_err(anyhow::Error::msg)
}

/// The overrides feed the config's template; CL2's helpers compute the counts and rates;
/// object templates see `.Name`, `.Index`, `.Namespace` and their `templateFillMap`.
#[test]
fn a_cl2_config_renders_with_its_overrides() -> anyhow::Result<()> {
    let dir = cl2_dir();
    let opts = LoadOptions {
        overrides: vec![dir.join("overrides.yaml")],
        ..LoadOptions::default()
    };
    let s = load_with(&dir.join("config.yaml"), &opts)?;
    assert_eq!(s.name, "cl2-density");
    assert_eq!(s.namespaces, ["cl2-density-1", "cl2-density-2"]);
    let pods = objects(&s, 2)?;
    assert_eq!(pods.replicas, 20, "PODS_PER_NAMESPACE from overrides.yaml");
    let configmaps = objects(&s, 1)?;
    assert_eq!(
        configmaps.replicas, 2,
        "Nodes (default 1) × DivideInt 20 10"
    );
    let pod = render(&s, 2, "cl2-density-2", 7)?;
    assert_eq!(pod["metadata"]["name"], "density-pod-0-7");
    let labels = &pod["metadata"]["labels"];
    assert_eq!(labels["replica"], "7");
    assert_eq!(labels["shard"], "1", "Mod 7 3");
    assert_eq!(labels["tier"], "load-test", "IncludeEmbedFile labels.yaml");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.k8s.io/pause:3.9");
    assert_eq!(container["resources"]["requests"]["cpu"], "5m");
    let cm = render(&s, 1, "cl2-density-1", 3)?;
    assert_eq!(cm["data"]["totalPods"], "40", "MultiplyInt 2 20");
    assert_eq!(cm["data"]["podsPerConfigMap"], "4", "DivideFloat 40 10");
    assert_eq!(cm["data"]["index"], "3");
    // Without the overrides, the config's own defaults hold.
    let plain = load_with(&dir.join("config.yaml"), &LoadOptions::default())?;
    assert_eq!(objects(&plain, 2)?.replicas, 5);
    // .Nodes: the cluster's count, unless --param (or an override) gives it.
    let sized = LoadOptions {
        nodes: Some(4),
        ..opts.clone()
    };
    assert_eq!(
        objects(&load_with(&dir.join("config.yaml"), &sized)?, 1)?.replicas,
        8
    );
    let given = LoadOptions {
        params: vec![("Nodes".into(), "3".into())],
        ..sized
    };
    assert_eq!(
        objects(&load_with(&dir.join("config.yaml"), &given)?, 1)?.replicas,
        6
    );
    Ok(())
}

/// The config runs against the simulator: `.Nodes` counted on it, every object created at
/// its tuning set's rate, the measurement's PerfData written under the name perfdash looks for.
#[test]
fn a_cl2_config_runs_against_the_simulator() -> anyhow::Result<()> {
    let sim = SimProcess::start(&["--nodes", "3"])?;
    let dir = cl2_dir();
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("out");
    let overrides = dir.join("overrides.yaml").display().to_string();
    let done = loadgen_run(
        &sim,
        &dir.join("config.yaml"),
        &out,
        &["--testoverrides", &overrides],
    )?;
    done.passed_summary("the CL2 config", &out)?;
    // (step dir, objects, qps): the last of N units starts at (N - 1) / qps. ConfigMaps:
    // 2 namespaces × 3 nodes × DivideInt 20 10.
    for (step, count, qps) in [
        ("step-01-Creating-configmaps", 12u64, 10.0),
        ("step-02-Creating-pods", 40, 20.0),
    ] {
        let s = read_json(&out.join(step).join("summary.json"))?;
        let phase = &s["phases"][0];
        let o = &phase["objects"];
        assert_eq!(o["created"], count, "{step}: {phase:#}");
        assert_eq!(o["failed"], 0, "{step}: {phase:#}");
        let took = phase["duration_s"].as_f64().unwrap_or(-1.0);
        let spread = (count - 1) as f64 / qps;
        assert!(
            took >= spread && took < spread + 1.5,
            "{step}: {count} objects at {qps}/s took {took} s (schedule: {spread} s)"
        );
        assert!(out.join(step).join("perfdata.json").is_file());
    }
    assert!(out.join("perfdata.json").is_file());
    // CL2: {summary name}_{test name}_{RFC 3339}.json beside perfdata.json; the
    // measurement's summary name is CL2's for the method (no summaryName given).
    let prefix = "APIResponsivenessPrometheus_cl2-density_";
    let named: Vec<String> = std::fs::read_dir(&out)?
        .filter_map(|e| e.ok().and_then(|e| e.file_name().into_string().ok()))
        .filter(|n| n.starts_with(prefix))
        .collect();
    assert_eq!(named.len(), 1, "{named:?}");
    let stamp = named[0]
        .strip_prefix(prefix)
        .and_then(|n| n.strip_suffix(".json"))
        .unwrap_or_default();
    assert!(
        stamp.len() == 20 && stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T',
        "not an RFC 3339 time: {stamp}"
    );
    let perf = read_json(&out.join(&named[0]))?;
    assert_eq!(perf["version"], "v1");
    let items = perf["dataItems"].as_array().cloned().unwrap_or_default();
    assert!(
        items.iter().any(|i| i["labels"]["Resource"] == "pods"
            && i["labels"]["Verb"] == "POST"
            && i["data"]["Perc99"].is_number()),
        "{perf:#}"
    );
    wait_gone(&sim, &["cl2-density-1".into(), "cl2-density-2".into()])
}

/// Copies the config's directory with `edit` applied to `file`.
fn variant(file: &str, edit: impl Fn(&str) -> String) -> anyhow::Result<tempfile::TempDir> {
    let tmp = tempfile::tempdir()?;
    for e in std::fs::read_dir(cl2_dir())? {
        let e = e?;
        let text = std::fs::read_to_string(e.path())?;
        let name = e.file_name();
        let text = if name == file { edit(&text) } else { text };
        std::fs::write(tmp.path().join(name), text)?;
    }
    Ok(tmp)
}

/// `loadgen run --validate` of a variant: exit 64 and its stderr.
fn refused(dir: &Path) -> anyhow::Result<String> {
    let sim_less = tempfile::tempdir()?;
    let out = sim_less.path().join("out");
    let config = dir.join("config.yaml");
    let overrides = dir.join("overrides.yaml").display().to_string();
    let done = super::loadgen_run_with(
        &config,
        &out,
        &["--testoverrides", &overrides, "--validate"],
    )?;
    anyhow::ensure!(
        done.status.code() == Some(64),
        "want exit 64, got {}: {}",
        done.status,
        done.stderr
    );
    Ok(done.stderr)
}

/// A measurement loadgen does not implement is accepted with its params and skipped
/// by name; unknown params of one it implements are not an error; CL2's other tuning
/// sets and module steps are read; an object kind loadgen cannot address is refused
/// with the file, the place and what is supported.
#[test]
fn what_loadgen_does_not_implement_is_skipped_by_name_or_refused() -> anyhow::Result<()> {
    let m = variant("config.yaml", |t| {
        t.replacen(
            "    Method: APIResponsivenessPrometheus\n    Params:\n      action: start\n",
            "    Method: APIResponsivenessPrometheus\n    Params:\n      action: start\n      someFutureParam: 3\n  - Identifier: Probes\n    Method: InClusterNetworkLatency\n    Params:\n      action: start\n      checkProbesReadyTimeout: 15m\n",
            1,
        )
    })?;
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("out");
    let overrides = m.path().join("overrides.yaml").display().to_string();
    let done = super::loadgen_run_with(
        &m.path().join("config.yaml"),
        &out,
        &["--testoverrides", &overrides, "--validate"],
    )?;
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stdout.contains(
            "skipped: measurement InClusterNetworkLatency `Probes` at steps[0].measurements[1]"
        ) && done.stdout.contains("skip InClusterNetworkLatency/Probes")
            && done.stdout.contains("params not read: someFutureParam"),
        "{}",
        done.stdout
    );
    let k = variant("pod.yaml", |t| {
        t.replace("kind: Pod", "kind: VolumeSnapshot")
    })?;
    let err = refused(k.path())?;
    assert!(
        err.contains("steps[2].phases[0].objectBundle[0].objectTemplatePath")
            && err.contains("object kind `VolumeSnapshot` is not supported")
            && err.contains("ConfigMap")
            && err.contains("Deployment"),
        "{err}"
    );
    let t = variant("config.yaml", |t| {
        t.replace(
            "  qpsLoad:\n    qps: {{$POD_QPS}}",
            "  parallelismLimitedLoad:\n    parallelismLimit: 5",
        )
    })?;
    let config = t.path().join("config.yaml");
    let s = load_with(
        &config,
        &LoadOptions {
            overrides: vec![t.path().join("overrides.yaml")],
            ..LoadOptions::default()
        },
    )?;
    assert_eq!(
        objects(&s, 2)?.tuning.as_ref().map(|t| t.shape.clone()),
        Some(loadgen::scenario::tuning::LoadShape::ParallelismLimited { limit: 5 })
    );
    let module = variant("config.yaml", |t| {
        t.replace(
            "- name: Collecting measurements\n",
            "- module:\n    path: /modules/x.yaml\n- name: Collecting measurements\n",
        )
    })?;
    let err = refused(module.path())?;
    assert!(
        err.contains("steps[3].module.path") && err.contains("modules/x.yaml"),
        "{err}"
    );
    Ok(())
}
