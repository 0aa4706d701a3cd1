//! The Stage engine on a paused clock, against a fake server that applies
//! what the engine sends and echoes it back as watch events: delays fall
//! inside kwok's bounds (scaled by --time-scale), heartbeats repeat at their
//! interval without being scheduled twice, deleted pods go.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadgen::stages::engine::{Done, Engine, Job, Scope};
use loadgen::stages::feed::SeenObject;
use loadgen::stages::next::ActionKind;
use loadgen::stages::{Kind, StageSet};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod stages_common;
use stages_common::merge;

fn load(rels: &[&str]) -> Arc<StageSet> {
    Arc::new(stages_common::load(rels))
}

/// What the fake server did: (when, stage index, action kinds).
type Log = Arc<Mutex<Vec<(Instant, usize, Vec<ActionKind>)>>>;

struct Fake {
    objects: Arc<Mutex<HashMap<String, Value>>>,
    log: Log,
    tx: mpsc::Sender<SeenObject>,
    rv: Arc<Mutex<u64>>,
}

impl Fake {
    fn apply(&self, job: Job) -> impl std::future::Future<Output = Done> + use<> {
        let (objects, log, tx, rv) = (
            self.objects.clone(),
            self.log.clone(),
            self.tx.clone(),
            self.rv.clone(),
        );
        async move {
            // A request takes 5 ms of (paused) time.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let kinds: Vec<ActionKind> = job.actions.iter().map(|a| a.kind).collect();
            log.lock().unwrap().push((Instant::now(), job.stage, kinds));
            let mut returned = None;
            let mut event = None;
            {
                let mut objs = objects.lock().unwrap();
                for a in &job.actions {
                    let body: Value = a
                        .body
                        .as_ref()
                        .map(|(_, b)| serde_json::from_slice(b).unwrap())
                        .unwrap_or(Value::Null);
                    match a.kind {
                        ActionKind::Delete => {
                            if let Some(o) = objs.remove(&job.key.1) {
                                event = Some(SeenObject {
                                    kind: job.key.0,
                                    deleted: true,
                                    object: o,
                                });
                            }
                        }
                        ActionKind::Event => {}
                        _ => {
                            let Some(o) = objs.get_mut(&job.key.1) else {
                                continue;
                            };
                            merge(o, &body);
                            let mut r = rv.lock().unwrap();
                            *r += 1;
                            o["metadata"]["resourceVersion"] = json!(r.to_string());
                            returned = Some(o.clone());
                            event = Some(SeenObject {
                                kind: job.key.0,
                                deleted: false,
                                object: o.clone(),
                            });
                        }
                    }
                }
            }
            if let Some(e) = event {
                let _ = tx.send(e).await;
            }
            Done {
                key: job.key,
                stage: job.stage,
                object: returned,
            }
        }
    }
}

struct Harness {
    fake: Arc<Fake>,
    tx: mpsc::Sender<SeenObject>,
    stop: CancellationToken,
    engine: tokio::task::JoinHandle<Engine>,
}

fn harness(set: Arc<StageSet>, time_scale: f64) -> Harness {
    let (tx, rx) = mpsc::channel(1024);
    let fake = Arc::new(Fake {
        objects: Arc::default(),
        log: Arc::default(),
        tx: tx.clone(),
        rv: Arc::new(Mutex::new(100)),
    });
    let nodes: HashSet<String> = ["n1".to_string()].into();
    let engine = Engine::new(set, time_scale, Scope::Nodes(Arc::new(nodes)), 7);
    let stop = CancellationToken::new();
    let f = fake.clone();
    let engine = tokio::spawn(engine.drive(rx, move |job| f.apply(job), 64, stop.clone()));
    Harness {
        fake,
        tx,
        stop,
        engine,
    }
}

impl Harness {
    async fn add(&self, key: &str, kind: Kind, obj: Value) {
        self.fake
            .objects
            .lock()
            .unwrap()
            .insert(key.to_string(), obj.clone());
        self.tx
            .send(SeenObject {
                kind,
                deleted: false,
                object: obj,
            })
            .await
            .unwrap();
    }

    fn get(&self, key: &str) -> Option<Value> {
        self.fake.objects.lock().unwrap().get(key).cloned()
    }

    /// Waits (in paused time) until `cond` holds, at most `limit`.
    async fn until(&self, limit: Duration, cond: impl Fn(&Harness) -> bool) {
        let deadline = Instant::now() + limit;
        while !cond(self) {
            assert!(Instant::now() < deadline, "not reached within {limit:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Pending"}})
}

#[tokio::test(start_paused = true)]
async fn general_pod_stages_apply_within_kwoks_bounds_scaled() {
    let set = load(&[
        "pod/general/pod-create.yaml",
        "pod/general/pod-ready.yaml",
        "pod/general/pod-delete.yaml",
    ]);
    let names: Vec<String> = set.stages.iter().map(|s| s.name.clone()).collect();
    let h = harness(set, 10.0);
    let t0 = Instant::now();
    h.add("ns/p", Kind::Pod, pod()).await;
    // A pod on another node is not ours.
    let mut other = pod();
    other["spec"]["nodeName"] = json!("elsewhere");
    other["metadata"]["name"] = json!("q");
    h.add("ns/q", Kind::Pod, other).await;
    h.until(Duration::from_secs(5), |h| {
        h.get("ns/p")
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let log = h.fake.log.lock().unwrap().clone();
    let steps: Vec<&str> = log.iter().map(|(_, s, _)| names[*s].as_str()).collect();
    assert_eq!(steps, ["pod-create", "pod-ready"]);
    assert!(log[0].2.contains(&ActionKind::Event) && log[0].2.contains(&ActionKind::Status));
    // kwok: delay uniform in [1 s, 5 s) for both, here ÷10; +5 ms per fake request.
    let mut from = t0;
    for (at, stage, _) in &log {
        let d = *at - from - Duration::from_millis(5);
        assert!(
            d >= Duration::from_millis(100) && d < Duration::from_millis(500),
            "{} after {d:?}",
            names[*stage]
        );
        from = *at;
    }
    // Deletion: deletionTimestamp 30 s ahead (graceful); the delete Stage
    // fires between 1 s and then, ÷10.
    let mut p = h.get("ns/p").unwrap();
    let ts = loadgen::ops::rfc3339(loadgen::ops::unix_nanos() + 30_000_000_000);
    p["metadata"]["deletionTimestamp"] = json!(ts);
    p["metadata"]["resourceVersion"] = json!("1000");
    let t1 = Instant::now();
    h.add("ns/p", Kind::Pod, p).await;
    h.until(Duration::from_secs(10), |h| h.get("ns/p").is_none())
        .await;
    let (at, stage, kinds) = h.fake.log.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        (names[stage].as_str(), kinds),
        ("pod-delete", vec![ActionKind::Delete])
    );
    let d = at - t1 - Duration::from_millis(5);
    assert!(
        d >= Duration::from_millis(100) && d <= Duration::from_secs(3),
        "{d:?}"
    );
    assert!(h
        .get("ns/q")
        .is_some_and(|q| q["status"]["phase"] == "Pending"));
    h.stop.cancel();
    let engine = h.engine.await.unwrap();
    assert_eq!(engine.followed(), 0, "the deleted pod is forgotten");
}

#[tokio::test(start_paused = true)]
async fn node_heartbeat_stage_repeats_at_its_interval_and_never_twice() {
    let set = load(&[
        "node/fast/node-initialize.yaml",
        "node/heartbeat/node-heartbeat.yaml",
    ]);
    let h = harness(set, 1.0);
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "uid": "n", "resourceVersion": "1"}, "spec": {}});
    h.add("n1", Kind::Node, node).await;
    // An unrelated write between heartbeats (as a label change) must not reset the timer.
    // The clock is paused: these sleeps advance virtual time (the engine's timers fire as
    // they come due), they do not wait for anything to happen.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut touched = h.get("n1").unwrap();
    touched["metadata"]["labels"] = json!({"x": "y"});
    touched["metadata"]["resourceVersion"] = json!("5000");
    h.add("n1", Kind::Node, touched).await;
    tokio::time::sleep(Duration::from_secs(250)).await;
    h.stop.cancel();
    let log = h.fake.log.lock().unwrap().clone();
    assert_eq!(log[0].1, 0, "node-initialize first");
    let beats: Vec<Instant> = log.iter().filter(|l| l.1 == 1).map(|l| l.0).collect();
    // 20–25 s apart (kwok's bounds) over ~260 s: 10 to 13 beats.
    assert!((10..=13).contains(&beats.len()), "{} beats", beats.len());
    for w in beats.windows(2) {
        let gap = w[1] - w[0];
        assert!(
            gap >= Duration::from_secs(20) && gap <= Duration::from_millis(25_010),
            "heartbeats {gap:?} apart"
        );
    }
}
