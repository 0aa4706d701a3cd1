//! The gateway's shared state: the running configuration (hot-reloaded),
//! the upstream pool, the pattern store, admission, token reviews, metrics,
//! and the drain's signals. Building it and reloading it are here; serving
//! and draining are in [`crate::server`], one request's way in
//! [`crate::handle`]. Background parts get narrow handles (an `Arc` of the
//! pool, the pattern store, admission), never the whole gateway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admit::Admission;
use crate::budget::shared::coordination::{SharedBudget, SharedView};
use crate::config::{self, Config};
use crate::enforce::lane::Lane;
use crate::forward::{Tunnels, UpstreamPool};
use crate::metrics::{
    CauseLabel, LaneLabel, Metrics, ReasonLabel, ResultLabel, UnitLabel, UpstreamLabel,
};
use crate::observe::Observer;
use crate::predict::{PatternStore, PatternView};
use crate::tls::serving::ServingCerts;
use crate::tokenreview::TokenReviews;
use crate::Error;

/// tollgate, ready to serve. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    config: Arc<config::Current>,
    pool: Arc<UpstreamPool>,
    patterns: Arc<PatternStore>,
    metrics: Arc<Metrics>,
    registry: Registry,
    tls: Option<Arc<ServingCerts>>,
    admin_tls: Option<Arc<ServingCerts>>,
    draining: AtomicBool,
    /// Connections and tunnels, waited for by the drain; tunnels close at
    /// its hard stop.
    tunnels: Tunnels,
    reviews: Option<Arc<TokenReviews>>,
    admission: Arc<Admission>,
    observer: Arc<Observer>,
    /// The etcd-read budget shared with the other masters (`quota.global`).
    shared: Option<Arc<SharedBudget>>,
}

/// `/debug/budget`: the heavy lane's local budget and, when on, the shared
/// etcd-read budget with the cluster's allocation.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DebugBudget {
    #[serde(flatten)]
    pub local: crate::budget::heavy::BudgetView,
    pub shared: Option<SharedView>,
}

/// `/debug/patterns` names users: an admin listener reachable from other
/// hosts without client certificates is said so at start.
fn warn_if_admin_exposed(config: &Config) {
    let Some(addr) = &config.admin_listen else {
        return;
    };
    let loopback = addr
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(addr.starts_with("localhost:"));
    if !loopback && config.admin.tls.client_ca_file.is_none() {
        tracing::warn!(admin = %addr, "the admin listener is reachable beyond this host and open to anyone: /debug/patterns names users; bind it to 127.0.0.1 or set admin.tls with a clientCaFile");
    }
}

impl Gateway {
    /// Load certificates and build the upstream clients; binds nothing.
    pub fn new(config: Config) -> Result<Gateway, Error> {
        config.validate()?;
        crate::install_crypto_provider();
        let tls = ServingCerts::load("client", &config.tls)?.map(Arc::new);
        let admin_tls = ServingCerts::load("admin", &config.admin.tls)?.map(Arc::new);
        warn_if_admin_exposed(&config);
        let pool = Arc::new(UpstreamPool::new(&config)?);
        if config.tls.client_ca_file.is_some() && !pool.has_front_proxy() {
            tracing::warn!("client certificates are verified but no front-proxy certificate is set: certificate clients reach the apiserver anonymous");
        }
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let review = &config.token_review;
        let reviews = review.enabled.then(|| {
            TokenReviews::new(
                Duration::from_secs_f64(review.cache_seconds),
                crate::tokenreview::Limits {
                    per_second: review.per_source_per_second,
                    burst: review.per_source_burst as f64,
                    in_flight: review.per_source_in_flight,
                },
                metrics.token_reviews.clone(),
            )
        });
        let triggers = metrics.guard_triggers.clone();
        let admission = Arc::new(Admission::new(
            config.admission(),
            Box::new(move |cause| {
                triggers
                    .get_or_create(&CauseLabel {
                        cause: cause.as_str(),
                    })
                    .inc();
            }),
        ));
        let shared = config.quota.global.enabled().then(|| {
            let shared = Arc::new(SharedBudget::new(&config.quota.global, &mut registry));
            admission.set_shared_gate(shared.gate().clone());
            shared
        });
        let patterns = Arc::new(PatternStore::new(config.patterns.clone()));
        let config = Arc::new(config::Current::new(config));
        let tunnels = Tunnels {
            tasks: TaskTracker::new(),
            hard_stop: CancellationToken::new(),
            upgrades: metrics.upgrades.clone(),
        };
        let observer = Arc::new(Observer {
            metrics: metrics.clone(),
            patterns: patterns.clone(),
            config: config.clone(),
        });
        Ok(Gateway {
            inner: Arc::new(Inner {
                config,
                pool,
                patterns,
                metrics,
                registry,
                tls,
                admin_tls,
                draining: AtomicBool::new(false),
                tunnels,
                reviews,
                admission,
                observer,
                shared,
            }),
        })
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        self.inner.config.get()
    }

    /// The running configuration, as a handle background loops keep.
    pub fn current_config(&self) -> &Arc<config::Current> {
        &self.inner.config
    }

    pub fn pool(&self) -> &Arc<UpstreamPool> {
        &self.inner.pool
    }

    pub fn pattern_store(&self) -> &Arc<PatternStore> {
        &self.inner.patterns
    }

    pub fn admission(&self) -> &Arc<Admission> {
        &self.inner.admission
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    pub fn reviews(&self) -> Option<&Arc<TokenReviews>> {
        self.inner.reviews.as_ref()
    }

    /// The client listener's serving certificates, if clients connect over TLS.
    pub fn tls(&self) -> Option<&Arc<ServingCerts>> {
        self.inner.tls.as_ref()
    }

    /// The admin listener's serving certificates, if it serves TLS.
    pub fn admin_tls(&self) -> Option<&Arc<ServingCerts>> {
        self.inner.admin_tls.as_ref()
    }

    /// Connections and tunnels: the drain waits for them.
    pub fn tasks(&self) -> &TaskTracker {
        &self.inner.tunnels.tasks
    }

    /// Cancelled when the drain's deadline passed: what is still open closes.
    pub fn hard_stop(&self) -> &CancellationToken {
        &self.inner.tunnels.hard_stop
    }

    /// The forward step's handle for upgraded connections.
    pub fn tunnels(&self) -> &Tunnels {
        &self.inner.tunnels
    }

    /// The observe step's handle.
    pub fn observer(&self) -> &Arc<Observer> {
        &self.inner.observer
    }

    /// Learn which identity headers the apiserver trusts before serving
    /// ([`crate::requestheader::learn_at_start`]); an error when tollgate must not start.
    pub async fn learn_identity_headers(&self) -> Result<(), Error> {
        let pool = &self.inner.pool;
        crate::requestheader::learn_at_start(
            &self.config(),
            pool,
            pool.trusted_headers(),
            &self.inner.metrics,
        )
        .await
        .map_err(Error::IdentityHeaders)
    }

    /// From now on `/readyz` says 503.
    pub fn begin_drain(&self) {
        self.inner.draining.store(true, Ordering::Relaxed);
    }

    /// Ready: an upstream is healthy, no drain has begun, and, with a front-proxy
    /// certificate, tollgate knows every identity header the apiserver trusts.
    pub fn ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// [`Gateway::ready`], or why not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.inner.draining.load(Ordering::Relaxed) {
            return Err("draining".into());
        }
        let pool = &self.inner.pool;
        if !pool.ready() {
            return Err("no upstream is healthy".into());
        }
        pool.trusted_headers().readiness(pool.has_front_proxy())
    }

    /// Learned patterns, heaviest first, each with the cost admission charges.
    pub fn patterns(&self) -> Vec<PatternView> {
        let weight = self.config().quota.etcd_read_weight;
        self.inner.patterns.snapshot(weight)
    }

    /// Prometheus text of every metric, with the gauges of state refreshed.
    /// The heavy lane's budget for `/debug/budget`.
    pub fn budget(&self) -> DebugBudget {
        let config = self.config();
        DebugBudget {
            local: self.inner.admission.budget_view(config.admission()),
            shared: self
                .inner
                .shared
                .as_ref()
                .map(|s| s.view(&config.quota.global)),
        }
    }

    /// The shared etcd-read budget, when `quota.global` is on.
    pub fn shared_budget(&self) -> Option<&Arc<SharedBudget>> {
        self.inner.shared.as_ref()
    }

    pub fn encode_metrics(&self) -> Result<String, std::fmt::Error> {
        let m = &self.inner.metrics;
        m.patterns.set(self.inner.patterns.lock().len() as i64);
        m.alive_tasks.set(crate::workers::alive_tasks() as i64);
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
        let admission = &self.inner.admission;
        let v = admission.view(config.admission());
        m.quota_available.set(v.level as i64);
        m.quota_rate.set(v.rate as i64);
        m.quota_burst.set(v.burst as i64);
        m.queued.set(v.queued as i64);
        m.guard_active.set(i64::from(v.guard_active));
        let b = admission.budget_view(config.admission());
        m.budget_rate.set(b.bytes_per_second as i64);
        m.budget_inflight.set(b.inflight_bytes as i64);
        m.budget_inflight_used.set(b.inflight_used_bytes as i64);
        m.budget_signal.set(b.p99_seconds.unwrap_or(f64::NAN));
        m.budget_target.set(b.target_seconds);
        m.budget_unlearned.set(b.unlearned_inflight as i64);
        for (reason, n) in &b.decisions {
            let c = m.budget_decisions.get_or_create(&ReasonLabel { reason });
            c.inc_by(n.saturating_sub(c.get()));
        }
        if let Some(shared) = &self.inner.shared {
            shared.update_metrics(&config.quota.global);
        }
        for (unit, size) in [("nodes", v.nodes), ("containers", v.containers)] {
            if let Some(n) = size {
                m.cluster_size
                    .get_or_create(&UnitLabel { unit })
                    .set(n as i64);
            }
        }
        for lane in Lane::ALL {
            let n = match lane {
                Lane::Heavy => v.heavy_inflight,
                other => admission.slots().inflight(other),
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
                self.count_reload("error");
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
    /// decision); listeners, upstreams and the paths of the TLS files need a
    /// restart (logged; the files' content is reloaded when it changes:
    /// [`crate::tls::serving`]).
    pub fn reload(&self, new: Config) -> Result<(), Error> {
        let result = new.validate();
        self.count_reload(if result.is_ok() { "ok" } else { "error" });
        result?;
        let old = self.config();
        if old.listen != new.listen
            || old.tls != new.tls
            || old.admin_listen != new.admin_listen
            || old.admin.tls != new.admin.tls
            || old.upstream.urls != new.upstream.urls
        {
            tracing::warn!(
                "listen, TLS file paths and upstream changes take effect at the next restart"
            );
        }
        self.inner
            .patterns
            .lock()
            .set_settings(new.patterns.clone());
        // Names added to upstream.requestHeaders are stripped at once; none stops being.
        let pool = &self.inner.pool;
        pool.trusted_headers()
            .configure(&new.upstream.request_headers);
        new.upstream
            .request_headers
            .warn_if_incomplete(pool.has_front_proxy());
        let changed = config::diff::changes(&old, &new);
        self.inner.config.set(new);
        tracing::info!(%changed, "configuration reloaded");
        Ok(())
    }

    fn count_reload(&self, result: &'static str) {
        self.inner
            .metrics
            .reloads
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }
}
