//! kubectl against the simulated kube-apiserver (`tollgate-bench sim`), end to end: the real
//! binary on an ephemeral loopback port, the real kubectl through the kubeconfig the sim
//! writes, over plain HTTP and over TLS, and (`on_etcd::`) a representative set with
//! `--store etcd` on a real etcd. Each test starts its own simulator, seeded with 100
//! nodes and 3,000 pods over three namespaces, so the tests run in parallel and may write.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tests::{eventually, CertAuthority, KubeUser, Kubectl, Scheme, SimProcess, Store};

const NODES: usize = 100;
const PODS: usize = 3000;
const NAMESPACES: usize = 3;

/// How long a test waits for a watcher to print an expected line.
const WATCH_WAIT: Duration = Duration::from_secs(30);

/// Runs each named test function once over plain HTTP and once over TLS:
/// `NAME::http` and `NAME::tls`.
macro_rules! over_http_and_tls {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn http() -> anyhow::Result<()> {
                super::$name(tests::Scheme::Http, tests::Store::Memory)
            }
            #[test]
            fn tls() -> anyhow::Result<()> {
                super::$name(tests::Scheme::Tls, tests::Store::Memory)
            }
        }
    )*};
}

/// Runs each named test function once more with `--store etcd` on a real etcd, over plain
/// HTTP: `on_etcd::NAME`.
macro_rules! on_etcd {
    ($($name:ident),* $(,)?) => {
        mod on_etcd {$(
            #[test]
            fn $name() -> anyhow::Result<()> {
                super::$name(tests::Scheme::Http, tests::Store::Etcd)
            }
        )*}
    };
}

over_http_and_tls!(
    get_nodes,
    get_pods_all_namespaces,
    field_selector_spec_node_name,
    label_pod,
    patch_node_merge,
    delete_pod,
    watch_prints_label_change,
    watch_prints_graceful_delete,
    identities,
);

on_etcd!(
    get_pods_all_namespaces,
    field_selector_spec_node_name,
    label_pod,
    patch_node_merge,
    delete_pod,
    watch_prints_label_change,
    watch_prints_graceful_delete,
);

/// A simulator seeded with [`NODES`] nodes and [`PODS`] pods over [`NAMESPACES`] namespaces.
fn seeded(scheme: Scheme, store: Store, extra: &[&str]) -> anyhow::Result<SimProcess> {
    let (nodes, pods, namespaces) = (NODES.to_string(), PODS.to_string(), NAMESPACES.to_string());
    let mut args = vec![
        "--nodes",
        &nodes,
        "--pods",
        &pods,
        "--namespaces",
        &namespaces,
    ];
    args.extend_from_slice(scheme.sim_args());
    args.extend_from_slice(extra);
    let sim = SimProcess::start_on(store, &args)?;
    let prefix = format!("{}://127.0.0.1:", scheme.url_scheme());
    anyhow::ensure!(
        sim.url.starts_with(&prefix),
        "the simulator serves {}, expected {prefix}…",
        sim.url
    );
    Ok(sim)
}

/// Fails if the simulator died during the test (it must outlive every request).
fn still_running(mut sim: SimProcess) -> anyhow::Result<()> {
    anyhow::ensure!(
        sim.is_running(),
        "the simulator (pid {}) exited during the test; its log:\n{}",
        sim.pid(),
        sim.log()
    );
    Ok(())
}

/// The whitespace-separated columns of a kubectl table line.
fn columns(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// The header's columns and the rows of a kubectl table.
fn table(out: &str) -> anyhow::Result<(Vec<&str>, Vec<Vec<&str>>)> {
    let mut lines = out.lines();
    let header = lines.next().context("kubectl printed no table header")?;
    Ok((columns(header), lines.map(columns).collect()))
}

/// The `.items` of a kubectl `-o json` list.
fn items(list: &Value) -> anyhow::Result<&Vec<Value>> {
    list["items"]
        .as_array()
        .with_context(|| format!("no .items in {}", abbreviated(list)))
}

fn abbreviated(v: &Value) -> String {
    let s = v.to_string();
    s.chars().take(500).collect()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// `namespace/name` of each item.
fn keys(list: &[Value]) -> BTreeSet<String> {
    list.iter()
        .map(|o| {
            format!(
                "{}/{}",
                str_at(o, "/metadata/namespace"),
                str_at(o, "/metadata/name")
            )
        })
        .collect()
}

/// The names of the pods of `namespace`, sorted; checks every item is in that namespace.
fn pod_names(k: &Kubectl, namespace: &str) -> anyhow::Result<Vec<String>> {
    let list = k.json(&["get", "pods", "-n", namespace, "-o", "json"])?;
    let items = items(&list)?;
    let mut names = Vec::new();
    for o in items {
        let ns = str_at(o, "/metadata/namespace");
        anyhow::ensure!(
            ns == namespace,
            "`get pods -n {namespace}` returned a pod of namespace {ns:?}: {}",
            str_at(o, "/metadata/name")
        );
        names.push(str_at(o, "/metadata/name").to_string());
    }
    names.sort();
    anyhow::ensure!(!names.is_empty(), "no pods in {namespace}");
    Ok(names)
}

// === reads ===

fn get_nodes(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();

    let out = k.ok(&["get", "nodes"])?;
    let (header, rows) = table(&out)?;
    assert_eq!(header, ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]);
    assert_eq!(rows.len(), NODES, "`get nodes` rows:\n{out}");
    let names: BTreeSet<String> = rows.iter().map(|r| r[0].to_string()).collect();
    let expected: BTreeSet<String> = (1..=NODES).map(|i| format!("node-{i}")).collect();
    assert_eq!(names, expected, "node names");
    for row in &rows {
        assert_eq!(row.get(1), Some(&"Ready"), "STATUS of {row:?}");
    }

    // The same nodes as objects.
    let list = k.json(&["get", "nodes", "-o", "json"])?;
    let items = items(&list)?;
    assert_eq!(items.len(), NODES);
    assert!(items.iter().all(|n| n["kind"] == "Node"));
    let node7 = k.json(&["get", "node", "node-7", "-o", "json"])?;
    assert_eq!(str_at(&node7, "/metadata/name"), "node-7");
    assert!(
        !str_at(&node7, "/metadata/uid").is_empty(),
        "node-7 has a uid"
    );
    still_running(sim)
}

fn get_pods_all_namespaces(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();

    let out = k.ok(&["get", "pods", "-A"])?;
    let (header, rows) = table(&out)?;
    assert_eq!(
        header,
        ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    assert_eq!(rows.len(), PODS, "`get pods -A` rows");
    let unique: BTreeSet<(&str, &str)> = rows.iter().map(|r| (r[0], r[1])).collect();
    assert_eq!(unique.len(), PODS, "every pod listed once");
    let mut per_ns: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &rows {
        *per_ns.entry(r[0]).or_default() += 1;
    }
    let expected: BTreeMap<&str, usize> = [("ns-1", 1000), ("ns-2", 1000), ("ns-3", 1000)].into();
    assert_eq!(per_ns, expected, "pods per namespace");

    // One namespace lists exactly its own pods, and kubectl has nothing to complain about
    // (a namespaced LIST that returns other namespaces' pods makes kubectl print an error per pod).
    let ns2 = k.run(&["get", "pods", "-n", "ns-2", "--no-headers"])?;
    assert!(
        ns2.stderr.trim().is_empty(),
        "`get pods -n ns-2` stderr: {}",
        ns2.stderr.lines().take(5).collect::<Vec<_>>().join("\n")
    );
    let ns2_names: BTreeSet<&str> = ns2
        .stdout
        .lines()
        .filter_map(|l| columns(l).first().copied())
        .collect();
    let expected: BTreeSet<&str> = rows
        .iter()
        .filter(|r| r[0] == "ns-2")
        .map(|r| r[1])
        .collect();
    assert_eq!(ns2_names.len(), 1000);
    assert_eq!(ns2_names, expected, "`-n ns-2` and `-A` agree on ns-2");
    assert_eq!(pod_names(&k, "ns-3")?.len(), 1000, "`-n ns-3 -o json`");
    still_running(sim)
}

fn field_selector_spec_node_name(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();
    let selector = "spec.nodeName=node-7";

    let selected = k.json(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        selector,
        "-o",
        "json",
    ])?;
    let selected = items(&selected)?;
    // The seed spreads pods evenly over the nodes.
    assert_eq!(selected.len(), PODS / NODES, "pods on node-7");
    for p in selected {
        assert_eq!(
            str_at(p, "/spec/nodeName"),
            "node-7",
            "pod {} selected by {selector}",
            str_at(p, "/metadata/name")
        );
    }

    // The table lists the same pods, each on node-7.
    let out = k.ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        selector,
        "-o",
        "wide",
    ])?;
    let (header, rows) = table(&out)?;
    let node_col = header
        .iter()
        .position(|c| *c == "NODE")
        .context("no NODE column in -o wide")?;
    let table_keys: BTreeSet<String> = rows.iter().map(|r| format!("{}/{}", r[0], r[1])).collect();
    assert_eq!(table_keys, keys(selected), "table and JSON agree");
    for r in &rows {
        assert_eq!(r.get(node_col), Some(&"node-7"), "{r:?}");
    }

    // Exactly the pods a client-side filter of the full list finds.
    let all = k.json(&["get", "pods", "-A", "-o", "json"])?;
    let all = items(&all)?;
    assert_eq!(all.len(), PODS);
    let on_node7: Vec<Value> = all
        .iter()
        .filter(|p| str_at(p, "/spec/nodeName") == "node-7")
        .cloned()
        .collect();
    assert_eq!(
        keys(selected),
        keys(&on_node7),
        "server and client filters agree"
    );

    // And `!=` selects all the others.
    let others = k.ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        "spec.nodeName!=node-7",
        "--no-headers",
    ])?;
    assert_eq!(others.lines().count(), PODS - PODS / NODES);
    still_running(sim)
}

// === writes ===

fn label_pod(scheme: Scheme, store: Store) -> anyhow::Result<()> {
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

fn patch_node_merge(scheme: Scheme, store: Store) -> anyhow::Result<()> {
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

fn delete_pod(scheme: Scheme, store: Store) -> anyhow::Result<()> {
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

// === watches ===

fn watch_prints_label_change(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();
    let ns2 = pod_names(&k, "ns-2")?;
    let ns3 = pod_names(&k, "ns-3")?;
    let pod = ns2[ns2.len() / 2].as_str();
    let elsewhere = ns3[0].as_str();

    let mut watcher = k.background("60s", &["get", "pods", "-n", "ns-2", "-w", "--show-labels"])?;
    let first = watcher.wait_for_line(WATCH_WAIT, &format!("the row of {pod}"), |l| {
        columns(l).first() == Some(&pod)
    })?;
    assert!(!first.contains("watched="), "{first}");

    // A change in another namespace, then the one watched: the watcher prints the second
    // (and, as events are ordered, would have printed the first before it if it leaked).
    k.ok(&["label", "pod", elsewhere, "-n", "ns-3", "watched=elsewhere"])?;
    k.ok(&["label", "pod", pod, "-n", "ns-2", "watched=yes"])?;
    watcher.wait_for_line(WATCH_WAIT, &format!("{pod} with watched=yes"), |l| {
        let c = columns(l);
        c.first() == Some(&pod)
            && c.last()
                .is_some_and(|labels| labels.split(',').any(|l| l == "watched=yes"))
    })?;
    assert!(watcher.is_running(), "the watch is still open");

    let ns2: BTreeSet<&str> = ns2.iter().map(String::as_str).collect();
    for line in watcher.lines().iter().skip(1) {
        let name = columns(line).first().copied().unwrap_or("");
        assert!(
            ns2.contains(name),
            "`get pods -n ns-2 -w` printed a pod that is not in ns-2: {line}"
        );
    }
    still_running(sim)
}

fn watch_prints_graceful_delete(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();
    let names = pod_names(&k, "ns-1")?;
    let pod = names[names.len() - 1].as_str();
    let event_of = |line: &str, event: &str, status: Option<&str>| {
        let c = columns(line);
        c.first() == Some(&event)
            && c.get(1) == Some(&pod)
            && status.is_none_or(|s| c.get(3) == Some(&s))
    };

    let mut watcher = k.background(
        "60s",
        &["get", "pods", "-n", "ns-1", "-w", "--output-watch-events"],
    )?;
    watcher.wait_for_line(WATCH_WAIT, &format!("ADDED {pod}"), |l| {
        event_of(l, "ADDED", None)
    })?;

    k.ok(&["delete", "pod", pod, "-n", "ns-1", "--wait=false"])?;
    watcher.wait_for_line(WATCH_WAIT, &format!("MODIFIED {pod} Terminating"), |l| {
        event_of(l, "MODIFIED", Some("Terminating"))
    })?;
    watcher.wait_for_line(WATCH_WAIT, &format!("DELETED {pod}"), |l| {
        event_of(l, "DELETED", None)
    })?;
    let err = k.fails(&["get", "pod", pod, "-n", "ns-1"])?;
    assert!(err.contains("(NotFound)"), "{err}");
    still_running(sim)
}

// === identities ===

/// `kubectl auth whoami -o json`: user name, uid and groups.
fn whoami(k: &Kubectl) -> anyhow::Result<(String, String, Vec<String>)> {
    let review = k.json(&["auth", "whoami", "-o", "json"])?;
    anyhow::ensure!(
        review["kind"] == "SelfSubjectReview",
        "not a SelfSubjectReview: {}",
        abbreviated(&review)
    );
    let info = &review["status"]["userInfo"];
    let groups = info["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    Ok((
        str_at(info, "/username").to_string(),
        str_at(info, "/uid").to_string(),
        groups,
    ))
}

fn identities(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let inputs = tempfile::tempdir()?;
    let tokens = inputs.path().join("tokens.csv");
    std::fs::write(
        &tokens,
        "alice-token,alice,uid-alice,\"dev,ops\"\nbob-token,bob,uid-bob\n",
    )?;
    let client_ca = CertAuthority::generate("e2e-client-ca")?;
    let client_ca_file = inputs.path().join("client-ca.crt");
    std::fs::write(&client_ca_file, client_ca.cert_pem())?;
    let tokens_arg = tokens.to_string_lossy();
    let ca_arg = client_ca_file.to_string_lossy();
    let mut args = vec!["--token-auth-file", &*tokens_arg];
    if scheme == Scheme::Tls {
        args.extend(["--client-ca-file", &*ca_arg]);
    }
    let sim = seeded(scheme, store, &args)?;
    let alice = sim.kubectl_as("alice", &KubeUser::Token("alice-token".into()))?;
    let wrong = sim.kubectl_as("wrong", &KubeUser::Token("not-a-token".into()))?;

    // No credentials at all: anonymous.
    let (user, _, groups) = whoami(&sim.kubectl())?;
    assert_eq!(user, "system:anonymous");
    assert_eq!(groups, ["system:unauthenticated"]);

    if scheme == Scheme::Http {
        // kubectl (client-go's clientcmd) loads a kubeconfig user's credentials only for TLS
        // transports: over plain HTTP it sends no token, so every caller is anonymous, even
        // with a wrong token. Tests that need identities over kubectl must use --tls.
        for k in [&alice, &wrong] {
            let (user, _, _) = whoami(k)?;
            assert_eq!(user, "system:anonymous", "{}", k.kubeconfig.display());
        }
        return still_running(sim);
    }

    let (user, uid, groups) = whoami(&alice)?;
    assert_eq!(user, "alice");
    assert_eq!(uid, "uid-alice");
    assert_eq!(groups, ["dev", "ops", "system:authenticated"]);
    // The token works for ordinary requests too.
    assert_eq!(
        alice.ok(&["get", "nodes", "--no-headers"])?.lines().count(),
        NODES
    );

    let bob = sim.kubectl_as("bob", &KubeUser::Token("bob-token".into()))?;
    assert_eq!(
        whoami(&bob)?,
        (
            "bob".into(),
            "uid-bob".into(),
            vec!["system:authenticated".into()]
        )
    );

    // A token the server does not know is refused (401), not served as anonymous.
    let err = wrong.fails(&["auth", "whoami", "-o", "json"])?;
    assert!(
        err.contains("You must be logged in to the server (Unauthorized)"),
        "{err}"
    );
    // (`get` fails in discovery, where client-go words a 401 differently.)
    let err = wrong.fails(&["get", "nodes"])?;
    assert!(err.contains("You must be logged in to the server"), "{err}");

    // Client certificates: CN is the user, O the groups.
    let cert = client_ca.issue_client("carol", &["team-a", "team-b"])?;
    let carol = sim.kubectl_as(
        "carol",
        &KubeUser::ClientCert {
            cert_pem: cert.cert_pem.clone(),
            key_pem: cert.key_pem.clone(),
        },
    )?;
    let (user, _, groups) = whoami(&carol)?;
    assert_eq!(user, "carol");
    assert_eq!(groups, ["team-a", "team-b", "system:authenticated"]);
    assert_eq!(
        carol.ok(&["get", "nodes", "--no-headers"])?.lines().count(),
        NODES
    );

    // A certificate from a CA the server does not trust never authenticates its CN.
    let other_ca = CertAuthority::generate("not-the-client-ca")?;
    let forged = other_ca.issue_client("carol", &["system:masters"])?;
    let mallory = sim.kubectl_as(
        "mallory",
        &KubeUser::ClientCert {
            cert_pem: forged.cert_pem,
            key_pem: forged.key_pem,
        },
    )?;
    let r = mallory.run(&["auth", "whoami", "-o", "json"])?;
    assert!(
        !r.success(),
        "an untrusted client certificate was accepted: {}",
        r.stdout
    );
    // As kube-apiserver: the handshake succeeds and the request is refused with 401.
    assert!(r.stderr.contains("Unauthorized"), "{}", r.stderr);
    still_running(sim)
}
