//! ClusterLoader2's `ResourceUsageSummary`, measured from outside the cluster.
//!
//! CL2 reads each system container's CPU and working set through the
//! kubelets' summary API, every 10 s on the control plane. loadgen cannot see
//! containers: it samples the servers' own `/metrics` (the process collector's
//! `process_cpu_seconds_total` and `process_resident_memory_bytes`, which
//! kube-apiserver, etcd, tollgate and the simulator all serve), names each
//! process by what its metrics show (`kube-apiserver`, `etcd`, `tollgate`,
//! `tollgate-sim`, …), and writes CL2's file: percentile (`"50"`, `"90"`,
//! `"99"`, `"100"`) → `[{Name, CPU, Mem}]`, one entry per process, named as a
//! CL2 container (`{component}-{host:port}/{component}`) so perfdash and CL2's
//! `resourceConstraints` (keyed by the part after `/`) read it unchanged.
//!
//! The same samples keep the etcd and kube-scheduler texts that TestMetrics'
//! parts read ([`super::test_metrics`]).

use std::collections::BTreeMap;
use std::time::Duration;

use kubeio::promtext::{samples, unlabelled};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::server_metrics::Scraper;

/// CL2's `StopAndSummarize([]int{50, 90, 99, 100})`.
pub const PERCENTILES: [u32; 4] = [50, 90, 99, 100];

/// CL2's control-plane sampling period (`MasterResourceDataGatheringPeriod`).
pub const INTERVAL: Duration = Duration::from_secs(10);

const ETCD_DB_SIZE: [&str; 2] = [
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_debugging_mvcc_db_total_size_in_bytes",
];

/// CL2's `ResourceConstraint`: limits on a container's 99th percentile
/// (0 or absent: none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Constraint {
    #[serde(default)]
    pub cpu_constraint: f64,
    #[serde(default)]
    pub memory_constraint: u64,
}

/// What is named in a `/metrics`: the component serving it.
pub fn component_of(text: &str) -> &'static str {
    let has = |prefix: &str| samples(text).any(|s| s.name.starts_with(prefix));
    if has("tollgate_sim_") {
        "tollgate-sim"
    } else if has("tollgate_") {
        "tollgate"
    } else if has("etcd_server_") {
        "etcd"
    } else if has("scheduler_schedule_attempts_") || has("scheduler_pending_pods") {
        // Before kube-apiserver: a scheduler may serve apiserver_* client series.
        "kube-scheduler"
    } else if has("apiserver_request_") {
        "kube-apiserver"
    } else {
        "process"
    }
}

/// What one `/metrics` URL showed between start and gather.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampled {
    pub url: String,
    pub component: Option<&'static str>,
    pub scrapes: u64,
    pub scrape_errors: u64,
    /// Cores used between consecutive scrapes.
    pub cpu_cores: Vec<f64>,
    pub memory_bytes: Vec<u64>,
    /// For etcd: the last scrape's text (its histograms are cumulative, read
    /// once at gather as CL2 does) and the largest database size seen.
    pub etcd_last: Option<String>,
    pub etcd_max_db_size: f64,
    /// For kube-scheduler: the first and last scrapes' texts (CL2 subtracts
    /// the histograms read at start from those read at gather).
    pub scheduler_first: Option<String>,
    pub scheduler_last: Option<String>,
}

impl Sampled {
    pub(super) fn add(&mut self, at: Instant, text: String, last_cpu: &mut Option<(Instant, f64)>) {
        self.scrapes += 1;
        let component = *self.component.get_or_insert_with(|| component_of(&text));
        if let Some(cpu) = unlabelled(&text, "process_cpu_seconds_total") {
            if let Some((t0, c0)) = *last_cpu {
                let dt = at.duration_since(t0).as_secs_f64();
                if dt > 0.0 {
                    self.cpu_cores.push((cpu - c0).max(0.0) / dt);
                }
            }
            *last_cpu = Some((at, cpu));
        }
        if let Some(mem) = unlabelled(&text, "process_resident_memory_bytes") {
            self.memory_bytes.push(mem.max(0.0) as u64);
        }
        if component == "etcd" {
            if let Some(size) = ETCD_DB_SIZE.iter().find_map(|n| unlabelled(&text, n)) {
                self.etcd_max_db_size = self.etcd_max_db_size.max(size);
            }
            self.etcd_last = Some(text);
        } else if component == "kube-scheduler" {
            if self.scheduler_first.is_none() {
                self.scheduler_first = Some(text);
            } else {
                self.scheduler_last = Some(text);
            }
        }
    }

    /// CL2's container name: `{pod}/{container}`, the pod named as a static
    /// control-plane pod is (`kube-apiserver-<node>`), here after the address.
    pub fn name(&self) -> String {
        let c = self.component.unwrap_or("process");
        let host = self
            .url
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.authority().map(|a| a.to_string()))
            .unwrap_or_else(|| self.url.clone());
        format!("{c}-{host}/{c}")
    }
}

/// Scrapes `scraper` every `interval` (at once, then until `stop`, once more
/// at the end) and keeps each sample.
pub async fn sample(
    scraper: Scraper,
    url: String,
    interval: Duration,
    stop: CancellationToken,
) -> Sampled {
    let mut s = Sampled {
        url,
        ..Sampled::default()
    };
    let mut last_cpu = None;
    let mut tick = tokio::time::interval(interval);
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.cancelled() => true,
        };
        match scraper.scrape().await {
            Some(text) => s.add(Instant::now(), text, &mut last_cpu),
            None => s.scrape_errors += 1,
        }
        if stopping {
            return s;
        }
    }
}

/// CL2's `ComputePercentiles`: the sorted series' element at
/// `ceil(n * p / 100) - 1`.
fn percentile<T: Copy + PartialOrd>(sorted: &[T], p: u32) -> Option<T> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let idx = (n * p as usize).div_ceil(100).saturating_sub(1);
    sorted.get(idx.min(n - 1)).copied()
}

/// CL2's `ResourceUsageSummary` file: `{"50": [{"Name", "CPU", "Mem"}], …}`,
/// names sorted; empty when nothing was sampled (as CL2's with no worker).
pub fn summary(sampled: &[Sampled]) -> Value {
    let mut rows: Vec<(String, Vec<f64>, Vec<u64>)> = sampled
        .iter()
        .filter(|s| !s.cpu_cores.is_empty() || !s.memory_bytes.is_empty())
        .map(|s| {
            let mut cpu = s.cpu_cores.clone();
            cpu.sort_by(f64::total_cmp);
            let mut mem = s.memory_bytes.clone();
            mem.sort_unstable();
            (s.name(), cpu, mem)
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = serde_json::Map::new();
    if rows.is_empty() {
        return Value::Object(out);
    }
    // Go's encoding/json writes a map's keys sorted: "100", "50", "90", "99".
    let mut keys = PERCENTILES;
    keys.sort_by_key(|p| p.to_string());
    for p in keys {
        let items: Vec<Value> = rows
            .iter()
            .map(|(name, cpu, mem)| {
                json!({
                    "Name": name,
                    "CPU": percentile(cpu, p).unwrap_or(0.0),
                    "Mem": percentile(mem, p).unwrap_or(0),
                })
            })
            .collect();
        out.insert(p.to_string(), Value::Array(items));
    }
    Value::Object(out)
}

/// One constraint checked: a container's 99th percentile against its limit.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstraintCheck {
    /// As CL2 says a violation: `container N is using X/Y CPU` (`MB of memory`).
    pub subject: String,
    pub limit: f64,
    pub used: f64,
    /// `cores` or `MB`.
    pub unit: &'static str,
    pub met: bool,
}

/// CL2's `verifySummary`: each 99th-percentile entry against its
/// container's constraint (the part of the name after `/`).
pub fn constraint_checks(
    summary: &Value,
    constraints: &BTreeMap<String, Constraint>,
) -> Vec<ConstraintCheck> {
    let mut out = Vec::new();
    for item in summary["99"].as_array().into_iter().flatten() {
        let name = item["Name"].as_str().unwrap_or_default();
        let container = name.split('/').nth(1).unwrap_or_default();
        let Some(c) = constraints.get(container) else {
            continue;
        };
        let cpu = item["CPU"].as_f64().unwrap_or(0.0);
        if c.cpu_constraint > 0.0 {
            out.push(ConstraintCheck {
                subject: format!("container {name} is using {cpu}/{} CPU", c.cpu_constraint),
                limit: c.cpu_constraint,
                used: cpu,
                unit: "cores",
                met: cpu <= c.cpu_constraint,
            });
        }
        let mem = item["Mem"].as_u64().unwrap_or(0);
        if c.memory_constraint > 0 {
            let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
            out.push(ConstraintCheck {
                subject: format!(
                    "container {name} is using {}/{} MB of memory",
                    mb(mem),
                    mb(c.memory_constraint)
                ),
                limit: mb(c.memory_constraint),
                used: mb(mem),
                unit: "MB",
                met: mem <= c.memory_constraint,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(url: &str, component: &'static str, cpu: &[f64], mem: &[u64]) -> Sampled {
        Sampled {
            url: url.into(),
            component: Some(component),
            cpu_cores: cpu.to_vec(),
            memory_bytes: mem.to_vec(),
            ..Sampled::default()
        }
    }

    #[test]
    fn percentiles_are_cl2s_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50), Some(5.0));
        assert_eq!(percentile(&v, 90), Some(9.0));
        assert_eq!(percentile(&v, 99), Some(10.0));
        assert_eq!(percentile(&v, 100), Some(10.0));
        assert_eq!(percentile(&[7u64], 50), Some(7));
        assert_eq!(percentile::<u64>(&[], 50), None);
    }

    #[test]
    fn the_summary_has_cl2s_shape_per_percentile() {
        let s = summary(&[
            sampled(
                "http://127.0.0.1:2379/metrics",
                "etcd",
                &[0.2, 0.1, 0.4],
                &[300, 100, 200],
            ),
            sampled("https://10.0.0.1:6443", "kube-apiserver", &[1.5], &[1000]),
        ]);
        let keys: Vec<&String> = s.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["100", "50", "90", "99"]);
        let p50 = s["50"].as_array().expect("array");
        assert_eq!(p50.len(), 2);
        assert_eq!(p50[0]["Name"], "etcd-127.0.0.1:2379/etcd");
        assert_eq!(p50[0]["CPU"], 0.2);
        assert_eq!(p50[0]["Mem"], 200);
        assert_eq!(s["100"][0]["CPU"], 0.4);
        assert_eq!(s["100"][0]["Mem"], 300);
        assert_eq!(
            p50[1]["Name"],
            "kube-apiserver-10.0.0.1:6443/kube-apiserver"
        );
        assert_eq!(summary(&[]), json!({}));
    }

    #[test]
    fn constraints_are_checked_on_the_99th_percentile_by_container() {
        let s = summary(&[sampled("http://a:1", "kube-apiserver", &[2.0], &[3 << 20])]);
        let mut c = BTreeMap::new();
        c.insert(
            "kube-apiserver".to_string(),
            Constraint {
                cpu_constraint: 1.0,
                memory_constraint: 0,
            },
        );
        let v = constraint_checks(&s, &c);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(!v[0].met && v[0].subject.contains("2/1 CPU"), "{v:?}");
        c.insert(
            "kube-apiserver".into(),
            Constraint {
                cpu_constraint: 4.0,
                memory_constraint: 1 << 20,
            },
        );
        let v = constraint_checks(&s, &c);
        let missed: Vec<&str> = v
            .iter()
            .filter(|c| !c.met)
            .map(|c| c.subject.as_str())
            .collect();
        assert_eq!(
            missed,
            ["container kube-apiserver-a:1/kube-apiserver is using 3/1 MB of memory"]
        );
        assert_eq!(v.len(), 2, "the CPU limit is checked and met: {v:?}");
    }

    #[test]
    fn samples_give_cpu_rates_memory_and_the_component() {
        let t0 = Instant::now();
        let mut s = Sampled::default();
        let mut last = None;
        let text = |cpu: f64, mem: u64| {
            format!("apiserver_request_total{{verb=\"GET\"}} 3\nprocess_cpu_seconds_total {cpu}\nprocess_resident_memory_bytes {mem}\n")
        };
        s.add(t0, text(10.0, 100), &mut last);
        s.add(t0 + Duration::from_secs(2), text(11.0, 300), &mut last);
        s.add(t0 + Duration::from_secs(4), text(15.0, 200), &mut last);
        assert_eq!(s.component, Some("kube-apiserver"));
        assert_eq!(s.cpu_cores, [0.5, 2.0]);
        assert_eq!(s.memory_bytes, [100, 300, 200]);
        assert!(s.etcd_last.is_none());
    }

    #[test]
    fn components_are_named_by_their_metrics() {
        assert_eq!(
            component_of("tollgate_sim_virtual_cpu_seconds_total 1\napiserver_request_total 1\n"),
            "tollgate-sim"
        );
        assert_eq!(component_of("tollgate_budget_bytes 1\n"), "tollgate");
        assert_eq!(component_of("etcd_server_has_leader 1\n"), "etcd");
        assert_eq!(
            component_of("apiserver_request_total{code=\"200\"} 1\n"),
            "kube-apiserver"
        );
        assert_eq!(
            component_of("scheduler_pending_pods{queue=\"active\"} 0\napiserver_request_total 1\n"),
            "kube-scheduler"
        );
        assert_eq!(component_of("process_cpu_seconds_total 1\n"), "process");
    }
}
