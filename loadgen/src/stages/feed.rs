//! The Stage engine's eyes: the one list-then-watch informer
//! ([`crate::watch::informer`]) over nodes or pods, every object listed and
//! every change sent to the engine. The channel is bounded: when the engine
//! falls behind, this reader waits, the stream backs up, and the server
//! eventually ends the watch — which then relists, as client-go does. After
//! a failed watch it relists too (the engine takes objects it already knows).

use std::time::Duration;

use http::Method;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Kind;
use crate::target::ApiClient;
use crate::watch::informer::{self, AfterFailure, BackoffPolicy, EventType, Handler, ListWatch};

/// The engine's backoff: short (a simulated cluster is local), no jitter.
const BACKOFF: BackoffPolicy = BackoffPolicy {
    initial: Duration::from_millis(200),
    cap: Duration::from_secs(10),
    jitter: 0.0,
    reset_after: Duration::MAX,
};
/// Server-side timeout of each watch.
const WATCH_TIMEOUT: Duration = Duration::from_secs(300);

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

/// Lists and watches `kind` until `stop`, sending what it sees to `tx`. `filters`: query
/// parameters (encoded) every LIST and WATCH carries, e.g. a field selector; the Stage
/// engine passes none.
pub async fn run(
    client: ApiClient,
    kind: Kind,
    filters: Vec<String>,
    timeout: Duration,
    tx: mpsc::Sender<SeenObject>,
    stop: CancellationToken,
) {
    let lw = ListWatch {
        client,
        collection: collection_path(kind).to_string(),
        filters,
        request_timeout: timeout,
        watch_timeout: Some(WATCH_TIMEOUT),
        id: 0,
        backoff: BACKOFF,
        after_failure: AfterFailure::Relist,
        initial: informer::InitialList::List,
    };
    informer::run(lw, Feed { kind, timeout, tx }, stop).await;
}

struct Feed {
    kind: Kind,
    timeout: Duration,
    tx: mpsc::Sender<SeenObject>,
}

impl Handler for Feed {
    /// LIST (from the watch cache), every item sent.
    async fn list(&mut self, lw: &ListWatch, path: String) -> Option<String> {
        let client = &lw.client;
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
        let mut list = tokio::time::timeout(self.timeout, fetch)
            .await
            .ok()
            .flatten()?;
        let rv = list["metadata"]["resourceVersion"].as_str()?.to_string();
        let items = match list.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        for object in items {
            let seen = SeenObject {
                kind: self.kind,
                deleted: false,
                object,
            };
            self.tx.send(seen).await.ok()?;
        }
        Some(rv)
    }

    async fn event(&mut self, kind: EventType, object: Value, _line_bytes: usize) -> bool {
        let seen = SeenObject {
            kind: self.kind,
            deleted: kind == EventType::Deleted,
            object,
        };
        self.tx.send(seen).await.is_ok()
    }
}
