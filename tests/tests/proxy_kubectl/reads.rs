//! Reads through tollgate: byte-identical to the upstream, paging with --chunk-size.

use super::*;

pub(crate) fn reads_match_the_upstream(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &[])?;
    let direct = stack.direct()?;
    let direct_nodes = direct.ok(&["get", "--raw", "/api/v1/nodes"])?;
    for (who, k) in stack.users()? {
        let out = k.ok(&["get", "nodes", "--no-headers"])?;
        let rows: Vec<Vec<&str>> = out.lines().map(columns).collect();
        assert_eq!(rows.len(), NODES, "{who}: `get nodes`");
        assert!(rows.iter().all(|r| r.get(1) == Some(&"Ready")), "{who}");

        let out = k.ok(&["get", "pods", "-A", "--no-headers"])?;
        let mut per_ns: BTreeMap<String, usize> = BTreeMap::new();
        for l in out.lines() {
            *per_ns
                .entry(columns(l).first().copied().unwrap_or("").to_string())
                .or_default() += 1;
        }
        let expected: BTreeMap<String, usize> = (1..=NAMESPACES)
            .map(|i| (format!("ns-{i}"), PODS / NAMESPACES))
            .collect();
        assert_eq!(per_ns, expected, "{who}: `get pods -A` per namespace");

        let node = k.json(&["get", "node", "node-7", "-o", "json"])?;
        assert_eq!(str_at(&node, "/metadata/name"), "node-7", "{who}");

        let selected = k.json(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=node-7",
            "-o",
            "json",
        ])?;
        let selected = items(&selected)?;
        assert_eq!(selected.len(), PODS / NODES, "{who}: pods on node-7");
        assert!(selected
            .iter()
            .all(|p| str_at(p, "/spec/nodeName") == "node-7"));

        // `get --raw`: byte for byte what the sim serves directly (nothing was written).
        let raw = k.ok(&["get", "--raw", "/api/v1/nodes"])?;
        assert!(
            raw == direct_nodes,
            "{who}: `get --raw /api/v1/nodes` through tollgate ({} bytes) differs from the \
             sim's own answer ({} bytes)",
            raw.len(),
            direct_nodes.len()
        );
        let page: Value = serde_json::from_str(&k.ok(&[
            "get",
            "--raw",
            "/api/v1/namespaces/ns-1/pods?limit=5",
        ])?)?;
        assert_eq!(items(&page)?.len(), 5, "{who}: ?limit=5");
        assert!(
            !str_at(&page, "/metadata/continue").is_empty(),
            "{who}: a continue token"
        );
        let version: Value = serde_json::from_str(&k.ok(&["get", "--raw", "/version"])?)?;
        assert!(
            !str_at(&version, "/gitVersion").is_empty(),
            "{who}: /version {version}"
        );
        let missing = k.fails(&["get", "--raw", "/api/v1/namespaces/ns-1/pods/nope"])?;
        assert!(missing.contains("NotFound"), "{who}: {missing}");
    }
    stack.still_running()
}

pub(crate) fn paging_with_chunk_size(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &[])?;
    let expected: BTreeSet<String> = stack
        .direct()?
        .ok(&["get", "pods", "-A", "-o", "name"])?
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(expected.len(), PODS);
    for (who, k) in stack.users()? {
        for chunk in ["250", "1000"] {
            let out = k.ok(&["get", "pods", "-A", "-o", "name", "--chunk-size", chunk])?;
            let names: Vec<&str> = out.lines().collect();
            let unique: BTreeSet<String> = names.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                names.len(),
                PODS,
                "{who}: --chunk-size {chunk}: every pod once"
            );
            assert_eq!(unique, expected, "{who}: --chunk-size {chunk}");
        }
        // Tables page too.
        let out = k.ok(&["get", "pods", "-A", "--no-headers", "--chunk-size", "700"])?;
        assert_eq!(
            out.lines().count(),
            PODS,
            "{who}: table with --chunk-size 700"
        );
    }
    // tollgate saw the pages: the continued ones as exact reads.
    let patterns: Vec<Value> = serde_json::from_str(&stack.proxy.admin_ok("/debug/patterns")?)?;
    let continued: u64 = patterns
        .iter()
        .filter(|p| p["verb"] == "list" && p["resource"] == "pods" && p["consistency"] == "exact")
        .filter_map(|p| p["count"].as_u64())
        .sum();
    let users = stack.users()?.len() as u64;
    // 3000/250 - 1 + 3000/1000 - 1 + 3000/700 (rounded up) - 1 continued pages per user.
    assert_eq!(
        continued,
        users * (11 + 2 + 4),
        "continued pages in {patterns:?}"
    );
    stack.still_running()
}
