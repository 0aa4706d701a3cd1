//! Classification: the request parsed by `apimodel` into verb, resource,
//! scope and list options, plus what tollgate adds for costing: the
//! consistency class, whether a watch starts with the full state (a
//! watch-list, costed as a LIST), the selector shapes and the response
//! encoding asked for.
//!
//! The table (see also `apimodel::consistency`):
//!
//! | request | verb in key | consistency |
//! |---|---|---|
//! | GET collection, `resourceVersion` unset | list | consistent |
//! | GET collection, `resourceVersion=0` (with or without `limit`) | list | cache |
//! | GET collection, `resourceVersion=N`, no match, no limit | list | cache |
//! | GET collection, `resourceVersion=N`, no match, with limit | list | exact |
//! | `resourceVersionMatch=Exact`, or a `continue` token | list | exact |
//! | watch, `resourceVersion` unset | watch-list (costed as a list) | consistent |
//! | watch, `resourceVersion=0`, or `sendInitialEvents=true` | watch-list | cache |
//! | watch, `resourceVersion=N` | watch | cache |
//! | unknown paths (CRDs, aggregated APIs) | by method, as any resource | by query |
//! | non-resource URLs (`/version`, discovery) | nonresource | none |
//!
//! Only requests whose query cannot be read get a 400; a selector tollgate
//! cannot parse is keyed as `?` and forwarded for the apiserver to judge.

use apimodel::consistency::watch_starts_with_full_state;
use apimodel::request::Scope;
use apimodel::{ConsistencyClass, FieldSelector, LabelSelector, ParseError, RequestInfo, Verb};
use http::header::ACCEPT;
use http::HeaderMap;

/// The response encoding a client asked for; part of the pattern key
/// because the same objects cost very different bytes in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Encoding {
    Json,
    Protobuf,
    Table,
}

impl Encoding {
    pub fn of(headers: &HeaderMap) -> Encoding {
        let accept = headers
            .get(ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // `as=Table` is a media-type parameter: no `;`, no substring search (most requests).
        if accept.contains(';') && accept.contains("as=Table") {
            Encoding::Table
        } else if accept.starts_with("application/vnd.kubernetes.protobuf") {
            Encoding::Protobuf
        } else {
            Encoding::Json
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Json => "json",
            Encoding::Protobuf => "protobuf",
            Encoding::Table => "table",
        }
    }
}

/// A classified request.
#[derive(Debug, Clone)]
pub struct Classified {
    pub info: RequestInfo,
    /// For LIST and WATCH.
    pub consistency: Option<ConsistencyClass>,
    /// A watch that starts by sending every matching object.
    pub watch_list: bool,
    /// Label selector keys, sorted; `["?"]` if unparsable.
    pub label_keys: Vec<String>,
    /// Field selector fields with operators, values dropped (`spec.nodeName=`).
    pub field_shape: Vec<String>,
    pub encoding: Encoding,
}

impl Classified {
    /// LIST, or a watch that costs one.
    pub fn is_list_like(&self) -> bool {
        self.info.verb == Verb::List || self.watch_list
    }

    /// The request selects a subset: the apiserver still reads the rest.
    pub fn has_selector(&self) -> bool {
        !self.label_keys.is_empty() || !self.field_shape.is_empty()
    }

    pub fn scope(&self) -> Scope {
        self.info.scope()
    }

    /// A LIST of everything in its scope, in one response: what teaches the
    /// per-resource prior.
    pub fn is_full_list(&self) -> bool {
        self.info.verb == Verb::List
            && !self.has_selector()
            && self.info.options.limit.is_none()
            && self.info.options.continue_token.is_none()
            && self.info.subresource.is_empty()
    }
}

/// Classify a request from its method, URI and headers.
pub fn classify(
    method: &http::Method,
    uri: &http::Uri,
    headers: &HeaderMap,
) -> Result<Classified, ParseError> {
    let info = RequestInfo::parse(method.as_str(), uri.path(), uri.query())?;
    let consistency = ConsistencyClass::of(&info);
    let watch_list = watch_starts_with_full_state(&info);
    let label_keys = match info.options.label_selector.as_deref() {
        None => Vec::new(),
        Some(s) => LabelSelector::parse(s)
            .map(|s| s.keys())
            .unwrap_or_else(|_| vec!["?".into()]),
    };
    let field_shape = match info.options.field_selector.as_deref() {
        None => Vec::new(),
        Some(s) => FieldSelector::parse(s)
            .map(|s| s.shape())
            .unwrap_or_else(|_| vec!["?".into()]),
    };
    Ok(Classified {
        info,
        consistency,
        watch_list,
        label_keys,
        field_shape,
        encoding: Encoding::of(headers),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Method};

    fn c(method: Method, url: &str) -> Classified {
        let uri: http::Uri = url.parse().expect("uri");
        classify(&method, &uri, &HeaderMap::new()).expect("classifies")
    }

    #[test]
    fn table() {
        use ConsistencyClass::*;
        // (url, verb, watch_list, consistency, selector?)
        let cases = [
            ("/api/v1/pods", Verb::List, false, Some(Consistent), false),
            (
                "/api/v1/pods?resourceVersion=0&limit=500",
                Verb::List,
                false,
                Some(Cache),
                false,
            ),
            (
                "/api/v1/pods?resourceVersion=42",
                Verb::List,
                false,
                Some(Cache),
                false,
            ),
            (
                "/api/v1/pods?resourceVersion=42&limit=10",
                Verb::List,
                false,
                Some(Exact),
                false,
            ),
            (
                "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1",
                Verb::List,
                false,
                Some(Consistent),
                true,
            ),
            (
                "/api/v1/pods?watch=1",
                Verb::Watch,
                true,
                Some(Consistent),
                false,
            ),
            (
                "/api/v1/pods?watch=1&resourceVersion=0",
                Verb::Watch,
                true,
                Some(Cache),
                false,
            ),
            (
                "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
                Verb::Watch,
                true,
                Some(Cache),
                false,
            ),
            (
                "/api/v1/pods?watch=1&resourceVersion=77",
                Verb::Watch,
                false,
                Some(Cache),
                false,
            ),
            ("/api/v1/namespaces/a/pods/b", Verb::Get, false, None, false),
            (
                "/apis/example.com/v1/widgets?labelSelector=app%3Dx",
                Verb::List,
                false,
                Some(Consistent),
                true,
            ),
            ("/version", Verb::NonResource, false, None, false),
        ];
        for (url, verb, watch_list, consistency, selector) in cases {
            let got = c(Method::GET, url);
            assert_eq!(got.info.verb, verb, "{url}");
            assert_eq!(got.watch_list, watch_list, "{url}");
            assert_eq!(
                got.is_list_like(),
                verb == Verb::List || watch_list,
                "{url}"
            );
            assert_eq!(got.consistency, consistency, "{url}");
            assert_eq!(got.has_selector(), selector, "{url}");
        }
    }

    #[test]
    fn selectors_keep_fields_not_values() {
        let got = c(Method::GET, "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-17&labelSelector=app%3Dweb,tier+in+(a,b)");
        assert_eq!(got.field_shape, vec!["spec.nodeName=".to_string()]);
        assert_eq!(got.label_keys, vec!["app".to_string(), "tier".to_string()]);
        assert!(!got.is_full_list());
        assert!(c(Method::GET, "/api/v1/pods").is_full_list());
        assert!(!c(Method::GET, "/api/v1/pods?limit=5").is_full_list());
    }

    #[test]
    fn malformed_query_is_an_error_unknown_selector_is_not() {
        let uri: http::Uri = "/api/v1/pods?limit=abc".parse().expect("uri");
        assert!(classify(&Method::GET, &uri, &HeaderMap::new()).is_err());
        let got = c(Method::GET, "/api/v1/pods?labelSelector=%21%21%21");
        assert_eq!(got.label_keys, vec!["?".to_string()]);
    }

    proptest::proptest! {
        // A parser's guard: many cases are cheap (the fuzz target goes further).
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        #[test]
        fn never_panics_on_any_path_or_query(
            method in "(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS|BREW)",
            path in "(/[a-zA-Z0-9%._~-]{0,12}){0,8}",
            query in "([a-zA-Z]{1,20}=[a-zA-Z0-9%=,!()+._-]{0,20}&?){0,6}",
        ) {
            let url = format!("{}?{query}", if path.is_empty() { "/" } else { &path });
            if let (Ok(uri), Ok(m)) = (url.parse::<http::Uri>(), method.parse::<Method>()) {
                if let Ok(c) = classify(&m, &uri, &HeaderMap::new()) {
                    let key = crate::pattern::PatternKey::new(&c, crate::identity::ClientClass::User);
                    let _ = key.to_string();
                }
            }
        }
    }

    #[test]
    fn encoding_from_accept() {
        let mut h = HeaderMap::new();
        assert_eq!(Encoding::of(&h), Encoding::Json);
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/vnd.kubernetes.protobuf, application/json"),
        );
        assert_eq!(Encoding::of(&h), Encoding::Protobuf);
        h.insert(
            ACCEPT,
            HeaderValue::from_static(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
            ),
        );
        assert_eq!(Encoding::of(&h), Encoding::Table);
    }
}
