//! The run's own namespaces, `<basename>-1..N`: created (labelled as
//! loadgen's, so writes into them are allowed) before the first step and
//! deleted after the last — with everything left in them — whatever happened.

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::ops::{Resource, MANAGED_BY};
use crate::target::ApiClient;

use super::reconcile::SCENARIO_LABEL;

pub(crate) async fn call(
    client: &ApiClient,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    let body = body.map(|b| ("application/json", Bytes::from(b.to_string())));
    let req = client
        .request(method.clone(), path, body)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let resp = tokio::time::timeout(std::time::Duration::from_secs(30), client.send(req))
        .await
        .map_err(|_| format!("{method} {path}: no answer within 30s"))?
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// Creates `name` labelled as loadgen's; an existing namespace is adopted only
/// if it already carries that label (a leftover of an earlier run).
pub async fn create(client: &ApiClient, name: &str, scenario: &str) -> Result<(), String> {
    let body = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": { MANAGED_BY.0: MANAGED_BY.1, SCENARIO_LABEL: scenario },
        },
    });
    let (status, _) = call(client, Method::POST, "/api/v1/namespaces", Some(body)).await?;
    match status {
        200..=299 => Ok(()),
        409 => {
            let (s, v) = call(
                client,
                Method::GET,
                &format!("/api/v1/namespaces/{name}"),
                None,
            )
            .await?;
            let labelled = v["metadata"]["labels"][MANAGED_BY.0].as_str() == Some(MANAGED_BY.1);
            let terminating = v["status"]["phase"].as_str() == Some("Terminating");
            if s != 200 || !labelled {
                Err(format!(
                    "namespace {name} already exists and is not labelled {}={}: refusing to use it",
                    MANAGED_BY.0, MANAGED_BY.1
                ))
            } else if terminating {
                Err(format!("namespace {name} is still terminating from an earlier run; retry when it is gone"))
            } else {
                Ok(())
            }
        }
        other => Err(format!("POST /api/v1/namespaces ({name}): HTTP {other}")),
    }
}

/// Deletes `name` (404 counts as done).
pub async fn delete(client: &ApiClient, name: &str) -> Result<(), String> {
    let (status, _) = call(
        client,
        Method::DELETE,
        &format!("/api/v1/namespaces/{name}"),
        None,
    )
    .await?;
    match status {
        200..=299 | 404 => Ok(()),
        other => Err(format!("DELETE namespace {name}: HTTP {other}")),
    }
}

/// Deletes a cluster-scoped object the run created (404 counts as done).
pub async fn delete_object(
    client: &ApiClient,
    resource: &Resource,
    name: &str,
) -> Result<(), String> {
    let path = resource.object_path("", name);
    let (status, _) = call(client, Method::DELETE, &path, None).await?;
    match status {
        200..=299 | 404 => Ok(()),
        other => Err(format!("DELETE {path}: HTTP {other}")),
    }
}

/// Fails fast, with the address and reason, if the API server does not answer.
pub async fn preflight(client: &ApiClient) -> Result<(), String> {
    call(client, Method::GET, "/version", None)
        .await
        .map(|_| ())
}
