//! One request's way through the gateway, written top to bottom in
//! [`Gateway::handle`]: identify → classify → pattern → predict → admit →
//! forward → observe. The gateway's shared state is in [`crate::gateway`].

use std::sync::Arc;
use std::time::Duration;

use apimodel::Verb;
use http::header::{CONTENT_ENCODING, HOST};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use crate::admin::{DirectionLabel, SourceLabel, VerbCode};
use crate::admit::{with_lane, Admitted, REWRITE_HEADER};
use crate::classify::classify;
use crate::enforce::decide::{actual_charge, Hold};
use crate::forward::{self, SendError};
pub use crate::gateway::Gateway;
use crate::identity::{rewrite_identity_headers, Client, PeerCertificate};
use crate::observe::{CountedBody, Tally};
use crate::pattern::PatternKey;
use crate::predict::{Completion, Outcome, Prediction};
use crate::status::{self, ProxyError};
use crate::tokenreview;
use crate::Body;

impl Gateway {
    /// One request, from arrival to the response head; the body streams on.
    pub async fn handle(
        &self,
        mut req: Request<Incoming>,
        peer: Option<Arc<PeerCertificate>>,
    ) -> Response<Body> {
        let started = Instant::now();
        let config = self.config();
        // identify
        let mut client = Client::of(peer.as_deref(), req.headers());
        tokenreview::review(self, &mut client, req.headers(), started);
        // classify (and, by the relist guard's policy, maybe read from the cache)
        let mut classified = match classify(req.method(), req.uri(), req.headers()) {
            Ok(c) => c,
            Err(e) => return self.reject(None, ProxyError::BadRequest(e)),
        };
        let rewritten = self.rewrite_to_cache(&mut req, &client, &classified, &config);
        if let Some(again) = &rewritten {
            classified = again.clone();
        }
        // pattern, predict
        let key = PatternKey::new(&classified, client.identity.class());
        let predicted = self.cache().predict(&key, started);
        tracing::debug!(pattern = %key, client = %client.identity.display_name(), predicted = predicted.cost(), "request");
        // admit: a lane, then admit, queue or reject (429)
        let Admitted { lane, hold } = match self
            .admit(&client, &classified, &key, &predicted, &config)
            .await
        {
            Ok(a) => a,
            Err(too_many) => return too_many,
        };

        // forward
        let upgrade = forward::is_upgrade(req.headers());
        let on_client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        forward::strip_hop_by_hop(&mut parts.headers, upgrade);
        rewrite_identity_headers(
            &mut parts.headers,
            &client.identity,
            self.inner.pool.has_front_proxy(),
        );
        parts.headers.remove(HOST);
        let front_proxy = client.identity.needs_front_proxy() && self.inner.pool.has_front_proxy();
        // A request without a body can be sent again if the upstream cannot be reached.
        let replay = (body.is_end_stream() && self.inner.pool.upstreams().len() > 1).then(|| {
            (
                parts.method.clone(),
                parts.uri.clone(),
                parts.headers.clone(),
            )
        });
        let long_running = classified.info.is_long_running();
        let timeout =
            (!long_running).then(|| Duration::from_secs_f64(config.timeouts.request_seconds));
        let outbound = Request::from_parts(parts, body.boxed());
        let sent = self
            .send(outbound, replay, front_proxy, upgrade, timeout)
            .await;
        let (mut resp, outstanding) = match sent {
            Ok(r) => r,
            // An unsettled hold refunds its debit: the upstream did no work.
            Err(e) => return with_lane(self.reject(Some(classified.info.verb), e), lane),
        };
        // Long-running requests (watches, upgrades) give their slot back once
        // the response starts, as the apiserver's flow control does; a
        // watch-list keeps its predicted charge (its initial state is not
        // measured to the end here).
        let hold = if long_running || upgrade {
            let debited = hold.debited();
            hold.settle(debited);
            Hold::Nothing
        } else {
            hold
        };
        if let (StatusCode::SWITCHING_PROTOCOLS, Some(client_side)) =
            (resp.status(), on_client_upgrade)
        {
            let upstream_side = hyper::upgrade::on(&mut resp);
            self.tunnel(client_side, upstream_side, outstanding);
            let (mut parts, _) = resp.into_parts();
            forward::strip_hop_by_hop(&mut parts.headers, true);
            self.count(&classified.info.verb, parts.status, 0);
            let resp = Response::from_parts(parts, status::full(bytes::Bytes::new()));
            return with_lane(resp, lane);
        }
        let (mut parts, body) = resp.into_parts();
        forward::strip_hop_by_hop(&mut parts.headers, false);
        if rewritten.is_some() {
            parts.headers.insert(
                REWRITE_HEADER,
                HeaderValue::from_static("resourceVersion=0"),
            );
        }

        // observe, once the body ends
        let gzip = parts
            .headers
            .get(CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        let code = parts.status;
        let verb = classified.info.verb;
        let full_list = classified.is_full_list();
        let client_name = client.display_name();
        let gateway = self.clone();
        self.inner.metrics.inflight.inc();
        let streaming_list =
            classified.watch_list && classified.info.options.send_initial_events == Some(true);
        let counted = CountedBody::new(body, started, move |tally: Tally| {
            drop(outstanding);
            let outcome = Outcome {
                status: code.as_u16(),
                bytes: tally.bytes,
                gzip,
                latency: tally.elapsed,
                completion: tally.completion,
                full_list,
                client: client_name,
                initial_bytes: tally.initial_bytes,
            };
            gateway.finish(&key, verb, long_running, &outcome, predicted, hold);
        });
        let counted = if streaming_list {
            counted.watch_for(crate::observe::INITIAL_EVENTS_END)
        } else {
            counted
        };
        with_lane(Response::from_parts(parts, counted.boxed()), lane)
    }

    /// The forward step: pick the least busy upstream and send; if it
    /// cannot be reached, eject it and, for a request without a body, try
    /// another one once. `timeout` bounds the wait for response headers.
    async fn send(
        &self,
        mut outbound: Request<Body>,
        replay: Option<(http::Method, http::Uri, http::HeaderMap)>,
        front_proxy: bool,
        upgrade: bool,
        timeout: Option<Duration>,
    ) -> Result<(Response<Incoming>, forward::Outstanding), ProxyError> {
        let pool = &self.inner.pool;
        let mut avoid = None;
        loop {
            let mut outstanding = pool.pick(avoid.as_ref()).ok_or(ProxyError::NoUpstream)?;
            let upstream = outstanding.upstream().clone();
            let retry = replay.as_ref().map(|(m, u, h)| {
                let mut r = Request::new(status::full(bytes::Bytes::new()));
                *r.method_mut() = m.clone();
                *r.uri_mut() = u.clone();
                *r.headers_mut() = h.clone();
                r
            });
            let sent = pool.send(&mut outstanding, outbound, front_proxy, upgrade);
            let result = match timeout {
                Some(t) => {
                    tokio::time::timeout(t, sent)
                        .await
                        .map_err(|_| ProxyError::Timeout {
                            upstream: upstream.url.clone(),
                            seconds: t.as_secs_f64(),
                        })?
                }
                None => sent.await,
            };
            let e = match result {
                Ok(resp) => return Ok((resp, outstanding)),
                Err(SendError::Build(e)) => return Err(ProxyError::Build(e)),
                Err(SendError::Client(e)) => e,
            };
            if !e.is_connect() {
                return Err(ProxyError::Upstream {
                    upstream: upstream.url.clone(),
                    source: e,
                });
            }
            pool.eject(&upstream);
            match (retry, avoid.is_none() && pool.upstreams().len() > 1) {
                (Some(r), true) => {
                    tracing::debug!(upstream = %upstream.url, "retrying on another upstream");
                    outbound = r;
                    avoid = Some(upstream);
                }
                _ => {
                    return Err(ProxyError::Upstream {
                        upstream: upstream.url.clone(),
                        source: e,
                    })
                }
            }
        }
    }

    /// The observe step: learn, settle the quota debit, export.
    fn finish(
        &self,
        key: &PatternKey,
        verb: Verb,
        long_running: bool,
        outcome: &Outcome,
        predicted: Prediction,
        hold: Hold,
    ) {
        let now = Instant::now();
        let m = &self.inner.metrics;
        m.inflight.dec();
        let code =
            StatusCode::from_u16(outcome.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        self.count(&verb, code, outcome.bytes);
        if !long_running {
            m.per_verb.duration(m, verb, outcome.latency.as_secs_f64());
        }
        let mut cache = self.cache();
        cache.observe(key, outcome, now);
        let sent = cache.uncompressed(key, outcome.bytes, outcome.gzip);
        drop(cache);
        let debited = hold.debited();
        if debited > 0.0 {
            let complete = outcome.completion == Completion::End;
            let weight = self.config().quota.etcd_read_weight;
            let actual = actual_charge(
                &predicted,
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
            hold.settle(actual);
        } else {
            drop(hold);
        }
        if outcome.completion == Completion::End && code.is_success() && !outcome.gzip {
            m.per_class.observe(
                m,
                key.verb,
                key.consistency,
                predicted.response_bytes,
                outcome.bytes,
            );
        }
    }

    fn count(&self, verb: &Verb, code: StatusCode, bytes: u64) {
        let m = &self.inner.metrics;
        m.per_verb.request(m, *verb, code.as_u16());
        m.per_verb.response_bytes(m, *verb, bytes);
    }

    /// Carry an upgraded connection (exec, attach, port-forward) both ways.
    fn tunnel(
        &self,
        client: hyper::upgrade::OnUpgrade,
        upstream: hyper::upgrade::OnUpgrade,
        outstanding: forward::Outstanding,
    ) {
        self.inner.metrics.upgrades.inc();
        let stop = self.inner.hard_stop.clone();
        self.inner.tasks.spawn(async move {
            let _outstanding = outstanding;
            let (client, upstream) = match tokio::join!(client, upstream) {
                (Ok(c), Ok(u)) => (c, u),
                (c, u) => {
                    tracing::debug!(client = ?c.err(), upstream = ?u.err(), "upgrade failed");
                    return;
                }
            };
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            tokio::select! {
                r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                    tracing::debug!(result = ?r, "upgraded stream closed");
                }
                _ = stop.cancelled() => {}
            }
        });
    }

    fn reject(&self, verb: Option<Verb>, e: ProxyError) -> Response<Body> {
        tracing::debug!(error = %e, "answered by tollgate");
        let resp = e.to_response();
        let verb = verb.map_or("unknown", Verb::as_str);
        self.inner
            .metrics
            .requests
            .get_or_create(&VerbCode {
                verb,
                code: resp.status().as_u16(),
            })
            .inc();
        self.inner
            .metrics
            .errors
            .get_or_create(&SourceLabel {
                source: e.source_side().as_str(),
            })
            .inc();
        resp
    }
}
