//! The modeled control plane's life: what requests are charged, the memory
//! they hold, and the OOM kill when it passes `--memory-limit` — every
//! connection dropped (watches end), connections refused for
//! `restart_seconds`, then a cold watch cache that fills from etcd (through
//! the same stations, so a relist storm slows it) before it serves again.

use super::costs::{Constants, Demand};
use super::heap::GoHeap;
use super::stations::{StationConfig, Stations};
use crate::sim::storage::store::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What `tollgate-bench sim` was asked to model.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// `--cost-model modeled`; off, nothing is charged and nothing crashes.
    pub enabled: bool,
    pub virtual_cpus: f64,
    pub memory_limit: u64,
    pub reject_until_cache_ready: bool,
    pub consistent_reads_from_cache: bool,
    pub constants: Constants,
}

impl ModelConfig {
    /// No cost model: the simulator serves as fast as it can.
    pub fn none() -> ModelConfig {
        ModelConfig {
            enabled: false,
            virtual_cpus: 2.0,
            memory_limit: u64::MAX,
            reject_until_cache_ready: false,
            consistent_reads_from_cache: false,
            constants: Constants::default(),
        }
    }
}

/// The modeled apiserver's memory (Go's heap, as its RSS follows it);
/// shared with the metrics collector. The lock is never held across an await.
#[derive(Debug)]
struct Memory {
    heap: Mutex<GoHeap>,
    /// Bumped at each crash: holds from before it are not given back twice.
    generation: AtomicU64,
    /// The heap's clock starts here (tokio's, so paused-clock tests move it).
    epoch: Instant,
}

impl Memory {
    fn new(c: &Constants) -> Memory {
        Memory {
            heap: Mutex::new(GoHeap::new(c.heap_params(), c.memory_base, 0.0)),
            generation: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    fn heap(&self) -> std::sync::MutexGuard<'_, GoHeap> {
        // A panic while holding it leaves numbers, not broken invariants.
        self.heap.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rss(&self) -> u64 {
        let now = self.now();
        self.heap().rss(now) as u64
    }

    /// Allocates; returns the RSS reached.
    fn allocate(&self, live: f64, garbage: f64) -> f64 {
        let now = self.now();
        self.heap().allocate(live, garbage, now)
    }

    fn set_base(&self, base: f64) {
        let now = self.now();
        self.heap().set_base(base, now);
    }

    /// A new process: only its base memory.
    fn restart(&self, c: &Constants) {
        let now = self.now();
        self.generation.fetch_add(1, Ordering::AcqRel);
        *self.heap() = GoHeap::new(c.heap_params(), c.memory_base, now);
    }
}

struct Life {
    /// Cancelled at a crash: every connection and watch of this incarnation ends.
    connections: CancellationToken,
    /// When the current incarnation accepts connections (after a crash, in the future).
    up_at: Instant,
}

/// The modeled control plane.
pub struct ControlPlane {
    pub config: ModelConfig,
    stations: Arc<Stations>,
    store: Arc<Store>,
    memory: Arc<Memory>,
    life: Mutex<Life>,
    ready: watch::Sender<bool>,
    restarts: Counter,
    /// `process_start_time_seconds` (f64 bits), moved at each modeled restart.
    start_time: Arc<AtomicU64>,
    /// The revision the restarted watch cache was filled at: like the
    /// cacher's window, it holds no events before it, so a watch from an
    /// older revision gets 410 and its informer relists (0: never restarted).
    watch_floor: AtomicU64,
    stop: CancellationToken,
}

/// Memory held by one request; garbage once dropped.
pub struct MemoryHold {
    memory: Arc<Memory>,
    bytes: f64,
    generation: u64,
}

impl Drop for MemoryHold {
    fn drop(&mut self) {
        if self.memory.generation.load(Ordering::Acquire) == self.generation {
            self.memory.heap().release(self.bytes);
        }
    }
}

/// Bytes and objects in the watch cache (what a restart must reload).
fn cache_size(store: &Store) -> (u64, u64) {
    let mut objects = 0u64;
    let mut bytes = 0u64;
    for i in 0..crate::sim::resources::slots() {
        let (_, map) = store.snapshot(i);
        objects += map.len() as u64;
        bytes += map.values().map(|o| o.json.len() as u64).sum::<u64>();
    }
    (objects, bytes)
}

impl ControlPlane {
    /// Starts the model (its scheduler runs until `stop`) and registers its metrics.
    pub fn start(
        config: ModelConfig,
        store: Arc<Store>,
        registry: &mut Registry,
        start_time: Arc<AtomicU64>,
        stop: CancellationToken,
    ) -> Arc<ControlPlane> {
        let c = &config.constants;
        let stations = Stations::new(StationConfig {
            cpus: config.virtual_cpus,
            etcd_cpus: c.etcd_cpus,
            quantum: c.quantum,
            etcd_range_lock_fraction: c.etcd_range_lock_fraction,
            etcd_fsync: c.etcd_fsync,
        });
        let memory = Arc::new(Memory::new(c));
        let (ready, _) = watch::channel(true);
        if config.enabled {
            tokio::spawn(stations.clone().run(stop.clone()));
            tokio::spawn(track_cache_memory(
                store.clone(),
                memory.clone(),
                ready.subscribe(),
                c.clone(),
                stop.clone(),
            ));
        }
        let restarts = Counter::default();
        registry.register(
            "tollgate_sim_restarts",
            "Modeled apiserver restarts (OOM kills at --memory-limit).",
            restarts.clone(),
        );
        registry.register_collector(Box::new(ModelCollector {
            stations: stations.clone(),
            memory: memory.clone(),
        }));
        Arc::new(ControlPlane {
            config,
            stations,
            store,
            memory,
            life: Mutex::new(Life {
                connections: stop.child_token(),
                up_at: Instant::now(),
            }),
            ready,
            restarts,
            start_time,
            watch_floor: AtomicU64::new(0),
            stop,
        })
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    pub fn constants(&self) -> &Constants {
        &self.config.constants
    }

    fn life(&self) -> std::sync::MutexGuard<'_, Life> {
        self.life.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token of the current incarnation: connections and watches end when it is cancelled.
    pub fn connections(&self) -> CancellationToken {
        self.life().connections.clone()
    }

    /// When the current incarnation accepts connections.
    pub fn up_at(&self) -> Instant {
        self.life().up_at
    }

    /// Whether the watch cache has been filled since the last (modeled) start.
    pub fn cache_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the watch cache is ready (as the cacher blocks watches until then).
    pub async fn wait_cache_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Watches from a revision before this get 410 (see `watch_floor`).
    pub fn watch_floor(&self) -> u64 {
        self.watch_floor.load(Ordering::Acquire)
    }

    /// Modeled resident memory now (bytes).
    pub fn virtual_memory(&self) -> u64 {
        self.memory.rss()
    }

    /// Takes `bytes` of modeled memory for a request until the hold is
    /// dropped. Past `--memory-limit` the apiserver is OOM-killed: `None`,
    /// and every connection is dropped.
    pub fn hold(self: &Arc<Self>, bytes: f64) -> Option<MemoryHold> {
        let bytes = bytes.max(0.0);
        let generation = self.memory.generation.load(Ordering::Acquire);
        let hold = MemoryHold {
            memory: self.memory.clone(),
            bytes,
            generation,
        };
        if self.memory.allocate(bytes, 0.0) > self.config.memory_limit as f64 {
            self.crash();
            return None;
        }
        Some(hold)
    }

    /// Waits while the stations serve `d` (its live memory is held by the
    /// caller; its garbage is allocated here). An OOM kill on the way never
    /// returns: the connection the request came on is being dropped.
    pub async fn serve(self: &Arc<Self>, d: &Demand) {
        if !self.enabled() {
            return;
        }
        if d.garbage > 0.0 && self.memory.allocate(0.0, d.garbage) > self.config.memory_limit as f64
        {
            self.crash();
            std::future::pending::<()>().await;
        }
        self.stations.cpu(d.cpu_before).await;
        self.stations.etcd_read(d.etcd_read).await;
        self.stations.etcd_write(d.etcd_write).await;
        self.stations.cpu(d.cpu_after).await;
    }

    /// The OOM kill and the restart that follows.
    fn crash(self: &Arc<Self>) {
        let up_at = {
            let mut life = self.life();
            let now = Instant::now();
            if life.up_at > now || self.stop.is_cancelled() {
                return; // already down
            }
            life.connections.cancel();
            life.connections = self.stop.child_token();
            life.up_at = now + Duration::from_secs_f64(self.constants().restart_seconds);
            life.up_at
        };
        self.memory.restart(self.constants());
        self.stations.reset_cpu();
        self.ready.send_replace(false);
        self.restarts.inc();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default()
            + self.constants().restart_seconds;
        self.start_time.store(wall.to_bits(), Ordering::Relaxed);
        tracing::warn!(
            limit = self.config.memory_limit,
            restart_seconds = self.constants().restart_seconds,
            "modeled apiserver out of memory: dropping every connection and restarting"
        );
        let cp = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(up_at) => {}
                _ = cp.stop.cancelled() => return,
            }
            // The new process's reflectors LIST everything from etcd into the cache.
            let listed_at = cp.store.revision();
            let (objects, bytes) = cache_size(&cp.store);
            let fill = cp.constants().cache_fill(objects, bytes);
            tokio::select! {
                _ = cp.serve(&fill) => {}
                _ = cp.stop.cancelled() => return,
            }
            cp.memory.set_base(cp.constants().base_memory(bytes));
            cp.watch_floor.store(listed_at, Ordering::Release);
            cp.ready.send_replace(true);
            tracing::info!(objects, bytes, "modeled watch cache ready");
        });
    }
}

/// How often the watch cache's modeled memory follows the objects stored.
const CACHE_MEMORY_REFRESH: Duration = Duration::from_secs(1);

/// Keeps the base memory (binary + watch cache) in step with what is stored,
/// as objects are created and deleted; while the cache is cold it holds nothing.
async fn track_cache_memory(
    store: Arc<Store>,
    memory: Arc<Memory>,
    ready: watch::Receiver<bool>,
    c: Constants,
    stop: CancellationToken,
) {
    loop {
        if *ready.borrow() {
            // Walking the snapshots costs ~1 ms per 10,000 objects, once a second.
            let (_, bytes) = cache_size(&store);
            memory.set_base(c.base_memory(bytes));
        }
        tokio::select! {
            _ = tokio::time::sleep(CACHE_MEMORY_REFRESH) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// `tollgate_sim_virtual_cpu_seconds_total` and `tollgate_sim_virtual_memory_bytes`, read at scrape time.
#[derive(Debug)]
struct ModelCollector {
    stations: Arc<Stations>,
    memory: Arc<Memory>,
}

impl std::fmt::Debug for Stations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stations").finish_non_exhaustive()
    }
}

impl Collector for ModelCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (cpu, etcd) = self.stations.served();
        let mut family = encoder.encode_descriptor(
            "tollgate_sim_virtual_cpu_seconds",
            "CPU seconds the modeled control plane spent, by component (apiserver, etcd).",
            None,
            MetricType::Counter,
        )?;
        for (component, v) in [("apiserver", cpu), ("etcd", etcd)] {
            let labels = [("component", component)];
            ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
        }
        let g = ConstGauge::new(self.memory.rss() as f64);
        g.encode(encoder.encode_descriptor(
            "tollgate_sim_virtual_memory_bytes",
            "Resident memory of the modeled apiserver: Go's heap (base, watch cache, what requests in flight hold, garbage not yet collected) and pages not yet given back.",
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}
