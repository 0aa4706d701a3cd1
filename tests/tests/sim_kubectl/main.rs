//! kubectl against the simulated kube-apiserver (`tollgate-bench sim`), end to end: the real
//! binary on an ephemeral loopback port, the real kubectl through the kubeconfig the sim
//! writes, over plain HTTP and over TLS, and (`on_etcd::`) a representative set with
//! `--store etcd` on a real etcd. Each test starts its own simulator, seeded with 100
//! nodes and 3,000 pods over three namespaces, so the tests run in parallel and may write.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tests::{
    abbreviated, eventually, str_at, whoami, CertAuthority, KubeUser, Kubectl, Scheme, SimProcess,
    Store,
};

mod apply;
mod identity;
mod pods_run;
mod reads;
mod watches;
mod workloads;
mod writes;

use apply::*;
use identity::*;
use pods_run::*;
use reads::*;
use watches::*;
use workloads::*;
use writes::*;

const NODES: usize = 100;
const PODS: usize = 3000;
const NAMESPACES: usize = 3;

/// How long a test waits for a watcher to print an expected line.
const WATCH_WAIT: Duration = Duration::from_secs(30);

/// Runs each named test function once over plain HTTP and once over TLS:
/// `NAME::http` and `NAME::tls`.
macro_rules! over_http_and_tls {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn http() -> anyhow::Result<()> {
                super::$name(tests::Scheme::Http, tests::Store::Memory)
            }
            #[test]
            fn tls() -> anyhow::Result<()> {
                super::$name(tests::Scheme::Tls, tests::Store::Memory)
            }
        }
    )*};
}

/// Runs each named test function once more with `--store etcd` on a real etcd, over plain
/// HTTP: `on_etcd::NAME`.
macro_rules! on_etcd {
    ($($name:ident),* $(,)?) => {
        mod on_etcd {$(
            #[test]
            fn $name() -> anyhow::Result<()> {
                super::$name(tests::Scheme::Http, tests::Store::Etcd)
            }
        )*}
    };
}

over_http_and_tls!(
    get_nodes,
    get_pods_all_namespaces,
    field_selector_spec_node_name,
    label_pod,
    patch_node_merge,
    delete_pod,
    watch_prints_label_change,
    watch_prints_graceful_delete,
    identities,
    apply_workload_and_custom_resource,
    kubectl_run_reaches_running,
    kubectl_rolls_out_a_deployment,
);

/// Once, over plain HTTP: a Job's pod completes.
#[test]
fn job_pod_reaches_succeeded() -> anyhow::Result<()> {
    job_pod_succeeds(Scheme::Http, Store::Memory)
}

on_etcd!(
    get_pods_all_namespaces,
    field_selector_spec_node_name,
    label_pod,
    patch_node_merge,
    delete_pod,
    watch_prints_label_change,
    watch_prints_graceful_delete,
    apply_workload_and_custom_resource,
);

/// A simulator seeded with [`NODES`] nodes and [`PODS`] pods over [`NAMESPACES`] namespaces.
fn seeded(scheme: Scheme, store: Store, extra: &[&str]) -> anyhow::Result<SimProcess> {
    let (nodes, pods, namespaces) = (NODES.to_string(), PODS.to_string(), NAMESPACES.to_string());
    let mut args = vec![
        "--nodes",
        &nodes,
        "--pods",
        &pods,
        "--namespaces",
        &namespaces,
    ];
    args.extend_from_slice(scheme.sim_args());
    args.extend_from_slice(extra);
    let sim = SimProcess::start_on(store, &args)?;
    let prefix = format!("{}://127.0.0.1:", scheme.url_scheme());
    anyhow::ensure!(
        sim.url.starts_with(&prefix),
        "the simulator serves {}, expected {prefix}…",
        sim.url
    );
    Ok(sim)
}

/// Fails if the simulator died during the test (it must outlive every request).
fn still_running(mut sim: SimProcess) -> anyhow::Result<()> {
    anyhow::ensure!(
        sim.is_running(),
        "the simulator (pid {}) exited during the test; its log:\n{}",
        sim.pid(),
        sim.log()
    );
    Ok(())
}

/// The whitespace-separated columns of a kubectl table line.
fn columns(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// The header's columns and the rows of a kubectl table.
fn table(out: &str) -> anyhow::Result<(Vec<&str>, Vec<Vec<&str>>)> {
    let mut lines = out.lines();
    let header = lines.next().context("kubectl printed no table header")?;
    Ok((columns(header), lines.map(columns).collect()))
}

/// The `.items` of a kubectl `-o json` list.
fn items(list: &Value) -> anyhow::Result<&Vec<Value>> {
    list["items"]
        .as_array()
        .with_context(|| format!("no .items in {}", abbreviated(list)))
}

/// `namespace/name` of each item.
fn keys(list: &[Value]) -> BTreeSet<String> {
    list.iter()
        .map(|o| {
            format!(
                "{}/{}",
                str_at(o, "/metadata/namespace"),
                str_at(o, "/metadata/name")
            )
        })
        .collect()
}

/// The names of the pods of `namespace`, sorted; checks every item is in that namespace.
fn pod_names(k: &Kubectl, namespace: &str) -> anyhow::Result<Vec<String>> {
    let list = k.json(&["get", "pods", "-n", namespace, "-o", "json"])?;
    let items = items(&list)?;
    let mut names = Vec::new();
    for o in items {
        let ns = str_at(o, "/metadata/namespace");
        anyhow::ensure!(
            ns == namespace,
            "`get pods -n {namespace}` returned a pod of namespace {ns:?}: {}",
            str_at(o, "/metadata/name")
        );
        names.push(str_at(o, "/metadata/name").to_string());
    }
    names.sort();
    anyhow::ensure!(!names.is_empty(), "no pods in {namespace}");
    Ok(names)
}
