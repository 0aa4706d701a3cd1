//! WATCH: a chunked stream of WatchEvents read from the store's history at
//! the watcher's own pace, so every change after the start revision arrives
//! exactly once and in order. A watcher that falls behind the history window
//! gets an ERROR event with a 410, as from the real apiserver, never a gap.

use super::respond::{channel_body, Body, Encoding};
use super::table;
use crate::sim::kube_version::KubeVersion;
use crate::sim::resources::ResourceDef;
use crate::sim::storage::object::Obj;
use crate::sim::storage::read::Filter;
use crate::sim::storage::store::{EventType, Store, StoreError};
use apimodel::{ListOptions, Status};
use bytes::{BufMut, Bytes, BytesMut};
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const CHUNK: usize = 64 * 1024;
/// Events taken from the history per lock.
const BATCH: usize = 512;

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Send the current state as ADDED events first; `end_bookmark` marks its end
    /// (streaming lists, `sendInitialEvents=true`).
    FullState { end_bookmark: bool },
    /// Changes after this revision only.
    After(u64),
    /// Changes from now on.
    Now,
}

#[derive(Debug, Clone)]
pub struct WatchPlan {
    pub start: Start,
    pub filter: Filter,
    pub bookmarks: bool,
    pub timeout: Duration,
}

fn forbidden(msg: &str) -> Status {
    Status::invalid("", "", "", msg.to_string())
}

/// Validates a WATCH's options as the apiserver does.
pub fn plan(def: &ResourceDef, namespace: &str, o: &ListOptions) -> Result<WatchPlan, Status> {
    let filter = Filter::parse(def, o)?.in_namespace(namespace);
    let rv = match o.resource_version.as_deref() {
        None => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| forbidden(&format!("resourceVersion: Invalid value: {v:?}")))?,
        ),
    };
    let m = o.resource_version_match.as_deref();
    let start = match o.send_initial_events {
        Some(send) => {
            if m != Some("NotOlderThan") {
                return Err(forbidden("resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"));
            }
            if send && !o.allow_watch_bookmarks {
                return Err(forbidden("allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true"));
            }
            match (send, rv) {
                (true, _) => Start::FullState { end_bookmark: true },
                (false, Some(n)) if n > 0 => Start::After(n),
                (false, _) => Start::Now,
            }
        }
        None => {
            if m.is_some() {
                return Err(forbidden("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"));
            }
            match rv {
                None | Some(0) => Start::FullState {
                    end_bookmark: false,
                },
                Some(n) => Start::After(n),
            }
        }
    };
    // Like --min-request-timeout: a random time between 30 and 60 minutes unless the client asks.
    let timeout = match o.timeout_seconds {
        Some(t) => Duration::from_secs(t),
        None => Duration::from_secs(rand::rng().random_range(1800..3600)),
    };
    Ok(WatchPlan {
        start,
        filter,
        bookmarks: o.allow_watch_bookmarks,
        timeout,
    })
}

/// What a watch needs besides its plan.
pub struct WatchCtx {
    pub store: Arc<Store>,
    pub resource: usize,
    pub def: &'static ResourceDef,
    pub encoding: Encoding,
    pub bookmark_every: Duration,
    /// The release whose encoding of a bookmark's object is sent.
    pub kube_version: KubeVersion,
    /// Cancelled when the server stops (or, later, crashes): the stream ends.
    pub shutdown: CancellationToken,
    /// Held for as long as the stream lives (gauges, in-flight accounting).
    pub guard: Box<dyn Send>,
}

/// Starts the watch and returns its body.
pub fn start(ctx: WatchCtx, plan: WatchPlan) -> Body {
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        let _guard = ctx.guard;
        let w = Watcher {
            store: ctx.store,
            resource: ctx.resource,
            def: ctx.def,
            encoding: ctx.encoding,
            filter: plan.filter,
            kube_version: ctx.kube_version,
            tx,
        };
        tokio::select! {
            _ = w.run(plan.start, plan.bookmarks, plan.timeout, ctx.bookmark_every) => {}
            _ = ctx.shutdown.cancelled() => {}
        }
    });
    channel_body(rx)
}

struct Watcher {
    store: Arc<Store>,
    resource: usize,
    def: &'static ResourceDef,
    encoding: Encoding,
    filter: Filter,
    kube_version: KubeVersion,
    tx: mpsc::Sender<Bytes>,
}

impl Watcher {
    async fn run(
        &self,
        start: Start,
        bookmarks: bool,
        timeout: Duration,
        bookmark_every: Duration,
    ) {
        let deadline = Instant::now() + timeout;
        let mut changes = self.store.subscribe_resource(self.resource);
        changes.borrow_and_update();
        let mut cursor = match start {
            Start::Now => self.store.revision(),
            Start::After(n) => n,
            Start::FullState { end_bookmark } => {
                let (rv, map) = self.store.snapshot(self.resource);
                let map = super::list::namespace_range(map, &self.filter.namespace);
                let mut buf = BytesMut::new();
                for (_, o) in map.iter() {
                    if self.filter.matches(self.def, o) {
                        self.encode(&mut buf, "ADDED", o);
                        if buf.len() >= CHUNK && !self.send(&mut buf).await {
                            return;
                        }
                    }
                }
                if end_bookmark {
                    self.bookmark(&mut buf, rv, true);
                }
                if !self.send(&mut buf).await {
                    return;
                }
                rv
            }
        };
        let mut next_bookmark = Instant::now() + bookmark_every;
        loop {
            changes.borrow_and_update();
            loop {
                let (events, reached) = match self.store.events_after(self.resource, cursor, BATCH)
                {
                    Ok(r) => r,
                    Err(StoreError::Compacted { asked, oldest }) => {
                        let s = Status::expired(format!(
                            "too old resource version: {asked} ({oldest})"
                        ));
                        let mut buf = BytesMut::new();
                        buf.extend_from_slice(
                            format!("{{\"type\":\"ERROR\",\"object\":{}}}\n", s.to_json())
                                .as_bytes(),
                        );
                        self.send(&mut buf).await;
                        return;
                    }
                    Err(_) => return,
                };
                let mut buf = BytesMut::new();
                for e in &events {
                    match (self.transition(e.kind, e.prev.as_deref(), &e.cur), &e.prev) {
                        (Some("DELETED"), Some(prev)) if matches!(e.kind, EventType::Modified) => {
                            // An object leaving the selector: kube-apiserver's cacher sends it as
                            // it was while it still matched, at the event's revision.
                            let left = Obj::new(self.def, prev.value(), e.cur.rv);
                            self.encode(&mut buf, "DELETED", &left);
                        }
                        (Some(kind), _) => self.encode(&mut buf, kind, &e.cur),
                        (None, _) => {}
                    }
                }
                if !self.send(&mut buf).await {
                    return;
                }
                let caught_up = reached == cursor;
                cursor = reached;
                if caught_up || events.len() < BATCH && reached >= self.store.revision() {
                    break;
                }
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tokio::time::sleep_until(next_bookmark) => {
                    next_bookmark = Instant::now() + bookmark_every;
                    if bookmarks {
                        let mut buf = BytesMut::new();
                        self.bookmark(&mut buf, cursor, false);
                        if !self.send(&mut buf).await {
                            return;
                        }
                    }
                }
                _ = self.tx.closed() => return,
            }
        }
    }

    /// The event a filtered watcher sees for a change: an object that starts
    /// matching is ADDED, one that stops matching is DELETED.
    fn transition(&self, kind: EventType, prev: Option<&Obj>, cur: &Obj) -> Option<&'static str> {
        if self.filter.is_empty() {
            return Some(kind.as_str());
        }
        let now = self.filter.matches(self.def, cur);
        match kind {
            EventType::Added | EventType::Deleted => now.then_some(kind.as_str()),
            EventType::Modified => {
                match (prev.is_some_and(|p| self.filter.matches(self.def, p)), now) {
                    (true, true) => Some("MODIFIED"),
                    (false, true) => Some("ADDED"),
                    (true, false) => Some("DELETED"),
                    (false, false) => None,
                }
            }
        }
    }

    fn encode(&self, buf: &mut BytesMut, kind: &str, o: &Obj) {
        buf.extend_from_slice(b"{\"type\":\"");
        buf.extend_from_slice(kind.as_bytes());
        buf.extend_from_slice(b"\",\"object\":");
        match self.encoding {
            Encoding::Json => buf.extend_from_slice(&o.json),
            Encoding::Table(v) => {
                let t = table::single(self.def, o, o.rv, v, crate::sim::clock::now_unix());
                buf.extend_from_slice(t.to_string().as_bytes());
            }
        }
        buf.extend_from_slice(b"}\n");
    }

    fn bookmark(&self, buf: &mut BytesMut, rv: u64, initial_events_end: bool) {
        let mut meta = serde_json::json!({"resourceVersion": rv.to_string()});
        // 1.20 encodes the unset timestamp as `null`; the current release leaves it out.
        if self.kube_version == KubeVersion::V1_20 {
            meta["creationTimestamp"] = serde_json::Value::Null;
        }
        if initial_events_end {
            meta["annotations"] = serde_json::json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = serde_json::json!({"kind": self.def.kind, "apiVersion": self.def.api_version(), "metadata": meta});
        buf.put_slice(format!("{{\"type\":\"BOOKMARK\",\"object\":{obj}}}\n").as_bytes());
    }

    /// Hands the buffered events to the connection; false once the client is gone.
    async fn send(&self, buf: &mut BytesMut) -> bool {
        if buf.is_empty() {
            return true;
        }
        self.tx.send(buf.split().freeze()).await.is_ok()
    }
}
