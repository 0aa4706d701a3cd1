//! Kubernetes 1.20's built-in kinds served generically (issue 19), over loopback HTTP:
//! discovery from the generated 1.20 documents, CRUD/watch of kinds the simulator has no
//! code for, the defaults clients rely on (generation, a Service's clusterIP, a namespace's
//! `default` ServiceAccount), the scale and status subresources, CRDs (served, validated,
//! and removed with their objects), and a generic LIST's modeled cost.
//! Behaviour tests run against the memory store and a real etcd (`NAME::memory`, `NAME::etcd`).

#![allow(clippy::unwrap_used)] // tests may unwrap

#[macro_use]
mod common;

use common::{rv, sim, sim_on, Backend, Http};
use serde_json::{json, Value};
use std::time::Duration;

on_both_stores!(
    deployments_are_served_with_generation_scale_and_status,
    services_get_a_cluster_ip_from_the_range,
    a_crd_serves_its_resource_until_deleted,
);

fn deployment(name: &str, app: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "labels": {"app": app}},
           "spec": {"selector": {"matchLabels": {"app": app}},
                    "template": {"metadata": {"labels": {"app": app}},
                                 "spec": {"containers": [{"name": "c", "image": "nginx:1.19"}]}}}})
}

fn ok(r: &common::Reply, code: u16) -> Value {
    assert_eq!(r.status, code, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[tokio::test]
async fn discovery_lists_what_1_20_lists() {
    let s = sim(&[]).await;
    let h = Http::new(&s.url);
    let apps = ok(&h.get("/apis/apps/v1").await, 200);
    let names: Vec<&str> = apps["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for want in [
        "deployments",
        "deployments/scale",
        "deployments/status",
        "statefulsets",
        "daemonsets",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    let deploy = apps["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "deployments")
        .unwrap();
    assert_eq!(deploy["shortNames"], json!(["deploy"]));
    assert_eq!(deploy["categories"], json!(["all"]));
    let groups = ok(&h.get("/apis").await, 200);
    let group_names: Vec<&str> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    for want in [
        "apps",
        "batch",
        "rbac.authorization.k8s.io",
        "apiextensions.k8s.io",
        "coordination.k8s.io",
    ] {
        assert!(group_names.contains(&want), "{want} in {group_names:?}");
    }
    // The simulator's own extra is still listed.
    let authn = ok(&h.get("/apis/authentication.k8s.io/v1").await, 200);
    assert!(authn["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "selfsubjectreviews"));
    // A verb discovery does not list has no route: services have no deletecollection.
    assert_eq!(
        h.delete("/api/v1/namespaces/default/services").await.status,
        405
    );
}

async fn deployments_are_served_with_generation_scale_and_status(backend: Backend) {
    let s = sim_on(backend, &[]).await;
    let h = Http::new(&s.url);
    let base = "/apis/apps/v1/namespaces/default/deployments";
    let created = ok(&h.post(base, &deployment("web", "web")).await, 201);
    assert_eq!(created["metadata"]["generation"], 1);
    assert!(created["metadata"]["uid"]
        .as_str()
        .is_some_and(|u| u.len() == 36));
    assert_eq!(created["spec"]["replicas"], 1);
    assert_eq!(created["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(
        created["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
        "IfNotPresent"
    );
    ok(&h.post(base, &deployment("db", "db")).await, 201);
    let start = rv(&created);
    let mut watch = h
        .watch(&format!("{base}?watch=1&resourceVersion={start}"))
        .await;

    // Label selectors and field selectors on a kind with no code of its own.
    let web = ok(
        &h.get(&format!("{base}?labelSelector=app%3Dweb")).await,
        200,
    );
    assert_eq!(web["kind"], "DeploymentList");
    assert_eq!(web["items"].as_array().unwrap().len(), 1);
    let db = ok(
        &h.get(&format!("{base}?fieldSelector=metadata.name%3Ddb"))
            .await,
        200,
    );
    assert_eq!(db["items"][0]["metadata"]["name"], "db");
    let page = ok(&h.get(&format!("{base}?limit=1")).await, 200);
    assert!(page["metadata"]["continue"].as_str().is_some());

    // Scale: reads and writes spec.replicas, bumping the generation.
    let scale = ok(&h.get(&format!("{base}/web/scale")).await, 200);
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 1);
    assert_eq!(scale["status"]["selector"], "app=web");
    let put = json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
                     "metadata": {"name": "web", "namespace": "default"}, "spec": {"replicas": 3}});
    assert_eq!(
        ok(&h.put(&format!("{base}/web/scale"), &put).await, 200)["spec"]["replicas"],
        3
    );
    let got = ok(&h.get(&format!("{base}/web")).await, 200);
    assert_eq!(got["spec"]["replicas"], 3);
    assert_eq!(got["metadata"]["generation"], 2);

    // Status: a status write leaves the spec and the generation alone; a spec write bumps it.
    let mut st = got.clone();
    st["status"] = json!({"replicas": 3, "readyReplicas": 2});
    let after = ok(&h.put(&format!("{base}/web/status"), &st).await, 200);
    assert_eq!(after["status"]["readyReplicas"], 2);
    assert_eq!(after["metadata"]["generation"], 2);
    let patched = ok(
        &h.patch(
            &format!("{base}/web"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"x": "y"}}}),
        )
        .await,
        200,
    );
    assert_eq!(
        patched["metadata"]["generation"], 2,
        "labels are not the spec"
    );
    assert_eq!(
        patched["status"]["readyReplicas"], 2,
        "a main-resource write keeps the status"
    );
    let bumped = ok(
        &h.patch(
            &format!("{base}/web"),
            "application/json-patch+json",
            &json!([{"op": "replace", "path": "/spec/replicas", "value": 5}]),
        )
        .await,
        200,
    );
    assert_eq!(bumped["metadata"]["generation"], 3);
    // A stale resourceVersion is 409, as for the six original kinds.
    let mut stale = got.clone();
    stale["spec"]["replicas"] = 9.into();
    assert_eq!(h.put(&format!("{base}/web"), &stale).await.status, 409);

    assert_eq!(h.delete(&format!("{base}/db")).await.status, 200);
    assert_eq!(h.get(&format!("{base}/db")).await.status, 404);
    let gone = ok(
        &h.delete(&format!("{base}?labelSelector=app%3Dweb")).await,
        200,
    );
    assert_eq!(gone["items"].as_array().unwrap().len(), 1);
    assert_eq!(ok(&h.get(base).await, 200)["items"], json!([]));

    // The watch saw every change in order: MODIFIED × 4 of web (scale, status, 2 patches), then the deletes.
    let mut seen = Vec::new();
    while let Some(e) = watch.next(Duration::from_secs(5)).await {
        seen.push(format!(
            "{} {}",
            e["type"].as_str().unwrap(),
            e["object"]["metadata"]["name"].as_str().unwrap()
        ));
        if seen.len() == 7 {
            break;
        }
    }
    assert_eq!(
        seen,
        [
            "ADDED db",
            "MODIFIED web",
            "MODIFIED web",
            "MODIFIED web",
            "MODIFIED web",
            "DELETED db",
            "DELETED web"
        ]
    );
}

async fn services_get_a_cluster_ip_from_the_range(backend: Backend) {
    let s = sim_on(backend, &[]).await;
    let h = Http::new(&s.url);
    let base = "/api/v1/namespaces/default/services";
    let svc = |name: &str, ip: Option<&str>| {
        let mut v = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                           "spec": {"ports": [{"port": 80}], "selector": {"app": name}}});
        if let Some(ip) = ip {
            v["spec"]["clusterIP"] = ip.into();
        }
        v
    };
    let a = ok(&h.post(base, &svc("a", None)).await, 201);
    let b = ok(&h.post(base, &svc("b", None)).await, 201);
    let (ia, ib) = (
        a["spec"]["clusterIP"].as_str().unwrap(),
        b["spec"]["clusterIP"].as_str().unwrap(),
    );
    assert!(
        ia.starts_with("10.96.") && ib.starts_with("10.96."),
        "{ia} {ib}"
    );
    assert_ne!(ia, ib);
    assert_eq!(a["spec"]["clusterIPs"], json!([ia]));
    assert_eq!(a["spec"]["ports"][0]["targetPort"], 80);
    assert!(
        a["metadata"].get("generation").is_none(),
        "services do not track it in 1.20"
    );
    let headless = ok(&h.post(base, &svc("h", Some("None"))).await, 201);
    assert_eq!(headless["spec"]["clusterIP"], "None");
    // An address in use is refused.
    assert_eq!(h.post(base, &svc("c", Some(ia))).await.status, 422);
    // An update without clusterIP keeps the allocated one.
    let mut upd = a.clone();
    upd["spec"].as_object_mut().unwrap().remove("clusterIP");
    upd["spec"].as_object_mut().unwrap().remove("clusterIPs");
    assert_eq!(
        ok(&h.put(&format!("{base}/a"), &upd).await, 200)["spec"]["clusterIP"],
        ia
    );

    // A new namespace gets its `default` ServiceAccount.
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}});
    ok(&h.post("/api/v1/namespaces", &ns).await, 201);
    let sa = ok(
        &h.get("/api/v1/namespaces/team/serviceaccounts/default")
            .await,
        200,
    );
    assert_eq!(sa["kind"], "ServiceAccount");

    // Deleting the namespace gives its Services' addresses back.
    let team = "/api/v1/namespaces/team/services";
    let t = ok(&h.post(team, &svc("t", None)).await, 201);
    let it = t["spec"]["clusterIP"].as_str().unwrap().to_string();
    assert_eq!(h.post(base, &svc("d", Some(&it))).await.status, 422);
    assert!(h
        .delete("/api/v1/namespaces/team")
        .await
        .status
        .is_success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while h.get("/api/v1/namespaces/team").await.status != 404 {
        assert!(
            std::time::Instant::now() < deadline,
            "the namespace is still there"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        ok(&h.post(base, &svc("d", Some(&it))).await, 201)["spec"]["clusterIP"],
        it
    );
}

/// Creates the widgets CRD (201) through `h`: the created CRD.
async fn create_widget_crd(h: &Http) -> Value {
    ok(
        &h.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &widget_crd(),
        )
        .await,
        201,
    )
}

fn widget_crd() -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                    "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object", "required": ["size"],
                                               "properties": {"size": {"type": "integer"}, "color": {"type": "string"}}}}}}}]}})
}

fn widget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})
}

async fn a_crd_serves_its_resource_until_deleted(backend: Backend) {
    let s = sim_on(backend, &[]).await;
    let h = Http::new(&s.url);
    let base = "/apis/example.com/v1/namespaces/default/widgets";
    assert_eq!(h.get(base).await.status, 404);
    let crd = create_widget_crd(&h).await;
    assert_eq!(crd["spec"]["names"]["listKind"], "WidgetList");
    let established = ok(
        &h.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
            .await,
        200,
    );
    assert_eq!(
        established["status"]["conditions"][1]["type"],
        "Established"
    );
    let disc = ok(&h.get("/apis/example.com/v1").await, 200);
    assert_eq!(disc["resources"][0]["name"], "widgets");
    assert_eq!(disc["resources"][0]["shortNames"], json!(["wd"]));
    assert_eq!(disc["resources"][1]["name"], "widgets/status");
    let groups = ok(&h.get("/apis").await, 200);
    assert!(groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["name"] == "example.com"));

    // The schema: types and required fields checked, unknown fields pruned.
    let w = ok(
        &h.post(base, &widget("w1", json!({"size": 3, "extra": true})))
            .await,
        201,
    );
    assert_eq!(w["spec"], json!({"size": 3}));
    assert_eq!(w["metadata"]["generation"], 1);
    let bad = h.post(base, &widget("w2", json!({"size": "big"}))).await;
    assert_eq!(bad.status, 422);
    assert_eq!(
        bad.json()["message"],
        "Widget.example.com \"w2\" is invalid: spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\""
    );
    let missing = h.post(base, &widget("w3", json!({"color": "red"}))).await;
    assert_eq!(missing.status, 422);
    assert_eq!(missing.json()["details"]["causes"][0]["field"], "spec.size");
    let patched = ok(
        &h.patch(
            &format!("{base}/w1"),
            "application/merge-patch+json",
            &json!({"spec": {"size": 4}}),
        )
        .await,
        200,
    );
    assert_eq!(patched["metadata"]["generation"], 2);

    // Deleting the CRD deletes its objects (a watcher sees them go) and the resource.
    let mut watch = h
        .watch(&format!("{base}?watch=1&resourceVersion={}", rv(&patched)))
        .await;
    ok(
        &h.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
            .await,
        200,
    );
    let e = watch
        .next(Duration::from_secs(5))
        .await
        .expect("a DELETED event");
    assert_eq!(e["type"], "DELETED");
    assert_eq!(e["object"]["metadata"]["name"], "w1");
    assert_eq!(h.get(base).await.status, 404);
    assert_eq!(h.get("/apis/example.com/v1").await.status, 404);
    // Created again, it starts empty.
    create_widget_crd(&h).await;
    assert_eq!(ok(&h.get(base).await, 200)["items"], json!([]));
}

#[tokio::test]
async fn a_generic_list_costs_in_proportion_to_its_size() {
    // The charge is read from the modeled CPU seconds, so the machine's speed does not matter.
    let s = sim(&["--cost-model", "modeled"]).await;
    let h = Http::new(&s.url);
    for ns in ["small", "big"] {
        let v = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        ok(&h.post("/api/v1/namespaces", &v).await, 201);
    }
    let filler = "x".repeat(4000);
    for (ns, n) in [("small", 20), ("big", 200)] {
        for i in 0..n {
            let v = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("s{i}")},
                           "stringData": {"k": filler}});
            ok(
                &h.post(&format!("/api/v1/namespaces/{ns}/secrets"), &v)
                    .await,
                201,
            );
        }
    }
    let cpu = |text: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("tollgate_sim_virtual_cpu_seconds_total{")
                    && l.contains("component=\"apiserver\"")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .sum()
    };
    let metrics = || async { String::from_utf8(h.get("/metrics").await.body.to_vec()).unwrap() };
    let mut charged = Vec::new();
    for ns in ["small", "big"] {
        let before = cpu(&metrics().await);
        let list = ok(
            &h.get(&format!(
                "/api/v1/namespaces/{ns}/secrets?resourceVersion=0"
            ))
            .await,
            200,
        );
        let after = cpu(&metrics().await);
        assert!(!list["items"].as_array().unwrap().is_empty());
        charged.push(after - before);
    }
    let (small, big) = (charged[0], charged[1]);
    assert!(small > 0.0, "a LIST of 20 secrets costs something: {small}");
    // Ten times the objects and bytes: several times the CPU (a fixed part per request,
    // and the /metrics scrapes, keep it from exactly 10).
    assert!(
        big > 5.0 * small,
        "200 secrets {big:.4}s vs 20 secrets {small:.4}s"
    );
}

/// On etcd a CRD outlives the simulator: one started later on the same etcd serves its
/// resource again, with the objects stored under it.
#[tokio::test]
async fn a_restart_on_etcd_serves_the_stored_crds_and_their_objects() {
    let first = sim_on(Backend::Etcd, &["--nodes", "1", "--pods", "0"]).await;
    let etcd_url = first.etcd.as_ref().expect("an etcd").url.clone();
    let h = Http::new(&first.url);
    let base = "/apis/example.com/v1/namespaces/default/widgets";
    create_widget_crd(&h).await;
    ok(
        &h.post(base, &widget("kept", json!({"size": 7}))).await,
        201,
    );
    let common::StoreSim { sim: s1, etcd } = first;
    s1.stop().await;

    let second = sim(&[
        "--store",
        "etcd",
        "--etcd-endpoints",
        &etcd_url,
        "--nodes",
        "1",
        "--pods",
        "0",
    ])
    .await;
    let h = Http::new(&second.url);
    let kept = ok(&h.get(&format!("{base}/kept")).await, 200);
    assert_eq!(kept["spec"]["size"], 7);
    let disc = ok(&h.get("/apis/example.com/v1").await, 200);
    assert_eq!(disc["resources"][0]["name"], "widgets");
    second.stop().await;
    drop(etcd);
}
