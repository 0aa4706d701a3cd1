//! StatefulSets (pods `NAME-0` … `NAME-(replicas-1)`, `OrderedReady`: each made once every
//! lower one runs and is ready, removed from the highest down; `Parallel`: all at once; a
//! template change replaces pods from the highest ordinal down, one at a time) and
//! DaemonSets (one pod per node its `nodeSelector` fits, bound to the node directly; a
//! template change replaces one pod at a time, as `maxUnavailable: 1`).

use super::cache::{Cache, PodInfo, Res};
use super::common::{
    delete_pod, generation, meta, pod_from_template, replicas, selects, status_patch,
    template_hash, Action,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;

const REVISION_LABEL: &str = "controller-revision-hash";

/// The revision name of a template, as a ControllerRevision's: `NAME-HASH`.
fn revision(owner: &Value) -> String {
    format!(
        "{}-{}",
        meta(owner).1,
        template_hash(&owner["spec"]["template"], REVISION_LABEL)
    )
}

pub fn reconcile_statefulset(cache: &Cache, sts: &Value) -> Vec<Action> {
    let (ns, name, uid) = meta(sts);
    let want = replicas(sts);
    let rev = revision(sts);
    let parallel = sts["spec"]["podManagementPolicy"] == "Parallel";
    let on_delete = sts["spec"]["updateStrategy"]["type"] == "OnDelete";
    let deleting = !sts["metadata"]["deletionTimestamp"].is_null();
    let pods = cache.pods_of(uid);
    let mut by_ordinal: BTreeMap<i64, &PodInfo> = BTreeMap::new();
    for p in &pods {
        if let Some(i) = p
            .name
            .strip_prefix(name)
            .and_then(|s| s.strip_prefix('-'))
            .and_then(|s| s.parse::<i64>().ok())
        {
            by_ordinal.insert(i, p);
        }
    }
    let mut actions = Vec::new();
    if !deleting {
        for i in 0..want {
            match by_ordinal.get(&i) {
                None => {
                    let pod_name = format!("{name}-{i}");
                    let mut body = pod_from_template(
                        Res::StatefulSet,
                        sts,
                        Some(&pod_name),
                        &[
                            (REVISION_LABEL, rev.clone()),
                            ("statefulset.kubernetes.io/pod-name", pod_name.clone()),
                        ],
                    );
                    body["spec"]["hostname"] = pod_name.clone().into();
                    if let Some(svc) = sts["spec"]["serviceName"].as_str() {
                        body["spec"]["subdomain"] = svc.into();
                    }
                    actions.push(Action::Create {
                        res: Res::Pod,
                        ns: ns.into(),
                        body,
                    });
                    if !parallel {
                        break;
                    }
                }
                // A finished pod is replaced, as the StatefulSet controller does.
                Some(p) if matches!(p.phase.as_str(), "Succeeded" | "Failed") && !p.deleting => {
                    actions.push(delete_pod(&p.namespace, &p.name));
                    if !parallel {
                        break;
                    }
                }
                Some(p) if !parallel && !p.running_ready() => break,
                Some(_) => {}
            }
        }
        let all_ready = (0..want).all(|i| by_ordinal.get(&i).is_some_and(|p| p.running_ready()));
        // Beyond `replicas`: from the highest down (one at a time unless Parallel).
        if actions.is_empty() && (parallel || all_ready) {
            let extra: Vec<&&PodInfo> = by_ordinal
                .range(want..)
                .rev()
                .map(|(_, p)| p)
                .filter(|p| !p.deleting)
                .collect();
            for p in extra.iter().take(if parallel { extra.len() } else { 1 }) {
                actions.push(delete_pod(&p.namespace, &p.name));
            }
            if extra.is_empty() && all_ready && !on_delete {
                // Rolling update: the highest pod of an older revision goes, and comes back.
                let outdated = (by_ordinal.range(..want).rev())
                    .find(|(_, p)| p.labels.get(REVISION_LABEL) != Some(&json!(rev)));
                if let Some((_, p)) = outdated {
                    actions.push(delete_pod(&p.namespace, &p.name));
                }
            }
        }
    }
    let counted: Vec<&PodInfo> = by_ordinal
        .values()
        .copied()
        .filter(|p| !p.deleting)
        .collect();
    let updated = counted
        .iter()
        .filter(|p| p.labels.get(REVISION_LABEL) == Some(&json!(rev)))
        .count();
    let current_revision = if updated == counted.len() {
        json!(rev)
    } else {
        sts["status"]["currentRevision"].clone()
    };
    let ready = counted.iter().filter(|p| p.running_ready()).count();
    let current = counted
        .iter()
        .filter(|p| p.labels.get(REVISION_LABEL) == Some(&current_revision))
        .count();
    let fields = [
        ("observedGeneration", json!(generation(sts)), true),
        ("replicas", json!(counted.len()), false),
        ("readyReplicas", json!(ready), true),
        ("currentReplicas", json!(current), true),
        ("updatedReplicas", json!(updated), true),
        ("currentRevision", current_revision, true),
        ("updateRevision", json!(rev), true),
        ("collisionCount", json!(0), false),
    ];
    actions.extend(status_patch(Res::StatefulSet, sts, &fields));
    actions
}

pub fn reconcile_daemonset(cache: &Cache, ds: &Value) -> Vec<Action> {
    let (ns, _, uid) = meta(ds);
    let rev = revision(ds);
    let selector = &ds["spec"]["template"]["spec"]["nodeSelector"];
    let deleting = !ds["metadata"]["deletionTimestamp"].is_null();
    let wanted: Vec<&String> = (cache.nodes.iter())
        .filter(|(_, n)| selector.is_null() || selects(selector, &n.labels))
        .map(|(name, _)| name)
        .collect();
    let pods = cache.pods_of(uid);
    let mut on: BTreeMap<&str, Vec<&PodInfo>> = BTreeMap::new();
    for p in pods.iter().filter(|p| p.active()) {
        on.entry(p.node.as_str()).or_default().push(p);
    }
    let mut actions = Vec::new();
    if !deleting {
        for node in &wanted {
            match on.get(node.as_str()).map(Vec::as_slice) {
                None | Some([]) => {
                    let mut body = pod_from_template(
                        Res::DaemonSet,
                        ds,
                        None,
                        &[
                            (REVISION_LABEL, rev.clone()),
                            ("pod-template-generation", generation(ds).to_string()),
                        ],
                    );
                    body["spec"]["nodeName"] = node.as_str().into();
                    actions.push(Action::Create {
                        res: Res::Pod,
                        ns: ns.into(),
                        body,
                    });
                }
                Some([_, extra @ ..]) => {
                    actions.extend(extra.iter().map(|p| delete_pod(&p.namespace, &p.name)));
                }
            }
        }
        // Pods on nodes gone or no longer fitting.
        for (node, ps) in &on {
            if !wanted.iter().any(|w| w.as_str() == *node) {
                actions.extend(ps.iter().map(|p| delete_pod(&p.namespace, &p.name)));
            }
        }
        // One outdated pod at a time, once every other is ready.
        let all_ready = on.values().flatten().all(|p| p.running_ready());
        let on_delete = ds["spec"]["updateStrategy"]["type"] == "OnDelete";
        if actions.is_empty() && all_ready && !on_delete {
            let outdated =
                (on.values().flatten()).find(|p| p.labels.get(REVISION_LABEL) != Some(&json!(rev)));
            if let Some(p) = outdated {
                actions.push(delete_pod(&p.namespace, &p.name));
            }
        }
    }
    let scheduled: Vec<&PodInfo> = on
        .iter()
        .filter(|(n, _)| wanted.iter().any(|w| w.as_str() == **n))
        .filter_map(|(_, ps)| ps.first().copied())
        .collect();
    let ready = scheduled.iter().filter(|p| p.running_ready()).count();
    let updated = scheduled
        .iter()
        .filter(|p| p.labels.get(REVISION_LABEL) == Some(&json!(rev)))
        .count();
    let misscheduled = on
        .keys()
        .filter(|n| !wanted.iter().any(|w| w.as_str() == **n))
        .count();
    let fields = [
        ("currentNumberScheduled", json!(scheduled.len()), false),
        ("numberMisscheduled", json!(misscheduled), false),
        ("desiredNumberScheduled", json!(wanted.len()), false),
        ("numberReady", json!(ready), false),
        ("observedGeneration", json!(generation(ds)), true),
        ("updatedNumberScheduled", json!(updated), true),
        ("numberAvailable", json!(ready), true),
        (
            "numberUnavailable",
            json!(wanted.len() - ready.min(wanted.len())),
            true,
        ),
    ];
    actions.extend(status_patch(Res::DaemonSet, ds, &fields));
    actions
}
