//! kwok-compatible Stages (`apiVersion: kwok.x-k8s.io/v1alpha1`, `kind:
//! Stage`): node and pod lifecycles driven by what the watches show, so a
//! simulated cluster's objects go Pending → Running → terminating → gone and
//! watchers see realistic MODIFIED/DELETED traffic. `loadgen/STAGES.md`
//! lists what is supported.
//!
//! # Layout
//! - [`document`]: the Stage document, read strictly (unknown fields refused by name).
//! - [`jq`]: jq expressions (selector keys, `*From`), compiled with jaq.
//! - [`selector`]: `matchLabels`, `matchAnnotations`, `matchExpressions`.
//! - [`delay`]: `delay` (duration, jitter, `durationFrom`, `jitterDurationFrom`).
//! - [`next`]: `next` as requests (event, finalizers, delete, status, patches).
//! - [`template`]: the Go text/template subset and kwok's template functions.
//! - [`feed`]: the informer over the simulated nodes and their pods, feeding the engine.
//! - [`engine`]: selection, weights, delays (time-scaled), applying; event-driven.
//! - this file: loading Stage files into a [`StageSet`], `--stages fast` (built in).

pub mod delay;
pub mod document;
pub mod engine;
pub mod feed;
pub mod jq;
pub mod next;
pub mod selector;
pub mod template;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::Rng;
use serde_json::{json, Value};

use document::StageDoc;
use next::{NextSpec, PatchSpec};
use selector::Matcher;

/// kwok's "fast" node and pod Stages, the built-in set (`--stages fast`).
pub const BUILTIN: &str = include_str!("builtin.yaml");
/// The `--stages` word for [`BUILTIN`].
pub const BUILTIN_NAME: &str = "fast";

/// The kinds of object Stages drive here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Node,
    Pod,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Pod => "Pod",
        }
    }
}

/// Why Stage documents were refused.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {reason}")]
    Invalid { origin: String, reason: String },
}

/// One compiled Stage.
#[derive(Debug, PartialEq)]
pub struct Stage {
    pub name: String,
    /// Where it came from (file, or `fast`), for messages.
    pub origin: String,
    pub kind: Kind,
    pub selector: Matcher,
    pub weight: i64,
    pub weight_from: Option<jq::Query>,
    pub delay: delay::DelaySpec,
    pub next: NextSpec,
    pub immediate_next: bool,
}

impl Stage {
    /// kwok's weight for `obj`: `weightFrom` when it finds an integer, else `weight`.
    pub fn weight_for(&self, input: &jq::Input) -> i64 {
        self.weight_from
            .as_ref()
            .and_then(|q| q.strings_on(input).into_iter().next())
            .and_then(|s| s.trim().parse::<i64>().ok())
            .unwrap_or(self.weight)
            .max(0)
    }
}

/// The loaded Stages.
#[derive(Debug, Default, PartialEq)]
pub struct StageSet {
    pub stages: Vec<Stage>,
}

/// Where Stages come from: `--stages FILE...` (or `fast`) and `--time-scale`.
#[derive(Debug, Clone, Default)]
pub struct StagesSpec {
    pub sources: Vec<String>,
    /// Delays are divided by this (10: ten times faster than written).
    pub time_scale: f64,
    pub loaded: Option<Arc<StageSet>>,
}

impl PartialEq for StagesSpec {
    fn eq(&self, other: &StagesSpec) -> bool {
        self.sources == other.sources && self.time_scale == other.time_scale
    }
}

impl StagesSpec {
    /// Loads `sources` (files, or `fast` for the built-in set); none: no Stages.
    pub fn load(sources: &[String], time_scale: f64) -> Result<StagesSpec, StageError> {
        if !(time_scale.is_finite() && time_scale > 0.0) {
            return Err(StageError::Invalid {
                origin: "--time-scale".into(),
                reason: format!("{time_scale} must be a positive number"),
            });
        }
        let loaded = if sources.is_empty() {
            None
        } else {
            let mut set = StageSet::default();
            for s in sources {
                let more = if s == BUILTIN_NAME {
                    StageSet::parse(BUILTIN, BUILTIN_NAME)?
                } else {
                    StageSet::load_file(Path::new(s))?
                };
                set.stages.extend(more.stages);
            }
            Some(Arc::new(set))
        };
        Ok(StagesSpec {
            sources: sources.to_vec(),
            time_scale,
            loaded,
        })
    }
}

fn kind_of(r: &document::ResourceRef) -> Option<Kind> {
    let core = matches!(r.api_group.as_str(), "v1" | "" | "core/v1");
    match (core, r.kind.as_str()) {
        (true, "Node") => Some(Kind::Node),
        (true, "Pod") => Some(Kind::Pod),
        _ => None,
    }
}

fn compile_from(
    f: &Option<document::ExpressionFrom>,
    field: &str,
) -> Result<Option<jq::Query>, String> {
    f.as_ref()
        .map(|e| {
            jq::Query::compile(&e.expression_from)
                .map_err(|m| format!("{field}.expressionFrom {:?}: {m}", e.expression_from))
        })
        .transpose()
}

impl StageSet {
    /// Reads every Stage document of a YAML file.
    pub fn load_file(path: &Path) -> Result<StageSet, StageError> {
        let text = std::fs::read_to_string(path).map_err(|source| StageError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        StageSet::parse(&text, &path.display().to_string())
    }

    /// Compiles the Stage documents in `text`; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<StageSet, StageError> {
        let docs = document::parse_all(text).map_err(|reason| StageError::Invalid {
            origin: origin.to_string(),
            reason,
        })?;
        let mut stages = Vec::new();
        for doc in docs {
            let name = doc.metadata.name.clone();
            let stage = compile(doc, origin).map_err(|reason| StageError::Invalid {
                origin: format!("{origin}: Stage {name:?}"),
                reason,
            })?;
            stages.push(stage);
        }
        Ok(StageSet { stages })
    }

    /// Whether some Stage keeps re-applying to a running, Ready node and
    /// writes its heartbeat time: then loadgen's own status heartbeat is off,
    /// so a node is never patched twice.
    pub fn has_node_heartbeat(&self) -> bool {
        let ready = json!({"metadata": {"name": "probe", "labels": {}, "annotations": {}},
            "status": {"phase": "Running", "conditions": template::funcs::node_conditions()}});
        self.stages.iter().any(|s| {
            s.kind == Kind::Node
                && s.selector.matches(&ready)
                && !s.next.delete
                && s.next.status.is_some()
                && s.next.status_mentions("lastHeartbeatTime")
        })
    }

    /// Whether any Stage is for `kind`.
    pub fn has(&self, kind: Kind) -> bool {
        self.stages.iter().any(|s| s.kind == kind)
    }

    /// The Stage to apply to `obj`, if any: among those whose selector
    /// matches, one at random in proportion to its weight (all weights zero:
    /// uniformly), as kwok.
    pub fn select(&self, kind: Kind, obj: &Value, rng: &mut impl Rng) -> Option<usize> {
        let input = jq::Input::new(obj)?;
        let matching: Vec<(usize, i64)> = self
            .stages
            .iter()
            .enumerate()
            .filter(|(_, s)| s.kind == kind && s.selector.matches_on(obj, &input))
            .map(|(i, s)| (i, s.weight_for(&input)))
            .collect();
        match matching.as_slice() {
            [] => None,
            [(i, _)] => Some(*i),
            _ => {
                let total: i64 = matching.iter().map(|m| m.1).sum();
                if total <= 0 {
                    return Some(matching[rng.random_range(0..matching.len())].0);
                }
                let mut pick = rng.random_range(0..total);
                for (i, w) in &matching {
                    if pick < *w {
                        return Some(*i);
                    }
                    pick -= w;
                }
                matching.last().map(|m| m.0)
            }
        }
    }
}

fn compile(doc: StageDoc, origin: &str) -> Result<Stage, String> {
    if doc.api_version != document::API_VERSION {
        return Err(format!(
            "apiVersion {:?}: only {} is supported",
            doc.api_version,
            document::API_VERSION
        ));
    }
    if doc.kind != document::KIND {
        return Err(format!("kind {:?}: only Stage is supported", doc.kind));
    }
    let spec = doc.spec;
    let kind = kind_of(&spec.resource_ref).ok_or_else(|| {
        format!(
            "spec.resourceRef {}/{}: only v1 Node and v1 Pod are supported",
            spec.resource_ref.api_group, spec.resource_ref.kind
        )
    })?;
    let selector =
        Matcher::compile(&spec.selector.unwrap_or_default()).map_err(|m| format!("spec.{m}"))?;
    let d = spec.delay.unwrap_or_default();
    let delay = delay::DelaySpec {
        duration_ms: d.duration_milliseconds,
        duration_from: compile_from(&d.duration_from, "spec.delay.durationFrom")?,
        jitter_ms: d.jitter_duration_milliseconds,
        jitter_from: compile_from(&d.jitter_duration_from, "spec.delay.jitterDurationFrom")?,
    };
    let n = spec.next;
    let status = n
        .status_template
        .as_deref()
        .map(template::Template::parse)
        .transpose()
        .map_err(|e| format!("spec.next.statusTemplate: {e}"))?;
    let mut patches = Vec::new();
    for (i, p) in n.patches.into_iter().enumerate() {
        if !matches!(p.subresource.as_str(), "" | "status") {
            return Err(format!(
                "spec.next.patches[{i}].subresource {:?}: only \"\" and \"status\" are supported",
                p.subresource
            ));
        }
        let template = template::Template::parse(&p.template)
            .map_err(|e| format!("spec.next.patches[{i}].template: {e}"))?;
        patches.push(PatchSpec {
            subresource: p.subresource,
            root: p.root,
            template,
            type_: p.type_,
        });
    }
    Ok(Stage {
        name: doc.metadata.name,
        origin: origin.to_string(),
        kind,
        selector,
        weight: spec.weight.unwrap_or(0),
        weight_from: compile_from(&spec.weight_from, "spec.weightFrom")?,
        delay,
        next: NextSpec {
            status_source: n.status_template.clone().unwrap_or_default(),
            status,
            delete: n.delete.unwrap_or(false),
            event: n.event,
            finalizers: n.finalizers,
            patches,
        },
        immediate_next: spec.immediate_next_stage.unwrap_or(false),
    })
}

/// Everything [`start`] needs from the run.
pub(crate) struct StartCtx<'a> {
    pub target: &'a crate::target::Target,
    /// Per request.
    pub timeout: std::time::Duration,
    pub start: tokio::time::Instant,
    pub max_in_flight: usize,
    pub tracker: &'a tokio_util::task::TaskTracker,
    /// Ends the informers and the engine.
    pub stop: &'a tokio_util::sync::CancellationToken,
}

/// Bound of the channel from the informers to the engine (objects seen).
const SEEN_QUEUE: usize = 16_384;

/// Starts the informers and the engine for loadgen's simulated `nodes`; returns the
/// recorders of the Stages' requests (one per kind of request the Stages send) and the
/// engine's counters.
pub(crate) fn start(
    set: Arc<StageSet>,
    time_scale: f64,
    nodes: &[String],
    ctx: StartCtx<'_>,
) -> (
    Vec<Arc<crate::record::OpRecorder>>,
    Arc<engine::EngineStats>,
) {
    use next::ActionKind;
    let kinds: Vec<ActionKind> = [
        ActionKind::Event,
        ActionKind::Finalizers,
        ActionKind::Delete,
        ActionKind::Status,
        ActionKind::Patch,
    ]
    .into_iter()
    .filter(|k| {
        set.stages.iter().any(|s| {
            let n = &s.next;
            match k {
                ActionKind::Event => n.event.is_some(),
                ActionKind::Finalizers => n.finalizers.is_some(),
                ActionKind::Delete => n.delete,
                ActionKind::Status => n.status.is_some() && !n.delete,
                ActionKind::Patch => !n.patches.is_empty() && !n.delete,
            }
        })
    })
    .collect();
    let recorders: std::collections::HashMap<ActionKind, Arc<crate::record::OpRecorder>> = kinds
        .iter()
        .map(|k| {
            let rec = crate::record::OpRecorder::new(engine::op_name(*k), ctx.start);
            (*k, Arc::new(rec))
        })
        .collect();
    let out: Vec<_> = recorders.values().cloned().collect();
    let names: std::collections::HashSet<String> = nodes.iter().cloned().collect();
    let run = EngineRun {
        client: crate::target::ApiClient::new(ctx.target),
        scope: engine::Scope::Nodes(Arc::new(names)),
        time_scale,
        timeout: ctx.timeout,
        max_in_flight: ctx.max_in_flight,
        recorders,
        tracker: ctx.tracker,
        stop: ctx.stop,
    };
    (out, spawn(set, run))
}

/// How and where [`spawn`] runs an engine.
pub struct EngineRun<'a> {
    /// The server the informers read and the Stages' requests go to.
    pub client: crate::target::ApiClient,
    /// The nodes whose objects are followed.
    pub scope: engine::Scope,
    /// Delays are divided by this.
    pub time_scale: f64,
    /// Per request.
    pub timeout: std::time::Duration,
    /// Stages applied at once.
    pub max_in_flight: usize,
    /// Where each kind of request is recorded; kinds not here are not recorded (a
    /// long-running caller with no report to write passes none: a recorder's time series
    /// grows by a row a second).
    pub recorders: std::collections::HashMap<next::ActionKind, Arc<crate::record::OpRecorder>>,
    pub tracker: &'a tokio_util::task::TaskTracker,
    /// Ends the informers and the engine.
    pub stop: &'a tokio_util::sync::CancellationToken,
}

/// Starts the informers (nodes and/or pods, as the Stages need) and the engine on
/// `run.tracker`; returns the engine's counters. loadgen's `--stages` and the simulated
/// apiserver's `--kubelet` both run Stages through this.
pub fn spawn(set: Arc<StageSet>, run: EngineRun<'_>) -> Arc<engine::EngineStats> {
    let client = run.client;
    let (tx, rx) = tokio::sync::mpsc::channel(SEEN_QUEUE);
    for kind in [Kind::Node, Kind::Pod] {
        if set.has(kind) {
            run.tracker.spawn(feed::run(
                client.clone(),
                kind,
                Vec::new(),
                run.timeout,
                tx.clone(),
                run.stop.clone(),
            ));
        }
    }
    drop(tx);
    let engine = engine::Engine::new(set, run.time_scale, run.scope, rand::random());
    let stats = engine.stats.clone();
    let counters = stats.clone();
    let timeout = run.timeout;
    let recorders = Arc::new(run.recorders);
    let apply = move |job: engine::Job| {
        let client = client.clone();
        let recorders = recorders.clone();
        let stats = stats.clone();
        async move { engine::send_job(&client, job, timeout, &recorders, &stats).await }
    };
    let stop = run.stop.clone();
    let max = run.max_in_flight;
    run.tracker.spawn(async move {
        let engine = engine.drive(rx, apply, max, stop).await;
        let s = &engine.stats;
        tracing::info!(
            followed = engine.followed(),
            failed = s.failed.load(std::sync::atomic::Ordering::Relaxed),
            render_errors = s.render_errors.load(std::sync::atomic::Ordering::Relaxed),
            dropped = s.dropped.load(std::sync::atomic::Ordering::Relaxed),
            "stages engine stopped"
        );
    });
    counters
}
