//! The [`Report`] of an etcd run: the API runs' schema, with etcd's verbs
//! (`RANGE`, `RANGE(serializable)`, `PUT`, `WATCH`), the prefix as the
//! resource, and the endpoints as the target.

use std::sync::Arc;
use std::time::Duration;

use super::{EtcdConfig, OP_PUT, OP_RANGE, OP_WATCH};
use crate::record::OpRecorder;
use crate::report::{OperationSummary, Report};
use crate::watch::WatchStats;
use crate::watch::WatchSummary;

/// Collects the recorders' results.
pub(crate) fn build(
    config: &EtcdConfig,
    started_at_unix_nanos: u128,
    elapsed: Duration,
    interrupted: bool,
    recorders: &[Arc<OpRecorder>],
    watch: &WatchStats,
) -> Report {
    let mut report = Report::empty(
        &config.endpoints.join(","),
        started_at_unix_nanos,
        elapsed,
        interrupted,
        &config.schedule,
    );
    // Achieved rates over the scheduling window, not the drain after it.
    report.add_operations(
        recorders,
        elapsed.min(config.duration),
        &config.schedule,
        |sum| describe(config, sum),
    );
    if let Some(spec) = &config.watches {
        // etcd watches have no bookmarks or relists: those counters stay 0.
        report.watches = Some(WatchSummary::of(spec.count, watch));
    }
    report
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
