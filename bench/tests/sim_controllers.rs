//! `--controllers` (on with `--kubelet`): what Cluster Loader 2's configs create runs, seen
//! through the API as a client sees it. Each test starts its own simulator (3 nodes, no
//! seeded pods) with the simulated kubelet and scheduler, creates workloads over HTTP, and
//! polls (with a deadline) until the status fields clients read say what the pods say.

#![allow(clippy::unwrap_used)]

mod common;

use common::{sim, Http};
use serde_json::{json, Value};
use std::future::Future;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);
const NS: &str = "/api/v1/namespaces/default";
const APPS: &str = "/apis/apps/v1/namespaces/default";

/// Polls `f` until it returns `Some`, failing after [`DEADLINE`] with `what` and the last
/// value seen.
async fn until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("{what}: not within {DEADLINE:?}; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn cluster() -> (bench::sim::RunningSim, Http) {
    let s = sim(&[
        "--kubelet",
        "--nodes",
        "3",
        "--pods",
        "0",
        "--kubelet-delete-delay",
        "100ms",
    ])
    .await;
    let c = Http::new(&s.url);
    (s, c)
}

fn pod_template(app: &str, image: &str) -> Value {
    json!({"metadata": {"labels": {"app": app}},
           "spec": {"containers": [{"name": "c", "image": image}]}})
}

/// The pods whose controller owner is `uid`.
async fn pods_of(c: &Http, uid: &str) -> Vec<Value> {
    let list = c.get(&format!("{NS}/pods")).await.json();
    (list["items"].as_array().cloned().unwrap_or_default())
        .into_iter()
        .filter(|p| {
            (p["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten())
            .any(|r| r["uid"] == uid && r["controller"] == true)
        })
        .collect()
}

fn names(items: &[Value]) -> Vec<String> {
    let mut n: Vec<String> = items
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect();
    n.sort();
    n
}

async fn deployment_settled(c: &Http, name: &str, replicas: i64) -> Result<Value, String> {
    let d = c.get(&format!("{APPS}/deployments/{name}")).await.json();
    let s = &d["status"];
    let done = s["observedGeneration"] == d["metadata"]["generation"]
        && s["replicas"] == replicas
        && s["updatedReplicas"] == replicas
        && s["readyReplicas"] == replicas
        && s["availableReplicas"] == replicas
        && s["unavailableReplicas"].is_null();
    done.then_some(d.clone()).ok_or_else(|| s.to_string())
}

async fn replica_sets(c: &Http, deployment_uid: &str) -> Vec<Value> {
    let list = c.get(&format!("{APPS}/replicasets")).await.json();
    (list["items"].as_array().cloned().unwrap_or_default())
        .into_iter()
        .filter(|rs| rs["metadata"]["ownerReferences"][0]["uid"] == deployment_uid)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_makes_a_replica_set_and_running_pods_and_rolls_a_new_template() {
    let (_s, c) = cluster().await;
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": pod_template("web", "nginx:1.19")}});
    let r = c.post(&format!("{APPS}/deployments"), &d).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let uid = r.json()["metadata"]["uid"].as_str().unwrap().to_string();
    let d = until("3 replicas available", || deployment_settled(&c, "web", 3)).await;
    let conds = d["status"]["conditions"].as_array().unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "Available" && c["status"] == "True"),
        "{conds:?}"
    );
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "Progressing" && c["reason"] == "NewReplicaSetAvailable"),
        "{conds:?}"
    );
    let sets = replica_sets(&c, &uid).await;
    assert_eq!(sets.len(), 1);
    let rs = &sets[0];
    let hash = rs["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(rs["metadata"]["name"], format!("web-{hash}"));
    assert_eq!(rs["status"]["readyReplicas"], 3);
    let pods = pods_of(&c, rs["metadata"]["uid"].as_str().unwrap()).await;
    assert_eq!(pods.len(), 3);
    for p in &pods {
        assert_eq!(p["status"]["phase"], "Running", "{p}");
        assert_eq!(p["metadata"]["labels"]["pod-template-hash"], hash.as_str());
        assert!(p["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with(&format!("web-{hash}-")));
        // What the real apiserver always serializes, though kwok's Stage does not write it.
        assert_eq!(p["status"]["containerStatuses"][0]["imageID"], "", "{p}");
        assert_eq!(
            p["status"]["containerStatuses"][0]["lastState"],
            json!({}),
            "{p}"
        );
    }

    // Scaled up and down through the scale subresource, as `kubectl scale` does.
    let r = c
        .patch(
            &format!("{APPS}/deployments/web/scale"),
            "application/merge-patch+json",
            &json!({"spec": {"replicas": 5}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    until("5 replicas", || deployment_settled(&c, "web", 5)).await;

    // A new template: a second ReplicaSet takes over, the first goes to 0.
    let r = c
        .patch(
            &format!("{APPS}/deployments/web"),
            "application/strategic-merge-patch+json",
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:1.20"}]}}}}),
        )
        .await;
    assert_eq!(r.status, 200);
    until("rolled to the new template", || async {
        let d = deployment_settled(&c, "web", 5).await?;
        let sets = replica_sets(&c, &uid).await;
        let old = sets
            .iter()
            .find(|rs| rs["metadata"]["labels"]["pod-template-hash"] == hash.as_str());
        let new = sets
            .iter()
            .find(|rs| rs["metadata"]["labels"]["pod-template-hash"] != hash.as_str());
        match (old, new) {
            (Some(o), Some(n))
                if o["spec"]["replicas"] == 0
                    && o["status"]["replicas"] == 0
                    && n["status"]["availableReplicas"] == 5
                    && n["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2" =>
            {
                Ok(d)
            }
            _ => Err(format!("{sets:?}")),
        }
    })
    .await;
    let images: Vec<Value> = (c.get(&format!("{NS}/pods")).await.json()["items"]
        .as_array()
        .cloned()
        .unwrap())
    .into_iter()
    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
    .map(|p| p["spec"]["containers"][0]["image"].clone())
    .collect();
    assert_eq!(images, vec![json!("nginx:1.20"); 5]);

    // Deleted (background): its ReplicaSets and their pods are collected.
    assert_eq!(
        c.delete(&format!("{APPS}/deployments/web")).await.status,
        200
    );
    until("ReplicaSets and pods collected", || async {
        let sets = c.get(&format!("{APPS}/replicasets")).await.json()["items"]
            .as_array()
            .unwrap()
            .len();
        let pods = c.get(&format!("{NS}/pods")).await.json()["items"]
            .as_array()
            .unwrap()
            .len();
        (sets == 0 && pods == 0)
            .then_some(())
            .ok_or(format!("{sets} sets, {pods} pods"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_runs_its_completions_parallelism_at_a_time() {
    let (_s, c) = cluster().await;
    let mut t = pod_template("batch", "busybox:1.32");
    t["spec"]["restartPolicy"] = "Never".into();
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "work"},
        "spec": {"completions": 4, "parallelism": 2, "template": t}});
    let r = c.post("/apis/batch/v1/namespaces/default/jobs", &job).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let uid = r.json()["metadata"]["uid"].as_str().unwrap().to_string();
    let most_active = std::cell::Cell::new(0usize);
    let j = until("the Job complete", || async {
        let pods = pods_of(&c, &uid).await;
        let active = pods
            .iter()
            .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
            .count();
        most_active.set(most_active.get().max(active));
        let j = c
            .get("/apis/batch/v1/namespaces/default/jobs/work")
            .await
            .json();
        let complete = (j["status"]["conditions"].as_array().into_iter().flatten())
            .any(|c| c["type"] == "Complete" && c["status"] == "True");
        complete.then_some(j.clone()).ok_or(j["status"].to_string())
    })
    .await;
    assert_eq!(j["status"]["succeeded"], 4);
    assert!(j["status"]["active"].is_null(), "{}", j["status"]);
    assert!(j["status"]["completionTime"].is_string());
    assert!(j["status"]["startTime"].is_string());
    let pods = pods_of(&c, &uid).await;
    assert_eq!(pods.len(), 4, "one pod per completion");
    assert!(pods.iter().all(|p| p["status"]["phase"] == "Succeeded"));
    let most = most_active.get();
    assert!(most <= 2, "parallelism 2, saw {most} at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_pods_are_ordered_and_scale_down_from_the_top() {
    let (_s, c) = cluster().await;
    let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": pod_template("db", "postgres:13")}});
    let mut w = c.watch(&format!("{NS}/pods?watch=true")).await;
    let r = c.post(&format!("{APPS}/statefulsets"), &sts).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let uid = r.json()["metadata"]["uid"].as_str().unwrap().to_string();
    until("3 ready", || async {
        let s = c.get(&format!("{APPS}/statefulsets/db")).await.json();
        (s["status"]["readyReplicas"] == 3
            && s["status"]["replicas"] == 3
            && s["status"]["observedGeneration"] == 1
            && s["status"]["currentRevision"] == s["status"]["updateRevision"])
            .then_some(())
            .ok_or(s["status"].to_string())
    })
    .await;
    // Created in order, each once the one before runs.
    let mut added = Vec::new();
    while added.len() < 3 {
        let e = w.next(DEADLINE).await.expect("pod events");
        if e["type"] == "ADDED" {
            added.push(
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    assert_eq!(added, ["db-0", "db-1", "db-2"]);
    let pods = pods_of(&c, &uid).await;
    assert_eq!(names(&pods), ["db-0", "db-1", "db-2"]);
    assert!(pods
        .iter()
        .all(|p| p["spec"]["hostname"] == p["metadata"]["name"] && p["spec"]["subdomain"] == "db"));

    let r = c
        .patch(
            &format!("{APPS}/statefulsets/db"),
            "application/merge-patch+json",
            &json!({"spec": {"replicas": 1}}),
        )
        .await;
    assert_eq!(r.status, 200);
    until("scaled to 1", || async {
        let pods = pods_of(&c, &uid).await;
        (names(&pods) == ["db-0"])
            .then_some(())
            .ok_or(format!("{:?}", names(&pods)))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonset_runs_one_pod_per_node_and_replication_controller_its_replicas() {
    let (_s, c) = cluster().await;
    let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": pod_template("agent", "agent:1")}});
    let r = c.post(&format!("{APPS}/daemonsets"), &ds).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let uid = r.json()["metadata"]["uid"].as_str().unwrap().to_string();
    until("a ready pod on each of the 3 nodes", || async {
        let d = c.get(&format!("{APPS}/daemonsets/agent")).await.json();
        let s = &d["status"];
        (s["desiredNumberScheduled"] == 3
            && s["numberReady"] == 3
            && s["numberAvailable"] == 3
            && s["updatedNumberScheduled"] == 3
            && s["numberUnavailable"].is_null())
        .then_some(())
        .ok_or(s.to_string())
    })
    .await;
    let mut nodes: Vec<String> = pods_of(&c, &uid)
        .await
        .iter()
        .map(|p| p["spec"]["nodeName"].as_str().unwrap().to_string())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["node-1", "node-2", "node-3"]);

    let rc = json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "legacy"},
        "spec": {"replicas": 2, "selector": {"app": "legacy"}, "template": pod_template("legacy", "legacy:1")}});
    let r = c.post(&format!("{NS}/replicationcontrollers"), &rc).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let rc_uid = r.json()["metadata"]["uid"].as_str().unwrap().to_string();
    until("2 ready", || async {
        let rc = c
            .get(&format!("{NS}/replicationcontrollers/legacy"))
            .await
            .json();
        (rc["status"]["readyReplicas"] == 2
            && rc["status"]["availableReplicas"] == 2
            && rc["status"]["observedGeneration"] == 1)
            .then_some(())
            .ok_or(rc["status"].to_string())
    })
    .await;
    assert_eq!(pods_of(&c, &rc_uid).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_waits_for_dependents_and_orphan_keeps_them() {
    let (_s, c) = cluster().await;
    for name in ["fg", "orph"] {
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}}, "template": pod_template(name, "x:1")}});
        assert_eq!(
            c.post(&format!("{APPS}/replicasets"), &rs).await.status,
            201
        );
    }
    for name in ["fg", "orph"] {
        until("2 ready", || async {
            let rs = c.get(&format!("{APPS}/replicasets/{name}")).await.json();
            (rs["status"]["readyReplicas"] == 2)
                .then_some(())
                .ok_or(rs["status"].to_string())
        })
        .await;
    }
    let orphan_uid = c.get(&format!("{APPS}/replicasets/orph")).await.json()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let fg_uid = c.get(&format!("{APPS}/replicasets/fg")).await.json()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();

    let r = c
        .send(
            http::Method::DELETE,
            &format!("{APPS}/replicasets/fg"),
            "application/json",
            json!({"propagationPolicy": "Foreground"}).to_string(),
        )
        .await;
    assert_eq!(r.status, 200);
    let marked = r.json();
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    assert_eq!(
        marked["metadata"]["finalizers"],
        json!(["foregroundDeletion"])
    );
    until("the owner gone after its pods", || async {
        let code = c.get(&format!("{APPS}/replicasets/fg")).await.status;
        let left = pods_of(&c, &fg_uid).await.len();
        if code == 404 {
            assert_eq!(left, 0, "owner gone before its pods");
            Ok(())
        } else {
            Err(format!("{code}, {left} pods"))
        }
    })
    .await;

    let r = c
        .delete(&format!("{APPS}/replicasets/orph?propagationPolicy=Orphan"))
        .await;
    assert_eq!(r.status, 200);
    until("the owner gone, its pods kept without it", || async {
        let code = c.get(&format!("{APPS}/replicasets/orph")).await.status;
        let list = c
            .get(&format!("{NS}/pods?labelSelector=app%3Dorph"))
            .await
            .json();
        let pods = list["items"].as_array().cloned().unwrap_or_default();
        let unowned = pods.iter().all(|p| {
            !p["metadata"]["ownerReferences"]
                .to_string()
                .contains(&orphan_uid)
        });
        (code == 404 && pods.len() == 2 && unowned)
            .then_some(())
            .ok_or(format!("{code} {pods:?}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_deletion_removes_what_the_controllers_made() {
    let (_s, c) = cluster().await;
    assert_eq!(
        c.post("/api/v1/namespaces", &json!({"metadata": {"name": "gone"}}))
            .await
            .status,
        201
    );
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "a"}}, "template": pod_template("a", "a:1")}});
    assert_eq!(
        c.post("/apis/apps/v1/namespaces/gone/deployments", &d)
            .await
            .status,
        201
    );
    until("2 pods running", || async {
        let l = c.get("/api/v1/namespaces/gone/pods").await.json();
        let running = (l["items"].as_array().into_iter().flatten())
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        (running == 2).then_some(()).ok_or(running.to_string())
    })
    .await;
    let r = c.delete("/api/v1/namespaces/gone").await;
    assert_eq!(r.status, 200);
    until("the namespace and its contents gone", || async {
        let ns = c.get("/api/v1/namespaces/gone").await.status;
        let pods = c.get("/api/v1/namespaces/gone/pods").await.json()["items"]
            .as_array()
            .map_or(0, Vec::len);
        let sets = c
            .get("/apis/apps/v1/namespaces/gone/replicasets")
            .await
            .json()["items"]
            .as_array()
            .map_or(0, Vec::len);
        (ns == 404 && pods == 0 && sets == 0)
            .then_some(())
            .ok_or(format!("{ns} {pods} {sets}"))
    })
    .await;
}

/// Without `--kubelet`, the simulator is an apiserver alone (what the benchmarks load):
/// nothing acts on a Deployment unless `--controllers` asks for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_are_off_without_kubelet_unless_asked() {
    for (flags, expect_rs) in [
        (&["--nodes", "1", "--pods", "0"][..], false),
        (&["--nodes", "1", "--pods", "0", "--controllers"][..], true),
    ] {
        let s = sim(flags).await;
        let c = Http::new(&s.url);
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}}, "template": pod_template("d", "d:1")}});
        assert_eq!(c.post(&format!("{APPS}/deployments"), &d).await.status, 201);
        if expect_rs {
            until("a ReplicaSet and a (pending) pod", || async {
                let sets = c.get(&format!("{APPS}/replicasets")).await.json()["items"]
                    .as_array()
                    .map_or(0, Vec::len);
                let pods = c.get(&format!("{NS}/pods")).await.json()["items"]
                    .as_array()
                    .map_or(0, Vec::len);
                (sets == 1 && pods == 1)
                    .then_some(())
                    .ok_or(format!("{sets} {pods}"))
            })
            .await;
        } else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let sets = c.get(&format!("{APPS}/replicasets")).await.json()["items"]
                .as_array()
                .map_or(0, Vec::len);
            assert_eq!(sets, 0);
        }
        s.stop().await;
    }
}
