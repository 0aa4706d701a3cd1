//! The Stage engine's eyes: LIST then WATCH of nodes or pods, relisting on
//! 410 and reconnecting on close or error (after a short backoff), every
//! object and change sent to the engine. The channel is bounded: when the
//! engine falls behind, this reader waits, the stream backs up, and the
//! server eventually ends the watch — which then relists, as client-go does.

use std::time::Duration;

use http::Method;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Kind;
use crate::ops::encode;
use crate::target::ApiClient;

/// One object seen: listed or changed (`deleted` for DELETED).
#[derive(Debug, Clone)]
pub struct SeenObject {
    pub kind: Kind,
    pub deleted: bool,
    pub object: Value,
}

/// Where to list and watch `kind`: cluster-wide (the engine keeps only the
/// simulated nodes and the pods on them).
pub fn collection_path(kind: Kind) -> &'static str {
    match kind {
        Kind::Node => "/api/v1/nodes",
        Kind::Pod => "/api/v1/pods",
    }
}

enum End {
    Gone,
    Closed(String),
    Failed,
}

/// Lists and watches `kind` until `stop`, sending what it sees to `tx`.
pub async fn run(
    client: ApiClient,
    kind: Kind,
    timeout: Duration,
    tx: mpsc::Sender<SeenObject>,
    stop: CancellationToken,
) {
    let mut rv: Option<String> = None;
    let mut backoff = Duration::from_millis(200);
    loop {
        if stop.is_cancelled() {
            return;
        }
        let step = async {
            let from = match rv.take() {
                Some(rv) => rv,
                None => list(&client, kind, timeout, &tx).await?,
            };
            Some(watch(&client, kind, &from, timeout, &tx).await)
        };
        let end = tokio::select! {
            _ = stop.cancelled() => return,
            e = step => e,
        };
        match end {
            Some(End::Closed(at)) => {
                rv = Some(at);
                backoff = Duration::from_millis(200);
                continue;
            }
            Some(End::Gone) => continue,
            Some(End::Failed) | None => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

/// LIST (from the watch cache), every item sent; the list's resourceVersion.
async fn list(
    client: &ApiClient,
    kind: Kind,
    timeout: Duration,
    tx: &mpsc::Sender<SeenObject>,
) -> Option<String> {
    let path = format!("{}?resourceVersion=0", collection_path(kind));
    let fetch = async {
        let req = client.request(Method::GET, &path, None).ok()?;
        let resp = client.send(req).await.ok()?;
        if !resp.status().is_success() {
            tracing::warn!(path, status = resp.status().as_u16(), "stages: list failed");
            return None;
        }
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice::<Value>(&body).ok()
    };
    let mut list = tokio::time::timeout(timeout, fetch).await.ok().flatten()?;
    let rv = list["metadata"]["resourceVersion"].as_str()?.to_string();
    let items = match list.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    for object in items {
        let seen = SeenObject {
            kind,
            deleted: false,
            object,
        };
        tx.send(seen).await.ok()?;
    }
    Some(rv)
}

async fn watch(
    client: &ApiClient,
    kind: Kind,
    rv: &str,
    timeout: Duration,
    tx: &mpsc::Sender<SeenObject>,
) -> End {
    let path = format!(
        "{}?watch=1&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds=300",
        collection_path(kind),
        encode(rv)
    );
    let Ok(req) = client.request(Method::GET, &path, None) else {
        return End::Failed;
    };
    let resp = match tokio::time::timeout(timeout, client.send(req)).await {
        Ok(Ok(r)) => r,
        _ => return End::Failed,
    };
    match resp.status().as_u16() {
        200..=299 => {}
        410 => return End::Gone,
        _ => return End::Failed,
    }
    let mut rv = rv.to_string();
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = match body.frame().await {
            None => return End::Closed(rv),
            Some(Err(_)) => return End::Failed,
            Some(Ok(f)) => f,
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        buf.extend_from_slice(data);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            let Ok(mut event) = serde_json::from_slice::<Value>(line) else {
                return End::Failed;
            };
            let object = event["object"].take();
            if let Some(v) = object["metadata"]["resourceVersion"].as_str() {
                rv = v.to_string();
            }
            let deleted = match event["type"].as_str().unwrap_or("") {
                "ADDED" | "MODIFIED" => false,
                "DELETED" => true,
                "BOOKMARK" => continue,
                _ => {
                    return if object["code"].as_u64() == Some(410) {
                        End::Gone
                    } else {
                        End::Failed
                    }
                }
            };
            let seen = SeenObject {
                kind,
                deleted,
                object,
            };
            if tx.send(seen).await.is_err() {
                return End::Failed;
            }
        }
    }
}
