//! Watches: `kubectl get -w` prints what another kubectl changes.

use super::*;

pub(crate) fn watch_prints_label_change(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();
    let ns2 = pod_names(&k, "ns-2")?;
    let ns3 = pod_names(&k, "ns-3")?;
    let pod = ns2[ns2.len() / 2].as_str();
    let elsewhere = ns3[0].as_str();

    let mut watcher = k.background("60s", &["get", "pods", "-n", "ns-2", "-w", "--show-labels"])?;
    let first = watcher.wait_for_line(WATCH_WAIT, &format!("the row of {pod}"), |l| {
        columns(l).first() == Some(&pod)
    })?;
    assert!(!first.contains("watched="), "{first}");

    // A change in another namespace, then the one watched: the watcher prints the second
    // (and, as events are ordered, would have printed the first before it if it leaked).
    k.ok(&["label", "pod", elsewhere, "-n", "ns-3", "watched=elsewhere"])?;
    k.ok(&["label", "pod", pod, "-n", "ns-2", "watched=yes"])?;
    watcher.wait_for_line(WATCH_WAIT, &format!("{pod} with watched=yes"), |l| {
        let c = columns(l);
        c.first() == Some(&pod)
            && c.last()
                .is_some_and(|labels| labels.split(',').any(|l| l == "watched=yes"))
    })?;
    assert!(watcher.is_running(), "the watch is still open");

    let ns2: BTreeSet<&str> = ns2.iter().map(String::as_str).collect();
    for line in watcher.lines().iter().skip(1) {
        let name = columns(line).first().copied().unwrap_or("");
        assert!(
            ns2.contains(name),
            "`get pods -n ns-2 -w` printed a pod that is not in ns-2: {line}"
        );
    }
    still_running(sim)
}

pub(crate) fn watch_prints_graceful_delete(scheme: Scheme, store: Store) -> anyhow::Result<()> {
    let sim = seeded(scheme, store, &[])?;
    let k = sim.kubectl();
    let names = pod_names(&k, "ns-1")?;
    let pod = names[names.len() - 1].as_str();
    let event_of = |line: &str, event: &str, status: Option<&str>| {
        let c = columns(line);
        c.first() == Some(&event)
            && c.get(1) == Some(&pod)
            && status.is_none_or(|s| c.get(3) == Some(&s))
    };

    let mut watcher = k.background(
        "60s",
        &["get", "pods", "-n", "ns-1", "-w", "--output-watch-events"],
    )?;
    watcher.wait_for_line(WATCH_WAIT, &format!("ADDED {pod}"), |l| {
        event_of(l, "ADDED", None)
    })?;

    k.ok(&["delete", "pod", pod, "-n", "ns-1", "--wait=false"])?;
    watcher.wait_for_line(WATCH_WAIT, &format!("MODIFIED {pod} Terminating"), |l| {
        event_of(l, "MODIFIED", Some("Terminating"))
    })?;
    watcher.wait_for_line(WATCH_WAIT, &format!("DELETED {pod}"), |l| {
        event_of(l, "DELETED", None)
    })?;
    let err = k.fails(&["get", "pod", pod, "-n", "ns-1"])?;
    assert!(err.contains("(NotFound)"), "{err}");
    still_running(sim)
}
