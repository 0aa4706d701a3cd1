//! Watches through tollgate: another client's changes, long watches in order.

use super::*;

pub(crate) fn watch_prints_changes_made_by_another_kubectl(client: Scheme) -> anyhow::Result<()> {
    let stack = Stack::start(client, &["--kubelet-delete-delay", "1s"])?;
    let users = stack.users()?;
    // The watcher is the first user; the writer the last (over TLS: a certificate user
    // watches what a token user changes).
    let (watcher_name, k) = &users[0];
    let (writer_name, writer) = &users[users.len() - 1];
    let ns2 = pod_names(k, "ns-2")?;
    let ns3 = pod_names(k, "ns-3")?;
    let pod = ns2[ns2.len() / 2].as_str();
    let elsewhere = ns3[0].as_str();

    let mut watcher = k.background(
        "120s",
        &[
            "get",
            "pods",
            "-n",
            "ns-2",
            "-w",
            "--output-watch-events",
            "--show-labels",
        ],
    )?;
    let event_of = |line: &str, event: &str, label: Option<&str>| {
        let c = columns(line);
        c.first() == Some(&event)
            && c.get(1) == Some(&pod)
            && label.is_none_or(|l| c.last().is_some_and(|ls| ls.split(',').any(|x| x == l)))
    };
    watcher.wait_for_line(WATCH_WAIT, &format!("ADDED {pod}"), |l| {
        event_of(l, "ADDED", None)
    })?;
    writer.ok(&["label", "pod", elsewhere, "-n", "ns-3", "watched=elsewhere"])?;
    writer.ok(&["label", "pod", pod, "-n", "ns-2", "watched=yes"])?;
    watcher.wait_for_line(
        WATCH_WAIT,
        &format!("{watcher_name} sees MODIFIED {pod} watched=yes by {writer_name}"),
        |l| event_of(l, "MODIFIED", Some("watched=yes")),
    )?;
    writer.ok(&["delete", "pod", pod, "-n", "ns-2", "--wait=false"])?;
    watcher.wait_for_line(WATCH_WAIT, &format!("DELETED {pod}"), |l| {
        event_of(l, "DELETED", None)
    })?;
    assert!(watcher.is_running(), "the watch is still open");
    let ns2: BTreeSet<&str> = ns2.iter().map(String::as_str).collect();
    for line in watcher.lines() {
        let name = columns(line).get(1).copied().unwrap_or("");
        assert!(
            ns2.contains(name) || name == "NAME",
            "`get pods -n ns-2 -w` printed a pod not in ns-2: {line}"
        );
    }
    drop(watcher);
    stack.still_running()
}

pub(crate) fn long_watch_sees_every_event_in_order(client: Scheme) -> anyhow::Result<()> {
    const CHANGES: usize = 200;
    let stack = Stack::start(client, &[])?;
    let users = stack.users()?;
    let (who, k) = &users[0];
    let names = pod_names(k, "ns-1")?;
    let per_ns = names.len();

    // Every pod of ns-1 as a row, then one row per change.
    let mut watcher = k.background(
        "300s",
        &[
            "get",
            "pods",
            "-n",
            "ns-1",
            "-w",
            "--no-headers",
            "-o",
            "custom-columns=NAME:.metadata.name,SEQ:.metadata.labels.seq,RV:.metadata.resourceVersion",
        ],
    )?;
    let mut rows = 0;
    watcher.wait_for_line(WATCH_WAIT, &format!("{per_ns} initial rows"), |_| {
        rows += 1;
        rows == per_ns
    })?;

    // 200 merge patches through tollgate, one after another on one connection, each to a
    // different pod (wrapping around), labelled with its sequence number.
    let requests: Vec<(&str, String, Option<String>)> = (1..=CHANGES)
        .map(|seq| {
            let pod = &names[(seq - 1) % names.len()];
            (
                "PATCH",
                format!("/api/v1/namespaces/ns-1/pods/{pod}"),
                Some(format!(r#"{{"metadata":{{"labels":{{"seq":"{seq}"}}}}}}"#)),
            )
        })
        .collect();
    let writer = match stack.client {
        Scheme::Tls => stack.curl(Who::Token("alice-token"))?,
        Scheme::Http => stack.curl(Who::Anonymous)?,
    };
    let started = Instant::now();
    let results = writer.batch(
        stack.proxy.dir(),
        &requests,
        &[
            "Content-Type: application/merge-patch+json",
            "Accept: application/json",
        ],
    )?;
    let codes: BTreeSet<u16> = results.iter().map(|r| r.0).collect();
    assert_eq!(codes, BTreeSet::from([200]), "every PATCH succeeded");

    // The watcher prints every one of them, in order, and nothing else.
    let mut seen: Vec<(String, usize, u64)> = Vec::new();
    let mut last_error = None;
    let r = watcher.wait_for_line(
        Duration::from_secs(60),
        &format!("{CHANGES} change rows"),
        |l| {
            let c = columns(l);
            let parsed = (|| {
                Some((
                    c.first()?.to_string(),
                    c.get(1)?.parse::<usize>().ok()?,
                    c.get(2)?.parse::<u64>().ok()?,
                ))
            })();
            match parsed {
                Some(row) => seen.push(row),
                None => last_error = Some(format!("an unexpected row: {l}")),
            }
            seen.len() == CHANGES || last_error.is_some()
        },
    );
    r.with_context(|| format!("{who}: {} change rows seen", seen.len()))?;
    if let Some(e) = last_error {
        anyhow::bail!("{who}: {e}");
    }
    let seqs: Vec<usize> = seen.iter().map(|r| r.1).collect();
    assert_eq!(
        seqs,
        (1..=CHANGES).collect::<Vec<_>>(),
        "{who}: in order, none lost"
    );
    for (seq, row) in seen.iter().enumerate() {
        assert_eq!(
            row.0,
            names[seq % names.len()],
            "{who}: the pod of change {}",
            seq + 1
        );
    }
    assert!(
        seen.windows(2).all(|w| w[0].2 < w[1].2),
        "{who}: resourceVersions increase"
    );
    assert!(watcher.is_running(), "the watch is still open");
    eprintln!(
        "{who}: {CHANGES} changes written and seen through tollgate in {:?}",
        started.elapsed()
    );
    drop(watcher);
    stack.still_running()
}
