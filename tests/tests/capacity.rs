//! `tollgate-bench capacity` end to end: a small execution against the simulated apiserver,
//! run by the real binaries, with an SLO whose verdict depends on the load alone (LISTs
//! served per minute ≤ 200), so the capacity is known in advance whatever the machine's
//! speed: 2 LIST/s passes, 8/s fails. Then the same execution killed after its first
//! experiment and rerun: the rerun replays what was stored and runs only what is missing.
//! Through tollgate, the capacity is the goodput (LISTs served per minute) of the experiment
//! within the SLOs that served the most, not the offered load tollgate answered with 429s.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tests::bench_command;

const EXECUTION: &str = r#"
name: lists-per-minute
sut:
  sim: {args: [--pods, "{resource}"]}
loadgen:
  args: [--lists, "{load}/s", --list-resource, pods, -A]
duration: 4s
load: {name: LIST calls/s, values: [1, 2, 8]}
resource: {name: pods, values: [10, 20]}
slos:
  - {name: LISTs served per minute, operation: list, measure: okPerMinute, max: 200}
  - {operation: list, measure: serverErrorRate, max: 0}
search: {metric: capacity, strategy: binary, lowerBound: true}
"#;

fn command(dir: &Path) -> Command {
    let mut c = bench_command();
    c.arg("capacity")
        .arg(dir.join("exec.yaml"))
        .arg("--output")
        .arg(dir.join("out"));
    c
}

fn capacity_json(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("out/capacity.json")).expect("capacity.json");
    serde_json::from_str(&text).expect("capacity.json is JSON")
}

fn records(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("out/results.jsonl"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn cells(records: &[serde_json::Value]) -> Vec<(u64, u64)> {
    records
        .iter()
        .map(|r| {
            (
                r["loadIndex"].as_u64().expect("loadIndex"),
                r["resourceIndex"].as_u64().expect("resourceIndex"),
            )
        })
        .collect()
}

fn setup() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().to_owned();
    std::fs::write(dir.join("exec.yaml"), EXECUTION).expect("writing exec.yaml");
    (tmp, dir)
}

#[test]
fn capacity_is_the_highest_load_within_the_slos() {
    let (_tmp, dir) = setup();
    let out = command(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let c = capacity_json(&dir);
    let values: Vec<f64> = c["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["value"].as_f64().unwrap_or(-1.0))
        .collect();
    assert_eq!(values, vec![2.0, 2.0], "{c:#}\n{stderr}");
    // Binary search with the lower bound skips cells: not the whole 3 × 2 grid.
    let ran = cells(&records(&dir));
    assert!(ran.len() < 6, "{ran:?}");
    let summary = std::fs::read_to_string(dir.join("out/summary.md")).unwrap();
    assert!(summary.contains("| 10 | 2 |"), "{summary}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Capacity: lists-per-minute"));
}

#[test]
fn a_killed_run_resumes_without_repeating_an_experiment() {
    let (_tmp, dir) = setup();
    let mut child = command(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while records(&dir).is_empty() {
        assert!(Instant::now() < deadline, "no experiment finished in 120 s");
        assert!(child.try_wait().unwrap().is_none(), "capacity exited early");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Ctrl-C or SIGTERM is how a user stops it; the experiment in progress is abandoned.
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(!child.wait().unwrap().success());
    let before = cells(&records(&dir));
    assert!(!before.is_empty());

    let out = command(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("replaying"), "{stderr}");
    let after = cells(&records(&dir));
    let mut unique = after.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        after.len(),
        "an experiment ran twice: {after:?}"
    );
    assert_eq!(&after[..before.len()], &before[..]);
    let c = capacity_json(&dir);
    assert_eq!(c["experimentsReplayed"].as_u64(), Some(before.len() as u64));
    let values: Vec<f64> = c["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["value"].as_f64().unwrap_or(-1.0))
        .collect();
    assert_eq!(values, vec![2.0, 2.0]);
}

/// Through tollgate, each experiment samples tollgate's quota pool once a second into its
/// `quota.csv`, and the report charts it.
#[test]
fn an_experiment_through_tollgate_records_the_quota_pool() {
    const BURST: f64 = 1_000_000.0;
    let execution = format!(
        r#"
name: through-tollgate
sut:
  sim: {{args: [--pods, "20"]}}
  tollgate: {{args: [--mode, enforce, --quota-mode, static, --quota-bytes-per-second, "{{resource}}", --quota-burst-bytes, "{BURST}"]}}
loadgen:
  args: [--lists, "{{load}}/s", --list-resource, pods, -A]
duration: 4s
load: {{name: LIST calls/s, values: [2]}}
resource: {{name: quota bytes/s, values: [100000]}}
slos:
  - {{name: LISTs served per minute, operation: list, measure: okPerMinute, min: 1}}
search: {{metric: capacity, strategy: full}}
"#
    );
    let (_tmp, dir) = setup();
    std::fs::write(dir.join("exec.yaml"), execution).expect("writing exec.yaml");
    let out = command(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let recs = records(&dir);
    assert_eq!(recs.len(), 1, "{stderr}");
    let exp = dir
        .join("out")
        .join(recs[0]["output"].as_str().expect("output"));
    let csv = std::fs::read_to_string(exp.join("quota.csv")).expect("quota.csv");
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("second,quota_available_bytes"));
    let levels: Vec<f64> = lines
        .map(|l| {
            let (_, v) = l.split_once(',').expect("two columns");
            v.parse().expect("a number")
        })
        .collect();
    // A 4-second run sampled each second; the pool never holds more than its burst.
    assert!(levels.len() >= 2, "{csv}");
    assert!(levels.iter().all(|v| *v <= BURST), "{csv}");
    let html = std::fs::read_to_string(dir.join("out/report.html")).expect("report.html");
    assert!(html.contains("Quota pool level"), "no quota chart");
}

/// Through tollgate (a fixed pool far below the highest load offered), every experiment
/// records what it served, and the capacity is the most LISTs served per minute among the
/// experiments within the SLOs, at the load that served them — not the highest load offered,
/// which mostly got 429s.
#[test]
fn through_tollgate_the_capacity_is_the_most_goodput_within_the_slos() {
    const EXECUTION: &str = r#"
name: goodput
sut:
  sim: {args: [--pods, "400", --pod-bytes, "3000"]}
  tollgate: {args: [--mode, enforce, --quota-mode, static, --quota-bytes-per-second, "{resource}", --quota-burst-bytes, "2000000", --max-wait, "1"]}
loadgen:
  args: [--lists, "{load}/min", --list-resource, pods, -A]
duration: 4s
load: {name: LIST calls/min, values: [60, 240, 960]}
resource: {name: quota bytes/s, values: [1000000]}
slos:
  - {name: LISTs served per minute, operation: list, measure: okPerMinute, min: 1}
search: {metric: capacity, strategy: full}
"#;
    let (_tmp, dir) = setup();
    std::fs::write(dir.join("exec.yaml"), EXECUTION).expect("writing exec.yaml");
    let out = command(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let c = capacity_json(&dir);
    assert_eq!(c["maximises"], "goodput", "{c:#}");
    // Every run's goodput and served bytes, beside the load it was offered.
    let exps = c["experiments"].as_array().expect("experiments");
    assert_eq!(exps.len(), 3, "{c:#}");
    for e in exps {
        let g = e["listsServedPerMinute"].as_f64().expect("goodput per run");
        assert!(
            e["servedBytes"].as_u64().expect("served bytes per run") > 0,
            "{e}"
        );
        assert!(g > 0.0 && g <= 1.05 * e["load"].as_f64().unwrap(), "{e}");
    }
    for r in records(&dir) {
        assert!(r["listsServedPerMinute"].as_f64().is_some(), "{r}");
    }
    // The chosen point: the passing experiment with the most served.
    let best = exps
        .iter()
        .filter(|e| e["ok"] == true)
        .max_by(|a, b| {
            f64::total_cmp(
                &a["listsServedPerMinute"].as_f64().unwrap(),
                &b["listsServedPerMinute"].as_f64().unwrap(),
            )
        })
        .expect("an experiment within the SLOs");
    let point = &c["values"][0];
    assert_eq!(point["value"], best["listsServedPerMinute"], "{c:#}");
    assert_eq!(point["load"], best["load"], "{c:#}");
    assert_eq!(point["servedBytes"], best["servedBytes"], "{c:#}");
    // The pool serves far fewer than the 960/min offered at the top, which passed.
    assert_eq!(exps[2]["ok"], true, "{c:#}");
    assert!(point["value"].as_f64().unwrap() < 480.0, "{c:#}");
    let summary = std::fs::read_to_string(dir.join("out/summary.md")).unwrap();
    assert!(summary.contains("LISTs served/min (goodput)"), "{summary}");
}
