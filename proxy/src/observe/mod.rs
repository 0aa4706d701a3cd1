//! The observe step: the response body is wrapped so that, where it ends
//! ([`body::CountedBody`]), the bytes actually sent reconcile the quota
//! debit, teach the pattern cache, and update the request metrics
//! ([`Observer::finish`]; a body the upstream cut short also counts as an
//! upstream error). Requests tollgate answers itself (a bad request,
//! an unreachable upstream) are counted by [`Observer::answered`].

pub mod body;

use std::sync::Arc;

use apimodel::Verb;
use http::header::CONTENT_ENCODING;
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::admit::{with_lane, Hold};
use crate::config;
use crate::context::RequestCtx;
use crate::forward::Forwarded;
use crate::metrics::{DirectionLabel, Metrics, PhaseLabel, SourceLabel, VerbCode};
use crate::pattern::PatternKey;
use crate::predict::charge::{actual_charge, actual_read};
use crate::predict::{Completion, Outcome, PatternStore, Prediction};
use crate::status::{ErrorSource, ProxyError};
use crate::Body;

pub use body::{CountedBody, Tally, INITIAL_EVENTS_END};

/// What observe needs: the metrics, the pattern store, the running
/// configuration. One `Arc` of it rides in each response body's callback.
#[derive(Debug)]
pub struct Observer {
    pub metrics: Arc<Metrics>,
    pub patterns: Arc<PatternStore>,
    pub config: Arc<config::Current>,
}

/// The part of a request's context its end-of-stream callback keeps.
#[derive(Debug)]
struct Ending {
    key: PatternKey,
    verb: Verb,
    long_running: bool,
    full_list: bool,
    client: String,
    predicted: Prediction,
    hold: Hold,
    status: StatusCode,
    gzip: bool,
}

impl Observer {
    /// The observe step: the response to send, its body counted to the end.
    // Inlined into `handle` so the context is not copied whole to be taken apart.
    #[inline]
    pub fn observe(self: &Arc<Self>, forwarded: Forwarded, ctx: RequestCtx) -> Response<Body> {
        let (resp, outstanding) = match forwarded {
            Forwarded::Upgraded(head) => {
                self.count(&ctx.kind.verb, head.status(), 0);
                return with_lane(head, ctx.lane);
            }
            Forwarded::Stream(resp, outstanding) => (resp, outstanding),
        };
        let (parts, body) = resp.into_parts();
        let gzip = parts
            .headers
            .get(CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        let kind = ctx.kind;
        let lane = ctx.lane;
        let ending = Ending {
            verb: kind.verb,
            long_running: kind.long_running,
            full_list: kind.full_list,
            client: ctx.client.display_name(),
            key: ctx.key,
            predicted: ctx.predicted,
            hold: ctx.hold,
            status: parts.status,
            gzip,
        };
        self.metrics.inflight.inc();
        let observer = self.clone();
        let counted = CountedBody::new(body, ctx.started, move |tally: Tally| {
            drop(outstanding);
            observer.finish(ending, tally);
        });
        let counted = if kind.streams_initial_events {
            counted.watch_for(INITIAL_EVENTS_END)
        } else {
            counted
        };
        let body = counted.map_err(crate::BoxError::from).boxed();
        with_lane(Response::from_parts(parts, body), lane)
    }

    /// The response ended: learn, settle the quota debit, export.
    fn finish(&self, mut e: Ending, tally: Tally) {
        let outcome = Outcome {
            status: e.status.as_u16(),
            bytes: tally.bytes,
            gzip: e.gzip,
            latency: tally.elapsed,
            completion: tally.completion,
            full_list: e.full_list,
            client: e.client,
            initial_bytes: tally.initial_bytes,
        };
        let now = Instant::now();
        let m = &*self.metrics;
        m.inflight.dec();
        let code =
            StatusCode::from_u16(outcome.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // A body the upstream stalled is what a 504 is, whatever its headers said.
        let counted_code = if tally.stalled {
            tracing::warn!(pattern = %e.key, status = code.as_u16(), bytes = outcome.bytes, "upstream response stalled: stream ended");
            m.upstream_stalls
                .get_or_create(&PhaseLabel { phase: "body" })
                .inc();
            StatusCode::GATEWAY_TIMEOUT
        } else {
            code
        };
        self.count(&e.verb, counted_code, outcome.bytes);
        // The upstream cut the body short (reset, closed mid-stream): the client got its
        // status, then a broken body; that is an upstream error as much as a 502 is.
        if outcome.completion == Completion::Error {
            m.errors
                .get_or_create(&SourceLabel {
                    source: ErrorSource::Upstream.as_str(),
                })
                .inc();
        }
        if !e.long_running {
            m.per_verb
                .duration(m, e.verb, outcome.latency.as_secs_f64());
        }
        let key = &e.key;
        let mut cache = self.patterns.lock();
        cache.observe(key, &outcome, now);
        let sent = cache.uncompressed(key, outcome.bytes, outcome.gzip);
        drop(cache);
        if let Some(etcd) = e.hold.take_etcd() {
            let complete = outcome.completion == Completion::End;
            let read = actual_read(&e.predicted, key.has_selector(), sent);
            // A response cut short read at least what was passed.
            let read = if complete {
                read
            } else {
                read.max(etcd.debited())
            };
            etcd.settle(read);
        }
        let debited = e.hold.debited();
        if debited > 0.0 {
            let complete = outcome.completion == Completion::End;
            let weight = self.config.get().quota.etcd_read_weight;
            let actual = actual_charge(
                &e.predicted,
                key.has_selector(),
                sent,
                complete,
                weight,
                debited,
            );
            let (direction, bytes) = if actual < debited {
                ("refund", debited - actual)
            } else {
                ("debt", actual - debited)
            };
            m.quota_reconciled
                .get_or_create(&DirectionLabel { direction })
                .inc_by(bytes as u64);
            e.hold.settle(actual, complete);
        } else {
            drop(e.hold);
        }
        if outcome.completion == Completion::End && code.is_success() && !outcome.gzip {
            m.per_class.observe(
                m,
                key.verb,
                key.consistency,
                e.predicted.response_bytes,
                outcome.bytes,
            );
        }
    }

    fn count(&self, verb: &Verb, code: StatusCode, bytes: u64) {
        let m = &*self.metrics;
        m.per_verb.request(m, *verb, code.as_u16());
        m.per_verb.response_bytes(m, *verb, bytes);
    }

    /// A request tollgate answered itself with an error: the response, counted.
    pub fn answered(&self, verb: Option<Verb>, e: ProxyError) -> Response<Body> {
        tracing::debug!(error = %e, "answered by tollgate");
        if let ProxyError::Timeout { upstream, seconds } = &e {
            tracing::warn!(%upstream, seconds, "upstream sent no response headers in time");
            self.metrics
                .upstream_stalls
                .get_or_create(&PhaseLabel { phase: "headers" })
                .inc();
        }
        let resp = e.to_response();
        let verb = verb.map_or("unknown", Verb::as_str);
        let m = &self.metrics;
        m.requests
            .get_or_create(&VerbCode {
                verb,
                code: resp.status().as_u16(),
            })
            .inc();
        m.errors
            .get_or_create(&SourceLabel {
                source: e.source_side().as_str(),
            })
            .inc();
        resp
    }
}
