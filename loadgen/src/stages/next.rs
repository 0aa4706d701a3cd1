//! What a Stage does when it applies (`next`), as requests: an event, a
//! finalizer change, then deletion — or else the status from
//! `statusTemplate` — and any `patches`. kwok's order and priority: `delete`
//! wins over `statusTemplate`; `event` and `finalizers` may stand alone.

use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

use super::document::{Event, Finalizers, PatchType};
use super::template::{Env, Template};
use super::Kind;

/// One compiled `next.patches` entry.
#[derive(Debug, PartialEq)]
pub struct PatchSpec {
    pub subresource: String,
    pub root: String,
    pub template: Template,
    pub type_: PatchType,
}

/// A compiled `next`.
#[derive(Debug, Default, PartialEq)]
pub struct NextSpec {
    /// The statusTemplate's text (to tell what it writes).
    pub status_source: String,
    pub status: Option<Template>,
    pub delete: bool,
    pub event: Option<Event>,
    pub finalizers: Option<Finalizers>,
    pub patches: Vec<PatchSpec>,
}

/// What one request of a Stage is, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    Event,
    Finalizers,
    Delete,
    Status,
    Patch,
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    pub kind: ActionKind,
    pub method: Method,
    pub path: String,
    pub body: Option<(&'static str, Bytes)>,
}

/// Why a Stage could not be turned into requests for an object.
#[derive(Debug, thiserror::Error)]
pub enum NextError {
    #[error("rendering {what}: {source}")]
    Render {
        what: &'static str,
        #[source]
        source: super::template::ExecError,
    },
    #[error("{what} rendered to text that is not YAML: {reason}")]
    NotYaml { what: &'static str, reason: String },
}

/// The object's path on the API (`/api/v1/nodes/NAME`, `/api/v1/namespaces/NS/pods/NAME`).
pub fn object_path(kind: Kind, obj: &Value) -> String {
    let name = obj["metadata"]["name"].as_str().unwrap_or("");
    match kind {
        Kind::Node => format!("/api/v1/nodes/{name}"),
        Kind::Pod => {
            let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default");
            format!("/api/v1/namespaces/{ns}/pods/{name}")
        }
    }
}

/// The template environment for `obj`: the node it is (Node) or is on (Pod).
pub fn env_for(kind: Kind, obj: &Value) -> Env {
    let node = match kind {
        Kind::Node => obj["metadata"]["name"].as_str(),
        Kind::Pod => obj["spec"]["nodeName"].as_str(),
    };
    Env {
        node_name: node.unwrap_or("").to_string(),
        include_dir: None,
    }
}

/// Renders `t` against `obj` and reads the text as YAML (`null` when empty).
pub fn render_yaml(
    what: &'static str,
    t: &Template,
    obj: &Value,
    env: &Env,
) -> Result<Value, NextError> {
    let text = t
        .render(obj, env)
        .map_err(|source| NextError::Render { what, source })?;
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_saphyr::from_str::<Value>(&text).map_err(|e| NextError::NotYaml {
        what,
        reason: e.to_string(),
    })
}

fn json_body(content_type: &'static str, v: &Value) -> Option<(&'static str, Bytes)> {
    Some((content_type, Bytes::from(v.to_string())))
}

impl NextSpec {
    /// Whether the statusTemplate writes `field`.
    pub fn status_mentions(&self, field: &str) -> bool {
        self.status_source.contains(field)
    }

    /// The requests applying this `next` to `obj` makes, in order.
    pub fn actions(&self, kind: Kind, obj: &Value, stage: &str) -> Result<Vec<Action>, NextError> {
        let path = object_path(kind, obj);
        let env = env_for(kind, obj);
        let mut out = Vec::new();
        if let Some(ev) = &self.event {
            out.push(event_action(kind, obj, ev, stage));
        }
        if let Some(f) = &self.finalizers {
            let cur: Vec<String> = obj["metadata"]["finalizers"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            let mut new = if f.empty { Vec::new() } else { cur.clone() };
            new.retain(|x| !f.remove.iter().any(|r| &r.value == x));
            for a in &f.add {
                if !new.contains(&a.value) {
                    new.push(a.value.clone());
                }
            }
            if new != cur {
                let list = if new.is_empty() {
                    Value::Null
                } else {
                    json!(new)
                };
                out.push(Action {
                    kind: ActionKind::Finalizers,
                    method: Method::PATCH,
                    path: path.clone(),
                    body: json_body(
                        "application/merge-patch+json",
                        &json!({"metadata": {"finalizers": list}}),
                    ),
                });
            }
        }
        if self.delete {
            out.push(Action {
                kind: ActionKind::Delete,
                method: Method::DELETE,
                path: path.clone(),
                // As kwok: the simulated kubelet is done with it, no more grace.
                body: json_body(
                    "application/json",
                    &json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}),
                ),
            });
            return Ok(out);
        }
        if let Some(t) = &self.status {
            let status = render_yaml("statusTemplate", t, obj, &env)?;
            if !status.is_null() {
                // Strategic merge, as kwok: conditions merge by type, container statuses by name.
                out.push(Action {
                    kind: ActionKind::Status,
                    method: Method::PATCH,
                    path: format!("{path}/status"),
                    body: json_body(
                        PatchType::Strategic.content_type(),
                        &json!({"status": status}),
                    ),
                });
            }
        }
        for p in &self.patches {
            let mut v = render_yaml("patches[].template", &p.template, obj, &env)?;
            if v.is_null() {
                continue;
            }
            for key in p.root.split('.').rev().filter(|k| !k.is_empty()) {
                v = json!({ key: v });
            }
            let sub = if p.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", p.subresource)
            };
            out.push(Action {
                kind: ActionKind::Patch,
                method: Method::PATCH,
                path: format!("{path}{sub}"),
                body: json_body(p.type_.content_type(), &v),
            });
        }
        Ok(out)
    }
}

fn event_action(kind: Kind, obj: &Value, ev: &Event, stage: &str) -> Action {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or("");
    let ns = match kind {
        Kind::Node => "default",
        Kind::Pod => meta["namespace"].as_str().unwrap_or("default"),
    };
    let now = super::template::funcs::now_rfc3339_nanos();
    let stamp = crate::ops::unix_nanos();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{stamp:x}"), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": kind.name(), "name": name,
            "namespace": meta["namespace"], "uid": meta["uid"]},
        "type": ev.type_, "reason": ev.reason, "message": ev.message,
        "source": {"component": "loadgen-stages", "host": stage},
        "firstTimestamp": now.split('.').next().map(|s| format!("{}Z", s.trim_end_matches('Z'))),
        "lastTimestamp": now.split('.').next().map(|s| format!("{}Z", s.trim_end_matches('Z'))),
        "count": 1,
    });
    Action {
        kind: ActionKind::Event,
        method: Method::POST,
        path: format!("/api/v1/namespaces/{ns}/events"),
        body: json_body("application/json", &event),
    }
}
