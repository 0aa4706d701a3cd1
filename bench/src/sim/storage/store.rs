//! The in-memory store: every resource's objects at the current revision, a
//! bounded history of changes (what etcd keeps until compaction), and a signal
//! that wakes watchers when the revision moves.
//!
//! One global revision counter orders all writes, as etcd's does. With the
//! memory store each write is exactly one [`Event`] and revisions are
//! contiguous; as the watch cache of the etcd store ([`Store::apply`]), the
//! history may skip revisions (writes to keys it does not serve), so it is
//! only ever searched by revision, never indexed by it.
//! Maps are persistent (imbl), so a LIST takes an O(1) snapshot and streams
//! it without holding the lock; a read at an older revision is the current
//! snapshot with the changes since then undone.

use super::object::Obj;
use imbl::OrdMap;
use std::collections::VecDeque;
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

pub type ObjMap = OrdMap<String, Arc<Obj>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One write. For a delete, `cur` is the object's last state stamped with the delete's revision.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub resource: usize,
    pub kind: EventType,
    pub prev: Option<Arc<Obj>>,
    pub cur: Arc<Obj>,
}

/// What the store refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("object not found")]
    NotFound,
    #[error("object already exists")]
    AlreadyExists,
    #[error("the object has been modified")]
    Conflict,
    /// The revision asked for is older than the history kept.
    #[error("too old resource version: {asked} ({oldest})")]
    Compacted { asked: u64, oldest: u64 },
    /// The write succeeded in etcd, but the watch cache did not reach its revision in time.
    #[error("the write at revision {0} is not yet visible in the watch cache")]
    CacheTimeout(u64),
    /// A read at a revision newer than storage (or the cache) has reached.
    #[error("Too large resource version: {0}")]
    TooNew(u64),
    /// etcd refused or failed the request (etcd's own message).
    #[error("{0}")]
    Storage(String),
}

/// What a write does to the object under a key.
pub enum Write {
    Put(serde_json::Value),
    Delete,
}

struct State {
    rv: u64,
    maps: Vec<ObjMap>,
    history: VecDeque<Arc<Event>>,
    /// Events at or below this revision are gone.
    compacted: u64,
    /// Per resource, the newest revision of its events gone from the history: a watch
    /// is too old only when it missed events of its own resource, as each of
    /// kube-apiserver's cachers keeps its own window.
    compacted_for: Vec<u64>,
    /// Pods by node name, as the cacher indexes them.
    by_node: node_index::NodeIndex,
}

/// The simulated etcd plus watch cache.
pub struct Store {
    state: RwLock<State>,
    /// Which CRDs occupy the custom slots.
    custom: crate::sim::resources::custom::Registry,
    window: usize,
    notify: watch::Sender<u64>,
    /// Per resource: moves when that resource has a new event (or the history restarts),
    /// so a watcher of pods is not woken by every node heartbeat.
    changed: Vec<watch::Sender<u64>>,
}

impl Store {
    /// A store for `resources` kinds keeping the last `window` revisions of history.
    pub fn new(resources: usize, window: usize) -> Store {
        let (notify, _) = watch::channel(1);
        Store {
            state: RwLock::new(State {
                rv: 1,
                maps: vec![OrdMap::new(); resources],
                history: VecDeque::new(),
                compacted: 1,
                compacted_for: vec![1; resources],
                by_node: node_index::NodeIndex::new(resources),
            }),
            custom: crate::sim::resources::custom::Registry::new(),
            window: window.max(1),
            notify,
            changed: (0..resources).map(|_| watch::channel(1).0).collect(),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-written (each
        // write swaps whole values), so a poisoned lock is still consistent.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The CRDs served, by slot.
    pub fn custom(&self) -> &crate::sim::resources::custom::Registry {
        &self.custom
    }

    /// The resource in slot `index`: a built-in, or a served CRD's storage version.
    pub fn def(&self, index: usize) -> Option<&'static crate::sim::resources::ResourceDef> {
        crate::sim::resources::by_index(index)
            .or_else(|| self.custom.by_index(index).map(|c| c.versions[0].def))
    }

    /// Every slot's resource, built-ins first.
    pub fn defs(&self) -> Vec<&'static crate::sim::resources::ResourceDef> {
        let mut out: Vec<_> = crate::sim::resources::builtins().iter().collect();
        out.extend(self.custom.served().iter().map(|c| c.versions[0].def));
        out
    }

    /// Revisions of history kept.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The current revision.
    pub fn revision(&self) -> u64 {
        self.read().rv
    }

    /// The oldest revision a read or watch may still start from.
    pub fn compacted(&self) -> u64 {
        self.read().compacted
    }

    /// A receiver that changes whenever the revision moves.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    /// A receiver that changes when `resource` has new events or the history restarts.
    pub fn subscribe_resource(&self, resource: usize) -> watch::Receiver<u64> {
        match self.changed.get(resource) {
            Some(c) => c.subscribe(),
            None => self.notify.subscribe(),
        }
    }

    /// Wakes the watchers of `resource` (all of them with `None`) and the revision waiters.
    fn wake(&self, resource: Option<usize>, rv: u64) {
        match resource.and_then(|r| self.changed.get(r)) {
            Some(c) => {
                c.send_replace(rv);
            }
            None if resource.is_none() => {
                for c in &self.changed {
                    c.send_replace(rv);
                }
            }
            None => {}
        }
        self.notify.send_replace(rv);
    }

    pub fn get(&self, resource: usize, key: &str) -> Option<Arc<Obj>> {
        self.read().maps[resource].get(key).cloned()
    }

    pub fn count(&self, resource: usize) -> usize {
        self.read().maps[resource].len()
    }

    /// The resource's objects now, and the revision they are at.
    pub fn snapshot(&self, resource: usize) -> (u64, ObjMap) {
        let s = self.read();
        (s.rv, s.maps[resource].clone())
    }

    /// The objects of `resource` whose `spec.nodeName` is `node`, at the current
    /// revision, read through the index (`None`: the resource has no such index).
    pub fn snapshot_on_node(&self, resource: usize, node: &str) -> Option<(u64, ObjMap)> {
        let s = self.read();
        let map = s.maps.get(resource)?;
        s.by_node.objects_on(resource, node, map).map(|m| (s.rv, m))
    }

    /// The resource's objects as they were at revision `at`.
    pub fn snapshot_at(&self, resource: usize, at: u64) -> Result<ObjMap, StoreError> {
        let (mut map, undo) = {
            let s = self.read();
            if at < s.compacted {
                return Err(StoreError::Compacted {
                    asked: at,
                    oldest: s.compacted,
                });
            }
            let undo: Vec<Arc<Event>> = s
                .history
                .iter()
                .rev()
                .take_while(|e| e.rv > at)
                .filter(|e| e.resource == resource)
                .cloned()
                .collect();
            (s.maps[resource].clone(), undo)
        };
        // Newest first, so each key ends at its state just after `at`.
        for e in undo {
            let key = e.cur.key();
            match &e.prev {
                Some(p) => map.insert(key, p.clone()),
                None => map.remove(&key),
            };
        }
        Ok(map)
    }

    /// Events for `resource` after revision `after`, at most `max` of them, and
    /// the revision the scan reached (so a watcher of a quiet resource does not
    /// rescan other resources' writes).
    pub fn events_after(
        &self,
        resource: usize,
        after: u64,
        max: usize,
    ) -> Result<(Vec<Arc<Event>>, u64), StoreError> {
        let s = self.read();
        let oldest = s
            .compacted_for
            .get(resource)
            .copied()
            .unwrap_or(s.compacted);
        if after < oldest {
            return Err(StoreError::Compacted {
                asked: after,
                oldest,
            });
        }
        let Some(first) = s.history.front().map(|e| e.rv) else {
            return Ok((Vec::new(), after.max(s.rv)));
        };
        // Revisions may skip (see the module header): search, never index.
        let start = s.history.partition_point(|e| e.rv <= after);
        let mut out = Vec::new();
        let mut reached = after.max(first.saturating_sub(1));
        for e in s.history.iter().skip(start) {
            // Never stop inside a revision: a txn's events share one.
            if out.len() >= max && e.rv != reached {
                break;
            }
            reached = e.rv;
            if e.resource == resource {
                out.push(e.clone());
            }
        }
        Ok((out, reached))
    }

    /// Loads objects that exist before the server starts: no events, and
    /// history begins after them (a watch from an earlier revision gets 410).
    pub fn seed(&self, resource: usize, objs: impl IntoIterator<Item = Obj>) {
        let mut s = self.write_lock();
        for o in objs {
            s.rv = s.rv.max(o.rv);
            let key = o.key();
            let prev = s.maps[resource].insert(key.clone(), Arc::new(o));
            let cur = s.maps[resource].get(&key).cloned();
            s.by_node
                .update(resource, &key, prev.as_deref(), cur.as_deref());
        }
        s.compacted = s.rv;
        let rv = s.rv;
        s.compacted_for.iter_mut().for_each(|c| *c = rv);
        drop(s);
        self.wake(None, rv);
    }

    /// Replaces every resource's objects with `maps`, read from storage at
    /// revision `rv` (a watch cache's list). The history restarts there:
    /// watchers from before it get 410 and relist.
    pub fn replace(&self, mut maps: Vec<ObjMap>, rv: u64) {
        let mut s = self.write_lock();
        maps.resize(s.maps.len(), ObjMap::new());
        s.by_node.rebuild(&maps);
        s.maps = maps;
        s.history.clear();
        s.rv = rv;
        s.compacted = rv;
        s.compacted_for.iter_mut().for_each(|c| *c = rv);
        drop(s);
        self.wake(None, rv);
    }

    /// The revision the next write will get (seeding stamps objects with it).
    pub fn next_revision(&self) -> u64 {
        self.read().rv + 1
    }

    /// Applies one write under `key` if the object is still at `expect_rv`
    /// (`Some(0)`: must not exist; `None`: any state). `build` stamps the new
    /// revision into the stored object. Returns the event.
    pub fn write(
        &self,
        resource: usize,
        key: &str,
        expect_rv: Option<u64>,
        write: Write,
        build: impl FnOnce(serde_json::Value, u64) -> Obj,
    ) -> Result<Arc<Event>, StoreError> {
        let mut s = self.write_lock();
        let prev = s.maps[resource].get(key).cloned();
        match (&write, expect_rv, &prev) {
            (_, Some(0), Some(_)) => return Err(StoreError::AlreadyExists),
            (_, Some(n), None) if n != 0 => return Err(StoreError::NotFound),
            (_, Some(n), Some(p)) if n != 0 && p.rv != n => return Err(StoreError::Conflict),
            (Write::Delete, _, None) => return Err(StoreError::NotFound),
            _ => {}
        }
        let rv = s.rv + 1;
        let event = self.commit(&mut s, resource, key, rv, prev, write, build)?;
        drop(s);
        self.wake(Some(resource), rv);
        Ok(event)
    }

    /// Moves the revision to `rv` without a change (etcd wrote a key the cache
    /// does not serve), so reads waiting for `rv` are not kept waiting.
    pub fn advance(&self, rv: u64) {
        let mut s = self.write_lock();
        if rv <= s.rv {
            return;
        }
        s.rv = rv;
        drop(s);
        self.notify.send_replace(rv);
    }

    /// Applies a change storage made at revision `rv` (the watch cache's feed):
    /// no preconditions, since etcd has checked them. Changes at or below the
    /// current revision are already in and are ignored; a delete of a key the
    /// cache does not hold only moves the revision. Returns the event, if any.
    pub fn apply(
        &self,
        resource: usize,
        key: &str,
        rv: u64,
        write: Write,
        build: impl FnOnce(serde_json::Value, u64) -> Obj,
    ) -> Option<Arc<Event>> {
        let mut s = self.write_lock();
        if rv <= s.rv && s.history.back().is_none_or(|e| e.rv != rv) {
            return None;
        }
        let prev = s.maps[resource].get(key).cloned();
        let event = match (&write, &prev) {
            (Write::Delete, None) => {
                s.rv = rv;
                None
            }
            _ => self
                .commit(&mut s, resource, key, rv, prev, write, build)
                .ok(),
        };
        drop(s);
        if event.is_some() {
            self.wake(Some(resource), rv);
        } else {
            self.notify.send_replace(rv);
        }
        event
    }

    /// Makes one change at revision `rv` and records it in the history.
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        s: &mut State,
        resource: usize,
        key: &str,
        rv: u64,
        prev: Option<Arc<Obj>>,
        write: Write,
        build: impl FnOnce(serde_json::Value, u64) -> Obj,
    ) -> Result<Arc<Event>, StoreError> {
        let (kind, cur) = match write {
            Write::Put(v) => {
                let obj = Arc::new(build(v, rv));
                s.maps[resource].insert(key.to_string(), obj.clone());
                s.by_node.update(resource, key, prev.as_deref(), Some(&obj));
                (
                    if prev.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    obj,
                )
            }
            Write::Delete => {
                let Some(p) = &prev else {
                    return Err(StoreError::NotFound);
                };
                s.maps[resource].remove(key);
                s.by_node.update(resource, key, Some(p), None);
                (EventType::Deleted, Arc::new(build(p.value(), rv)))
            }
        };
        s.rv = rv;
        let event = Arc::new(Event {
            rv,
            resource,
            kind,
            prev,
            cur,
        });
        s.history.push_back(event.clone());
        while s.history.len() > self.window {
            if let Some(old) = s.history.pop_front() {
                s.compacted = old.rv;
                if let Some(c) = s.compacted_for.get_mut(old.resource) {
                    *c = old.rv;
                }
            }
        }
        Ok(event)
    }
}

mod node_index;
#[cfg(test)]
mod tests;
