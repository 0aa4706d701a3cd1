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
use crate::forward::Forwarded;
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

/// A streaming list's heavy hold, kept until its initial state has passed.
struct InitialState {
    hold: Hold,
    key: PatternKey,
    predicted: Prediction,
    gzip: bool,
}

/// What a streaming list is learned by where its initial state ends.
struct Learning {
    key: PatternKey,
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
        let kind = ctx.kind;
        let lane = ctx.lane;
        let mut hold = ctx.hold;
        let client = ctx.client.display_name();
        let at_marker = kind.streams_initial_events.then(|| {
            let held = InitialState {
                hold: std::mem::take(&mut hold),
                key: ctx.key.clone(),
                predicted: ctx.predicted,
                gzip,
            };
            let learning = Learning {
                key: ctx.key.clone(),
                status: parts.status,
                gzip,
                full_list: kind.full_list,
                client: client.clone(),
                started: ctx.started,
            };
            self.initial_state_hook(held, learning)
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
        let body = counted.map_err(crate::BoxError::from).boxed();
        with_lane(Response::from_parts(parts, body), lane)
    }

    /// What a streaming list does where its initial state ends: it is
    /// learned there (the watch may go on for minutes, and until its size
    /// is learned each of its pattern's requests runs alone), and a heavy
    /// hold is settled there.
    fn initial_state_hook(self: &Arc<Self>, held: InitialState, learning: Learning) -> MarkerHook {
        let tx = if held.hold.is_heavy() {
            let (tx, rx) = oneshot::channel();
            tokio::spawn(self.clone().hold_through_initial_state(held, rx));
            Some(tx)
        } else {
            None
        };
        let observer = self.clone();
        Box::new(move |bytes| {
            observer.learn_initial_state(&learning, bytes);
            if let Some(tx) = tx {
                // The receiver gone (its hold timed out) is fine.
                let _ = tx.send(bytes);
            }
        })
    }

    /// The initial state as a completed LIST of its pattern.
    fn learn_initial_state(&self, l: &Learning, bytes: u64) {
        let outcome = Outcome {
            status: l.status.as_u16(),
            bytes,
            gzip: l.gzip,
            latency: l.started.elapsed(),
            completion: Completion::End,
            full_list: l.full_list,
            client: l.client.clone(),
            initial_bytes: Some(bytes),
        };
        self.patterns
            .lock()
            .observe(&l.key, &outcome, Instant::now());
    }

    /// A streaming list's hold, settled when its initial state has passed
    /// with what that state cost (a completed LIST for the in-flight
    /// budget's service time), or after [`INITIAL_STATE_HOLD`] or a stream
    /// cut short with its predicted charge.
    async fn hold_through_initial_state(
        self: Arc<Self>,
        s: InitialState,
        marker: oneshot::Receiver<u64>,
    ) {
        let passed = tokio::time::timeout(INITIAL_STATE_HOLD, marker).await;
        let debited = s.hold.debited();
        match passed {
            Ok(Ok(bytes)) => {
                let sent = self.patterns.lock().uncompressed(&s.key, bytes, s.gzip);
                let weight = self.config.get().quota.etcd_read_weight;
                let has_selector = s.key.has_selector();
                let actual = actual_charge(&s.predicted, has_selector, sent, true, weight, debited);
                self.reconcile(s.hold, actual, true);
            }
            _ => s.hold.settle(debited, false),
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
    use crate::identity::ClientClass;
    use crate::predict::Source;
    use http::{HeaderMap, Method};
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

    async fn streaming_list(c: &Config, a: &Arc<Admission>) -> InitialState {
        let uri: http::Uri =
            "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
                .parse()
                .expect("uri");
        let classified =
            crate::classify::classify(&Method::GET, &uri, &HeaderMap::new()).expect("ok");
        let verdict = a.admit_heavy("a", 5e5, c.admission(), false).await;
        assert!(verdict.hold.is_heavy());
        InitialState {
            hold: verdict.hold,
            key: PatternKey::new(&classified, ClientClass::User),
            predicted: Prediction {
                response_bytes: 5e5,
                read_bytes: 0.0,
                source: Source::Default,
            },
            gzip: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_list_holds_its_heavy_place_until_its_bookmark_or_a_request_timeout() {
        let (c, a, observer) = setup();
        let inflight = || a.view(c.admission()).heavy_inflight;

        // The bookmark passes after 3 s: the place is freed then, the watch going on.
        let state = streaming_list(&c, &a).await;
        let (tx, rx) = oneshot::channel();
        let held = tokio::spawn(observer.clone().hold_through_initial_state(state, rx));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(inflight(), 1, "held while the initial state flows");
        tx.send(4e5 as u64).expect("held");
        held.await.expect("settled");
        assert_eq!(inflight(), 0, "freed at the bookmark");

        // No bookmark ever: held for a request timeout, no longer.
        let state = streaming_list(&c, &a).await;
        let (_tx, rx) = oneshot::channel();
        let held = tokio::spawn(observer.clone().hold_through_initial_state(state, rx));
        tokio::time::sleep(INITIAL_STATE_HOLD - Duration::from_secs(1)).await;
        assert_eq!(inflight(), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        held.await.expect("settled");
        assert_eq!(inflight(), 0, "freed after a request timeout");

        // The stream ends first (the client went away): freed at once.
        let state = streaming_list(&c, &a).await;
        let (tx, rx) = oneshot::channel::<u64>();
        let held = tokio::spawn(observer.clone().hold_through_initial_state(state, rx));
        tokio::task::yield_now().await;
        drop(tx);
        held.await.expect("settled");
        assert_eq!(inflight(), 0, "freed with the stream");
    }
}
