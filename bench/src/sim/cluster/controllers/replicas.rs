//! ReplicaSets and ReplicationControllers (keep `spec.replicas` pods), and Jobs (run pods to
//! `completions`, `parallelism` at a time). Pods are counted by their controller owner
//! reference; pods another controller made are not adopted, and none is orphaned.

use super::cache::{Cache, PodInfo, Res};
use super::common::{
    condition, delete_pod, generation, meta, pod_from_template, replicas, status_patch, Action,
};
use crate::sim::clock;
use serde_json::{json, Value};

/// Pods created or deleted by one reconcile, at most (the rest at the next: a burst of
/// 3,000 replicas is sent in slices, as the ReplicaSet controller's slow start does).
pub const BURST: i64 = 500;

/// The order pods are given up in when scaling down: unscheduled, then pending, then not
/// ready, then the newest (ReplicaSet's `ActivePods` ordering, in short).
fn deletion_rank(p: &PodInfo) -> (bool, bool, bool, std::cmp::Reverse<String>) {
    (
        !p.node.is_empty(),
        p.phase != "Pending",
        p.ready,
        std::cmp::Reverse(p.created.clone()),
    )
}

pub fn reconcile_replicas(cache: &Cache, res: Res, owner: &Value) -> Vec<Action> {
    let (ns, _, uid) = meta(owner);
    let mut actions = Vec::new();
    let pods = cache.pods_of(uid);
    let mut active: Vec<&PodInfo> = pods.iter().copied().filter(|p| p.active()).collect();
    let want = replicas(owner);
    let have = active.len() as i64;
    if owner["metadata"]["deletionTimestamp"].is_null() {
        if have < want {
            for _ in 0..(want - have).min(BURST) {
                actions.push(Action::Create {
                    res: Res::Pod,
                    ns: ns.into(),
                    body: pod_from_template(res, owner, None, &[]),
                });
            }
        } else if have > want {
            active.sort_by_key(|p| deletion_rank(p));
            for p in active.iter().take((have - want).min(BURST) as usize) {
                actions.push(delete_pod(&p.namespace, &p.name));
            }
        }
    }
    let ready = active.iter().filter(|p| p.running_ready()).count() as i64;
    let labeled = active.len() as i64;
    let fields = [
        ("replicas", json!(labeled), false),
        ("fullyLabeledReplicas", json!(labeled), true),
        ("readyReplicas", json!(ready), true),
        ("availableReplicas", json!(ready), true),
        ("observedGeneration", json!(generation(owner)), true),
    ];
    actions.extend(status_patch(res, owner, &fields));
    actions
}

pub fn reconcile_job(cache: &Cache, job: &Value) -> Vec<Action> {
    let (ns, _, uid) = meta(job);
    let pods = cache.pods_of(uid);
    let succeeded = pods.iter().filter(|p| p.phase == "Succeeded").count() as i64;
    let failed = pods.iter().filter(|p| p.phase == "Failed").count() as i64;
    let mut active: Vec<&PodInfo> = pods.iter().copied().filter(|p| p.active()).collect();
    let spec = &job["spec"];
    let parallelism = spec["parallelism"].as_i64().unwrap_or(1).max(0);
    let completions = spec["completions"].as_i64();
    let backoff_limit = spec["backoffLimit"].as_i64().unwrap_or(6);
    let status = &job["status"];
    let finished = (status["conditions"].as_array().into_iter().flatten()).any(|c| {
        matches!(c["type"].as_str(), Some("Complete" | "Failed")) && c["status"] == "True"
    });
    let complete = match completions {
        Some(c) => succeeded >= c,
        None => succeeded > 0 && active.is_empty(),
    };
    let over_backoff = failed > backoff_limit;
    let suspended = !job["metadata"]["deletionTimestamp"].is_null();
    let mut actions = Vec::new();
    let want = if finished || complete || over_backoff || suspended {
        0
    } else {
        match completions {
            Some(c) => parallelism.min(c - succeeded).max(0),
            None if succeeded > 0 => 0,
            None => parallelism,
        }
    };
    let have = active.len() as i64;
    if have < want && !suspended {
        for _ in 0..(want - have).min(BURST) {
            actions.push(Action::Create {
                res: Res::Pod,
                ns: ns.into(),
                body: pod_from_template(Res::Job, job, None, &[]),
            });
        }
    } else if have > want && (over_backoff || !complete) {
        active.sort_by_key(|p| deletion_rank(p));
        for p in active.iter().take((have - want).min(BURST) as usize) {
            actions.push(delete_pod(&p.namespace, &p.name));
        }
    }
    let now = clock::rfc3339(clock::now_unix());
    let start = status["startTime"]
        .as_str()
        .map_or(json!(now), |s| json!(s));
    let mut conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    let mut completion_time = status["completionTime"].clone();
    if !finished && complete {
        conditions.push(strip_update(condition(status, "Complete", true, "", "")));
        completion_time = json!(now);
    } else if !finished && over_backoff {
        conditions.push(strip_update(condition(
            status,
            "Failed",
            true,
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        )));
    }
    let fields = [
        ("startTime", start, true),
        ("active", json!(have), true),
        ("succeeded", json!(succeeded), true),
        ("failed", json!(failed), true),
        ("conditions", Value::Array(conditions), true),
        ("completionTime", completion_time, true),
    ];
    actions.extend(status_patch(Res::Job, job, &fields));
    actions
}

/// A Job's condition carries `lastProbeTime` where others carry `lastUpdateTime`, and no
/// empty reason or message (both `omitempty`).
fn strip_update(mut c: Value) -> Value {
    if let Some(m) = c.as_object_mut() {
        if let Some(t) = m.remove("lastUpdateTime") {
            m.insert("lastProbeTime".into(), t);
        }
        m.retain(|_, v| v != "");
    }
    c
}
