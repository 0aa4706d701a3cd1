//! The one list-then-watch loop (kube-rs `watcher` style: an explicit
//! [`State`]), shared by the `--watches` / daemon watchers and the Stage
//! engine. What a LIST does and what an event means belong to a [`Handler`];
//! this module owns the states, the watch stream, and the backoff:
//!
//! LIST → WATCH from the list's resourceVersion → on a clean end, re-WATCH from
//! the last revision seen → on 410 Gone, re-LIST; on an error, back off, then
//! re-WATCH from the last revision (or re-LIST, as the handler's
//! [`AfterFailure`] says).
//!
//! With [`InitialList::Stream`] the LIST is a streaming list instead, as
//! client-go's `WatchListClient` does it: one WATCH with
//! `sendInitialEvents=true&resourceVersionMatch=NotOlderThan`, whose every
//! object arrives as ADDED, then a BOOKMARK annotated
//! `k8s.io/initial-events-end`, then the watch goes on. An apiserver that
//! refuses it (4xx: before 1.27, or the feature off) gets LIST → WATCH for
//! the rest of the run, as client-go falls back.

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
    pub initial: InitialList,
}

/// How an informer gets the objects that exist before it watches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InitialList {
    /// LIST (`resourceVersion=0`, from the watch cache), then WATCH.
    #[default]
    List,
    /// A streaming list: the WATCH sends them first (WatchList).
    Stream,
}

/// The annotation of the BOOKMARK that ends a streaming list's objects.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

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
    /// The apiserver refused a streaming list: LIST → WATCH from now on.
    StreamRefused,
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

    /// A streaming list delivered its last object `took` after it was
    /// sent, in `bytes` on the wire.
    fn streamed(&mut self, _took: Duration, _bytes: u64) {}
}

/// The informer's states.
#[derive(Debug)]
enum State {
    Listing,
    /// A streaming list's WATCH, until its objects have all come.
    Streaming,
    Watching {
        rv: String,
    },
    Backoff {
        next: Box<State>,
    },
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
    /// A streaming list was answered 4xx (not 410 or 429): not supported.
    Refused,
}

/// Where a watch stream starts.
#[derive(Debug, Clone, Copy)]
enum From<'a> {
    /// After a revision seen (a LIST's, or the last event's).
    Revision(&'a str),
    /// A streaming list: the objects first, then the watch.
    InitialEvents,
}

impl ListWatch {
    fn path(&self, extra: &[String]) -> String {
        let mut q = self.filters.clone();
        q.extend_from_slice(extra);
        format!("{}?{}", self.collection, q.join("&"))
    }
}

/// Lists and watches until `stop` is cancelled.
pub async fn run<H: Handler>(mut lw: ListWatch, mut handler: H, stop: CancellationToken) {
    let mut state = State::Listing;
    let mut backoff = Backoff::new(lw.backoff);
    loop {
        state = tokio::select! {
            _ = stop.cancelled() => return,
            next = step(&mut lw, &mut handler, state, &mut backoff) => next,
        };
    }
}

async fn step<H: Handler>(
    lw: &mut ListWatch,
    handler: &mut H,
    state: State,
    backoff: &mut Backoff,
) -> State {
    match state {
        State::Listing if lw.initial == InitialList::Stream => State::Streaming,
        State::Streaming => {
            handler.transition(Transition::WatchOpened);
            let (end, synced) = watch(lw, handler, From::InitialEvents).await;
            handler.transition(Transition::WatchClosed);
            match end {
                StreamEnd::Refused => {
                    handler.transition(Transition::StreamRefused);
                    lw.initial = InitialList::List;
                    State::Listing
                }
                // Once the objects have all come it is a watch like any.
                StreamEnd::Closed(rv) if synced => {
                    backoff.reset();
                    handler.transition(Transition::Reconnect);
                    State::Watching { rv }
                }
                StreamEnd::Failed(rv) if synced => watch_failed(lw, handler, rv),
                StreamEnd::Gone => {
                    handler.transition(Transition::Gone);
                    State::Listing
                }
                // Cut short, the list starts over, as a failed LIST does.
                _ => {
                    handler.transition(Transition::ListFailed);
                    State::Backoff {
                        next: Box::new(State::Listing),
                    }
                }
            }
        }
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
            let (end, _) = watch(lw, handler, From::Revision(&rv)).await;
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
                // Only a streaming list is refused; a watch's 4xx is a failure.
                StreamEnd::Failed(last) => watch_failed(lw, handler, last),
                StreamEnd::Refused => watch_failed(lw, handler, rv),
            }
        }
    }
}

/// A watch failed after `rv`: back off, then re-watch from it or relist.
fn watch_failed<H: Handler>(lw: &ListWatch, handler: &mut H, rv: String) -> State {
    handler.transition(Transition::WatchFailed);
    let next = match lw.after_failure {
        AfterFailure::Rewatch => State::Watching { rv },
        AfterFailure::Relist => State::Listing,
    };
    State::Backoff {
        next: Box::new(next),
    }
}

/// One watch stream until it ends, and whether a streaming list's objects
/// had all come by then.
async fn watch<H: Handler>(lw: &ListWatch, handler: &mut H, from: From<'_>) -> (StreamEnd, bool) {
    // Like client-go: a random server-side timeout between 5 and 10 minutes.
    let timeout_s = match lw.watch_timeout {
        Some(t) => t.as_secs().max(1),
        None => 300 + (lw.id * 7919 + unix_nanos() as u64) % 300,
    };
    let mut params = vec!["watch=1".to_string()];
    let mut rv = match from {
        From::Revision(rv) => {
            params.push(format!("resourceVersion={}", encode(rv)));
            rv.to_string()
        }
        // resourceVersion unset with NotOlderThan: the objects as of a
        // consistent read, as client-go asks for them.
        From::InitialEvents => {
            params.push("sendInitialEvents=true".into());
            params.push("resourceVersionMatch=NotOlderThan".into());
            String::new()
        }
    };
    params.push("allowWatchBookmarks=true".into());
    params.push(format!("timeoutSeconds={timeout_s}"));
    let path = lw.path(&params);
    let client = &lw.client;
    let started = Instant::now();
    let req = match client.request(http::Method::GET, &path, None) {
        Ok(r) => r,
        Err(_) => return (StreamEnd::Failed(rv), false),
    };
    let resp = match tokio::time::timeout(lw.request_timeout, client.send(req)).await {
        Ok(Ok(r)) => r,
        _ => return (StreamEnd::Failed(rv), false),
    };
    let streaming = matches!(from, From::InitialEvents);
    match resp.status().as_u16() {
        200..=299 => {}
        410 => return (StreamEnd::Gone, false),
        401 => {
            client.unauthorized();
            return (StreamEnd::Failed(rv), false);
        }
        400..=499 if streaming && resp.status().as_u16() != 429 => {
            return (StreamEnd::Refused, false)
        }
        _ => return (StreamEnd::Failed(rv), false),
    }
    // A watch is synced from the start; a streaming list at its bookmark.
    let mut synced = !streaming;
    let mut bytes = 0u64;
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = match body.frame().await {
            None => return (StreamEnd::Closed(rv), synced),
            Some(Err(_)) => return (StreamEnd::Failed(rv), synced),
            Some(Ok(f)) => f,
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        bytes += data.len() as u64;
        buf.extend_from_slice(data);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            match on_line(handler, &line, &mut rv).await {
                Line::Event => {}
                Line::InitialEventsEnd if !synced => {
                    synced = true;
                    handler.streamed(started.elapsed(), bytes);
                }
                Line::InitialEventsEnd => {}
                Line::End(end) => return (end, synced),
            }
        }
    }
}

/// What one line of a watch stream was.
enum Line {
    Event,
    /// The bookmark after a streaming list's objects.
    InitialEventsEnd,
    End(StreamEnd),
}

/// One line of the stream: a WatchEvent.
async fn on_line<H: Handler>(handler: &mut H, line: &[u8], rv: &mut String) -> Line {
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() {
        return Line::Event;
    }
    let Ok(mut event) = serde_json::from_slice::<Value>(trimmed) else {
        return Line::End(StreamEnd::Failed(rv.clone()));
    };
    let object = event["object"].take();
    let kind = match event["type"].as_str().unwrap_or("") {
        "ADDED" => EventType::Added,
        "MODIFIED" => EventType::Modified,
        "DELETED" => EventType::Deleted,
        "BOOKMARK" => {
            handler.transition(Transition::Bookmark);
            let meta = &object["metadata"];
            if let Some(v) = meta["resourceVersion"].as_str() {
                *rv = v.to_string();
            }
            return if meta["annotations"][INITIAL_EVENTS_END].as_str() == Some("true") {
                Line::InitialEventsEnd
            } else {
                Line::Event
            };
        }
        _ => {
            return Line::End(if object["code"].as_u64() == Some(410) {
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
        Line::Event
    } else {
        Line::End(StreamEnd::Failed(rv.clone()))
    }
}
