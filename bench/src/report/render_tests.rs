//! The reports of recorded directories (a demo, a capacity run with cluster sizes, a plain
//! loadgen output), written by `write_report` and parsed back: charts with data points, the
//! same numbers in HTML and Markdown, and no external resource in any src or href.

use std::path::Path;

use super::demo::{DemoSummary, Headline, Ratios, RunSummary, Setup, SCHEMA};
use super::loadgen::LoadgenRun;
use super::write_report;

const TIMESERIES_HEADER: &str =
    "second,operation,completed,ok,rejected_429,errors,dropped,bytes,p50_ms,p99_ms,max_ms\n";

/// A loadgen output directory with `seconds` rows of patches (and LISTs if `lists`).
fn loadgen_dir(dir: &Path, p99: f64, lists: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let mut ts = TIMESERIES_HEADER.to_owned();
    for s in 0..20 {
        ts.push_str(&format!("{s},patch,100,100,0,0,0,1,5,{p99},{p99}\n"));
        if lists {
            ts.push_str(&format!("{s},list,2,1,1,0,0,1,900,2000,2000\n"));
        }
    }
    std::fs::write(dir.join("timeseries.csv"), ts).unwrap();
    let mut ops = vec![serde_json::json!({
        "name": "patch", "requests": 2000, "errors": 0,
        "status_codes": {"200": 2000},
        "latency_ms": {"p50": 5.0, "p90": 9.0, "p99": p99, "max": p99}
    })];
    if lists {
        ops.push(serde_json::json!({
            "name": "list", "requests": 40, "errors": 0,
            "status_codes": {"200": 20, "429": 20},
            "latency_ms": {"p50": 900.0, "p90": 1500.0, "p99": 2000.0, "max": 2000.0}
        }));
    }
    let summary = serde_json::json!({
        "schema": "loadgen.summary/v1", "duration_s": 20.0, "interrupted": false,
        "operations": ops
    });
    std::fs::write(dir.join("summary.json"), summary.to_string()).unwrap();
}

/// Every src/href attribute value in the page.
fn links(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in ["src=\"", "href=\"", "src='", "href='"] {
        for part in html.split(attr).skip(1) {
            let quote = attr.chars().last().unwrap_or('"');
            out.push(part.split(quote).next().unwrap_or("").to_owned());
        }
    }
    out
}

fn assert_self_contained(html: &str) {
    let external: Vec<String> = links(html)
        .into_iter()
        .filter(|l| l.contains("http:") || l.contains("https:") || l.starts_with("//"))
        .collect();
    assert!(external.is_empty(), "external resources: {external:?}");
    assert!(!html.contains("<script"), "the page needs no script");
    assert!(!html.contains("@import") && !html.contains("url("));
}

#[test]
fn a_demo_directory_renders_self_contained_with_its_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut runs = Vec::new();
    let mut headline = Vec::new();
    for (name, p99, storm, tg) in [
        ("baseline", 12.0, false, false),
        ("baseline-tollgate", 13.0, false, true),
        ("unprotected", 4321.0, true, false),
        ("protected", 15.5, true, true),
    ] {
        let run_dir = dir.join("runs").join(name);
        loadgen_dir(&run_dir.join("loadgen"), p99, storm);
        std::fs::write(run_dir.join("memory.csv"), "second,m\n0,4e8\n1,5e8\n").unwrap();
        if tg {
            std::fs::write(run_dir.join("quota.csv"), "second,q\n0,2e8\n1,-1e7\n").unwrap();
        }
        let run = RunSummary {
            name: name.into(),
            title: format!("{name} run"),
            through_tollgate: tg,
            list_storm: storm,
            dir: format!("runs/{name}"),
            sim_restarts: u64::from(name == "unprotected"),
            tollgate_args: vec![],
            loadgen: LoadgenRun::read(&run_dir.join("loadgen")).unwrap().summary,
        };
        let lg = LoadgenRun::read(&run_dir.join("loadgen")).unwrap();
        headline.push(Headline::of(&run, &lg));
        runs.push(run);
    }
    assert_eq!(headline[3].rejected_429, 20);
    assert_eq!(headline[3].lists_served_per_minute, 60.0);
    let ratios = Ratios::of(&headline);
    let summary = DemoSummary {
        schema: SCHEMA.into(),
        quick: true,
        setup: Setup {
            nodes: 1,
            pods: 2,
            heartbeat_nodes: 1,
            patches_per_second: 100.0,
            lists_per_minute: 120.0,
            duration_seconds: 20.0,
            quota_bytes_per_second: None,
            quota_burst_bytes: 2,
            static_pools: 0,
            sim_args: vec![],
            tollgate_args: vec![],
            loadgen_args: vec![],
        },
        runs,
        headline,
        ratios: Some(ratios),
    };
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string(&summary).unwrap(),
    )
    .unwrap();
    let page = write_report(dir).unwrap();
    let html = std::fs::read_to_string(page).unwrap();
    assert_self_contained(&html);
    assert!(html.matches("<svg").count() >= 8, "charts missing");
    assert!(html.matches("class=\"point\"").count() >= 100);
    // 15.5 / 13 (protected / baseline through tollgate), 4321 / 12 with a crash.
    for n in [
        "4321",
        "15.5",
        "12",
        "unprotected run",
        "1.19×",
        "360.08× (crashed)",
    ] {
        assert!(html.contains(&format!("<td>{n}</td>")), "{n} missing");
    }
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("| unprotected run | 4321 |"), "{md}");
    // Goodput per run, beside the heartbeat p99 and p50: 20 LISTs served in 20 s, or none.
    assert!(html.contains("<th>LISTs served/min (goodput)</th>"));
    assert!(md.contains("| protected run | 15.5 | 5 | 60 |"), "{md}");
    assert!(md.contains("| baseline run | 12 | 5 | 0 |"), "{md}");
    assert!(md.contains("Quota pool level"));
}

#[test]
fn a_capacity_directory_with_sizes_renders_the_grid_and_the_quota_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (size, caps) in [
        (500, [Some(60.0), Some(120.0)]),
        (1000, [None, Some(120.0)]),
    ] {
        let sub = dir.join(format!("sizes/{size}"));
        std::fs::create_dir_all(sub.join("experiments/e1")).unwrap();
        let capacity = serde_json::json!({
            "execution": "storm", "fingerprint": "f", "metric": "capacity",
            "loadName": "LIST calls/min", "resourceName": "quota bytes/s",
            "values": [{"at": 1e7, "value": caps[0]}, {"at": 2e7, "value": caps[1]}],
            "grid": [[true, true], [false, true]],
            "loads": [60.0, 120.0], "resources": [1e7, 2e7],
            "experimentsRunNow": 3, "experimentsReplayed": 0
        });
        std::fs::write(sub.join("capacity.json"), capacity.to_string()).unwrap();
        let record = serde_json::json!({
            "load": 60.0, "loadIndex": 0, "resource": 1e7, "resourceIndex": 0,
            "repetition": 0, "ok": true,
            "slos": [{"name": "patch p99", "value": 40.0, "limit": 1000.0, "ok": true}],
            "output": "experiments/e1", "started": "", "seconds": 1.0
        });
        std::fs::write(
            sub.join("results.jsonl"),
            format!("{{\"execution\":\"f\"}}\n{record}\n"),
        )
        .unwrap();
        loadgen_dir(&sub.join("experiments/e1/loadgen"), 40.0, true);
    }
    let sizing = super::capacity::Sizing {
        execution: "storm".into(),
        unit: "nodes".into(),
        load_name: "LIST calls/min".into(),
        resource_name: "quota bytes/s".into(),
        target_load: 120.0,
        sizes: vec![
            super::capacity::SizeNeed {
                size: 500.0,
                dir: "sizes/500".into(),
                needed: Some(1e7),
            },
            super::capacity::SizeNeed {
                size: 1000.0,
                dir: "sizes/1000".into(),
                needed: Some(2e7),
            },
        ],
        fit: super::capacity::linear_fit(&[(500.0, 1e7), (1000.0, 2e7)]),
        resource_is_quota_rate: true,
    };
    std::fs::write(
        dir.join("sizing.json"),
        serde_json::to_string(&sizing).unwrap(),
    )
    .unwrap();
    let page = write_report(dir).unwrap();
    let html = std::fs::read_to_string(page).unwrap();
    assert_self_contained(&html);
    assert_eq!(
        html.matches("class=\"verdict\"").count(),
        8,
        "two 2×2 grids"
    );
    assert!(html.contains("bytesPerSecondPerUnit: 20000"), "{html}");
    assert!(html.contains("mode: nodeProportional"));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("| 1000 | 20000000 |"), "{md}");
    assert!(md.contains("| 120 | ✗ | ✓ |"), "{md}");
    // One size alone is a plain capacity report.
    let page = write_report(&dir.join("sizes/500")).unwrap();
    assert_self_contained(&std::fs::read_to_string(page).unwrap());
}

#[test]
fn a_loadgen_directory_renders_and_an_unknown_one_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    loadgen_dir(tmp.path(), 33.0, false);
    let html = std::fs::read_to_string(write_report(tmp.path()).unwrap()).unwrap();
    assert_self_contained(&html);
    assert!(html.contains("<td>33</td>"));
    let empty = tempfile::tempdir().unwrap();
    let err = write_report(empty.path()).unwrap_err().to_string();
    assert!(err.contains("neither a capacity run"), "{err}");
}
