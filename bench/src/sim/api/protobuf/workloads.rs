//! The protobuf bodies `kubectl create secret|serviceaccount|role|deployment|job|service`
//! send: the fields those commands set, as JSON.

use super::{base64_values, meta, pod_spec, put, ObjectMeta, PodSpec};
use prost::Message;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

#[derive(Clone, PartialEq, Message)]
pub(super) struct Secret {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, bytes", tag = "2")]
    data: BTreeMap<String, Vec<u8>>,
    #[prost(string, tag = "3")]
    r#type: String,
    #[prost(btree_map = "string, string", tag = "4")]
    string_data: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct ServiceAccount {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct Role {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, repeated, tag = "2")]
    rules: Vec<PolicyRule>,
}

#[derive(Clone, PartialEq, Message)]
struct PolicyRule {
    #[prost(string, repeated, tag = "1")]
    verbs: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    api_groups: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    resources: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    resource_names: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    non_resource_urls: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct LabelSelector {
    #[prost(btree_map = "string, string", tag = "1")]
    match_labels: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
struct PodTemplateSpec {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<PodSpec>,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct Deployment {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<DeploymentSpec>,
}

#[derive(Clone, PartialEq, Message)]
struct DeploymentSpec {
    #[prost(int32, optional, tag = "1")]
    replicas: Option<i32>,
    #[prost(message, optional, tag = "2")]
    selector: Option<LabelSelector>,
    #[prost(message, optional, tag = "3")]
    template: Option<PodTemplateSpec>,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct Job {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<JobSpec>,
}

#[derive(Clone, PartialEq, Message)]
struct JobSpec {
    #[prost(int32, optional, tag = "1")]
    parallelism: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    completions: Option<i32>,
    #[prost(message, optional, tag = "6")]
    template: Option<PodTemplateSpec>,
    #[prost(int32, optional, tag = "7")]
    backoff_limit: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct Service {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<ServiceSpec>,
}

#[derive(Clone, PartialEq, Message)]
struct ServiceSpec {
    #[prost(message, repeated, tag = "1")]
    ports: Vec<ServicePort>,
    #[prost(btree_map = "string, string", tag = "2")]
    selector: BTreeMap<String, String>,
    #[prost(string, tag = "3")]
    cluster_ip: String,
    #[prost(string, tag = "4")]
    r#type: String,
    #[prost(string, tag = "10")]
    external_name: String,
}

#[derive(Clone, PartialEq, Message)]
struct ServicePort {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    protocol: String,
    #[prost(int32, tag = "3")]
    port: i32,
    #[prost(message, optional, tag = "4")]
    target_port: Option<IntOrString>,
    #[prost(int32, tag = "5")]
    node_port: i32,
}

#[derive(Clone, PartialEq, Message)]
struct IntOrString {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int32, tag = "2")]
    int_val: i32,
    #[prost(string, tag = "3")]
    str_val: String,
}

fn template(t: Option<PodTemplateSpec>) -> Value {
    let t = t.unwrap_or_default();
    json!({"metadata": meta(t.metadata), "spec": pod_spec(t.spec.unwrap_or_default())})
}

/// The JSON of a `kind` body, or `None` for kinds decoded elsewhere (or not at all).
pub(super) fn decode(kind: &str, raw: &[u8]) -> Option<Result<Value, prost::DecodeError>> {
    Some(match kind {
        "Secret" => Secret::decode(raw).map(|s| {
            let mut o = Map::new();
            o.insert("metadata".into(), meta(s.metadata));
            put(&mut o, "data", base64_values(&s.data));
            put(&mut o, "stringData", json!(s.string_data));
            put(&mut o, "type", s.r#type);
            Value::Object(o)
        }),
        "ServiceAccount" => {
            ServiceAccount::decode(raw).map(|s| json!({"metadata": meta(s.metadata)}))
        }
        "Role" => Role::decode(raw).map(|r| {
            let rules: Vec<Value> = r
                .rules
                .into_iter()
                .map(|p| {
                    let mut o = Map::new();
                    put(&mut o, "verbs", json!(p.verbs));
                    // An empty apiGroups entry is the core group: kept.
                    if !p.api_groups.is_empty() {
                        o.insert("apiGroups".into(), json!(p.api_groups));
                    }
                    put(&mut o, "resources", json!(p.resources));
                    put(&mut o, "resourceNames", json!(p.resource_names));
                    put(&mut o, "nonResourceURLs", json!(p.non_resource_urls));
                    Value::Object(o)
                })
                .collect();
            json!({"metadata": meta(r.metadata), "rules": rules})
        }),
        "Deployment" => Deployment::decode(raw).map(|d| {
            let s = d.spec.unwrap_or_default();
            let mut spec = Map::new();
            if let Some(r) = s.replicas {
                spec.insert("replicas".into(), r.into());
            }
            if let Some(sel) = s.selector {
                spec.insert("selector".into(), json!({"matchLabels": sel.match_labels}));
            }
            spec.insert("template".into(), template(s.template));
            json!({"metadata": meta(d.metadata), "spec": spec})
        }),
        "Job" => Job::decode(raw).map(|j| {
            let s = j.spec.unwrap_or_default();
            let mut spec = Map::new();
            for (k, v) in [
                ("parallelism", s.parallelism),
                ("completions", s.completions),
                ("backoffLimit", s.backoff_limit),
            ] {
                if let Some(v) = v {
                    spec.insert(k.into(), v.into());
                }
            }
            spec.insert("template".into(), template(s.template));
            json!({"metadata": meta(j.metadata), "spec": spec})
        }),
        "Service" => Service::decode(raw).map(|svc| {
            let s = svc.spec.unwrap_or_default();
            let ports: Vec<Value> = s
                .ports
                .into_iter()
                .map(|p| {
                    let mut o = Map::new();
                    put(&mut o, "name", p.name);
                    put(&mut o, "protocol", p.protocol);
                    o.insert("port".into(), p.port.into());
                    match p.target_port {
                        Some(t) if t.r#type == 1 => put(&mut o, "targetPort", t.str_val),
                        Some(t) if t.int_val != 0 => {
                            o.insert("targetPort".into(), t.int_val.into());
                        }
                        _ => {}
                    }
                    if p.node_port != 0 {
                        o.insert("nodePort".into(), p.node_port.into());
                    }
                    Value::Object(o)
                })
                .collect();
            let mut spec = Map::new();
            put(&mut spec, "ports", Value::Array(ports));
            put(&mut spec, "selector", json!(s.selector));
            put(&mut spec, "clusterIP", s.cluster_ip);
            put(&mut spec, "type", s.r#type);
            put(&mut spec, "externalName", s.external_name);
            json!({"metadata": meta(svc.metadata), "spec": spec})
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_secret_and_a_service_as_kubectl_sends_them() {
        let s = Secret {
            metadata: Some(ObjectMeta {
                name: "s".into(),
                ..Default::default()
            }),
            data: [("a".to_string(), b"b".to_vec())].into(),
            ..Default::default()
        };
        let v = decode("Secret", &s.encode_to_vec()).unwrap().unwrap();
        assert_eq!(v, json!({"metadata": {"name": "s"}, "data": {"a": "Yg=="}}));
        let svc = Service {
            metadata: None,
            spec: Some(ServiceSpec {
                ports: vec![ServicePort {
                    name: "80-80".into(),
                    protocol: "TCP".into(),
                    port: 80,
                    target_port: Some(IntOrString {
                        r#type: 0,
                        int_val: 8080,
                        str_val: String::new(),
                    }),
                    node_port: 0,
                }],
                selector: [("app".to_string(), "web".to_string())].into(),
                r#type: "ClusterIP".into(),
                ..Default::default()
            }),
        };
        let v = decode("Service", &svc.encode_to_vec()).unwrap().unwrap();
        assert_eq!(
            v["spec"],
            json!({"ports": [{"name": "80-80", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                   "selector": {"app": "web"}, "type": "ClusterIP"})
        );
        assert!(decode("Widget", &[]).is_none());
    }
}
