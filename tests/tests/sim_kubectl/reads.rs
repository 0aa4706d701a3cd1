//! Reads: get nodes, pods across namespaces, field selectors.

use super::*;

pub(crate) fn get_nodes(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();

    let out = k.ok(&["get", "nodes"])?;
    let (header, rows) = table(&out)?;
    assert_eq!(header, ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]);
    assert_eq!(rows.len(), NODES, "`get nodes` rows:\n{out}");
    let names: BTreeSet<String> = rows.iter().map(|r| r[0].to_string()).collect();
    let expected: BTreeSet<String> = (1..=NODES).map(|i| format!("node-{i}")).collect();
    assert_eq!(names, expected, "node names");
    for row in &rows {
        assert_eq!(row.get(1), Some(&"Ready"), "STATUS of {row:?}");
    }

    // The same nodes as objects.
    let list = k.json(&["get", "nodes", "-o", "json"])?;
    let items = items(&list)?;
    assert_eq!(items.len(), NODES);
    assert!(items.iter().all(|n| n["kind"] == "Node"));
    let node7 = k.json(&["get", "node", "node-7", "-o", "json"])?;
    assert_eq!(str_at(&node7, "/metadata/name"), "node-7");
    assert!(
        !str_at(&node7, "/metadata/uid").is_empty(),
        "node-7 has a uid"
    );
    still_running(sim)
}

pub(crate) fn get_pods_all_namespaces(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();

    let out = k.ok(&["get", "pods", "-A"])?;
    let (header, rows) = table(&out)?;
    assert_eq!(
        header,
        ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    assert_eq!(rows.len(), PODS, "`get pods -A` rows");
    let unique: BTreeSet<(&str, &str)> = rows.iter().map(|r| (r[0], r[1])).collect();
    assert_eq!(unique.len(), PODS, "every pod listed once");
    let mut per_ns: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &rows {
        *per_ns.entry(r[0]).or_default() += 1;
    }
    let expected: BTreeMap<&str, usize> = [("ns-1", 1000), ("ns-2", 1000), ("ns-3", 1000)].into();
    assert_eq!(per_ns, expected, "pods per namespace");

    // One namespace lists exactly its own pods, and kubectl has nothing to complain about
    // (a namespaced LIST that returns other namespaces' pods makes kubectl print an error per pod).
    let ns2 = k.run(&["get", "pods", "-n", "ns-2", "--no-headers"])?;
    assert!(
        ns2.stderr.trim().is_empty(),
        "`get pods -n ns-2` stderr: {}",
        ns2.stderr.lines().take(5).collect::<Vec<_>>().join("\n")
    );
    let ns2_names: BTreeSet<&str> = ns2
        .stdout
        .lines()
        .filter_map(|l| columns(l).first().copied())
        .collect();
    let expected: BTreeSet<&str> = rows
        .iter()
        .filter(|r| r[0] == "ns-2")
        .map(|r| r[1])
        .collect();
    assert_eq!(ns2_names.len(), 1000);
    assert_eq!(ns2_names, expected, "`-n ns-2` and `-A` agree on ns-2");
    assert_eq!(pod_names(&k, "ns-3")?.len(), 1000, "`-n ns-3 -o json`");
    still_running(sim)
}

pub(crate) fn field_selector_spec_node_name(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();
    let selector = "spec.nodeName=node-7";

    let selected = k.json(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        selector,
        "-o",
        "json",
    ])?;
    let selected = items(&selected)?;
    // The seed spreads pods evenly over the nodes.
    assert_eq!(selected.len(), PODS / NODES, "pods on node-7");
    for p in selected {
        assert_eq!(
            str_at(p, "/spec/nodeName"),
            "node-7",
            "pod {} selected by {selector}",
            str_at(p, "/metadata/name")
        );
    }

    // The table lists the same pods, each on node-7.
    let out = k.ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        selector,
        "-o",
        "wide",
    ])?;
    let (header, rows) = table(&out)?;
    let node_col = header
        .iter()
        .position(|c| *c == "NODE")
        .context("no NODE column in -o wide")?;
    let table_keys: BTreeSet<String> = rows.iter().map(|r| format!("{}/{}", r[0], r[1])).collect();
    assert_eq!(table_keys, keys(selected), "table and JSON agree");
    for r in &rows {
        assert_eq!(r.get(node_col), Some(&"node-7"), "{r:?}");
    }

    // Exactly the pods a client-side filter of the full list finds.
    let all = k.json(&["get", "pods", "-A", "-o", "json"])?;
    let all = items(&all)?;
    assert_eq!(all.len(), PODS);
    let on_node7: Vec<Value> = all
        .iter()
        .filter(|p| str_at(p, "/spec/nodeName") == "node-7")
        .cloned()
        .collect();
    assert_eq!(
        keys(selected),
        keys(&on_node7),
        "server and client filters agree"
    );

    // And `!=` selects all the others.
    let others = k.ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        "spec.nodeName!=node-7",
        "--no-headers",
    ])?;
    assert_eq!(others.lines().count(), PODS - PODS / NODES);
    still_running(sim)
}
