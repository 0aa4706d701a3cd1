//! The fields kube-apiserver always writes because its Go types have no `omitempty` on
//! them (1.20's `k8s.io/api/core/v1`), filled into what is stored so a client reads what
//! the real apiserver would send: a pod's container statuses (`name`, `state`, `lastState`,
//! `ready`, `restartCount`, `image`, `imageID`; `state` and `lastState` are structs, which
//! encoding/json never omits, so `{}` at least; `startedAt`, `finishedAt` are `metav1.Time`,
//! written `null` when zero; a terminated state's `exitCode`) and its conditions
//! (`lastProbeTime`, `lastTransitionTime`: `null` when zero). Writers that leave them out
//! (kwok's Stages send no `imageID`) would otherwise give clients objects they refuse: the
//! Python client's models reject a container status without `imageID`.

use serde_json::{Map, Value};

fn or_insert(m: &mut Map<String, Value>, k: &str, v: Value) {
    m.entry(k).or_insert(v);
}

/// A `ContainerState` (`running`, `waiting`, `terminated`).
fn container_state(state: &mut Value) {
    let Some(s) = state.as_object_mut() else {
        *state = Value::Object(Map::new());
        return;
    };
    if let Some(r) = s.get_mut("running").and_then(Value::as_object_mut) {
        or_insert(r, "startedAt", Value::Null);
    }
    if let Some(t) = s.get_mut("terminated").and_then(Value::as_object_mut) {
        or_insert(t, "exitCode", 0.into());
        or_insert(t, "startedAt", Value::Null);
        or_insert(t, "finishedAt", Value::Null);
    }
}

/// One `ContainerStatus`.
fn container_status(c: &mut Value) {
    let Some(m) = c.as_object_mut() else {
        return;
    };
    or_insert(m, "name", "".into());
    for k in ["state", "lastState"] {
        container_state(m.entry(k).or_insert_with(|| Value::Object(Map::new())));
    }
    or_insert(m, "ready", false.into());
    or_insert(m, "restartCount", 0.into());
    or_insert(m, "image", "".into());
    or_insert(m, "imageID", "".into());
}

/// A pod's `status`, as 1.20 serializes it.
pub fn pod_status(pod: &mut Value) {
    let Some(status) = pod.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    for list in [
        "containerStatuses",
        "initContainerStatuses",
        "ephemeralContainerStatuses",
    ] {
        for c in (status.get_mut(list).and_then(Value::as_array_mut))
            .into_iter()
            .flatten()
        {
            container_status(c);
        }
    }
    for c in (status.get_mut("conditions").and_then(Value::as_array_mut))
        .into_iter()
        .flatten()
    {
        if let Some(m) = c.as_object_mut() {
            or_insert(m, "lastProbeTime", Value::Null);
            or_insert(m, "lastTransitionTime", Value::Null);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_kwok_writes_gets_what_go_always_serializes() {
        // kwok's pod-ready Stage: no imageID, no lastState, conditions without lastProbeTime.
        let mut pod = json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "t"}],
            "containerStatuses": [{"image": "i", "name": "c", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "t"}}}],
            "initContainerStatuses": [{"image": "j", "name": "init", "ready": true,
                "state": {"terminated": {"reason": "Completed", "finishedAt": "t"}}}]}});
        pod_status(&mut pod);
        assert_eq!(
            pod["status"]["containerStatuses"][0],
            json!({"image": "i", "imageID": "", "name": "c", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "t"}}, "lastState": {}})
        );
        assert_eq!(
            pod["status"]["initContainerStatuses"][0]["state"]["terminated"],
            json!({"reason": "Completed", "finishedAt": "t", "exitCode": 0, "startedAt": null})
        );
        assert_eq!(pod["status"]["initContainerStatuses"][0]["restartCount"], 0);
        assert_eq!(
            pod["status"]["conditions"][0],
            json!({"type": "Ready", "status": "True", "lastTransitionTime": "t", "lastProbeTime": null})
        );
        // Nothing else is added: a pending pod's status stays as it is.
        let mut pending = json!({"status": {"phase": "Pending", "qosClass": "BestEffort"}});
        pod_status(&mut pending);
        assert_eq!(
            pending,
            json!({"status": {"phase": "Pending", "qosClass": "BestEffort"}})
        );
    }
}
