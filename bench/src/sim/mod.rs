//! The simulated kube-apiserver (`tollgate-bench sim`): the real API's paths,
//! verbs, List/Status/WatchEvent shapes, authentication and max-in-flight
//! behaviour, over an in-memory store, so kubectl, loadgen and tollgate cannot
//! tell it from the real thing for the resources it serves. With `--store etcd`
//! the objects live in a real etcd and the in-memory store is the watch cache.
//!
//! Layout:
//! - [`api`]: one request's way (authenticate, parse, max-in-flight, route, count); `nonresource`: health, discovery, `/metrics`.
//! - [`model`]: the cost model (`--cost-model modeled`): stations, memory, crash and restart.
//! - [`list`], [`watch`], [`write`]: the verbs; [`patch`]: the three patch types.
//! - [`store`], [`object`]: revisions, snapshots, history; [`reaper`]: graceful deletes.
//! - [`storage`]: memory or etcd, chosen at start; [`etcd`]: keys, txns, ranges, the cache's feed;
//!   [`etcd_server`]: a local etcd process for tests and the demo.
//! - [`resources`], [`discovery`], [`table`]: what is served and how kubectl sees it.
//! - [`authn`], [`token_file`], [`pki`], [`tls`], [`kubeconfig`]: identities, certificates, client config.
//! - [`inflight`], [`metrics`], [`seed`], [`server`], [`respond`], [`clock`], [`validate`].

pub mod api;
pub mod authn;
pub mod clock;
mod config;
pub mod discovery;
pub mod etcd;
pub mod etcd_server;
pub mod inflight;
pub mod kubeconfig;
pub mod list;
pub mod metrics;
pub mod model;
mod nonresource;
pub mod object;
pub mod patch;
pub mod pki;
pub mod protobuf;
pub mod reaper;
pub mod resources;
pub mod respond;
pub mod seed;
pub mod server;
pub mod storage;
pub mod store;
pub mod table;
pub mod tls;
pub mod token_file;
pub mod validate;
pub mod watch;
pub mod write;

pub use config::{ByteSize, CostModel, SimArgs, SimError, StoreKind};

use api::{Api, ApiConfig};
use authn::{Authenticator, AuthnConfig};
use etcd::EtcdStore;
use inflight::Inflight;
use metrics::{KindLabels, SimMetrics};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use storage::Storage;
use store::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A simulator serving on a bound port.
pub struct RunningSim {
    pub addr: SocketAddr,
    /// `http://127.0.0.1:port` or `https://…`.
    pub url: String,
    /// The CA that signed the serving certificate, with `--tls`.
    pub ca_pem: Option<String>,
    pub api: Arc<Api>,
    stop: CancellationToken,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl RunningSim {
    /// Stops accepting, ends open watches and waits for connections to drain.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(s) = self.server.take() {
            let _ = s.await;
        }
    }
}

impl Drop for RunningSim {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Binds, seeds and starts serving; returns once the simulator is ready.
pub async fn start(args: SimArgs) -> Result<RunningSim, SimError> {
    tls::install_crypto_provider();
    let authn_config = args.authn_config()?;
    let model_config = args.model_config()?;
    let authn =
        Authenticator::new(authn_config.clone()).map_err(|e| SimError::Config(e.to_string()))?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .map_err(|e| SimError::Bind(args.listen.clone(), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| SimError::Bind(args.listen.clone(), e))?;
    let (acceptor, ca_pem) = if args.tls {
        let (cfg, ca) = config::tls_setup(&args, &authn_config)?;
        (Some(tokio_rustls::TlsAcceptor::from(cfg)), ca)
    } else {
        (None, None)
    };
    let scheme = if args.tls { "https" } else { "http" };
    let url = format!("{scheme}://{addr}");

    let store = Arc::new(Store::new(resources::RESOURCES.len(), args.history_window));
    let stop = CancellationToken::new();
    // Until the server runs, a failed start stops what was spawned (the etcd feed).
    let stop_on_error = stop.clone().drop_guard();
    let started = std::time::Instant::now();
    let storage = Arc::new(open_storage(&args, store.clone(), stop.clone()).await?);
    tracing::info!(
        nodes = args.nodes,
        pods = args.pods,
        store = ?args.store,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "seeded"
    );

    let mut registry = Registry::default();
    let metrics = SimMetrics::register(&mut registry);
    let gauges = ["readOnly", "mutating"].map(|k| {
        metrics
            .inflight
            .get_or_create(&KindLabels {
                request_kind: k.into(),
            })
            .clone()
    });
    let inflight = Inflight::new(
        args.max_requests_inflight,
        args.max_mutating_requests_inflight,
        gauges,
    );
    let model = model::ControlPlane::start(
        model_config,
        store.clone(),
        &mut registry,
        metrics.process_start.clone(),
        stop.clone(),
    );
    let reaper = reaper::Reaper::new();
    tokio::spawn(reaper.clone().run(storage.clone(), stop.clone()));
    let api = Arc::new(Api {
        store,
        storage,
        metrics,
        registry,
        inflight,
        authn,
        reaper,
        config: ApiConfig {
            max_body_bytes: args.max_request_body_bytes,
            bookmark_every: args.bookmark_interval.0,
            kubelet_delete_delay: args.kubelet_delete_delay.0,
            server_address: addr.to_string(),
        },
        shutdown: stop.clone(),
        model,
    });
    if let Some(path) = &args.kubeconfig_out {
        kubeconfig::write_kubeconfig(path, &url, ca_pem.as_deref(), &kubeconfig::KubeUser::None)
            .map_err(|e| SimError::Config(e.to_string()))?;
    }
    let server = tokio::spawn(server::serve(
        listener,
        addr,
        acceptor,
        api.clone(),
        stop.clone(),
    ));
    stop_on_error.disarm();
    Ok(RunningSim {
        addr,
        url,
        ca_pem,
        api,
        stop,
        server: Some(server),
    })
}

/// Seeds the chosen store. With etcd: seeds etcd, loads the watch cache from
/// it and starts the watch that keeps the cache fed until `stop`.
async fn open_storage(
    args: &SimArgs,
    cache: Arc<Store>,
    stop: CancellationToken,
) -> Result<Storage, SimError> {
    let spec = args.seed_spec();
    match args.store {
        StoreKind::Memory => {
            let seed_store = cache.clone();
            tokio::task::spawn_blocking(move || seed::seed(&seed_store, &spec))
                .await
                .map_err(|e| SimError::Config(format!("seeding failed: {e}")))?;
            Ok(Storage::memory(cache))
        }
        StoreKind::Etcd => {
            let endpoints = args.etcd_endpoints.join(",");
            let err = |source| SimError::Etcd {
                endpoints: endpoints.clone(),
                source,
            };
            let etcd = EtcdStore::connect(&args.etcd_endpoints)
                .await
                .map_err(err)?;
            let mut sink = etcd::EtcdSeedSink {
                etcd: etcd.clone(),
                runtime: tokio::runtime::Handle::current(),
            };
            tokio::task::spawn_blocking(move || seed::seed_into(&mut sink, &spec))
                .await
                .map_err(|e| SimError::Config(format!("seeding failed: {e}")))?
                .map_err(|e| err(store::StoreError::Storage(e)))?;
            let loaded = etcd.load(&cache).await.map_err(err)?;
            tokio::spawn(etcd.clone().feed(cache.clone(), loaded, stop));
            Ok(Storage::etcd(cache, etcd, args.watch_cache_wait_timeout.0))
        }
    }
}

/// Runs the simulator until `shutdown` completes (the binary's entry point).
pub async fn run(
    args: SimArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), SimError> {
    let sim = start(args.clone()).await?;
    println!(
        "tollgate-bench sim: serving the Kubernetes API at {}",
        sim.url
    );
    if let Some(p) = &args.kubeconfig_out {
        println!(
            "kubeconfig written to {} (try: kubectl --kubeconfig {} get nodes)",
            p.display(),
            p.display()
        );
    }
    let stdin_closed = async {
        if args.exit_with_stdin {
            let mut sink = tokio::io::sink();
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut sink).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = shutdown => {}
        _ = stdin_closed => tracing::info!("standard input closed: stopping"),
    }
    sim.stop().await;
    Ok(())
}

/// Authentication settings, re-exported for callers that build them by hand.
pub type Authn = AuthnConfig;
