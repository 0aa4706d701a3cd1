//! Workloads that run (issue 35): with `--kubelet` the simulator runs the workload
//! controllers too, so a real kubectl's `create deployment`, `scale`, `set image` and
//! `rollout status` work as against a cluster, `create job` completes, and `delete
//! deployment` takes the ReplicaSets and pods with it.

use super::*;

/// How long a rollout may take on a busy machine.
const ROLLOUT_WAIT: &str = "--timeout=90s";

pub(crate) fn kubectl_rolls_out_a_deployment(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let mut args = vec!["--kubelet", "--nodes", "3", "--pods", "0"];
    args.extend_from_slice(scheme.sim_args());
    let sim = SimProcess::start_on(store, &args)?;
    let k = sim.kubectl();
    k.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx:1.19",
        "--replicas=2",
    ])?;
    let out = k.ok(&["rollout", "status", "deployment/web", ROLLOUT_WAIT])?;
    assert!(out.contains("successfully rolled out"), "{out}");
    let ready = k.ok(&[
        "get",
        "deployment",
        "web",
        "-o",
        "jsonpath={.status.readyReplicas}/{.status.availableReplicas}",
    ])?;
    assert_eq!(ready, "2/2");

    k.ok(&["scale", "deployment/web", "--replicas=4"])?;
    let out = k.ok(&["rollout", "status", "deployment/web", ROLLOUT_WAIT])?;
    assert!(out.contains("successfully rolled out"), "{out}");
    let running = k.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "--field-selector=status.phase=Running",
        "-o",
        "name",
    ])?;
    assert_eq!(running.lines().count(), 4, "{running}");

    k.ok(&["set", "image", "deployment/web", "nginx=nginx:1.20"])?;
    let out = k.ok(&["rollout", "status", "deployment/web", ROLLOUT_WAIT])?;
    assert!(out.contains("successfully rolled out"), "{out}");
    let sets = k.json(&["get", "replicasets", "-l", "app=web", "-o", "json"])?;
    let mut replicas: Vec<(String, i64)> = (sets["items"].as_array().into_iter().flatten())
        .map(|rs| {
            (
                rs["spec"]["template"]["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                rs["spec"]["replicas"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    replicas.sort();
    assert_eq!(
        replicas,
        [("nginx:1.19".to_string(), 0), ("nginx:1.20".to_string(), 4)]
    );
    let history = k.ok(&["rollout", "history", "deployment/web"])?;
    assert!(
        history.lines().any(|l| l.trim_start().starts_with('2')),
        "{history}"
    );

    k.ok(&["create", "job", "once", "--image=busybox:1.32"])?;
    k.ok(&["wait", "--for=condition=complete", "job/once", ROLLOUT_WAIT])?;

    k.ok(&["delete", "deployment", "web"])?;
    eventually(
        Duration::from_secs(60),
        "the deployment's pods collected",
        || {
            let left = k.ok(&["get", "replicasets,pods", "-l", "app=web", "-o", "name"])?;
            Ok(left.trim().is_empty().then_some(()))
        },
    )?;
    still_running(sim)
}
