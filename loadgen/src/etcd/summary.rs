//! The [`Report`] of an etcd run: the API runs' schema, with etcd's verbs
//! (`RANGE`, `RANGE(serializable)`, `PUT`, `WATCH`), the prefix as the
//! resource, and the endpoints as the target.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{EtcdConfig, OP_PUT, OP_RANGE, OP_WATCH};
use crate::record::OpRecorder;
use crate::report::{
    schedule_name, OperationSummary, Percentiles, Report, StepSummary, WatchSummary, SCHEMA,
};
use crate::watch::WatchStats;

/// Collects the recorders' results.
pub(crate) fn build(
    config: &EtcdConfig,
    started_at_unix_nanos: u128,
    elapsed: Duration,
    interrupted: bool,
    recorders: &[Arc<OpRecorder>],
    watch: &WatchStats,
) -> Report {
    let mut report = Report {
        schema: SCHEMA.to_string(),
        target: config.endpoints.join(","),
        started_at_unix_ms: u64::try_from(started_at_unix_nanos / 1_000_000).unwrap_or(0),
        duration_s: elapsed.as_secs_f64(),
        interrupted,
        schedule: schedule_name(&config.schedule),
        operations: Vec::new(),
        watches: None,
        nodes: None,
        server_metrics: Vec::new(),
        shard: None,
        histograms: BTreeMap::new(),
        series: Vec::new(),
    };
    // Achieved rates over the scheduling window, not the drain after it.
    let window = elapsed.min(config.duration);
    for rec in recorders {
        let stats = rec.snapshot();
        let mut sum = OperationSummary::from_stats(rec.name(), &stats, window);
        describe(config, &mut sum);
        if let crate::schedule::ScheduleKind::Steps { steps, .. } = config.schedule {
            let full = sum.target_rate_per_s.unwrap_or(0.0);
            let n = f64::from(steps.max(1));
            sum.steps = stats
                .slices
                .iter()
                .enumerate()
                .filter(|(_, sl)| sl.requests > 0)
                .map(|(k, sl)| StepSummary {
                    step: k as u64 + 1,
                    target_rate_per_s: full * (k as f64 + 1.0).min(n) / n,
                    requests: sl.requests,
                    error_rate: ratio(sl.requests - sl.ok, sl.requests),
                    rate_429: ratio(sl.rejected_429, sl.requests),
                    latency_ms: Percentiles::of(&sl.latency),
                })
                .collect();
        }
        report.operations.push(sum);
        report
            .histograms
            .insert(rec.name().to_string(), stats.latency.clone());
        report.series.extend(
            stats
                .series
                .into_iter()
                .map(|row| (rec.name().to_string(), row)),
        );
    }
    if let Some(spec) = &config.watches {
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        report.watches = Some(WatchSummary {
            watchers: spec.count,
            active_at_end: get(&watch.active),
            events: get(&watch.events),
            bookmarks: 0,
            reconnects: get(&watch.reconnects),
            relists: 0,
            gone_410: get(&watch.gone),
            errors: get(&watch.errors),
        });
    }
    report
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

/// Verb, resource (the prefix), scope and target rate of an etcd operation.
fn describe(config: &EtcdConfig, sum: &mut OperationSummary) {
    match sum.name.as_str() {
        OP_RANGE => {
            if let Some(r) = &config.ranges {
                sum.verb = if r.serializable {
                    "RANGE(serializable)"
                } else {
                    "RANGE"
                }
                .into();
                sum.resource = r.prefix.clone();
                sum.scope = if r.limit > 0 {
                    format!("prefix(limit={})", r.limit)
                } else {
                    "prefix".into()
                };
                sum.target_rate_per_s = Some(r.rate.as_per_second());
            }
        }
        OP_PUT => {
            if let Some(p) = &config.puts {
                sum.verb = "PUT".into();
                sum.resource = p.prefix.clone();
                sum.scope = "key".into();
                sum.target_rate_per_s = Some(p.rate.as_per_second());
            }
        }
        OP_WATCH => {
            if let Some(w) = &config.watches {
                sum.verb = "WATCH".into();
                sum.resource = w.prefix.clone();
                sum.scope = "prefix".into();
                // Every watcher sees every put under its prefix.
                sum.target_rate_per_s = config
                    .puts
                    .as_ref()
                    .filter(|p| p.prefix.starts_with(&w.prefix))
                    .map(|p| p.rate.as_per_second() * w.count as f64);
            }
        }
        _ => {}
    }
}
