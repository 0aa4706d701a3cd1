//! The etcd store (`--store etcd`): objects live in a real etcd as
//! kube-apiserver keeps them, and the in-memory [`Store`] becomes the watch
//! cache, loaded by a paged range read and then fed by an etcd watch.
//!
//! - Keys: `/registry/<resource>/<namespace>/<name>` (cluster-scoped:
//!   `/registry/<resource>/<name>`), with the apiserver's directory names
//!   (nodes are `/registry/minions`). Values are the object's JSON without
//!   `metadata.resourceVersion`: that is the key's mod revision, stamped on read.
//! - Writes are transactions: a create compares `create_revision == 0`, an
//!   update or delete compares `mod_revision` (a failed compare is 409).
//! - Reads: ranges with a limit, at one revision, page by page (so no gRPC
//!   message grows with the object count); a compacted revision is 410.
//! - Compaction follows the cache's history window (`--history-window`), so
//!   "too old" means the same with either store.

use super::object::Obj;
use super::read::{Filter, ListPlan, ReadAt};
use super::store::{ObjMap, Store, StoreError, Write};
use crate::sim::resources::{self, builtin, ResourceDef};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, KeyValue,
    KvClient, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use futures_util::StreamExt;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Keys per range request: bounds each gRPC response (500 pods of 3 KB is 1.5 MB).
const PAGE: i64 = 500;
/// Largest gRPC response accepted (a page of unusually large objects).
const MAX_MESSAGE: usize = 256 * 1024 * 1024;
/// Operations per seeding transaction (etcd's default `--max-txn-ops` is 128).
const SEED_TXN_OPS: usize = 128;
/// Bytes per seeding transaction (etcd's default `--max-request-bytes` is 1.5 MiB).
const SEED_TXN_BYTES: usize = 1024 * 1024;
/// Seeding transactions sent at once.
const SEED_TXNS_IN_FLIGHT: usize = 8;
/// How long to wait before re-opening a failed watch.
const REWATCH_BACKOFF: Duration = Duration::from_millis(200);
/// How long connecting to etcd may take at start.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where every object lives in etcd.
pub const REGISTRY: &str = "/registry/";

/// The etcd key of the object under cache key `key` (`ns/name` or `name`).
pub fn etcd_key(def: &ResourceDef, key: &str) -> String {
    format!("{REGISTRY}{}/{key}", def.etcd_dir)
}

/// The resource and cache key an etcd key belongs to; `None` for keys we do not serve.
/// Custom resources live under `<group>/<plural>/`, as kube-apiserver keeps them.
pub fn parse_key(cache: &Store, key: &[u8]) -> Option<(usize, String)> {
    let key = std::str::from_utf8(key).ok()?.strip_prefix(REGISTRY)?;
    let (dir, rest) = key.split_once('/')?;
    let (idx, rest) = match builtin::by_etcd_dir(dir) {
        Some(d) => (d.index, rest),
        None => {
            let (plural, rest) = rest.split_once('/')?;
            let c = cache.custom().served().into_iter().find(|c| {
                c.group == dir && c.versions.first().is_some_and(|v| v.def.name == plural)
            })?;
            (c.versions.first()?.def.index, rest)
        }
    };
    (!rest.is_empty()).then(|| (idx, rest.to_string()))
}

/// The first key after every key starting with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn etcd_error(e: etcd_client::Error, asked: u64) -> StoreError {
    let msg = e.to_string();
    if msg.contains("required revision has been compacted") {
        StoreError::Compacted { asked, oldest: 0 }
    } else if msg.contains("required revision is a future revision") {
        StoreError::TooNew(asked)
    } else {
        StoreError::Storage(msg)
    }
}

/// The stored form: the object's JSON without its resourceVersion.
fn encode(v: &mut Value) -> Vec<u8> {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    serde_json::to_vec(v).unwrap_or_default()
}

/// The object a key-value holds, stamped with its mod revision.
fn decode(def: &ResourceDef, kv: &KeyValue) -> Option<Obj> {
    let v: Value = serde_json::from_slice(kv.value()).ok()?;
    Some(Obj::new(def, v, kv.mod_revision() as u64))
}

/// A connection to etcd, the source of truth.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    kv: KvClient,
}

impl EtcdStore {
    /// Connects to the endpoints (`http://127.0.0.1:2379`, …).
    pub async fn connect(endpoints: &[String]) -> Result<EtcdStore, StoreError> {
        let opts = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
        let client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(|e| StoreError::Storage(e.to_string()))?;
        let kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
        Ok(EtcdStore { client, kv })
    }

    /// Writes `key` if it is still at `expect_rv` (`Some(0)`: must not exist;
    /// `None`: any state) and returns the object at the write's revision.
    pub async fn write(
        &self,
        def: &ResourceDef,
        key: &str,
        expect_rv: Option<u64>,
        write: Write,
        build: impl FnOnce(Value, u64) -> Obj,
    ) -> Result<Obj, StoreError> {
        let k = etcd_key(def, key);
        let mut kv = self.kv.clone();
        let when = match (&write, expect_rv) {
            (Write::Put(_), Some(0)) => {
                Some(Compare::create_revision(k.as_str(), CompareOp::Equal, 0))
            }
            (_, Some(n)) => Some(Compare::mod_revision(
                k.as_str(),
                CompareOp::Equal,
                n as i64,
            )),
            (_, None) => None,
        };
        let (then, value) = match write {
            Write::Put(mut v) => (TxnOp::put(k.as_str(), encode(&mut v), None), Some(v)),
            Write::Delete => (
                TxnOp::delete(k.as_str(), Some(DeleteOptions::new().with_prev_key())),
                None,
            ),
        };
        let txn = match when {
            Some(c) => Txn::new()
                .when([c])
                .and_then([then])
                .or_else([TxnOp::get(k.as_str(), None)]),
            None => Txn::new().and_then([then]),
        };
        let resp = kv
            .txn(txn)
            .await
            .map_err(|e| StoreError::Storage(e.to_string()))?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0) as u64;
        if !resp.succeeded() {
            let exists = resp.op_responses().iter().any(|r| match r {
                TxnOpResponse::Get(g) => !g.kvs().is_empty(),
                _ => false,
            });
            return Err(match (expect_rv, exists) {
                (Some(0), _) => StoreError::AlreadyExists,
                (_, false) => StoreError::NotFound,
                (_, true) => StoreError::Conflict,
            });
        }
        match value {
            Some(v) => Ok(build(v, rev)),
            None => {
                let prev = resp.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Delete(d) => d.prev_kvs().first().cloned(),
                    _ => None,
                });
                let prev = prev.ok_or(StoreError::NotFound)?;
                let v: Value = serde_json::from_slice(prev.value())
                    .map_err(|e| StoreError::Storage(format!("stored {k} is not JSON: {e}")))?;
                Ok(build(v, rev))
            }
        }
    }

    /// The object under `key` now (a quorum read).
    pub async fn get(&self, def: &ResourceDef, key: &str) -> Result<Option<Obj>, StoreError> {
        let mut kv = self.kv.clone();
        let resp = kv
            .get(etcd_key(def, key), None)
            .await
            .map_err(|e| etcd_error(e, 0))?;
        Ok(resp.kvs().first().and_then(|kv| decode(def, kv)))
    }

    /// The revision of the whole store now.
    pub async fn revision(&self) -> Result<u64, StoreError> {
        let mut kv = self.kv.clone();
        let resp = kv
            .get(
                REGISTRY,
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .map_err(|e| etcd_error(e, 0))?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0) as u64)
    }

    /// Reads what a LIST plan asks for from etcd: the range of the resource
    /// (or of one namespace) from the continue key on, at the plan's revision
    /// or the current one. With a limit, stops once the page is full and one
    /// more key shows whether something follows. Returns the revision read at.
    pub async fn list(
        &self,
        def: &ResourceDef,
        plan: &ListPlan,
    ) -> Result<(u64, ObjMap), StoreError> {
        let dir = format!("{REGISTRY}{}/", def.etcd_dir);
        let prefix = if plan.filter.namespace.is_empty() {
            dir.clone()
        } else {
            format!("{dir}{}/", plan.filter.namespace)
        };
        let end = prefix_end(&prefix);
        let mut from = match &plan.start {
            Some(s) => format!("{dir}{s}").into_bytes(),
            None => prefix.clone().into_bytes(),
        };
        let mut rev = match plan.read_at {
            ReadAt::Exact(at) => at as i64,
            ReadAt::Latest | ReadAt::NotOlderThan(_) => 0,
        };
        // A page's worth plus one (to know if more follows) first; a selective
        // filter may need more, read in full pages after that.
        let mut page = plan
            .limit
            .map_or(PAGE, |l| (l as i64).saturating_add(1).min(PAGE));
        let (mut map, mut matched, mut past_page) = (ObjMap::new(), 0u64, false);
        loop {
            let mut kv = self.kv.clone();
            let opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(page)
                .with_revision(rev);
            let resp = kv
                .get(from.clone(), Some(opts))
                .await
                .map_err(|e| etcd_error(e, rev as u64))?;
            if rev == 0 {
                rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            let kvs = resp.kvs();
            for kv in kvs {
                let key = std::str::from_utf8(kv.key())
                    .ok()
                    .and_then(|k| k.strip_prefix(dir.as_str()))
                    .filter(|k| !k.is_empty())
                    .map(String::from);
                let (Some(key), Some(o)) = (key, decode(def, kv)) else {
                    continue;
                };
                if plan.limit.is_some_and(|l| matched >= l) {
                    past_page = true;
                }
                if plan.filter.matches(def, &o) {
                    matched += 1;
                }
                map.insert(key, Arc::new(o));
            }
            let Some(last) = kvs.last() else { break };
            if !resp.more() || past_page {
                break;
            }
            from = last.key().to_vec();
            from.push(0);
            page = PAGE;
        }
        Ok((rev as u64, map))
    }

    /// Writes the seed objects in transactions of at most [`SEED_TXN_OPS`]
    /// puts and [`SEED_TXN_BYTES`] bytes, [`SEED_TXNS_IN_FLIGHT`] at a time so
    /// etcd can commit them together (unconditional: a restarted sim re-seeds
    /// the same objects).
    pub async fn seed(&self, def: &ResourceDef, values: Vec<Value>) -> Result<(), StoreError> {
        let mut batches: Vec<Vec<TxnOp>> = vec![Vec::new()];
        let mut bytes = 0;
        for mut v in values {
            let key = super::object::key(
                v["metadata"]["namespace"].as_str().unwrap_or(""),
                v["metadata"]["name"].as_str().unwrap_or(""),
            );
            let data = encode(&mut v);
            let full = batches
                .last()
                .is_some_and(|b| b.len() >= SEED_TXN_OPS || bytes + data.len() > SEED_TXN_BYTES);
            if full {
                batches.push(Vec::new());
                bytes = 0;
            }
            bytes += data.len();
            if let Some(b) = batches.last_mut() {
                b.push(TxnOp::put(etcd_key(def, &key), data, None));
            }
        }
        let txns = batches.into_iter().filter(|b| !b.is_empty()).map(|ops| {
            let mut kv = self.kv.clone();
            async move { kv.txn(Txn::new().and_then(ops)).await }
        });
        let mut results = futures_util::stream::iter(txns).buffer_unordered(SEED_TXNS_IN_FLIGHT);
        while let Some(r) = results.next().await {
            r.map_err(|e| StoreError::Storage(e.to_string()))?;
        }
        Ok(())
    }

    /// Fills the cache with every served object at one revision and returns it.
    /// The CustomResourceDefinitions found serve their resources (again, after a restart),
    /// and those resources' objects are loaded with the rest.
    pub async fn load(&self, cache: &Store) -> Result<u64, StoreError> {
        let rev = self.revision().await?;
        let mut maps = vec![ObjMap::new(); resources::slots()];
        let mut loaded = std::collections::HashSet::new();
        let plan = ListPlan {
            read_at: ReadAt::Exact(rev),
            limit: None,
            start: None,
            filter: Filter::default(),
            from_cache: false,
            fresh: false,
        };
        for def in cache.defs() {
            maps[def.index] = self.list(def, &plan).await?.1;
            loaded.insert(def.index);
        }
        let crds = resources::builtins()
            .iter()
            .find(|d| d.group == "apiextensions.k8s.io" && d.name == "customresourcedefinitions");
        if let Some(crds) = crds {
            for crd in maps[crds.index].values() {
                if let Err(e) = cache.custom().install(&crd.value()) {
                    tracing::warn!(crd = %crd.name, error = %e, "a stored CRD is not served");
                }
            }
            for def in cache.defs() {
                if loaded.insert(def.index) {
                    maps[def.index] = self.list(def, &plan).await?.1;
                }
            }
        }
        cache.replace(maps, rev);
        Ok(rev)
    }

    /// Feeds the cache from an etcd watch of everything after `loaded`, until
    /// `stop`. A broken watch is re-opened after the last revision applied;
    /// etcd is compacted as the cache's history window moves.
    pub async fn feed(self, cache: Arc<Store>, loaded: u64, stop: CancellationToken) {
        let mut next = loaded + 1;
        let mut compacted = cache.compacted();
        let step = (cache.window() as u64 / 10).max(1);
        loop {
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(next as i64);
            let mut client = self.client.clone();
            let opened = tokio::select! {
                r = client.watch(REGISTRY, Some(opts)) => r,
                _ = stop.cancelled() => return,
            };
            let mut stream = match opened {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "opening the etcd watch failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(REWATCH_BACKOFF) => continue,
                        _ = stop.cancelled() => return,
                    }
                }
            };
            loop {
                let msg = tokio::select! {
                    m = stream.message() => m,
                    _ = stop.cancelled() => return,
                };
                let resp = match msg {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "the etcd watch failed; re-opening it");
                        break;
                    }
                };
                if resp.canceled() {
                    if resp.compact_revision() > 0 {
                        // Events the cache missed are gone: relist, as the
                        // apiserver's reflector does (its watchers then get 410).
                        tracing::warn!(
                            compacted = resp.compact_revision(),
                            next,
                            "the etcd watch fell behind compaction; relisting"
                        );
                        match self.load(&cache).await {
                            Ok(rev) => next = rev + 1,
                            Err(e) => tracing::warn!(error = %e, "relisting failed; retrying"),
                        }
                    }
                    break;
                }
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let rev = kv.mod_revision() as u64;
                    next = next.max(rev + 1);
                    let Some((idx, def, key)) =
                        parse_key(&cache, kv.key()).and_then(|(i, k)| Some((i, cache.def(i)?, k)))
                    else {
                        cache.advance(rev);
                        continue;
                    };
                    let build = |v, rv| Obj::new(def, v, rv);
                    match ev.event_type() {
                        EventType::Put => match serde_json::from_slice::<Value>(kv.value()) {
                            Ok(v) => {
                                cache.apply(idx, &key, rev, Write::Put(v), build);
                            }
                            Err(e) => {
                                tracing::warn!(key = %key, error = %e, "not JSON in etcd; ignored");
                                cache.advance(rev);
                            }
                        },
                        EventType::Delete => {
                            cache.apply(idx, &key, rev, Write::Delete, build);
                        }
                    }
                }
                let now = cache.compacted();
                if now >= compacted + step {
                    let mut c = self.client.clone();
                    match c.compact(now as i64, None).await {
                        Ok(_) => compacted = now,
                        Err(e) => tracing::warn!(error = %e, "compacting etcd failed"),
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(REWATCH_BACKOFF) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}

/// Seeds etcd from the blocking thread seeding runs on.
pub struct EtcdSeedSink {
    pub etcd: EtcdStore,
    pub runtime: tokio::runtime::Handle,
}

impl super::seed_objects::SeedSink for EtcdSeedSink {
    fn put(&mut self, def: &'static ResourceDef, values: Vec<Value>) -> Result<(), String> {
        self.runtime
            .block_on(self.etcd.seed(def, values))
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_apiservers() {
        let cache = Store::new(resources::slots(), 10);
        let pods = resources::by_name("pods").expect("pods");
        let nodes = resources::by_name("nodes").expect("nodes");
        assert_eq!(etcd_key(pods, "ns-1/p"), "/registry/pods/ns-1/p");
        assert_eq!(etcd_key(nodes, "node-1"), "/registry/minions/node-1");
        assert_eq!(
            parse_key(&cache, b"/registry/leases/kube-node-lease/node-1"),
            Some((
                resources::index_of(resources::by_name("leases").expect("leases")),
                "kube-node-lease/node-1".to_string()
            ))
        );
        assert_eq!(
            parse_key(&cache, b"/registry/secrets/ns/s").map(|(i, _)| i),
            resources::by_name("secrets").map(|d| d.index)
        );
        assert_eq!(
            parse_key(&cache, b"/registry/example.com/widgets/ns/w"),
            None
        );
        assert_eq!(parse_key(&cache, b"/other/pods/ns/p"), None);
        assert_eq!(prefix_end("/registry/pods/"), b"/registry/pods0".to_vec());
    }
}
