//! Writes: label, merge patch, graceful delete.

use super::*;

pub(crate) fn label_pod(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();
    let names = pod_names(&k, "ns-2")?;
    let pod = names[0].as_str();
    let label_of = |pod: &str| {
        k.ok(&[
            "get",
            "pod",
            pod,
            "-n",
            "ns-2",
            "-o",
            "jsonpath={.metadata.labels.e2e}",
        ])
    };
    assert_eq!(label_of(pod)?, "", "not labelled yet");

    let out = k.ok(&["label", "pod", pod, "-n", "ns-2", "e2e=labelled"])?;
    assert_eq!(out.trim(), format!("pod/{pod} labeled"));
    let shown = k.ok(&["get", "pod", pod, "-n", "ns-2", "--show-labels"])?;
    let (header, rows) = table(&shown)?;
    assert_eq!(header.last(), Some(&"LABELS"));
    assert_eq!(rows.len(), 1, "{shown}");
    let labels = rows[0].last().copied().unwrap_or("");
    assert!(
        labels.split(',').any(|l| l == "e2e=labelled"),
        "LABELS {labels:?}"
    );
    assert_eq!(label_of(pod)?, "labelled");
    // The label selector finds exactly that pod, in every namespace.
    let selected = k.ok(&["get", "pods", "-A", "-l", "e2e=labelled", "-o", "name"])?;
    assert_eq!(selected.trim(), format!("pod/{pod}"));
    // A neighbour is untouched.
    assert_eq!(label_of(&names[1])?, "");

    // Without --overwrite kubectl refuses; with it the value changes.
    let refused = k.fails(&["label", "pod", pod, "-n", "ns-2", "e2e=again"])?;
    assert!(refused.contains("already has a value"), "{refused}");
    k.ok(&[
        "label",
        "pod",
        pod,
        "-n",
        "ns-2",
        "e2e=again",
        "--overwrite",
    ])?;
    assert_eq!(label_of(pod)?, "again");

    // `e2e-` removes it.
    let out = k.ok(&["label", "pod", pod, "-n", "ns-2", "e2e-"])?;
    assert_eq!(out.trim(), format!("pod/{pod} unlabeled"));
    assert_eq!(label_of(pod)?, "");
    let none = k.run(&["get", "pods", "-A", "-l", "e2e", "-o", "name"])?;
    assert!(none.success(), "{}", none.stderr);
    assert_eq!(none.stdout.trim(), "", "no pod has the label any more");
    still_running(sim)
}

pub(crate) fn patch_node_merge(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();
    let rv = |node: &str| -> anyhow::Result<u64> {
        let s = k.ok(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])?;
        s.parse().with_context(|| format!("resourceVersion {s:?}"))
    };
    let status = |node: &str| -> anyhow::Result<String> {
        let out = k.ok(&["get", "node", node, "--no-headers"])?;
        Ok(columns(&out).get(1).copied().unwrap_or("").to_string())
    };
    let before = rv("node-1")?;
    assert_eq!(status("node-1")?, "Ready");

    let out = k.ok(&[
        "patch",
        "node",
        "node-1",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"e2e":"patched"}},"spec":{"unschedulable":true}}"#,
    ])?;
    assert_eq!(out.trim(), "node/node-1 patched");
    let node = k.json(&["get", "node", "node-1", "-o", "json"])?;
    assert_eq!(node["metadata"]["labels"]["e2e"], "patched", "label set");
    assert_eq!(node["spec"]["unschedulable"], true, "cordoned");
    assert!(
        node["metadata"]["labels"]["kubernetes.io/hostname"] == "node-1",
        "a merge patch keeps the other labels: {}",
        node["metadata"]["labels"]
    );
    let after = rv("node-1")?;
    assert!(after > before, "resourceVersion {before} -> {after}");
    assert_eq!(status("node-1")?, "Ready,SchedulingDisabled");
    let selected = k.ok(&["get", "nodes", "-l", "e2e=patched", "-o", "name"])?;
    assert_eq!(selected.trim(), "node/node-1");
    assert_eq!(status("node-2")?, "Ready", "node-2 untouched");

    // In a merge patch, null removes a key.
    let out = k.ok(&[
        "patch",
        "node",
        "node-1",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"e2e":null}},"spec":{"unschedulable":null}}"#,
    ])?;
    assert_eq!(out.trim(), "node/node-1 patched");
    let node = k.json(&["get", "node", "node-1", "-o", "json"])?;
    assert!(
        node["metadata"]["labels"].get("e2e").is_none(),
        "label removed"
    );
    assert!(node["spec"].get("unschedulable").is_none(), "uncordoned");
    assert_eq!(status("node-1")?, "Ready");
    still_running(sim)
}

pub(crate) fn delete_pod(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    // Long enough to see the pod Terminating from another kubectl.
    let delay = Duration::from_secs(5);
    let sim = seeded(scheme, store, &["--kubelet-delete-delay", "5s"])?;
    let k = sim.kubectl();
    let names = pod_names(&k, "ns-1")?;
    let (waited, not_waited) = (names[0].as_str(), names[1].as_str());
    let node = k.ok(&[
        "get",
        "pod",
        not_waited,
        "-n",
        "ns-1",
        "-o",
        "jsonpath={.spec.nodeName}",
    ])?;
    assert!(
        node.starts_with("node-"),
        "the pod is bound to a node: {node:?}"
    );

    // A pod bound to a node is deleted gracefully: it stays, Terminating, until its kubelet stops it.
    let out = k.ok(&["delete", "pod", not_waited, "-n", "ns-1", "--wait=false"])?;
    assert_eq!(out.trim(), format!("pod \"{not_waited}\" deleted"));
    let pod = k.json(&["get", "pod", not_waited, "-n", "ns-1", "-o", "json"])?;
    assert!(
        !str_at(&pod, "/metadata/deletionTimestamp").is_empty(),
        "a deletionTimestamp: {}",
        pod["metadata"]
    );
    let row = k.ok(&["get", "pod", not_waited, "-n", "ns-1", "--no-headers"])?;
    assert_eq!(columns(&row).get(2), Some(&"Terminating"), "{row}");

    // `kubectl delete` waits until the pod is gone; then it is NotFound.
    let started = Instant::now();
    let out = k.ok(&["delete", "pod", waited, "-n", "ns-1"])?;
    let took = started.elapsed();
    assert_eq!(out.trim(), format!("pod \"{waited}\" deleted"));
    assert!(
        took >= delay - Duration::from_secs(1),
        "the delete returned after {took:?}, before the simulated kubelet's {delay:?}"
    );
    let err = k.fails(&["get", "pod", waited, "-n", "ns-1"])?;
    assert!(
        err.contains("(NotFound)") && err.contains(&format!("pods \"{waited}\" not found")),
        "{err}"
    );

    // The one deleted without waiting goes too.
    eventually(Duration::from_secs(30), "the pod is gone", || {
        let r = k.run(&["get", "pod", not_waited, "-n", "ns-1"])?;
        Ok((!r.success() && r.stderr.contains("(NotFound)")).then_some(()))
    })?;
    let left = k.ok(&["get", "pods", "-n", "ns-1", "--no-headers"])?;
    assert_eq!(left.lines().count(), 1000 - 2);
    let err = k.fails(&["delete", "pod", waited, "-n", "ns-1"])?;
    assert!(err.contains("(NotFound)"), "deleting again: {err}");
    still_running(sim)
}
