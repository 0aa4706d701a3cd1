//! The gateway's shared state: configuration (hot-reloaded), the upstream
//! pool, the pattern cache, admission control, metrics; building it,
//! serving, draining and reloading. One request's way through it is in
//! [`crate::handle`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::{self, LaneLabel, Metrics, UpstreamLabel};
use crate::config::Config;
use crate::enforce::lane::{Lane, LaneSlots};
use crate::enforce::Admission;
use crate::forward::UpstreamPool;
use crate::predict::{PatternCache, PatternView};
use crate::tokenreview::TokenReviews;
use crate::{accept, tls, Error};

/// tollgate, ready to serve. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    config: RwLock<Arc<Config>>,
    pub(crate) pool: Arc<UpstreamPool>,
    cache: Mutex<PatternCache>,
    pub(crate) metrics: Metrics,
    registry: Registry,
    tls: Option<Arc<rustls::ServerConfig>>,
    draining: AtomicBool,
    /// Cancelled at the end of the drain: upgraded tunnels close.
    pub(crate) hard_stop: CancellationToken,
    pub(crate) tasks: TaskTracker,
    reviews: Option<TokenReviews>,
    pub(crate) slots: Arc<LaneSlots>,
    pub(crate) admission: Arc<Admission>,
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
        let slots = Arc::new(LaneSlots::default());
        let triggers = metrics.guard_triggers.clone();
        let admission = Arc::new(Admission::new(
            &config,
            slots.clone(),
            Box::new(move |cause| {
                triggers
                    .get_or_create(&admin::CauseLabel {
                        cause: cause.as_str(),
                    })
                    .inc();
            }),
        ));
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
                slots,
                admission,
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

    pub(crate) fn cache(&self) -> MutexGuard<'_, PatternCache> {
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

    pub(crate) fn lane_slots(&self) -> &Arc<LaneSlots> {
        &self.inner.slots
    }

    /// The cluster size for the pool's scaling: `nodes` or `containers`.
    pub fn set_cluster_size(&self, unit: &'static str, n: f64) {
        self.inner.admission.set_cluster_size(unit, n);
        self.inner
            .metrics
            .cluster_size
            .get_or_create(&admin::UnitLabel { unit })
            .set(n as i64);
    }

    /// The upstream's `process_start_time_seconds`, as scraped: a change
    /// means it restarted (the relist guard warms up).
    pub fn observe_upstream_start(&self, start_time: f64) {
        self.inner
            .admission
            .observe_upstream(self.inner.pool.recoveries(), Some(start_time));
    }

    /// Object counts scraped from the apiserver (see [`crate::scrape`]).
    pub fn set_object_counts(&self, counts: &[(String, f64)]) {
        let mut cache = self.cache();
        for (resource, n) in counts {
            cache.set_object_count(resource, *n);
        }
        drop(cache);
        if let Some((_, nodes)) = counts.iter().find(|(r, _)| r == "nodes") {
            self.set_cluster_size("nodes", *nodes);
        }
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
        let config = self.config();
        let v = self.inner.admission.view(&config);
        m.quota_available.set(v.level as i64);
        m.quota_rate.set(v.rate as i64);
        m.quota_burst.set(v.burst as i64);
        m.queued.set(v.queued as i64);
        m.guard_active.set(i64::from(v.guard_active));
        for lane in Lane::ALL {
            let n = match lane {
                Lane::Heavy => v.heavy_inflight,
                other => self.inner.slots.inflight(other),
            };
            m.lane_inflight
                .get_or_create(&LaneLabel {
                    lane: lane.as_str(),
                })
                .set(n as i64);
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

    /// Apply a new configuration. Mode, lanes, quota, guard, pattern and
    /// timeout settings take effect at once, and the quota pool keeps its
    /// level and debt (admission reads the running configuration on every
    /// decision); listeners, TLS and upstreams need a restart (logged).
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
        let (g, pool) = (self.clone(), self.inner.pool.clone());
        tokio::spawn(self.inner.admission.clone().dispatch_loop(
            move || g.config(),
            move || pool.recoveries(),
            stop.clone(),
        ));
        tokio::spawn(crate::enforce::scaling::container_loop(
            self.clone(),
            stop.clone(),
        ));
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
}

struct ResultLabel(&'static str);

impl From<ResultLabel> for admin::ResultLabel {
    fn from(r: ResultLabel) -> Self {
        admin::ResultLabel { result: r.0.into() }
    }
}
