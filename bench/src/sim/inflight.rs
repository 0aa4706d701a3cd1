//! kube-apiserver's max-in-flight filter: separate limits for read-only and
//! mutating requests; long-running requests (watches, exec) are not counted.
//! Above a limit a request gets 429 at once, never a queue.

use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

pub struct Inflight {
    limits: [usize; 2],
    used: [AtomicUsize; 2],
    gauges: [Gauge<i64, AtomicI64>; 2],
}

/// A held in-flight slot; released on drop (when the response body has been sent).
pub struct InflightGuard {
    owner: Arc<Inflight>,
    kind: usize,
}

impl Inflight {
    /// `0` means no limit, as for the real flags.
    pub fn new(
        max_readonly: usize,
        max_mutating: usize,
        gauges: [Gauge<i64, AtomicI64>; 2],
    ) -> Arc<Inflight> {
        Arc::new(Inflight {
            limits: [max_readonly, max_mutating],
            used: [AtomicUsize::new(0), AtomicUsize::new(0)],
            gauges,
        })
    }

    pub fn try_acquire(self: &Arc<Self>, mutating: bool) -> Option<InflightGuard> {
        let kind = usize::from(mutating);
        let limit = self.limits[kind];
        let prev = self.used[kind].fetch_add(1, Ordering::AcqRel);
        if limit > 0 && prev >= limit {
            self.used[kind].fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        self.gauges[kind].set((prev + 1) as i64);
        Some(InflightGuard {
            owner: self.clone(),
            kind,
        })
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let now = self.owner.used[self.kind].fetch_sub(1, Ordering::AcqRel) - 1;
        self.owner.gauges[self.kind].set(now as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_each_kind_separately_and_releases_on_drop() {
        let f = Inflight::new(2, 1, [Gauge::default(), Gauge::default()]);
        let a = f.try_acquire(false).unwrap();
        let _b = f.try_acquire(false).unwrap();
        assert!(f.try_acquire(false).is_none());
        let m = f.try_acquire(true).unwrap();
        assert!(f.try_acquire(true).is_none());
        drop(a);
        assert!(f.try_acquire(false).is_some());
        drop(m);
        assert!(f.try_acquire(true).is_some());
        let unlimited = Inflight::new(0, 0, [Gauge::default(), Gauge::default()]);
        let held: Vec<_> = (0..1000)
            .filter_map(|_| unlimited.try_acquire(false))
            .collect();
        assert_eq!(held.len(), 1000);
    }
}
