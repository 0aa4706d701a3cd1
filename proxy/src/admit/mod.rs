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
pub mod pages;
mod rewrite;

use std::time::Duration;

use apimodel::Status;
use http::{HeaderValue, Response, StatusCode};
use tokio::time::Instant;

use crate::budget::unlearned::looks_heavy;
use crate::classify::Classified;
use crate::config::{Config, Mode};
use crate::context::RequestCtx;
use crate::enforce::decision::{Decision, Reason};
use crate::enforce::lane::{assign, Lane, Subject};
use crate::identity::Client;
use crate::metrics::{DecisionLabel, LaneLabel, Metrics, VerbCode};
use crate::pattern::{LimitBucket, PatternKey};
use crate::predict::charge::charge;
use crate::predict::{PatternCache, PatternStore, Prediction, Source};
use crate::status::status_response;
use crate::Body;

pub use admission::{Admission, HeavyState, HeavyTicket, Hold, PoolView, UnlearnedTurn, Verdict};
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
    // A continue page of a list in progress goes at once (no client is
    // stranded in the middle of a list): before the unlearned pattern's turn,
    // which would hold it behind another client's page.
    if lane == Lane::Heavy && continues_a_list(&ctx.key) {
        let cost = charge(&ctx.predicted, config.quota.etcd_read_weight);
        let lineage = lineage_of(ctx, flow_by);
        if let Some(verdict) = admission.admit_continuation(&lineage, cost, settings) {
            record(metrics, &config, lane, &ctx.key, &verdict, cost);
            ctx.hold = verdict.hold;
            return Ok(());
        }
    }
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
        record(metrics, &config, lane, key, &verdict, cost);
        if key.is_list_like() && key.limit != LimitBucket(0) {
            let whole = patterns.lock().prior_bytes(key).unwrap_or(0.0)
                * (1.0 + config.quota.etcd_read_weight);
            admission.page_admitted(lineage_of(ctx, flow_by), cost, whole);
        }
        ctx.hold = verdict.hold;
        return Ok(());
    }
    refuse(admission, patterns, metrics, ctx, verdict, dry)
}

/// A page after the first: its key says `exact` with a limit, which is
/// what a `continue` token makes of a paged LIST (clients send their limit
/// with every page). A LIST at an exact revision with a limit counts too:
/// it only matters when the same client's list is in progress. Read off the
/// key, so every request's context stays as small as it is.
fn continues_a_list(key: &PatternKey) -> bool {
    key.is_list_like()
        && key.consistency == Some(apimodel::ConsistencyClass::Exact)
        && key.limit != LimitBucket(0)
}

/// The list a page belongs to: its client's flow, resource and scope.
fn lineage_of(
    ctx: &RequestCtx,
    flow_by: crate::config::settings::enforce::FlowBy,
) -> pages::Lineage {
    (
        Flow::of(&ctx.client, flow_by).name(),
        ctx.key.resource.clone(),
        ctx.key.scope.as_str(),
    )
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

/// A rejection: counted, noted on its pattern (apart for dry run), logged
/// (rate-limited) with the heavy lane's state and the limit that bound,
/// and, unless in dry run, answered with a 429.
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
    record(metrics, config, lane, key, &verdict, cost);
    let who = client.display_name();
    patterns
        .lock()
        .note_rejected(key, &who, dry, Instant::now());
    let state = admission.heavy_state(settings);
    let bound = bound_by(verdict.reason, lane, cost, &state, config);
    if let Some(suppressed) = admission.log_allowed(settings) {
        tracing::warn!(
            mode = config.mode.as_str(),
            lane = lane.as_str(),
            client = %who,
            pattern = %key,
            predicted_cost_bytes = cost as u64,
            reason = verdict.reason.as_str(),
            bound,
            retry_after = verdict.retry_after,
            budget_mode = state.mode,
            pool_level_bytes = state.level as i64,
            pool_bytes_per_second = state.rate as u64,
            pool_burst_bytes = state.burst as u64,
            queue_depth = state.queued,
            queued_bytes = state.queued_bytes as u64,
            heavy_inflight = state.inflight,
            inflight_used_bytes = state.inflight_used_bytes as u64,
            inflight_budget_bytes = state.inflight_bytes as u64,
            suppressed,
            "{}",
            if dry { "would reject (dry run)" } else { "rejected" }
        );
    }
    if dry {
        return Ok(());
    }
    let message = rejection_message(&verdict, lane, key, cost, bound, &state);
    let mut status = Status::too_many_requests(message, verdict.retry_after);
    if let Some(d) = status.details.as_mut() {
        d.causes.push(apimodel::status::StatusCause {
            reason: "PredictedCostBytes".into(),
            message: format!("{}", cost as u64),
            field: "predictedCostBytes".into(),
        });
        d.causes.push(apimodel::status::StatusCause {
            reason: "BoundBy".into(),
            message: bound.into(),
            field: "bound".into(),
        });
    }
    metrics
        .requests
        .get_or_create(&VerbCode {
            verb: ctx.kind.verb.as_str(),
            code: StatusCode::TOO_MANY_REQUESTS.as_u16(),
        })
        .inc();
    Err(with_lane(status_response(&status), lane))
}

/// A Retry-After past this many times the budget's turnover (and past
/// [`LONG_RETRY_SECONDS`]) is explained in the 429's message.
const LONG_RETRY_TURNOVERS: f64 = 2.0;
const LONG_RETRY_SECONDS: u64 = 10;

/// The 429's message: why, the lane, the pattern, its predicted cost and
/// the limit that bound; and, when the Retry-After is far beyond the
/// budget's turnover (the pool's refill from empty), why it is that long.
fn rejection_message(
    verdict: &Verdict,
    lane: Lane,
    key: &PatternKey,
    cost: f64,
    bound: &str,
    state: &HeavyState,
) -> String {
    let mut m = format!(
        "tollgate: {} (lane {}, pattern \"{key}\", predicted cost {} bytes, bound by {bound}); retry after {} s",
        verdict.reason.explain(),
        lane.as_str(),
        cost as u64,
        verdict.retry_after,
    );
    let turnover = state.turnover_seconds();
    let long = verdict.retry_after as f64 > LONG_RETRY_TURNOVERS * turnover.max(1.0)
        && verdict.retry_after > LONG_RETRY_SECONDS;
    if long {
        let why = match verdict.reason {
            Reason::RateLimit => {
                "this client's heavy-request rate (quota.perClient.requestsPerSecond) frees a turn no sooner".to_string()
            }
            _ => format!(
                "{} bytes of heavy requests wait ahead of it at {} bytes/s, and its own {} bytes",
                state.queued_bytes as u64, state.rate as u64, cost as u64
            ),
        };
        m.push_str(&format!(
            " (longer than the budget's turnover of {turnover:.1} s, because {why})"
        ));
    }
    m
}

/// The setting whose limit refused a request, by the reason and, for a
/// heavy request that waited too long, whichever of the heavy lane's
/// limits is short: its in-flight slots, its in-flight budget, its pool.
fn bound_by(
    reason: Reason,
    lane: Lane,
    cost: f64,
    state: &HeavyState,
    config: &Config,
) -> &'static str {
    let heavy = lane == Lane::Heavy;
    match reason {
        Reason::Inflight => match lane {
            Lane::System => "lanes.maxInflight.system",
            Lane::Workload => "lanes.maxInflight.workload",
            Lane::SelfLane => "lanes.maxInflight.self",
            _ => "lanes.maxInflight",
        },
        Reason::QueueFull if heavy => "quota.queue.perFlowDepth",
        Reason::QueueFull => "lanes.queue.perFlowDepth",
        Reason::TooManyFlows if heavy => "quota.queue.maxFlows",
        Reason::TooManyFlows => "lanes.queue.maxFlows",
        Reason::RateLimit => "quota.perClient.requestsPerSecond",
        Reason::Unlearned => "quota.maxWaitSeconds (an unlearned pattern, one at a time)",
        Reason::SharedBudget => "quota.global",
        Reason::MaxWait => {
            let slots = config.lanes.max_inflight.heavy;
            let adaptive = state.mode == "adaptive";
            if slots > 0 && state.inflight >= slots {
                "lanes.maxInflight.heavy"
            } else if state.inflight_used_bytes + cost > state.inflight_bytes {
                if adaptive {
                    "in-flight budget (adaptive; quota.adaptive.minInflightBytes, quota.inflightBytes)"
                } else {
                    "in-flight budget (quota.inflightBytes)"
                }
            } else if adaptive {
                "pool (adaptive rate; quota.adaptive.minBytesPerSecond, quota.bytesPerSecond)"
            } else {
                "pool (quota.bytesPerSecond, quota.burstBytes)"
            }
        }
        _ => "none",
    }
}

/// The admit step's metrics: the decision, the wait, the debit, the
/// predicted cost decided on.
fn record(
    metrics: &Metrics,
    config: &Config,
    lane: Lane,
    key: &PatternKey,
    verdict: &Verdict,
    cost: f64,
) {
    let label = DecisionLabel {
        mode: config.mode.as_str(),
        lane: lane.as_str(),
        verb: key.verb.as_str(),
        consistency: key.consistency.map_or("none", |c| c.as_str()),
        decision: verdict.decision.as_str(),
        reason: verdict.reason.as_str(),
    };
    if lane == Lane::Heavy {
        metrics
            .predicted_cost
            .get_or_create(&label)
            .inc_by(cost.max(0.0) as u64);
    }
    metrics.per_decision.inc(metrics, label);
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
/// their slot back now, as the apiserver's flow control does, keeping their
/// predicted charge; a streaming list keeps its place too until its initial
/// state has passed ([`crate::observe`]).
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
    let streams_initial_state = ctx.kind.streams_initial_events && status.is_success();
    if (ctx.long_running() || ctx.upgrade) && !streams_initial_state {
        let hold = std::mem::take(&mut ctx.hold);
        let debited = hold.debited();
        hold.settle(debited, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ClientClass;
    use http::{HeaderMap, Method};

    fn key(url: &str) -> PatternKey {
        let uri: http::Uri = url.parse().expect("uri");
        let c = crate::classify::classify(&Method::GET, &uri, &HeaderMap::new()).expect("ok");
        PatternKey::new(&c, ClientClass::User)
    }

    fn state() -> HeavyState {
        HeavyState {
            level: -2e6,
            rate: 4e6,
            burst: 16e6,
            queued: 12,
            queued_bytes: 400e6,
            inflight: 1,
            inflight_bytes: 64e6,
            inflight_used_bytes: 36e6,
            mode: "adaptive",
        }
    }

    fn rejected(reason: Reason, retry_after: u64) -> Verdict {
        Verdict {
            decision: Decision::Reject,
            reason,
            hold: Hold::Nothing,
            retry_after,
            waited: Duration::ZERO,
        }
    }

    #[test]
    fn the_limit_that_bound_is_named_by_its_setting() {
        let c = Config::default();
        let s = state();
        let b = |reason, lane, cost| bound_by(reason, lane, cost, &s, &c);
        assert_eq!(
            b(Reason::QueueFull, Lane::Heavy, 1.0),
            "quota.queue.perFlowDepth"
        );
        assert_eq!(
            b(Reason::QueueFull, Lane::Workload, 1.0),
            "lanes.queue.perFlowDepth"
        );
        assert_eq!(
            b(Reason::Inflight, Lane::System, 1.0),
            "lanes.maxInflight.system"
        );
        assert_eq!(
            b(Reason::RateLimit, Lane::Heavy, 1.0),
            "quota.perClient.requestsPerSecond"
        );
        // Waited too long: 36 of 64 MB in flight, so a 40 MB request found no room there…
        assert!(b(Reason::MaxWait, Lane::Heavy, 40e6).starts_with("in-flight budget"));
        // …and a 10 MB one waited for the pool's adaptive rate.
        assert!(b(Reason::MaxWait, Lane::Heavy, 10e6).starts_with("pool (adaptive rate"));
    }

    #[test]
    fn a_retry_after_far_beyond_the_turnover_says_why() {
        let k = key("/api/v1/pods");
        let s = state();
        // The budget turns over in 4 s (16 MB at 4 MB/s).
        let short = rejection_message(
            &rejected(Reason::QueueFull, 6),
            Lane::Heavy,
            &k,
            36e6,
            "quota.queue.perFlowDepth",
            &s,
        );
        assert!(!short.contains("turnover"), "{short}");
        assert!(short.contains("predicted cost 36000000 bytes"), "{short}");
        assert!(
            short.contains("bound by quota.queue.perFlowDepth"),
            "{short}"
        );
        let long = rejection_message(
            &rejected(Reason::QueueFull, 53),
            Lane::Heavy,
            &k,
            36e6,
            "quota.queue.perFlowDepth",
            &s,
        );
        assert!(
            long.contains("longer than the budget's turnover of 4.0 s")
                && long.contains("400000000 bytes of heavy requests wait ahead"),
            "{long}"
        );
        let rate = rejection_message(
            &rejected(Reason::RateLimit, 30),
            Lane::Heavy,
            &k,
            36e6,
            "quota.perClient.requestsPerSecond",
            &s,
        );
        assert!(
            rate.contains("(quota.perClient.requestsPerSecond) frees"),
            "{rate}"
        );
    }
}
