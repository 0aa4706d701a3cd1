//! `--server-metrics URL...`: scrapes Prometheus `/metrics` of the apiserver,
//! etcd or the simulator during the run and reports CPU (cores) and memory
//! average and peak, naming the series used. The simulator's
//! `tollgate_sim_virtual_cpu_seconds_total` / `tollgate_sim_virtual_memory_bytes`
//! win over `process_cpu_seconds_total` / `process_resident_memory_bytes`.

use std::time::Duration;

use http_body_util::BodyExt;
use kubeio::promtext::first_of;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::credentials::Credentials;
use crate::target::{ApiClient, TargetError, TargetOptions};

const CPU: [&str; 2] = [
    "tollgate_sim_virtual_cpu_seconds_total",
    "process_cpu_seconds_total",
];
const MEMORY: [&str; 2] = [
    "tollgate_sim_virtual_memory_bytes",
    "process_resident_memory_bytes",
];

/// What one metrics source showed during the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerMetricsSummary {
    pub url: String,
    pub samples: u64,
    pub scrape_errors: u64,
    /// The counter CPU was computed from, if any was found.
    pub cpu_source: Option<String>,
    pub cpu_cores_avg: Option<f64>,
    pub cpu_cores_peak: Option<f64>,
    pub memory_source: Option<String>,
    pub memory_bytes_avg: Option<f64>,
    pub memory_bytes_peak: Option<f64>,
}

#[derive(Debug, Default)]
struct Series {
    summary: ServerMetricsSummary,
    cpu: Vec<(Instant, f64)>,
    memory: Vec<f64>,
}

impl Series {
    fn add(&mut self, at: Instant, text: &str) {
        self.summary.samples += 1;
        if let Some((name, v)) = first_of(text, &CPU) {
            self.summary.cpu_source = Some(name.to_string());
            self.cpu.push((at, v));
        }
        if let Some((name, v)) = first_of(text, &MEMORY) {
            self.summary.memory_source = Some(name.to_string());
            self.memory.push(v);
        }
    }

    fn finish(mut self) -> ServerMetricsSummary {
        if let (Some(first), Some(last)) = (self.cpu.first(), self.cpu.last()) {
            let secs = last.0.duration_since(first.0).as_secs_f64();
            if secs > 0.0 {
                self.summary.cpu_cores_avg = Some((last.1 - first.1).max(0.0) / secs);
                let peak = self
                    .cpu
                    .windows(2)
                    .filter_map(|w| {
                        let dt = w[1].0.duration_since(w[0].0).as_secs_f64();
                        (dt > 0.0).then(|| (w[1].1 - w[0].1).max(0.0) / dt)
                    })
                    .fold(0.0, f64::max);
                self.summary.cpu_cores_peak = Some(peak);
            }
        }
        if !self.memory.is_empty() {
            let n = self.memory.len() as f64;
            self.summary.memory_bytes_avg = Some(self.memory.iter().sum::<f64>() / n);
            self.summary.memory_bytes_peak = Some(self.memory.iter().copied().fold(0.0, f64::max));
        }
        self.summary
    }
}

/// A scraper for each URL, with the run's credentials.
pub struct Scraper {
    url: String,
    path: String,
    client: ApiClient,
}

impl Scraper {
    /// One scraper per URL.
    pub fn new(
        target: &TargetOptions,
        url: &str,
        credentials: &Credentials,
    ) -> Result<Scraper, TargetError> {
        let uri: http::Uri = url.parse().map_err(|_| TargetError::Url(url.to_string()))?;
        let base = format!(
            "{}://{}",
            uri.scheme_str().unwrap_or("http"),
            uri.authority().map(|a| a.as_str()).unwrap_or("")
        );
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/metrics");
        let path = if path == "/" { "/metrics" } else { path };
        let resolved = target.resolve_with(Some(&base), Some(credentials))?;
        Ok(Scraper {
            url: url.to_string(),
            path: path.to_string(),
            client: ApiClient::new(&resolved),
        })
    }

    /// One scrape's text; `None` when it failed (said as a scrape error by callers).
    pub async fn scrape(&self) -> Option<String> {
        let req = self
            .client
            .request(http::Method::GET, &self.path, None)
            .ok()?;
        let fut = async {
            let resp = self.client.send(req).await.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            String::from_utf8(body.to_vec()).ok()
        };
        tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .ok()
            .flatten()
    }

    /// Scrapes every `interval` until `stop`, once more at the end, and summarizes.
    pub async fn run(self, interval: Duration, stop: CancellationToken) -> ServerMetricsSummary {
        let mut series = Series::default();
        series.summary.url = self.url.clone();
        let mut tick = tokio::time::interval(interval);
        loop {
            let stopping = tokio::select! {
                _ = tick.tick() => false,
                _ = stop.cancelled() => true,
            };
            match self.scrape().await {
                Some(text) => series.add(Instant::now(), &text),
                None => series.summary.scrape_errors += 1,
            }
            if stopping {
                return series.finish();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeio::promtext::sum;

    const TEXT: &str = "# HELP process_cpu_seconds_total Total user and system CPU time.\n\
# TYPE process_cpu_seconds_total counter\n\
process_cpu_seconds_total 12.5\n\
process_resident_memory_bytes 1.048576e+08\n\
process_cpu_seconds_total_extra 99\n\
tollgate_sim_virtual_memory_bytes{instance=\"a\"} 100\n\
tollgate_sim_virtual_memory_bytes{instance=\"b\"} 50 1700000000\n";

    #[test]
    fn reads_values_and_prefers_the_simulator() {
        assert_eq!(sum(TEXT, "process_cpu_seconds_total"), Some(12.5));
        assert_eq!(
            sum(TEXT, "process_resident_memory_bytes"),
            Some(104_857_600.0)
        );
        assert_eq!(
            first_of(TEXT, &MEMORY),
            Some(("tollgate_sim_virtual_memory_bytes", 150.0))
        );
        assert_eq!(
            first_of(TEXT, &CPU),
            Some(("process_cpu_seconds_total", 12.5))
        );
        assert_eq!(sum(TEXT, "absent"), None);
    }

    #[test]
    fn cpu_average_and_peak_from_counter_deltas() {
        let t0 = Instant::now();
        let mut s = Series::default();
        s.add(
            t0,
            "process_cpu_seconds_total 10\nprocess_resident_memory_bytes 100\n",
        );
        s.add(
            t0 + Duration::from_secs(1),
            "process_cpu_seconds_total 10.5\nprocess_resident_memory_bytes 300\n",
        );
        s.add(
            t0 + Duration::from_secs(2),
            "process_cpu_seconds_total 12.5\nprocess_resident_memory_bytes 200\n",
        );
        let sum = s.finish();
        assert_eq!(sum.cpu_cores_avg, Some(1.25));
        assert_eq!(sum.cpu_cores_peak, Some(2.0));
        assert_eq!(sum.memory_bytes_avg, Some(200.0));
        assert_eq!(sum.memory_bytes_peak, Some(300.0));
        assert_eq!(sum.cpu_source.as_deref(), Some("process_cpu_seconds_total"));
    }
}
