use super::*;
use proptest::prelude::*;

fn p(method: &str, url: &str) -> RequestInfo {
    let (path, query) = match url.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (url, None),
    };
    RequestInfo::parse(method, path, query).unwrap_or_else(|e| panic!("{url}: {e}"))
}

#[test]
fn classification_table() {
    // (method, url, verb, group, resource, subresource, namespace, name)
    type Case<'a> = (
        &'a str,
        &'a str,
        Verb,
        &'a str,
        &'a str,
        &'a str,
        &'a str,
        &'a str,
    );
    let cases: &[Case] = &[
        ("GET", "/api/v1/pods", Verb::List, "", "pods", "", "", ""),
        (
            "GET",
            "/api/v1/pods?watch=true",
            Verb::Watch,
            "",
            "pods",
            "",
            "",
            "",
        ),
        (
            "GET",
            "/api/v1/watch/pods",
            Verb::Watch,
            "",
            "pods",
            "",
            "",
            "",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns1/pods",
            Verb::List,
            "",
            "pods",
            "",
            "ns1",
            "",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns1/pods/p1",
            Verb::Get,
            "",
            "pods",
            "",
            "ns1",
            "p1",
        ),
        (
            "PATCH",
            "/api/v1/nodes/n1/status",
            Verb::Patch,
            "",
            "nodes",
            "status",
            "",
            "n1",
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
            Verb::Update,
            "coordination.k8s.io",
            "leases",
            "",
            "kube-node-lease",
            "n1",
        ),
        (
            "POST",
            "/api/v1/namespaces/ns1/pods",
            Verb::Create,
            "",
            "pods",
            "",
            "ns1",
            "",
        ),
        (
            "DELETE",
            "/api/v1/namespaces/ns1/pods/p1",
            Verb::Delete,
            "",
            "pods",
            "",
            "ns1",
            "p1",
        ),
        (
            "DELETE",
            "/api/v1/namespaces/ns1/pods",
            Verb::DeleteCollection,
            "",
            "pods",
            "",
            "ns1",
            "",
        ),
        (
            "GET",
            "/api/v1/namespaces",
            Verb::List,
            "",
            "namespaces",
            "",
            "",
            "",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns1",
            Verb::Get,
            "",
            "namespaces",
            "",
            "",
            "ns1",
        ),
        (
            "PUT",
            "/api/v1/namespaces/ns1/finalize",
            Verb::Update,
            "",
            "namespaces",
            "finalize",
            "",
            "ns1",
        ),
        (
            "POST",
            "/api/v1/namespaces/ns1/pods/p1/exec",
            Verb::Connect,
            "",
            "pods",
            "exec",
            "ns1",
            "p1",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns1/pods/p1/log",
            Verb::Get,
            "",
            "pods",
            "log",
            "ns1",
            "p1",
        ),
        (
            "GET",
            "/apis/example.com/v1/widgets",
            Verb::List,
            "example.com",
            "widgets",
            "",
            "",
            "",
        ),
        ("GET", "/version", Verb::NonResource, "", "", "", "", ""),
        ("GET", "/api", Verb::NonResource, "", "", "", "", ""),
        ("GET", "/api/v1", Verb::NonResource, "", "", "", "", ""),
        (
            "GET",
            "/apis/coordination.k8s.io/v1",
            Verb::NonResource,
            "",
            "",
            "",
            "",
            "",
        ),
        ("GET", "/healthz", Verb::NonResource, "", "", "", "", ""),
    ];
    for (m, url, verb, group, resource, sub, ns, name) in cases {
        let i = p(m, url);
        assert_eq!(
            (
                i.verb,
                i.group.as_str(),
                i.resource.as_str(),
                i.subresource.as_str(),
                i.namespace.as_str(),
                i.name.as_str()
            ),
            (*verb, *group, *resource, *sub, *ns, *name),
            "{m} {url}"
        );
    }
}

#[test]
fn list_options_are_read_and_decoded() {
    let i = p("GET", "/api/v1/pods?resourceVersion=0&limit=500&labelSelector=app%3Dweb%2Ctier+in+(a)&fieldSelector=spec.nodeName%3Dn1&continue=abc&allowWatchBookmarks=true&timeoutSeconds=30&sendInitialEvents=false&resourceVersionMatch=NotOlderThan");
    let o = &i.options;
    assert_eq!(o.resource_version.as_deref(), Some("0"));
    assert_eq!(o.limit, Some(500));
    assert_eq!(o.label_selector.as_deref(), Some("app=web,tier in (a)"));
    assert_eq!(o.field_selector.as_deref(), Some("spec.nodeName=n1"));
    assert_eq!(o.continue_token.as_deref(), Some("abc"));
    assert!(o.allow_watch_bookmarks);
    assert_eq!(o.timeout_seconds, Some(30));
    assert_eq!(o.send_initial_events, Some(false));
    assert_eq!(o.resource_version_match.as_deref(), Some("NotOlderThan"));
    // limit=0 means no limit; an empty resourceVersion means unset.
    let i = p("GET", "/api/v1/pods?limit=0&resourceVersion=");
    assert_eq!(i.options.limit, None);
    assert_eq!(i.options.resource_version, None);
}

#[test]
fn bad_queries_are_errors_not_panics() {
    assert!(RequestInfo::parse("GET", "/api/v1/pods", Some("limit=ten")).is_err());
    assert!(RequestInfo::parse("GET", "/api/v1/pods", Some("watch=maybe")).is_err());
    assert!(RequestInfo::parse("GET", "/api/v1/pods", Some("limit=-1")).is_err());
    assert!(RequestInfo::parse("BREW", "/api/v1/pods", None).is_err());
    assert!(RequestInfo::parse("GET", "/api/v1/%ff", None).is_err());
}

#[test]
fn long_running() {
    assert!(p("GET", "/api/v1/pods?watch=1").is_long_running());
    assert!(p("POST", "/api/v1/namespaces/a/pods/b/exec").is_long_running());
    assert!(!p("GET", "/api/v1/pods").is_long_running());
    assert!(!p("PATCH", "/api/v1/nodes/n/status").is_long_running());
}

proptest! {
    // A parser's guard: many cases are cheap (the fuzz target goes further).
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn parse_never_panics(method in "(GET|POST|PUT|PATCH|DELETE|[A-Z]{1,6})", path in "(/[a-z0-9%.]{0,12}){0,8}", query in ".{0,40}") {
        let _ = RequestInfo::parse(&method, &path, Some(&query));
    }
}
