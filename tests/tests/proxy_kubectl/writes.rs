//! Writes through tollgate: label, patches, graceful delete.

use super::*;

pub(crate) fn label_patch_delete(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &["--kubelet-delete-delay", "1s"])?;
    let direct = stack.direct()?;
    for (i, (who, k)) in stack.users()?.into_iter().enumerate() {
        let ns = format!("ns-{}", i + 1);
        let names = pod_names(&k, &ns)?;
        let pod = names[i].as_str();
        let out = k.ok(&["label", "pod", pod, "-n", &ns, &format!("e2e={who}")])?;
        assert_eq!(out.trim(), format!("pod/{pod} labeled"), "{who}");
        let seen = direct.ok(&[
            "get",
            "pod",
            pod,
            "-n",
            &ns,
            "-o",
            "jsonpath={.metadata.labels.e2e}",
        ])?;
        assert_eq!(seen, who, "the sim has the label set through tollgate");
        let selected = k.ok(&[
            "get",
            "pods",
            "-A",
            "-l",
            &format!("e2e={who}"),
            "-o",
            "name",
        ])?;
        assert_eq!(selected.trim(), format!("pod/{pod}"), "{who}");

        let node = format!("node-{}", i + 1);
        let out = k.ok(&[
            "patch",
            "node",
            &node,
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"e2e":"patched"}},"spec":{"unschedulable":true}}"#,
        ])?;
        assert_eq!(out.trim(), format!("node/{node} patched"), "{who}");
        let n = direct.json(&["get", "node", &node, "-o", "json"])?;
        assert_eq!(n["metadata"]["labels"]["e2e"], "patched", "{who}");
        assert_eq!(n["spec"]["unschedulable"], true, "{who}");
        let row = k.ok(&["get", "node", &node, "--no-headers"])?;
        assert_eq!(
            columns(&row).get(1),
            Some(&"Ready,SchedulingDisabled"),
            "{who}"
        );
        let json_patch = r#"[{"op":"remove","path":"/spec/unschedulable"}]"#;
        k.ok(&["patch", "node", &node, "--type", "json", "-p", json_patch])?;
        let row = k.ok(&["get", "node", &node, "--no-headers"])?;
        assert_eq!(columns(&row).get(1), Some(&"Ready"), "{who}: json patch");

        // `kubectl delete` waits (a watch through tollgate) until the kubelet has stopped it.
        let out = k.ok(&["delete", "pod", pod, "-n", &ns])?;
        assert_eq!(out.trim(), format!("pod \"{pod}\" deleted"), "{who}");
        let err = direct.fails(&["get", "pod", pod, "-n", &ns])?;
        assert!(err.contains("(NotFound)"), "{who}: {err}");
        let err = k.fails(&["delete", "pod", pod, "-n", &ns])?;
        assert!(err.contains("(NotFound)"), "{who}: deleting again: {err}");
        let left = k.ok(&["get", "pods", "-n", &ns, "--no-headers"])?;
        assert_eq!(left.lines().count(), PODS / NAMESPACES - 1, "{who}");
    }
    stack.still_running()
}
