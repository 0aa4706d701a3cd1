//! What kube-apiserver 1.20's registries add to a created object, for the kinds whose
//! clients rely on it: pod templates' defaults (Deployment, ReplicaSet, StatefulSet,
//! DaemonSet, ReplicationController, Job), a Job's selector, a Service's `clusterIP` from
//! the service range, Node and Pod defaults, and `metadata.generation` where the kind tracks
//! it. Anything not here is stored as sent.

use crate::sim::kube_version::KubeVersion;
use crate::sim::resources::ResourceDef;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// Inserts `v` under `k` unless the object has it.
fn or_insert(m: &mut Map<String, Value>, k: &str, v: Value) {
    m.entry(k).or_insert(v);
}

/// The objects of `m`'s `ports` list (a container's or a Service's).
fn ports(m: &mut Map<String, Value>) -> impl Iterator<Item = &mut Map<String, Value>> {
    m.get_mut("ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn obj<'a>(v: &'a mut Value, k: &str) -> Option<&'a mut Map<String, Value>> {
    let m = v.as_object_mut()?;
    m.entry(k).or_insert_with(|| json!({})).as_object_mut()
}

/// The defaults of a `PodSpec` (SetDefaults_PodSpec, SetDefaults_Container).
pub fn pod_spec(spec: &mut Value) {
    let Some(s) = spec.as_object_mut() else {
        return;
    };
    or_insert(s, "restartPolicy", "Always".into());
    or_insert(s, "terminationGracePeriodSeconds", 30.into());
    or_insert(s, "dnsPolicy", "ClusterFirst".into());
    or_insert(s, "securityContext", json!({}));
    or_insert(s, "schedulerName", "default-scheduler".into());
    for list in ["initContainers", "containers"] {
        for c in s
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(c) = c.as_object_mut() else { continue };
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            // `:latest` or no tag pulls always (the last `:` after the last `/` is a tag).
            let tagged = image
                .rsplit('/')
                .next()
                .is_some_and(|last| last.contains(':') && !last.ends_with(":latest"))
                || image.contains('@');
            let policy = if tagged { "IfNotPresent" } else { "Always" };
            or_insert(c, "imagePullPolicy", policy.into());
            or_insert(c, "resources", json!({}));
            or_insert(c, "terminationMessagePath", "/dev/termination-log".into());
            or_insert(c, "terminationMessagePolicy", "File".into());
            for p in ports(c) {
                or_insert(p, "protocol", "TCP".into());
            }
        }
    }
}

/// A pod template: on 1.20 `metadata.creationTimestamp: null` (its Go encoder writes the
/// zero time so; the current release leaves it out, and drops one a client sent), and the
/// pod spec's defaults.
fn template(spec: &mut Map<String, Value>, kube: KubeVersion) {
    let Some(t) = spec.get_mut("template") else {
        return;
    };
    if let Some(m) = obj(t, "metadata") {
        match kube {
            KubeVersion::V1_20 => or_insert(m, "creationTimestamp", Value::Null),
            KubeVersion::V1_37 => {
                if m.get("creationTimestamp").is_some_and(Value::is_null) {
                    m.remove("creationTimestamp");
                }
            }
        }
    }
    if let Some(s) = t.get_mut("spec") {
        pod_spec(s);
    }
}

/// The workload kinds' defaults; `uid` is the new object's (a Job's selector names it).
pub fn workload(def: &ResourceDef, v: &mut Value, uid: &str, kube: KubeVersion) {
    match (def.group, def.name) {
        ("apps", "deployments") => {
            if let Some(s) = obj(v, "spec") {
                or_insert(s, "replicas", 1.into());
                or_insert(s, "revisionHistoryLimit", 10.into());
                or_insert(s, "progressDeadlineSeconds", 600.into());
                or_insert(
                    s,
                    "strategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}),
                );
                template(s, kube);
            }
            or_status(v, json!({}));
        }
        ("apps", "statefulsets") => {
            if let Some(s) = obj(v, "spec") {
                or_insert(s, "replicas", 1.into());
                or_insert(s, "revisionHistoryLimit", 10.into());
                or_insert(s, "podManagementPolicy", "OrderedReady".into());
                or_insert(
                    s,
                    "updateStrategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
                );
                template(s, kube);
            }
            or_status(v, json!({"replicas": 0}));
        }
        ("apps", "replicasets") | ("", "replicationcontrollers") => {
            let rc = def.name == "replicationcontrollers";
            let labels = v["spec"]["template"]["metadata"]["labels"].clone();
            if let Some(s) = obj(v, "spec") {
                or_insert(s, "replicas", 1.into());
                if rc && labels.is_object() {
                    or_insert(s, "selector", labels.clone());
                }
                template(s, kube);
            }
            if rc && v["metadata"]["labels"].is_null() && labels.is_object() {
                v["metadata"]["labels"] = labels;
            }
            or_status(v, json!({"replicas": 0}));
        }
        ("apps", "daemonsets") => {
            if let Some(s) = obj(v, "spec") {
                or_insert(s, "revisionHistoryLimit", 10.into());
                or_insert(
                    s,
                    "updateStrategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}),
                );
                template(s, kube);
            }
            or_status(
                v,
                json!({"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0, "numberReady": 0}),
            );
        }
        ("batch", "jobs") => job(v, uid, kube),
        ("", "secrets") => secret(v),
        _ => {}
    }
}

/// A Secret: `stringData` is write-only, folded into `data` (base64); `type` defaults to
/// `Opaque`.
pub fn secret(v: &mut Value) {
    use base64::Engine;
    let Some(m) = v.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(strings)) = m.remove("stringData") {
        let data = m.entry("data").or_insert_with(|| json!({}));
        if let Some(data) = data.as_object_mut() {
            for (k, s) in strings {
                let s = s.as_str().unwrap_or_default().to_string();
                data.insert(
                    k,
                    base64::engine::general_purpose::STANDARD.encode(s).into(),
                );
            }
        }
    }
    or_insert(m, "type", "Opaque".into());
}

fn or_status(v: &mut Value, status: Value) {
    if let Some(m) = v.as_object_mut() {
        m.entry("status").or_insert(status);
    }
}

/// A Job: the `controller-uid`/`job-name` labels and selector the registry generates
/// (unless `manualSelector`), completions, parallelism and backoffLimit.
fn job(v: &mut Value, uid: &str, kube: KubeVersion) {
    let name = v["metadata"]["name"].clone();
    let manual = v["spec"]["manualSelector"].as_bool() == Some(true);
    if !manual {
        if let Some(t) = v["spec"].get_mut("template") {
            if let Some(m) = obj(t, "metadata") {
                if let Some(l) = m
                    .entry("labels")
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                {
                    l.insert("controller-uid".into(), uid.into());
                    l.insert("job-name".into(), name.clone());
                }
            }
        }
        if let Some(m) = obj(v, "metadata") {
            if let Some(l) = m
                .entry("labels")
                .or_insert_with(|| json!({}))
                .as_object_mut()
            {
                l.entry("controller-uid").or_insert(uid.into());
                l.entry("job-name").or_insert(name);
            }
        }
        if let Some(s) = obj(v, "spec") {
            s.insert(
                "selector".into(),
                json!({"matchLabels": {"controller-uid": uid}}),
            );
        }
    }
    if let Some(s) = obj(v, "spec") {
        or_insert(s, "completions", 1.into());
        or_insert(s, "parallelism", 1.into());
        or_insert(s, "backoffLimit", 6.into());
        template(s, kube);
    }
    or_status(v, json!({}));
}

/// Service ClusterIPs, allocated from a range as kube-apiserver's allocator does.
pub struct ClusterIps {
    base: u32,
    size: u32,
    state: Mutex<IpState>,
}

struct IpState {
    next: u32,
    /// Offsets in use: bounded by the range's size.
    used: HashSet<u32>,
}

impl ClusterIps {
    /// The range `base/prefix` (kubeadm's default is 10.96.0.0/12); its first address is
    /// the `kubernetes` Service's and never handed out.
    pub fn new(base: Ipv4Addr, prefix: u8) -> ClusterIps {
        let size = 1u32 << (32 - u32::from(prefix.clamp(8, 30)));
        ClusterIps {
            base: u32::from(base) & !(size - 1),
            size,
            state: Mutex::new(IpState {
                next: 2,
                used: HashSet::new(),
            }),
        }
    }

    /// A free address, or `None` when the range is full.
    pub fn allocate(&self) -> Option<String> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Offsets 0 (network), 1 (the kubernetes Service) and the last (broadcast) are never given.
        let usable = self.size.saturating_sub(3);
        for _ in 0..usable {
            let off = s.next;
            s.next = if off + 1 >= self.size - 1 { 2 } else { off + 1 };
            if s.used.insert(off) {
                return Some(Ipv4Addr::from(self.base + off).to_string());
            }
        }
        None
    }

    /// Takes an address a client asked for; false if it is outside the range or taken.
    pub fn claim(&self, ip: &str) -> bool {
        let Some(off) = self.offset(ip) else {
            return false;
        };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.used.insert(off)
    }

    /// Gives an address back (its Service is deleted).
    pub fn release(&self, ip: &str) {
        if let Some(off) = self.offset(ip) {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            s.used.remove(&off);
        }
    }

    /// Gives a deleted object's address back if it is a Service with one.
    pub fn release_service(&self, def: &ResourceDef, v: &Value) {
        if def.group.is_empty() && def.name == "services" {
            if let Some(ip) = service_ip(v) {
                self.release(ip);
            }
        }
    }

    fn offset(&self, ip: &str) -> Option<u32> {
        let ip = u32::from(ip.parse::<Ipv4Addr>().ok()?);
        let off = ip.checked_sub(self.base)?;
        (off > 1 && off < self.size - 1).then_some(off)
    }
}

/// A Service's defaults and its ClusterIP (`None` kept for headless Services; no address
/// for `ExternalName`). Errors are the registry's messages.
pub fn service(v: &mut Value, ips: &ClusterIps) -> Result<(), String> {
    let Some(s) = obj(v, "spec") else {
        return Ok(());
    };
    or_insert(s, "type", "ClusterIP".into());
    or_insert(s, "sessionAffinity", "None".into());
    for p in ports(s) {
        or_insert(p, "protocol", "TCP".into());
        if let Some(port) = p.get("port").cloned() {
            or_insert(p, "targetPort", port);
        }
    }
    let external_name = s.get("type").and_then(Value::as_str) == Some("ExternalName");
    if !external_name {
        let asked = s
            .get("clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let ip = match asked.as_str() {
            "" => ips
                .allocate()
                .ok_or("spec.clusterIP: Internal error: range is full")?,
            "None" => asked,
            ip if ips.claim(ip) => asked.clone(),
            ip => {
                return Err(format!(
                    "spec.clusterIP: Invalid value: {ip:?}: provided IP is already allocated or not in the valid range"
                ))
            }
        };
        s.insert("clusterIPs".into(), json!([ip]));
        s.insert("clusterIP".into(), ip.into());
    }
    or_status(v, json!({"loadBalancer": {}}));
    Ok(())
}

/// The Service's allocated address, to give back when it is deleted.
pub fn service_ip(v: &Value) -> Option<&str> {
    v["spec"]["clusterIP"].as_str().filter(|ip| *ip != "None")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ips_come_from_the_range_once_each() {
        let ips = ClusterIps::new(Ipv4Addr::new(10, 96, 0, 0), 12);
        let a = ips.allocate().expect("an address");
        assert_eq!(a, "10.96.0.2");
        assert!(!ips.claim(&a), "taken");
        assert!(ips.claim("10.100.1.1"));
        assert!(!ips.claim("10.112.0.5"), "outside 10.96.0.0/12");
        ips.release(&a);
        assert!(ips.claim(&a));
        let small = ClusterIps::new(Ipv4Addr::new(10, 0, 0, 0), 30);
        assert_eq!(small.allocate().as_deref(), Some("10.0.0.2"));
        assert_eq!(small.allocate(), None, "a /30 has one usable address");
    }

    #[test]
    fn services_keep_headless_and_get_an_address_otherwise() {
        let ips = ClusterIps::new(Ipv4Addr::new(10, 96, 0, 0), 12);
        let mut svc = json!({"spec": {"ports": [{"port": 80}]}});
        service(&mut svc, &ips).expect("allocated");
        assert_eq!(svc["spec"]["clusterIP"], "10.96.0.2");
        assert_eq!(svc["spec"]["clusterIPs"], json!(["10.96.0.2"]));
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        let mut headless = json!({"spec": {"clusterIP": "None"}});
        service(&mut headless, &ips).expect("headless");
        assert_eq!(headless["spec"]["clusterIP"], "None");
        assert_eq!(service_ip(&headless), None);
    }

    #[test]
    fn images_without_a_tag_pull_always() {
        let mut spec = json!({"containers": [{"name": "a", "image": "nginx"},
            {"name": "b", "image": "registry:5000/x:1.2"}, {"name": "c", "image": "x:latest"}]});
        pod_spec(&mut spec);
        let p: Vec<&str> = spec["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["imagePullPolicy"].as_str())
            .collect();
        assert_eq!(p, ["Always", "IfNotPresent", "Always"]);
        assert_eq!(spec["dnsPolicy"], "ClusterFirst");
    }
}
