//! Declarative objects: a phase says how many replicas of each bundle object
//! should exist per namespace; more than exist → creates, fewer → deletes,
//! the same number → every replica updated (PUT) to the phase's template.
//! Units (one namespace × replica number, the bundle's objects in order) are
//! spread in time by the phase's tuning set.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::measure::{ApiCalls, CallKey};
use super::template::Context;
use super::tuning;
use super::validate::{ObjectPhase, ObjectSet};
use crate::ops::{unix_nanos, Planned, Resource, MANAGED_BY, WRITTEN_AT};
use crate::send::{self, SendOptions};
use crate::target::ApiClient;

/// The DeleteOptions CL2 sends with every object it deletes.
const BACKGROUND_DELETE: &str =
    r#"{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}"#;

/// Label naming the scenario on every object it creates.
pub const SCENARIO_LABEL: &str = "loadgen.tollgate.dev/scenario";

/// What exists, by (namespace or "", [`ObjectSet::key`]): replicas and where they live.
#[derive(Debug, Default)]
pub struct Live {
    sets: Mutex<HashMap<(String, String), (u32, Resource)>>,
    /// Namespaces checked as writable (managed, or labelled as loadgen's).
    writable: Mutex<BTreeSet<String>>,
}

impl Live {
    /// Namespaces the run manages (created by it) are writable from the start.
    pub fn with_managed(namespaces: &[String]) -> Live {
        let live = Live::default();
        lock(&live.writable).extend(namespaces.iter().cloned());
        live
    }

    fn replicas(&self, ns: &str, set: &ObjectSet) -> u32 {
        lock(&self.sets)
            .get(&(ns.to_string(), set.key()))
            .map(|(n, _)| *n)
            .unwrap_or(0)
    }

    /// Cluster-scoped objects that exist: (resource, name); removed at cleanup.
    pub fn cluster_scoped(&self) -> Vec<(Resource, String)> {
        let sets = lock(&self.sets);
        let mut out = Vec::new();
        for ((ns, key), (n, resource)) in sets.iter() {
            if ns.is_empty() {
                let basename = key.rsplit('/').next().unwrap_or(key);
                out.extend((0..*n).map(|i| (resource.clone(), format!("{basename}-{i}"))));
            }
        }
        out
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a phase did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectTally {
    pub created: u64,
    pub updated: u64,
    pub deleted: u64,
    pub failed: u64,
    /// The first failure, for the step's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// How late units started against their tuning set's schedule (ms): the
    /// spreader's own accuracy, not the server's.
    #[serde(default)]
    pub start_lag_ms: crate::report::StartLag,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Update,
    Delete,
}

/// What one reconcile needs from the run.
pub struct ReconcileCtx<'a> {
    pub client: &'a ApiClient,
    pub send: &'a SendOptions,
    pub scenario: &'a str,
    pub params: &'a std::collections::BTreeMap<String, Value>,
    pub seed: u64,
    pub calls: &'a ApiCalls,
}

/// Brings `phase`'s objects to their declared state; `live` is updated.
pub async fn reconcile(phase: &ObjectPhase, live: &Live, ctx: &ReconcileCtx<'_>) -> ObjectTally {
    reconcile_until(phase, live, ctx, &CancellationToken::new()).await
}

/// [`reconcile`], but once `stop` is cancelled (a signal) no further unit
/// starts; those under way finish and are counted. A stopped phase leaves
/// `live` as it was: the run's cleanup deletes its namespaces anyway.
pub async fn reconcile_until(
    phase: &ObjectPhase,
    live: &Live,
    ctx: &ReconcileCtx<'_>,
    stop: &CancellationToken,
) -> ObjectTally {
    let namespaces: Vec<String> = phase
        .namespaces
        .clone()
        .unwrap_or_else(|| vec![String::new()]);
    let tally = Mutex::new(ObjectTally::default());
    for ns in namespaces.iter().filter(|n| !n.is_empty()) {
        if let Err(e) = ensure_writable(ctx.client, live, ns).await {
            let mut t = lock(&tally);
            t.failed += 1;
            t.first_error.get_or_insert(e);
            return t.clone();
        }
    }
    let work = Work::new(phase, live, &namespaces);
    let offsets = match &phase.tuning {
        Some(t) => t.offsets(work.units.len(), ctx.seed),
        None => vec![Duration::ZERO; work.units.len()],
    };
    let start = Instant::now();
    let lag = Mutex::new(crate::record::new_histogram());
    let shape = phase.tuning.as_ref().map(|t| &t.shape);
    tuning::spread_shaped(&offsets, shape, start, stop, |u| {
        let (ns, i) = work.units[u].clone();
        let late = start.elapsed().saturating_sub(offsets[u]);
        lock(&lag).saturating_record(u64::try_from(late.as_micros()).unwrap_or(u64::MAX).max(1));
        run_unit(phase, &work, ns, i, ctx, &tally)
    })
    .await;
    if !stop.is_cancelled() {
        record_live(phase, live, &namespaces);
    }
    let mut out = lock(&tally).clone();
    let lag = lock(&lag);
    if !lag.is_empty() {
        out.start_lag_ms = crate::report::StartLag {
            p99: crate::record::ms(lag.value_at_quantile(0.99)),
            max: crate::record::ms(lag.max()),
        };
    }
    out
}

/// A phase's units: which replica of which bundle object each creates,
/// updates or deletes.
struct Work {
    /// Every (namespace, replica) with something to do, in order.
    units: Vec<(String, u64)>,
    /// Each bundle object's replicas before the phase, by (namespace, index in the bundle).
    before: HashMap<(String, usize), u32>,
    /// The replicas the phase declares.
    want: u32,
    /// How many objects the bundle has.
    bundle: usize,
}

impl Work {
    fn new(phase: &ObjectPhase, live: &Live, namespaces: &[String]) -> Work {
        let mut work = Work {
            units: Vec::new(),
            before: HashMap::new(),
            want: phase.replicas,
            bundle: phase.bundle.len(),
        };
        let mut units = Vec::new();
        for ns in namespaces {
            let mut top = 0;
            for (j, set) in phase.bundle.iter().enumerate() {
                let prev = live.replicas(ns, set);
                work.before.insert((ns.clone(), j), prev);
                top = top.max(prev.max(phase.replicas));
            }
            units.extend((0..u64::from(top)).map(|i| (ns.clone(), i)));
        }
        // Only units with something to do take a slot in the tuning set's
        // schedule (scaling 100 → 200 spreads 100 creates, not 200 units).
        work.units = units
            .into_iter()
            .filter(|(ns, i)| (0..work.bundle).any(|j| work.op(ns, j, *i).is_some()))
            .collect();
        work
    }

    /// What replica `i` of bundle object `j` in `ns` needs, if anything.
    fn op(&self, ns: &str, j: usize, i: u64) -> Option<Op> {
        let prev = u64::from(self.before[&(ns.to_string(), j)]);
        let want = u64::from(self.want);
        if i >= prev && i < want {
            Some(Op::Create)
        } else if i >= want && i < prev {
            Some(Op::Delete)
        } else if i < want && prev == want {
            Some(Op::Update)
        } else {
            None
        }
    }

    /// Unit (`ns`, `i`)'s writes: creates and updates in bundle order, deletes
    /// in reverse (a service before its deployment, removed after it).
    fn order(&self, ns: &str, i: u64) -> Vec<(usize, Op)> {
        let mut order: Vec<(usize, Op)> = (0..self.bundle)
            .filter_map(|j| self.op(ns, j, i).map(|op| (j, op)))
            .collect();
        order.sort_by_key(|(j, op)| match op {
            Op::Delete => usize::MAX - j,
            _ => *j,
        });
        order
    }
}

/// Performs one unit's writes, counting each in `tally`.
async fn run_unit(
    phase: &ObjectPhase,
    work: &Work,
    ns: String,
    i: u64,
    ctx: &ReconcileCtx<'_>,
    tally: &Mutex<ObjectTally>,
) {
    for (j, op) in work.order(&ns, i) {
        let r = one(&phase.bundle[j], op, &ns, i, ctx).await;
        let mut t = lock(tally);
        match r {
            Ok(()) => match op {
                Op::Create => t.created += 1,
                Op::Update => t.updated += 1,
                Op::Delete => t.deleted += 1,
            },
            Err(e) => {
                t.failed += 1;
                t.first_error.get_or_insert(e);
            }
        }
    }
}

/// Records in `live` the replicas `phase` declared.
fn record_live(phase: &ObjectPhase, live: &Live, namespaces: &[String]) {
    let mut sets = lock(&live.sets);
    for ns in namespaces {
        for set in &phase.bundle {
            let key = (ns.clone(), set.key());
            if phase.replicas == 0 {
                sets.remove(&key);
            } else {
                sets.insert(key, (phase.replicas, set.resource.clone()));
            }
        }
    }
}

/// The object `set` renders for replica `i` in `ns`, with the name, namespace,
/// loadgen's labels and the write stamp that watch latency is measured by.
pub fn render(set: &ObjectSet, ns: &str, i: u64, ctx: &ReconcileCtx<'_>) -> Result<Value, String> {
    let name = format!("{}-{i}", set.basename);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (ctx.seed, ns, &set.basename, i).hash(&mut h);
    let mut rng = rand::rngs::StdRng::seed_from_u64(h.finish());
    let text = set
        .template
        .render(
            &Context {
                name: &name,
                namespace: ns,
                n: i,
                params: ctx.params,
            },
            &mut rng,
        )
        .map_err(|e| format!("{} rendered for {name}: {e}", set.template_path.display()))?;
    let mut v: Value = serde_saphyr::from_str(&text)
        .map_err(|e| format!("{} rendered for {name}: {e}", set.template_path.display()))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(format!(
            "{} rendered for {name}: not a mapping",
            set.template_path.display()
        ));
    };
    obj.entry("apiVersion")
        .or_insert_with(|| set.api_version.clone().into());
    obj.entry("kind").or_insert_with(|| set.kind.clone().into());
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| serde_json::json!({}));
    if !meta.is_object() {
        *meta = serde_json::json!({});
    }
    meta["name"] = name.into();
    if set.resource.namespaced {
        meta["namespace"] = ns.into();
    }
    if !meta["labels"].is_object() {
        meta["labels"] = serde_json::json!({});
    }
    meta["labels"][MANAGED_BY.0] = MANAGED_BY.1.into();
    meta["labels"][SCENARIO_LABEL] = label_value(ctx.scenario).into();
    if !meta["annotations"].is_object() {
        meta["annotations"] = serde_json::json!({});
    }
    meta["annotations"][WRITTEN_AT] = unix_nanos().to_string().into();
    Ok(v)
}

/// A valid label value: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn label_value(s: &str) -> String {
    let mut v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    v.truncate(63);
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

async fn one(
    set: &ObjectSet,
    op: Op,
    ns: &str,
    i: u64,
    ctx: &ReconcileCtx<'_>,
) -> Result<(), String> {
    let name = format!("{}-{i}", set.basename);
    let r = &set.resource;
    let scope = |s: &str| {
        if r.namespaced {
            s.to_string()
        } else {
            "cluster".to_string()
        }
    };
    let (planned, key) = match op {
        Op::Create | Op::Update => {
            let body = serde_json::to_vec(&render(set, ns, i, ctx)?).map_err(|e| e.to_string())?;
            let (method, path, verb, sc) = if op == Op::Create {
                (
                    Method::POST,
                    r.collection_path(Some(ns)),
                    "POST",
                    scope("namespace"),
                )
            } else {
                (
                    Method::PUT,
                    r.object_path(ns, &name),
                    "PUT",
                    "resource".to_string(),
                )
            };
            (
                Planned {
                    method,
                    path,
                    body: Some(("application/json", Bytes::from(body))),
                },
                CallKey {
                    verb: verb.into(),
                    resource: r.plural.clone(),
                    scope: sc,
                },
            )
        }
        // As CL2's DeleteObject: the object with its dependants (a Job's pods, a Deployment's
        // ReplicaSets), which batch/v1 Jobs and ReplicationControllers would otherwise orphan.
        Op::Delete => (
            Planned {
                method: Method::DELETE,
                path: r.object_path(ns, &name),
                body: Some((
                    "application/json",
                    Bytes::from_static(BACKGROUND_DELETE.as_bytes()),
                )),
            },
            CallKey {
                verb: "DELETE".into(),
                resource: r.plural.clone(),
                scope: "resource".into(),
            },
        ),
    };
    let t0 = Instant::now();
    let sent = send::send(ctx.client, &planned, ctx.send, false).await;
    ctx.calls.record(&key, &sent.outcome, t0.elapsed());
    if sent.outcome.is_success() {
        return Ok(());
    }
    let why = match (sent.outcome.status, sent.outcome.error) {
        (Some(code), _) => format!("HTTP {code}"),
        (None, Some(e)) => format!("{e:?}"),
        (None, None) => "no answer".into(),
    };
    Err(format!("{} {}: {why}", planned.method, planned.path))
}

/// Writes go only into namespaces the run manages or that are labelled as
/// loadgen's (e.g. created by an earlier phase from a template).
async fn ensure_writable(client: &ApiClient, live: &Live, ns: &str) -> Result<(), String> {
    if lock(&live.writable).contains(ns) {
        return Ok(());
    }
    let refuse = |why: String| format!("refusing to write into namespace `{ns}`: {why}");
    let req = client
        .request(Method::GET, &format!("/api/v1/namespaces/{ns}"), None)
        .map_err(|e| refuse(e.to_string()))?;
    let resp = client.send(req).await.map_err(|e| refuse(e.to_string()))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if status != 200 {
        return Err(refuse(format!("GET namespace answered HTTP {status}")));
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
    if v["metadata"]["labels"][MANAGED_BY.0].as_str() != Some(MANAGED_BY.1) {
        return Err(refuse(format!(
            "it is not labelled {}={}",
            MANAGED_BY.0, MANAGED_BY.1
        )));
    }
    lock(&live.writable).insert(ns.to_string());
    Ok(())
}
