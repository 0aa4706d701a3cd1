//! The simulated apiserver's API semantics over loopback HTTP: paging across
//! writes, watches that deliver every change once and in order, conflicts,
//! max-in-flight 429s, 410s past the history window, patches and bad input.
//! Each runs against the memory store and against a real etcd (`NAME::memory`, `NAME::etcd`).

#![allow(clippy::unwrap_used)] // tests may unwrap

#[macro_use]
mod common;

use common::{rv, sim, sim_on, Backend, Http};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

on_both_stores!(
    paging_across_writes_returns_the_first_pages_revision,
    watch_from_a_revision_delivers_every_change_once_in_order,
    filtered_watch_sees_objects_enter_and_leave_the_selection,
    streaming_list_sends_state_then_the_initial_events_end_bookmark,
    stale_writes_conflict,
    expired_continue_and_too_old_watch_get_410,
    patch_types_over_http,
    bad_input_gets_a_status_naming_the_problem,
    graceful_delete_of_a_bound_pod_then_removal,
    namespaced_reads_see_only_their_namespace,
);

fn pod(name: &str, node: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": labels},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
}

async fn create_pods(c: &Http, n: usize, prefix: &str) -> Vec<u64> {
    let mut rvs = Vec::new();
    for i in 0..n {
        let r = c
            .post(
                "/api/v1/namespaces/default/pods",
                &pod(
                    &format!("{prefix}-{i}"),
                    "node-1",
                    json!({"i": i.to_string()}),
                ),
            )
            .await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        rvs.push(rv(&r.json()));
    }
    rvs
}

async fn paging_across_writes_returns_the_first_pages_revision(backend: Backend) {
    let s = sim_on(backend, &["--nodes", "2"]).await;
    let c = Http::new(&s.url);
    create_pods(&c, 25, "p").await;
    let first = c
        .get("/api/v1/namespaces/default/pods?limit=10")
        .await
        .json();
    let at = rv(&first);
    let mut names: Vec<String> = first["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 10);
    // Writes between pages: a new pod, a deleted one not yet listed, a changed one.
    create_pods(&c, 1, "zz-late").await;
    assert_eq!(
        c.delete("/api/v1/namespaces/default/pods/p-9?gracePeriodSeconds=0")
            .await
            .status,
        200
    );
    let changed = c
        .patch(
            "/api/v1/namespaces/default/pods/p-8",
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"x": "y"}}}),
        )
        .await;
    assert_eq!(changed.status, 200);
    let mut token = first["metadata"]["continue"].as_str().unwrap().to_string();
    loop {
        let page = c
            .get(&format!(
                "/api/v1/namespaces/default/pods?limit=10&continue={}",
                urlencode(&token)
            ))
            .await;
        assert_eq!(page.status, 200, "{}", String::from_utf8_lossy(&page.body));
        let page = page.json();
        assert_eq!(
            rv(&page),
            at,
            "every page is served at the first page's revision"
        );
        for p in page["items"].as_array().unwrap() {
            names.push(p["metadata"]["name"].as_str().unwrap().to_string());
            assert!(
                rv(p) <= at,
                "an object newer than the list's revision leaked in"
            );
            assert!(p["metadata"]["labels"].get("x").is_none());
        }
        match page["metadata"]["continue"].as_str() {
            Some(t) => token = t.to_string(),
            None => break,
        }
    }
    let unique: BTreeSet<_> = names.iter().cloned().collect();
    assert_eq!(unique.len(), names.len(), "no duplicates across pages");
    assert_eq!(
        names.len(),
        25,
        "exactly the 25 pods that existed at the first page"
    );
    assert!(unique.contains("p-9") && !unique.contains("zz-late-0"));
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn watch_from_a_revision_delivers_every_change_once_in_order(backend: Backend) {
    let s = sim_on(backend, &["--nodes", "2"]).await;
    let c = Http::new(&s.url);
    let base = rv(&c.get("/api/v1/namespaces/default/pods").await.json());
    let mut w = c
        .watch(&format!(
            "/api/v1/namespaces/default/pods?watch=1&resourceVersion={base}"
        ))
        .await;
    // Writes race the watcher: creates, patches and deletes from three tasks.
    let writers: Vec<_> = (0..3)
        .map(|t| {
            let c = Http::new(&s.url);
            tokio::spawn(async move {
                let mut rvs = create_pods(&c, 20, &format!("w{t}")).await;
                for i in 0..20 {
                    let r = c
                        .patch(
                            &format!("/api/v1/namespaces/default/pods/w{t}-{i}"),
                            "application/strategic-merge-patch+json",
                            &json!({"metadata": {"labels": {"round": "2"}}}),
                        )
                        .await;
                    rvs.push(rv(&r.json()));
                }
                for i in 0..10 {
                    let r = c
                        .delete(&format!(
                            "/api/v1/namespaces/default/pods/w{t}-{i}?gracePeriodSeconds=0"
                        ))
                        .await;
                    assert_eq!(r.status, 200);
                }
                rvs
            })
        })
        .collect();
    let mut written = BTreeSet::new();
    for w in writers {
        written.extend(w.await.unwrap());
    }
    let mut seen = Vec::new();
    let mut deleted = 0;
    while seen.len() < written.len() + 30 {
        let e = w
            .next(Duration::from_secs(10))
            .await
            .expect("an event for every write");
        let kind = e["type"].as_str().unwrap().to_string();
        if kind == "DELETED" {
            deleted += 1;
        }
        seen.push(rv(&e["object"]));
    }
    assert_eq!(deleted, 30);
    assert!(
        seen.windows(2).all(|p| p[0] < p[1]),
        "events strictly in revision order"
    );
    assert!(seen.iter().all(|r| *r > base));
    assert!(
        written.iter().all(|r| seen.contains(r)),
        "every write's revision was delivered"
    );
    assert!(
        w.next(Duration::from_millis(300)).await.is_none(),
        "nothing extra"
    );
}

async fn filtered_watch_sees_objects_enter_and_leave_the_selection(backend: Backend) {
    let s = sim_on(backend, &[]).await;
    let c = Http::new(&s.url);
    create_pods(&c, 1, "f").await;
    let mut w = c.watch("/api/v1/namespaces/default/pods?watch=1&labelSelector=team%3Dblue&allowWatchBookmarks=true").await;
    let set = |v: &str| json!({"metadata": {"labels": {"team": v}}});
    c.patch(
        "/api/v1/namespaces/default/pods/f-0",
        "application/merge-patch+json",
        &set("blue"),
    )
    .await;
    c.patch(
        "/api/v1/namespaces/default/pods/f-0",
        "application/merge-patch+json",
        &json!({"metadata": {"annotations": {"a": "b"}}}),
    )
    .await;
    c.patch(
        "/api/v1/namespaces/default/pods/f-0",
        "application/merge-patch+json",
        &set("red"),
    )
    .await;
    let kinds: Vec<String> = [0, 1, 2].iter().map(|_| String::new()).collect();
    let mut got = Vec::new();
    for _ in kinds {
        got.push(
            w.next(Duration::from_secs(5)).await.unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(got, ["ADDED", "MODIFIED", "DELETED"]);
}

async fn streaming_list_sends_state_then_the_initial_events_end_bookmark(backend: Backend) {
    let s = sim_on(backend, &["--nodes", "3"]).await;
    let c = Http::new(&s.url);
    let mut w = c.watch("/api/v1/nodes?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true").await;
    for _ in 0..3 {
        assert_eq!(
            w.next(Duration::from_secs(5)).await.unwrap()["type"],
            "ADDED"
        );
    }
    let b = w.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(
        b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // Without bookmarks allowed the apiserver refuses a streaming list.
    let r = c
        .get("/api/v1/nodes?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan")
        .await;
    assert_eq!(r.status, 422);
}

async fn stale_writes_conflict(backend: Backend) {
    let s = sim_on(backend, &["--nodes", "1"]).await;
    let c = Http::new(&s.url);
    let node = c.get("/api/v1/nodes/node-1").await.json();
    let newer = c
        .patch(
            "/api/v1/nodes/node-1",
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"a": "1"}}}),
        )
        .await;
    assert_eq!(newer.status, 200);
    let mut stale = node.clone();
    stale["metadata"]["labels"]["b"] = "2".into();
    let r = c.put("/api/v1/nodes/node-1", &stale).await;
    assert_eq!(r.status, 409);
    assert_eq!(r.json()["reason"], "Conflict");
    // A patch pinned to an old resourceVersion conflicts too; the current one succeeds.
    let pinned = json!({"metadata": {"resourceVersion": node["metadata"]["resourceVersion"], "labels": {"c": "3"}}});
    assert_eq!(
        c.patch(
            "/api/v1/nodes/node-1",
            "application/merge-patch+json",
            &pinned
        )
        .await
        .status,
        409
    );
    let mut fresh = newer.json();
    fresh["metadata"]["labels"]["b"] = "2".into();
    let ok = c.put("/api/v1/nodes/node-1", &fresh).await;
    assert_eq!(ok.status, 200);
    assert!(rv(&ok.json()) > rv(&newer.json()));
    // Creating what exists is 409 AlreadyExists.
    let dup = c
        .post("/api/v1/nodes", &json!({"metadata": {"name": "node-1"}}))
        .await;
    assert_eq!(
        (dup.status.as_u16(), dup.json()["reason"].clone()),
        (409, json!("AlreadyExists"))
    );
}

async fn expired_continue_and_too_old_watch_get_410(backend: Backend) {
    let s = sim_on(backend, &["--history-window", "5"]).await;
    let c = Http::new(&s.url);
    create_pods(&c, 6, "e").await;
    let first = c
        .get("/api/v1/namespaces/default/pods?limit=2")
        .await
        .json();
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let old = rv(&first);
    create_pods(&c, 10, "later").await;
    let r = c
        .get(&format!(
            "/api/v1/namespaces/default/pods?limit=2&continue={}",
            urlencode(&token)
        ))
        .await;
    assert_eq!(r.status, 410);
    assert_eq!(r.json()["reason"], "Expired");
    let mut w = c
        .watch(&format!(
            "/api/v1/namespaces/default/pods?watch=1&resourceVersion={old}"
        ))
        .await;
    let e = w.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["code"], 410);
    assert!(
        w.next(Duration::from_secs(2)).await.is_none(),
        "the stream ends after the error"
    );
    let r = c
        .get(&format!(
            "/api/v1/namespaces/default/pods?resourceVersion={old}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(r.status, 410);
}

async fn patch_types_over_http(backend: Backend) {
    let s = sim_on(backend, &["--nodes", "1"]).await;
    let c = Http::new(&s.url);
    let heartbeat = json!({"status": {"$setElementOrder/conditions": [{"type": "MemoryPressure"}, {"type": "DiskPressure"}, {"type": "PIDPressure"}, {"type": "Ready"}],
        "conditions": [{"type": "Ready", "lastHeartbeatTime": "2026-11-22T00:00:00Z"}]}});
    let r = c
        .patch(
            "/api/v1/nodes/node-1/status",
            "application/strategic-merge-patch+json",
            &heartbeat,
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let conds = r.json()["status"]["conditions"].as_array().unwrap().clone();
    assert_eq!(conds.len(), 4);
    let ready = conds.iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(
        (ready["status"].clone(), ready["lastHeartbeatTime"].clone()),
        (json!("True"), json!("2026-11-22T00:00:00Z"))
    );
    let j = c
        .patch(
            "/api/v1/nodes/node-1",
            "application/json-patch+json",
            &json!([{"op": "add", "path": "/metadata/labels/zone", "value": "z9"}]),
        )
        .await;
    assert_eq!(j.json()["metadata"]["labels"]["zone"], "z9");
    let m = c
        .patch(
            "/api/v1/nodes/node-1",
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"zone": null}}}),
        )
        .await;
    assert!(m.json()["metadata"]["labels"].get("zone").is_none());
    // A spec change applies; kube-apiserver 1.20 keeps no `generation` on nodes.
    let g = c
        .patch(
            "/api/v1/nodes/node-1",
            "application/merge-patch+json",
            &json!({"spec": {"unschedulable": true}}),
        )
        .await
        .json();
    assert_eq!(g["spec"]["unschedulable"], true);
    assert!(g["metadata"].get("generation").is_none(), "{g}");
    let failed = c
        .patch(
            "/api/v1/nodes/node-1",
            "application/json-patch+json",
            &json!([{"op": "test", "path": "/metadata/name", "value": "x"}]),
        )
        .await;
    assert_eq!(failed.status, 422);
    let bad = c
        .send(
            http::Method::PATCH,
            "/api/v1/nodes/node-1",
            "application/merge-patch+json",
            "{nope",
        )
        .await;
    assert_eq!(bad.status, 400);
    let unknown = c
        .send(
            http::Method::PATCH,
            "/api/v1/nodes/node-1",
            "text/plain",
            "{}",
        )
        .await;
    assert_eq!(unknown.status, 415);
}

async fn bad_input_gets_a_status_naming_the_problem(backend: Backend) {
    let s = sim_on(backend, &["--max-request-body-bytes", "1000"]).await;
    let c = Http::new(&s.url);
    let cases = [
        ("/api/v1/widgets", 404u16),
        ("/api/v1/pods?labelSelector=a%20in%20b", 400),
        ("/api/v1/pods?fieldSelector=spec.unknown%3Dx", 400),
        ("/api/v1/pods?limit=ten", 400),
        ("/api/v1/pods?resourceVersionMatch=Exact", 422),
        ("/api/v1/pods?continue=%%%", 400),
        ("/api/v1/namespaces/default/pods/missing", 404),
    ];
    // No API group there: kube-apiserver's mux answers in plain text, not with a Status.
    let group = c.get("/apis/nope.io/v1/things").await;
    assert_eq!(group.status.as_u16(), 404);
    assert_eq!(String::from_utf8_lossy(&group.body), "404 page not found\n");
    for (path, code) in cases {
        let r = c.get(path).await;
        assert_eq!(
            r.status.as_u16(),
            code,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let s = r.json();
        assert_eq!(
            (s["kind"].clone(), s["code"].clone()),
            (json!("Status"), json!(code)),
            "{path}"
        );
        assert!(!s["message"].as_str().unwrap().is_empty());
    }
    let big = json!({"metadata": {"name": "big"}, "data": {"x": "y".repeat(2000)}});
    assert_eq!(
        c.post("/api/v1/namespaces/default/configmaps", &big)
            .await
            .status,
        413
    );
    let r = c
        .send(
            http::Method::POST,
            "/api/v1/namespaces/default/configmaps",
            "application/json",
            "[1,2",
        )
        .await;
    assert_eq!(r.status, 400);
    let r = c
        .post(
            "/api/v1/namespaces/default/configmaps",
            &json!({"metadata": {"name": "Not_Valid"}}),
        )
        .await;
    assert_eq!(r.status, 422);
    let r = c
        .post(
            "/api/v1/namespaces/nowhere/configmaps",
            &json!({"metadata": {"name": "x"}}),
        )
        .await;
    assert_eq!(r.status, 404);
}

async fn graceful_delete_of_a_bound_pod_then_removal(backend: Backend) {
    let s = sim_on(
        backend,
        &["--nodes", "1", "--kubelet-delete-delay", "300ms"],
    )
    .await;
    let c = Http::new(&s.url);
    create_pods(&c, 1, "g").await;
    let r = c.delete("/api/v1/namespaces/default/pods/g-0").await;
    assert_eq!(r.status, 200);
    assert!(r.json()["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        c.get("/api/v1/namespaces/default/pods/g-0").await.status,
        200,
        "still there while terminating"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while c.get("/api/v1/namespaces/default/pods/g-0").await.status != 404 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod never went away"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn namespaced_reads_see_only_their_namespace(backend: Backend) {
    let s = sim_on(
        backend,
        &["--nodes", "4", "--pods", "220", "--namespaces", "11"],
    )
    .await;
    let c = Http::new(&s.url);
    let mut total = 0;
    for ns in 1..=11 {
        let list = c
            .get(&format!("/api/v1/namespaces/ns-{ns}/pods"))
            .await
            .json();
        let items = list["items"].as_array().unwrap();
        assert!(
            items
                .iter()
                .all(|p| p["metadata"]["namespace"] == format!("ns-{ns}")),
            "ns-{ns} leaked others"
        );
        total += items.len();
    }
    assert_eq!(total, 220);
    // The same through a watch's initial state and a paged list.
    let mut w = c
        .watch("/api/v1/namespaces/ns-1/pods?watch=1&resourceVersion=0")
        .await;
    let mut n = 0;
    while let Some(e) = w.next(Duration::from_millis(500)).await {
        assert_eq!(e["object"]["metadata"]["namespace"], "ns-1");
        n += 1;
    }
    assert_eq!(n, 20);
    let page = c.get("/api/v1/namespaces/ns-1/pods?limit=15").await.json();
    assert_eq!(page["items"].as_array().unwrap().len(), 15);
    let rest = c
        .get(&format!(
            "/api/v1/namespaces/ns-1/pods?limit=15&continue={}",
            urlencode(page["metadata"]["continue"].as_str().unwrap())
        ))
        .await
        .json();
    assert_eq!(rest["items"].as_array().unwrap().len(), 5);
    assert!(rest["metadata"].get("continue").is_none());
}

on_both_stores!(storage_list_metrics_say_where_lists_were_served);
async fn storage_list_metrics_say_where_lists_were_served(store: Backend) {
    let s = sim_on(store, &["--nodes", "3"]).await;
    let c = Http::new(&s.url);
    c.get("/api/v1/nodes").await;
    c.get("/api/v1/nodes").await;
    c.get("/api/v1/nodes?resourceVersion=0").await;
    let m = String::from_utf8_lossy(&c.get("/metrics").await.body).to_string();
    let line = |name: &str| {
        m.lines()
            .find(|l| l.starts_with(name))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
    };
    // Two consistent LISTs read storage, after the watch cache's initial LIST at start; the
    // rv=0 one is served by the watch cache.
    assert_eq!(
        line("apiserver_storage_list_total{resource=\"nodes\"}").as_deref(),
        Some("3"),
        "{m}"
    );
    assert_eq!(
        line("apiserver_storage_list_returned_objects_total{resource=\"nodes\",storage=\"etcd\"}")
            .as_deref(),
        Some("6")
    );
    assert_eq!(line("apiserver_storage_list_returned_objects_total{resource=\"nodes\",storage=\"watchcache\"}").as_deref(), Some("3"));
}

/// As kube-apiserver with `--etcd-count-metric-poll-period`: 0 until the first count.
#[tokio::test]
async fn object_counts_are_zero_until_the_first_poll_period_ends() {
    let s = sim(&["--nodes", "3", "--etcd-count-metric-poll-period", "1s"]).await;
    let c = Http::new(&s.url);
    let nodes = || async {
        let m = String::from_utf8_lossy(&c.get("/metrics").await.body).to_string();
        m.lines()
            .find(|l| l.starts_with("apiserver_storage_objects{resource=\"nodes\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_eq!(nodes().await.as_deref(), Some("0"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while nodes().await.as_deref() != Some("3") {
        assert!(tokio::time::Instant::now() < deadline, "never counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Without the flag: counted at once.
    let live = sim(&["--nodes", "3"]).await;
    let m = String::from_utf8_lossy(&Http::new(&live.url).get("/metrics").await.body).to_string();
    assert!(
        m.contains("apiserver_storage_objects{resource=\"nodes\"} 3"),
        "{m}"
    );
}
