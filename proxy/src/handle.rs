//! The gateway: shared state and one request's way through it, written top
//! to bottom in [`Gateway::handle`]: identify → classify → pattern → predict
//! → (admit: nothing to decide in mode `off`) → forward → observe.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use apimodel::Verb;
use http::header::{CONTENT_ENCODING, HOST};
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::{self, ClassLabel, Metrics, SourceLabel, UpstreamLabel, VerbCode, VerbLabel};
use crate::classify::classify;
use crate::config::Config;
use crate::forward::{self, SendError, UpstreamPool};
use crate::identity::{rewrite_identity_headers, Client, PeerCertificate};
use crate::observe::{CountedBody, Tally};
use crate::pattern::PatternKey;
use crate::predict::{Outcome, PatternCache, PatternView, Prediction};
use crate::status::{self, ProxyError};
use crate::tokenreview::{self, TokenReviews};
use crate::{accept, tls, Body, Error};

/// tollgate, ready to serve. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    config: RwLock<Arc<Config>>,
    pool: Arc<UpstreamPool>,
    cache: Mutex<PatternCache>,
    metrics: Metrics,
    registry: Registry,
    tls: Option<Arc<rustls::ServerConfig>>,
    draining: AtomicBool,
    /// Cancelled at the end of the drain: upgraded tunnels close.
    hard_stop: CancellationToken,
    tasks: TaskTracker,
    reviews: Option<TokenReviews>,
}

impl Gateway {
    /// Load certificates and build the upstream clients; binds nothing.
    pub fn new(config: Config) -> Result<Gateway, Error> {
        config.validate()?;
        crate::install_crypto_provider();
        let tls = match (&config.tls.cert_file, &config.tls.key_file) {
            (Some(cert), Some(key)) => {
                let id = tls::load_identity(cert, key)?;
                Some(Arc::new(tls::server_config(
                    id,
                    config.tls.client_ca_file.as_deref(),
                )?))
            }
            _ => None,
        };
        let pool = Arc::new(UpstreamPool::new(&config)?);
        if config.tls.client_ca_file.is_some() && !pool.has_front_proxy() {
            tracing::warn!("client certificates are verified but no front-proxy certificate is set: certificate clients reach the apiserver anonymous");
        }
        let review = &config.token_review;
        let reviews = review
            .enabled
            .then(|| TokenReviews::new(Duration::from_secs_f64(review.cache_seconds)));
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        Ok(Gateway {
            inner: Arc::new(Inner {
                cache: Mutex::new(PatternCache::new(config.patterns.clone())),
                config: RwLock::new(Arc::new(config)),
                pool,
                metrics,
                registry,
                tls,
                draining: AtomicBool::new(false),
                hard_stop: CancellationToken::new(),
                tasks: TaskTracker::new(),
                reviews,
            }),
        })
    }

    pub fn config(&self) -> Arc<Config> {
        self.inner
            .config
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    fn cache(&self) -> MutexGuard<'_, PatternCache> {
        // A panic while holding the lock leaves statistics, not invariants: keep going.
        self.inner.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Ready: an upstream is healthy and no drain has begun.
    pub fn ready(&self) -> bool {
        !self.inner.draining.load(Ordering::Relaxed) && self.inner.pool.ready()
    }

    /// Learned patterns, heaviest first.
    pub fn patterns(&self) -> Vec<PatternView> {
        self.cache().snapshot(Instant::now())
    }

    pub(crate) fn reviews(&self) -> Option<&TokenReviews> {
        self.inner.reviews.as_ref()
    }

    pub(crate) fn pool(&self) -> &UpstreamPool {
        &self.inner.pool
    }

    /// Object counts scraped from the apiserver (see [`crate::scrape`]).
    pub fn set_object_counts(&self, counts: &[(String, f64)]) {
        let mut cache = self.cache();
        for (resource, n) in counts {
            cache.set_object_count(resource, *n);
        }
        drop(cache);
        let m = &self.inner.metrics;
        for (resource, n) in counts {
            m.resource_objects
                .get_or_create(&admin::ResourceLabel {
                    resource: resource.clone(),
                })
                .set(*n as i64);
        }
    }

    /// Consistent LISTs forwarded so far, per resource.
    pub fn consistent_lists(&self) -> std::collections::HashMap<String, u64> {
        self.cache().consistent_lists().clone()
    }

    /// Learn which store serves consistent LISTs from `(resource, etcd
    /// LISTs, consistent LISTs)` over one scrape interval.
    pub fn learn_stores(&self, deltas: &[(String, f64, u64)]) {
        let mut cache = self.cache();
        for (resource, etcd, ours) in deltas {
            if let Some(store) = cache.learn_store(resource, *etcd, *ours) {
                tracing::debug!(%resource, ?store, "learned the store of consistent LISTs");
            }
        }
    }

    /// Prometheus text of every metric, refreshed.
    pub fn encode_metrics(&self) -> Result<String, std::fmt::Error> {
        let m = &self.inner.metrics;
        m.patterns.set(self.cache().len() as i64);
        for u in self.inner.pool.upstreams() {
            let l = UpstreamLabel {
                upstream: u.url.clone(),
            };
            m.upstream_healthy
                .get_or_create(&l)
                .set(i64::from(u.is_healthy()));
            m.upstream_outstanding
                .get_or_create(&l)
                .set(u.outstanding() as i64);
        }
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.inner.registry)?;
        Ok(s)
    }

    /// Apply a freshly loaded configuration, or log why it was refused and
    /// keep the running one.
    pub fn reload_from(&self, loaded: Result<Config, crate::ConfigError>) {
        let result = match loaded {
            Ok(config) => self.reload(config),
            Err(e) => {
                self.inner
                    .metrics
                    .reloads
                    .get_or_create(&ResultLabel("error").into())
                    .inc();
                Err(e.into())
            }
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "reload refused; keeping the running configuration");
        }
    }

    /// Apply a new configuration. Pattern, timeout and mode settings take
    /// effect at once; listeners, TLS and upstreams need a restart (logged).
    pub fn reload(&self, new: Config) -> Result<(), Error> {
        let result = new.validate();
        let label = ResultLabel(if result.is_ok() { "ok" } else { "error" });
        self.inner
            .metrics
            .reloads
            .get_or_create(&label.into())
            .inc();
        result?;
        let old = self.config();
        if old.listen != new.listen
            || old.tls.cert_file != new.tls.cert_file
            || old.upstream.urls != new.upstream.urls
        {
            tracing::warn!("listen, TLS and upstream changes take effect at the next restart");
        }
        self.cache().set_settings(new.patterns.clone());
        if let Ok(mut c) = self.inner.config.write() {
            *c = Arc::new(new);
        }
        tracing::info!("configuration reloaded");
        Ok(())
    }

    /// Serve clients on `listener` and the admin endpoints on `admin` until
    /// `shutdown`, then drain: stop accepting, close connections spread over
    /// the drain window, wait for them.
    pub async fn serve(
        self,
        listener: TcpListener,
        admin: Option<TcpListener>,
        shutdown: impl Future<Output = ()>,
    ) {
        let stop = CancellationToken::new();
        tokio::spawn(self.inner.pool.clone().health_loop(stop.clone()));
        tokio::spawn(crate::scrape::scrape_loop(self.clone(), stop.clone()));
        // The admin listener outlives the drain: /readyz says 503 meanwhile.
        let admin_stop = CancellationToken::new();
        if let Some(admin) = admin {
            tokio::spawn(admin::serve(self.clone(), admin, admin_stop.clone()));
        }
        let accept = tokio::spawn(accept::accept_loop(
            self.clone(),
            listener,
            self.inner.tls.clone(),
            stop.clone(),
        ));
        shutdown.await;
        tracing::info!("shutting down: draining connections");
        self.inner.draining.store(true, Ordering::Relaxed);
        stop.cancel();
        let _ = accept.await;
        let window = Duration::from_secs_f64(self.config().drain.window_seconds);
        self.inner.tasks.close();
        if tokio::time::timeout(window + accept::CLOSE_GRACE * 2, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("drain deadline passed with connections open");
        }
        self.inner.hard_stop.cancel();
        admin_stop.cancel();
    }

    pub(crate) fn tasks(&self) -> &TaskTracker {
        &self.inner.tasks
    }

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
        // classify
        let classified = match classify(req.method(), req.uri(), req.headers()) {
            Ok(c) => c,
            Err(e) => return self.reject(None, ProxyError::BadRequest(e)),
        };
        // pattern, predict
        let key = PatternKey::new(&classified, client.identity.class());
        let predicted = self.cache().predict(&key, started);
        tracing::debug!(pattern = %key, client = %client.identity.display_name(), predicted = predicted.cost(), "request");
        // admit: mode `off` decides nothing.

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
            Err(e) => return self.reject(Some(classified.info.verb), e),
        };
        if let (StatusCode::SWITCHING_PROTOCOLS, Some(client_side)) =
            (resp.status(), on_client_upgrade)
        {
            let upstream_side = hyper::upgrade::on(&mut resp);
            self.tunnel(client_side, upstream_side, outstanding);
            let (mut parts, _) = resp.into_parts();
            forward::strip_hop_by_hop(&mut parts.headers, true);
            self.count(&classified.info.verb, parts.status, 0);
            return Response::from_parts(parts, status::full(bytes::Bytes::new()));
        }
        let (mut parts, body) = resp.into_parts();
        forward::strip_hop_by_hop(&mut parts.headers, false);

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
            gateway.finish(&key, verb, long_running, &outcome, predicted);
        });
        let counted = if streaming_list {
            counted.watch_for(crate::observe::INITIAL_EVENTS_END)
        } else {
            counted
        };
        Response::from_parts(parts, counted.boxed())
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

    /// The observe step: learn, export.
    fn finish(
        &self,
        key: &PatternKey,
        verb: Verb,
        long_running: bool,
        outcome: &Outcome,
        predicted: Prediction,
    ) {
        let now = Instant::now();
        let m = &self.inner.metrics;
        m.inflight.dec();
        let code =
            StatusCode::from_u16(outcome.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        self.count(&verb, code, outcome.bytes);
        if !long_running {
            m.duration
                .get_or_create(&VerbLabel {
                    verb: verb.as_str(),
                })
                .observe(outcome.latency.as_secs_f64());
        }
        let mut cache = self.cache();
        cache.observe(key, outcome, now);
        drop(cache);
        if outcome.completion == crate::predict::Completion::End
            && code.is_success()
            && !outcome.gzip
        {
            let class = ClassLabel {
                verb: key.verb.as_str(),
                consistency: key.consistency.map_or("none", |c| c.as_str()),
            };
            let actual = outcome.bytes;
            m.predicted_bytes
                .get_or_create(&class)
                .inc_by(predicted.response_bytes as u64);
            m.actual_bytes.get_or_create(&class).inc_by(actual);
            if predicted.response_bytes > 0.0 {
                m.prediction_ratio
                    .get_or_create(&class)
                    .observe(actual as f64 / predicted.response_bytes);
            }
        }
    }

    fn count(&self, verb: &Verb, code: StatusCode, bytes: u64) {
        let m = &self.inner.metrics;
        m.requests
            .get_or_create(&VerbCode {
                verb: verb.as_str(),
                code: code.as_u16(),
            })
            .inc();
        m.response_bytes
            .get_or_create(&VerbLabel {
                verb: verb.as_str(),
            })
            .inc_by(bytes);
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

struct ResultLabel(&'static str);

impl From<ResultLabel> for admin::ResultLabel {
    fn from(r: ResultLabel) -> Self {
        admin::ResultLabel { result: r.0.into() }
    }
}
