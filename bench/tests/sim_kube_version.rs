//! `--kube-version` over HTTP: what the release the sim answers as changes for a client.
//! 1.20 reads a consistent LIST from etcd, 1.37 from the watch cache after one revision
//! request (KEP-2340); 1.37 serves exact-revision LISTs and continue tokens from cache
//! snapshots while the cache holds the revision and answers 410 past it (KEP-4988); each
//! serves its own discovery documents and `/version`. The rules themselves are unit-tested in
//! `sim::kube_version`; the real apiserver is the reference in `tests/CONFORMANCE.md`.
#![allow(clippy::unwrap_used)]

mod common;

use common::{sim, Http};
use serde_json::json;

/// A metric's value from the Prometheus text (0 when absent): the sum over the series whose
/// labels contain every `want` pair.
fn metric(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let series = l.split_whitespace().next().unwrap_or("");
            series.split('{').next() == Some(name)
                && want
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum()
}

/// What the modeled etcd spent and which stores `apiserver_storage_list_total` counted.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    etcd_cpu: f64,
    etcd_lists: f64,
    cache_lists: f64,
}

async fn counts(h: &Http) -> Counts {
    let m = String::from_utf8(h.get("/metrics").await.body.to_vec()).unwrap();
    let pods_from = |storage| {
        metric(
            &m,
            "apiserver_storage_list_total",
            &[("resource", "pods"), ("storage", storage)],
        )
    };
    Counts {
        etcd_cpu: metric(
            &m,
            "tollgate_sim_virtual_cpu_seconds_total",
            &[("component", "etcd")],
        ),
        etcd_lists: if m.contains("apiserver_storage_list_total{group") {
            pods_from("etcd")
        } else {
            // 1.20's series: LISTs from etcd, by resource only.
            metric(&m, "apiserver_storage_list_total", &[("resource", "pods")])
        },
        cache_lists: pods_from("watchcache"),
    }
}

/// `path` (200 expected), and how the counts moved while it was served.
async fn list(h: &Http, path: &str) -> (serde_json::Value, Counts) {
    let before = counts(h).await;
    let r = h.get(path).await;
    assert_eq!(
        r.status,
        200,
        "{path}: {}",
        String::from_utf8_lossy(&r.body)
    );
    let after = counts(h).await;
    (
        r.json(),
        Counts {
            etcd_cpu: after.etcd_cpu - before.etcd_cpu,
            etcd_lists: after.etcd_lists - before.etcd_lists,
            cache_lists: after.cache_lists - before.cache_lists,
        },
    )
}

async fn modeled(version: &str) -> bench::sim::RunningSim {
    sim(&[
        "--kube-version",
        version,
        "--cost-model",
        "modeled",
        "--nodes",
        "20",
        "--pods",
        "2000",
        "--history-window",
        "10",
    ])
    .await
}

/// etcd's modeled CPU for one range request that reads no object (the default constant).
const REVISION_REQUEST: f64 = 0.0005;

#[tokio::test]
async fn a_consistent_list_reads_etcd_on_1_20_and_the_cache_on_1_37() {
    let old = modeled("1.20").await;
    let (_, c) = list(&Http::new(&old.url), "/api/v1/pods").await;
    assert_eq!(c.etcd_lists, 1.0, "{c:?}");
    // 2,000 keys and their bytes read from etcd: far more than one request.
    assert!(c.etcd_cpu > 10.0 * REVISION_REQUEST, "{c:?}");

    let new = modeled("1.37").await;
    let h = Http::new(&new.url);
    let (_, c) = list(&h, "/api/v1/pods").await;
    assert_eq!((c.etcd_lists, c.cache_lists), (0.0, 1.0), "{c:?}");
    // One revision request, no object read from etcd.
    assert!((c.etcd_cpu - REVISION_REQUEST).abs() < 1e-9, "{c:?}");
    // With a limit too (KEP-4988: paginated LISTs from the cache).
    let (page, c) = list(&h, "/api/v1/pods?limit=500").await;
    assert_eq!((c.etcd_lists, c.cache_lists), (0.0, 1.0), "{c:?}");
    assert_eq!(page["items"].as_array().map(Vec::len), Some(500));
    // A GET without resourceVersion still reads etcd on 1.37.
    let name = page["items"][0]["metadata"]["name"].as_str().unwrap();
    let ns = page["items"][0]["metadata"]["namespace"].as_str().unwrap();
    let before = counts(&h).await;
    let r = h.get(&format!("/api/v1/namespaces/{ns}/pods/{name}")).await;
    assert_eq!(r.status, 200);
    assert!(counts(&h).await.etcd_cpu - before.etcd_cpu > REVISION_REQUEST);
}

#[tokio::test]
async fn exact_reads_and_continues_come_from_cache_snapshots_on_1_37_until_the_window_passes() {
    for version in ["1.20", "1.37"] {
        let s = modeled(version).await;
        let h = Http::new(&s.url);
        let (first, _) = list(&h, "/api/v1/namespaces/default/configmaps").await;
        let rv = first["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let (page, _) = list(&h, "/api/v1/pods?limit=100").await;
        let token = page["metadata"]["continue"].as_str().unwrap().to_string();
        let (_, exact) = list(
            &h,
            &format!("/api/v1/pods?resourceVersion={rv}&resourceVersionMatch=Exact"),
        )
        .await;
        let (legacy, legacy_counts) =
            list(&h, &format!("/api/v1/pods?resourceVersion={rv}&limit=10")).await;
        assert_eq!(legacy["items"].as_array().map(Vec::len), Some(10));
        let (next, cont) = list(&h, &format!("/api/v1/pods?limit=100&continue={token}")).await;
        assert_eq!(next["items"].as_array().map(Vec::len), Some(100));
        for (what, c) in [
            ("exact", exact),
            ("legacy exact", legacy_counts),
            ("continue", cont),
        ] {
            match version {
                "1.20" => {
                    assert_eq!(c.etcd_lists, 1.0, "{version} {what}: {c:?}");
                    // A range read of keys (with a limit, a page of them).
                    assert!(c.etcd_cpu > REVISION_REQUEST, "{version} {what}: {c:?}");
                }
                _ => {
                    assert_eq!((c.etcd_lists, c.cache_lists), (0.0, 1.0), "{what}: {c:?}");
                    assert_eq!(c.etcd_cpu, 0.0, "{what}: {c:?}");
                }
            }
        }
        // Past the history window (10 revisions) both answer 410 Expired, as etcd does after
        // a compaction, with a continue token for the same place now.
        for i in 0..12 {
            let r = h
                .post(
                    "/api/v1/namespaces/default/configmaps",
                    &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("w{i}")}}),
                )
                .await;
            assert_eq!(r.status, 201);
        }
        let r = h
            .get(&format!("/api/v1/pods?limit=100&continue={token}"))
            .await;
        assert_eq!(
            r.status,
            410,
            "{version}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["reason"], "Expired");
        assert!(r.json()["metadata"]["continue"].is_string());
        let r = h
            .get(&format!(
                "/api/v1/pods?resourceVersion={rv}&resourceVersionMatch=Exact"
            ))
            .await;
        assert_eq!(r.status, 410, "{version}");
    }
}

#[tokio::test]
async fn each_release_serves_its_own_discovery() {
    let old = sim(&["--kube-version", "1.20"]).await;
    let new = sim(&["--kube-version", "1.37"]).await;
    let (old, new) = (Http::new(&old.url), Http::new(&new.url));
    assert_eq!(new.get("/version").await.json()["gitVersion"], "v1.37.2");
    assert_ne!(old.get("/version").await.json()["gitVersion"], "v1.37.2");
    // batch/v1 CronJobs are 1.21+: discovered and served on 1.37 only.
    let cronjobs = |list: serde_json::Value| {
        list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "cronjobs")
    };
    assert!(cronjobs(new.get("/apis/batch/v1").await.json()));
    assert!(!cronjobs(old.get("/apis/batch/v1").await.json()));
    let cj = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}});
    let path = "/apis/batch/v1/namespaces/default/cronjobs";
    assert_eq!(new.post(path, &cj).await.status, 201);
    assert_eq!(old.post(path, &cj).await.status, 404);
    // The beta versions removed since 1.20 are gone on 1.37.
    assert_eq!(old.get("/apis/policy/v1beta1").await.status, 200);
    assert_eq!(new.get("/apis/policy/v1beta1").await.status, 404);
    let groups = |list: serde_json::Value| list["groups"].as_array().unwrap().len();
    assert_ne!(
        groups(old.get("/apis").await.json()),
        groups(new.get("/apis").await.json())
    );
}

/// 1.20's Go encoder writes an unset timestamp as `null`; 1.37.2 leaves it out (seen in the
/// differential cases: a streaming list's bookmark, a Deployment's pod template).
#[tokio::test]
async fn the_current_release_leaves_out_unset_timestamps() {
    for (version, null) in [("1.20", true), ("1.37", false)] {
        let s = sim(&["--kube-version", version, "--nodes", "2"]).await;
        let h = Http::new(&s.url);
        let mut w = h
            .watch("/api/v1/nodes?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
            .await;
        let mut bookmark = None;
        for _ in 0..3 {
            let e = w.next(std::time::Duration::from_secs(5)).await.unwrap();
            if e["type"] == "BOOKMARK" {
                bookmark = Some(e);
            }
        }
        let meta = &bookmark.expect("the initial-events-end bookmark")["object"]["metadata"];
        assert_eq!(meta["annotations"]["k8s.io/initial-events-end"], "true");
        assert_eq!(
            meta.as_object().unwrap().contains_key("creationTimestamp"),
            null,
            "{version}: {meta}"
        );
        let d = h
            .post(
                "/apis/apps/v1/namespaces/default/deployments",
                &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                    "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}),
            )
            .await;
        assert_eq!(d.status, 201);
        let template = &d.json()["spec"]["template"]["metadata"];
        assert_eq!(
            template
                .as_object()
                .unwrap()
                .contains_key("creationTimestamp"),
            null,
            "{version}: {template}"
        );
    }
}

/// `/metrics` names only the release's own resources (the store has slots for both).
#[tokio::test]
async fn the_metrics_name_only_the_releases_own_resources() {
    for (version, own, other) in [
        ("1.20", "podsecuritypolicies", "deviceclasses"),
        ("1.37", "deviceclasses", "podsecuritypolicies"),
    ] {
        let s = sim(&["--kube-version", version]).await;
        let m = String::from_utf8(Http::new(&s.url).get("/metrics").await.body.to_vec()).unwrap();
        for name in ["apiserver_storage_list_total", "apiserver_storage_objects"] {
            let series = |resource: &str| {
                m.lines()
                    .any(|l| l.starts_with(name) && l.contains(&format!("resource=\"{resource}")))
            };
            assert!(series(own), "{version}: no {name} for {own}");
            assert!(!series(other), "{version}: {name} for {other}");
        }
    }
}
