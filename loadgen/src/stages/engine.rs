//! The Stage engine, event-driven as kwok's: when a watch shows an object
//! (ADDED or MODIFIED) the Stage it now matches is chosen (by weight among
//! several) and scheduled after its delay (divided by `--time-scale`); when
//! the delay is up and the object still matches, the Stage's requests are
//! sent. A later event that keeps the object on the same Stage keeps its
//! timer (a heartbeat is not pushed back by other writes); one that moves it
//! elsewhere replaces it. `immediateNextStage` evaluates the object the
//! server returned at once instead of waiting for its watch event.
//!
//! One task owns all state (no locks): a map of the objects it follows, one
//! heap of timers, at most `max_in_flight` applications at once. Due Stages
//! beyond that wait in a queue of at most [`MAX_READY`]; past it they are
//! dropped and counted (`stages.dropped`), and the object is evaluated again
//! on its next event.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::feed::SeenObject;
use super::next::{Action, ActionKind};
use super::{Kind, StageSet};
use crate::record::{ErrorClass, OpRecorder, Outcome};
use crate::target::ApiClient;

/// Due Stages waiting for a free application slot, at most.
pub const MAX_READY: usize = 100_000;

/// Operation names in the report, one per kind of request.
pub fn op_name(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::Event => "stage-event",
        ActionKind::Finalizers => "stage-finalizers",
        ActionKind::Delete => "stage-delete",
        ActionKind::Status => "stage-status",
        ActionKind::Patch => "stage-patch",
    }
}

/// `summary.json` → `nodes.stages`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StagesSummary {
    /// Times each Stage was applied, by name.
    pub applied: std::collections::BTreeMap<String, u64>,
    pub failed_requests: u64,
    pub render_errors: u64,
    pub dropped: u64,
}

/// Counters of the engine, for the report and tests.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// The Stages' names, by index.
    pub names: Vec<String>,
    /// Stages applied (all their requests sent), by Stage index.
    pub applied: Vec<AtomicU64>,
    /// Requests that failed (non-2xx other than 404/409, or no answer).
    pub failed: AtomicU64,
    /// Stages whose templates did not render.
    pub render_errors: AtomicU64,
    /// Due Stages dropped at [`MAX_READY`].
    pub dropped: AtomicU64,
}

impl EngineStats {
    pub fn new(set: &StageSet) -> EngineStats {
        EngineStats {
            names: set.stages.iter().map(|s| s.name.clone()).collect(),
            applied: set.stages.iter().map(|_| AtomicU64::new(0)).collect(),
            ..Default::default()
        }
    }

    pub fn summary(&self) -> StagesSummary {
        let mut applied = std::collections::BTreeMap::new();
        for (name, n) in self.names.iter().zip(&self.applied) {
            *applied.entry(name.clone()).or_insert(0) += n.load(Ordering::Relaxed);
        }
        StagesSummary {
            applied,
            failed_requests: self.failed.load(Ordering::Relaxed),
            render_errors: self.render_errors.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }

    pub fn applied(&self, stage: usize) -> u64 {
        self.applied
            .get(stage)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }
}

type Key = (Kind, String);

/// Which nodes' objects an engine follows.
#[derive(Debug, Clone)]
pub enum Scope {
    /// These nodes and the pods bound to them (loadgen's simulated nodes, among real ones).
    Nodes(Arc<HashSet<String>>),
    /// Every node and every pod bound to one: the engine is the cluster's only kubelet
    /// (the simulated apiserver's `--kubelet`).
    AllNodes,
}

impl Scope {
    fn contains(&self, node: &str) -> bool {
        match self {
            Scope::Nodes(names) => names.contains(node),
            Scope::AllNodes => !node.is_empty(),
        }
    }
}

struct Followed {
    obj: Value,
    /// The scheduled Stage and its timer generation.
    pending: Option<(usize, u64)>,
    generation: u64,
    in_flight: bool,
    /// An event came while a Stage was being applied.
    dirty: bool,
}

/// A Stage due on an object: the requests to send.
pub struct Job {
    pub key: (Kind, String),
    pub stage: usize,
    pub actions: Vec<Action>,
}

/// A [`Job`] done: the object the server last returned, if any.
pub struct Done {
    pub key: (Kind, String),
    pub stage: usize,
    pub object: Option<Value>,
}

/// The engine's state; [`Engine::drive`] runs it.
pub struct Engine {
    set: Arc<StageSet>,
    time_scale: f64,
    /// Only these nodes and the pods on them are followed.
    scope: Scope,
    rng: StdRng,
    objects: HashMap<Key, Followed>,
    timers: BinaryHeap<Reverse<(Instant, u64, Key, u64)>>,
    seq: u64,
    ready: VecDeque<Job>,
    pub stats: Arc<EngineStats>,
}

fn key_of(obj: &Value, kind: Kind) -> Key {
    let m = &obj["metadata"];
    let name = m["name"].as_str().unwrap_or("");
    match kind {
        Kind::Node => (kind, name.to_string()),
        Kind::Pod => (
            kind,
            format!("{}/{name}", m["namespace"].as_str().unwrap_or("")),
        ),
    }
}

fn rv_of(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

impl Engine {
    pub fn new(set: Arc<StageSet>, time_scale: f64, scope: Scope, seed: u64) -> Engine {
        let stats = Arc::new(EngineStats::new(&set));
        Engine {
            set,
            time_scale: if time_scale > 0.0 { time_scale } else { 1.0 },
            scope,
            rng: StdRng::seed_from_u64(seed),
            objects: HashMap::new(),
            timers: BinaryHeap::new(),
            seq: 0,
            ready: VecDeque::new(),
            stats,
        }
    }

    /// Objects followed now.
    pub fn followed(&self) -> usize {
        self.objects.len()
    }

    fn ours(&self, seen: &SeenObject) -> bool {
        let name = match seen.kind {
            Kind::Node => &seen.object["metadata"]["name"],
            Kind::Pod => &seen.object["spec"]["nodeName"],
        };
        name.as_str().is_some_and(|n| self.scope.contains(n))
    }

    /// A watch event (or listed object).
    pub fn on_seen(&mut self, seen: SeenObject, now: Instant) {
        if !self.ours(&seen) {
            return;
        }
        let key = key_of(&seen.object, seen.kind);
        if seen.deleted {
            self.objects.remove(&key);
            return;
        }
        let st = self.objects.entry(key.clone()).or_insert_with(|| Followed {
            obj: Value::Null,
            pending: None,
            generation: 0,
            in_flight: false,
            dirty: false,
        });
        // A relist may bring an older copy than a watch event already did.
        if st.obj.is_null() || rv_of(&seen.object) >= rv_of(&st.obj) {
            st.obj = seen.object;
        }
        if st.in_flight {
            st.dirty = true;
            return;
        }
        self.evaluate(key, now);
    }

    /// Chooses the Stage for the object as it is now and schedules it.
    fn evaluate(&mut self, key: Key, now: Instant) {
        let Some(st) = self.objects.get(&key) else {
            return;
        };
        let chosen = match st.pending {
            // Still on the scheduled Stage: keep its timer.
            Some((s, _)) if self.set.stages[s].selector.matches(&st.obj) => return,
            _ => self.set.select(key.0, &st.obj, &mut self.rng),
        };
        let now_ms = i64::try_from(crate::ops::unix_nanos() / 1_000_000).unwrap_or(i64::MAX);
        let delay = chosen.map(|s| {
            let d = self.set.stages[s]
                .delay
                .delay(&st.obj, now_ms, &mut self.rng);
            d.div_f64(self.time_scale)
        });
        let Some(st) = self.objects.get_mut(&key) else {
            return;
        };
        st.generation += 1;
        st.pending = chosen.map(|s| (s, st.generation));
        if let (Some(_), Some(delay)) = (chosen, delay) {
            self.seq += 1;
            self.timers
                .push(Reverse((now + delay, self.seq, key, st.generation)));
        }
    }

    /// When the next timer is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse(t)| t.0)
    }

    /// Moves every Stage due by `now` to the ready queue.
    pub fn fire_due(&mut self, now: Instant) {
        while let Some(Reverse((at, ..))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, _, key, generation))) = self.timers.pop() else {
                break;
            };
            self.fire(key, generation, now);
        }
    }

    fn fire(&mut self, key: Key, generation: u64, now: Instant) {
        let Some(st) = self.objects.get_mut(&key) else {
            return;
        };
        let Some((stage, g)) = st.pending else {
            return;
        };
        if g != generation || st.in_flight {
            return;
        }
        st.pending = None;
        let s = &self.set.stages[stage];
        if !s.selector.matches(&st.obj) {
            self.evaluate(key, now);
            return;
        }
        match s.next.actions(key.0, &st.obj, &s.name) {
            Ok(actions) => {
                if self.ready.len() >= MAX_READY {
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                st.in_flight = true;
                self.ready.push_back(Job {
                    key,
                    stage,
                    actions,
                });
            }
            Err(e) => {
                if self.stats.render_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(stage = %s.name, origin = %s.origin, error = %e, "stage cannot be applied");
                }
            }
        }
    }

    /// The next job to send, if any.
    pub fn take_ready(&mut self) -> Option<Job> {
        self.ready.pop_front()
    }

    /// A job finished.
    pub fn on_done(&mut self, done: Done, now: Instant) {
        if let Some(a) = self.stats.applied.get(done.stage) {
            a.fetch_add(1, Ordering::Relaxed);
        }
        let immediate = self.set.stages[done.stage].immediate_next;
        let Some(st) = self.objects.get_mut(&done.key) else {
            return;
        };
        st.in_flight = false;
        if let Some(o) = done.object {
            if o["kind"].as_str() == Some(done.key.0.name()) && rv_of(&o) >= rv_of(&st.obj) {
                st.obj = o;
            }
        }
        if immediate || std::mem::take(&mut st.dirty) {
            self.evaluate(done.key, now);
        }
    }

    /// Runs until `stop` (or the channel closes and nothing is left to do):
    /// events from `rx`, timers, and `apply` for each due Stage, at most
    /// `max_in_flight` at once.
    pub async fn drive<A, F>(
        mut self,
        mut rx: mpsc::Receiver<SeenObject>,
        apply: A,
        max_in_flight: usize,
        stop: CancellationToken,
    ) -> Engine
    where
        A: Fn(Job) -> F,
        F: Future<Output = Done>,
    {
        let mut in_flight = FuturesUnordered::new();
        let mut open = true;
        loop {
            while in_flight.len() < max_in_flight.max(1) {
                match self.take_ready() {
                    Some(job) => in_flight.push(apply(job)),
                    None => break,
                }
            }
            if !open && in_flight.is_empty() && self.timers.is_empty() {
                return self;
            }
            let due = self.next_due();
            tokio::select! {
                biased;
                _ = stop.cancelled() => return self,
                Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                    self.on_done(done, Instant::now());
                }
                seen = rx.recv(), if open => match seen {
                    Some(seen) => self.on_seen(seen, Instant::now()),
                    None => open = false,
                },
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    self.fire_due(Instant::now());
                }
            }
        }
    }
}

/// Sends a job's requests in order, each recorded under its operation
/// (`stage-status`, …); stops at the first failure (a 404: the object is
/// gone). Returns the last object the server answered with.
pub async fn send_job(
    client: &ApiClient,
    job: Job,
    timeout: Duration,
    recorders: &HashMap<ActionKind, Arc<OpRecorder>>,
    stats: &EngineStats,
) -> Done {
    let mut object = None;
    for a in job.actions {
        let started = Instant::now();
        let mut outcome = Outcome::default();
        let sent = async {
            let req = client
                .request(a.method.clone(), &a.path, a.body.clone())
                .ok()?;
            let resp = client.send(req).await.ok()?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            Some((status, body))
        };
        let result = tokio::time::timeout(timeout, sent).await;
        let mut ok = false;
        match result {
            Ok(Some((status, body))) => {
                outcome.status = Some(status);
                outcome.bytes = body.len() as u64;
                ok = (200..300).contains(&status);
                if ok && matches!(a.kind, ActionKind::Status | ActionKind::Patch) {
                    object = serde_json::from_slice::<Value>(&body).ok();
                }
                if !ok && status != 404 && status != 409 {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(None) => {
                outcome.error = Some(ErrorClass::Connection);
                stats.failed.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                outcome.error = Some(ErrorClass::Timeout);
                stats.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(rec) = recorders.get(&a.kind) {
            rec.record(&outcome, started.elapsed(), false);
        }
        if !ok {
            break;
        }
    }
    Done {
        key: job.key,
        stage: job.stage,
        object,
    }
}
