//! `loadgen seed` then `loadgen cleanup` removes exactly what seed made.

use super::*;

/// Every object of a kind as `namespace/name` (cluster-scoped: `name`).
fn names(k: &Kubectl, kind: &str) -> anyhow::Result<BTreeSet<String>> {
    let out = k.ok(&[
        "get",
        kind,
        "-A",
        "-o",
        "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}",
    ])?;
    Ok(out
        .lines()
        .map(|l| l.trim_start_matches('/').to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// `loadgen seed` creates its namespaces, nodes and pods (labelled as loadgen's);
/// `loadgen cleanup` deletes exactly them: the simulator's own objects and an unlabelled
/// namespace and pod named like loadgen's remain.
#[test]
fn seed_then_cleanup_removes_exactly_what_seed_made() -> anyhow::Result<()> {
    let sim = SimProcess::start(&[
        "--nodes",
        "4",
        "--pods",
        "40",
        "--namespaces",
        "2",
        "--kubelet-delete-delay",
        "100ms",
    ])?;
    let k = sim.kubectl();
    // Others' objects that look like loadgen's but are not labelled as its.
    // (`kubectl create namespace` sends protobuf, which the sim refuses: create from JSON.)
    let namespace = serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "loadgen-ns-9"}
    });
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "loadgen-pod-0", "namespace": "loadgen-ns-9", "labels": {"app": "other"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    });
    for (name, object) in [("namespace", namespace), ("pod", pod)] {
        let file = sim.dir().join(format!("other-{name}.json"));
        std::fs::write(&file, object.to_string())?;
        k.ok(&["create", "-f", &file.display().to_string()])?;
    }

    let kinds = ["namespaces", "nodes", "pods"];
    let mut before = BTreeMap::new();
    for kind in kinds {
        before.insert(kind, names(&k, kind)?);
    }

    let seed = target_args(
        &sim,
        &[
            "--nodes",
            "7",
            "--pods",
            "30",
            "--namespaces",
            "3",
            "--pod-bytes",
            "500",
        ],
    )?;
    let mut args = vec!["seed"];
    args.extend(strs(&seed));
    let seeded = loadgen(&args, Duration::ZERO)?;
    anyhow::ensure!(
        seeded
            .stdout
            .contains("seed: 40 created, 0 already there, 0 failed"),
        "seed: {}",
        seeded.stdout
    );
    let selector = "app.kubernetes.io/managed-by=loadgen";
    let count = |kind: &str| -> anyhow::Result<usize> {
        Ok(k.ok(&["get", kind, "-A", "-l", selector, "-o", "name"])?
            .lines()
            .count())
    };
    anyhow::ensure!(
        (count("namespaces")?, count("nodes")?, count("pods")?) == (3, 7, 30),
        "seeded objects by label"
    );
    let seeded_pod = k.json(&[
        "get",
        "pod",
        "-n",
        "loadgen-ns-1",
        "loadgen-pod-1",
        "-o",
        "json",
    ])?;
    anyhow::ensure!(
        seeded_pod["spec"]["nodeName"] == "loadgen-node-1"
            && seeded_pod["metadata"]["annotations"]["loadgen.tollgate.dev/padding"]
                .as_str()
                .map(str::len)
                == Some(500),
        "loadgen-pod-1: {seeded_pod:#}"
    );
    // Seeding again changes nothing.
    let again = loadgen(&args, Duration::ZERO)?;
    anyhow::ensure!(
        again
            .stdout
            .contains("seed: 0 created, 40 already there, 0 failed"),
        "second seed: {}",
        again.stdout
    );

    let cleanup = target_args(&sim, &[])?;
    let mut args = vec!["cleanup"];
    args.extend(strs(&cleanup));
    let cleaned = loadgen(&args, Duration::ZERO)?;
    anyhow::ensure!(
        cleaned.stdout.contains("cleanup: 40 deleted") && cleaned.stdout.contains("0 failed"),
        "cleanup: {}",
        cleaned.stdout
    );
    // Pods bound to nodes go gracefully and namespaces terminate: wait for them to be gone.
    eventually(
        Duration::from_secs(60),
        "exactly the objects from before seeding",
        || {
            for kind in kinds {
                let now = names(&k, kind)?;
                if &now != before.get(kind).context("kind")? {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )?;
    let other = k.json(&[
        "get",
        "pod",
        "-n",
        "loadgen-ns-9",
        "loadgen-pod-0",
        "-o",
        "json",
    ])?;
    anyhow::ensure!(other["metadata"]["labels"]["app"] == "other", "{other:#}");
    still_running(sim)
}
