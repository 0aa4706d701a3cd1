//! The admit step of [`Gateway::handle`]: the request's lane, then the
//! decision (see [`crate::enforce::decide`]), counted by mode, lane,
//! pattern class, decision and reason; a rejection noted on its pattern
//! (for `/debug/patterns`), logged (rate-limited) and, in `enforce`,
//! answered with a 429 `Status` and `Retry-After`. Also the relist guard's
//! optional policy: consistent LISTs of matching clients rewritten to
//! `resourceVersion=0`.

use apimodel::{ConsistencyClass, Status, Verb};
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::admin::{DecisionLabel, LaneLabel, VerbCode};
use crate::classify::{classify, Classified};
use crate::config::{Config, Mode};
use crate::enforce::decide::{charge, Decision, Hold};
use crate::enforce::lane::{assign, identity_matches, Lane, Subject};
use crate::enforce::settings::FlowBy;
use crate::handle::Gateway;
use crate::identity::Client;
use crate::pattern::PatternKey;
use crate::predict::Prediction;
use crate::status::status_response;
use crate::Body;

/// The response header naming the lane a request was served in.
pub const LANE_HEADER: &str = "x-tollgate-lane";
/// The response header saying a consistent LIST was served from the cache.
pub const REWRITE_HEADER: &str = "x-tollgate-rewritten";

/// An admitted request: its lane and what it holds until its response ends.
#[derive(Debug)]
pub struct Admitted {
    pub lane: Lane,
    pub hold: Hold,
}

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

impl Gateway {
    /// The relist guard's policy: a consistent LIST without `limit` of a
    /// client a rule matches (verified identities only) is rewritten to
    /// `resourceVersion=0` — served from the watch cache, possibly a little
    /// stale. Returns the request classified again if it was rewritten.
    pub(crate) fn rewrite_to_cache(
        &self,
        req: &mut Request<Incoming>,
        client: &Client,
        classified: &Classified,
        config: &Config,
    ) -> Option<Classified> {
        let rules = &config.relist_guard.rewrite_to_cache;
        let info = &classified.info;
        if rules.is_empty()
            || info.verb != Verb::List
            || classified.consistency != Some(ConsistencyClass::Consistent)
            || info.options.limit.is_some()
            || info.options.continue_token.is_some()
        {
            return None;
        }
        let resource = PatternKey::new(classified, client.identity.class()).resource;
        let warming = || self.inner.admission.warming_up(config);
        let applies = rules.iter().any(|r| {
            identity_matches(&client.identity, &r.users, &r.groups, true)
                && (r.resources.is_empty() || r.resources.contains(&resource))
                && (!r.during_warmup_only || warming())
        });
        if !applies {
            return None;
        }
        let uri = req.uri();
        let pq = match uri.query() {
            Some(q) if !q.is_empty() => format!("{}?{q}&resourceVersion=0", uri.path()),
            _ => format!("{}?resourceVersion=0", uri.path()),
        };
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(pq.parse().ok()?);
        let rewritten = http::Uri::from_parts(parts).ok()?;
        let again = classify(req.method(), &rewritten, req.headers()).ok()?;
        *req.uri_mut() = rewritten;
        self.inner.metrics.rewrites.inc();
        Some(again)
    }

    /// The admit step: `Err` is the 429 to answer.
    pub(crate) async fn admit(
        &self,
        client: &Client,
        classified: &Classified,
        key: &PatternKey,
        predicted: &Prediction,
        config: &Config,
    ) -> Result<Admitted, Response<Body>> {
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
        let lane = assign(&config.lanes, &subject);
        let dry = match config.mode {
            Mode::Off => {
                return Ok(Admitted {
                    lane,
                    hold: Hold::Nothing,
                })
            }
            Mode::DryRun => true,
            Mode::Enforce => false,
        };
        let flow_by = config.quota.queue.flow_by;
        let admission = &self.inner.admission;
        let verdict = if lane == Lane::Heavy {
            admission
                .admit_heavy(&flow_key(client, flow_by), cost, config, dry)
                .await
        } else {
            admission
                .admit_light(lane, || flow_key(client, flow_by), config, dry)
                .await
        };
        let m = &self.inner.metrics;
        m.decisions
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
            m.queue_wait
                .get_or_create(&LaneLabel {
                    lane: lane.as_str(),
                })
                .observe(verdict.waited.as_secs_f64());
        }
        if verdict.hold.debited() > 0.0 {
            m.quota_debited.inc_by(verdict.hold.debited() as u64);
        }
        if verdict.decision != Decision::Reject {
            return Ok(Admitted {
                lane,
                hold: verdict.hold,
            });
        }
        let who = client.display_name();
        self.cache().note_rejected(key, &who, Instant::now());
        if let Some(suppressed) = admission.log_allowed(config) {
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
            return Ok(Admitted {
                lane,
                hold: Hold::Nothing,
            });
        }
        let message = format!(
            "tollgate: {} (lane {}, pattern \"{key}\", predicted cost {} bytes); retry after {} s",
            verdict.reason.explain(),
            lane.as_str(),
            cost as u64,
            verdict.retry_after,
        );
        let status = Status::too_many_requests(message, verdict.retry_after);
        m.requests
            .get_or_create(&VerbCode {
                verb: info.verb.as_str(),
                code: StatusCode::TOO_MANY_REQUESTS.as_u16(),
            })
            .inc();
        Err(with_lane(status_response(&status), lane))
    }
}
