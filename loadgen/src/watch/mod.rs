//! Long-lived watches that behave like a client-go informer: LIST (from the
//! watch cache) → WATCH from the list's resourceVersion → on a clean end,
//! re-WATCH from the last revision seen → on 410 Gone, re-LIST; on errors,
//! back off like client-go's reflector (800 ms doubling to 30 s, with jitter).
//! The loop itself is [`informer`], shared with the Stage engine; this module
//! is what `--watches` and the node daemons do with it.
//!
//! Each delivered ADDED/MODIFIED event whose object carries a `written-at`
//! annotation *new for that object* yields a delivery latency: loadgen's clock
//! now minus the time loadgen's writer stamped into the object. Events that
//! repeat a stamp (status updates by others, graceful-delete MODIFIEDs,
//! replays) and DELETED events are counted but not timed: their stamp is old.

pub mod informer;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ops::{encode, unix_nanos, Planned, Resource, WRITTEN_AT};
use crate::record::{OpRecorder, Outcome};
use crate::send::{self, SendOptions};
use crate::target::ApiClient;
pub use informer::InitialList;
use informer::{AfterFailure, BackoffPolicy, EventType, Handler, ListWatch, Transition};

/// What `--watches N` watches.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub count: u64,
    pub resource: Resource,
    /// `None`: all namespaces.
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// Watches sharing one client (one HTTP/2 connection).
    pub per_connection: u64,
    /// Server-side timeout of each watch request (`None`: 5–10 min at random, as client-go).
    pub timeout: Option<Duration>,
    /// LIST then WATCH, or a streaming list.
    pub initial: InitialList,
}

/// Counters shared by all watchers.
#[derive(Debug, Default)]
pub struct WatchStats {
    pub active: AtomicU64,
    pub events: AtomicU64,
    pub bookmarks: AtomicU64,
    pub reconnects: AtomicU64,
    pub relists: AtomicU64,
    pub gone: AtomicU64,
    pub errors: AtomicU64,
    pub stream_refusals: AtomicU64,
}

/// Watch counters at the end of the run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WatchSummary {
    pub watchers: u64,
    pub active_at_end: u64,
    pub events: u64,
    pub bookmarks: u64,
    pub reconnects: u64,
    pub relists: u64,
    pub gone_410: u64,
    pub errors: u64,
    /// Streaming lists the apiserver refused (then LIST → WATCH).
    #[serde(default)]
    pub stream_refusals: u64,
}

impl WatchSummary {
    /// The watchers' counters at the end of a run.
    pub(crate) fn of(watchers: u64, w: &WatchStats) -> WatchSummary {
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        WatchSummary {
            watchers,
            active_at_end: get(&w.active),
            events: get(&w.events),
            bookmarks: get(&w.bookmarks),
            reconnects: get(&w.reconnects),
            relists: get(&w.relists),
            gone_410: get(&w.gone),
            errors: get(&w.errors),
            stream_refusals: get(&w.stream_refusals),
        }
    }
}

/// The last `written-at` stamp seen per object (keyed by a hash of
/// namespace/name), so each write is timed once.
#[derive(Debug, Default)]
struct Stamps(HashMap<u64, u128>);

impl Stamps {
    fn is_new(&mut self, meta: &serde_json::Value, ts: u128) -> bool {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        meta["namespace"].as_str().unwrap_or("").hash(&mut h);
        meta["name"].as_str().unwrap_or("").hash(&mut h);
        self.0.insert(h.finish(), ts) != Some(ts)
    }
}

/// One watcher.
#[derive(Debug)]
pub struct Watcher {
    pub id: u64,
    pub spec: WatchSpec,
    pub client: ApiClient,
    pub send: SendOptions,
    /// Delivery latency of annotated events.
    pub events: Arc<OpRecorder>,
    /// The (re)lists.
    pub lists: Arc<OpRecorder>,
    pub stats: Arc<WatchStats>,
}

impl Watcher {
    /// Runs until `stop` is cancelled.
    pub async fn run(self, stop: CancellationToken) {
        let mut filters = Vec::new();
        if let Some(s) = &self.spec.label_selector {
            filters.push(format!("labelSelector={}", encode(s)));
        }
        if let Some(s) = &self.spec.field_selector {
            filters.push(format!("fieldSelector={}", encode(s)));
        }
        let lw = ListWatch {
            client: self.client.clone(),
            collection: self
                .spec
                .resource
                .collection_path(self.spec.namespace.as_deref()),
            filters,
            request_timeout: self.send.timeout,
            watch_timeout: self.spec.timeout,
            id: self.id,
            backoff: BackoffPolicy::CLIENT_GO,
            after_failure: AfterFailure::Rewatch,
            initial: self.spec.initial,
        };
        let handler = Timing {
            watcher: self,
            stamps: Stamps::default(),
        };
        informer::run(lw, handler, stop).await;
    }
}

/// A watcher's part of the informer: the LIST (or streaming list) recorded
/// as an operation (its items counted, not kept), and each freshly stamped
/// event timed.
struct Timing {
    watcher: Watcher,
    stamps: Stamps,
}

impl Handler for Timing {
    async fn list(&mut self, lw: &ListWatch, path: String) -> Option<String> {
        let w = &self.watcher;
        let started = Instant::now();
        let planned = Planned {
            method: http::Method::GET,
            path,
            body: None,
        };
        let sent = send::send(&lw.client, &planned, &w.send, true).await;
        w.lists.record(&sent.outcome, started.elapsed(), false);
        match sent.list_meta {
            Some(meta) if sent.outcome.is_success() => Some(meta.resource_version),
            _ => None,
        }
    }

    async fn event(&mut self, kind: EventType, object: Value, line_bytes: usize) -> bool {
        let w = &self.watcher;
        w.stats.events.fetch_add(1, Ordering::Relaxed);
        let meta = &object["metadata"];
        let stamp = meta["annotations"][WRITTEN_AT]
            .as_str()
            .and_then(|s| s.parse::<u128>().ok());
        let fresh = stamp.filter(|ts| kind != EventType::Deleted && self.stamps.is_new(meta, *ts));
        if let Some(ts) = fresh {
            let delay = unix_nanos().saturating_sub(ts);
            let delay = Duration::from_nanos(u64::try_from(delay).unwrap_or(u64::MAX));
            let outcome = Outcome {
                status: Some(200),
                bytes: line_bytes as u64,
                ..Default::default()
            };
            w.events.record(&outcome, delay, false);
        }
        true
    }

    fn transition(&mut self, t: Transition) {
        let s = &self.watcher.stats;
        match t {
            Transition::WatchOpened => s.active.fetch_add(1, Ordering::Relaxed),
            Transition::WatchClosed => s.active.fetch_sub(1, Ordering::Relaxed),
            Transition::Reconnect => s.reconnects.fetch_add(1, Ordering::Relaxed),
            Transition::Gone => {
                s.gone.fetch_add(1, Ordering::Relaxed);
                s.relists.fetch_add(1, Ordering::Relaxed)
            }
            Transition::ListFailed => s.errors.fetch_add(1, Ordering::Relaxed),
            Transition::WatchFailed => {
                s.errors.fetch_add(1, Ordering::Relaxed);
                s.reconnects.fetch_add(1, Ordering::Relaxed)
            }
            Transition::Bookmark => s.bookmarks.fetch_add(1, Ordering::Relaxed),
            Transition::StreamRefused => s.stream_refusals.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// A streaming list is recorded as the LIST it replaces: from the
    /// request to its last object.
    fn streamed(&mut self, took: Duration, bytes: u64) {
        let outcome = Outcome {
            status: Some(200),
            bytes,
            ..Default::default()
        };
        self.watcher.lists.record(&outcome, took, false);
    }
}
