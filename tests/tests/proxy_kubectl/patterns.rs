//! What tollgate learned: /debug/patterns after a mixed load.

use super::*;

pub(crate) fn debug_patterns_after_a_mixed_load(client: Scheme) -> anyhow::Result<()> {
    const ROUNDS: usize = 8;
    let stack = Stack::start(client, &[])?;
    let names = pod_names(&stack.direct()?, "ns-1")?;
    let curl = match client {
        Scheme::Tls => stack.curl(Who::Token("alice-token"))?,
        Scheme::Http => stack.curl(Who::Anonymous)?,
    };

    // Interleaved: full LISTs of pods and nodes (consistent), a namespace's pods, the pods
    // of one node by field selector (consistent), single GETs and watch-cache LISTs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Kind {
        Pods,
        Nodes,
        NamespacePods,
        PodsOnNode,
        GetPod,
        PodsCached,
    }
    let mut requests: Vec<(&str, String, Option<String>)> = Vec::new();
    let mut kinds = Vec::new();
    for (round, pod) in names.iter().take(ROUNDS).enumerate() {
        for (kind, path) in [
            (Kind::Pods, "/api/v1/pods".to_string()),
            (
                Kind::PodsOnNode,
                format!(
                    "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-{}",
                    round + 1
                ),
            ),
            (Kind::Nodes, "/api/v1/nodes".to_string()),
            (Kind::GetPod, format!("/api/v1/namespaces/ns-1/pods/{pod}")),
            (
                Kind::NamespacePods,
                "/api/v1/namespaces/ns-2/pods".to_string(),
            ),
            (
                Kind::PodsOnNode,
                format!(
                    "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-{}",
                    round + 50
                ),
            ),
            (
                Kind::PodsCached,
                "/api/v1/pods?resourceVersion=0".to_string(),
            ),
        ] {
            requests.push(("GET", path, None));
            kinds.push(kind);
        }
    }
    let results = curl.batch(stack.proxy.dir(), &requests, &["Accept: application/json"])?;
    let mut sizes: BTreeMap<Kind, Vec<u64>> = BTreeMap::new();
    for (kind, (code, size)) in kinds.iter().zip(&results) {
        assert_eq!(*code, 200, "{kind:?}");
        sizes.entry(*kind).or_default().push(*size);
    }
    let avg = |k: Kind| {
        let v = &sizes[&k];
        v.iter().sum::<u64>() as f64 / v.len() as f64
    };

    let patterns: Vec<Value> = serde_json::from_str(&stack.proxy.admin_ok("/debug/patterns")?)?;
    let shown = || {
        patterns
            .iter()
            .map(|p| {
                format!(
                    "{} count={} bytesAvg={} predictedCostBytes={}",
                    p["pattern"], p["count"], p["bytesAvg"], p["predictedCostBytes"]
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let find = |verb: &str, resource: &str, scope: &str, consistency: Option<&str>, field: bool| {
        let found: Vec<(usize, &Value)> = patterns
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p["verb"] == verb
                    && p["resource"] == resource
                    && p["scope"] == scope
                    && consistency.is_none_or(|c| p["consistency"] == c)
                    && p["pattern"]
                        .as_str()
                        .is_some_and(|s| s.contains("spec.nodeName") == field)
            })
            .collect();
        anyhow::ensure!(
            found.len() == 1,
            "{} patterns for {verb} {resource} {scope} {consistency:?} field={field}:\n{}",
            found.len(),
            shown()
        );
        Ok(found[0])
    };
    let number = |p: &Value, field: &str| p[field].as_f64().unwrap_or(f64::NAN);
    let within = |learned: f64, actual: f64| (learned - actual).abs() <= 0.10 * actual;

    let checks = [
        (
            Kind::Pods,
            "list",
            "pods",
            "cluster",
            Some("consistent"),
            false,
        ),
        (
            Kind::Nodes,
            "list",
            "nodes",
            "cluster",
            Some("consistent"),
            false,
        ),
        (
            Kind::NamespacePods,
            "list",
            "pods",
            "namespace",
            Some("consistent"),
            false,
        ),
        (
            Kind::PodsOnNode,
            "list",
            "pods",
            "cluster",
            Some("consistent"),
            true,
        ),
        (
            Kind::PodsCached,
            "list",
            "pods",
            "cluster",
            Some("cache"),
            false,
        ),
        (Kind::GetPod, "get", "pods", "namespace", None, false),
    ];
    let mut ranks = BTreeMap::new();
    for (kind, verb, resource, scope, consistency, field) in checks {
        let (rank, p) = find(verb, resource, scope, consistency, field)?;
        ranks.insert(kind, rank);
        let n = sizes[&kind].len() as u64;
        assert_eq!(
            p["count"].as_u64(),
            Some(n),
            "{kind:?} count in\n{}",
            shown()
        );
        let (learned, actual) = (number(p, "bytesAvg"), avg(kind));
        assert!(
            within(learned, actual),
            "{kind:?}: learned bytesAvg {learned} vs actual average {actual} (over {n}):\n{}",
            shown()
        );
        eprintln!(
            "{kind:?}: {} learned {learned:.0} B, actual {actual:.0} B, predicted cost {:.0}",
            p["pattern"],
            number(p, "predictedCostBytes")
        );
    }

    // The heavy ones are named first; the field-selector LIST among them although its
    // responses are small: a consistent read with a selector reads every pod.
    let (_, on_node) = find("list", "pods", "cluster", Some("consistent"), true)?;
    let full_pods = avg(Kind::Pods);
    let predicted = number(on_node, "predictedCostBytes");
    assert!(
        avg(Kind::PodsOnNode) < 0.05 * full_pods,
        "the field-selector responses are small: {} vs {full_pods}",
        avg(Kind::PodsOnNode)
    );
    assert!(
        predicted >= 0.9 * full_pods,
        "LIST pods ?fieldSelector=spec.nodeName=X (consistent) predicted {predicted}, \
         less than a full pods LIST ({full_pods}):\n{}",
        shown()
    );
    assert_eq!(
        ranks[&Kind::Pods],
        0,
        "the full consistent pods LIST is the heaviest:\n{}",
        shown()
    );
    for light in [Kind::Nodes, Kind::NamespacePods, Kind::GetPod] {
        assert!(
            ranks[&Kind::PodsOnNode] < ranks[&light],
            "the field-selector LIST ranks above {light:?}:\n{}",
            shown()
        );
    }
    stack.still_running()
}

/// tollgate learns which store serves consistent LISTs from the apiserver's own
/// `apiserver_storage_list_total` (LISTs read from etcd): a simulator that reads them from etcd
/// (as before Kubernetes 1.31) and one that serves them from its watch cache
/// (`--consistent-reads-from-cache`), each scraped every second.
pub(crate) fn store_is_learned_from_storage_list_metrics(client: Scheme) -> anyhow::Result<()> {
    // Each time tollgate is configured to assume the other store, so only learning passes.
    for (sim_flag, want, assumed) in [
        (None, "etcd", "watchCache"),
        (Some("--consistent-reads-from-cache"), "watchCache", "etcd"),
    ] {
        let inputs = tempfile::tempdir()?;
        let config = inputs.path().join("tollgate.yaml");
        std::fs::write(
            &config,
            format!(
                "upstream:\n  metricsScrape: {{enabled: true, path: /metrics, intervalSeconds: 1}}\n\
                 patterns:\n  consistentStore: {assumed}\n"
            ),
        )?;
        let sim_extra: Vec<&str> = sim_flag.into_iter().collect();
        let stack = Stack::start_with(
            client,
            &sim_extra,
            &["--config".to_string(), config.display().to_string()],
        )?;
        let curl = stack.curl(Who::Anonymous)?;
        let list = ("GET", "/api/v1/namespaces/ns-1/pods".to_string(), None);
        let deadline = Instant::now() + Duration::from_secs(60);
        let learned = loop {
            // At least 5 consistent LISTs between two scrapes are the evidence tollgate needs.
            let results = curl.batch(stack.proxy.dir(), &vec![list.clone(); 6], &[])?;
            anyhow::ensure!(results.iter().all(|(code, _)| *code == 200), "{results:?}");
            let patterns: Vec<Value> =
                serde_json::from_str(&stack.proxy.admin_ok("/debug/patterns")?)?;
            let store = patterns
                .iter()
                .find(|p| {
                    p["verb"] == "list"
                        && p["resource"] == "pods"
                        && p["consistency"] == "consistent"
                })
                .and_then(|p| p["store"].as_str().map(str::to_string));
            if store.as_deref() == Some(want) || Instant::now() > deadline {
                break store;
            }
            std::thread::sleep(Duration::from_millis(300));
        };
        assert_eq!(
            learned.as_deref(),
            Some(want),
            "simulator flag {sim_flag:?}; tollgate log:\n{}",
            stack.proxy.log()
        );
    }
    Ok(())
}
