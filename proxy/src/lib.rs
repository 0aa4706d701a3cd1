//! Tollgate: a streaming reverse proxy in front of kube-apiserver that
//! classifies every request, learns what each heavy LIST pattern costs in
//! bytes, and admits, queues or rejects them against a byte-cost quota.
//!
//! Layout, in the order a request meets the modules:
//! - [`config`]: the YAML file and the command-line flags that override it.
//! - [`kubeconfig`]: the upstream address, CA and tollgate's own identity
//!   from a kubeconfig (`--upstream-kubeconfig`).
//! - [`tls`]: PEM loading and the rustls configurations of both sides.
//! - [`accept`]: the client listener: TCP, TLS, HTTP/1.1 and HTTP/2, upgrades,
//!   graceful drain.
//! - [`identity`]: who the client is (certificate, token hash, anonymous) and
//!   the identity headers the apiserver gets (front-proxy `X-Remote-*`).
//! - [`tokenreview`]: who a bearer token belongs to, asked of the apiserver
//!   in the background and cached (optional).
//! - [`classify`]: the request parsed into verb, resource, scope and list
//!   options (via `apimodel`), and its consistency class.
//! - [`pattern`]: the normalized pattern key a request is learned under.
//! - [`predict`]: the pure pattern cache: decayed byte, latency and rate
//!   statistics per pattern, per-resource priors, `predict` and `observe`.
//! - [`decay`]: exponentially decayed statistics used by the predictor.
//! - [`admit`]: the admit step: lane, decision, metrics, 429s; the relist
//!   guard's rewrite of consistent LISTs to the cache.
//! - [`enforce`]: the pure parts of enforcement: lanes, the quota pool, fair
//!   queues (DRR), per-client rate limits, `Retry-After`, the relist guard,
//!   cluster-size scaling, and admission with its dispatcher.
//! - [`gateway`]: the shared state: configuration, reload, serve, drain.
//! - [`handle`]: one request's way: identify → classify → pattern → predict →
//!   admit → forward → observe, in one function.
//! - [`forward`]: the upstream pool (least outstanding requests, health
//!   checks, ejection, HTTP/2 lanes), hop-by-hop headers, upgrades.
//! - [`lanes`]: the clients that carry forwarded requests, at most the
//!   apiserver's streams per HTTP/2 connection.
//! - [`observe`]: the counting body wrapper that reports once at the end.
//! - [`scrape`]: the apiserver's object counts and etcd LIST counts, scraped
//!   into the priors and the learned store of consistent LISTs.
//! - [`admin`]: metrics and the admin listener (`/metrics`, `/healthz`,
//!   `/readyz`, `/debug/patterns`).
//! - [`status`]: errors turned into Kubernetes `Status` responses.
#![forbid(unsafe_code)]

pub mod accept;
pub mod admin;
pub mod admit;
pub mod budget;
pub mod classify;
pub mod config;
pub mod decay;
pub mod enforce;
pub mod forward;
pub mod gateway;
pub mod handle;
pub mod identity;
pub mod kubeconfig;
pub mod lanes;
pub mod observe;
pub mod pattern;
pub mod predict;
pub mod scrape;
pub mod status;
pub mod tls;
pub mod tokenreview;

use std::future::Future;

use tokio::net::TcpListener;

pub use config::{Config, ConfigError, Flags};

/// The body type of every request and response tollgate makes: streamed.
pub type Body = http_body_util::combinators::BoxBody<bytes::Bytes, hyper::Error>;
pub use handle::Gateway;

/// Why tollgate could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Kubeconfig(#[from] kubeconfig::KubeconfigError),
    #[error("cannot bind {what} on {addr}")]
    Bind {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid upstream {url:?}: {reason}")]
    Upstream { url: String, reason: String },
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
    gateway.serve(listener, admin, shutdown).await;
    Ok(())
}
