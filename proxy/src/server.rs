//! Serving and draining: start the background loops (health checks, the
//! metrics scrape, the upstream's release, the heavy lane's dispatcher, the budget's controller, the
//! shared budget's renewal through etcd, the container count,
//! the identity headers' refresh, the certificate files' reload) with the narrow handles each needs, the admin listener, and
//! the client listener ([`crate::accept`]); at `shutdown`, stop accepting, close the
//! connections spread over the drain window, and wait for them up to a
//! deadline.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::gateway::Gateway;
use crate::release::ReleaseProbe;
use crate::scrape::Scraper;
use crate::signal_probe::{Schedule, SignalProbe};
use crate::tls::serving;
use crate::workers::Workers;
use crate::{accept, admin, containers, requestheader};

/// Serve clients on `listener` (their connections on `workers`) and the admin endpoints on
/// `admin` until `shutdown`, then drain: stop accepting, close connections spread over the
/// drain window, wait for them (bounded), and stop.
pub async fn serve(
    gateway: Gateway,
    listener: TcpListener,
    admin: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
    workers: Workers,
) {
    let stop = CancellationToken::new();
    start_background(&gateway, &stop);
    // The admin listener outlives the drain: /readyz says 503 meanwhile.
    let admin_stop = CancellationToken::new();
    if let Some(admin) = admin {
        tokio::spawn(admin::serve(gateway.clone(), admin, admin_stop.clone()));
    }
    let accept = tokio::spawn(accept::accept_loop(
        gateway.clone(),
        listener,
        gateway.tls().cloned(),
        workers,
        stop.clone(),
    ));
    shutdown.await;
    tracing::info!("shutting down: draining connections");
    gateway.begin_drain();
    stop.cancel();
    let _ = accept.await;
    drain(&gateway).await;
    admin_stop.cancel();
}

/// The loops that run beside the requests until `stop`.
fn start_background(gateway: &Gateway, stop: &CancellationToken) {
    let pool = gateway.pool();
    tokio::spawn(pool.clone().health_loop(stop.clone()));
    let scraper = Scraper {
        config: gateway.current_config().clone(),
        pool: pool.clone(),
        patterns: gateway.pattern_store().clone(),
        admission: gateway.admission().clone(),
        objects: gateway.metrics().resource_objects.clone(),
        failures: gateway.metrics().scrape_failures.clone(),
    };
    tokio::spawn(scraper.run(stop.clone()));
    let probe = ReleaseProbe {
        pool: pool.clone(),
        patterns: gateway.pattern_store().clone(),
        metrics: gateway.metrics().clone(),
    };
    tokio::spawn(probe.run(stop.clone()));
    let probe = SignalProbe {
        pool: pool.clone(),
        admission: gateway.admission().clone(),
        config: gateway.current_config().clone(),
        metrics: gateway.metrics().clone(),
    };
    tokio::spawn(probe.run(Schedule::default(), stop.clone()));
    let (config, recoveries) = (gateway.current_config().clone(), pool.clone());
    tokio::spawn(gateway.admission().clone().dispatch_loop(
        move || config.get(),
        |c| Config::admission(c),
        move || recoveries.recoveries(),
        stop.clone(),
    ));
    let config = gateway.current_config().clone();
    tokio::spawn(gateway.admission().clone().budget_loop(
        move || config.get(),
        |c| Config::admission(c),
        stop.clone(),
    ));
    if let Some(shared) = gateway.shared_budget() {
        tokio::spawn(
            shared
                .clone()
                .run(gateway.current_config().clone(), stop.clone()),
        );
    }
    tokio::spawn(requestheader::learn_loop(
        gateway.current_config().clone(),
        pool.clone(),
        pool.trusted_headers().clone(),
        gateway.metrics().clone(),
        stop.clone(),
    ));
    tokio::spawn(containers::container_loop(
        gateway.current_config().clone(),
        pool.clone(),
        gateway.admission().clone(),
        stop.clone(),
    ));
    // Stopped with the client listener: the admin listener keeps the certificate it has
    // for the rest of the drain.
    let certs = [gateway.tls(), gateway.admin_tls()];
    tokio::spawn(serving::reload_loop(
        certs.into_iter().flatten().cloned().collect(),
        gateway.metrics().clone(),
        stop.clone(),
    ));
}

/// Wait for the connections (each closes at its moment in the drain window,
/// or as soon as no request is in flight on it) and tunnels, up to the
/// window plus grace; then close what is left.
async fn drain(gateway: &Gateway) {
    let window = Duration::from_secs_f64(gateway.config().drain.window_seconds);
    let tasks = gateway.tasks();
    tasks.close();
    if tokio::time::timeout(window + accept::CLOSE_GRACE * 2, tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed with connections open");
    }
    gateway.hard_stop().cancel();
}
