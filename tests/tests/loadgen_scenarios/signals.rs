//! SIGTERM in the middle of a scenario: the load phase stops and drains, the objects phase
//! starts no more units and finishes those under way, the namespaces are deleted, the
//! results are written marked interrupted, and loadgen exits 143.

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tests::{eventually, fresh_workspace_binary, SimProcess};

use super::{read_json, wait_gone, write};

/// Cluster-wide pod LISTs the simulator has served.
fn lists_served(sim: &SimProcess) -> anyhow::Result<u64> {
    let text = sim.kubectl().ok(&["get", "--raw", "/metrics"])?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains("verb=\"LIST\"")
                && l.contains("resource=\"pods\"")
                && l.contains("scope=\"cluster\"")
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum::<f64>() as u64)
}

#[test]
fn sigterm_stops_a_scenario_and_writes_its_results() -> anyhow::Result<()> {
    let sim = SimProcess::start(&["--nodes", "2", "--pods", "20", "--namespaces", "1"])?;
    let dir = tempfile::tempdir()?;
    write(
        dir.path(),
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: '{{.Name}}'}\ndata: {n: '{{N}}'}\n",
    );
    // A load phase and an objects phase side by side, both far from done at the signal.
    let file = write(
        dir.path(),
        "sigterm.yaml",
        "name: sigterm\nnamespaces: 1\ntuningSets:\n- {name: slow, qpsLoad: {qps: 5}}\n\
         steps:\n- name: lists\n  phases:\n  - name: lists\n    \
         loadgen: --lists 20/s --all-namespaces\n    duration: 10m\n  \
         - name: configmaps\n    namespaceRange: {min: 1, max: 1}\n    \
         replicasPerNamespace: 1000\n    tuningSet: slow\n    \
         objectBundle: [{basename: cm, objectTemplatePath: cm.yaml}]\n",
    );
    let out = dir.path().join("out");
    let logs = tempfile::tempdir()?;
    let mut child = Command::new(fresh_workspace_binary(
        "loadgen",
        &["loadgen", "kubeio", "apimodel"],
    ))
    .arg("run")
    .arg(&file)
    .args(["--server", &sim.url, "--drain-timeout", "5s", "--output"])
    .arg(&out)
    .env_remove("KUBECONFIG")
    .env_remove("KUBERNETES_SERVICE_HOST")
    .env("RUST_LOG", "warn")
    .stdin(Stdio::null())
    .stdout(File::create(logs.path().join("stdout"))?)
    .stderr(File::create(logs.path().join("stderr"))?)
    .spawn()?;
    let base = lists_served(&sim)?;
    let flowing = eventually(Duration::from_secs(60), "20 LISTs served", || {
        Ok((lists_served(&sim)? >= base + 20).then_some(()))
    });
    // Our own child, by its pid.
    let signalled = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    let deadline = signalled + Duration::from_secs(40);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    flowing?;
    anyhow::ensure!(kill.success(), "kill -TERM: {kill}");
    let stderr = std::fs::read_to_string(logs.path().join("stderr")).unwrap_or_default();
    let took = signalled.elapsed();
    anyhow::ensure!(
        status.is_some() && took < Duration::from_secs(5 + 20),
        "loadgen run took {took:?} after SIGTERM (drain 5s); stderr: {stderr}"
    );
    anyhow::ensure!(
        status.and_then(|s| s.code()) == Some(143),
        "exit status {status:?} (want 143); stderr: {stderr}"
    );
    let top = read_json(&out.join("summary.json"))?;
    anyhow::ensure!(top["interrupted"] == true, "{top:#}");
    let perf = read_json(&out.join("perfdata.json"))?;
    anyhow::ensure!(perf["interrupted"] == true, "{perf:#}");
    let phase = read_json(&out.join("step-00-lists/phase-00-lists/summary.json"))?;
    anyhow::ensure!(phase["interrupted"] == true, "{phase:#}");
    let list = phase["operations"]
        .as_array()
        .and_then(|ops| ops.iter().find(|o| o["name"] == "list"))
        .cloned()
        .unwrap_or_default();
    anyhow::ensure!(
        list["requests"].as_u64().unwrap_or(0) >= 20
            && list["errors"] == 0
            && list["cancelled"] == 0,
        "the phase's LISTs, drained: {list:#}"
    );
    // The objects phase started no unit after the signal and finished those under way.
    let step = read_json(&out.join("step-00-lists/summary.json"))?;
    let cms = step["phases"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "configmaps"))
        .cloned()
        .unwrap_or_default();
    let created = cms["objects"]["created"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        (1..1000).contains(&created)
            && cms["objects"]["failed"] == 0
            && cms["error"] == "interrupted",
        "the objects phase after SIGTERM: {cms:#}"
    );
    wait_gone(&sim, &["loadgen-sigterm-1".to_string()])
}
