//! Objects the simulator starts with: the system namespaces, and on request
//! nodes (with their leases), namespaces and pods that look like a real
//! cluster's — labels, owner references, containers with images, env and
//! resources, status with conditions — padded to a chosen size.

use super::object::Obj;
use super::store::Store;
use crate::sim::clock;
use crate::sim::resources::{self, ResourceDef};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// What to seed.
#[derive(Debug, Clone)]
pub struct SeedSpec {
    pub nodes: usize,
    pub pods: usize,
    pub namespaces: usize,
    pub pod_bytes: usize,
    pub seed: u64,
}

/// The namespaces every cluster has.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

const ALNUM: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn suffix(rng: &mut StdRng, n: usize) -> String {
    (0..n)
        .map(|_| ALNUM[rng.random_range(0..ALNUM.len())] as char)
        .collect()
}

fn uid(rng: &mut StdRng) -> String {
    uuid::Builder::from_random_bytes(rng.random())
        .into_uuid()
        .to_string()
}

/// Where seeded objects go: the memory store, or etcd (see [`super::etcd`]).
pub trait SeedSink {
    /// Stores a batch of one resource's objects; an error stops the seeding.
    fn put(&mut self, def: &'static ResourceDef, values: Vec<Value>) -> Result<(), String>;
}

impl SeedSink for &Store {
    fn put(&mut self, def: &'static ResourceDef, values: Vec<Value>) -> Result<(), String> {
        let base = self.next_revision();
        let objs: Vec<Obj> = values
            .into_iter()
            .enumerate()
            .map(|(i, v)| Obj::new(def, v, base + i as u64))
            .collect();
        self.seed(resources::index_of(def), objs);
        Ok(())
    }
}

struct Seeder<'a> {
    sink: &'a mut dyn SeedSink,
    rng: StdRng,
    now: i64,
    /// The first error the sink reported; later batches are skipped.
    error: Option<String>,
}

impl Seeder<'_> {
    fn put(&mut self, def: &'static ResourceDef, values: Vec<Value>) {
        if self.error.is_none() {
            self.error = self.sink.put(def, values).err();
        }
    }

    fn meta(&mut self, name: &str, namespace: Option<&str>, age_secs: i64) -> Value {
        let mut m = json!({"name": name, "uid": uid(&mut self.rng),
            "creationTimestamp": clock::rfc3339(self.now - age_secs)});
        if let Some(ns) = namespace {
            m["namespace"] = ns.into();
        }
        m
    }
}

/// Seeds the memory store; returns the node names (pods are spread over them).
pub fn seed(store: &Store, spec: &SeedSpec) -> Vec<String> {
    let mut sink = store;
    seed_into(&mut sink, spec).unwrap_or_default()
}

/// Seeds `sink`; returns the node names, or the sink's first error.
pub fn seed_into(sink: &mut dyn SeedSink, spec: &SeedSpec) -> Result<Vec<String>, String> {
    let mut s = Seeder {
        sink,
        rng: StdRng::seed_from_u64(spec.seed),
        now: clock::now_unix(),
        error: None,
    };
    let Some(ns_def) = resources::by_name("namespaces") else {
        return Ok(Vec::new());
    };
    let mut ns_names: Vec<String> = SYSTEM_NAMESPACES.iter().map(|n| n.to_string()).collect();
    let workload_ns: Vec<String> = (1..=spec.namespaces).map(|i| format!("ns-{i}")).collect();
    ns_names.extend(workload_ns.iter().cloned());
    let namespaces: Vec<Value> = ns_names
        .iter()
        .map(|n| {
            let mut meta = s.meta(n, None, 86_400 * 30);
            meta["labels"] = json!({"kubernetes.io/metadata.name": n});
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta,
                   "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
        })
        .collect();
    s.put(ns_def, namespaces);
    // The ServiceAccounts controller's `default` in every namespace (see api::defaults).
    if let Some(def) = resources::by_name("serviceaccounts") {
        let accounts = ns_names
            .iter()
            .map(|n| {
                json!({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": s.meta("default", Some(n), 86_400 * 30)})
            })
            .collect();
        s.put(def, accounts);
    }

    let nodes: Vec<String> = (1..=spec.nodes).map(|i| format!("node-{i}")).collect();
    let node_values: Vec<Value> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| node(&mut s, n, i))
        .collect();
    if let Some(def) = resources::by_name("nodes") {
        s.put(def, node_values);
    }
    let leases: Vec<Value> = nodes.iter().map(|n| lease(&mut s, n)).collect();
    if let Some(def) = resources::by_name("leases") {
        s.put(def, leases);
    }

    let pod_ns = if workload_ns.is_empty() {
        vec!["default".to_string()]
    } else {
        workload_ns
    };
    if let Some(def) = resources::by_name("pods") {
        // In batches, so a large seed does not hold every JSON value at once.
        let mut made = 0;
        while made < spec.pods {
            let n = (spec.pods - made).min(10_000);
            let batch: Vec<Value> = (made..made + n)
                .map(|i| {
                    let node = nodes.get(i % nodes.len().max(1)).map(String::as_str);
                    pod(&mut s, &pod_ns[i % pod_ns.len()], node, i, spec.pod_bytes)
                })
                .collect();
            s.put(def, batch);
            made += n;
        }
    }
    match s.error {
        Some(e) => Err(e),
        None => Ok(nodes),
    }
}

fn node(s: &mut Seeder, name: &str, i: usize) -> Value {
    let mut meta = s.meta(name, None, 86_400 * 7);
    let zone = format!("zone-{}", i % 3);
    meta["labels"] = json!({
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "m5.2xlarge", "topology.kubernetes.io/zone": zone,
        "type": "tollgate-sim"});
    meta["annotations"] = json!({"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"});
    let ts = clock::rfc3339(s.now);
    let cond = |t: &str, st: &str, reason: &str, msg: &str| json!({"type": t, "status": st, "lastHeartbeatTime": ts, "lastTransitionTime": ts, "reason": reason, "message": msg});
    let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    json!({"apiVersion": "v1", "kind": "Node", "metadata": meta,
        "spec": {"podCIDR": format!("10.244.{}.0/24", i % 256), "providerID": format!("sim://{name}")},
        "status": {
            "capacity": {"cpu": "8", "ephemeral-storage": "102350Mi", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "7800m", "ephemeral-storage": "94319Mi", "memory": "31Gi", "pods": "110"},
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status")],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": suffix(&mut s.rng, 32), "systemUUID": uid(&mut s.rng), "bootID": uid(&mut s.rng),
                "kernelVersion": "6.1.0-27-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.34.0",
                "kubeProxyVersion": "v1.34.0", "operatingSystem": "linux", "architecture": "amd64"}}})
}

fn lease(s: &mut Seeder, node: &str) -> Value {
    let meta = s.meta(node, Some("kube-node-lease"), 86_400 * 7);
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                 "renewTime": format!("{}.000000Z", clock::rfc3339(s.now).trim_end_matches('Z'))}})
}

fn pod(s: &mut Seeder, ns: &str, node: Option<&str>, i: usize, target_bytes: usize) -> Value {
    let app = format!("app-{}", i % 97);
    let rs_hash = format!("{:x}", 0x5f00_0000u64 + (i % 97) as u64 * 7919);
    let name = format!("{app}-{rs_hash}-{}", suffix(&mut s.rng, 5));
    let age = s.rng.random_range(600..86_400 * 5);
    let mut meta = s.meta(&name, Some(ns), age);
    meta["generateName"] = format!("{app}-{rs_hash}-").into();
    meta["labels"] = json!({"app": app, "pod-template-hash": rs_hash, "tier": (["web", "api", "worker"][i % 3])});
    meta["annotations"] =
        json!({"kubectl.kubernetes.io/restartedAt": clock::rfc3339(s.now - age - 60)});
    meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-{rs_hash}"),
        "uid": uid(&mut s.rng), "controller": true, "blockOwnerDeletion": true}]);
    let started = clock::rfc3339(s.now - age + 5);
    let ip = format!("10.244.{}.{}", (i >> 8) & 255, i & 255);
    let mut container = json!({"name": "main", "image": format!("registry.example/{app}:v1.{}", i % 13),
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"});
    let cond = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": started});
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"containers": [], "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "schedulerName": "default-scheduler", "priority": 0,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]},
        "status": {"phase": "Running",
            "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": started, "qosClass": "Burstable",
            "containerStatuses": [{"name": "main", "ready": true, "started": true, "restartCount": 0,
                "image": format!("registry.example/{app}:v1.{}", i % 13), "imageID": format!("registry.example/{app}@sha256:{}", suffix(&mut s.rng, 64)),
                "containerID": format!("containerd://{}", suffix(&mut s.rng, 64)), "state": {"running": {"startedAt": started}}}]}});
    if let Some(n) = node {
        pod["spec"]["nodeName"] = n.into();
        pod["status"]["hostIP"] = format!("10.0.{}.{}", (i >> 8) & 255, i & 255).into();
    } else {
        pod["status"]["phase"] = "Pending".into();
    }
    // Small targets drop the least essential parts first; then configuration
    // env vars, as real pods carry, pad up to the target size.
    // Sized once, then kept up to date by subtracting what is dropped (serializing
    // the whole pod again for each step was a third of the seeding time).
    let mut have = json_len(&pod) + json_len(&container);
    let optional: [(&str, &str); 6] = [
        ("metadata", "annotations"),
        ("spec", "tolerations"),
        ("status", "podIPs"),
        ("container", "volumeMounts"),
        ("container", "ports"),
        ("metadata", "generateName"),
    ];
    for (parent, field) in optional {
        if have <= target_bytes {
            break;
        }
        let obj = if parent == "container" {
            container.as_object_mut()
        } else {
            pod[parent].as_object_mut()
        };
        if let Some(removed) = obj.and_then(|o| o.remove(field)) {
            // `"field":value,` (each parent keeps other fields, so a comma goes too).
            have -= field.len() + 3 + json_len(&removed) + 1;
        }
    }
    if let Some(env) = container["env"].as_array_mut() {
        let mut k = 0;
        while have + 60 <= target_bytes {
            let value = suffix(&mut s.rng, 32);
            let e = json!({"name": format!("CONFIG_{k}"), "value": value});
            have += json_len(&e) + 1;
            env.push(e);
            k += 1;
        }
    }
    pod["spec"]["containers"] = json!([container]);
    pod
}

/// The length of `v` as compact JSON, counted without building it.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    let _ = serde_json::to_writer(&mut n, v);
    n.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_realistic_pods_of_the_asked_size_reproducibly() {
        let a = Store::new(resources::slots(), 10);
        let spec = SeedSpec {
            nodes: 3,
            pods: 30,
            namespaces: 2,
            pod_bytes: 2048,
            seed: 7,
        };
        let nodes = seed(&a, &spec);
        assert_eq!(nodes.len(), 3);
        let pods = resources::index_of(resources::by_name("pods").unwrap());
        let (_, map) = a.snapshot(pods);
        assert_eq!(map.len(), 30);
        for (_, o) in map.iter() {
            let len = o.json.len();
            assert!((1900..=2200).contains(&len), "pod of {len} bytes");
            let v = o.value();
            assert!(v["spec"]["nodeName"].as_str().unwrap().starts_with("node-"));
            assert_eq!(v["status"]["conditions"].as_array().unwrap().len(), 5);
        }
        let ns = resources::index_of(resources::by_name("namespaces").unwrap());
        assert_eq!(a.count(ns), SYSTEM_NAMESPACES.len() + 2);
        // Same seed, same names.
        let b = Store::new(resources::slots(), 10);
        seed(&b, &spec);
        let names = |s: &Store| s.snapshot(pods).1.keys().cloned().collect::<Vec<_>>();
        assert_eq!(names(&a), names(&b));
    }
}
