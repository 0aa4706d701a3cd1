//! The capacity report's pure parts: the fit, the need read off each size, the metric table
//! and the quota settings.

use super::*;

#[test]
fn fits_a_line() {
    let f = linear_fit(&[(100.0, 15.0), (200.0, 25.0), (400.0, 45.0)]).unwrap();
    assert!((f.slope - 0.1).abs() < 1e-9 && (f.intercept - 5.0).abs() < 1e-9);
    assert!((f.r2.unwrap() - 1.0).abs() < 1e-9);
    let one = linear_fit(&[(1000.0, 50.0)]).unwrap();
    assert_eq!((one.intercept, one.slope), (0.0, 0.05));
    assert!(linear_fit(&[]).is_none());
    assert!(linear_fit(&[(5.0, 1.0), (5.0, 2.0)]).is_none());
}

fn outcome(metric: &str, values: &[(f64, Option<f64>)]) -> CapacityJson {
    CapacityJson {
        execution: "e".into(),
        metric: metric.into(),
        maximises: Objective::OfferedLoad,
        load_name: "l".into(),
        resource_name: "r".into(),
        values: values
            .iter()
            .map(|(at, value)| Point {
                at: *at,
                value: *value,
                load: None,
                served: None,
            })
            .collect(),
        grid: vec![],
        experiments: vec![],
        loads: vec![],
        resources: vec![],
    }
}

#[test]
fn needed_reads_either_metric() {
    // capacity: per resource, highest load
    let c = outcome(
        "capacity",
        &[(10.0, None), (20.0, Some(60.0)), (40.0, Some(120.0))],
    );
    assert_eq!(needed(&c, 120.0), Some(40.0));
    assert_eq!(needed(&c, 60.0), Some(20.0));
    assert_eq!(needed(&c, 250.0), None);
    // demand: per load, least resource
    let d = outcome("demand", &[(60.0, Some(10.0)), (120.0, Some(30.0))]);
    assert_eq!(needed(&d, 120.0), Some(30.0));
}

#[test]
fn the_goodput_table_puts_the_offered_load_beside_the_lists_served() {
    let served = |g: f64, b: u64| {
        Some(Served {
            lists_per_minute: g,
            bytes: b,
        })
    };
    let points = [
        Point {
            at: 2.0,
            value: Some(20.5),
            load: Some(1920.0),
            served: served(20.5, 3_000_000),
        },
        Point {
            at: 4.0,
            value: None,
            load: None,
            served: None,
        },
    ];
    let t = metric_table(
        "capacity",
        Objective::Goodput,
        "LIST calls/min",
        "vCPUs",
        &points,
    );
    assert_eq!(
        t.header,
        [
            "vCPUs",
            "LISTs served/min (goodput) within the SLOs",
            "at LIST calls/min",
            "served MB"
        ]
    );
    assert_eq!(t.rows[0], ["2", "20.5", "1920", "3"]);
    assert_eq!(t.rows[1], ["4", "none", "none", "–"]);
    let mut plain = points[0].clone();
    plain.value = Some(1920.0);
    let t = metric_table("capacity", Objective::OfferedLoad, "l", "r", &[plain]);
    assert_eq!(t.header[1], "highest l meeting the SLOs");
    assert_eq!(t.rows[0], ["2", "1920", "20.5", "3"]);
    // A capacity in goodput sustains a target load only when that many were served.
    let mut c = outcome("capacity", &[(2.0, Some(20.5)), (4.0, Some(130.0))]);
    c.maximises = Objective::Goodput;
    assert_eq!(needed(&c, 120.0), Some(4.0));
}

#[test]
fn quota_settings_follow_the_unit() {
    let s = Sizing {
        execution: "e".into(),
        unit: "containers".into(),
        load_name: "l".into(),
        resource_name: "quota bytes/s".into(),
        target_load: 120.0,
        sizes: vec![],
        fit: None,
        resource_is_quota_rate: true,
    };
    let q = quota_settings(
        &s,
        Fit {
            intercept: -5.0,
            slope: 1000.0,
            r2: Some(0.9),
        },
    );
    assert!(q.contains("mode: containerProportional"), "{q}");
    assert!(
        q.contains("quota:\n  mode: static\n"),
        "a fitted pool is fixed: {q}"
    );
    assert!(q.contains("bytesPerSecondPerUnit: 1000"), "{q}");
    assert!(q.contains("clamped"), "{q}");
}
