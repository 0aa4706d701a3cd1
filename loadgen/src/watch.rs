//! Long-lived watches that behave like a client-go informer, written as an
//! explicit state machine: LIST (from the watch cache) → WATCH from the list's
//! resourceVersion → on a clean end, re-WATCH from the last revision seen →
//! on 410 Gone, re-LIST; on errors, back off like client-go's reflector
//! (800 ms doubling to 30 s, with jitter).
//!
//! Each delivered ADDED/MODIFIED event whose object carries a `written-at`
//! annotation *new for that object* yields a delivery latency: loadgen's clock
//! now minus the time loadgen's writer stamped into the object. Events that
//! repeat a stamp (status updates by others, graceful-delete MODIFIEDs,
//! replays) and DELETED events are counted but not timed: their stamp is old.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ops::{encode, unix_nanos, Planned, Resource, WRITTEN_AT};
use crate::record::{OpRecorder, Outcome};
use crate::send::{self, SendOptions};
use crate::target::ApiClient;

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

/// The informer's states.
#[derive(Debug)]
enum State {
    Listing,
    Watching { rv: String },
    Backoff { next: Box<State> },
}

/// client-go reflector backoff: 800 ms initial, ×2, 30 s cap, jitter 1.0,
/// reset after 2 minutes without trouble.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    last: Option<Instant>,
}

impl Backoff {
    const INITIAL: Duration = Duration::from_millis(800);
    const CAP: Duration = Duration::from_secs(30);
    const RESET: Duration = Duration::from_secs(120);

    fn step(&mut self) -> Duration {
        if self.last.is_some_and(|t| t.elapsed() > Self::RESET) {
            self.next = Self::INITIAL;
        }
        self.last = Some(Instant::now());
        let base = self.next;
        self.next = (self.next * 2).min(Self::CAP);
        let jitter: f64 = rand::rng().random::<f64>();
        base.mul_f64(1.0 + jitter)
    }
}

enum StreamEnd {
    /// The server closed the stream (timeoutSeconds): re-watch from `rv`.
    Closed(String),
    /// 410: the revision is compacted, relist.
    Gone,
    /// Error: back off, then re-watch from `rv`.
    Failed(String),
}

impl Watcher {
    /// Runs until `stop` is cancelled.
    pub async fn run(self, stop: CancellationToken) {
        let mut state = State::Listing;
        let mut backoff = Backoff {
            next: Backoff::INITIAL,
            last: None,
        };
        let mut stamps = Stamps::default();
        loop {
            state = tokio::select! {
                _ = stop.cancelled() => return,
                next = self.step(state, &mut backoff, &mut stamps) => next,
            };
        }
    }

    async fn step(&self, state: State, backoff: &mut Backoff, stamps: &mut Stamps) -> State {
        match state {
            State::Listing => {
                let started = Instant::now();
                let planned = Planned {
                    method: http::Method::GET,
                    path: self.path(&["resourceVersion=0".into()]),
                    body: None,
                };
                let sent = send::send(&self.client, &planned, &self.send, true).await;
                self.lists.record(&sent.outcome, started.elapsed(), false);
                match sent.list_meta {
                    Some(meta) if sent.outcome.is_success() => State::Watching {
                        rv: meta.resource_version,
                    },
                    _ => {
                        self.stats.errors.fetch_add(1, Ordering::Relaxed);
                        State::Backoff {
                            next: Box::new(State::Listing),
                        }
                    }
                }
            }
            State::Backoff { next } => {
                tokio::time::sleep(backoff.step()).await;
                *next
            }
            State::Watching { rv } => {
                self.stats.active.fetch_add(1, Ordering::Relaxed);
                let end = self.watch(&rv, stamps).await;
                self.stats.active.fetch_sub(1, Ordering::Relaxed);
                match end {
                    StreamEnd::Closed(rv) => {
                        self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                        State::Watching { rv }
                    }
                    StreamEnd::Gone => {
                        self.stats.gone.fetch_add(1, Ordering::Relaxed);
                        self.stats.relists.fetch_add(1, Ordering::Relaxed);
                        State::Listing
                    }
                    StreamEnd::Failed(rv) => {
                        self.stats.errors.fetch_add(1, Ordering::Relaxed);
                        self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                        State::Backoff {
                            next: Box::new(State::Watching { rv }),
                        }
                    }
                }
            }
        }
    }

    fn path(&self, extra: &[String]) -> String {
        let mut q: Vec<String> = Vec::new();
        if let Some(s) = &self.spec.label_selector {
            q.push(format!("labelSelector={}", encode(s)));
        }
        if let Some(s) = &self.spec.field_selector {
            q.push(format!("fieldSelector={}", encode(s)));
        }
        q.extend_from_slice(extra);
        format!(
            "{}?{}",
            self.spec
                .resource
                .collection_path(self.spec.namespace.as_deref()),
            q.join("&")
        )
    }

    /// One watch stream from `rv` until it ends.
    async fn watch(&self, rv: &str, stamps: &mut Stamps) -> StreamEnd {
        // Like client-go: a random server-side timeout between 5 and 10 minutes.
        let timeout_s = match self.spec.timeout {
            Some(t) => t.as_secs().max(1),
            None => 300 + (self.id * 7919 + unix_nanos() as u64) % 300,
        };
        let path = self.path(&[
            "watch=1".into(),
            format!("resourceVersion={}", encode(rv)),
            "allowWatchBookmarks=true".into(),
            format!("timeoutSeconds={timeout_s}"),
        ]);
        let req = match self.client.request(http::Method::GET, &path, None) {
            Ok(r) => r,
            Err(e) => return StreamEnd::Failed(format!("{rv}: {e}")),
        };
        let resp = match tokio::time::timeout(self.send.timeout, self.client.send(req)).await {
            Ok(Ok(r)) => r,
            _ => return StreamEnd::Failed(rv.to_string()),
        };
        match resp.status().as_u16() {
            200..=299 => {}
            410 => return StreamEnd::Gone,
            401 => {
                self.client.unauthorized();
                return StreamEnd::Failed(rv.to_string());
            }
            _ => return StreamEnd::Failed(rv.to_string()),
        }
        let mut rv = rv.to_string();
        let mut body = resp.into_body();
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let frame = match body.frame().await {
                None => return StreamEnd::Closed(rv),
                Some(Err(_)) => return StreamEnd::Failed(rv),
                Some(Ok(f)) => f,
            };
            let Some(data) = frame.data_ref() else {
                continue;
            };
            buf.extend_from_slice(data);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                if let Some(end) = self.on_event(&line, &mut rv, stamps) {
                    return end;
                }
            }
        }
    }

    fn on_event(&self, line: &[u8], rv: &mut String, stamps: &mut Stamps) -> Option<StreamEnd> {
        let trimmed = line.trim_ascii();
        if trimmed.is_empty() {
            return None;
        }
        let Ok(event) = serde_json::from_slice::<serde_json::Value>(trimmed) else {
            return Some(StreamEnd::Failed(rv.clone()));
        };
        let obj = &event["object"];
        match event["type"].as_str().unwrap_or("") {
            "ERROR" => {
                if obj["code"].as_u64() == Some(410) {
                    return Some(StreamEnd::Gone);
                }
                return Some(StreamEnd::Failed(rv.clone()));
            }
            "BOOKMARK" => {
                self.stats.bookmarks.fetch_add(1, Ordering::Relaxed);
            }
            kind => {
                self.stats.events.fetch_add(1, Ordering::Relaxed);
                let meta = &obj["metadata"];
                let stamp = meta["annotations"][WRITTEN_AT]
                    .as_str()
                    .and_then(|s| s.parse::<u128>().ok());
                let fresh = stamp.filter(|ts| kind != "DELETED" && stamps.is_new(meta, *ts));
                if let Some(ts) = fresh {
                    let delay = unix_nanos().saturating_sub(ts);
                    let delay = Duration::from_nanos(u64::try_from(delay).unwrap_or(u64::MAX));
                    let outcome = Outcome {
                        status: Some(200),
                        bytes: line.len() as u64,
                        ..Default::default()
                    };
                    self.events.record(&outcome, delay, false);
                }
            }
        }
        if let Some(v) = obj["metadata"]["resourceVersion"].as_str() {
            *rv = v.to_string();
        }
        None
    }
}
