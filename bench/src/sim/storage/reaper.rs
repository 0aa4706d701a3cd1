//! What kubelets and the namespace controller do after a delete starts: a
//! pod's graceful deletion ends when its (simulated) kubelet has stopped it,
//! and a terminating namespace is emptied and then removed.

use super::object::Obj;
use super::store::Write;
use super::Storage;
use crate::sim::resources::{self, ResourceDef};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

enum Job {
    /// Remove the object under this key if it is still the same (uid) and deleting.
    Pod {
        resource: usize,
        key: String,
        uid: String,
    },
    Namespace(String),
}

/// Pending deletions, by deadline. Bounded by the number of objects being deleted.
pub struct Reaper {
    jobs: Mutex<BTreeMap<(Instant, u64), Job>>,
    seq: std::sync::atomic::AtomicU64,
    wake: Notify,
}

impl Reaper {
    pub fn new() -> Arc<Reaper> {
        Arc::new(Reaper {
            jobs: Mutex::new(BTreeMap::new()),
            seq: Default::default(),
            wake: Notify::new(),
        })
    }

    fn push(&self, at: Instant, job: Job) {
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((at, seq), job);
        self.wake.notify_one();
    }

    pub fn schedule(&self, delay: Duration, resource: usize, key: String, uid: String) {
        self.push(Instant::now() + delay, Job::Pod { resource, key, uid });
    }

    pub fn finish_namespace(&self, name: String) {
        self.push(Instant::now(), Job::Namespace(name));
    }

    /// Runs the jobs as they fall due until `stop`; `deleted` hears of every object a
    /// namespace's termination removes (a Service gives its ClusterIP back).
    pub async fn run(
        self: Arc<Self>,
        storage: Arc<Storage>,
        stop: CancellationToken,
        deleted: impl Fn(&ResourceDef, &Obj),
    ) {
        loop {
            let next = {
                let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
                match jobs.first_key_value().map(|(k, _)| *k) {
                    Some(k) if k.0 <= Instant::now() => jobs.remove(&k).map(Ok),
                    Some(k) => Some(Err(k.0)),
                    None => None,
                }
            };
            match next {
                Some(Ok(job)) => tokio::select! {
                    _ = run_job(&storage, job, &deleted) => {}
                    _ = stop.cancelled() => return,
                },
                Some(Err(at)) => tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = self.wake.notified() => {}
                    _ = stop.cancelled() => return,
                },
                None => tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = stop.cancelled() => return,
                },
            }
        }
    }
}

async fn run_job(storage: &Storage, job: Job, deleted: &impl Fn(&ResourceDef, &Obj)) {
    let store = storage.cache();
    match job {
        Job::Pod { resource, key, uid } => {
            let Some(def) = store.def(resource) else {
                return;
            };
            if let Some(o) = store.get(resource, &key) {
                if o.uid == uid && o.deleting {
                    let _ = storage.write(def, &key, Some(o.rv), Write::Delete).await;
                }
            }
        }
        Job::Namespace(ns) => {
            for def in store.defs().into_iter().filter(|d| d.namespaced) {
                let (_, map) = store.snapshot(def.index);
                for (k, _) in map.iter().filter(|(_, o)| o.namespace == ns) {
                    if let Ok(gone) = storage.write(def, k, None, Write::Delete).await {
                        deleted(def, &gone);
                    }
                }
            }
            if let Some(def) = resources::by_name("namespaces") {
                let _ = storage.write(def, &ns, None, Write::Delete).await;
            }
        }
    }
}
