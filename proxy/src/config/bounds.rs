//! The range of every duration, size, rate and count in the configuration,
//! checked wherever a configuration is accepted (start, `check-config`,
//! reload). Without upper bounds, values that parse were accepted and
//! panicked later, far from the file: `timeouts.idleSeconds: 1e300` in every
//! new connection (`Duration::from_secs_f64`), `drain.windowSeconds: 1e20` at
//! SIGTERM, and a duration that converts but is huge overflows
//! `Instant + Duration`. Without lower bounds a tiny period became a zero
//! `Duration` (tokio's `interval` panics on it) and a tiny request rate an
//! unrepresentable period.
//!
//! Sections checked by their own modules for other reasons (lane rules,
//! the adaptive budget's relations) keep those checks; the table here is
//! only about magnitudes, one line per field.

use std::time::Duration;

use super::{Config, ConfigError};

/// Longest duration of any setting: one day. Far beyond any useful timeout,
/// wait or period, and far from `Instant`'s overflow.
pub const MAX_SECONDS: f64 = 86_400.0;

/// Shortest nonzero duration: 1 ms. Shorter ones round to a zero `Duration`
/// or spin.
pub const MIN_SECONDS: f64 = 0.001;

/// Largest size or byte rate: 1 PiB (per second). Products of sizes, weights
/// and cluster sizes then stay finite.
pub const MAX_BYTES: f64 = 1_125_899_906_842_624.0;

/// Largest count (in-flight limits, queue depths, capacities, bursts).
pub const MAX_COUNT: u64 = 10_000_000;

/// Largest ratio or weight (gzip ratio, etcd read weight, jitter).
pub const MAX_FACTOR: f64 = 1000.0;

/// Largest event rate (requests or log lines per second); the smallest
/// nonzero one is [`MIN_PER_SECOND`].
pub const MAX_PER_SECOND: f64 = 1_000_000.0;

/// Smallest nonzero event rate: one per 1000 s.
pub const MIN_PER_SECOND: f64 = 0.001;

/// What a field is, and so its range.
#[derive(Debug, Clone, Copy)]
enum Value {
    /// A duration in `[MIN_SECONDS, MAX_SECONDS]`.
    Seconds(f64),
    /// A duration, or `0` (none).
    SecondsOrZero(f64),
    /// Bytes in `[1, MAX_BYTES]`.
    Bytes(f64),
    /// Bytes, or `0`.
    BytesOrZero(f64),
    /// An event rate in `[MIN_PER_SECOND, MAX_PER_SECOND]`, or `0` (off).
    PerSecondOrZero(f64),
    /// A ratio or weight in `[0, MAX_FACTOR]`.
    Factor(f64),
    /// A ratio in `[MIN_PER_SECOND, MAX_FACTOR]` (never zero).
    PositiveFactor(f64),
    /// A count in `[1, MAX_COUNT]`.
    Count(u64),
    /// A count in `[0, MAX_COUNT]` (`0`: no limit).
    CountOrZero(u64),
}

impl Value {
    /// Why the value is out of its range, if it is.
    fn refusal(self) -> Option<String> {
        use Value::*;
        let float = |v: f64, zero_ok: bool, min: f64, max: f64, unit: &str| {
            if !v.is_finite() {
                return Some(format!("must be a finite number, got {v}"));
            }
            if zero_ok && v == 0.0 {
                return None;
            }
            let or_zero = if zero_ok { "0 or " } else { "" };
            (!(min..=max).contains(&v))
                .then(|| format!("must be {or_zero}between {min} and {max}{unit}, got {v}"))
        };
        match self {
            Seconds(v) | SecondsOrZero(v) => {
                // The conversion every user of the value makes, tried here first.
                if let Err(e) = Duration::try_from_secs_f64(v) {
                    return Some(format!("{v} is not a duration in seconds: {e}"));
                }
                float(
                    v,
                    matches!(self, SecondsOrZero(_)),
                    MIN_SECONDS,
                    MAX_SECONDS,
                    " seconds",
                )
            }
            Bytes(v) => float(v, false, 1.0, MAX_BYTES, " bytes"),
            BytesOrZero(v) => float(v, true, 1.0, MAX_BYTES, " bytes"),
            PerSecondOrZero(v) => float(v, true, MIN_PER_SECOND, MAX_PER_SECOND, " per second"),
            Factor(v) => float(v, true, 0.0, MAX_FACTOR, ""),
            PositiveFactor(v) => float(v, false, MIN_PER_SECOND, MAX_FACTOR, ""),
            Count(n) => (!(1..=MAX_COUNT).contains(&n))
                .then(|| format!("must be between 1 and {MAX_COUNT}, got {n}")),
            CountOrZero(n) => {
                (n > MAX_COUNT).then(|| format!("must be at most {MAX_COUNT}, got {n}"))
            }
        }
    }
}

/// A `usize` as a count (saturating, so a huge one is still refused).
fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl Config {
    /// Every duration, size, rate and count against its range; the first
    /// out of range is refused with its field.
    pub(super) fn validate_bounds(&self) -> Result<(), ConfigError> {
        for (field, value) in self.magnitudes() {
            if let Some(reason) = value.refusal() {
                return Err(ConfigError::Invalid { field, reason });
            }
        }
        Ok(())
    }

    /// The table: each numeric field with what it is.
    fn magnitudes(&self) -> Vec<(&'static str, Value)> {
        use Value::*;
        let up = &self.upstream;
        let t = &self.timeouts;
        let p = &self.patterns;
        let l = &self.lanes;
        let q = &self.quota;
        let a = &q.adaptive;
        let mut table = vec![
            ("maxConnections", Count(count(self.max_connections))),
            (
                "maxConnectionsPerSource",
                CountOrZero(count(self.max_connections_per_source)),
            ),
            (
                "admin.maxConnections",
                Count(count(self.admin.max_connections)),
            ),
            (
                "admin.headerReadSeconds",
                Seconds(self.admin.header_read_seconds),
            ),
            ("admin.idleSeconds", Seconds(self.admin.idle_seconds)),
            (
                "upstream.maxStreamsPerConnection",
                Count(count(up.max_streams_per_connection)),
            ),
            (
                "upstream.maxLightConnections",
                Count(count(up.max_light_connections)),
            ),
            (
                "upstream.connectTimeoutSeconds",
                Seconds(up.connect_timeout_seconds),
            ),
            (
                "upstream.timeouts.watchHeaderSeconds",
                Seconds(up.timeouts.watch_header_seconds),
            ),
            (
                "upstream.timeouts.watchMarginSeconds",
                SecondsOrZero(up.timeouts.watch_margin_seconds),
            ),
            (
                "upstream.timeouts.watchIdleSeconds",
                Seconds(up.timeouts.watch_idle_seconds),
            ),
            (
                "upstream.timeouts.bodyIdleSeconds",
                Seconds(up.timeouts.body_idle_seconds),
            ),
            (
                "upstream.timeouts.pingIntervalSeconds",
                Seconds(up.timeouts.ping_interval_seconds),
            ),
            (
                "upstream.timeouts.pingTimeoutSeconds",
                Seconds(up.timeouts.ping_timeout_seconds),
            ),
            (
                "upstream.healthCheck.intervalSeconds",
                Seconds(up.health_check.interval_seconds),
            ),
            (
                "upstream.healthCheck.timeoutSeconds",
                Seconds(up.health_check.timeout_seconds),
            ),
            (
                "upstream.metricsScrape.intervalSeconds",
                Seconds(up.metrics_scrape.interval_seconds),
            ),
            (
                "upstream.requestHeaders.refreshSeconds",
                Seconds(up.request_headers.refresh_seconds),
            ),
            ("timeouts.headerReadSeconds", Seconds(t.header_read_seconds)),
            ("timeouts.requestSeconds", Seconds(t.request_seconds)),
            ("timeouts.keepAliveSeconds", Seconds(t.keep_alive_seconds)),
            ("timeouts.idleSeconds", Seconds(t.idle_seconds)),
            (
                "drain.windowSeconds",
                SecondsOrZero(self.drain.window_seconds),
            ),
            (
                "tokenReview.cacheSeconds",
                Seconds(self.token_review.cache_seconds),
            ),
            (
                "tokenReview.perSourcePerSecond",
                PositiveFactor(self.token_review.per_source_per_second),
            ),
            (
                "tokenReview.perSourceBurst",
                Count(count(self.token_review.per_source_burst)),
            ),
            (
                "tokenReview.perSourceInFlight",
                Count(count(self.token_review.per_source_in_flight)),
            ),
            ("patterns.capacity", Count(count(p.capacity))),
            ("patterns.halfLifeSeconds", Seconds(p.half_life_seconds)),
            (
                "patterns.defaultListBytes",
                BytesOrZero(p.default_list_bytes),
            ),
            (
                "patterns.defaultRequestBytes",
                BytesOrZero(p.default_request_bytes),
            ),
            ("patterns.defaultObjectBytes", Bytes(p.default_object_bytes)),
            ("patterns.gzipRatio", PositiveFactor(p.gzip_ratio)),
            (
                "lanes.heavyThresholdBytes",
                BytesOrZero(l.heavy_threshold_bytes),
            ),
            ("lanes.maxWaitSeconds", Seconds(l.max_wait_seconds)),
            (
                "lanes.queue.perFlowDepth",
                Count(count(l.queue.per_flow_depth)),
            ),
            ("lanes.queue.maxFlows", Count(count(l.queue.max_flows))),
            (
                "lanes.maxInflight.exempt",
                CountOrZero(count(l.max_inflight.exempt)),
            ),
            (
                "lanes.maxInflight.system",
                CountOrZero(count(l.max_inflight.system)),
            ),
            (
                "lanes.maxInflight.workload",
                CountOrZero(count(l.max_inflight.workload)),
            ),
            (
                "lanes.maxInflight.heavy",
                CountOrZero(count(l.max_inflight.heavy)),
            ),
            (
                "lanes.maxInflight.self",
                CountOrZero(count(l.max_inflight.self_)),
            ),
            ("quota.inflightBytes", Bytes(q.inflight_bytes())),
            ("quota.bytesPerSecond", Bytes(q.bytes_per_second())),
            ("quota.burstBytes", Bytes(q.burst_bytes())),
            ("quota.etcdReadWeight", Factor(q.etcd_read_weight)),
            (
                "quota.global.etcdBytesPerSecond",
                BytesOrZero(q.global.etcd_bytes_per_second),
            ),
            (
                "quota.global.fallbackBytesPerSecond",
                BytesOrZero(q.global.fallback_bytes_per_second),
            ),
            ("quota.maxWaitSeconds", Seconds(q.max_wait_seconds)),
            ("quota.logPerSecond", PerSecondOrZero(q.log_per_second)),
            (
                "quota.queue.perFlowDepth",
                Count(count(q.queue.per_flow_depth)),
            ),
            ("quota.queue.maxFlows", Count(count(q.queue.max_flows))),
            ("quota.queue.quantumBytes", Bytes(q.queue.quantum_bytes)),
            (
                "quota.perClient.requestsPerSecond",
                PerSecondOrZero(q.per_client.requests_per_second),
            ),
            (
                "quota.perClient.burst",
                CountOrZero(u64::from(q.per_client.burst)),
            ),
            (
                "quota.perClient.maxClients",
                Count(count(q.per_client.max_clients)),
            ),
            (
                "quota.retryAfter.minSeconds",
                SecondsOrZero(q.retry_after.min_seconds as f64),
            ),
            (
                "quota.retryAfter.maxSeconds",
                SecondsOrZero(q.retry_after.max_seconds as f64),
            ),
            ("quota.retryAfter.jitter", Factor(q.retry_after.jitter)),
            (
                "quota.scaling.bytesPerSecondPerUnit",
                BytesOrZero(q.scaling.bytes_per_second_per_unit),
            ),
            (
                "quota.scaling.burstBytesPerUnit",
                BytesOrZero(q.scaling.burst_bytes_per_unit),
            ),
            (
                "quota.scaling.refreshSeconds",
                Seconds(q.scaling.refresh_seconds),
            ),
            ("quota.adaptive.baselineFactor", Factor(a.baseline_factor)),
            (
                "quota.adaptive.minBytesPerSecond",
                Bytes(a.min_bytes_per_second),
            ),
            (
                "quota.adaptive.minInflightBytes",
                Bytes(a.min_inflight_bytes),
            ),
            (
                "quota.adaptive.intervalSeconds",
                Seconds(a.interval_seconds),
            ),
            (
                "relistGuard.warmupSeconds",
                Seconds(self.relist_guard.warmup_seconds),
            ),
        ];
        if let Some(v) = a.max_bytes_per_second {
            table.push(("quota.adaptive.maxBytesPerSecond", Bytes(v)));
        }
        if let Some(v) = a.max_inflight_bytes {
            table.push(("quota.adaptive.maxInflightBytes", Bytes(v)));
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(yaml: &str) -> Option<String> {
        let mut c = Config::from_yaml(yaml).expect("parses");
        c.upstream.urls = vec!["http://a:1".into()];
        c.validate().err().map(|e| e.to_string())
    }

    #[test]
    fn the_defaults_are_within_bounds() {
        let mut c = Config::default();
        c.upstream.urls = vec!["http://a:1".into()];
        c.validate_bounds().expect("defaults in range");
    }

    #[test]
    fn values_that_panicked_later_are_refused_with_their_field() {
        for (yaml, field) in [
            ("timeouts: {idleSeconds: 1e300}", "timeouts.idleSeconds"),
            (
                "timeouts: {requestSeconds: 1e300}",
                "timeouts.requestSeconds",
            ),
            (
                "timeouts: {keepAliveSeconds: 1e20}",
                "timeouts.keepAliveSeconds",
            ),
            (
                "timeouts: {headerReadSeconds: 1e-300}",
                "timeouts.headerReadSeconds",
            ),
            ("quota: {maxWaitSeconds: 1e300}", "quota.maxWaitSeconds"),
            ("lanes: {maxWaitSeconds: 1e300}", "lanes.maxWaitSeconds"),
            ("drain: {windowSeconds: 1e20}", "drain.windowSeconds"),
            ("drain: {windowSeconds: .inf}", "drain.windowSeconds"),
            (
                "upstream: {metricsScrape: {intervalSeconds: 1e-12}}",
                "upstream.metricsScrape.intervalSeconds",
            ),
            (
                "quota: {perClient: {requestsPerSecond: 1e-300}}",
                "quota.perClient.requestsPerSecond",
            ),
            ("quota: {burstBytes: 1e300}", "quota.burstBytes"),
            ("quota: {etcdReadWeight: 1e300}", "quota.etcdReadWeight"),
            (
                "quota: {adaptive: {baselineFactor: 1e300}}",
                "quota.adaptive.baselineFactor",
            ),
            (
                "quota: {retryAfter: {maxSeconds: 18446744073709551615}}",
                "quota.retryAfter.maxSeconds",
            ),
            (
                "lanes: {maxInflight: {workload: 18446744073709551615}}",
                "lanes.maxInflight.workload",
            ),
            ("patterns: {capacity: 10000000000}", "patterns.capacity"),
            ("patterns: {gzipRatio: 1e300}", "patterns.gzipRatio"),
        ] {
            let err = refused(yaml).unwrap_or_else(|| panic!("{yaml} accepted"));
            assert!(err.contains(field), "{yaml}: {err}");
        }
    }

    #[test]
    fn values_at_the_bounds_are_accepted() {
        for yaml in [
            "timeouts: {idleSeconds: 86400, headerReadSeconds: 0.001}",
            "drain: {windowSeconds: 0}",
            "drain: {windowSeconds: 86400}",
            "quota: {perClient: {requestsPerSecond: 0}}",
            "quota: {perClient: {requestsPerSecond: 0.001}}",
            "quota: {retryAfter: {maxSeconds: 86400}}",
            "lanes: {maxInflight: {workload: 0}}",
            "quota: {bytesPerSecond: 1125899906842624, burstBytes: 1}",
        ] {
            assert_eq!(refused(yaml), None, "{yaml}");
        }
    }
}
