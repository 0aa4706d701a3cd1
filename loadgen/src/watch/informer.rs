//! The one list-then-watch loop (kube-rs `watcher` style: an explicit
//! [`State`]), shared by the `--watches` / daemon watchers and the Stage
//! engine. What a LIST does and what an event means belong to a [`Handler`];
//! this module owns the states, the watch stream, and the backoff:
//!
//! LIST → WATCH from the list's resourceVersion → on a clean end, re-WATCH from
//! the last revision seen → on 410 Gone, re-LIST; on an error, back off, then
//! re-WATCH from the last revision (or re-LIST, as the handler's
//! [`AfterFailure`] says).

use std::future::Future;
use std::time::Duration;

use http_body_util::BodyExt;
use rand::Rng;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ops::{encode, unix_nanos};
use crate::target::ApiClient;

/// What to list and watch, and how to behave when things go wrong.
#[derive(Debug, Clone)]
pub struct ListWatch {
    pub client: ApiClient,
    /// The collection, e.g. `/api/v1/pods`.
    pub collection: String,
    /// Query parameters every LIST and WATCH carries (selectors), encoded.
    pub filters: Vec<String>,
    /// How long the response head of a watch may take.
    pub request_timeout: Duration,
    /// Server-side timeout of each watch (`None`: 5–10 min at random, as client-go).
    pub watch_timeout: Option<Duration>,
    /// Spreads the random watch timeouts of many watchers.
    pub id: u64,
    pub backoff: BackoffPolicy,
    pub after_failure: AfterFailure,
}

/// Where an informer resumes after a failed watch (once backed off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Re-WATCH from the last revision seen.
    Rewatch,
    /// LIST again (the handler then sees every object again).
    Relist,
}

/// A watch event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// What happened, for a handler's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// A watch stream is open (`WatchClosed` follows).
    WatchOpened,
    WatchClosed,
    /// The server ended the watch cleanly; re-watching.
    Reconnect,
    /// 410 Gone: relisting.
    Gone,
    /// A LIST failed; backing off.
    ListFailed,
    /// A watch failed; backing off.
    WatchFailed,
    /// A BOOKMARK was read.
    Bookmark,
}

/// What one informer does with what it sees.
pub trait Handler {
    /// LIST (`path` carries the filters and `resourceVersion=0`): the list's
    /// resourceVersion, or `None` to back off and list again.
    fn list(&mut self, lw: &ListWatch, path: String)
        -> impl Future<Output = Option<String>> + Send;

    /// One event (`line_bytes`: its size on the wire); `false` ends the watch as failed.
    fn event(
        &mut self,
        kind: EventType,
        object: Value,
        line_bytes: usize,
    ) -> impl Future<Output = bool> + Send;

    /// A state change, for counters.
    fn transition(&mut self, _t: Transition) {}
}

/// The informer's states.
#[derive(Debug)]
enum State {
    Listing,
    Watching { rv: String },
    Backoff { next: Box<State> },
}

/// How long to wait after trouble: `initial`, doubling to `cap`, times
/// `1 + jitter·rand`; back to `initial` after `reset_after` without trouble
/// or after a watch that ended cleanly.
#[derive(Debug, Clone, Copy)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub cap: Duration,
    pub jitter: f64,
    pub reset_after: Duration,
}

impl BackoffPolicy {
    /// client-go's reflector: 800 ms initial, ×2, 30 s cap, jitter 1.0, reset after 2 minutes.
    pub const CLIENT_GO: BackoffPolicy = BackoffPolicy {
        initial: Duration::from_millis(800),
        cap: Duration::from_secs(30),
        jitter: 1.0,
        reset_after: Duration::from_secs(120),
    };
}

#[derive(Debug)]
struct Backoff {
    policy: BackoffPolicy,
    next: Duration,
    last: Option<Instant>,
}

impl Backoff {
    fn new(policy: BackoffPolicy) -> Backoff {
        Backoff {
            policy,
            next: policy.initial,
            last: None,
        }
    }

    fn step(&mut self) -> Duration {
        if self
            .last
            .is_some_and(|t| t.elapsed() > self.policy.reset_after)
        {
            self.next = self.policy.initial;
        }
        self.last = Some(Instant::now());
        let base = self.next;
        self.next = (self.next * 2).min(self.policy.cap);
        if self.policy.jitter > 0.0 {
            let r: f64 = rand::rng().random::<f64>();
            base.mul_f64(1.0 + self.policy.jitter * r)
        } else {
            base
        }
    }

    fn reset(&mut self) {
        self.next = self.policy.initial;
    }
}

enum StreamEnd {
    /// The server closed the stream (timeoutSeconds): re-watch from `rv`.
    Closed(String),
    /// 410: the revision is compacted, relist.
    Gone,
    /// Error: back off, then re-watch from `rv` (or relist).
    Failed(String),
}

impl ListWatch {
    fn path(&self, extra: &[String]) -> String {
        let mut q = self.filters.clone();
        q.extend_from_slice(extra);
        format!("{}?{}", self.collection, q.join("&"))
    }
}

/// Lists and watches until `stop` is cancelled.
pub async fn run<H: Handler>(lw: ListWatch, mut handler: H, stop: CancellationToken) {
    let mut state = State::Listing;
    let mut backoff = Backoff::new(lw.backoff);
    loop {
        state = tokio::select! {
            _ = stop.cancelled() => return,
            next = step(&lw, &mut handler, state, &mut backoff) => next,
        };
    }
}

async fn step<H: Handler>(
    lw: &ListWatch,
    handler: &mut H,
    state: State,
    backoff: &mut Backoff,
) -> State {
    match state {
        State::Listing => {
            let path = lw.path(&["resourceVersion=0".into()]);
            match handler.list(lw, path).await {
                Some(rv) => State::Watching { rv },
                None => {
                    handler.transition(Transition::ListFailed);
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
            handler.transition(Transition::WatchOpened);
            let end = watch(lw, handler, &rv).await;
            handler.transition(Transition::WatchClosed);
            match end {
                StreamEnd::Closed(rv) => {
                    backoff.reset();
                    handler.transition(Transition::Reconnect);
                    State::Watching { rv }
                }
                StreamEnd::Gone => {
                    handler.transition(Transition::Gone);
                    State::Listing
                }
                StreamEnd::Failed(rv) => {
                    handler.transition(Transition::WatchFailed);
                    let next = match lw.after_failure {
                        AfterFailure::Rewatch => State::Watching { rv },
                        AfterFailure::Relist => State::Listing,
                    };
                    State::Backoff {
                        next: Box::new(next),
                    }
                }
            }
        }
    }
}

/// One watch stream from `rv` until it ends.
async fn watch<H: Handler>(lw: &ListWatch, handler: &mut H, rv: &str) -> StreamEnd {
    // Like client-go: a random server-side timeout between 5 and 10 minutes.
    let timeout_s = match lw.watch_timeout {
        Some(t) => t.as_secs().max(1),
        None => 300 + (lw.id * 7919 + unix_nanos() as u64) % 300,
    };
    let path = lw.path(&[
        "watch=1".into(),
        format!("resourceVersion={}", encode(rv)),
        "allowWatchBookmarks=true".into(),
        format!("timeoutSeconds={timeout_s}"),
    ]);
    let client = &lw.client;
    let req = match client.request(http::Method::GET, &path, None) {
        Ok(r) => r,
        Err(_) => return StreamEnd::Failed(rv.to_string()),
    };
    let resp = match tokio::time::timeout(lw.request_timeout, client.send(req)).await {
        Ok(Ok(r)) => r,
        _ => return StreamEnd::Failed(rv.to_string()),
    };
    match resp.status().as_u16() {
        200..=299 => {}
        410 => return StreamEnd::Gone,
        401 => {
            client.unauthorized();
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
            if let Some(end) = on_line(handler, &line, &mut rv).await {
                return end;
            }
        }
    }
}

/// One line of the stream: a WatchEvent.
async fn on_line<H: Handler>(handler: &mut H, line: &[u8], rv: &mut String) -> Option<StreamEnd> {
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() {
        return None;
    }
    let Ok(mut event) = serde_json::from_slice::<Value>(trimmed) else {
        return Some(StreamEnd::Failed(rv.clone()));
    };
    let object = event["object"].take();
    let kind = match event["type"].as_str().unwrap_or("") {
        "ADDED" => EventType::Added,
        "MODIFIED" => EventType::Modified,
        "DELETED" => EventType::Deleted,
        "BOOKMARK" => {
            handler.transition(Transition::Bookmark);
            if let Some(v) = object["metadata"]["resourceVersion"].as_str() {
                *rv = v.to_string();
            }
            return None;
        }
        _ => {
            return Some(if object["code"].as_u64() == Some(410) {
                StreamEnd::Gone
            } else {
                StreamEnd::Failed(rv.clone())
            });
        }
    };
    if let Some(v) = object["metadata"]["resourceVersion"].as_str() {
        *rv = v.to_string();
    }
    if handler.event(kind, object, line.len()).await {
        None
    } else {
        Some(StreamEnd::Failed(rv.clone()))
    }
}
