//! The admit step: the request's lane ([`lane`]), then the decision
//! ([`admit`], made by the shared [`Admission`] from the pure parts in
//! [`crate::enforce`]), counted by mode, lane, pattern class, decision and
//! reason; a rejection noted on its pattern (for `/debug/patterns`), logged
//! (rate-limited) and, in `enforce`, answered with a 429 `Status` and
//! `Retry-After`. Long-running requests give their slot back once their
//! response starts ([`on_response_start`]). Also the relist guard's optional
//! policy, run before prediction: consistent LISTs of matching clients
//! rewritten to `resourceVersion=0` ([`rewrite`]).

mod admission;
mod flow;
mod rewrite;

use std::time::Duration;

use apimodel::Status;
use http::{HeaderValue, Response, StatusCode};
use tokio::time::Instant;

use crate::budget::unlearned::looks_heavy;
use crate::classify::Classified;
use crate::config::{Config, Mode};
use crate::context::RequestCtx;
use crate::enforce::decision::{charge, Decision};
use crate::enforce::lane::{assign, Lane, Subject};
use crate::identity::Client;
use crate::metrics::{DecisionLabel, LaneLabel, Metrics, VerbCode};
use crate::pattern::PatternKey;
use crate::predict::{PatternCache, PatternStore, Prediction, Source};
use crate::status::status_response;
use crate::Body;

pub use admission::{Admission, HeavyTicket, Hold, PoolView, UnlearnedTurn, Verdict};
pub use flow::Flow;
pub use rewrite::rewrite_to_cache;

/// The response header naming the lane a request was served in.
pub use apimodel::headers::LANE_HEADER;

/// Put the lane on a response.
pub fn with_lane(mut resp: Response<Body>, lane: Lane) -> Response<Body> {
    // Checked once at compile time, not on every response as a `&str` name would be.
    const NAME: http::HeaderName = http::HeaderName::from_static(LANE_HEADER);
    resp.headers_mut()
        .insert(NAME, HeaderValue::from_static(lane.as_str()));
    resp
}

/// The lane a request is served in: by identity, verb and resource; a LIST
/// predicted to cost at least `lanes.heavyThresholdBytes` is heavy, and so
/// is one of an unlearned pattern that looks heavy (`unlearned_heavy`,
/// see [`crate::budget::unlearned`]) whatever its prior says: a prior can
/// be far too low. kube-apiserver 1.20 counts objects once a minute, so
/// for its first minute a freshly started apiserver reports 0 pods; priced
/// at 0 bytes, a dozen 25 MB LISTs went to the workload lane at once, past
/// the one-at-a-time gate and the in-flight budget. If the pattern is
/// learned light while such a request waits for its turn, it moves to the
/// lane it would have had (`RequestCtx::lane_if_light`).
pub fn lane(
    config: &Config,
    client: &Client,
    classified: &Classified,
    key: &PatternKey,
    predicted: &Prediction,
    unlearned_heavy: bool,
) -> Lane {
    let cost = charge(predicted, config.quota.etcd_read_weight);
    let heavy =
        key.is_list_like() && (unlearned_heavy || cost >= config.lanes.heavy_threshold_bytes);
    let info = &classified.info;
    let subject = Subject {
        identity: &client.identity,
        verb: info.verb.as_str(),
        resource: &key.resource,
        non_resource_path: (!info.is_resource()).then_some(info.path.as_str()),
        heavy,
    };
    assign(&config.lanes, &subject)
}

/// Whether `predicted` for `key` is a prior (no completed response yet) of a
/// pattern that looks heavy, by the object count `cache` has scraped.
pub fn unlearned_heavy(cache: &PatternCache, key: &PatternKey, predicted: &Prediction) -> bool {
    predicted.source != Source::Pattern && looks_heavy(key, cache.object_count(&key.resource))
}

/// The admit step for a request in `ctx.lane`: admit (what it holds goes in
/// `ctx.hold`), queue, or reject. `Err` is the 429 to answer.
pub async fn admit(
    admission: &std::sync::Arc<Admission>,
    patterns: &PatternStore,
    metrics: &Metrics,
    ctx: &mut RequestCtx,
) -> Result<(), Response<Body>> {
    let dry = match ctx.config.mode {
        Mode::Off => return Ok(()),
        Mode::DryRun => true,
        Mode::Enforce => false,
    };
    let config = ctx.config.clone();
    let mut lane = ctx.lane;
    let settings = config.admission();
    let flow_by = config.quota.queue.flow_by;
    // Dry run: not simulated (nothing waits).
    let mut turn = None;
    if lane == Lane::Heavy && !dry {
        match unlearned_turn(admission, patterns, ctx).await {
            Ok(None) => {
                let cost = charge(&ctx.predicted, config.quota.etcd_read_weight);
                if let Some(light) = ctx.lane_if_light.filter(|_| {
                    ctx.predicted.source == Source::Pattern
                        && cost < config.lanes.heavy_threshold_bytes
                }) {
                    ctx.lane = light;
                    lane = light;
                }
            }
            Ok(t) => turn = t,
            Err(()) => {
                let flow = Flow::of(&ctx.client, flow_by).name();
                let verdict = admission.reject_unlearned(&flow, settings);
                return refuse(admission, patterns, metrics, ctx, verdict, dry);
            }
        }
    }
    let key = &ctx.key;
    let cost = charge(&ctx.predicted, config.quota.etcd_read_weight);
    let flow = Flow::of(&ctx.client, flow_by);
    // The etcd-read part passes the share of the budget shared by all
    // masters first (a local bucket: nothing waits on etcd).
    let mut etcd = None;
    if let Some(gate) = admission.shared_gate() {
        let reads = ctx.predicted.read_bytes;
        if lane == Lane::Heavy && !dry && reads > 0.0 {
            let wait = Duration::from_secs_f64(config.quota.max_wait_seconds);
            match gate.pass(reads, Instant::now() + wait).await {
                Some(t) => etcd = Some(t),
                None => {
                    let verdict = admission.reject_shared(&flow.name(), settings);
                    return refuse(admission, patterns, metrics, ctx, verdict, dry);
                }
            }
        }
    }
    let mut verdict = if lane == Lane::Heavy {
        admission
            .admit_heavy(&flow.name(), cost, settings, dry)
            .await
    } else {
        admission.admit_light(lane, &flow, settings, dry).await
    };
    verdict.hold.attach(turn);
    verdict.hold.attach_etcd(etcd);
    if verdict.decision != Decision::Reject {
        record(metrics, &config, lane, key, &verdict);
        ctx.hold = verdict.hold;
        return Ok(());
    }
    refuse(admission, patterns, metrics, ctx, verdict, dry)
}

/// Until a heavy-looking pattern has a completed response, one request of
/// it at a time (see [`crate::budget::unlearned`]): `Ok(Some(turn))` for
/// the one, `Ok(None)` if it is learned (now, after waiting: `ctx` then has
/// the learned prediction) or does not look heavy, `Err` if another stayed
/// in flight for `quota.maxWaitSeconds`.
async fn unlearned_turn(
    admission: &std::sync::Arc<Admission>,
    patterns: &PatternStore,
    ctx: &mut RequestCtx,
) -> Result<Option<UnlearnedTurn>, ()> {
    let deadline = Instant::now() + Duration::from_secs_f64(ctx.config.quota.max_wait_seconds);
    let mut waited = false;
    loop {
        let freed = admission.unlearned_freed();
        tokio::pin!(freed);
        // Registered before looking, so an end in between is not missed.
        freed.as_mut().enable();
        {
            let cache = patterns.lock();
            if waited {
                ctx.predicted = cache.predict(&ctx.key, Instant::now());
            }
            if !unlearned_heavy(&cache, &ctx.key, &ctx.predicted) {
                return Ok(None);
            }
        }
        if let Some(turn) = admission.try_start_unlearned(&ctx.key) {
            return Ok(Some(turn));
        }
        if tokio::time::timeout_at(deadline, freed).await.is_err() {
            return Err(());
        }
        waited = true;
    }
}

/// A rejection: counted, noted on its pattern, logged (rate-limited) and,
/// unless in dry run, answered with a 429.
fn refuse(
    admission: &Admission,
    patterns: &PatternStore,
    metrics: &Metrics,
    ctx: &RequestCtx,
    verdict: Verdict,
    dry: bool,
) -> Result<(), Response<Body>> {
    let config = &*ctx.config;
    let (lane, key, client) = (ctx.lane, &ctx.key, &ctx.client);
    let settings = config.admission();
    let cost = charge(&ctx.predicted, config.quota.etcd_read_weight);
    record(metrics, config, lane, key, &verdict);
    let who = client.display_name();
    patterns.lock().note_rejected(key, &who, Instant::now());
    if let Some(suppressed) = admission.log_allowed(settings) {
        tracing::warn!(
            mode = config.mode.as_str(),
            lane = lane.as_str(),
            client = %who,
            pattern = %key,
            predicted_bytes = cost as u64,
            reason = verdict.reason.as_str(),
            retry_after = verdict.retry_after,
            suppressed,
            "{}",
            if dry { "would reject (dry run)" } else { "rejected" }
        );
    }
    if dry {
        return Ok(());
    }
    let message = format!(
        "tollgate: {} (lane {}, pattern \"{key}\", predicted cost {} bytes); retry after {} s",
        verdict.reason.explain(),
        lane.as_str(),
        cost as u64,
        verdict.retry_after,
    );
    let status = Status::too_many_requests(message, verdict.retry_after);
    metrics
        .requests
        .get_or_create(&VerbCode {
            verb: ctx.kind.verb.as_str(),
            code: StatusCode::TOO_MANY_REQUESTS.as_u16(),
        })
        .inc();
    Err(with_lane(status_response(&status), lane))
}

/// The admit step's metrics: the decision, the wait, the debit.
fn record(metrics: &Metrics, config: &Config, lane: Lane, key: &PatternKey, verdict: &Verdict) {
    metrics.per_decision.inc(
        metrics,
        DecisionLabel {
            mode: config.mode.as_str(),
            lane: lane.as_str(),
            verb: key.verb.as_str(),
            consistency: key.consistency.map_or("none", |c| c.as_str()),
            decision: verdict.decision.as_str(),
            reason: verdict.reason.as_str(),
        },
    );
    if verdict.decision == Decision::Queue {
        metrics
            .queue_wait
            .get_or_create(&LaneLabel {
                lane: lane.as_str(),
            })
            .observe(verdict.waited.as_secs_f64());
    }
    if verdict.hold.debited() > 0.0 {
        metrics.quota_debited.inc_by(verdict.hold.debited() as u64);
    }
}

/// The response started. Long-running requests (watches, upgrades) give
/// their slot back now, as the apiserver's flow control does; a watch-list
/// keeps its predicted charge (its initial state is not measured to the end
/// here).
///
/// Here, where the response headers arrive, the budget's signal is fed:
/// the latency of light requests of the protected lanes (and `workload`,
/// its stand-in), and the apiserver's 429s and 5xx. Headers, not the body's
/// end: for a heartbeat PATCH the apiserver's work is done when it answers,
/// while the time to the body's end adds the client's reading, which no
/// budget can fix.
pub fn on_response_start(admission: &Admission, ctx: &mut RequestCtx, status: StatusCode) {
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        admission.note_upstream_error();
    }
    let light = !(ctx.long_running() || ctx.upgrade || ctx.key.is_list_like());
    if light && ctx.lane != Lane::Heavy {
        admission.record_latency(ctx.lane, ctx.started);
    }
    if ctx.long_running() || ctx.upgrade {
        let hold = std::mem::take(&mut ctx.hold);
        let debited = hold.debited();
        hold.settle(debited, false);
    }
}
