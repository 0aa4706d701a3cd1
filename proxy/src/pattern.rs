//! The pattern key: what two requests must share to be learned together.
//! Verb (watch-lists apart from plain watches), resource, scope, selector
//! fields without values, consistency class, limit bucket, client class and
//! response encoding. Names, namespaces and selector values are dropped, so
//! the number of keys stays bounded by the API's shape, not by the cluster.

use std::fmt;

use apimodel::request::Scope;
use apimodel::{ConsistencyClass, Verb};

use crate::classify::{Classified, Encoding};
use crate::identity::ClientClass;

/// The verb as the pattern cache sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PatternVerb {
    Api(Verb),
    /// A watch that starts with the full state: costed as a LIST.
    WatchList,
}

impl PatternVerb {
    pub fn as_str(self) -> &'static str {
        match self {
            PatternVerb::Api(v) => v.as_str(),
            PatternVerb::WatchList => "watchlist",
        }
    }
}

/// `limit` rounded up to a bucket: 0 means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitBucket(pub u64);

impl LimitBucket {
    const BOUNDS: [u64; 5] = [100, 500, 1000, 5000, 10_000];

    pub fn of(limit: Option<u64>) -> LimitBucket {
        match limit {
            None | Some(0) => LimitBucket(0),
            Some(l) => LimitBucket(
                Self::BOUNDS
                    .iter()
                    .copied()
                    .find(|b| l <= *b)
                    .unwrap_or(u64::MAX),
            ),
        }
    }
}

impl fmt::Display for LimitBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("nolimit"),
            u64::MAX => f.write_str("limit>10000"),
            b => write!(f, "limit<={b}"),
        }
    }
}

/// The normalized key a request is learned and predicted under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PatternKey {
    pub verb: PatternVerb,
    /// `resource`, `group/resource` or `…/subresource`; for non-resource
    /// requests the first path segment (`/version`, `/apis`).
    pub resource: String,
    pub scope: Scope,
    /// `label:a,b;field:spec.nodeName=` — fields only, sorted.
    pub selector: String,
    pub consistency: Option<ConsistencyClass>,
    pub limit: LimitBucket,
    pub client: ClientClass,
    pub encoding: Encoding,
}

impl PatternKey {
    pub fn new(c: &Classified, client: ClientClass) -> PatternKey {
        let info = &c.info;
        let verb = if c.watch_list {
            PatternVerb::WatchList
        } else {
            PatternVerb::Api(info.verb)
        };
        let resource = if info.is_resource() {
            let mut r = if info.group.is_empty() {
                info.resource.clone()
            } else {
                format!("{}/{}", info.group, info.resource)
            };
            if !info.subresource.is_empty() {
                r.push('/');
                r.push_str(&info.subresource);
            }
            r
        } else {
            let first = info
                .path
                .trim_start_matches('/')
                .split('/')
                .next()
                .unwrap_or("");
            format!("/{first}")
        };
        let mut selector = String::new();
        if !c.label_keys.is_empty() {
            selector.push_str("label:");
            selector.push_str(&c.label_keys.join(","));
        }
        if !c.field_shape.is_empty() {
            if !selector.is_empty() {
                selector.push(';');
            }
            selector.push_str("field:");
            selector.push_str(&c.field_shape.join(","));
        }
        let limit = if c.is_list_like() {
            LimitBucket::of(info.options.limit)
        } else {
            LimitBucket(0)
        };
        PatternKey {
            verb,
            resource,
            scope: c.scope(),
            selector,
            consistency: c.consistency,
            limit,
            client,
            encoding: c.encoding,
        }
    }

    /// The (resource, scope) a prior is kept under.
    pub fn prior_key(&self) -> (String, Scope) {
        (self.resource.clone(), self.scope)
    }

    pub fn is_list_like(&self) -> bool {
        matches!(
            self.verb,
            PatternVerb::Api(Verb::List) | PatternVerb::WatchList
        )
    }

    pub fn has_selector(&self) -> bool {
        !self.selector.is_empty()
    }

    /// What an equality field selector narrows the request to, whatever
    /// the cluster's size: one object (`metadata.name=`) or one node's
    /// objects (`spec.nodeName=`, a kubelet's or a per-node daemon's).
    pub fn narrows_to(&self) -> Option<Narrow> {
        let fields = self
            .selector
            .split(';')
            .find_map(|part| part.strip_prefix("field:"))?;
        let mut named = fields.split(',');
        if named.clone().any(|f| f == "metadata.name=") {
            Some(Narrow::OneObject)
        } else if named.any(|f| f == "spec.nodeName=") {
            Some(Narrow::OneNode)
        } else {
            None
        }
    }
}

/// See [`PatternKey::narrows_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Narrow {
    OneObject,
    OneNode,
}

impl fmt::Display for PatternKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.verb.as_str(),
            self.resource,
            self.scope.as_str()
        )?;
        if !self.selector.is_empty() {
            write!(f, " {}", self.selector)?;
        }
        if let Some(c) = self.consistency {
            write!(f, " {}", c.as_str())?;
        }
        if self.limit.0 != 0 {
            write!(f, " {}", self.limit)?;
        }
        write!(f, " {} {}", self.client.as_str(), self.encoding.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::classify;
    use http::{HeaderMap, Method};

    fn key(url: &str, client: ClientClass) -> PatternKey {
        let uri: http::Uri = url.parse().expect("uri");
        let c = classify(&Method::GET, &uri, &HeaderMap::new()).expect("classifies");
        PatternKey::new(&c, client)
    }

    #[test]
    fn values_and_names_are_dropped() {
        let a = key(
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
            ClientClass::Node,
        );
        let b = key(
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-17",
            ClientClass::Node,
        );
        assert_eq!(a, b);
        assert_eq!(
            a.to_string(),
            "list pods cluster field:spec.nodeName= consistent node json"
        );
        let g1 = key("/api/v1/namespaces/a/pods/x", ClientClass::User);
        let g2 = key("/api/v1/namespaces/b/pods/y", ClientClass::User);
        assert_eq!(g1, g2);
        assert_eq!(g1.to_string(), "get pods namespace user json");
    }

    #[test]
    fn watch_list_limit_bucket_and_group() {
        let w = key(
            "/apis/apps/v1/deployments?watch=1&resourceVersion=0",
            ClientClass::ControlPlane,
        );
        assert_eq!(w.verb, PatternVerb::WatchList);
        assert!(w.is_list_like());
        assert_eq!(
            w.to_string(),
            "watchlist apps/deployments cluster cache controlPlane json"
        );
        let l = key(
            "/api/v1/pods?limit=250&labelSelector=app%3Dx",
            ClientClass::User,
        );
        assert_eq!(l.limit, LimitBucket(500));
        assert_eq!(
            l.to_string(),
            "list pods cluster label:app consistent limit<=500 user json"
        );
        assert_eq!(LimitBucket::of(Some(20_000)).to_string(), "limit>10000");
        assert_eq!(key("/version", ClientClass::Anonymous).resource, "/version");
    }
}
