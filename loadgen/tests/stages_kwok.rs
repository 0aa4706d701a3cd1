//! kwok's own published Stage documents (tests/testdata/kwok: byte-identical
//! copies of ../shared/testdata/kwok, kept in the repository so that a fresh
//! clone tests them) load unchanged, render against realistic nodes and pods,
//! and drive them through their lifecycles; Stage files with unknown fields are
//! refused by name; weights split a population within statistical bounds.
#![allow(clippy::unwrap_used)] // tests may unwrap

use loadgen::stages::next::ActionKind;
use loadgen::stages::{Kind, StageSet, StagesSpec};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};

mod stages_common;
use stages_common::{load, merge};

const NODE_FAST: &[&str] = &["node/fast/node-initialize.yaml"];
const NODE_HEARTBEAT: &[&str] = &[
    "node/fast/node-initialize.yaml",
    "node/heartbeat/node-heartbeat.yaml",
];
const NODE_LEASE: &[&str] = &[
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
];
const NODE_CHAOS: &[&str] = &[
    "node/fast/node-initialize.yaml",
    "node/chaos/node-not-ready.yaml",
];
const POD_FAST: &[&str] = &[
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
];
const POD_GENERAL: &[&str] = &[
    "pod/general/pod-create.yaml",
    "pod/general/pod-init-container-running.yaml",
    "pod/general/pod-init-container-completed.yaml",
    "pod/general/pod-ready.yaml",
    "pod/general/pod-complete.yaml",
    "pod/general/pod-delete.yaml",
];
const POD_CHAOS: &[&str] = &[
    "pod/chaos/pod-container-running-failed.yaml",
    "pod/chaos/pod-init-container-running-failed.yaml",
];

/// A node as a client creates it (kwok's nodes start without status).
fn bare_node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": "u-node", "resourceVersion": "1",
            "creationTimestamp": "2026-11-22T10:00:00Z",
            "labels": {"type": "kwok", "kubernetes.io/hostname": name}},
        "spec": {}})
}

/// A pod bound to `node` as the apiserver stores it: Pending, no status yet.
fn pending_pod(node: &str, init: bool, owner: Option<&str>) -> Value {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": "team-a", "uid": "u-pod", "resourceVersion": "1",
            "creationTimestamp": "2026-11-22T10:00:00Z", "labels": {"app": "web"}},
        "spec": {"nodeName": node,
            "containers": [{"name": "app", "image": "nginx:1.27"}, {"name": "sidecar", "image": "envoy:1.31"}]},
        "status": {"phase": "Pending", "qosClass": "BestEffort"}});
    if init {
        pod["spec"]["initContainers"] = json!([{"name": "setup", "image": "busybox:1.36"}]);
    }
    if let Some(kind) = owner {
        pod["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": kind, "name": "job-1", "uid": "u-job"}]);
    }
    pod
}

/// Applies the Stage chosen for `obj` as the engine would (without the
/// server): returns the Stage's name, or `None` when none matches.
fn step(
    set: &StageSet,
    kind: Kind,
    obj: &mut Value,
    rng: &mut StdRng,
) -> Option<(String, Vec<ActionKind>)> {
    let i = set.select(kind, obj, rng)?;
    let stage = &set.stages[i];
    let actions = stage
        .next
        .actions(kind, obj, &stage.name)
        .unwrap_or_else(|e| panic!("stage {} on {obj}: {e}", stage.name));
    let kinds: Vec<ActionKind> = actions.iter().map(|a| a.kind).collect();
    for a in &actions {
        let body: Value = a
            .body
            .as_ref()
            .map(|(_, b)| serde_json::from_slice(b).expect("action bodies are JSON"))
            .unwrap_or(Value::Null);
        match a.kind {
            ActionKind::Status | ActionKind::Finalizers | ActionKind::Patch => merge(obj, &body),
            ActionKind::Delete => *obj = Value::Null,
            ActionKind::Event => assert_eq!(body["kind"], "Event"),
        }
    }
    let rv: u64 = obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if !obj.is_null() {
        obj["metadata"]["resourceVersion"] = Value::String((rv + 1).to_string());
    }
    Some((stage.name.clone(), kinds))
}

fn condition<'a>(obj: &'a Value, t: &str) -> &'a Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == t))
        .map(|c| &c["status"])
        .unwrap_or(&Value::Null)
}

#[test]
fn every_kwok_stage_document_loads_unchanged() {
    let all: Vec<&str> = [
        NODE_HEARTBEAT,
        NODE_LEASE,
        NODE_CHAOS,
        POD_FAST,
        POD_GENERAL,
        POD_CHAOS,
    ]
    .concat();
    let mut names = Vec::new();
    for rel in all {
        let set = load(&[rel]);
        assert_eq!(set.stages.len(), 1, "{rel}");
        names.push(set.stages[0].name.clone());
    }
    assert!(names.contains(&"node-initialize".to_string()));
    // The built-in set is kwok's fast node and pod Stages.
    let builtin = StagesSpec::load(&["fast".into()], 1.0).unwrap();
    let builtin = builtin.loaded.unwrap();
    let names: Vec<&str> = builtin.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["node-initialize", "pod-ready", "pod-complete", "pod-delete"]
    );
}

#[test]
fn node_initialize_then_heartbeats() {
    let mut rng = StdRng::seed_from_u64(1);
    for files in [NODE_FAST, NODE_HEARTBEAT, NODE_LEASE] {
        let set = load(files);
        let mut node = bare_node("kwok-node-7");
        let (name, _) =
            step(&set, Kind::Node, &mut node, &mut rng).expect("a bare node is initialized");
        assert_eq!(name, "node-initialize");
        let st = &node["status"];
        assert_eq!(st["phase"], "Running");
        assert_eq!(condition(&node, "Ready"), "True");
        assert_eq!(st["conditions"].as_array().unwrap().len(), 5);
        let addresses = st["addresses"].as_array().expect("addresses");
        assert!(addresses.iter().any(
            |a| a["type"] == "InternalIP" && a["address"].as_str().unwrap().starts_with("10.")
        ));
        assert!(addresses
            .iter()
            .any(|a| a["type"] == "Hostname" && a["address"] == "kwok-node-7"));
        assert_eq!(st["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
        assert_eq!(st["allocatable"]["pods"], "1M");
        assert_eq!(st["nodeInfo"]["architecture"], "amd64");
        assert!(st["nodeInfo"]["kubeletVersion"]
            .as_str()
            .unwrap()
            .starts_with("kwok-"));
        let before = st["conditions"][0]["lastHeartbeatTime"].clone();
        let next = step(&set, Kind::Node, &mut node, &mut rng);
        if files == NODE_FAST {
            assert!(next.is_none(), "the fast set only initializes");
            assert!(!set.has_node_heartbeat());
        } else {
            let (name, kinds) = next.expect("a Ready node heartbeats");
            assert!(name.starts_with("node-heartbeat"), "{name}");
            assert_eq!(kinds, [ActionKind::Status]);
            assert!(node["status"]["conditions"][0]["lastHeartbeatTime"].is_string());
            assert_ne!(before, Value::Null);
            assert!(set.has_node_heartbeat(), "{files:?}");
            // And again: a heartbeat Stage keeps matching.
            assert!(step(&set, Kind::Node, &mut node, &mut rng).is_some());
        }
    }
}

#[test]
fn node_initialize_keeps_what_the_node_reports() {
    let mut rng = StdRng::seed_from_u64(9);
    let set = load(NODE_FAST);
    let mut node = bare_node("big-1");
    node["status"] = json!({
        "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
        "allocatable": {"cpu": "31500m", "memory": "250Gi", "pods": "110"},
        "addresses": [{"type": "InternalIP", "address": "192.0.2.7"}],
        "nodeInfo": {"kubeletVersion": "v1.34.1", "architecture": "arm64", "bootID": ""},
        "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]});
    let (name, _) = step(&set, Kind::Node, &mut node, &mut rng).unwrap();
    assert_eq!(name, "node-initialize");
    let st = &node["status"];
    assert_eq!(st["allocatable"]["cpu"], "31500m");
    assert_eq!(st["capacity"]["memory"], "256Gi");
    assert_eq!(st["nodeInfo"]["kubeletVersion"], "v1.34.1");
    assert_eq!(st["nodeInfo"]["architecture"], "arm64");
    // The InternalIP it had is kept (merged by type), a Hostname added.
    let addresses = st["addresses"].as_array().unwrap();
    assert!(addresses
        .iter()
        .any(|a| a["type"] == "InternalIP" && a["address"] == "192.0.2.7"));
    assert!(addresses
        .iter()
        .any(|a| a["type"] == "Hostname" && a["address"] == "big-1"));
    assert_eq!(condition(&node, "Ready"), "True");
}

#[test]
fn node_chaos_makes_labelled_nodes_not_ready() {
    let mut rng = StdRng::seed_from_u64(2);
    let set = load(NODE_CHAOS);
    let mut plain = bare_node("n-plain");
    step(&set, Kind::Node, &mut plain, &mut rng).unwrap();
    assert!(step(&set, Kind::Node, &mut plain, &mut rng).is_none());
    let mut bad = bare_node("n-bad");
    bad["metadata"]["labels"]["node-not-ready.stage.kwok.x-k8s.io"] = json!("true");
    bad["metadata"]["annotations"] = json!({"node-not-ready.stage.kwok.x-k8s.io/reason": "Broken"});
    step(&set, Kind::Node, &mut bad, &mut rng).unwrap();
    let (name, _) = step(&set, Kind::Node, &mut bad, &mut rng).unwrap();
    assert_eq!(name, "node-not-ready");
    assert_eq!(condition(&bad, "Ready"), "False");
    let ready = bad["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["reason"], "Broken");
}

fn deleting(pod: &mut Value) {
    pod["metadata"]["deletionTimestamp"] = json!("2026-11-22T10:05:00Z");
    pod["metadata"]["deletionGracePeriodSeconds"] = json!(30);
}

#[test]
fn fast_pods_run_complete_and_go() {
    let mut rng = StdRng::seed_from_u64(3);
    let set = load(POD_FAST);
    let mut pod = pending_pod("n1", true, None);
    let (name, _) = step(&set, Kind::Pod, &mut pod, &mut rng).unwrap();
    assert_eq!(name, "pod-ready");
    let st = &pod["status"];
    assert_eq!(st["phase"], "Running");
    assert_eq!(condition(&pod, "Ready"), "True");
    assert_eq!(st["containerStatuses"].as_array().unwrap().len(), 2);
    assert!(st["containerStatuses"][0]["state"]["running"]["startedAt"].is_string());
    assert_eq!(
        st["initContainerStatuses"][0]["state"]["terminated"]["reason"],
        "Completed"
    );
    assert!(st["podIP"].as_str().unwrap().starts_with("10."));
    assert_eq!(st["hostIP"], st["hostIPs"][0]["ip"]);
    // Running, not a Job's: nothing more until deleted.
    assert!(step(&set, Kind::Pod, &mut pod, &mut rng).is_none());
    deleting(&mut pod);
    let (name, kinds) = step(&set, Kind::Pod, &mut pod, &mut rng).unwrap();
    assert_eq!(
        (name.as_str(), kinds.as_slice()),
        ("pod-delete", &[ActionKind::Delete][..])
    );
    assert!(pod.is_null());
    // A Job's pod completes.
    let mut job = pending_pod("n1", false, Some("Job"));
    step(&set, Kind::Pod, &mut job, &mut rng).unwrap();
    let (name, _) = step(&set, Kind::Pod, &mut job, &mut rng).unwrap();
    assert_eq!(name, "pod-complete");
    assert_eq!(job["status"]["phase"], "Succeeded");
    assert_eq!(
        job["status"]["containerStatuses"][1]["state"]["terminated"]["exitCode"],
        0
    );
}

#[test]
fn general_pods_walk_every_phase() {
    let mut rng = StdRng::seed_from_u64(4);
    let set = load(POD_GENERAL);
    // With an init container: create → init running → init completed → ready.
    let mut pod = pending_pod("n2", true, None);
    let mut seen = Vec::new();
    while let Some((name, _)) = step(&set, Kind::Pod, &mut pod, &mut rng) {
        seen.push(name);
        assert!(seen.len() < 10, "no end: {seen:?}");
    }
    assert_eq!(
        seen,
        [
            "pod-create",
            "pod-init-container-running",
            "pod-init-container-completed",
            "pod-ready"
        ]
    );
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(condition(&pod, "Ready"), "True");
    assert_eq!(condition(&pod, "Initialized"), "True");
    deleting(&mut pod);
    let (name, _) = step(&set, Kind::Pod, &mut pod, &mut rng).unwrap();
    assert_eq!(name, "pod-delete");
    assert!(pod.is_null());
    // A Job's pod without init containers: create → ready → complete.
    let mut job = pending_pod("n2", false, Some("Job"));
    let mut seen = Vec::new();
    while let Some((name, kinds)) = step(&set, Kind::Pod, &mut job, &mut rng) {
        if name == "pod-create" {
            assert!(
                kinds.contains(&ActionKind::Event),
                "pod-create records an event"
            );
        }
        seen.push(name);
        assert!(seen.len() < 10, "no end: {seen:?}");
    }
    assert_eq!(seen, ["pod-create", "pod-ready", "pod-complete"]);
    assert_eq!(job["status"]["phase"], "Succeeded");
    // A pod with a finalizer is not deleted by the general Stages.
    let mut kept = pending_pod("n2", false, None);
    kept["metadata"]["finalizers"] = json!(["example.com/keep"]);
    deleting(&mut kept);
    assert!(step(&set, Kind::Pod, &mut kept, &mut rng).is_none());
}

#[test]
fn pod_chaos_fails_labelled_pods() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut set = load(POD_FAST);
    set.stages.extend(load(POD_CHAOS).stages);
    let mut pod = pending_pod("n3", false, None);
    pod["metadata"]["labels"]["pod-container-running-failed.stage.kwok.x-k8s.io"] = json!("true");
    pod["metadata"]["annotations"] =
        json!({"pod-container-running-failed.stage.kwok.x-k8s.io/container-name": "sidecar"});
    step(&set, Kind::Pod, &mut pod, &mut rng).unwrap();
    let (name, _) = step(&set, Kind::Pod, &mut pod, &mut rng).unwrap();
    assert_eq!(name, "pod-container-running-failed");
    assert_eq!(pod["status"]["phase"], "Failed");
    let sidecar = pod["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sidecar")
        .unwrap();
    assert_eq!(sidecar["state"]["terminated"]["exitCode"], 1);
    let mut init = pending_pod("n3", true, None);
    init["metadata"]["labels"]["pod-init-container-running-failed.stage.kwok.x-k8s.io"] =
        json!("true");
    // Pending: the chaos Stage (weight 10000) and pod-ready (weight 0) both match.
    let (name, _) = step(&set, Kind::Pod, &mut init, &mut rng).unwrap();
    assert_eq!(name, "pod-init-container-running-failed");
    assert_eq!(
        init["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"],
        "initContainerError"
    );
}

#[test]
fn unknown_fields_are_refused_by_name() {
    let doc = |extra_spec: &str, extra_next: &str| {
        format!(
            "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: s\nspec:\n  resourceRef:\n    apiGroup: v1\n    kind: Pod\n{extra_spec}  next:\n    delete: true\n{extra_next}"
        )
    };
    let err = StageSet::parse(
        &doc("  delayy:\n    durationMilliseconds: 1\n", ""),
        "typo.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("delayy") && err.contains("typo.yaml"), "{err}");
    let err = StageSet::parse(&doc("", "    deleet: true\n"), "next.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("deleet"), "{err}");
    // A kwok field loadgen does not implement is refused too, never ignored.
    let imp = "    patches:\n    - template: 'a: b'\n      impersonation:\n        username: x\n";
    let err = StageSet::parse(&doc("", imp), "imp.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("impersonation"), "{err}");
    // Unsupported template functions and resources, by name.
    let tpl = "    statusTemplate: '{{ Frobnicate . }}'\n";
    let err = StageSet::parse(&doc("", tpl), "tpl.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("Frobnicate"), "{err}");
    let svc = doc("", "").replace("kind: Pod", "kind: Service");
    let err = StageSet::parse(&svc, "svc.yaml").unwrap_err().to_string();
    assert!(err.contains("Service"), "{err}");
    let jq = doc(
        "  selector:\n    matchExpressions:\n    - key: '.a | | .b'\n      operator: Exists\n",
        "",
    );
    let err = StageSet::parse(&jq, "jq.yaml").unwrap_err().to_string();
    assert!(err.contains("matchExpressions[0]"), "{err}");
}

#[test]
fn weights_split_a_population() {
    let doc = |name: &str, weight: u32| {
        format!(
            "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: {name}\nspec:\n  resourceRef:\n    apiGroup: v1\n    kind: Pod\n  selector:\n    matchExpressions:\n    - key: .status.phase\n      operator: In\n      values: [Running]\n  weight: {weight}\n  weightFrom:\n    expressionFrom: '.metadata.annotations[\"w-{name}\"]'\n  next:\n    delete: true\n"
        )
    };
    let text = format!("{}---\n{}", doc("a", 1), doc("b", 3));
    let set = StageSet::parse(&text, "weights").unwrap();
    let mut rng = StdRng::seed_from_u64(42);
    let n = 20_000;
    let pod = json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}});
    let a = (0..n)
        .filter(|_| set.select(Kind::Pod, &pod, &mut rng) == Some(0))
        .count();
    // Binomial(n, 1/4): sd = sqrt(n·p·(1-p)) ≈ 61; 5 sd either side.
    let expect = n as f64 / 4.0;
    assert!(
        (a as f64 - expect).abs() < 5.0 * (n as f64 * 0.25 * 0.75).sqrt(),
        "a chosen {a} of {n}"
    );
    // weightFrom wins: an annotation turns `a` off for this pod.
    let off = json!({"metadata": {"name": "p", "annotations": {"w-a": "0"}}, "status": {"phase": "Running"}});
    assert!((0..1000).all(|_| set.select(Kind::Pod, &off, &mut rng) == Some(1)));
    // Not selected at all: no Stage.
    let pending = json!({"metadata": {"name": "p"}, "status": {"phase": "Pending"}});
    assert_eq!(set.select(Kind::Pod, &pending, &mut rng), None);
}
