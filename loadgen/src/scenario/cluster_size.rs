//! `.Nodes` for ClusterLoader2 configs: as CL2 does, the number of nodes that
//! take workloads — not unschedulable and not control-plane — counted once,
//! before the config is rendered.

use http::Method;
use serde_json::Value;

use super::namespaces::call;
use crate::target::ApiClient;

/// Nodes per LIST page: bounded pages, as kubectl's chunking.
const PAGE: u32 = 500;

/// Counts the schedulable worker nodes, following `continue`.
pub async fn schedulable_nodes(client: &ApiClient) -> Result<u64, String> {
    let mut count = 0;
    let mut cont = String::new();
    loop {
        let mut path = format!("/api/v1/nodes?limit={PAGE}");
        if !cont.is_empty() {
            path.push_str("&continue=");
            path.push_str(&cont);
        }
        let (status, list) = call(client, Method::GET, &path, None).await?;
        if status != 200 {
            return Err(format!("GET {path}: HTTP {status}"));
        }
        count += list["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(|n| takes_workloads(n))
            .count() as u64;
        match list["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => cont = c.to_string(),
            _ => return Ok(count),
        }
    }
}

fn takes_workloads(node: &Value) -> bool {
    let labels = &node["metadata"]["labels"];
    let control_plane = [
        "node-role.kubernetes.io/control-plane",
        "node-role.kubernetes.io/master",
    ]
    .iter()
    .any(|l| labels.get(l).is_some());
    node["spec"]["unschedulable"] != true && !control_plane
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_plane_and_cordoned_nodes_do_not_count() {
        let worker = serde_json::json!({"metadata": {"labels": {"kubernetes.io/os": "linux"}}});
        let cordoned = serde_json::json!({"metadata": {}, "spec": {"unschedulable": true}});
        let master = serde_json::json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}});
        assert!(takes_workloads(&worker));
        assert!(!takes_workloads(&cordoned));
        assert!(!takes_workloads(&master));
    }
}
