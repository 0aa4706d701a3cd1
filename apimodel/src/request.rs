//! A request parsed the way kube-apiserver's RequestInfoFactory parses it.
//!
//! Every request is either a resource request (`/api/v1/namespaces/ns/pods/p`,
//! `/apis/coordination.k8s.io/v1/leases`) with a verb derived from the method,
//! the name and `watch`, or a non-resource request (`/version`, `/apis`,
//! `/healthz`, discovery). Only requests whose query cannot be read (a limit
//! that is not a number, an invalid `watch` flag) are errors: paths tollgate
//! does not know are still resource requests of unknown resources.

use percent_encoding::percent_decode_str;
use std::borrow::Cow;
use std::fmt;

/// What a request does, in the apiserver's authorization vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    /// exec, attach, portforward and proxy subresources: long-running streams.
    Connect,
    /// A request that is not for a resource (`/version`, discovery, `/healthz`).
    NonResource,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Connect => "connect",
            Verb::NonResource => "nonresource",
        }
    }

    /// Writes count against the apiserver's mutating in-flight limit.
    pub fn is_mutating(self) -> bool {
        matches!(
            self,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
        )
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a request could not be read; answered with a 400 Status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid value {value:?} for query parameter {param:?}: {reason}")]
    Query {
        param: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("the path is not valid UTF-8 once decoded: {0:?}")]
    Encoding(String),
    #[error("unsupported HTTP method {0:?}")]
    Method(String),
}

/// The query parameters of LIST and WATCH that change what a request costs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    pub watch: bool,
    /// `resourceVersion`; `None` when absent or empty.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`: `NotOlderThan` or `Exact` (kept as sent; the server validates it).
    pub resource_version_match: Option<String>,
    pub limit: Option<u64>,
    pub continue_token: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub send_initial_events: Option<bool>,
    pub allow_watch_bookmarks: bool,
    pub timeout_seconds: Option<u64>,
    /// `follow` on a pod's log: a stream that stays open.
    pub follow: bool,
}

/// A request as the apiserver understands it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    pub verb: Verb,
    /// The path, for non-resource requests and messages.
    pub path: String,
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub options: ListOptions,
}

/// Subresources that hold a stream open (as kube-apiserver's long-running check lists them).
const CONNECT_SUBRESOURCES: &[&str] = &["exec", "attach", "portforward", "proxy"];

/// Path segments [`RequestInfo::parse`] reads: `apis/G/V/watch/namespaces/NS/R/NAME/SUB` is
/// nine; later ones (a proxy subresource's own path) never change the result.
const MAX_SEGMENTS: usize = 10;

impl RequestInfo {
    /// Parses a request. `path` is the raw (percent-encoded) path, `query` the raw query without `?`.
    pub fn parse(method: &str, path: &str, query: Option<&str>) -> Result<RequestInfo, ParseError> {
        let options = parse_query(query.unwrap_or(""))?;
        // Every request is parsed, and almost no path has an escape: borrowing it then, and
        // keeping the segments on the stack, saves a copy of the path and a `Vec` a request.
        let decoded: Cow<'_, str> = if path.contains('%') {
            percent_decode_str(path)
                .decode_utf8()
                .map_err(|_| ParseError::Encoding(path.to_string()))?
        } else {
            Cow::Borrowed(path)
        };
        let mut segments = [""; MAX_SEGMENTS];
        let mut n = 0;
        for segment in decoded
            .split('/')
            .filter(|p| !p.is_empty())
            .take(MAX_SEGMENTS)
        {
            segments[n] = segment;
            n += 1;
        }
        let mut info = RequestInfo {
            verb: Verb::NonResource,
            path: String::new(),
            group: String::new(),
            version: String::new(),
            resource: String::new(),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            options,
        };
        info.read_segments(method, &segments[..n])?;
        info.path = decoded.into_owned();
        Ok(info)
    }

    /// Group, version, namespace, resource, name and subresource from the
    /// path's segments, and the verb; left as a non-resource request when the
    /// path is not an API path.
    fn read_segments(&mut self, method: &str, parts: &[&str]) -> Result<(), ParseError> {
        let info = self;
        let rest: &[&str] = match parts {
            ["api", version, rest @ ..] if !rest.is_empty() => {
                info.version = version.to_string();
                rest
            }
            ["apis", group, version, rest @ ..] if !rest.is_empty() => {
                info.group = group.to_string();
                info.version = version.to_string();
                rest
            }
            _ => return Ok(()),
        };
        let mut rest = rest;
        // Old-style `/api/v1/watch/...` paths.
        if rest.first() == Some(&"watch") {
            info.options.watch = true;
            rest = &rest[1..];
            if rest.is_empty() {
                return Ok(());
            }
        }
        if rest[0] == "namespaces" && rest.len() > 1 {
            info.namespace = rest[1].to_string();
            // `namespaces/x/status` and `/finalize` are subresources of the namespace itself.
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        info.resource = rest[0].to_string();
        if let Some(n) = rest.get(1) {
            info.name = n.to_string();
        }
        if let Some(s) = rest.get(2) {
            info.subresource = s.to_string();
        }
        if info.resource == "namespaces" && rest.len() >= 2 {
            // A namespace is named by its own name, not scoped by it.
            info.namespace.clear();
        }
        info.verb = verb_for(method, info)?;
        Ok(())
    }

    pub fn is_resource(&self) -> bool {
        self.verb != Verb::NonResource
    }

    /// Namespaced or cluster-wide, as a pattern key keeps it.
    pub fn scope(&self) -> Scope {
        if self.namespace.is_empty() {
            Scope::Cluster
        } else {
            Scope::Namespace
        }
    }

    /// Requests kube-apiserver's max-in-flight filter does not count: watches and
    /// streams (exec, attach, port-forward, proxy, followed logs).
    pub fn is_long_running(&self) -> bool {
        self.verb == Verb::Watch
            || self.verb == Verb::Connect
            || (self.subresource == "log" && self.options.follow)
    }
}

/// Cluster-wide or inside one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Cluster,
    Namespace,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::Namespace => "namespace",
        }
    }
}

fn verb_for(method: &str, info: &RequestInfo) -> Result<Verb, ParseError> {
    if CONNECT_SUBRESOURCES.contains(&info.subresource.as_str()) {
        return Ok(Verb::Connect);
    }
    let named = !info.name.is_empty();
    Ok(match method {
        "GET" | "HEAD" if info.options.watch => Verb::Watch,
        "GET" | "HEAD" if named => Verb::Get,
        "GET" | "HEAD" => Verb::List,
        "POST" => Verb::Create,
        "PUT" => Verb::Update,
        "PATCH" => Verb::Patch,
        "DELETE" if named => Verb::Delete,
        "DELETE" => Verb::DeleteCollection,
        "OPTIONS" => Verb::NonResource,
        other => return Err(ParseError::Method(other.to_string())),
    })
}

/// Splits and percent-decodes a query string (`+` is a space, as in Go's url.ParseQuery).
pub fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode_component(k), decode_component(v))
    })
}

fn decode_component(s: &str) -> String {
    if !s.contains(['+', '%']) {
        return s.to_string();
    }
    let spaced = s.replace('+', " ");
    percent_decode_str(&spaced).decode_utf8_lossy().into_owned()
}

fn parse_bool(param: &'static str, v: &str) -> Result<bool, ParseError> {
    // Go's strconv.ParseBool, which the apiserver's query decoding uses.
    match v {
        "" | "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(ParseError::Query {
            param,
            value: v.to_string(),
            reason: "not a boolean",
        }),
    }
}

fn parse_u64(param: &'static str, v: &str) -> Result<u64, ParseError> {
    v.parse::<u64>().map_err(|_| ParseError::Query {
        param,
        value: v.to_string(),
        reason: "not a non-negative integer",
    })
}

fn non_empty(v: String) -> Option<String> {
    (!v.is_empty()).then_some(v)
}

fn parse_query(query: &str) -> Result<ListOptions, ParseError> {
    let mut o = ListOptions::default();
    for (k, v) in query_pairs(query) {
        match k.as_str() {
            "watch" => o.watch = parse_bool("watch", &v)?,
            "resourceVersion" => o.resource_version = non_empty(v),
            "resourceVersionMatch" => o.resource_version_match = non_empty(v),
            "limit" => o.limit = Some(parse_u64("limit", &v)?).filter(|l| *l > 0),
            "continue" => o.continue_token = non_empty(v),
            "labelSelector" => o.label_selector = non_empty(v),
            "fieldSelector" => o.field_selector = non_empty(v),
            "sendInitialEvents" => {
                o.send_initial_events = Some(parse_bool("sendInitialEvents", &v)?)
            }
            "allowWatchBookmarks" => {
                o.allow_watch_bookmarks = parse_bool("allowWatchBookmarks", &v)?
            }
            "timeoutSeconds" => o.timeout_seconds = Some(parse_u64("timeoutSeconds", &v)?),
            "follow" => o.follow = parse_bool("follow", &v)?,
            _ => {}
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests;
