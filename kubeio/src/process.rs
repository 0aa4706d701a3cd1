//! This process's own cost, read from `/proc/self` at scrape time, exported under the names
//! client_golang's process collector uses (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`), so the dashboards and alerts written for any Kubernetes
//! component read tollgate and the simulator the same way. Off Linux every figure reads 0.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// `USER_HZ`: the unit of the CPU times in `/proc/self/stat`, 100 on every Linux architecture
/// Kubernetes runs on.
const TICKS_PER_SECOND: f64 = 100.0;
/// The unit of `/proc/self/statm` (4 KiB pages on x86-64 and arm64 as Kubernetes nodes run them).
const PAGE_BYTES: f64 = 4096.0;

/// What this process costs right now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// User plus system CPU seconds since the process started.
    pub cpu_seconds: f64,
    /// Resident memory in bytes.
    pub resident_bytes: f64,
    /// Open file descriptors.
    pub open_fds: f64,
    /// The soft limit on open file descriptors (`RLIMIT_NOFILE`).
    pub max_fds: f64,
}

/// This process's usage from `/proc/self`; a figure that cannot be read is 0.
pub fn usage() -> Usage {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let cpu_seconds = stat_fields(&stat)
        .and_then(|f| {
            let utime: f64 = f.get(11)?.parse().ok()?;
            let stime: f64 = f.get(12)?.parse().ok()?;
            Some((utime + stime) / TICKS_PER_SECOND)
        })
        .unwrap_or_default();
    let resident_bytes = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map(|pages| pages * PAGE_BYTES)
        .unwrap_or_default();
    // The directory's own descriptor is counted too, as client_golang counts it.
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as f64)
        .unwrap_or_default();
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| max_open_files(&s))
        .unwrap_or_default();
    Usage {
        cpu_seconds,
        resident_bytes,
        open_fds,
        max_fds,
    }
}

/// When this process started, in seconds since the Unix epoch: its start in clock ticks after
/// boot (`/proc/self/stat`) plus the boot time (`/proc/stat`'s `btime`); now if either is
/// unreadable.
pub fn start_time() -> f64 {
    let after_boot = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_fields(&s)?.get(19)?.parse::<f64>().ok());
    let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse::<f64>()
            .ok()
    });
    match (boot, after_boot) {
        (Some(boot), Some(ticks)) => boot + ticks / TICKS_PER_SECOND,
        _ => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default(),
    }
}

/// The fields of `/proc/PID/stat` after the command name (which may hold spaces and
/// parentheses), so index 0 is the state (field 3 of proc(5)).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat.rsplit_once(')')?.1.split_whitespace().collect())
}

/// The soft "Max open files" of `/proc/PID/limits`; `unlimited` is `f64::INFINITY`.
fn max_open_files(limits: &str) -> Option<f64> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    match rest.split_whitespace().next()? {
        "unlimited" => Some(f64::INFINITY),
        soft => soft.parse().ok(),
    }
}

// === impl ProcessCollector ===

/// The `process_*` families, read at each scrape. Register with
/// `registry.register_collector(Box::new(ProcessCollector::new()))`.
#[derive(Debug, Clone)]
pub struct ProcessCollector {
    /// `process_start_time_seconds` as f64 bits.
    start_time: Arc<AtomicU64>,
}

impl ProcessCollector {
    /// With the process's real start time.
    pub fn new() -> ProcessCollector {
        ProcessCollector::with_start_time(Arc::new(AtomicU64::new(start_time().to_bits())))
    }

    /// With a start time (f64 bits) the owner may move: the simulator moves it at each restart
    /// it models, as a restarted apiserver's would.
    pub fn with_start_time(start_time: Arc<AtomicU64>) -> ProcessCollector {
        ProcessCollector { start_time }
    }

    /// The start time it exports, as f64 bits, shared.
    pub fn start_time(&self) -> &Arc<AtomicU64> {
        &self.start_time
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        ProcessCollector::new()
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let u = usage();
        ConstCounter::new(u.cpu_seconds).encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            MetricType::Counter,
        )?)?;
        let start = f64::from_bits(self.start_time.load(Ordering::Relaxed));
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                u.resident_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                u.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                u.max_fds,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                start,
            ),
        ] {
            ConstGauge::new(value).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                MetricType::Gauge,
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may unwrap
mod tests {
    use super::*;

    #[test]
    fn stat_fields_start_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 12345 0";
        let f = stat_fields(stat).unwrap();
        assert_eq!(f[0], "S");
        assert_eq!((f[11], f[12]), ("250", "50"));
        assert_eq!(f[19], "12345");
    }

    #[test]
    fn max_open_files_is_the_soft_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024.0));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(max_open_files(unlimited), Some(f64::INFINITY));
        assert_eq!(max_open_files("nothing"), None);
    }

    #[test]
    fn this_process_has_a_cost_and_a_start_in_the_past() {
        let u = usage();
        assert!(u.resident_bytes > 0.0, "{u:?}");
        assert!(u.open_fds >= 3.0, "stdin, stdout, stderr at least: {u:?}");
        assert!(u.max_fds >= u.open_fds, "{u:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = start_time();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
    }

    #[test]
    fn the_collector_exports_every_family() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "{name} in\n{text}"
            );
        }
    }
}
