//! `tollgate-bench demo --quick` end to end (what CI runs), and the capacity search over cluster
//! sizes with its sizing report. The demo: the runs on the modeled simulated control plane
//! with the real binaries (heartbeats only, direct and through tollgate; the LIST storm
//! without tollgate, through tollgate's default adaptive budget, and through two static pools
//! for the best one), then
//! - `summary.json` holds the runs, each with loadgen's summary for that run, the headline
//!   (goodput per run beside the heartbeat p50/p99) and the headline ratios (computed from the
//!   headline's own figures, the target being tollgate's default adaptive one);
//! - the ordering holds with loose bounds: the direct baseline's heartbeat PATCH p99 is the
//!   best, the baseline through tollgate beats the unprotected storm, and the protected run is
//!   better than the unprotected one (lower p99, or the unprotected apiserver crashed and the
//!   protected one did not);
//! - `report.html` fetches nothing (no http(s) URL in any src or href) and, opened in headless
//!   Chromium, shows its charts (SVG paths and data points), the headline numbers and ratios.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tests::bench_command;

/// The quick demo is ~1 minute of load; starting four control planes of 10,000 pods on a busy
/// 2-core machine adds to it.
const DEMO_TIMEOUT: Duration = Duration::from_secs(420);

fn run_quick_demo(out: &Path) -> (String, String) {
    let mut child = bench_command()
        .args(["demo", "--quick", "--output"])
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tollgate-bench demo");
    // Read the pipes on threads so a chatty child never blocks; poll for the exit.
    let read = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let stdout = read(child.stdout.take().map(|s| Box::new(s) as _));
    let stderr = read(child.stderr.take().map(|s| Box::new(s) as _));
    let deadline = Instant::now() + DEMO_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for the demo") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the quick demo ran longer than {DEMO_TIMEOUT:?}:\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (stdout, stderr) = (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    );
    assert!(status.success(), "demo failed ({status}):\n{stderr}");
    (stdout, stderr)
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Chromium from Debian (`chromium`), or another name it goes by.
fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
        {
            let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if out.status.success() && !p.is_empty() {
                return PathBuf::from(p);
            }
        }
    }
    panic!(
        "headless Chromium is needed to check the report renders: install Debian's `chromium` \
         (scripts/deps.sh --tests does)"
    );
}

/// The DOM after Chromium loaded and laid out the page, with the network off.
fn dump_dom(page: &Path) -> String {
    let profile = tempfile::tempdir().expect("temp dir");
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            // Nothing may be fetched: any request would go to this dead proxy and fail.
            "--proxy-server=127.0.0.1:9",
            "--virtual-time-budget=2000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromium");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if child.try_wait().expect("waiting for chromium").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    reader.join().unwrap_or_default()
}

/// Every src/href attribute value of the page.
fn links(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lower = html.to_ascii_lowercase();
    for attr in ["src=", "href=", "xlink:href="] {
        let mut from = 0;
        while let Some(i) = lower[from..].find(attr) {
            let start = from + i + attr.len();
            let rest = &html[start..];
            let value = match rest.chars().next() {
                Some(q @ ('"' | '\'')) => rest[1..].split(q).next().unwrap_or(""),
                _ => rest.split([' ', '>']).next().unwrap_or(""),
            };
            out.push(value.to_owned());
            from = start;
        }
    }
    out
}

#[test]
fn quick_demo_orders_the_runs_and_its_page_shows_the_charts() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().join("report");
    let t0 = Instant::now();
    let (stdout, stderr) = run_quick_demo(&out);
    let took = t0.elapsed();
    let page = out.join("report.html");
    assert!(
        stdout.contains(&page.display().to_string()),
        "the demo did not say where the report is:\n{stdout}"
    );
    assert!(stderr.contains("[6/6]"), "no progress shown:\n{stderr}");

    // summary.json: four runs and two static pools, each with loadgen's summary, the headline
    // and its ratios.
    let text = std::fs::read_to_string(out.join("summary.json")).expect("summary.json");
    let s: serde_json::Value = serde_json::from_str(&text).expect("summary.json is JSON");
    assert_eq!(s["schema"], "tollgate.demo/v1");
    let runs = s["runs"].as_array().expect("runs");
    let names: Vec<&str> = runs.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names[..4],
        ["baseline", "baseline-tollgate", "unprotected", "protected"]
    );
    assert_eq!(names.len(), 6, "{names:?}");
    assert!(
        names[4..].iter().all(|n| n.starts_with("static-")),
        "{names:?}"
    );
    // The protected run is tollgate's default (adaptive, no pool set by hand); the static
    // pools say so.
    assert_eq!(
        runs[3]["tollgateArgs"],
        serde_json::json!(["--mode", "enforce"])
    );
    for r in &runs[4..] {
        let args: Vec<&str> = r["tollgateArgs"]
            .as_array()
            .expect("tollgateArgs")
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        assert!(
            args.windows(2).any(|w| w == ["--quota-mode", "static"]),
            "{args:?}"
        );
    }
    for r in runs {
        assert_eq!(r["loadgen"]["schema"], "loadgen.summary/v1", "{r:#}");
        let ops: Vec<&str> = r["loadgen"]["operations"]
            .as_array()
            .expect("operations")
            .iter()
            .filter_map(|o| o["name"].as_str())
            .collect();
        assert!(ops.contains(&"patch"), "{ops:?}");
        let name = r["name"].as_str().unwrap_or_default();
        let storm = name == "unprotected" || name == "protected" || name.starts_with("static-");
        assert_eq!(ops.contains(&"list"), storm, "{ops:?}");
        assert_eq!(
            r["throughTollgate"].as_bool(),
            Some(name == "baseline-tollgate" || name == "protected" || name.starts_with("static-")),
            "{r:#}"
        );
    }
    let h = |run: &str| -> &serde_json::Value {
        s["headline"]
            .as_array()
            .expect("headline")
            .iter()
            .find(|h| h["run"] == run)
            .expect("a headline per run")
    };
    let (base, base_tg, unprot, prot) = (
        h("baseline"),
        h("baseline-tollgate"),
        h("unprotected"),
        h("protected"),
    );
    let p99 = |h: &serde_json::Value| f(&h["patchP99Ms"]);
    let crashes = |h: &serde_json::Value| h["simCrashes"].as_u64().unwrap_or(0);
    let report = format!(
        "PATCH p99 ms: baseline {}, through tollgate {}, unprotected {} ({} crashes, {} errors), \
         protected {} ({} LISTs/min, {} 429s); ratios {}; demo took {took:?}",
        p99(base),
        p99(base_tg),
        p99(unprot),
        crashes(unprot),
        unprot["errors"],
        p99(prot),
        prot["listsServedPerMinute"],
        prot["rejected429"],
        s["ratios"]
    );
    eprintln!("{report}");
    // Loose bounds: a shared CI machine is noisy; the ordering is what must hold.
    assert!(p99(base) > 0.0, "{report}");
    assert!(
        p99(base) <= p99(unprot) && p99(base) <= 1.5 * p99(prot) + 10.0,
        "the baseline is not the best: {report}"
    );
    assert!(
        p99(base_tg) <= p99(unprot),
        "heartbeats through tollgate alone were slower than under the unprotected storm: {report}"
    );
    // The ratios are the headline's own p99s divided, each by the baseline on its path.
    let ratios = &s["ratios"];
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    assert!(
        close(
            f(&ratios["protectedVsTollgateBaseline"]),
            p99(prot) / p99(base_tg)
        ),
        "{report}"
    );
    assert!(
        close(
            f(&ratios["unprotectedVsDirectBaseline"]),
            p99(unprot) / p99(base)
        ),
        "{report}"
    );
    // The protected target is tollgate's default adaptive one: p99 ≤ max(2 × the baseline
    // through tollgate, 50 ms), as a ratio to that baseline.
    let target_ms = (2.0 * p99(base_tg)).max(50.0);
    assert!(
        close(f(&ratios["protectedTargetMs"]), target_ms),
        "{report}"
    );
    assert!(
        close(f(&ratios["protectedTarget"]), target_ms / p99(base_tg)),
        "{report}"
    );
    // Goodput: the protected run's against the best static pool within the target.
    let statics: Vec<&serde_json::Value> = s["headline"]
        .as_array()
        .expect("headline")
        .iter()
        .filter(|h| h["run"].as_str().is_some_and(|r| r.starts_with("static-")))
        .collect();
    assert_eq!(statics.len(), 2, "{report}");
    assert_eq!(ratios["staticPoolsTried"], 2, "{report}");
    let within = |h: &serde_json::Value| h["withinTarget"] == true;
    let best = statics
        .iter()
        .filter(|h| within(h))
        .max_by(|a, b| f(&a["listsServedPerMinute"]).total_cmp(&f(&b["listsServedPerMinute"])));
    match best {
        Some(b) => {
            assert_eq!(ratios["bestStatic"], b["title"], "{report}");
            if f(&b["listsServedPerMinute"]) > 0.0 {
                assert!(
                    close(
                        f(&ratios["protectedVsBestStatic"]),
                        f(&prot["listsServedPerMinute"]) / f(&b["listsServedPerMinute"])
                    ),
                    "{report}"
                );
            }
        }
        None => assert!(ratios["bestStatic"].is_null(), "{report}"),
    }
    assert_eq!(ratios["unprotectedTarget"], 10.0, "{report}");
    assert_eq!(
        crashes(prot),
        0,
        "tollgate did not prevent a crash: {report}"
    );
    assert!(
        crashes(unprot) > 0 || p99(unprot) >= 2.0 * p99(prot),
        "the protected run is not better than the unprotected one: {report}"
    );
    assert!(
        f(&prot["listsServedPerMinute"]) > 0.0,
        "tollgate served no LIST at all: {report}"
    );

    // The page: nothing external, then what a browser shows.
    let html = std::fs::read_to_string(&page).expect("report.html");
    let external: Vec<String> = links(&html)
        .into_iter()
        .filter(|l| l.to_ascii_lowercase().contains("http"))
        .collect();
    assert!(external.is_empty(), "external resources: {external:?}");
    assert!(out.join("summary.md").exists());

    let dom = dump_dom(&page);
    let svgs = dom.matches("<svg").count();
    let paths = dom.matches("<path class=\"series\"").count();
    let points = dom.matches("<circle class=\"point\"").count();
    assert!(
        svgs >= 6 && paths >= 6 && points >= 50,
        "charts missing from the rendered page: {svgs} svg, {paths} lines, {points} points"
    );
    // The headline numbers, as the page formats them.
    for hl in [base, base_tg, unprot, prot] {
        let title = hl["title"].as_str().expect("title");
        assert!(dom.contains(title), "{title} missing from the page");
        let shown = bench::report::fmt(p99(hl));
        assert!(
            dom.contains(&format!("<td>{shown}</td>")),
            "PATCH p99 {shown} of {title} missing from the page"
        );
    }
    // Goodput per run, beside the heartbeat p99 and p50.
    assert!(
        dom.contains("<th>LISTs served/min (goodput)</th>"),
        "no goodput column on the page"
    );
    for hl in s["headline"].as_array().expect("headline") {
        let title = hl["title"].as_str().expect("title");
        let g = bench::report::fmt((f(&hl["listsServedPerMinute"]) * 10.0).round() / 10.0);
        let row = format!(
            "<td>{}</td><td>{}</td><td>{g}</td>",
            bench::report::fmt(p99(hl)),
            bench::report::fmt(f(&hl["patchP50Ms"]))
        );
        assert!(
            dom.contains(&row),
            "{title}'s goodput {g} missing from the page"
        );
    }
    let ratio = format!("{:.2}×", f(&ratios["protectedVsTollgateBaseline"]));
    assert!(
        dom.contains(&format!("<td>{ratio}</td>")),
        "the protected ratio {ratio} is missing from the page"
    );
}

/// The capacity search over two cluster sizes (the sim seeded with 10 and 20 nodes), with an
/// SLO whose verdict depends on the load alone (as in `capacity.rs`): each size sustains 2
/// LIST/s with the least in-flight limit tried, so the fit is flat at 100, and the report
/// shows both sizes' grids and the recommendation, self-contained.
#[test]
fn capacity_over_cluster_sizes_writes_the_sizing_report() {
    const EXECUTION: &str = r#"
name: sized
sut:
  sim: {args: [--pods, "20", --max-requests-inflight, "{resource}"]}
loadgen:
  args: [--lists, "{load}/s", --list-resource, pods, -A]
duration: 4s
load: {name: LIST calls/s, values: [1, 2, 8]}
resource: {name: in-flight, values: [100, 200]}
slos:
  - {name: LISTs served per minute, operation: list, measure: okPerMinute, max: 200}
search: {metric: capacity, strategy: binary, lowerBound: true}
clusterSize:
  unit: nodes
  targetLoad: 2
  sizes:
    - {size: 10, simArgs: [--nodes, "10"]}
    - {size: 20, simArgs: [--nodes, "20"]}
"#;
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    std::fs::write(dir.join("exec.yaml"), EXECUTION).expect("writing exec.yaml");
    let out = bench_command()
        .arg("capacity")
        .arg(dir.join("exec.yaml"))
        .arg("--output")
        .arg(dir.join("out"))
        .output()
        .expect("running capacity");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = std::fs::read_to_string(dir.join("out/sizing.json")).expect("sizing.json");
    let s: serde_json::Value = serde_json::from_str(&text).expect("sizing.json is JSON");
    let needed: Vec<f64> = s["sizes"]
        .as_array()
        .expect("sizes")
        .iter()
        .map(|z| f(&z["needed"]))
        .collect();
    assert_eq!(needed, [100.0, 100.0], "{s:#}\n{stderr}");
    assert_eq!(f(&s["fit"]["intercept"]), 100.0, "{s:#}");
    assert_eq!(f(&s["fit"]["slope"]), 0.0, "{s:#}");
    for size in ["10", "20"] {
        let sub = dir.join("out/sizes").join(size);
        assert!(sub.join("capacity.json").exists() && sub.join("report.html").exists());
    }
    let html = std::fs::read_to_string(dir.join("out/report.html")).expect("report.html");
    let external: Vec<String> = links(&html)
        .into_iter()
        .filter(|l| l.to_ascii_lowercase().contains("http"))
        .collect();
    assert!(external.is_empty(), "external resources: {external:?}");
    assert_eq!(
        html.matches("class=\"verdict\"").count(),
        12,
        "two 3×2 grids"
    );
    assert!(html.contains("Linear fit"), "no recommendation in the page");
}
