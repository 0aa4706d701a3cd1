use super::*;

fn h(run: &str, p99: f64, crashes: u64) -> Headline {
    Headline {
        run: run.into(),
        title: run.into(),
        patch_p50_ms: Some(1.0),
        patch_p99_ms: Some(p99),
        list_p99_ms: None,
        lists_served_per_minute: 30.0,
        rejected_429: 5,
        errors: 0,
        heartbeat_failures: 0,
        sim_crashes: crashes,
        within_target: None,
    }
}

#[test]
fn the_verdict_names_the_ratios() {
    let v = verdict(&[
        h("baseline", 10.0, 0),
        h("unprotected", 1000.0, 2),
        h("protected", 12.0, 0),
    ]);
    assert!(v.contains("100.0× the baseline"), "{v}");
    assert!(v.contains("(1.2×)"), "{v}");
    assert!(v.contains("OOM-killed 2 time(s)"), "{v}");
    assert!(v.contains("answered 5 with 429"), "{v}");
    let t = headline_table(&[h("baseline", 10.0, 0)]);
    assert_eq!(t.rows[0][1], "10");
    // Goodput beside the heartbeat p99 and p50, for every run.
    assert_eq!(t.header[3], "LISTs served/min (goodput)");
    assert_eq!(t.rows[0][2..4], ["1", "30"]);
}

#[test]
fn the_target_is_tollgates_default_adaptive_one() {
    assert_eq!(target_ms(Some(10.0)), Some(50.0));
    assert_eq!(target_ms(Some(40.0)), Some(80.0));
    assert_eq!(target_ms(None), None);
    let mut runs = vec![
        h("baseline", 10.0, 0),
        h("baseline-tollgate", 40.0, 0),
        h("unprotected", 900.0, 0),
        h("protected", 80.0, 0),
        h("static-1", 81.0, 0),
    ];
    runs[0].heartbeat_failures = 1;
    judge(&mut runs);
    let within: Vec<Option<bool>> = runs.iter().map(|x| x.within_target).collect();
    assert_eq!(
        within,
        [
            Some(false),
            Some(true),
            Some(false),
            Some(true),
            Some(false)
        ],
        "a failed heartbeat or a p99 over 80 ms misses it"
    );
}

#[test]
fn ratios_compare_each_run_with_the_baseline_on_its_path() {
    let mut runs = vec![
        h("baseline", 10.0, 0),
        h("baseline-tollgate", 20.0, 0),
        h("unprotected", 90.0, 0),
        h("protected", 60.0, 0),
    ];
    judge(&mut runs);
    let r = Ratios::of(&runs);
    // The target: max(2 × 20 ms, 50 ms) = 50 ms, 2.5× the baseline through tollgate.
    assert_eq!(r.protected_vs_tollgate_baseline, Some(3.0));
    assert_eq!(r.protected_target, 2.5);
    assert_eq!(r.protected_target_ms, Some(50.0));
    assert_eq!(r.protected_met, Some(false));
    assert_eq!(r.unprotected_vs_direct_baseline, Some(9.0));
    assert_eq!(r.unprotected_met, Some(false));
    assert_eq!(r.tollgate_baseline_vs_direct, Some(2.0));
    assert!(
        r.sentence()
            .contains("3.00× (target ≤ 2.50× = max(2× baseline, 50 ms) = 50 ms: NOT met)"),
        "{}",
        r.sentence()
    );
    assert!(r.sentence().contains("not measured"), "{}", r.sentence());
    // A crash meets the unprotected target whatever the p99.
    runs[2].sim_crashes = 1;
    runs[3].patch_p99_ms = Some(30.0);
    judge(&mut runs);
    let r = Ratios::of(&runs);
    assert_eq!(
        (r.protected_met, r.unprotected_met),
        (Some(true), Some(true))
    );
    assert_eq!(r.table().rows[1][1], "9.00× (crashed)");
    // Three-run summaries (no baseline through tollgate) have no protected ratio.
    let r = Ratios::of(&[h("baseline", 10.0, 0), h("protected", 12.0, 0)]);
    assert_eq!(
        (r.protected_vs_tollgate_baseline, r.protected_met),
        (None, None)
    );
}

#[test]
fn goodput_is_compared_with_the_best_static_pool_within_the_target() {
    let mut runs = vec![
        h("baseline-tollgate", 20.0, 0),
        h("protected", 45.0, 0),
        h("static-10", 30.0, 0),
        h("static-20", 49.0, 0),
        h("static-40", 70.0, 0),
    ];
    runs[1].lists_served_per_minute = 8.0;
    runs[2].lists_served_per_minute = 4.0;
    runs[3].lists_served_per_minute = 9.0;
    runs[4].lists_served_per_minute = 16.0; // served more, but over the 50 ms target
    judge(&mut runs);
    let r = Ratios::of(&runs);
    assert_eq!(r.static_pools_tried, 3);
    assert_eq!(r.best_static.as_deref(), Some("static-20"));
    let vs = r.protected_vs_best_static.unwrap();
    assert!((vs - 8.0 / 9.0).abs() < 1e-9, "{vs}");
    assert_eq!(r.goodput_met, Some(true));
    assert!(
        r.sentence().contains("89% of the best of 3"),
        "{}",
        r.sentence()
    );
    assert_eq!(r.table().rows[3][1], "89%");
    let v = verdict(&runs);
    assert!(v.contains("static-20) served 9 LISTs/min"), "{v}");
    // Below 80% of it: not met.
    runs[1].lists_served_per_minute = 7.0;
    assert_eq!(Ratios::of(&runs).goodput_met, Some(false));
}
