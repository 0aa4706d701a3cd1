//! Unlearned patterns are not trusted: until a heavy-looking pattern has a
//! completed response, at most one request of it is in flight. Pure.
//!
//! An unseen pattern is priced by a guess (the scraped object count times an
//! object size, or `defaultListBytes`). On the real apiserver a LIST of all
//! pods guessed at 1 MiB was 33 MB, and a dozen such guesses admitted in the
//! same second wrecked the heartbeats before the first response could teach
//! the real size. So the first request of such a pattern goes alone; the
//! rest wait until it completes (then the pattern cache knows the cost) or
//! it fails (then the next one goes alone).
//!
//! Heavy-looking ([`looks_heavy`]): a LIST without `limit`, a watch that
//! starts with the full state, or a LIST of a resource whose object count is
//! unknown or large — but not a LIST from the watch cache that names one
//! node or one object by an equality field selector (`spec.nodeName=`,
//! `metadata.name=`): what every kubelet and per-node daemon sends when it
//! (re)starts. Its response is one node's share whatever the cluster's
//! size and, from the cache, it reads nothing from etcd; gated one at a
//! time, thousands of them waited behind a LIST of all pods for their
//! first to be learned. The same LIST read from etcd (consistent or exact)
//! reads every object of the resource and stays heavy-looking.
//!
//! Bounded: at most `capacity` patterns are tracked at once; past it, a new
//! unlearned pattern waits like a busy one (that many unlearned heavy
//! requests in flight is already more than the lane should carry).

use std::collections::HashSet;
use std::hash::Hash;

use apimodel::ConsistencyClass;

use crate::pattern::{LimitBucket, PatternKey, PatternVerb};

/// Objects past which a LIST with `limit` still looks heavy until learned.
pub const LARGE_OBJECT_COUNT: f64 = 1000.0;

/// Is a request of this pattern heavy-looking while it is unlearned?
/// `objects`: the resource's scraped object count, if known.
pub fn looks_heavy(key: &PatternKey, objects: Option<f64>) -> bool {
    match key.verb {
        PatternVerb::WatchList => true,
        PatternVerb::Api(apimodel::Verb::List) if narrow_cache_read(key) => false,
        PatternVerb::Api(apimodel::Verb::List) => {
            key.limit == LimitBucket(0) || objects.is_none_or(|n| n > LARGE_OBJECT_COUNT)
        }
        PatternVerb::Api(_) => false,
    }
}

/// A read from the watch cache narrowed to one node or one object.
fn narrow_cache_read(key: &PatternKey) -> bool {
    key.consistency == Some(ConsistencyClass::Cache) && key.narrows_to().is_some()
}

/// What [`SingleFlight::try_start`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// This request is the pattern's one in flight.
    Started,
    /// Another request of the pattern is in flight: wait.
    Busy,
    /// `capacity` patterns are tracked already: wait.
    Full,
}

/// The unlearned heavy-looking patterns with a request in flight.
#[derive(Debug, Clone)]
pub struct SingleFlight<K> {
    inflight: HashSet<K>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone> SingleFlight<K> {
    pub fn new(capacity: usize) -> SingleFlight<K> {
        SingleFlight {
            inflight: HashSet::new(),
            capacity: capacity.max(1),
        }
    }

    /// Patterns with a request in flight.
    pub fn len(&self) -> usize {
        self.inflight.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inflight.is_empty()
    }

    /// Would a request of `key` start now?
    pub fn can_start(&self, key: &K) -> Start {
        if self.inflight.contains(key) {
            Start::Busy
        } else if self.inflight.len() >= self.capacity {
            Start::Full
        } else {
            Start::Started
        }
    }

    /// Start a request of the unlearned pattern `key` if none is in flight.
    pub fn try_start(&mut self, key: &K) -> Start {
        let start = self.can_start(key);
        if start == Start::Started {
            self.inflight.insert(key.clone());
        }
        start
    }

    /// The pattern's request ended (completed, failed or cancelled): the
    /// next one may start. Whether it is learned now is the pattern
    /// cache's to say.
    pub fn finish(&mut self, key: &K) {
        self.inflight.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::classify;
    use crate::identity::ClientClass;
    use http::{HeaderMap, Method};
    use proptest::prelude::*;

    fn key(url: &str) -> PatternKey {
        let uri: http::Uri = url.parse().expect("uri");
        let c = classify(&Method::GET, &uri, &HeaderMap::new()).expect("classifies");
        PatternKey::new(&c, ClientClass::Node)
    }

    #[test]
    fn what_looks_heavy() {
        let heavy = |url: &str, objects| looks_heavy(&key(url), objects);
        assert!(heavy("/api/v1/pods", Some(3.0)), "no limit");
        assert!(
            heavy("/api/v1/pods?watch=1&limit=500", Some(3.0)),
            "watch list"
        );
        assert!(heavy("/api/v1/pods?limit=500", None), "count unknown");
        assert!(heavy("/api/v1/pods?limit=500", Some(10_000.0)), "large");
        assert!(!heavy("/api/v1/pods?limit=500", Some(1000.0)));
        assert!(!heavy("/api/v1/namespaces/a/pods/x", None), "get");
        assert!(
            !heavy("/api/v1/pods?watch=1&resourceVersion=5", None),
            "watch"
        );
        // A kubelet's LIST of its own pods, from the watch cache.
        let own = "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&resourceVersion=0";
        assert!(!heavy(own, None));
        assert!(!heavy(
            "/api/v1/pods?labelSelector=app%3Dx&fieldSelector=status.phase%3DRunning,spec.nodeName%3Dn1&resourceVersion=0",
            Some(150_000.0)
        ));
        assert!(!heavy(
            "/api/v1/nodes?fieldSelector=metadata.name%3Dn1&resourceVersion=0",
            None
        ));
        // The same read from etcd reads every pod; other fields narrow nothing.
        assert!(heavy("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", None));
        assert!(heavy(
            "/api/v1/pods?fieldSelector=spec.nodeName!%3Dn1&resourceVersion=0",
            None
        ));
        assert!(heavy(
            "/api/v1/pods?fieldSelector=status.phase%3DRunning&resourceVersion=0",
            None
        ));
    }

    #[test]
    fn one_request_per_unlearned_pattern() {
        let mut s = SingleFlight::new(2);
        assert_eq!(s.try_start(&"pods"), Start::Started);
        assert_eq!(s.try_start(&"pods"), Start::Busy);
        assert_eq!(s.try_start(&"secrets"), Start::Started);
        assert_eq!(s.try_start(&"nodes"), Start::Full, "two tracked at most");
        s.finish(&"pods");
        assert_eq!(s.can_start(&"pods"), Start::Started);
        assert_eq!(s.try_start(&"nodes"), Start::Started);
        assert_eq!(s.len(), 2);
    }

    proptest! {
        /// Never two in flight of one pattern, never more patterns than the
        /// capacity, and a pattern with nothing in flight can start when
        /// there is room.
        #[test]
        fn at_most_one_per_pattern_and_bounded(
            capacity in 1usize..6,
            ops in proptest::collection::vec((any::<bool>(), 0u8..10), 1..300),
        ) {
            let mut s = SingleFlight::new(capacity);
            let mut running: Vec<u8> = Vec::new();
            for (start, key) in ops {
                if start {
                    let was_running = running.contains(&key);
                    match s.try_start(&key) {
                        Start::Started => {
                            prop_assert!(!was_running);
                            running.push(key);
                        }
                        Start::Busy => prop_assert!(was_running),
                        Start::Full => prop_assert!(!was_running && running.len() >= capacity),
                    }
                } else if let Some(i) = running.iter().position(|k| *k == key) {
                    running.swap_remove(i);
                    s.finish(&key);
                }
                prop_assert!(s.len() <= capacity);
                prop_assert_eq!(s.len(), running.len());
            }
        }
    }
}
