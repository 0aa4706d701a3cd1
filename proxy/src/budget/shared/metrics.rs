//! `tollgate_shared_budget_*`: registered only when the shared budget is
//! on; refreshed from the renewal loop's state at each scrape.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::coordination::SharedView;

/// `role`: coordinator or member.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabel {
    pub role: &'static str,
}

/// The shared budget's metrics.
#[derive(Debug, Clone, Default)]
pub struct SharedMetrics {
    granted: Gauge<f64, AtomicU64>,
    in_force: Gauge<f64, AtomicU64>,
    fallback: Gauge,
    demand: Gauge<f64, AtomicU64>,
    role: Family<RoleLabel, Gauge>,
    renewal_age: Gauge<f64, AtomicU64>,
    members: Gauge,
    writes: Counter,
    admitted: Counter,
    read: Counter,
    rejected: Counter,
}

impl SharedMetrics {
    pub fn register(r: &mut Registry) -> SharedMetrics {
        let m = SharedMetrics::default();
        let bps = Unit::Other("bytes_per_second".into());
        r.register_with_unit(
            "tollgate_shared_budget_granted",
            "This member's grant of the cluster-wide etcd-read budget as last read from etcd (0: none)",
            bps.clone(),
            m.granted.clone(),
        );
        r.register_with_unit(
            "tollgate_shared_budget_in_force",
            "Etcd-read bytes/s this member spends now: its grant while valid, else the fallback share",
            bps.clone(),
            m.in_force.clone(),
        );
        r.register(
            "tollgate_shared_budget_fallback",
            "1 while this member has no valid grant and spends the fallback share (reserve / N or quota.global.fallbackBytesPerSecond)",
            m.fallback.clone(),
        );
        r.register_with_unit(
            "tollgate_shared_budget_demand",
            "Etcd-read bytes/s this member's heavy requests asked for, smoothed (what it reports to the coordinator)",
            bps,
            m.demand.clone(),
        );
        r.register(
            "tollgate_shared_budget_role",
            "1 for this member's role in the shared budget (coordinator, member)",
            m.role.clone(),
        );
        r.register_with_unit(
            "tollgate_shared_budget_last_renewal_age",
            "Seconds since this member last renewed its lease and read the allocation (NaN: never)",
            Unit::Seconds,
            m.renewal_age.clone(),
        );
        r.register(
            "tollgate_shared_budget_members",
            "Live members seen at the last renewal",
            m.members.clone(),
        );
        r.register(
            "tollgate_shared_budget_coordination_writes",
            "Writes to etcd this member made for the shared budget (registration, demand, acknowledgements, grants)",
            m.writes.clone(),
        );
        r.register_with_unit(
            "tollgate_shared_budget_admitted",
            "Predicted etcd-read bytes of the heavy requests this member let through to the apiserver, counted when they end",
            Unit::Bytes,
            m.admitted.clone(),
        );
        r.register_with_unit(
            "tollgate_shared_budget_read",
            "Etcd-read bytes of those requests, settled when their responses ended",
            Unit::Bytes,
            m.read.clone(),
        );
        r.register(
            "tollgate_shared_budget_rejected",
            "Heavy requests refused because the share had no room within their wait",
            m.rejected.clone(),
        );
        m
    }

    /// Bring the metrics up to `v`.
    pub fn update(&self, v: &SharedView) {
        self.granted.set(v.granted_bytes_per_second.unwrap_or(0.0));
        self.in_force.set(v.gate.bytes_per_second);
        self.fallback.set(i64::from(!v.gate.granted));
        self.demand.set(v.demand_bytes_per_second);
        for role in ["coordinator", "member"] {
            self.role
                .get_or_create(&RoleLabel { role })
                .set(i64::from(v.role == role));
        }
        self.renewal_age
            .set(v.last_renewal_age_seconds.unwrap_or(f64::NAN));
        self.members.set(v.members.len() as i64);
        let to = |c: &Counter, v: u64| {
            c.inc_by(v.saturating_sub(c.get()));
        };
        to(&self.writes, v.coordination_writes);
        to(&self.admitted, v.gate.admitted_bytes);
        to(&self.read, v.gate.read_bytes);
        to(&self.rejected, v.gate.rejected);
    }
}
