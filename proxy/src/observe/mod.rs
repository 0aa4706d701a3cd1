//! The observe step: the response body is wrapped so that, where it ends
//! ([`body::CountedBody`]), the bytes actually sent reconcile the quota
//! debit, teach the pattern cache, and update the request metrics
//! ([`Observer::finish`]; a body the upstream cut short also counts as an
//! upstream error). Requests tollgate answers itself (a bad request,
//! an unreachable upstream) are counted by [`Observer::answered`].
//!
//! A streaming list (a watch with `sendInitialEvents=true`) is the LIST it
//! replaces until its initial state has passed: it keeps its heavy debit
//! and in-flight place until the bookmark that ends that state, settled
//! then with what the state cost, so fifty informers starting at once
//! stream their states as the in-flight budget allows, as fifty LISTs would.

pub mod body;

use std::sync::Arc;
use std::time::Duration;

use apimodel::Verb;
use http::header::CONTENT_ENCODING;
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::admit::{with_lane, Hold};
use crate::config;
use crate::context::RequestCtx;
use crate::enforce::Lane;
use crate::forward::{Coalesce, Forwarded};
use crate::metrics::{DirectionLabel, Metrics, PhaseLabel, SourceLabel, VerbCode};
use crate::pattern::PatternKey;
use crate::predict::charge::{actual_charge, actual_read};
use crate::predict::{Completion, Outcome, PatternStore, Prediction};
use crate::status::{ErrorSource, ProxyError};
use crate::Body;

pub use body::{CountedBody, MarkerHook, Tally, INITIAL_EVENTS_END};

/// The longest a streaming list holds its heavy place while its initial
/// state flows: kube-apiserver's default `--request-timeout` (1 minute),
/// the longest the LIST it replaces may run. A stream that sends no
/// bookmark (an apiserver that ignores `sendInitialEvents`) frees its place
/// then, and keeps its predicted charge, as a watch does.
const INITIAL_STATE_HOLD: Duration = Duration::from_secs(60);

/// A streaming list: what it is learned by, and its hold settled by, where
/// its initial state ends.
struct InitialState {
    key: PatternKey,
    predicted: Prediction,
    status: StatusCode,
    gzip: bool,
    full_list: bool,
    client: String,
    started: Instant,
}

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
        // What went over the bulk connections ([`crate::forward`]) comes back in many frames.
        let bulk = ctx.long_running() || ctx.key.is_list_like() || ctx.lane == Lane::Heavy;
        let kind = ctx.kind;
        let lane = ctx.lane;
        let mut hold = ctx.hold;
        let client = ctx.client.display_name();
        let at_marker = kind.streams_initial_events.then(|| {
            let state = InitialState {
                key: ctx.key.clone(),
                predicted: ctx.predicted,
                status: parts.status,
                gzip,
                full_list: kind.full_list,
                client: client.clone(),
                started: ctx.started,
            };
            self.initial_state_hook(state, std::mem::take(&mut hold))
        });
        let ending = Ending {
            verb: kind.verb,
            long_running: kind.long_running,
            full_list: kind.full_list,
            client,
            key: ctx.key,
            predicted: ctx.predicted,
            hold,
            status: parts.status,
            gzip,
        };
        self.metrics.inflight.inc();
        let observer = self.clone();
        let counted = CountedBody::new(body, ctx.started, move |tally: Tally| {
            drop(outstanding);
            observer.finish(ending, tally);
        });
        let counted = match at_marker {
            Some(hook) => counted.watch_for(INITIAL_EVENTS_END).at_marker(hook),
            None => counted,
        };
        let body = if bulk {
            Coalesce::new(counted)
                .map_err(crate::BoxError::from)
                .boxed()
        } else {
            counted.map_err(crate::BoxError::from).boxed()
        };
        with_lane(Response::from_parts(parts, body), lane)
    }

    /// What a streaming list does where its initial state ends: it is
    /// learned there (the watch may go on for minutes, and until its size
    /// is learned each of its pattern's requests runs alone), and a heavy
    /// hold is settled there with what the state cost.
    fn initial_state_hook(self: &Arc<Self>, s: InitialState, hold: Hold) -> MarkerHook {
        let debited = hold.debited();
        let tx = hold.is_heavy().then(|| {
            let (tx, rx) = oneshot::channel();
            tokio::spawn(self.clone().hold_through_initial_state(hold, rx));
            tx
        });
        let observer = self.clone();
        Box::new(move |bytes| {
            let actual = observer.learn_initial_state(&s, bytes, debited);
            if let Some(tx) = tx {
                // The receiver gone (its hold timed out) is fine.
                let _ = tx.send(actual);
            }
        })
    }

    /// The initial state learned as a completed LIST of its pattern; what
    /// it cost.
    fn learn_initial_state(&self, s: &InitialState, bytes: u64, debited: f64) -> f64 {
        let outcome = Outcome {
            status: s.status.as_u16(),
            bytes,
            gzip: s.gzip,
            latency: s.started.elapsed(),
            completion: Completion::End,
            full_list: s.full_list,
            client: s.client.clone(),
            initial_bytes: Some(bytes),
        };
        let mut cache = self.patterns.lock();
        cache.observe(&s.key, &outcome, Instant::now());
        let sent = cache.uncompressed(&s.key, bytes, s.gzip);
        drop(cache);
        let weight = self.config.get().quota.etcd_read_weight;
        actual_charge(
            &s.predicted,
            s.key.has_selector(),
            sent,
            true,
            weight,
            debited,
        )
    }

    /// A streaming list's heavy hold, settled with the cost its initial
    /// state had when that state has passed (a completed LIST for the
    /// in-flight budget's service time), or with its predicted charge after
    /// [`INITIAL_STATE_HOLD`] or a stream cut short.
    async fn hold_through_initial_state(self: Arc<Self>, hold: Hold, cost: oneshot::Receiver<f64>) {
        match tokio::time::timeout(INITIAL_STATE_HOLD, cost).await {
            Ok(Ok(actual)) => self.reconcile(hold, actual, true),
            _ => {
                let debited = hold.debited();
                hold.settle(debited, false);
            }
        }
    }

    /// Settle a heavy debit with the actual cost, counted as a refund or a debt.
    fn reconcile(&self, hold: Hold, actual: f64, complete: bool) {
        let debited = hold.debited();
        let (direction, bytes) = if actual < debited {
            ("refund", debited - actual)
        } else {
            ("debt", actual - debited)
        };
        self.metrics
            .quota_reconciled
            .get_or_create(&DirectionLabel { direction })
            .inc_by(bytes as u64);
        hold.settle(actual, complete);
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
        // A streaming list whose initial state ended was learned there.
        if tally.initial_bytes.is_none() {
            cache.observe(key, &outcome, now);
        }
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
            self.reconcile(e.hold, actual, complete);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admit::Admission;
    use crate::config::settings::budget::QuotaMode;
    use crate::config::Config;
    use prometheus_client::registry::Registry;

    /// A static pool with room for one streaming list, and an observer.
    fn setup() -> (Config, Arc<Admission>, Arc<Observer>) {
        let mut c = Config::default();
        c.quota.mode = QuotaMode::Static;
        c.quota.bytes_per_second = Some(1e6);
        c.quota.burst_bytes = Some(1e6);
        c.quota.per_client.requests_per_second = 0.0;
        c.relist_guard.enabled = false;
        let admission = Arc::new(Admission::new(c.admission(), Box::new(|_| {})));
        let observer = Arc::new(Observer {
            metrics: Arc::new(Metrics::register(&mut Registry::default())),
            patterns: Arc::new(PatternStore::new(c.patterns.clone())),
            config: Arc::new(config::Current::new(c.clone())),
        });
        (c, admission, observer)
    }

    /// A streaming list's heavy hold.
    async fn streaming_list(c: &Config, a: &Arc<Admission>) -> Hold {
        let verdict = a.admit_heavy("a", 5e5, c.admission(), false).await;
        assert!(verdict.hold.is_heavy());
        verdict.hold
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_list_holds_its_heavy_place_until_its_bookmark_or_a_request_timeout() {
        let (c, a, observer) = setup();
        let inflight = || a.view(c.admission()).heavy_inflight;

        // The bookmark passes after the initial state has flowed for 3 s (of the
        // paused clock: the sleep moves virtual time, nothing waits): freed then.
        let hold = streaming_list(&c, &a).await;
        let (tx, rx) = oneshot::channel();
        let held = tokio::spawn(observer.clone().hold_through_initial_state(hold, rx));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(inflight(), 1, "held while the initial state flows");
        tx.send(4e5).expect("held");
        held.await.expect("settled");
        assert_eq!(inflight(), 0, "freed at the bookmark");

        // No bookmark ever: held for exactly a request timeout (the paused
        // clock jumps to the timer), then freed.
        let hold = streaming_list(&c, &a).await;
        let (_tx, rx) = oneshot::channel::<f64>();
        let start = Instant::now();
        tokio::spawn(observer.clone().hold_through_initial_state(hold, rx))
            .await
            .expect("settled");
        assert_eq!(
            start.elapsed(),
            INITIAL_STATE_HOLD,
            "held for a request timeout"
        );
        assert_eq!(inflight(), 0, "freed after a request timeout");

        // The stream ends first (the client went away): freed at once.
        let hold = streaming_list(&c, &a).await;
        let (tx, rx) = oneshot::channel::<f64>();
        let start = Instant::now();
        let held = tokio::spawn(observer.clone().hold_through_initial_state(hold, rx));
        drop(tx);
        held.await.expect("settled");
        assert_eq!(start.elapsed(), Duration::ZERO, "not held on");
        assert_eq!(inflight(), 0, "freed with the stream");
    }
}
