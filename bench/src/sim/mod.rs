//! The simulated kube-apiserver (`tollgate-bench sim`): the real API's paths,
//! verbs, List/Status/WatchEvent shapes, authentication and max-in-flight
//! behaviour, over an in-memory store, so kubectl, loadgen and tollgate cannot
//! tell it from the real thing for the resources it serves. With `--store etcd`
//! the objects live in a real etcd and the in-memory store is the watch cache.
//!
//! Layout, by what each part is:
//! - [`api`]: the API surface. Its `mod.rs` is one request's way (authenticate, parse,
//!   max-in-flight, route, count); `reads` (the GET, LIST and WATCH handlers), [`api::list`],
//!   [`api::watch`], [`api::write`], [`api::delete`] and [`api::patch`] serve the verbs;
//!   `nonresource` and [`api::discovery`] the paths that name no resource; [`api::table`],
//!   [`api::respond`], [`api::protobuf`] and [`api::validate`] the wire formats and the
//!   apiserver's rules for names.
//! - [`storage`]: where objects live. [`storage::store`] (revisions, snapshots, history) and
//!   [`storage::object`]; [`storage::etcd`] (keys, txns, ranges, the cache's feed) behind the
//!   memory-or-etcd choice in `storage`'s `mod.rs`; [`storage::seed_objects`] (what the sim
//!   starts with); [`storage::reaper`] (graceful deletes); [`storage::etcd_server`] (a local
//!   etcd process for tests and the demo).
//! - [`auth`]: identities and certificates: [`auth::authn`], [`auth::token_file`],
//!   [`auth::pki`], [`auth::tls`], [`auth::kubeconfig`].
//! - [`cluster`]: the simulator's own clients, `--kubelet` (kwok's Stages) and `--scheduler`,
//!   which reach it through its listener as any client does.
//! - [`model`]: the cost model (`--cost-model modeled`): stations, memory, crash and restart.
//! - [`kube_version`]: which release the sim answers as (`--kube-version`): what each serves
//!   a LIST from, what its metrics count, which discovery documents it serves.
//! - Beside them, what every part reads or the server wraps around them: [`resources`] (what
//!   is served; the API, the store and the model index by it), [`clock`] (timestamps as the
//!   API writes them), [`server`] (accepting connections), [`inflight`] (max-in-flight),
//!   [`metrics`] (`/metrics`), `config` (settings and start-up errors).
//!
//! `api` and `storage` import each other: the handlers call storage, and storage reads with the
//! plan `api::list` makes from a request (revision, selectors, page), which both stores execute.

pub mod api;
pub mod auth;
pub mod clock;
pub mod cluster;
mod config;
pub mod inflight;
pub mod kube_version;
pub mod metrics;
pub mod model;
pub mod resources;
pub mod server;
pub mod storage;

/// Kept at its old path for callers outside the crate (tests, loadgen's etcd test).
pub use storage::etcd_server;

pub(crate) use config::read_file;
pub use config::{CostModel, ServingCert, SimConfig, SimError, StoreKind};
pub use kube_version::KubeVersion;

use api::{Api, ApiConfig};
use auth::authn::{Authenticator, AuthnConfig};
use inflight::Inflight;
use metrics::{KindLabels, SimMetrics};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use storage::etcd::EtcdStore;
use storage::store::Store;
use storage::Storage;
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
    /// The simulator's own clients (`--kubelet`, `--scheduler`).
    clients: tokio_util::task::TaskTracker,
}

impl RunningSim {
    /// Stops accepting, ends open watches and waits for connections to drain.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(s) = self.server.take() {
            let _ = s.await;
        }
        self.clients.close();
        self.clients.wait().await;
    }
}

impl Drop for RunningSim {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Binds, seeds and starts serving; returns once the simulator is ready.
pub async fn start(config: SimConfig) -> Result<RunningSim, SimError> {
    auth::tls::install_crypto_provider();
    let mut authn =
        Authenticator::new(config.authn.clone()).map_err(|e| SimError::Config(e.to_string()))?;
    let loopback = config.cluster.any().then(cluster::loopback_token);
    if let Some(token) = &loopback {
        authn = authn.with_loopback_token(token.clone());
    }
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| SimError::Bind(config.listen.clone(), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| SimError::Bind(config.listen.clone(), e))?;
    let (acceptor, ca_pem) = match &config.tls {
        Some(serving) => {
            let (cfg, ca) = config::tls_setup(serving, &config.authn)?;
            (Some(tokio_rustls::TlsAcceptor::from(cfg)), ca)
        }
        None => (None, None),
    };
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let url = format!("{scheme}://{addr}");

    let store = Arc::new(Store::new(resources::slots(), config.history_window));
    let stop = CancellationToken::new();
    // Until the server runs, a failed start stops what was spawned (the etcd feed).
    let stop_on_error = stop.clone().drop_guard();
    let started = std::time::Instant::now();
    let storage = Arc::new(open_storage(&config, store.clone(), stop.clone()).await?);
    tracing::info!(
        nodes = config.seed.nodes,
        pods = config.seed.pods,
        store = ?config.store,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "seeded"
    );

    publish_authentication(&storage, &config.authn).await?;
    let api = serving_state(&config, addr, store, storage, authn, &stop);
    if let Some(path) = &config.kubeconfig_out {
        auth::kubeconfig::write_kubeconfig(
            path,
            &url,
            ca_pem.as_deref(),
            &auth::kubeconfig::KubeUser::None,
        )
        .map_err(|e| SimError::Config(e.to_string()))?;
    }
    let server = tokio::spawn(server::serve(
        listener,
        addr,
        acceptor,
        api.clone(),
        stop.clone(),
    ));
    let clients = tokio_util::task::TaskTracker::new();
    if let Some(token) = &loopback {
        cluster::start(config.cluster, scheme, addr, token, &clients, &stop)
            .map_err(SimError::Config)?;
    }
    stop_on_error.disarm();
    Ok(RunningSim {
        addr,
        url,
        ca_pem,
        api,
        stop,
        server: Some(server),
        clients,
    })
}

/// Writes `kube-system/extension-apiserver-authentication` ([`auth::published`]), replacing
/// one a previous run left in etcd, as kube-apiserver's post-start hook does.
async fn publish_authentication(storage: &Storage, authn: &AuthnConfig) -> Result<(), SimError> {
    let Some(def) = resources::by_name("configmaps") else {
        return Ok(());
    };
    let v = auth::published::configmap(
        authn,
        &uuid::Uuid::new_v4().to_string(),
        &clock::rfc3339(clock::now_unix()),
    );
    let k = storage::object::key(auth::published::NAMESPACE, auth::published::NAME);
    storage
        .write(def, &k, None, storage::store::Write::Put(v))
        .await
        .map(|_| ())
        .map_err(|e| SimError::Config(format!("publishing {}: {e}", auth::published::NAME)))
}

/// Everything a request may touch: metrics, the max-in-flight limits, the cost model and
/// the reaper (started here) around the store.
fn serving_state(
    config: &SimConfig,
    addr: SocketAddr,
    store: Arc<Store>,
    storage: Arc<Storage>,
    authn: Authenticator,
    stop: &CancellationToken,
) -> Arc<Api> {
    let mut registry = Registry::default();
    let metrics = SimMetrics::register(&mut registry, config.kube_version);
    let gauges = ["readOnly", "mutating"].map(|k| {
        metrics
            .inflight
            .get_or_create(&KindLabels {
                request_kind: k.into(),
            })
            .clone()
    });
    let inflight = Inflight::new(
        config.max_requests_inflight,
        config.max_mutating_requests_inflight,
        gauges,
    );
    let model = model::ControlPlane::start(
        config.model.clone(),
        store.clone(),
        &mut registry,
        metrics.process_start.clone(),
        stop.clone(),
    );
    let reaper = storage::reaper::Reaper::new();
    let cluster_ips = Arc::new(api::defaults::ClusterIps::new(
        std::net::Ipv4Addr::new(10, 96, 0, 0),
        12,
    ));
    let ips = cluster_ips.clone();
    tokio::spawn(
        reaper
            .clone()
            .run(storage.clone(), stop.clone(), move |def, gone| {
                ips.release_service(def, &gone.value());
            }),
    );
    Arc::new(Api {
        cluster_ips,
        store,
        storage,
        metrics,
        registry,
        inflight,
        authn,
        reaper,
        config: ApiConfig {
            max_body_bytes: config.max_request_body_bytes,
            bookmark_every: config.bookmark_interval,
            kubelet_delete_delay: config.kubelet_delete_delay,
            server_address: addr.to_string(),
            garbage_collector: config.cluster.controllers,
            kube_version: config.kube_version,
        },
        shutdown: stop.clone(),
        model,
        counts: api::counts::ObjectCounts::new(config.count_poll_period),
    })
}

/// Seeds the chosen store. With etcd: seeds etcd, loads the watch cache from
/// it and starts the watch that keeps the cache fed until `stop`.
async fn open_storage(
    config: &SimConfig,
    cache: Arc<Store>,
    stop: CancellationToken,
) -> Result<Storage, SimError> {
    let spec = config.seed.clone();
    match config.store {
        StoreKind::Memory => {
            let seed_store = cache.clone();
            tokio::task::spawn_blocking(move || storage::seed_objects::seed(&seed_store, &spec))
                .await
                .map_err(|e| SimError::Config(format!("seeding failed: {e}")))?;
            Ok(Storage::memory(cache))
        }
        StoreKind::Etcd => {
            let endpoints = config.etcd_endpoints.join(",");
            let err = |source| SimError::Etcd {
                endpoints: endpoints.clone(),
                source,
            };
            let etcd = EtcdStore::connect(&config.etcd_endpoints)
                .await
                .map_err(err)?;
            let mut sink = storage::etcd::EtcdSeedSink {
                etcd: etcd.clone(),
                runtime: tokio::runtime::Handle::current(),
            };
            tokio::task::spawn_blocking(move || storage::seed_objects::seed_into(&mut sink, &spec))
                .await
                .map_err(|e| SimError::Config(format!("seeding failed: {e}")))?
                .map_err(|e| err(storage::store::StoreError::Storage(e)))?;
            let loaded = etcd.load(&cache).await.map_err(err)?;
            tokio::spawn(etcd.clone().feed(cache.clone(), loaded, stop));
            Ok(Storage::etcd(cache, etcd, config.watch_cache_wait_timeout))
        }
    }
}

/// Runs the simulator until `shutdown` completes (the binary's entry point).
pub async fn run(
    config: SimConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), SimError> {
    let kubeconfig_out = config.kubeconfig_out.clone();
    let exit_with_stdin = config.exit_with_stdin;
    let sim = start(config).await?;
    println!(
        "tollgate-bench sim: serving the Kubernetes API at {}",
        sim.url
    );
    if let Some(p) = &kubeconfig_out {
        println!(
            "kubeconfig written to {} (try: kubectl --kubeconfig {} get nodes)",
            p.display(),
            p.display()
        );
    }
    let stdin_closed = async {
        if exit_with_stdin {
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
