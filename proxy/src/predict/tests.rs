use super::*;
use crate::classify::classify;
use crate::identity::ClientClass;
use http::{HeaderMap, Method};

fn key(url: &str) -> PatternKey {
    let uri: http::Uri = url.parse().expect("uri");
    let c = classify(&Method::GET, &uri, &HeaderMap::new()).expect("classifies");
    PatternKey::new(&c, ClientClass::User)
}

fn ok(bytes: u64, ms: u64) -> Outcome {
    Outcome {
        status: 200,
        bytes,
        gzip: false,
        latency: Duration::from_millis(ms),
        completion: Completion::End,
        full_list: false,
        client: "user:a".into(),
        initial_bytes: None,
    }
}

fn full(bytes: u64) -> Outcome {
    Outcome {
        full_list: true,
        ..ok(bytes, 10)
    }
}

fn cache() -> PatternCache {
    PatternCache::new(Patterns::default())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6 * b.abs().max(1.0)
}

#[test]
fn mean_of_simultaneous_samples_is_exact() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/namespaces/a/configmaps?resourceVersion=0");
    c.observe(&k, &ok(1000, 5), t0);
    c.observe(&k, &ok(3000, 15), t0);
    let s = c.get(&k).expect("learned");
    assert_eq!(s.count, 2);
    assert_eq!(s.bytes_mean(), Some(2000.0));
    assert_eq!(s.latency_mean_ms(), Some(10.0));
    let p = c.predict(&k, t0);
    assert_eq!(p.response_bytes, 2000.0);
    assert_eq!(p.read_bytes, 0.0, "rv=0 is served from the watch cache");
    assert_eq!(p.source, Source::Pattern);
}

#[test]
fn old_samples_weigh_half_after_one_half_life() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/namespaces/a/configmaps?resourceVersion=0");
    c.observe(&k, &ok(1000, 1), t0);
    c.observe(&k, &ok(3000, 1), t0 + Duration::from_secs(300));
    // (0.5·1000 + 3000) / 1.5
    let mean = c.get(&k).and_then(PatternStats::bytes_mean).expect("mean");
    assert!(close(mean, 3500.0 / 1.5), "{mean}");
}

#[test]
fn rate_from_decayed_count() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/nodes/n1");
    for _ in 0..10 {
        c.observe(&k, &ok(100, 1), t0);
    }
    let rate = c.get(&k).expect("learned").rate(300.0);
    assert!(close(rate, 10.0 * std::f64::consts::LN_2 / 300.0), "{rate}");
}

#[test]
fn p95_is_the_upper_bound_of_its_bucket() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/pods?resourceVersion=0");
    for _ in 0..95 {
        c.observe(&k, &ok(1000, 1), t0);
    }
    for _ in 0..5 {
        c.observe(&k, &ok(1_000_000, 1), t0);
    }
    let s = c.get(&k).expect("learned");
    // 1000 lies in [2^(79/8), 2^(80/8)) = [~939, 1024).
    assert_eq!(s.bytes_p95(), 1024.0);
    let mut h = DecayedHistogram::default();
    h.add(0.5, 1.0);
    assert_eq!(h.quantile(0.5), 1.0);
    assert_eq!(DecayedHistogram::default().quantile(0.95), 0.0);
}

#[test]
fn unseen_patterns_use_defaults_then_the_prior() {
    let mut c = cache();
    let t0 = Instant::now();
    let list = key("/api/v1/pods?resourceVersion=0");
    let p = c.predict(&list, t0);
    assert_eq!((p.response_bytes, p.source), (1_048_576.0, Source::Default));
    assert_eq!(
        c.predict(&key("/api/v1/namespaces/a/pods/x"), t0).cost(),
        4096.0
    );

    c.observe(&key("/api/v1/pods"), &full(10_000_000), t0);
    let p = c.predict(&list, t0);
    assert_eq!(
        (p.response_bytes, p.read_bytes, p.source),
        (10_000_000.0, 0.0, Source::Prior)
    );
    // A full-state watch is costed as the list it starts with.
    let wl = key("/api/v1/pods?watch=1&resourceVersion=0");
    assert_eq!(c.predict(&wl, t0).response_bytes, 10_000_000.0);
}

#[test]
fn scraped_object_counts_give_a_prior_before_any_full_list() {
    let mut c = cache();
    let t0 = Instant::now();
    c.set_object_count("pods", 1000.0);
    let by_node = key("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1");
    // Read from etcd: 1000 objects × the default 4096 bytes each; answered:
    // one node's worth (110 pods), the node count not being known.
    let p = c.predict(&by_node, t0);
    assert_eq!(
        (p.response_bytes, p.read_bytes, p.source),
        (450_560.0, 4_096_000.0, Source::Prior)
    );
    // A namespace LIST is not the cluster count.
    assert_eq!(
        c.predict(&key("/api/v1/namespaces/a/pods"), t0).source,
        Source::Default
    );
    // A full LIST teaches bytes per object (and the prior itself).
    c.observe(&key("/api/v1/pods"), &full(2_000_000), t0);
    c.set_object_count("pods", 2000.0);
    assert_eq!(
        c.prior_bytes(&by_node),
        Some(2_000_000.0),
        "observed LISTs win"
    );
    let deploy = key("/apis/apps/v1/deployments?resourceVersion=0");
    c.set_object_count("apps/deployments", 10.0);
    assert_eq!(c.predict(&deploy, t0).response_bytes, 40_960.0);
    c.set_object_count("apps/deployments", f64::NAN);
    assert_eq!(
        c.predict(&deploy, t0).response_bytes,
        40_960.0,
        "garbage ignored"
    );
}

#[test]
fn streaming_lists_learn_their_initial_state_not_their_lifetime() {
    let mut c = cache();
    let t0 = Instant::now();
    let wl = key("/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan");
    // The end of the initial state not seen: nothing learned about bytes.
    c.observe(
        &wl,
        &Outcome {
            completion: Completion::Cancelled,
            ..ok(9_000_000, 1)
        },
        t0,
    );
    assert_eq!(c.get(&wl).and_then(PatternStats::bytes_mean), None);
    assert_eq!(c.predict(&wl, t0).source, Source::Default);
    // Seen after 300 kB of a stream that went on to 9 MB.
    let seen = Outcome {
        completion: Completion::Cancelled,
        initial_bytes: Some(300_000),
        ..ok(9_000_000, 1)
    };
    c.observe(&wl, &seen, t0);
    assert_eq!(
        c.get(&wl).and_then(PatternStats::bytes_mean),
        Some(300_000.0)
    );
    assert_eq!(c.predict(&wl, t0).response_bytes, 300_000.0);
    // Unfiltered, so it is the full state of pods: a LIST's prior too.
    assert_eq!(
        c.predict(&key("/api/v1/pods?resourceVersion=0"), t0)
            .response_bytes,
        300_000.0
    );
    // A filtered one teaches only itself.
    let by_node =
        key("/api/v1/pods?watch=1&sendInitialEvents=true&fieldSelector=spec.nodeName%3Dn1");
    c.observe(
        &by_node,
        &Outcome {
            initial_bytes: Some(1_000),
            ..ok(5_000, 1)
        },
        t0,
    );
    assert_eq!(c.prior_bytes(&by_node), Some(300_000.0));
}

#[test]
fn consistent_filtered_list_is_heavy_though_small() {
    let mut c = cache();
    let t0 = Instant::now();
    c.observe(&key("/api/v1/pods"), &full(10_000_000), t0);
    let by_node = key("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1");
    for _ in 0..3 {
        c.observe(&by_node, &ok(2_000, 3), t0);
    }
    let p = c.predict(&by_node, t0);
    assert_eq!(p.response_bytes, 2_000.0);
    assert_eq!(
        p.read_bytes, 10_000_000.0,
        "etcd reads every pod, then filters"
    );
    assert_eq!(p.cost(), 10_002_000.0);

    // The same selector from the watch cache costs what it returns.
    let cached = key("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&resourceVersion=0");
    c.observe(&cached, &ok(2_000, 1), t0);
    assert_eq!(c.predict(&cached, t0).cost(), 2_000.0);

    // And configuration can say consistent reads come from the cache (1.31+).
    c.set_settings(Patterns {
        consistent_store: StoreSetting::WatchCache,
        ..Patterns::default()
    });
    assert_eq!(c.predict(&by_node, t0).cost(), 2_000.0);
}

#[test]
fn the_consistent_store_is_learned_from_etcd_list_counts() {
    let mut c = cache();
    let t0 = Instant::now();
    c.observe(&key("/api/v1/pods"), &full(10_000_000), t0);
    let by_node = key("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1");
    for _ in 0..6 {
        c.observe(&by_node, &ok(2_000, 3), t0);
    }
    assert_eq!(c.consistent_lists().get("pods"), Some(&7));
    assert_eq!(c.store(&by_node), Store::Etcd, "the configured default");
    assert_eq!(c.learn_store("pods", 0.0, 4), None, "too little evidence");
    // 7 consistent LISTs, 1 LIST from etcd (someone else's): the cache served ours.
    assert_eq!(c.learn_store("pods", 1.0, 7), Some(Store::WatchCache));
    assert_eq!(c.predict(&by_node, t0).cost(), 2_000.0);
    assert_eq!(c.snapshot(t0, 2.0)[0].store, Some(Store::WatchCache));
    // Etcd LISTs as many as ours: etcd served them.
    assert_eq!(c.learn_store("pods", 7.0, 7), Some(Store::Etcd));
    assert_eq!(c.predict(&by_node, t0).cost(), 10_002_000.0);
    // Other resources keep the configured default.
    assert_eq!(c.store(&key("/api/v1/nodes")), Store::Etcd);
}

#[test]
fn consistent_lists_are_priced_by_the_upstreams_release_until_learned() {
    let mut c = cache();
    let t0 = Instant::now();
    c.observe(
        &key("/api/v1/pods?resourceVersion=0"),
        &full(10_000_000),
        t0,
    );
    let consistent = key("/api/v1/pods");
    let exact = key("/api/v1/pods?resourceVersion=77&resourceVersionMatch=Exact");
    let page = key("/api/v1/pods?limit=500&continue=tok");
    let release = |minor| Some(Release { major: 1, minor });
    let priced =
        |c: &PatternCache, k: &PatternKey| (c.store_and_reason(k), c.predict(k, t0).read_bytes);

    // Unknown (auto, /version not read): etcd, the dearer guess.
    assert_eq!(
        priced(&c, &consistent),
        ((Store::Etcd, StoreReason::UnknownVersion), 10_000_000.0)
    );
    // 1.20: a consistent LIST is a quorum read from etcd.
    c.set_release(release(20));
    assert_eq!(
        priced(&c, &consistent),
        ((Store::Etcd, StoreReason::VersionPrior), 10_000_000.0)
    );
    // 1.31 and later: from the watch cache, only its encoding costs.
    for minor in [31, 37] {
        c.set_release(release(minor));
        assert_eq!(
            priced(&c, &consistent),
            ((Store::WatchCache, StoreReason::VersionPrior), 0.0)
        );
        let p = c.predict(&consistent, t0);
        assert_eq!(p.cost(), p.response_bytes);
    }
    // Exact reads and continue pages keep etcd on every release (a revision may be past the
    // cache's history); the cache class keeps the cache.
    for k in [&exact, &page] {
        let ((store, reason), read) = priced(&c, k);
        assert_eq!(
            (store, reason),
            (Store::Etcd, StoreReason::Configured),
            "{k}"
        );
        assert!(read > 0.0, "{k}");
    }
    assert_eq!(
        c.store_and_reason(&key("/api/v1/pods?resourceVersion=0")),
        (Store::WatchCache, StoreReason::Configured)
    );
    // Learned evidence beats the release: these pods came from etcd (a cache not fresh, say).
    for _ in 0..5 {
        c.observe(&consistent, &ok(10_000_000, 900), t0);
    }
    assert_eq!(c.learn_store("pods", 5.0, 5), Some(Store::Etcd));
    assert_eq!(
        c.store_and_reason(&consistent),
        (Store::Etcd, StoreReason::Learned)
    );
    // A configured store beats the release, not the evidence.
    c.set_settings(Patterns {
        consistent_store: StoreSetting::Etcd,
        ..Patterns::default()
    });
    assert_eq!(
        c.store_and_reason(&key("/api/v1/nodes")),
        (Store::Etcd, StoreReason::Configured)
    );
    assert_eq!(
        c.snapshot(t0, 1.0)
            .iter()
            .find(|v| v.pattern == consistent.to_string())
            .and_then(|v| v.store_reason),
        Some(StoreReason::Learned)
    );
}

#[test]
fn unfiltered_etcd_list_reads_what_it_returns() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/pods");
    c.observe(&k, &full(5_000), t0);
    let p = c.predict(&k, t0);
    assert_eq!((p.response_bytes, p.read_bytes), (5_000.0, 5_000.0));
}

#[test]
fn gzip_bytes_are_scaled_to_uncompressed() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/secrets?resourceVersion=0");
    c.observe(
        &k,
        &Outcome {
            gzip: true,
            ..ok(1_000, 1)
        },
        t0,
    );
    assert_eq!(c.get(&k).and_then(PatternStats::bytes_mean), Some(8_000.0));
    // Once full LISTs of the resource were seen both ways, their ratio is used.
    let full_list = key("/api/v1/secrets");
    c.observe(&full_list, &full(40_000), t0);
    c.observe(
        &full_list,
        &Outcome {
            gzip: true,
            ..full(10_000)
        },
        t0,
    );
    let k2 = key("/api/v1/secrets?resourceVersion=0&limit=5");
    c.observe(
        &k2,
        &Outcome {
            gzip: true,
            ..ok(1_000, 1)
        },
        t0,
    );
    assert_eq!(c.get(&k2).and_then(PatternStats::bytes_mean), Some(4_000.0));
}

#[test]
fn failures_and_cancellations_count_but_do_not_teach_bytes() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/pods?resourceVersion=0");
    c.observe(
        &k,
        &Outcome {
            status: 500,
            ..ok(10, 1)
        },
        t0,
    );
    c.observe(
        &k,
        &Outcome {
            completion: Completion::Cancelled,
            ..ok(99, 1)
        },
        t0,
    );
    c.observe(
        &k,
        &Outcome {
            completion: Completion::Error,
            ..ok(99, 1)
        },
        t0,
    );
    let s = c.get(&k).expect("counted");
    assert_eq!((s.count, s.errors, s.cancelled), (3, 2, 1));
    assert_eq!(s.bytes_mean(), None);
}

#[test]
fn eviction_drops_the_coldest_and_keeps_the_bound() {
    let mut c = PatternCache::new(Patterns {
        capacity: 10,
        ..Patterns::default()
    });
    let t0 = Instant::now();
    let resources: Vec<String> = (0..11)
        .map(|i| format!("/api/v1/r{i}?resourceVersion=0"))
        .collect();
    for (i, url) in resources.iter().enumerate().take(10) {
        c.observe(&key(url), &ok(1_000 * (i as u64 + 1), 1), t0);
    }
    assert_eq!(c.len(), 10);
    c.observe(&key(&resources[10]), &ok(500_000, 1), t0);
    assert_eq!(c.len(), 10);
    assert!(c.get(&key(&resources[0])).is_none(), "lightest evicted");
    assert!(c.get(&key(&resources[10])).is_some());
    let snap = c.snapshot(t0, 2.0);
    assert_eq!(snap.len(), 10);
    assert_eq!(snap[0].resource, "r10", "heaviest first");
    assert_eq!(snap[0].bytes_avg, 500_000.0);
    assert_eq!(snap[0].top_clients, vec!["user:a".to_string()]);
}

#[test]
fn top_clients_are_bounded_and_ordered() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/nodes?resourceVersion=0");
    for (client, n) in [("a", 3), ("b", 1), ("c", 5), ("d", 1), ("e", 1), ("f", 1)] {
        for _ in 0..n {
            c.observe(
                &k,
                &Outcome {
                    client: client.into(),
                    ..ok(1, 1)
                },
                t0,
            );
        }
    }
    let top = c.get(&k).expect("learned").top_clients();
    assert_eq!(top.len(), 5);
    assert_eq!(top[0], "c");
    assert_eq!(top[1], "a");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn any_key() -> impl Strategy<Value = PatternKey> {
        (0usize..40, any::<bool>(), 0u8..4, any::<bool>()).prop_map(|(r, sel, rv, ns)| {
            let scope = if ns { "namespaces/a/" } else { "" };
            let mut url = format!("/api/v1/{scope}r{r}?x=1");
            if sel {
                url.push_str("&fieldSelector=a%3Db");
            }
            match rv {
                0 => {}
                1 => url.push_str("&resourceVersion=0"),
                2 => url.push_str("&resourceVersionMatch=Exact&resourceVersion=5"),
                _ => url.push_str("&watch=1"),
            }
            key(&url)
        })
    }

    proptest! {
        #[test]
        fn bounded_and_finite(ops in proptest::collection::vec((any_key(), 0u64..10_000_000, 0u64..5_000, any::<bool>(), 0u8..3), 1..200)) {
            let mut c = PatternCache::new(Patterns { capacity: 16, ..Patterns::default() });
            let t0 = Instant::now();
            for (k, bytes, dt_ms, gzip, end) in ops {
                let completion = [Completion::End, Completion::Error, Completion::Cancelled][end as usize];
                let now = t0 + Duration::from_millis(dt_ms);
                let p = c.predict(&k, now);
                prop_assert!(p.cost().is_finite() && p.response_bytes >= 0.0 && p.read_bytes >= 0.0);
                c.observe(&k, &Outcome { gzip, completion, full_list: bytes % 3 == 0, ..ok(bytes, 1) }, now);
                prop_assert!(c.len() <= 16);
            }
            for v in c.snapshot(t0 + Duration::from_secs(10), 2.0) {
                prop_assert!(v.rate.is_finite() && v.bytes_avg.is_finite() && v.predicted_cost_bytes.is_finite());
            }
        }
    }
}

#[test]
fn a_narrowed_list_is_priced_at_its_share_but_reads_all_from_etcd() {
    let mut c = cache();
    let t0 = Instant::now();
    c.observe(&key("/api/v1/pods"), &full(10_000_000), t0);
    c.set_object_count("pods", 1000.0);
    let by_node = key("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&resourceVersion=0");
    // No node count yet: a full node's worth (110 pods of 10 kB).
    assert_eq!(c.predict(&by_node, t0).response_bytes, 1_100_000.0);
    c.set_object_count("nodes", 50.0);
    let p = c.predict(&by_node, t0);
    assert_eq!((p.response_bytes, p.read_bytes), (200_000.0, 0.0));
    // From etcd it reads every pod to find the node's.
    let consistent = key("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1");
    let p = c.predict(&consistent, t0);
    assert_eq!((p.response_bytes, p.read_bytes), (200_000.0, 10_000_000.0));
    let one = key("/api/v1/pods?fieldSelector=metadata.name%3Dx&resourceVersion=0");
    assert_eq!(c.predict(&one, t0).response_bytes, 10_000.0);
    // Learned, the pattern's own bytes win.
    c.observe(&by_node, &ok(3_000, 2), t0);
    assert_eq!(c.predict(&by_node, t0).response_bytes, 3_000.0);
}

#[test]
fn a_page_is_priced_at_its_limit_not_the_whole_list() {
    let mut c = cache();
    let t0 = Instant::now();
    // 3000 pods, a full LIST of them 12 MB: 4000 bytes each.
    c.set_object_count("pods", 3000.0);
    c.observe(&key("/api/v1/pods"), &full(12_000_000), t0);
    // kubectl's continue page, a pattern never seen: 500 pods, read from etcd.
    let page = key("/api/v1/pods?limit=500&continue=abc");
    assert_eq!(page.consistency, Some(ConsistencyClass::Exact));
    let p = c.predict(&page, t0);
    assert_eq!(
        (p.response_bytes, p.read_bytes, p.source),
        (2_000_000.0, 2_000_000.0, Source::Prior)
    );
    // A limit past the resource's size costs no more than the whole.
    let big = c.predict(&key("/api/v1/pods?limit=5000"), t0);
    assert_eq!(big.response_bytes, 12_000_000.0);
    // Learned, a page is what its pages cost.
    c.observe(&page, &ok(1_500_000, 50), t0);
    assert_eq!(c.predict(&page, t0).response_bytes, 1_500_000.0);
    // With nothing known, a page is its limit of default-sized objects.
    let fresh = cache();
    let p = fresh.predict(&key("/api/v1/secrets?limit=100"), t0);
    assert_eq!(p.response_bytes, 100.0 * 4096.0);
}

#[test]
fn dry_runs_would_rejects_are_counted_apart_from_rejects() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/pods");
    c.note_rejected(&k, "user:a", true, t0);
    c.note_rejected(&k, "user:a", true, t0);
    c.note_rejected(&k, "user:b", false, t0);
    let s = c.get(&k).expect("noted");
    assert_eq!((s.rejected, s.would_reject), (1, 2));
    let v = &c.snapshot(t0, 2.0)[0];
    assert_eq!((v.rejected, v.would_reject), (1, 2));
    assert_eq!(v.rejected_clients, vec!["user:a", "user:b"]);
}

#[test]
fn debug_patterns_cost_is_what_admission_charges() {
    let mut c = cache();
    let t0 = Instant::now();
    let k = key("/api/v1/pods");
    c.observe(&k, &full(1_000_000), t0);
    // A consistent LIST from etcd: 1 MB sent, 1 MB read, weighed twice.
    let v = &c.snapshot(t0, 2.0)[0];
    assert_eq!(v.predicted_response_bytes, 1_000_000.0);
    assert_eq!(v.predicted_etcd_read_bytes, 1_000_000.0);
    assert_eq!(v.predicted_cost_bytes, 3_000_000.0);
    let p = c.predict(&k, t0);
    assert_eq!(
        v.predicted_cost_bytes,
        crate::predict::charge::charge(&p, 2.0)
    );
}
