//! Safety on real clusters: writes go only into namespaces loadgen created
//! (labelled `app.kubernetes.io/managed-by=loadgen`) or that `--namespace-allow`
//! names; `--max-objects` caps what a run creates; `--dry-run` prints the plan.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use http_body_util::BodyExt;

use crate::ops::{OpKind, PatchTarget, MANAGED_BY};
use crate::schedule::Ticks;
use crate::target::ApiClient;
use crate::Config;

/// Namespaces this run would write into.
pub fn write_namespaces(config: &Config) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for op in &config.operations {
        let writes = match op.kind {
            OpKind::Create | OpKind::Delete => true,
            OpKind::Patch { target, .. } => target == PatchTarget::PodLabels,
            OpKind::List { .. } | OpKind::Get => false,
        };
        if writes {
            out.insert(op.namespace.clone());
        }
    }
    if let Some(b) = &config.burst {
        out.insert(b.namespace.clone());
    }
    // Simulated nodes write pods (--pods-per-node) and bind them (--bind) in
    // their namespace; nodes and leases are their own (labelled), not a namespace's.
    if let Some(n) = config
        .nodes
        .as_ref()
        .filter(|n| n.pods_per_node > 0 || n.bind)
    {
        out.insert(n.namespace.clone());
    }
    out
}

/// Checks every namespace the run writes into; the error says which and why.
pub async fn check_namespaces(client: &ApiClient, config: &Config) -> Result<(), crate::Error> {
    for ns in write_namespaces(config) {
        if config.namespace_allow.contains(&ns) {
            continue;
        }
        let refuse = |why: String| crate::Error::NamespaceNotAllowed {
            namespace: ns.clone(),
            why,
        };
        let req = client
            .request(http::Method::GET, &format!("/api/v1/namespaces/{ns}"), None)
            .map_err(|e| refuse(e.to_string()))?;
        let resp = client.send(req).await.map_err(|e| refuse(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if status != 200 {
            return Err(refuse(format!("GET namespace answered HTTP {status}")));
        }
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if v["metadata"]["labels"][MANAGED_BY.0].as_str() != Some(MANAGED_BY.1) {
            return Err(refuse(format!(
                "it is not labelled {}={}",
                MANAGED_BY.0, MANAGED_BY.1
            )));
        }
    }
    Ok(())
}

/// What `--dry-run` prints: target, schedule and every operation with its
/// rate, request count and first request.
pub fn plan(config: &Config) -> String {
    let mut out = String::new();
    let server = config
        .target
        .server
        .clone()
        .unwrap_or_else(|| "(from kubeconfig)".into());
    let _ = writeln!(out, "target: {server} (HTTP {:?})", config.target.http);
    let _ = writeln!(
        out,
        "duration: {:?}, schedule: {}, max in flight per operation: {}",
        config.duration,
        crate::report::schedule_name(&config.schedule),
        config.max_in_flight
    );
    if let Some(s) = config.shard {
        let _ = writeln!(
            out,
            "shard {}/{} (rates and counts already divided)",
            s.index, s.count
        );
    }
    for op in &config.operations {
        let count = Ticks::new(config.schedule.clone(), op.rate)
            .take_while(|t| *t < config.duration)
            .count();
        let first = op
            .plan(0, Some("<rv>"), Some("<created pod>"))
            .map(|p| format!("{} {}", p.method, p.path))
            .unwrap_or_default();
        let ns = if op.namespace.is_empty() {
            "<kubeconfig namespace or default>"
        } else {
            &op.namespace
        };
        let _ = writeln!(
            out,
            "{:<8} {} → {count} requests, namespace {ns}: {first}",
            op.name, op.rate
        );
    }
    if let Some(b) = &config.burst {
        let _ = writeln!(
            out,
            "burst    {} pods created in parallel, then deleted",
            b.count
        );
    }
    if let Some(w) = &config.watches {
        let _ = writeln!(
            out,
            "watches  {} × {} (namespace {})",
            w.count,
            w.resource,
            match w.namespace.as_deref() {
                None => "all",
                Some("") => "<kubeconfig namespace or default>",
                Some(ns) => ns,
            }
        );
    }
    if let Some(n) = &config.nodes {
        let nodes = n.indices().count();
        let every = |what: &str, interval: std::time::Duration| {
            if interval.is_zero() {
                format!("{what} off")
            } else {
                let rate = nodes as f64 / interval.as_secs_f64();
                format!("{what} every {interval:?} ({rate:.1}/s)")
            }
        };
        let _ = writeln!(
            out,
            "nodes    {nodes} ({}): {}, {}, {} daemons and {} pods per node{}",
            match &n.adopt_selector {
                Some(s) => format!("adopting nodes matching {s}"),
                None => format!("{}node-K, created or adopted", n.object_prefix),
            },
            every("status", n.heartbeat),
            every("lease", n.lease_renew),
            n.daemons_per_node,
            n.pods_per_node,
            if n.bind { ", binding pending pods" } else { "" }
        );
    }
    let _ = writeln!(out, "creates at most {} objects", config.max_objects);
    out
}
