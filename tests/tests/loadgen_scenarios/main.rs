//! `loadgen run SCENARIO.yaml` against the simulated kube-apiserver (`tollgate-bench sim`,
//! memory store), end to end:
//!
//! - declarative reconcile, step by step through the library: create → update → scale down →
//!   delete leaves exactly the expected objects after each step, each rendered from its
//!   template for its own replica number;
//! - a failing step stops the run, exits 1, and the run's namespaces are still deleted;
//! - measurements count exactly the steps between their start and gather;
//! - every shipped example scenario runs at reduced scale (its `CI scale` parameters) and
//!   produces SLO verdicts, per-step results and a clean cluster.
//! - a ClusterLoader2-shaped config (`cl2/`: CL2's helpers, an overrides file, object
//!   templates) renders, runs at its tuning sets' rates and writes perfdash-named PerfData;
//!   what loadgen does not implement is skipped by name (a measurement) or refused (a kind);
//! - ClusterLoader2's own configs (`perf-tests/`, a pinned copy of perf-tests'
//!   `clusterloader2/testing/`): every one validates or is refused for its listed reason;
//!   `density` and `load` run unchanged at a small scale (`cl2-small/` overrides);
//! - SIGTERM mid-scenario drains the load phase, cleans up, writes results marked
//!   interrupted and exits 143.
//!
//! Each test starts its own simulator, so the tests run in parallel.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tests::{eventually, fresh_workspace_binary, SimProcess};

/// How long one scenario may run before it is killed.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(90);

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// `loadgen run FILE --server SIM --output OUT ARGS`.
fn loadgen_run(
    sim: &SimProcess,
    file: &Path,
    out: &Path,
    args: &[&str],
) -> anyhow::Result<Finished> {
    let mut all = vec!["--server", sim.url.as_str()];
    all.extend_from_slice(args);
    loadgen_run_with(file, out, &all)
}

/// Runs `loadgen run FILE --output OUT ARGS` to its end (killed after the timeout).
fn loadgen_run_with(file: &Path, out: &Path, args: &[&str]) -> anyhow::Result<Finished> {
    let logs = tempfile::tempdir()?;
    let mut child = Command::new(fresh_workspace_binary(
        "loadgen",
        &["loadgen", "kubeio", "apimodel"],
    ))
    .arg("run")
    .arg(file)
    .arg("--output")
    .arg(out)
    .args(args)
    .env_remove("KUBECONFIG")
    .env("RUST_LOG", "warn")
    .stdin(Stdio::null())
    .stdout(File::create(logs.path().join("stdout"))?)
    .stderr(File::create(logs.path().join("stderr"))?)
    .spawn()
    .context("starting loadgen run")?;
    let deadline = Instant::now() + SCENARIO_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            // Our own child, by its handle.
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "`loadgen run {}` did not finish within {SCENARIO_TIMEOUT:?}",
                file.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |n: &str| std::fs::read_to_string(logs.path().join(n)).unwrap_or_default();
    Ok(Finished {
        status,
        stdout: read("stdout"),
        stderr: read("stderr"),
    })
}

impl Finished {
    /// The run's summary.json (under `out`), after checking that `what` exited 0 and its
    /// verdict is pass.
    fn passed_summary(&self, what: &str, out: &Path) -> anyhow::Result<Value> {
        assert!(
            self.status.success(),
            "{what}: {}\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        let summary = read_json(&out.join("summary.json"))?;
        assert_eq!(summary["verdict"], "pass", "{what}: {summary:#}");
        Ok(summary)
    }
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Names of the namespaces that exist.
fn namespaces(sim: &SimProcess) -> anyhow::Result<Vec<String>> {
    let v = sim.kubectl().json(&["get", "namespaces", "-o", "json"])?;
    Ok(v["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
        .collect())
}

/// Waits until none of `gone` is listed any more.
fn wait_gone(sim: &SimProcess, gone: &[String]) -> anyhow::Result<()> {
    eventually(
        Duration::from_secs(30),
        "the run's namespaces are deleted",
        || {
            let left: Vec<String> = namespaces(sim)?
                .into_iter()
                .filter(|n| gone.contains(n))
                .collect();
            Ok(left.is_empty().then_some(()))
        },
    )
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("writing a test file");
    p
}

const CONFIGMAP: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: {{.Name}}
  labels: {version: v1}
data:
  replica: \"{{N}}\"
  shard: \"{{N%3}}\"
  weight: \"{{RAND%3+5}}\"
  namespace: \"{{.Namespace}}\"
  self: \"{{.Name}}\"
  app: \"{{.App}}\"
";

fn phase(replicas: u32, template: &str) -> String {
    format!(
        "- name: r{replicas}-{template}
  phases:
  - namespaceRange: {{min: 1, max: 2}}
    replicasPerNamespace: {replicas}
    tuningSet: fast
    objectBundle:
    - {{basename: cfg, objectTemplatePath: {template}}}
"
    )
}

/// ConfigMaps loadgen manages in `ns`: name → (version label, data).
fn configmaps(sim: &SimProcess, ns: &str) -> anyhow::Result<BTreeMap<String, (String, Value)>> {
    let v = sim.kubectl().json(&[
        "get",
        "configmaps",
        "-n",
        ns,
        "-l",
        "app.kubernetes.io/managed-by=loadgen",
        "-o",
        "json",
    ])?;
    Ok(v["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|i| {
            (
                i["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                (
                    i["metadata"]["labels"]["version"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    i["data"].clone(),
                ),
            )
        })
        .collect())
}

#[test]
fn reconcile_creates_updates_scales_down_and_deletes_exactly() -> anyhow::Result<()> {
    use loadgen::scenario::measure::ApiCalls;
    use loadgen::scenario::reconcile::{reconcile, Live, ReconcileCtx};
    use loadgen::scenario::validate::{PhaseKind, StepBody};

    let sim = SimProcess::start(&[])?;
    let dir = tempfile::tempdir()?;
    write(dir.path(), "cm.yaml", CONFIGMAP);
    write(
        dir.path(),
        "cm-v2.yaml",
        &CONFIGMAP.replace("version: v1", "version: v2"),
    );
    let file = write(
        dir.path(),
        "reconcile.yaml",
        &format!(
            "name: reconcile\nparams: {{App: rec}}\nnamespaces: 2\ntuningSets:\n- {{name: fast, qpsLoad: {{qps: 500}}}}\nsteps:\n{}{}{}{}",
            phase(4, "cm.yaml"),
            phase(4, "cm-v2.yaml"),
            phase(2, "cm-v2.yaml"),
            phase(0, "cm-v2.yaml")
        ),
    );
    let scenario = loadgen::scenario::load(&file, &[])?;
    assert_eq!(
        scenario.namespaces,
        ["loadgen-reconcile-1", "loadgen-reconcile-2"]
    );
    let rt = tokio::runtime::Runtime::new()?;
    let target = loadgen::target::TargetOptions {
        server: Some(sim.url.clone()),
        ..Default::default()
    };
    let (_, client) = rt.block_on(loadgen::scenario::connect(&target))?;
    for ns in &scenario.namespaces {
        rt.block_on(loadgen::scenario::namespaces::create(
            &client,
            ns,
            "reconcile",
        ))
        .map_err(anyhow::Error::msg)?;
    }
    let live = Live::with_managed(&scenario.namespaces);
    let calls = ApiCalls::default();
    let send = loadgen::send::SendOptions::default();
    let ctx = ReconcileCtx {
        client: &client,
        send: &send,
        scenario: "reconcile",
        params: &scenario.params,
        seed: 7,
        calls: &calls,
    };
    // (replicas, version, created, updated, deleted) expected after each step.
    let expected = [
        (4, "v1", 8, 0, 0),
        (4, "v2", 0, 8, 0),
        (2, "v2", 0, 0, 4),
        (0, "v2", 0, 0, 4),
    ];
    let mut weights = Vec::new();
    for (step, (replicas, version, created, updated, deleted)) in
        scenario.steps.iter().zip(expected)
    {
        let StepBody::Phases(phases) = &step.body else {
            anyhow::bail!("{}: not phases", step.name)
        };
        let PhaseKind::Objects(objects) = &phases[0].kind else {
            anyhow::bail!("{}: not objects", step.name)
        };
        let tally = rt.block_on(reconcile(objects, &live, &ctx));
        assert_eq!(
            (tally.created, tally.updated, tally.deleted, tally.failed),
            (created, updated, deleted, 0),
            "{}: {tally:?}",
            step.name
        );
        for ns in &scenario.namespaces {
            let got = configmaps(&sim, ns)?;
            let names: Vec<String> = (0..replicas).map(|i| format!("cfg-{i}")).collect();
            assert_eq!(
                got.keys().cloned().collect::<Vec<_>>(),
                names,
                "{} in {ns}",
                step.name
            );
            for (name, (v, data)) in &got {
                let n: u64 = name.trim_start_matches("cfg-").parse()?;
                assert_eq!(v, version, "{name} after {}", step.name);
                assert_eq!(data["replica"], n.to_string(), "{name}");
                assert_eq!(data["shard"], (n % 3).to_string(), "{name}");
                assert_eq!(data["namespace"].as_str(), Some(ns.as_str()));
                assert_eq!(data["self"].as_str(), Some(name.as_str()));
                assert_eq!(data["app"], "rec");
                let w: u64 = data["weight"].as_str().unwrap_or_default().parse()?;
                assert!((5..=7).contains(&w), "{name}: weight {w}");
                weights.push(w);
            }
        }
    }
    weights.sort_unstable();
    weights.dedup();
    assert!(
        weights.len() > 1,
        "RAND is drawn per object, yet every weight was {weights:?}"
    );
    Ok(())
}

#[test]
fn a_failing_step_stops_the_run_and_namespaces_are_still_deleted() -> anyhow::Result<()> {
    let sim = SimProcess::start(&[])?;
    let dir = tempfile::tempdir()?;
    write(dir.path(), "cm.yaml", CONFIGMAP);
    // A custom resource no CRD defines: every create answers 404.
    write(
        dir.path(),
        "secret.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: '{{.Name}}'}\n",
    );
    let file = write(
        dir.path(),
        "fails.yaml",
        "name: fails\nparams: {App: f}\nnamespaces: 2\nsteps:
- phases:
  - namespaceRange: {min: 1, max: 2}
    replicasPerNamespace: 2
    objectBundle: [{basename: cfg, objectTemplatePath: cm.yaml}]
- name: bad
  phases:
  - namespaceRange: {min: 1, max: 2}
    replicasPerNamespace: 1
    objectBundle: [{basename: s, objectTemplatePath: secret.yaml}]
- name: never
  phases:
  - namespaceRange: {min: 1, max: 2}
    replicasPerNamespace: 5
    objectBundle: [{basename: cfg, objectTemplatePath: cm.yaml}]
",
    );
    let out = dir.path().join("out");
    let done = loadgen_run(&sim, &file, &out, &[])?;
    assert_eq!(
        done.status.code(),
        Some(1),
        "stdout: {}\nstderr: {}",
        done.stdout,
        done.stderr
    );
    let summary = read_json(&out.join("summary.json"))?;
    let error = summary["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("step 1 (bad)") && error.contains("404"),
        "{error}"
    );
    assert_eq!(summary["verdict"], "fail");
    assert_eq!(
        summary["steps"].as_array().map(Vec::len),
        Some(2),
        "the third step must not run"
    );
    let ns = ["loadgen-fails-1".to_string(), "loadgen-fails-2".to_string()];
    assert_eq!(
        summary["cleanup"]["namespaces_deleted"],
        serde_json::json!(ns)
    );
    wait_gone(&sim, &ns)
}

#[test]
fn measurements_count_the_steps_between_start_and_gather() -> anyhow::Result<()> {
    let sim = SimProcess::start(&[])?;
    let dir = tempfile::tempdir()?;
    write(dir.path(), "cm.yaml", CONFIGMAP);
    write(
        dir.path(),
        "cm-v2.yaml",
        &CONFIGMAP.replace("version: v1", "version: v2"),
    );
    let objects = |name: &str, replicas: u32, template: &str| {
        format!("- name: {name}\n  phases:\n  - namespaceRange: {{min: 1, max: 1}}\n    replicasPerNamespace: {replicas}\n    objectBundle: [{{basename: cfg, objectTemplatePath: {template}}}]\n")
    };
    let m = |name: &str, id: &str, action: &str| {
        format!("- name: {name}\n  measurements: [{{method: APIResponsiveness, identifier: {id}, action: {action}}}]\n")
    };
    let text = format!(
        "name: bracket\nparams: {{App: b}}\nnamespaces: 1\nsteps:\n{}{}{}{}{}{}{}",
        m("start-all", "all", "start"),
        objects("create", 3, "cm.yaml"),
        m("start-mid", "mid", "start"),
        objects("update", 3, "cm-v2.yaml"),
        m("gather-mid", "mid", "gather"),
        objects("delete", 0, "cm-v2.yaml"),
        m("gather-all", "all", "gather"),
    );
    let file = write(dir.path(), "bracket.yaml", &text);
    let out = dir.path().join("out");
    let done = loadgen_run(&sim, &file, &out, &[])?;
    assert!(
        done.status.success(),
        "stdout: {}\nstderr: {}",
        done.stdout,
        done.stderr
    );
    let summary = read_json(&out.join("summary.json"))?;
    let calls = |id: &str| -> BTreeMap<String, u64> {
        summary["measurements"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["identifier"] == id)
            .flat_map(|m| m["calls"].as_array().cloned().unwrap_or_default())
            .map(|c| {
                (
                    c["verb"].as_str().unwrap_or_default().to_string(),
                    c["requests"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    assert_eq!(calls("mid"), BTreeMap::from([("PUT".to_string(), 3)]));
    assert_eq!(
        calls("all"),
        BTreeMap::from([
            ("DELETE".to_string(), 3),
            ("POST".to_string(), 3),
            ("PUT".to_string(), 3)
        ])
    );
    let mid = summary["measurements"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["identifier"] == "mid")
        .context("mid measurement")?;
    assert_eq!(
        (
            mid["started_in_step"].as_u64(),
            mid["gathered_in_step"].as_u64()
        ),
        (Some(2), Some(4))
    );
    assert_eq!(summary["verdict"], "pass");
    // The step dirs: the update step's own summary, the gather step's perfdata.
    let update = read_json(&out.join("step-03-update/summary.json"))?;
    assert_eq!(update["phases"][0]["objects"]["updated"], 3);
    let perf = read_json(&out.join("step-04-gather-mid/perfdata.json"))?;
    assert_eq!(perf["dataItems"][0]["labels"]["Verb"], "PUT");
    Ok(())
}

mod cl2;
mod conformance;
mod etcd;
mod examples;
mod signals;
