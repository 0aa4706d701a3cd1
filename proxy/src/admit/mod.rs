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
mod rewrite;

use apimodel::Status;
use http::{HeaderValue, Response, StatusCode};
use tokio::time::Instant;

use crate::classify::Classified;
use crate::config::{Config, Mode};
use crate::context::RequestCtx;
use crate::enforce::decision::{charge, Decision};
use crate::enforce::lane::{assign, Lane, Subject};
use crate::enforce::settings::FlowBy;
use crate::identity::Client;
use crate::metrics::{DecisionLabel, LaneLabel, Metrics, VerbCode};
use crate::pattern::PatternKey;
use crate::predict::{PatternStore, Prediction};
use crate::status::status_response;
use crate::Body;

pub use admission::{Admission, HeavyTicket, Hold, PoolView, Verdict};
pub use rewrite::rewrite_to_cache;

/// The response header naming the lane a request was served in.
pub const LANE_HEADER: &str = "x-tollgate-lane";

/// The flow a client's heavy requests queue in (and are rate-limited by).
pub fn flow_key(client: &Client, by: FlowBy) -> String {
    let product = || {
        client
            .user_agent
            .split(['/', ' '])
            .next()
            .unwrap_or("")
            .to_string()
    };
    match by {
        FlowBy::User => client.identity.display_name(),
        FlowBy::UserAgent => product(),
        FlowBy::UserAndUserAgent => client.display_name(),
    }
}

/// Put the lane on a response.
pub fn with_lane(mut resp: Response<Body>, lane: Lane) -> Response<Body> {
    // Checked once at compile time, not on every response as a `&str` name would be.
    const NAME: http::HeaderName = http::HeaderName::from_static(LANE_HEADER);
    resp.headers_mut()
        .insert(NAME, HeaderValue::from_static(lane.as_str()));
    resp
}

/// The lane a request is served in: by identity, verb and resource; a LIST
/// predicted to cost at least `lanes.heavyThresholdBytes` is heavy.
pub fn lane(
    config: &Config,
    client: &Client,
    classified: &Classified,
    key: &PatternKey,
    predicted: &Prediction,
) -> Lane {
    let cost = charge(predicted, config.quota.etcd_read_weight);
    let heavy = key.is_list_like() && cost >= config.lanes.heavy_threshold_bytes;
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

/// The admit step for a request in `ctx.lane`: admit (what it holds goes in
/// `ctx.hold`), queue, or reject. `Err` is the 429 to answer.
pub async fn admit(
    admission: &std::sync::Arc<Admission>,
    patterns: &PatternStore,
    metrics: &Metrics,
    ctx: &mut RequestCtx,
) -> Result<(), Response<Body>> {
    let config = &*ctx.config;
    let (lane, key) = (ctx.lane, &ctx.key);
    let dry = match config.mode {
        Mode::Off => return Ok(()),
        Mode::DryRun => true,
        Mode::Enforce => false,
    };
    let cost = charge(&ctx.predicted, config.quota.etcd_read_weight);
    let flow_by = config.quota.queue.flow_by;
    let settings = config.admission();
    let client = &ctx.client;
    let verdict = if lane == Lane::Heavy {
        admission
            .admit_heavy(&flow_key(client, flow_by), cost, settings, dry)
            .await
    } else {
        admission
            .admit_light(lane, || flow_key(client, flow_by), settings, dry)
            .await
    };
    record(metrics, config, lane, key, &verdict);
    if verdict.decision != Decision::Reject {
        ctx.hold = verdict.hold;
        return Ok(());
    }
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
            verb: ctx.classified.info.verb.as_str(),
            code: StatusCode::TOO_MANY_REQUESTS.as_u16(),
        })
        .inc();
    Err(with_lane(status_response(&status), lane))
}

/// The admit step's metrics: the decision, the wait, the debit.
fn record(metrics: &Metrics, config: &Config, lane: Lane, key: &PatternKey, verdict: &Verdict) {
    metrics
        .decisions
        .get_or_create(&DecisionLabel {
            mode: config.mode.as_str(),
            lane: lane.as_str(),
            verb: key.verb.as_str(),
            consistency: key.consistency.map_or("none", |c| c.as_str()),
            decision: verdict.decision.as_str(),
            reason: verdict.reason.as_str(),
        })
        .inc();
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
pub fn on_response_start(ctx: &mut RequestCtx) {
    if ctx.long_running() || ctx.upgrade {
        let hold = std::mem::take(&mut ctx.hold);
        let debited = hold.debited();
        hold.settle(debited);
    }
}
