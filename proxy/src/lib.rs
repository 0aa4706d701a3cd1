//! Tollgate: a streaming reverse proxy in front of kube-apiserver that
//! classifies every request, learns what each heavy LIST pattern costs in
//! bytes, and admits, queues or rejects them against a byte-cost quota.
//!
//! One request's way, each step a function in the module named after it,
//! called in order by [`handle::handle`] over one per-request context
//! ([`context::RequestCtx`]):
//!
//! | step | function | what it does |
//! |---|---|---|
//! | accept | [`accept::accept_loop`] | TCP, TLS (client certificates), HTTP/1.1 and HTTP/2, upgrades, the drain's close |
//! | identify | [`identity::Client::of`], [`tokenreview::review`] | certificate, token hash or anonymous; a token's cached TokenReview |
//! | classify | [`classify::classify`], [`admit::rewrite_to_cache`] | verb, resource, scope, list options, consistency; the relist guard's rewrite |
//! | pattern | [`pattern::PatternKey::new`] | the normalized key the request is learned under |
//! | predict | [`predict::PatternCache::predict`] | the cost from the pattern cache or the resource priors |
//! | admit | [`admit::lane`], [`admit::admit`] | the lane, then admit, queue or reject (429); unlearned heavy patterns one at a time |
//! | forward | [`forward::forward`] | headers rewritten (identity headers: [`requestheader`]), sent to the least busy upstream (retried once), tunnels |
//! | observe | [`observe::Observer::observe`] | the body counted to its end: quota reconciled, pattern learned, metrics |
//!
//! Around them:
//! - [`server`]: `serve` and the drain; starts the background loops with
//!   narrow handles: health checks ([`forward::UpstreamPool::health_loop`]),
//!   the metrics [`scrape`], the upstream's [`release`] (its `/version`), the heavy lane's dispatcher
//!   ([`admit::Admission::dispatch_loop`]), the budget's controller
//!   ([`admit::Admission::budget_loop`]), the [`containers`] count, the
//!   identity headers the apiserver trusts ([`requestheader::learn_loop`]).
//! - [`workers`]: the threads client connections are served on, each with its own runtime and
//!   its own upstream connections; accept, admin and the background loops stay on the main one.
//! - [`gateway`]: the shared state (configuration, upstream pool, pattern
//!   store, admission, metrics) and reload.
//! - [`enforce`]: the pure parts of admission (lanes, quota pool, fair
//!   queues, the heavy lane, rate limits, `Retry-After`, relist guard,
//!   scaling, settings); [`budget`]: the heavy lane's byte budget (bytes in
//!   flight, unlearned patterns, the latency signal, the adaptive
//!   controller, the etcd-read budget shared with the other masters
//!   through etcd); [`predict`] and [`decay`]: the pure pattern cache.
//! - [`config`], [`tls`]: settings and certificates (a kubeconfig is read by
//!   the shared `kubeio` crate); the listeners' certificate files are
//!   reloaded when they change ([`tls::serving`]).
//! - [`logging`]: the binary's `--log-format` and `--log-level`.
//! - [`listener`]: what both listeners share (accept backoff, connection
//!   caps, idle connections).
//! - [`metrics`]: every metric; [`admin`]: the admin listener (`/metrics`,
//!   `/healthz`, `/readyz`, `/debug/patterns`, `/debug/budget`; optional TLS with a client CA
//!   for `/metrics` and `/debug/*`); [`status`]: errors as
//!   Kubernetes `Status` responses.
#![forbid(unsafe_code)]

pub mod accept;
pub mod admin;
pub mod admit;
pub mod budget;
pub mod classify;
pub mod config;
pub mod containers;
pub mod context;
pub mod decay;
pub mod enforce;
pub mod forward;
pub mod gateway;
pub mod handle;
pub mod identity;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod observe;
pub mod pattern;
pub mod predict;
pub mod release;
pub mod requestheader;
pub mod scrape;
pub mod server;
pub mod signal_probe;
pub mod snapshot;
pub mod status;
pub mod tls;
pub mod tokenreview;
pub mod wake_lag;
pub mod workers;

use std::future::Future;

use tokio::net::TcpListener;

pub use config::{Config, ConfigError, Flags};

/// The body type of every request and response tollgate makes: streamed.
/// Its error is boxed: a body may end with hyper's error or tollgate's own
/// (an upstream body that stalled, [`forward::stall`]).
pub type Body = http_body_util::combinators::BoxBody<bytes::Bytes, BoxError>;

/// Any error, sendable.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub use gateway::Gateway;

/// Why tollgate could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Kubeconfig(#[from] kubeio::kubeconfig::KubeconfigError),
    #[error("cannot bind {what} on {addr}")]
    Bind {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid upstream {url:?}: {reason}")]
    Upstream { url: String, reason: String },
    #[error("{0}")]
    IdentityHeaders(String),
}

/// Install ring as rustls' process-wide crypto provider. Idempotent.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Run tollgate with `config`, serving clients on `listener` (and the admin
/// endpoints on `config.admin_listen`, if set) until `shutdown` completes;
/// then drain.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let admin = match &config.admin_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Bind {
                    what: "admin listener",
                    addr: addr.clone(),
                    source,
                })?,
        ),
        None => None,
    };
    let gateway = Gateway::new(config)?;
    gateway.learn_identity_headers().await?;
    server::serve(
        gateway,
        listener,
        admin,
        shutdown,
        workers::Workers::local(),
    )
    .await;
    Ok(())
}
