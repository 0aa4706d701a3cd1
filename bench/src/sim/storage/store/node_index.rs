//! The watch cache's index of pods by `spec.nodeName`: kube-apiserver's cacher
//! serves `LIST pods ?fieldSelector=spec.nodeName=X` from it by reading only the
//! node's pods. Without it the sim scanned every pod for each of a 5,000-node
//! cluster's 25,000 per-node daemon LISTs. Persistent like the maps, so it is
//! read under the store's lock in O(pods on the node).

use super::{Obj, ObjMap};
use imbl::{OrdMap, OrdSet};

const FIELD: &str = "spec.nodeName";

#[derive(Clone, Default)]
pub(super) struct NodeIndex {
    /// Per resource: where `spec.nodeName` is in `Obj::fields` (`None`: not indexed).
    position: Vec<Option<usize>>,
    /// Per resource: node name → the keys of its objects.
    keys: Vec<OrdMap<String, OrdSet<String>>>,
}

impl NodeIndex {
    pub(super) fn new(resources: usize) -> NodeIndex {
        NodeIndex {
            position: (0..resources)
                .map(|r| {
                    crate::sim::resources::by_index(r)
                        .and_then(|d| d.fields.iter().position(|f| *f == FIELD))
                })
                .collect(),
            keys: vec![OrdMap::new(); resources],
        }
    }

    fn node<'o>(&self, resource: usize, o: &'o Obj) -> Option<&'o str> {
        let pos = (*self.position.get(resource)?)?;
        o.fields.get(pos)?.as_deref().filter(|n| !n.is_empty())
    }

    /// `key` moved from `prev` to `cur` (either may be absent).
    pub(super) fn update(
        &mut self,
        resource: usize,
        key: &str,
        prev: Option<&Obj>,
        cur: Option<&Obj>,
    ) {
        let (old, new) = (
            prev.and_then(|o| self.node(resource, o)),
            cur.and_then(|o| self.node(resource, o)),
        );
        if old == new {
            return;
        }
        let Some(keys) = self.keys.get_mut(resource) else {
            return;
        };
        if let Some(old) = old {
            if let Some(set) = keys.get_mut(old) {
                set.remove(key);
                if set.is_empty() {
                    keys.remove(old);
                }
            }
        }
        if let Some(new) = new {
            keys.entry(new.to_string())
                .or_default()
                .insert(key.to_string());
        }
    }

    /// Rebuilt from whole maps (seeding, a watch cache's relist).
    pub(super) fn rebuild(&mut self, maps: &[ObjMap]) {
        *self = NodeIndex::new(self.position.len());
        for (r, map) in maps.iter().enumerate() {
            for (k, o) in map.iter() {
                self.update(r, k, None, Some(o));
            }
        }
    }

    /// The objects of `resource` on `node` out of `map`, or `None` when the resource
    /// is not indexed.
    pub(super) fn objects_on(&self, resource: usize, node: &str, map: &ObjMap) -> Option<ObjMap> {
        self.position.get(resource).copied().flatten()?;
        let mut out = ObjMap::new();
        if let Some(keys) = self.keys.get(resource).and_then(|k| k.get(node)) {
            for k in keys {
                if let Some(o) = map.get(k) {
                    out.insert(k.clone(), o.clone());
                }
            }
        }
        Some(out)
    }
}
