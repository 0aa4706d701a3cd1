//! Kubernetes protobuf request bodies, for what kubectl's typed clients send
//! (`kubectl create configmap|namespace|secret|serviceaccount|role|deployment|job|service`,
//! `kubectl run`): the `k8s\0` envelope (`runtime.Unknown`) and the fields those commands
//! set, turned into the JSON the rest of the simulator works on ([`workloads`] has the
//! kinds beyond ConfigMap, Namespace and Pod). Other kinds get 415, naming the kind.

mod workloads;

use prost::Message;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

const MAGIC: &[u8] = b"k8s\0";

#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", tag = "2")]
    raw: Vec<u8>,
    #[prost(string, tag = "3")]
    content_encoding: String,
}

#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, tag = "1")]
    api_version: String,
    #[prost(string, tag = "2")]
    kind: String,
}

#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    generate_name: String,
    #[prost(string, tag = "3")]
    namespace: String,
    #[prost(string, tag = "6")]
    resource_version: String,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
    #[prost(string, repeated, tag = "14")]
    finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ConfigMap {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, string", tag = "2")]
    data: BTreeMap<String, String>,
    #[prost(btree_map = "string, bytes", tag = "3")]
    binary_data: BTreeMap<String, Vec<u8>>,
    #[prost(bool, optional, tag = "4")]
    immutable: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct Namespace {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<NamespaceSpec>,
}

#[derive(Clone, PartialEq, Message)]
struct NamespaceSpec {
    #[prost(string, repeated, tag = "1")]
    finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Pod {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<PodSpec>,
}

#[derive(Clone, PartialEq, Message)]
struct PodSpec {
    #[prost(message, repeated, tag = "2")]
    containers: Vec<Container>,
    #[prost(string, tag = "3")]
    restart_policy: String,
    #[prost(int64, optional, tag = "4")]
    termination_grace_period_seconds: Option<i64>,
    #[prost(string, tag = "6")]
    dns_policy: String,
    #[prost(btree_map = "string, string", tag = "7")]
    node_selector: BTreeMap<String, String>,
    #[prost(string, tag = "8")]
    service_account_name: String,
    #[prost(string, tag = "10")]
    node_name: String,
    #[prost(string, tag = "19")]
    scheduler_name: String,
}

#[derive(Clone, PartialEq, Message)]
struct Container {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    image: String,
    #[prost(string, repeated, tag = "3")]
    command: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    args: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    ports: Vec<ContainerPort>,
    #[prost(message, repeated, tag = "7")]
    env: Vec<EnvVar>,
    #[prost(message, optional, tag = "8")]
    resources: Option<Resources>,
    #[prost(string, tag = "14")]
    image_pull_policy: String,
    #[prost(bool, tag = "16")]
    stdin: bool,
    #[prost(bool, tag = "18")]
    tty: bool,
}

#[derive(Clone, PartialEq, Message)]
struct ContainerPort {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int32, tag = "3")]
    container_port: i32,
    #[prost(string, tag = "4")]
    protocol: String,
}

#[derive(Clone, PartialEq, Message)]
struct EnvVar {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

#[derive(Clone, PartialEq, Message)]
struct Resources {
    #[prost(btree_map = "string, message", tag = "1")]
    limits: BTreeMap<String, Quantity>,
    #[prost(btree_map = "string, message", tag = "2")]
    requests: BTreeMap<String, Quantity>,
}

#[derive(Clone, PartialEq, Message)]
struct Quantity {
    #[prost(string, tag = "1")]
    string: String,
}

/// Why a protobuf body was not turned into JSON.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    /// Not the Kubernetes envelope, or not valid protobuf (400).
    #[error("the protobuf body could not be decoded: {0}")]
    Malformed(String),
    /// A kind this simulator does not decode from protobuf (415).
    #[error("the simulator decodes protobuf bodies of ConfigMap, Namespace, Pod, Secret, ServiceAccount, Role, Deployment, Job and Service only, not {0:?}; send JSON")]
    Unsupported(String),
}

/// Decodes a `application/vnd.kubernetes.protobuf` body into the object's JSON.
pub fn to_json(body: &[u8]) -> Result<Value, ProtobufError> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| ProtobufError::Malformed("missing the k8s\\0 prefix".into()))?;
    let unknown = Unknown::decode(rest).map_err(|e| ProtobufError::Malformed(e.to_string()))?;
    if !unknown.content_encoding.is_empty() {
        return Err(ProtobufError::Malformed(format!(
            "unsupported content encoding {:?}",
            unknown.content_encoding
        )));
    }
    let tm = unknown.type_meta.unwrap_or_default();
    let bad = |e: prost::DecodeError| ProtobufError::Malformed(e.to_string());
    let mut v = match tm.kind.as_str() {
        "ConfigMap" => {
            let c = ConfigMap::decode(unknown.raw.as_slice()).map_err(bad)?;
            let mut v = json!({"metadata": meta(c.metadata)});
            if !c.data.is_empty() {
                v["data"] = json!(c.data);
            }
            if !c.binary_data.is_empty() {
                v["binaryData"] = base64_values(&c.binary_data);
            }
            if let Some(i) = c.immutable {
                v["immutable"] = i.into();
            }
            v
        }
        "Namespace" => {
            let n = Namespace::decode(unknown.raw.as_slice()).map_err(bad)?;
            let mut v = json!({"metadata": meta(n.metadata)});
            if let Some(s) = n.spec.filter(|s| !s.finalizers.is_empty()) {
                v["spec"] = json!({"finalizers": s.finalizers});
            }
            v
        }
        "Pod" => {
            let p = Pod::decode(unknown.raw.as_slice()).map_err(bad)?;
            json!({"metadata": meta(p.metadata), "spec": pod_spec(p.spec.unwrap_or_default())})
        }
        other => match workloads::decode(other, unknown.raw.as_slice()) {
            Some(v) => v.map_err(bad)?,
            None => return Err(ProtobufError::Unsupported(other.to_string())),
        },
    };
    v["apiVersion"] = tm.api_version.into();
    v["kind"] = tm.kind.into();
    Ok(v)
}

/// Bytes values as JSON carries them: base64 strings.
fn base64_values(m: &BTreeMap<String, Vec<u8>>) -> Value {
    use base64::Engine;
    m.iter()
        .map(|(k, b)| {
            let s = base64::engine::general_purpose::STANDARD.encode(b);
            (k.clone(), Value::String(s))
        })
        .collect::<Map<_, _>>()
        .into()
}

fn put(m: &mut Map<String, Value>, k: &str, v: impl Into<Value>) {
    let v = v.into();
    let empty = match &v {
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Null => true,
        _ => false,
    };
    if !empty {
        m.insert(k.to_string(), v);
    }
}

fn meta(m: Option<ObjectMeta>) -> Value {
    let m = m.unwrap_or_default();
    let mut o = Map::new();
    put(&mut o, "name", m.name);
    put(&mut o, "generateName", m.generate_name);
    put(&mut o, "namespace", m.namespace);
    put(&mut o, "resourceVersion", m.resource_version);
    put(&mut o, "labels", json!(m.labels));
    put(&mut o, "annotations", json!(m.annotations));
    put(&mut o, "finalizers", json!(m.finalizers));
    Value::Object(o)
}

fn pod_spec(s: PodSpec) -> Value {
    let mut o = Map::new();
    let containers: Vec<Value> = s.containers.into_iter().map(container).collect();
    o.insert("containers".into(), Value::Array(containers));
    put(&mut o, "restartPolicy", s.restart_policy);
    if let Some(g) = s.termination_grace_period_seconds {
        o.insert("terminationGracePeriodSeconds".into(), g.into());
    }
    put(&mut o, "dnsPolicy", s.dns_policy);
    put(&mut o, "nodeSelector", json!(s.node_selector));
    put(&mut o, "serviceAccountName", s.service_account_name);
    put(&mut o, "nodeName", s.node_name);
    put(&mut o, "schedulerName", s.scheduler_name);
    Value::Object(o)
}

fn container(c: Container) -> Value {
    let mut o = Map::new();
    put(&mut o, "name", c.name);
    put(&mut o, "image", c.image);
    put(&mut o, "command", json!(c.command));
    put(&mut o, "args", json!(c.args));
    let ports: Vec<Value> = c
        .ports
        .into_iter()
        .map(|p| {
            let mut m = Map::new();
            put(&mut m, "name", p.name);
            m.insert("containerPort".into(), p.container_port.into());
            put(&mut m, "protocol", p.protocol);
            Value::Object(m)
        })
        .collect();
    put(&mut o, "ports", Value::Array(ports));
    let env: Vec<Value> = c
        .env
        .into_iter()
        .map(|e| json!({"name": e.name, "value": e.value}))
        .collect();
    put(&mut o, "env", Value::Array(env));
    let r = c.resources.unwrap_or_default();
    let q = |m: BTreeMap<String, Quantity>| {
        json!(m
            .into_iter()
            .map(|(k, v)| (k, v.string))
            .collect::<BTreeMap<_, _>>())
    };
    o.insert("resources".into(), {
        let mut rm = Map::new();
        put(&mut rm, "limits", q(r.limits));
        put(&mut rm, "requests", q(r.requests));
        Value::Object(rm)
    });
    put(&mut o, "imagePullPolicy", c.image_pull_policy);
    if c.stdin {
        o.insert("stdin".into(), true.into());
    }
    if c.tty {
        o.insert("tty".into(), true.into());
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let u = Unknown {
            type_meta: Some(TypeMeta {
                api_version: "v1".into(),
                kind: kind.into(),
            }),
            raw,
            content_encoding: String::new(),
        };
        let mut out = MAGIC.to_vec();
        out.extend(u.encode_to_vec());
        out
    }

    #[test]
    fn decodes_a_configmap_as_kubectl_sends_it() {
        let cm = ConfigMap {
            metadata: Some(ObjectMeta {
                name: "cfg".into(),
                namespace: "default".into(),
                ..Default::default()
            }),
            data: [("a".to_string(), "b".to_string())].into(),
            ..Default::default()
        };
        let v = to_json(&envelope("ConfigMap", cm.encode_to_vec())).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default"}, "data": {"a": "b"}})
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(matches!(to_json(b"{}"), Err(ProtobufError::Malformed(_))));
        assert!(matches!(
            to_json(b"k8s\0\xff\xff\xff"),
            Err(ProtobufError::Malformed(_))
        ));
        assert!(
            matches!(to_json(&envelope("DaemonSet", vec![])), Err(ProtobufError::Unsupported(k)) if k == "DaemonSet")
        );
    }
}
