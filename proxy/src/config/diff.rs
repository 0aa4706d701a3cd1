//! What a reload changed, in words for its log line: the salient settings
//! (mode, the budget, the lanes, the queues, the patterns, what needs a
//! restart) of the old and the new configuration, named by their path in
//! the file, and the ones that differ as `path: old → new`. An operator
//! who reloads reads at once whether the file said what they meant.

use std::fmt::Debug;

use super::Config;

/// The settings a reload's log names when they change, each by its path in
/// the file and its value as text. Sections are compared whole (their
/// fields in Rust's debug form): a changed field inside shows in the text.
pub fn salient(c: &Config) -> Vec<(&'static str, String)> {
    fn show<T: Debug>(v: T) -> String {
        format!("{v:?}")
    }
    fn bytes(v: Option<f64>) -> String {
        v.map_or_else(|| "default".to_string(), |b| format!("{b}"))
    }
    let q = &c.quota;
    let l = &c.lanes;
    vec![
        ("mode", c.mode.as_str().to_string()),
        ("quota.mode", q.mode.as_str().to_string()),
        ("quota.bytesPerSecond", bytes(q.bytes_per_second)),
        ("quota.burstBytes", bytes(q.burst_bytes)),
        ("quota.inflightBytes", bytes(q.inflight_bytes)),
        ("quota.adaptive", show(&q.adaptive)),
        ("quota.etcdReadWeight", show(q.etcd_read_weight)),
        ("quota.maxWaitSeconds", show(q.max_wait_seconds)),
        ("quota.queue", show(&q.queue)),
        ("quota.perClient", show(&q.per_client)),
        ("quota.retryAfter", show(&q.retry_after)),
        ("quota.scaling", show(&q.scaling)),
        ("quota.logPerSecond", show(q.log_per_second)),
        ("quota.global", show(&q.global)),
        ("lanes.heavyThresholdBytes", show(l.heavy_threshold_bytes)),
        ("lanes.maxInflight", show(&l.max_inflight)),
        ("lanes.maxWaitSeconds", show(l.max_wait_seconds)),
        ("lanes.queue", show(&l.queue)),
        ("lanes.rules", show(&l.rules)),
        ("relistGuard", show(&c.relist_guard)),
        ("patterns", show(&c.patterns)),
        ("timeouts", show(&c.timeouts)),
        ("drain.windowSeconds", show(c.drain.window_seconds)),
        ("tokenReview", show(&c.token_review)),
        ("maxConnections", show(c.max_connections)),
        ("listen", c.listen.clone()),
        ("adminListen", show(&c.admin_listen)),
        ("upstream.urls", show(&c.upstream.urls)),
    ]
}

/// The salient settings that differ, `path: old → new`, joined by `; `;
/// `"nothing"` when none does.
pub fn changes(old: &Config, new: &Config) -> String {
    let changed: Vec<String> = salient(old)
        .into_iter()
        .zip(salient(new))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((path, a), (_, b))| format!("{path}: {a} → {b}"))
        .collect();
    if changed.is_empty() {
        "nothing".to_string()
    } else {
        changed.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;

    #[test]
    fn a_reload_names_what_changed_and_only_that() {
        let old = Config::default();
        assert_eq!(changes(&old, &old.clone()), "nothing");
        let mut new = old.clone();
        new.mode = Mode::Enforce;
        new.quota.bytes_per_second = Some(1e6);
        new.quota.adaptive.min_bytes_per_second = 2e6;
        new.lanes.max_inflight.heavy = 8;
        let said = changes(&old, &new);
        assert!(said.starts_with("mode: dryRun → enforce; "), "{said}");
        assert!(
            said.contains("quota.bytesPerSecond: default → 1000000"),
            "{said}"
        );
        assert!(said.contains("quota.adaptive: "), "{said}");
        assert!(said.contains("min_bytes_per_second: 2000000"), "{said}");
        assert!(said.contains("lanes.maxInflight: "), "{said}");
        assert!(
            !said.contains("patterns"),
            "unchanged sections stay out: {said}"
        );
        assert_eq!(said.matches(" → ").count(), 4, "{said}");
    }
}
