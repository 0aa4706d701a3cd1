//! Where objects are kept, chosen at startup (`--store`): the handlers ask
//! [`Storage`] and need not know which it is.
//!
//! - `memory`: the in-memory [`Store`] is everything (the default).
//! - `etcd`: etcd is the source of truth and the [`Store`] is the watch cache
//!   (see [`etcd`]). Writes go to etcd and answer once the cache has
//!   caught up with their revision (read-your-writes), or 504 after
//!   `--watch-cache-wait-timeout`. Consistent reads (GET or LIST without
//!   resourceVersion), exact revisions and continue tokens read etcd;
//!   `resourceVersion=0` and NotOlderThan read the cache, as kube-apiserver 1.20 does.
//!   With `--kube-version 1.37` the API layer sends consistent LISTs, exact revisions and
//!   continues the cache still holds to the cache ([`read::ListPlan::fresh`]: a consistent
//!   one first waits until the cache has seen etcd's current revision, else falls back to
//!   etcd). The cache learns revisions only from events under `/registry/` (no progress
//!   notifications): a write to another prefix of the same etcd makes such LISTs wait out
//!   the timeout and read etcd.
//!
//! Both serve a [`read::ListPlan`]: what a LIST asks for, built by the API layer from the
//! request's options and defined here, so storage never reaches up into `api`.

pub mod etcd;
pub mod etcd_server;
pub mod object;
pub mod read;
pub mod reaper;
pub mod seed_objects;
pub mod store;

use self::read::ListPlan;
use crate::sim::resources::{self, ResourceDef};
use apimodel::Status;
use etcd::EtcdStore;
use object::Obj;
use std::sync::Arc;
use std::time::Duration;
use store::{ObjMap, Store, StoreError, Write};

enum Backend {
    Memory,
    /// Boxed: the etcd client is a few KB.
    Etcd(Box<EtcdStore>),
}

/// The store the handlers write to and read through.
pub struct Storage {
    cache: Arc<Store>,
    backend: Backend,
    /// How long a write waits for the watch cache to reach its revision.
    cache_wait: Duration,
}

impl Storage {
    /// Everything in memory.
    pub fn memory(cache: Arc<Store>) -> Storage {
        Storage {
            cache,
            backend: Backend::Memory,
            cache_wait: Duration::ZERO,
        }
    }

    /// etcd as the source of truth, `cache` as its watch cache (loaded and fed by the caller).
    pub fn etcd(cache: Arc<Store>, etcd: EtcdStore, cache_wait: Duration) -> Storage {
        Storage {
            cache,
            backend: Backend::Etcd(Box::new(etcd)),
            cache_wait,
        }
    }

    /// The watch cache (with `memory`, the store itself).
    pub fn cache(&self) -> &Arc<Store> {
        &self.cache
    }

    /// Applies one write under `key` if the object is still at `expect_rv`
    /// (`Some(0)`: must not exist; `None`: any state); returns the object
    /// written (for a delete, its last state at the delete's revision).
    pub async fn write(
        &self,
        def: &'static ResourceDef,
        key: &str,
        expect_rv: Option<u64>,
        write: Write,
    ) -> Result<Arc<Obj>, StoreError> {
        let build = |v, rv| Obj::new(def, v, rv);
        match &self.backend {
            Backend::Memory => self
                .cache
                .write(resources::index_of(def), key, expect_rv, write, build)
                .map(|e| e.cur.clone()),
            Backend::Etcd(etcd) => {
                let obj = etcd.write(def, key, expect_rv, write, build).await?;
                self.wait_for_cache(obj.rv).await?;
                Ok(Arc::new(obj))
            }
        }
    }

    /// Waits until the watch cache has applied revision `rv`.
    async fn wait_for_cache(&self, rv: u64) -> Result<(), StoreError> {
        let mut changes = self.cache.subscribe();
        let reached = tokio::time::timeout(self.cache_wait, changes.wait_for(|r| *r >= rv))
            .await
            .is_ok_and(|r| r.is_ok());
        if reached {
            Ok(())
        } else {
            Err(StoreError::CacheTimeout(rv))
        }
    }

    /// The object under `key`: from etcd when `consistent` (a GET without
    /// resourceVersion), else from the cache.
    pub async fn get(
        &self,
        def: &'static ResourceDef,
        key: &str,
        consistent: bool,
    ) -> Result<Option<Arc<Obj>>, StoreError> {
        match &self.backend {
            Backend::Etcd(etcd) if consistent => Ok(etcd.get(def, key).await?.map(Arc::new)),
            _ => Ok(self.cache.get(resources::index_of(def), key)),
        }
    }

    /// What a LIST plan reads and the revision it is at, and whether it came
    /// from etcd (true) or the watch cache, for the metrics' `storage` label.
    pub async fn list(
        &self,
        def: &'static ResourceDef,
        plan: &ListPlan,
    ) -> Result<(u64, ObjMap, bool), Status> {
        let idx = resources::index_of(def);
        match &self.backend {
            Backend::Etcd(etcd) if !plan.from_cache => self.list_etcd(etcd, def, plan).await,
            Backend::Etcd(etcd) => {
                if plan.fresh {
                    // A consistent read from the cache (KEP-2340): etcd's current revision
                    // first; if the cache does not reach it within the wait, the LIST falls
                    // back to etcd, as kube-apiserver does by default.
                    let now = etcd
                        .revision()
                        .await
                        .map_err(|e| Status::internal(e.to_string()))?;
                    if self.wait_for_cache(now).await.is_err() {
                        let mut direct = plan.clone();
                        direct.from_cache = false;
                        direct.fresh = false;
                        return self.list_etcd(etcd, def, &direct).await;
                    }
                }
                // Not older than N: the cache waits until it has seen N, as the
                // apiserver's watch cache does, then serves it.
                if let read::ReadAt::NotOlderThan(n) = plan.read_at {
                    if self.wait_for_cache(n).await.is_err() {
                        return Err(Status::timeout(StoreError::TooNew(n).to_string()));
                    }
                }
                read::snapshot(&self.cache, idx, plan).map(|(rv, m)| (rv, m, false))
            }
            _ => read::snapshot(&self.cache, idx, plan).map(|(rv, m)| (rv, m, !plan.from_cache)),
        }
    }
}

impl Storage {
    /// A LIST read from etcd, with kube-apiserver's answers for a revision it no longer has
    /// (410) or has not reached (504).
    async fn list_etcd(
        &self,
        etcd: &EtcdStore,
        def: &'static ResourceDef,
        plan: &ListPlan,
    ) -> Result<(u64, ObjMap, bool), Status> {
        if let read::ReadAt::Exact(at) = plan.read_at {
            // Our compaction policy first (etcd is compacted to it lazily).
            let oldest = self.cache.compacted();
            if at < oldest {
                return Err(expired(plan, self.cache.revision()));
            }
        }
        match etcd.list(def, plan).await {
            Ok((rv, map)) => Ok((rv, map, true)),
            Err(StoreError::Compacted { .. }) => Err(expired(plan, self.cache.revision())),
            Err(e @ StoreError::TooNew(_)) => Err(Status::timeout(e.to_string())),
            Err(e) => Err(Status::internal(e.to_string())),
        }
    }
}

/// kube-apiserver's 410s, as the in-memory store words them: a continue token gets one for
/// the same place at the current revision `now`.
fn expired(plan: &ListPlan, now: u64) -> Status {
    match &plan.start {
        Some(start) => read::expired_continue(now, start),
        None => Status::expired(read::EXPIRED_LIST),
    }
}
