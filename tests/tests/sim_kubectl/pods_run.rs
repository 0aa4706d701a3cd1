//! Pods that run (issue 19): with `--kubelet` (kwok's default Stages run by the simulator)
//! and the scheduler it turns on, `kubectl run` makes a pod that is bound to the seeded node
//! and reaches `Running` with container statuses, `Ready` and an IP; a pod owned by a Job
//! reaches `Succeeded`. The kubelet's and scheduler's requests reach the simulator as any
//! client's do: its `/metrics` counts them.

use super::*;

/// How long a pod may take to reach a phase on a busy machine.
const PHASE_WAIT: Duration = Duration::from_secs(60);

/// A pod owned by a Job, as a Job controller would create it (the Job itself is not stored:
/// the simulator's controllers leave alone what names an owner they never saw).
const JOB_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: job-pod
  labels: {job-name: once}
  ownerReferences:
  - apiVersion: batch/v1
    kind: Job
    name: once
    uid: 0b3c1f9e-5a4d-4a57-9d7e-6f1f3b7c2a10
    controller: true
    blockOwnerDeletion: true
spec:
  restartPolicy: Never
  containers:
  - name: work
    image: busybox
    command: [sh, -c, "true"]
"#;

/// Waits until `pod`'s phase is `phase`.
fn wait_for_phase(k: &Kubectl, pod: &str, phase: &str) -> anyhow::Result<()> {
    eventually(PHASE_WAIT, &format!("pod {pod} {phase}"), || {
        let now = k.ok(&["get", "pod", pod, "-o", "jsonpath={.status.phase}"])?;
        // An error keeps polling, and the last one says where the pod got to.
        anyhow::ensure!(now == phase, "pod {pod} is {now:?}");
        Ok(Some(()))
    })
}

fn condition<'a>(pod: &'a Value, kind: &str) -> &'a str {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
}

/// `apiserver_request_total` for `verb` on pods' `subresource`, summed over codes 2xx.
fn served_ok(metrics: &str, verb: &str, subresource: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            l.contains(&format!("verb=\"{verb}\""))
                && l.contains("resource=\"pods\"")
                && l.contains(&format!("subresource=\"{subresource}\""))
                && l.contains("code=\"2")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

pub(crate) fn kubectl_run_reaches_running(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let mut args = vec!["--kubelet"];
    args.extend_from_slice(scheme.sim_args());
    let sim = SimProcess::start_on(store, &args)?;
    let k = sim.kubectl();
    // --kubelet with no --nodes seeds one Ready node.
    let nodes = k.ok(&["get", "nodes", "-o", "name"])?;
    assert_eq!(nodes.trim(), "node/node-1");

    let out = k.ok(&["run", "x", "--image=nginx"])?;
    assert_eq!(out.trim(), "pod/x created");
    wait_for_phase(&k, "x", "Running")?;

    let pod = k.json(&["get", "pod", "x", "-o", "json"])?;
    assert_eq!(
        str_at(&pod, "/spec/nodeName"),
        "node-1",
        "bound by the scheduler"
    );
    for c in ["PodScheduled", "Initialized", "Ready", "ContainersReady"] {
        assert_eq!(condition(&pod, c), "True", "{c}: {}", abbreviated(&pod));
    }
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .context("containerStatuses")?;
    assert_eq!(statuses.len(), 1, "{}", abbreviated(&pod));
    let c = &statuses[0];
    assert_eq!(c["name"], "x");
    assert_eq!(c["image"], "nginx");
    assert_eq!(c["ready"], true);
    assert!(c["state"]["running"]["startedAt"].is_string(), "{c}");
    for field in ["/status/podIP", "/status/hostIP", "/status/startTime"] {
        assert!(
            !str_at(&pod, field).is_empty(),
            "{field}: {}",
            abbreviated(&pod)
        );
    }
    // kubectl's table says so too.
    let shown = k.ok(&["get", "pod", "x"])?;
    let (header, rows) = table(&shown)?;
    assert_eq!(header[..3], ["NAME", "READY", "STATUS"], "{shown}");
    assert_eq!(rows[0][..3], ["x", "1/1", "Running"], "{shown}");

    // The scheduler's binding and the kubelet's status write were requests to the simulator.
    let metrics = k.ok(&["get", "--raw", "/metrics"])?;
    assert_eq!(served_ok(&metrics, "POST", "binding"), 1, "one binding");
    assert!(
        served_ok(&metrics, "PATCH", "status") >= 1,
        "the kubelet's status PATCH is counted"
    );

    // A delete is finished by the kubelet: the pod goes.
    k.ok(&["delete", "pod", "x", "--wait=false"])?;
    eventually(PHASE_WAIT, "pod x deleted", || {
        let out = k.run(&["get", "pod", "x", "-o", "name"])?;
        Ok((!out.success() && out.stderr.contains("NotFound")).then_some(()))
    })?;
    still_running(sim)
}

pub(crate) fn job_pod_succeeds(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let mut args = vec!["--kubelet", "--nodes", "3"];
    args.extend_from_slice(scheme.sim_args());
    let sim = SimProcess::start_on(store, &args)?;
    let k = sim.kubectl();
    let file = sim.dir().join("job-pod.yaml");
    std::fs::write(&file, JOB_POD)?;
    k.ok(&["create", "-f", &file.display().to_string()])?;
    wait_for_phase(&k, "job-pod", "Succeeded")?;

    let pod = k.json(&["get", "pod", "job-pod", "-o", "json"])?;
    assert!(
        str_at(&pod, "/spec/nodeName").starts_with("node-"),
        "{}",
        abbreviated(&pod)
    );
    let c = &pod["status"]["containerStatuses"][0];
    assert_eq!(c["name"], "work");
    assert_eq!(c["ready"], false);
    assert_eq!(c["state"]["terminated"]["exitCode"], 0, "{c}");
    assert_eq!(c["state"]["terminated"]["reason"], "Completed", "{c}");

    // A pod no Job owns keeps running.
    k.ok(&["run", "server", "--image=nginx"])?;
    wait_for_phase(&k, "server", "Running")?;
    still_running(sim)
}
