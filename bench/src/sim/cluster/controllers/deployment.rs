//! Deployments: one ReplicaSet per pod template (named `DEPLOYMENT-HASH`, its pods labelled
//! `pod-template-hash`), scaled as the deployment controller scales them: `RollingUpdate`
//! brings the new ReplicaSet up within `maxSurge` pods over the desired count and the old
//! ones down while at least `replicas - maxUnavailable` pods are available; `Recreate` scales
//! the old ones to 0 first. The status (`replicas`, `updatedReplicas`, `readyReplicas`,
//! `availableReplicas`, `unavailableReplicas`, `observedGeneration`, the `Available` and
//! `Progressing` conditions) is what `kubectl rollout status` reads.
//! Not done: `revisionHistoryLimit` (old ReplicaSets are kept), `minReadySeconds`, pausing,
//! rollback and the progress deadline.

use super::cache::{Cache, Res};
use super::common::{
    condition, generation, int_or_percent, meta, object_key, owner_ref, replicas, scale,
    status_patch, template_hash, Action,
};
use serde_json::{json, Value};

const HASH_LABEL: &str = "pod-template-hash";
const REVISION: &str = "deployment.kubernetes.io/revision";

fn status_i64(v: &Value, k: &str) -> i64 {
    v["status"][k].as_i64().unwrap_or(0)
}

fn revision(rs: &Value) -> i64 {
    rs["metadata"]["annotations"][REVISION]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The new ReplicaSet of `d` (template hash `h`), as the deployment controller creates it.
fn new_replica_set(d: &Value, h: &str, revision: i64, start: i64) -> Value {
    let (ns, name, _) = meta(d);
    let mut template = d["spec"]["template"].clone();
    template["metadata"]["labels"][HASH_LABEL] = h.into();
    let mut selector = d["spec"]["selector"].clone();
    selector["matchLabels"][HASH_LABEL] = h.into();
    let mut labels = d["spec"]["template"]["metadata"]["labels"].clone();
    labels[HASH_LABEL] = h.into();
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": format!("{name}-{h}"), "namespace": ns, "labels": labels,
            "annotations": {REVISION: revision.to_string(),
                "deployment.kubernetes.io/desired-replicas": replicas(d).to_string(),
                "deployment.kubernetes.io/max-replicas": (replicas(d) + max_surge(d)).to_string()},
            "ownerReferences": [owner_ref(Res::Deployment, d)]},
        "spec": {"replicas": start, "selector": selector, "template": template}})
}

fn max_surge(d: &Value) -> i64 {
    let ru = &d["spec"]["strategy"]["rollingUpdate"];
    int_or_percent(&ru["maxSurge"], replicas(d), true, 0)
}

fn max_unavailable(d: &Value) -> i64 {
    let ru = &d["spec"]["strategy"]["rollingUpdate"];
    let u = int_or_percent(&ru["maxUnavailable"], replicas(d), false, 0);
    // Both 0 would never move: the API refuses it, the controller takes 1.
    if u == 0 && max_surge(d) == 0 {
        1
    } else {
        u
    }
}

pub fn reconcile(cache: &Cache, d: &Value) -> Vec<Action> {
    let (ns, _, uid) = meta(d);
    let h = template_hash(&d["spec"]["template"], HASH_LABEL);
    let mut owned: Vec<&Value> = cache
        .dependents(Res::ReplicaSet, uid)
        .into_iter()
        .filter(|rs| rs["metadata"]["namespace"] == ns)
        .collect();
    owned.sort_by_key(|rs| object_key(rs));
    let new_rs = owned
        .iter()
        .copied()
        .find(|rs| rs["spec"]["template"]["metadata"]["labels"][HASH_LABEL] == h.as_str());
    let old: Vec<&Value> = owned
        .iter()
        .copied()
        .filter(|rs| rs["spec"]["template"]["metadata"]["labels"][HASH_LABEL] != h.as_str())
        .collect();
    let want = replicas(d);
    let recreate = d["spec"]["strategy"]["type"] == "Recreate";
    let deleting = !d["metadata"]["deletionTimestamp"].is_null();
    let paused = d["spec"]["paused"].as_bool() == Some(true);
    let mut actions = Vec::new();
    let old_total: i64 = old.iter().map(|rs| replicas(rs)).sum();
    let old_pods: i64 = old.iter().map(|rs| status_i64(rs, "replicas")).sum();
    if !deleting && !paused {
        match new_rs {
            None => {
                let rev = owned.iter().map(|rs| revision(rs)).max().unwrap_or(0) + 1;
                let start = if recreate {
                    if old_pods > 0 || old_total > 0 {
                        0
                    } else {
                        want
                    }
                } else {
                    (want + max_surge(d) - old_total).clamp(0, want)
                };
                actions.push(Action::Create {
                    res: Res::ReplicaSet,
                    ns: ns.into(),
                    body: new_replica_set(d, &h, rev, start),
                });
            }
            Some(new) => {
                let cur = replicas(new);
                let target = if recreate {
                    if old_pods > 0 || old_total > 0 {
                        0
                    } else {
                        want
                    }
                } else if cur > want || old.is_empty() {
                    want
                } else {
                    (want + max_surge(d) - old_total).clamp(cur, want)
                };
                actions.extend(scale(Res::ReplicaSet, new, target));
            }
        }
        // Old ReplicaSets down, oldest first, as far as availability allows.
        let mut can_remove = if recreate {
            i64::MAX
        } else {
            let available: i64 = owned
                .iter()
                .map(|rs| status_i64(rs, "availableReplicas"))
                .sum();
            let unavailable_old: i64 = old
                .iter()
                .map(|rs| replicas(rs) - status_i64(rs, "availableReplicas"))
                .map(|n| n.max(0))
                .sum();
            (available - (want - max_unavailable(d))).max(0) + unavailable_old
        };
        let mut by_age = old.clone();
        by_age.sort_by_key(|rs| revision(rs));
        for rs in by_age {
            let cur = replicas(rs);
            let down = cur.min(can_remove);
            if down > 0 {
                can_remove -= down;
                actions.extend(scale(Res::ReplicaSet, rs, cur - down));
            }
        }
    }
    // Status, from what the ReplicaSets report.
    let sum = |k: &str| owned.iter().map(|rs| status_i64(rs, k)).sum::<i64>();
    let updated = new_rs.map_or(0, |rs| status_i64(rs, "replicas"));
    let available = sum("availableReplicas");
    let min_available = want - max_unavailable(d);
    let status = &d["status"];
    let done = updated == want && sum("replicas") == want && available >= want;
    let rs_name = format!("{}-{h}", meta(d).1);
    let progressing = if done {
        (
            "NewReplicaSetAvailable",
            format!("ReplicaSet {rs_name:?} has successfully progressed."),
        )
    } else if new_rs.is_none() {
        (
            "NewReplicaSetCreated",
            format!("Created new replica set {rs_name:?}"),
        )
    } else {
        (
            "ReplicaSetUpdated",
            format!("ReplicaSet {rs_name:?} is progressing."),
        )
    };
    let avail = if available >= min_available {
        (
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
        )
    } else {
        (
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
        )
    };
    let conditions = json!([
        condition(
            status,
            "Available",
            available >= min_available,
            avail.0,
            avail.1
        ),
        condition(status, "Progressing", true, progressing.0, &progressing.1),
    ]);
    let fields = [
        ("observedGeneration", json!(generation(d)), true),
        ("replicas", json!(sum("replicas")), true),
        ("updatedReplicas", json!(updated), true),
        ("readyReplicas", json!(sum("readyReplicas")), true),
        ("availableReplicas", json!(available), true),
        (
            "unavailableReplicas",
            json!((want - available).max(0)),
            true,
        ),
        ("conditions", conditions, true),
    ];
    actions.extend(status_patch(Res::Deployment, d, &fields));
    actions
}
