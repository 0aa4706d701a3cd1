//! What a LIST or WATCH asks for, which decides where the apiserver may serve
//! it from and so what it costs.
//!
//! | request | class |
//! |---|---|
//! | LIST, `resourceVersion` unset | `consistent` (quorum read; from the watch cache only with consistent reads from cache, 1.31+) |
//! | LIST, `resourceVersion=0` (with or without `limit`) | `cache` |
//! | LIST, `resourceVersion=N`, `resourceVersionMatch=NotOlderThan` | `cache` |
//! | LIST, `resourceVersion=N`, no match, no `limit` | `cache` (not older than N) |
//! | LIST, `resourceVersion=N`, no match, with `limit` | `exact` (paged read at N) |
//! | LIST, `resourceVersionMatch=Exact` or a `continue` token | `exact` |
//! | WATCH, `resourceVersion` unset | starts with the full state: `consistent` |
//! | WATCH, `resourceVersion=0` | starts with the full state: `cache` |
//! | WATCH, `sendInitialEvents=true` | starts with the full state (streaming list): `cache` |
//! | WATCH, `resourceVersion=N` | no initial state: `cache` (events from the cache) |

use crate::request::{ListOptions, RequestInfo, Verb};
use std::fmt;

/// Where a read may be served from, by what it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConsistencyClass {
    /// Any recent state: the watch cache.
    Cache,
    /// The latest state: a quorum read from etcd before consistent reads from cache.
    Consistent,
    /// A given revision: etcd, unless the apiserver keeps cache snapshots.
    Exact,
}

impl ConsistencyClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ConsistencyClass::Cache => "cache",
            ConsistencyClass::Consistent => "consistent",
            ConsistencyClass::Exact => "exact",
        }
    }

    /// The class of a LIST with these options.
    pub fn of_list(o: &ListOptions) -> ConsistencyClass {
        if o.continue_token.is_some() || o.resource_version_match.as_deref() == Some("Exact") {
            return ConsistencyClass::Exact;
        }
        match o.resource_version.as_deref() {
            None => ConsistencyClass::Consistent,
            Some("0") => ConsistencyClass::Cache,
            Some(_) if o.resource_version_match.as_deref() == Some("NotOlderThan") => {
                ConsistencyClass::Cache
            }
            Some(_) if o.limit.is_some() => ConsistencyClass::Exact,
            Some(_) => ConsistencyClass::Cache,
        }
    }

    /// The class of a request, for the reads that have one (LIST and WATCH).
    pub fn of(info: &RequestInfo) -> Option<ConsistencyClass> {
        match info.verb {
            Verb::List => Some(Self::of_list(&info.options)),
            Verb::Watch
                if info.options.resource_version.is_none()
                    && info.options.send_initial_events != Some(true) =>
            {
                Some(ConsistencyClass::Consistent)
            }
            Verb::Watch => Some(ConsistencyClass::Cache),
            _ => None,
        }
    }
}

impl fmt::Display for ConsistencyClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A WATCH that begins by sending every matching object (`resourceVersion` unset or
/// `0`, or a streaming list with `sendInitialEvents=true`): it costs what a LIST costs.
pub fn watch_starts_with_full_state(info: &RequestInfo) -> bool {
    info.verb == Verb::Watch
        && (info.options.send_initial_events == Some(true)
            || matches!(info.options.resource_version.as_deref(), None | Some("0")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(url: &str) -> Option<ConsistencyClass> {
        let (path, q) = url.split_once('?').unwrap_or((url, ""));
        ConsistencyClass::of(&RequestInfo::parse("GET", path, Some(q)).unwrap())
    }

    #[test]
    fn classification_table() {
        use ConsistencyClass::*;
        let cases = [
            ("/api/v1/pods", Some(Consistent)),
            ("/api/v1/pods?resourceVersion=0", Some(Cache)),
            ("/api/v1/pods?resourceVersion=0&limit=500", Some(Cache)),
            ("/api/v1/pods?resourceVersion=42", Some(Cache)),
            ("/api/v1/pods?resourceVersion=42&limit=500", Some(Exact)),
            (
                "/api/v1/pods?resourceVersion=42&resourceVersionMatch=NotOlderThan&limit=5",
                Some(Cache),
            ),
            (
                "/api/v1/pods?resourceVersion=42&resourceVersionMatch=Exact",
                Some(Exact),
            ),
            ("/api/v1/pods?limit=500&continue=tok", Some(Exact)),
            ("/api/v1/pods?limit=500", Some(Consistent)),
            ("/api/v1/pods?watch=1", Some(Consistent)),
            ("/api/v1/pods?watch=1&resourceVersion=0", Some(Cache)),
            (
                "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
                Some(Cache),
            ),
            ("/api/v1/pods?watch=1&resourceVersion=77", Some(Cache)),
            ("/api/v1/namespaces/a/pods/b", None),
        ];
        for (url, want) in cases {
            assert_eq!(class(url), want, "{url}");
        }
    }

    #[test]
    fn full_state_watches() {
        let w = |q: &str| {
            watch_starts_with_full_state(
                &RequestInfo::parse("GET", "/api/v1/pods", Some(q)).unwrap(),
            )
        };
        assert!(w("watch=1"));
        assert!(w("watch=1&resourceVersion=0"));
        assert!(w("watch=1&resourceVersion=9&sendInitialEvents=true"));
        assert!(!w("watch=1&resourceVersion=9"));
        assert!(!w("resourceVersion=0"));
    }
}
