//! Which store serves a consistent LIST (issue 33): 1.20 reads it from etcd; the current release
//! serves it from the watch cache (1.31+, once etcd's progress notifications confirm the cache
//! is fresh). tollgate learns which from the apiserver's `apiserver_storage_list_total` (LISTs
//! that reached etcd) against the consistent LISTs it forwarded (`proxy/src/scrape.rs`), and
//! prices the pattern by it (`store` in `/debug/patterns`). Checked on both versions: what the
//! apiserver did (its own counter) and what tollgate concluded.
//!
//! Before any learning, tollgate's prior follows the release its `/version` names
//! (`patterns.consistentStore: auto`): the first consistent LIST is priced as a watch-cache read
//! on the current release and as an etcd read on 1.20; an exact-revision LIST as an etcd read on
//! both (`proxy/src/predict/release.rs` says why).

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tests::{KubeVersion, Kubectl, RealApiserver, TollgateProcess};

use super::stack::Stack;
use super::Http;

/// Consistent LISTs sent per round (tollgate judges a resource after 5).
const LISTS: usize = 8;
/// How long tollgate may take to judge (it scrapes every second here).
const JUDGE_WAIT: Duration = Duration::from_secs(60);

/// tollgate in front of `kube` with the configuration file `yaml`, and a client of it with a
/// user's certificate.
fn tollgate_with(
    kube: &RealApiserver,
    dir: &std::path::Path,
    yaml: &str,
) -> anyhow::Result<(TollgateProcess, Http)> {
    let config = dir.join("tollgate.yaml");
    std::fs::write(&config, yaml)?;
    let mut options = Stack::tollgate_options(kube)?;
    options
        .args
        .extend(["--config".into(), config.display().to_string()]);
    let tollgate = TollgateProcess::start(&options)?;
    let ca = tollgate.serving_ca_file()?.context("tollgate serves TLS")?;
    let via = Http::new(&tollgate.url, dir)
        .with_cacert(ca)
        .with_cert(kube.file("KUBE_USER_CERT")?, kube.file("KUBE_USER_KEY")?);
    Ok((tollgate, via))
}

per_version!(
    tollgate_learns_which_store_serves_consistent_lists,
    the_first_lists_are_priced_by_the_release_before_any_learning
);

fn the_first_lists_are_priced_by_the_release_before_any_learning(
    version: KubeVersion,
) -> anyhow::Result<()> {
    let kube = RealApiserver::start_version(version, &[])?;
    let inputs = tempfile::tempdir()?;
    // No scrape: nothing can be learned, only the release decides.
    let (tollgate, via) = tollgate_with(
        &kube,
        inputs.path(),
        "upstream:\n  metricsScrape:\n    enabled: false\n",
    )?;
    let admin = kube.kubectl()?;

    // tollgate reads /version at start: wait for it, then send the first requests.
    let deadline = Instant::now() + Duration::from_secs(30);
    let minor = loop {
        let metrics = tollgate.admin_ok("/metrics")?;
        let minor = kubeio::promtext::first(&metrics, "tollgate_upstream_minor_version");
        if let Some(m) = minor.filter(|m| *m > 0.0) {
            break m;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "tollgate read no release from {}'s /version; its log:\n{}",
            kube.git_version,
            tollgate.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    anyhow::ensure!(
        minor == f64::from(kube.minor()?),
        "tollgate says minor {minor}, the apiserver is {}",
        kube.git_version
    );

    let before = etcd_lists(&admin, "pods")?;
    let first = via
        .get("/api/v1/pods")?
        .expect(200, "consistent LIST of pods")?
        .json()?;
    let rv = first["metadata"]["resourceVersion"]
        .as_str()
        .context("the LIST's resourceVersion")?
        .to_string();
    let after_consistent = etcd_lists(&admin, "pods")?;
    via.get(&format!(
        "/api/v1/pods?resourceVersion={rv}&resourceVersionMatch=Exact"
    ))?
    .expect(200, "exact-revision LIST of pods")?;
    let after_exact = etcd_lists(&admin, "pods")?;
    let grew = |a: Option<f64>, b: Option<f64>| b.unwrap_or(0.0) - a.unwrap_or(0.0);
    eprintln!(
        "{}: LISTs of pods that reached etcd: consistent {}, exact {}",
        kube.git_version,
        grew(before, after_consistent),
        grew(after_consistent, after_exact)
    );
    // The current release served both from its watch cache: the consistent one once etcd's
    // progress notify confirmed the cache fresh, the exact one from the cache's snapshot at that
    // revision (ListFromCacheSnapshot, 1.34+). tollgate prices the exact one as an etcd read all
    // the same, knowingly: a revision past the cache's history goes to etcd, and the request does
    // not say which (tests/CONFORMANCE.md).
    if version == KubeVersion::Current {
        anyhow::ensure!(
            grew(before, after_exact) == 0.0,
            "{}: {} of the two LISTs of pods reached etcd",
            kube.git_version,
            grew(before, after_exact)
        );
    }

    let consistent_store = match version {
        KubeVersion::V1_20 => "etcd",
        KubeVersion::Current => "watchCache",
    };
    let patterns: Value = serde_json::from_str(&tollgate.admin_ok("/debug/patterns")?)?;
    for (consistency, store, reason) in [
        ("consistent", consistent_store, "versionPrior"),
        ("exact", "etcd", "configured"),
    ] {
        let p = pods_pattern(&patterns, consistency)
            .with_context(|| format!("no {consistency} LIST of pods in {patterns:#}"))?;
        let read = p["predictedEtcdReadBytes"].as_f64().unwrap_or(-1.0);
        anyhow::ensure!(
            p["store"] == store && p["storeReason"] == reason,
            "{}: the {consistency} LIST of pods is priced as {} ({}), not {store} ({reason}): {p:#}",
            kube.git_version,
            p["store"],
            p["storeReason"]
        );
        // A watch-cache read costs its encoding only; an etcd read the bytes read as well.
        let response = p["predictedResponseBytes"].as_f64().unwrap_or(0.0);
        anyhow::ensure!(response > 0.0, "no response learned: {p:#}");
        let want_read = if store == "etcd" { response } else { 0.0 };
        anyhow::ensure!(
            read == want_read,
            "{}: the {consistency} LIST predicts {read} bytes read from etcd, not {want_read}: {p:#}",
            kube.git_version
        );
    }
    Ok(())
}

fn tollgate_learns_which_store_serves_consistent_lists(version: KubeVersion) -> anyhow::Result<()> {
    let kube = RealApiserver::start_version(version, &[])?;
    let inputs = tempfile::tempdir()?;
    let (tollgate, via) = tollgate_with(
        &kube,
        inputs.path(),
        "upstream:\n  metricsScrape:\n    intervalSeconds: 1\n",
    )?;
    let admin = kube.kubectl()?;

    let expected = match version {
        KubeVersion::V1_20 => "etcd",
        KubeVersion::Current => "watchCache",
    };
    let deadline = Instant::now() + JUDGE_WAIT;
    let mut sent = 0;
    let before = etcd_lists(&admin, "pods")?;
    loop {
        for _ in 0..LISTS {
            // No resourceVersion: a consistent LIST.
            via.get("/api/v1/pods")?
                .expect(200, "consistent LIST of pods")?;
        }
        sent += LISTS;
        // Two scrapes or more (one a second): on the current release until tollgate has
        // learned the watch cache; on 1.20 it must not conclude so at any moment.
        let round_end = Instant::now() + Duration::from_secs(3);
        let mut store = consistent_pods_store(&tollgate)?;
        while Instant::now() < round_end {
            store = consistent_pods_store(&tollgate)?;
            if store.as_deref() == Some("watchCache") {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let reached_etcd = etcd_lists(&admin, "pods")?.map(|after| after - before.unwrap_or(0.0));
        if store.as_deref() == Some(expected) {
            // The apiserver's own counter says the same (1.20 may not export it).
            match (version, reached_etcd) {
                (KubeVersion::Current, Some(n)) => anyhow::ensure!(
                    n < 0.5 * sent as f64,
                    "the current release read {n} of {sent} consistent LISTs from etcd"
                ),
                (KubeVersion::Current, None) => {
                    anyhow::bail!("the current release exports no apiserver_storage_list_total")
                }
                (KubeVersion::V1_20, Some(n)) => anyhow::ensure!(
                    n >= sent as f64,
                    "1.20 read only {n} of {sent} consistent LISTs from etcd"
                ),
                (KubeVersion::V1_20, None) => {}
            }
            eprintln!(
                "{}: {sent} consistent LISTs, {reached_etcd:?} reached etcd; tollgate: {expected}",
                kube.git_version
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{}: after {sent} consistent LISTs tollgate prices them as served by {store:?}, not \
             {expected} ({reached_etcd:?} reached etcd); patterns: {}",
            kube.git_version,
            tollgate.admin_ok("/debug/patterns").unwrap_or_default()
        );
    }
}

/// The cluster-wide LIST of pods of `consistency` in `/debug/patterns`.
fn pods_pattern<'a>(patterns: &'a Value, consistency: &str) -> Option<&'a Value> {
    patterns.as_array()?.iter().find(|p| {
        p["verb"] == "list"
            && p["resource"] == "pods"
            && p["scope"] == "cluster"
            && p["consistency"] == consistency
    })
}

/// The store `/debug/patterns` gives the consistent cluster-wide LIST of pods.
fn consistent_pods_store(tollgate: &TollgateProcess) -> anyhow::Result<Option<String>> {
    let patterns: Value = serde_json::from_str(&tollgate.admin_ok("/debug/patterns")?)?;
    Ok(patterns
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| {
            p["verb"] == "list"
                && p["resource"] == "pods"
                && p["scope"] == "cluster"
                && p["consistency"] == "consistent"
        })
        .and_then(|p| p["store"].as_str().map(String::from)))
}

/// `apiserver_storage_list_total{resource, storage="etcd"}` (LISTs that reached etcd; the
/// current release counts the watch cache's as `storage="watchcache"`), if exported.
fn etcd_lists(admin: &Kubectl, resource: &str) -> anyhow::Result<Option<f64>> {
    let text = admin.ok(&["get", "--raw", "/metrics"])?;
    let mut found = None;
    for s in kubeio::promtext::samples(&text) {
        if s.name == "apiserver_storage_list_total"
            && s.label("resource").is_some_and(|r| r == resource)
        {
            // The etcd series appears with the first LIST from etcd.
            let from_etcd = s.label("storage").is_none_or(|store| store == "etcd");
            *found.get_or_insert(0.0) += if from_etcd { s.value } else { 0.0 };
        }
    }
    Ok(found)
}
