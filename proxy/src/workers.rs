//! The threads that serve client connections: each worker runs its own single-threaded tokio
//! runtime, and a connection lives on one worker from its handshake to its close, with the
//! upstream connections its requests go over ([`crate::forward`] keeps them per worker). This is
//! Envoy's and nginx's shape: no task of a request wakes on another core, no I/O readiness
//! crosses threads, and a worker's upstream pool is its own. With one work-stealing runtime the
//! same requests cost 12–40% more CPU each on two cores, in wake-ups and cache lines moved between
//! the threads (bench/RESULTS.md, "Cost per request as users measure it").
//!
//! The accept loop, the admin listener and the background loops stay on the runtime that calls
//! [`crate::server::serve`]; shared state (admission, the budget, patterns, metrics) is reached
//! from every worker as before.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The process's workers' runtimes, once [`Workers::start`]ed: their number sizes the
/// per-worker upstream clients, made before the first connection.
static STARTED: OnceLock<Vec<Handle>> = OnceLock::new();

/// The number of workers: 1 when connections are served on the caller's runtime.
pub fn count() -> usize {
    STARTED.get().map_or(1, Vec::len)
}

/// Tasks alive on the caller's runtime and on every worker's: connections, requests, watches,
/// background loops.
pub fn alive_tasks() -> usize {
    let here = Handle::try_current().map_or(0, |h| h.metrics().num_alive_tasks());
    let workers: usize = STARTED
        .get()
        .map(|w| w.iter().map(|h| h.metrics().num_alive_tasks()).sum())
        .unwrap_or(0);
    here + workers
}

/// This thread's worker index (0 on any thread that is not a worker).
pub fn current() -> usize {
    WORKER.with(Cell::get)
}

/// The most workers `--workers` and `TOKIO_WORKER_THREADS` may ask for.
pub const MAX_WORKERS: usize = 1024;

/// `TOKIO_WORKER_THREADS` set to something that is not a number of workers.
#[derive(Debug, thiserror::Error)]
#[error("invalid TOKIO_WORKER_THREADS={0:?}: a number of threads from 1 to {MAX_WORKERS}")]
pub struct BadWorkerThreads(String);

/// The default number of workers: `TOKIO_WORKER_THREADS` when set (as `#[tokio::main]` reads
/// it, and refuses a bad value), else the CPUs this process may use (its cgroup's quota counted).
pub fn default_count() -> Result<usize, BadWorkerThreads> {
    count_from(std::env::var("TOKIO_WORKER_THREADS").ok().as_deref())
}

fn count_from(env: Option<&str>) -> Result<usize, BadWorkerThreads> {
    match env {
        None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_WORKERS).contains(n))
            .ok_or_else(|| BadWorkerThreads(v.to_string())),
    }
}

/// Where accepted connections are served.
#[derive(Debug, Clone)]
pub struct Workers {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Empty: connections run on the caller's runtime (tests, the library's `run`).
    handles: Vec<Handle>,
    /// Connections open per worker: a new one goes to the least loaded.
    open: Vec<AtomicUsize>,
    stop: CancellationToken,
    threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

/// An error starting a worker thread or its runtime.
#[derive(Debug, thiserror::Error)]
#[error("starting worker {index}: {source}")]
pub struct StartError {
    index: usize,
    source: std::io::Error,
}

/// How long [`Workers::shutdown`] lets a worker's remaining tasks finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

impl Workers {
    /// Connections served on the runtime of the caller, as one task each.
    pub fn local() -> Workers {
        Workers {
            inner: Arc::new(Inner {
                handles: Vec::new(),
                open: Vec::new(),
                stop: CancellationToken::new(),
                threads: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }

    /// `n` worker threads (at least one), each with its own runtime. Call once per process,
    /// before the gateway is built, so the upstream clients are made per worker.
    pub fn start(n: usize) -> Result<Workers, StartError> {
        let n = n.max(1);
        let stop = CancellationToken::new();
        // A worker that cannot start stops those started before it.
        let stop_on_error = stop.clone().drop_guard();
        let mut handles = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for index in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| StartError { index, source })?;
            handles.push(runtime.handle().clone());
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tollgate-worker-{index}"))
                .spawn(move || {
                    WORKER.with(|w| w.set(index));
                    // Its lateness is part of what its light requests' clients wait.
                    runtime.spawn(crate::wake_lag::tick());
                    runtime.block_on(stop.cancelled());
                    runtime.shutdown_timeout(SHUTDOWN_GRACE);
                })
                .map_err(|source| StartError { index, source })?;
            threads.push(thread);
        }
        stop_on_error.disarm();
        // The first start's runtimes are the process's (tests start more than once).
        let _ = STARTED.set(handles.clone());
        Ok(Workers {
            inner: Arc::new(Inner {
                open: (0..n).map(|_| AtomicUsize::new(0)).collect(),
                handles,
                stop,
                threads: std::sync::Mutex::new(threads),
            }),
        })
    }

    /// Run `connection` on the worker with the fewest open connections (or on the caller's
    /// runtime). The future is made on that worker, so what it registers (the socket, its
    /// timers, the tasks it spawns) belongs to it.
    pub fn spawn<F, Fut>(&self, connection: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let inner = &self.inner;
        if inner.handles.is_empty() {
            tokio::spawn(async move { connection().await });
            return;
        }
        let index = (0..inner.open.len())
            .min_by_key(|&i| inner.open[i].load(Ordering::Relaxed))
            .unwrap_or(0);
        inner.open[index].fetch_add(1, Ordering::Relaxed);
        let open = OpenConnection {
            inner: inner.clone(),
            index,
        };
        inner.handles[index].spawn(async move {
            let _open = open;
            connection().await
        });
    }

    /// Stop the worker threads: what still runs on them gets [`SHUTDOWN_GRACE`] and is dropped.
    pub fn shutdown(&self) {
        self.inner.stop.cancel();
        let threads =
            std::mem::take(&mut *self.inner.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// One connection counted on its worker until it ends.
struct OpenConnection {
    inner: Arc<Inner>,
    index: usize,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.inner.open[self.index].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn a_bad_worker_thread_count_is_refused_with_its_value() {
        assert_eq!(count_from(Some("3")).expect("three"), 3);
        assert!(count_from(None).expect("the CPUs") >= 1);
        for bad in ["0", "two", "-1", "", "1025"] {
            let e = count_from(Some(bad)).expect_err(bad).to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    /// A connection goes to the worker with the fewest open, runs on that worker's thread, and
    /// the worker's count drops when it ends.
    #[test]
    fn connections_go_to_the_least_loaded_worker() {
        let workers = Workers::start(2).expect("workers");
        let (ran, on) = mpsc::channel();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let held = ran.clone();
        workers.spawn(move || async move {
            let _ = held.send((current(), std::thread::current().name().map(String::from)));
            let _ = released.await;
        });
        let first = on.recv_timeout(WAIT).expect("first connection ran");
        let short = ran.clone();
        workers.spawn(move || async move {
            let _ = short.send((current(), std::thread::current().name().map(String::from)));
        });
        let second = on.recv_timeout(WAIT).expect("second connection ran");
        assert_ne!(first.0, second.0, "the second went to the idle worker");
        for (index, name) in [&first, &second] {
            assert_eq!(
                name.as_deref(),
                Some(format!("tollgate-worker-{index}").as_str())
            );
        }
        // The short one ended: its worker is the least loaded again.
        let deadline = std::time::Instant::now() + WAIT;
        while workers.inner.open[second.0].load(Ordering::Relaxed) != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the count never dropped"
            );
            std::thread::yield_now();
        }
        workers.spawn(move || async move {
            let _ = ran.send((current(), None));
        });
        assert_eq!(on.recv_timeout(WAIT).expect("third ran").0, second.0);
        // Counted from outside any runtime: the held connection is a worker's task.
        assert!(alive_tasks() >= 1, "the workers' tasks are counted");
        drop(release);
        workers.shutdown();
    }
}
