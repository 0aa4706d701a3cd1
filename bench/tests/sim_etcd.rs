//! What only the etcd store does: objects live in a real etcd under the
//! apiserver's keys with `resourceVersion` = the etcd mod revision, a
//! consistent LIST reads etcd (an object written behind the simulator's back
//! is in it at once), the watch cache follows etcd's watch, updates compare
//! the mod revision, the list metrics say which store served each LIST, reads
//! of a revision not reached yet get 504, and the test etcd itself behaves.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use common::{rv, sim_on, Backend, Http};
use etcd_client::Client;
use serde_json::{json, Value};
use std::time::Duration;

async fn etcd_value(client: &mut Client, key: &str) -> Option<(Value, u64)> {
    let resp = client.get(key, None).await.unwrap();
    resp.kvs().first().map(|kv| {
        (
            serde_json::from_slice(kv.value()).unwrap(),
            kv.mod_revision() as u64,
        )
    })
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn counter(metrics: &str, name: &str, resource: &str, storage: &str) -> u64 {
    let prefix = format!("{name}_total{{resource=\"{resource}\",storage=\"{storage}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn objects_live_in_etcd_and_the_cache_follows_its_watch() {
    let s = sim_on(Backend::Etcd, &["--nodes", "2"]).await;
    let mut etcd = Client::connect([s.etcd.as_ref().unwrap().url.as_str()], None)
        .await
        .unwrap();
    let c = Http::new(&s.url);

    seeded_objects_sit_under_the_apiservers_keys(&mut etcd, &c).await;
    let made_rev = a_create_gets_the_keys_mod_revision(&mut etcd, &c).await;
    let (sneaky, stale) =
        a_pod_written_behind_its_back_is_listed_and_watched(&mut etcd, &c, made_rev).await;
    updates_compare_the_mod_revision(&mut etcd, &c, &sneaky, &stale).await;
    a_delete_behind_its_back_shows_and_the_metrics_tell_the_paths_apart(&mut etcd, &c).await;
}

async fn seeded_objects_sit_under_the_apiservers_keys(etcd: &mut Client, c: &Http) {
    // Seeded objects are under the apiserver's keys, at their mod revision.
    let (node, node_rev) = etcd_value(etcd, "/registry/minions/node-1").await.unwrap();
    assert_eq!(node["metadata"]["name"], "node-1");
    assert!(
        node["metadata"].get("resourceVersion").is_none(),
        "etcd keeps no resourceVersion"
    );
    assert_eq!(rv(&c.get("/api/v1/nodes/node-1").await.json()), node_rev);
    assert!(
        etcd_value(etcd, "/registry/leases/kube-node-lease/node-1")
            .await
            .is_some(),
        "leases under /registry/leases"
    );
}

async fn a_create_gets_the_keys_mod_revision(etcd: &mut Client, c: &Http) -> u64 {
    // A create through the API: resourceVersion is the key's mod revision.
    let made = c
        .post(
            "/api/v1/namespaces/default/pods",
            &json!({"metadata": {"name": "api-made"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        )
        .await;
    assert_eq!(made.status, 201);
    let (_, made_rev) = etcd_value(etcd, "/registry/pods/default/api-made")
        .await
        .unwrap();
    assert_eq!(rv(&made.json()), made_rev);
    made_rev
}

/// Returns the pod as written to etcd and as a GET read it (stale after the next write).
async fn a_pod_written_behind_its_back_is_listed_and_watched(
    etcd: &mut Client,
    c: &Http,
    made_rev: u64,
) -> (Value, Value) {
    // Written behind the simulator's back: a consistent LIST reads etcd, so it is there at once.
    let mut w = c
        .watch(&format!(
            "/api/v1/namespaces/default/pods?watch=1&resourceVersion={made_rev}"
        ))
        .await;
    let sneaky = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sneaky", "namespace": "default", "uid": "u-1"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]}});
    let put = etcd
        .put("/registry/pods/default/sneaky", sneaky.to_string(), None)
        .await
        .unwrap();
    let put_rev = put.header().unwrap().revision() as u64;
    let list = c.get("/api/v1/namespaces/default/pods").await.json();
    assert!(names(&list).contains(&"sneaky".to_string()), "{list}");
    assert!(rv(&list) >= put_rev, "the list is at etcd's revision");
    let item = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["metadata"]["name"] == "sneaky")
        .unwrap();
    assert_eq!(
        rv(item),
        put_rev,
        "resourceVersion is the etcd mod revision"
    );
    let got = c.get("/api/v1/namespaces/default/pods/sneaky").await;
    assert_eq!((got.status.as_u16(), rv(&got.json())), (200, put_rev));

    // The watch cache follows etcd's watch: the watcher sees it, then a cache LIST has it.
    let e = w.next(Duration::from_secs(10)).await.expect("an event");
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("sneaky"))
    );
    assert_eq!(rv(&e["object"]), put_rev);
    let cached = c
        .get("/api/v1/namespaces/default/pods?resourceVersion=0")
        .await
        .json();
    assert!(names(&cached).contains(&"sneaky".to_string()));
    (sneaky, got.json())
}

async fn updates_compare_the_mod_revision(
    etcd: &mut Client,
    c: &Http,
    sneaky: &Value,
    stale: &Value,
) {
    // An update compares the mod revision: changed in etcd since it was read, a pinned PUT is 409.
    etcd.put("/registry/pods/default/sneaky", sneaky.to_string(), None)
        .await
        .unwrap();
    let r = c.put("/api/v1/namespaces/default/pods/sneaky", stale).await;
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
    // Unpinned, the update retries against the stored object and wins.
    let r = c
        .patch(
            "/api/v1/namespaces/default/pods/sneaky",
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"seen": "yes"}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let (stored, rev) = etcd_value(etcd, "/registry/pods/default/sneaky")
        .await
        .unwrap();
    assert_eq!(stored["metadata"]["labels"]["seen"], "yes");
    assert_eq!(rv(&r.json()), rev);
}

async fn a_delete_behind_its_back_shows_and_the_metrics_tell_the_paths_apart(
    etcd: &mut Client,
    c: &Http,
) {
    // Deleted behind its back: gone from a consistent GET at once.
    etcd.delete("/registry/pods/default/sneaky", None)
        .await
        .unwrap();
    assert_eq!(
        c.get("/api/v1/namespaces/default/pods/sneaky").await.status,
        404
    );

    // The metrics tell the two paths apart.
    let metrics = String::from_utf8_lossy(&c.get("/metrics").await.body).to_string();
    let fetched = "apiserver_storage_list_fetched_objects";
    assert!(counter(&metrics, fetched, "pods", "etcd") >= 2, "{metrics}");
    assert!(counter(&metrics, fetched, "pods", "watchcache") >= 2);
}

#[tokio::test]
async fn a_paged_list_reads_etcd_at_the_first_pages_revision() {
    let s = sim_on(
        Backend::Etcd,
        &["--nodes", "3", "--pods", "250", "--namespaces", "2"],
    )
    .await;
    let mut etcd = Client::connect([s.etcd.as_ref().unwrap().url.as_str()], None)
        .await
        .unwrap();
    let c = Http::new(&s.url);
    let first = c.get("/api/v1/pods?limit=100").await.json();
    let at = rv(&first);
    let mut seen = names(&first);
    // Written after the first page: not in later pages, which read etcd at `at`.
    etcd.put(
        "/registry/pods/ns-1/zzz-late",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "zzz-late", "namespace": "ns-1"}}).to_string(),
        None,
    )
    .await
    .unwrap();
    let mut token = first["metadata"]["continue"].as_str().unwrap().to_string();
    loop {
        let page = c
            .get(&format!(
                "/api/v1/pods?limit=100&continue={}",
                percent_encoding::utf8_percent_encode(&token, percent_encoding::NON_ALPHANUMERIC)
            ))
            .await
            .json();
        assert_eq!(rv(&page), at);
        seen.extend(names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(t) => token = t.to_string(),
            None => break,
        }
    }
    assert_eq!(seen.len(), 250);
    assert!(!seen.contains(&"zzz-late".to_string()));
    let now = c.get("/api/v1/pods").await.json();
    assert_eq!(names(&now).len(), 251);
}

#[tokio::test]
async fn reads_of_a_revision_not_reached_yet_time_out_with_504() {
    let s = sim_on(
        Backend::Etcd,
        &["--nodes", "1", "--watch-cache-wait-timeout", "300ms"],
    )
    .await;
    let c = Http::new(&s.url);
    let future = rv(&c.get("/api/v1/nodes").await.json()) + 1000;
    // From the cache: it waits for the revision, then gives up.
    let started = tokio::time::Instant::now();
    let r = c
        .get(&format!("/api/v1/nodes?resourceVersion={future}"))
        .await;
    assert_eq!(r.status, 504, "{}", String::from_utf8_lossy(&r.body));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("Too large resource version"));
    // From etcd at an exact revision: etcd refuses a future revision.
    let r = c
        .get(&format!(
            "/api/v1/nodes?resourceVersion={future}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(r.status, 504, "{}", String::from_utf8_lossy(&r.body));
    // A revision the cache has seen is served at once.
    let now = rv(&c.get("/api/v1/nodes").await.json());
    let r = c.get(&format!("/api/v1/nodes?resourceVersion={now}")).await;
    assert_eq!(r.status, 200);
}

#[test]
fn the_test_etcd_runs_on_its_own_ports_and_is_killed_on_drop() {
    let a = bench::sim::etcd_server::EtcdServer::start().unwrap();
    let b = bench::sim::etcd_server::EtcdServer::start().unwrap();
    assert!(a.url.starts_with("http://127.0.0.1:"), "{}", a.url);
    assert_ne!(a.url, b.url);
    let pid = a.pid();
    drop(a);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "etcd (pid {pid}) still runs"
    );
}

#[tokio::test]
async fn reads_at_a_compacted_revision_get_kube_apiservers_410s() {
    let s = sim_on(Backend::Etcd, &["--nodes", "3", "--history-window", "5"]).await;
    let c = Http::new(&s.url);
    let first = c.get("/api/v1/nodes?limit=1").await.json();
    let at = rv(&first);
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    for i in 0..12 {
        let r = c
            .patch(
                "/api/v1/nodes/node-1",
                "application/merge-patch+json",
                &json!({"metadata": {"labels": {"round": i.to_string()}}}),
            )
            .await;
        assert_eq!(r.status, 200);
    }
    let exact = c
        .get(&format!(
            "/api/v1/nodes?resourceVersion={at}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(
        exact.status,
        410,
        "{}",
        String::from_utf8_lossy(&exact.body)
    );
    assert_eq!(
        exact.json()["message"],
        "The resourceVersion for the provided list is too old."
    );
    let cont = c
        .get(&format!(
            "/api/v1/nodes?limit=1&continue={}",
            percent_encoding::utf8_percent_encode(&token, percent_encoding::NON_ALPHANUMERIC)
        ))
        .await;
    assert_eq!(cont.status, 410, "{}", String::from_utf8_lossy(&cont.body));
    // A token for the same place at the current revision, for a client that accepts an
    // inconsistent list: following it gives the rest of the nodes.
    let fresh = cont.json()["metadata"]["continue"]
        .as_str()
        .expect("410 carries a fresh continue token")
        .to_string();
    let rest = c
        .get(&format!(
            "/api/v1/nodes?continue={}",
            percent_encoding::utf8_percent_encode(&fresh, percent_encoding::NON_ALPHANUMERIC)
        ))
        .await;
    assert_eq!(rest.status, 200, "{}", String::from_utf8_lossy(&rest.body));
    assert_eq!(names(&rest.json()).len(), 2);
}

/// `--kube-version 1.37`: a consistent LIST is served from the watch cache, yet it is still
/// linearizable: the cache first waits until it has seen etcd's current revision, so what was
/// written to etcd behind the simulator's back just before is in it (KEP-2340).
#[tokio::test]
async fn on_1_37_a_consistent_list_from_the_cache_waits_for_etcds_revision() {
    let s = sim_on(
        Backend::Etcd,
        &["--kube-version", "1.37", "--nodes", "2", "--pods", "20"],
    )
    .await;
    let mut etcd = Client::connect([s.etcd.as_ref().unwrap().url.as_str()], None)
        .await
        .unwrap();
    let c = Http::new(&s.url);
    let lists = |m: &str, storage: &str| {
        let prefix = format!(
            "apiserver_storage_list_total{{group=\"\",resource=\"pods\",storage=\"{storage}\",index=\"\"}} "
        );
        m.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0.0, |v| v.trim().parse::<f64>().unwrap())
    };
    let before = String::from_utf8(c.get("/metrics").await.body.to_vec()).unwrap();
    const ROUNDS: usize = 20;
    for i in 0..ROUNDS {
        let name = format!("behind-{i}");
        let put = etcd
            .put(
                format!("/registry/pods/default/{name}"),
                json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": "default", "uid": format!("u-{i}")}})
                .to_string(),
                None,
            )
            .await
            .unwrap();
        let put_rev = put.header().unwrap().revision() as u64;
        let list = c.get("/api/v1/namespaces/default/pods").await.json();
        assert!(names(&list).contains(&name), "round {i}: {list}");
        assert!(rv(&list) >= put_rev, "round {i}");
    }
    let after = String::from_utf8(c.get("/metrics").await.body.to_vec()).unwrap();
    assert_eq!(
        lists(&after, "watchcache") - lists(&before, "watchcache"),
        ROUNDS as f64
    );
    assert_eq!(lists(&after, "etcd"), lists(&before, "etcd"));
}
