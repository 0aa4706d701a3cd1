//! The stored-object counts `/metrics` reports (`apiserver_storage_objects`).
//!
//! kube-apiserver counts its objects once per `--etcd-count-metric-poll-period`
//! (a minute by default) and reports 0 until its first count: for its first
//! minute a freshly started 1.20 apiserver says it stores no pods. tollgate
//! priced its first LISTs by that and let a dozen 25 MB LISTs in at once,
//! which the simulator, counting at every scrape, never showed. With a period
//! set the simulator reports the same way; it counts at the first scrape of
//! each period rather than on a timer, so what a scraper sees is at most its
//! own scrape interval older or newer than a timer's count.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct ObjectCounts {
    /// `None`: counted at every scrape.
    period: Option<Duration>,
    started: Instant,
    /// The period the counts were taken in (0: none yet), and the counts.
    last: Mutex<(u64, Vec<usize>)>,
}

impl ObjectCounts {
    /// `period` zero: counted at every scrape.
    pub fn new(period: Duration) -> ObjectCounts {
        ObjectCounts {
            period: (!period.is_zero()).then_some(period),
            started: Instant::now(),
            last: Mutex::new((0, Vec::new())),
        }
    }

    /// The counts of resources `0..n` to report now; `count(i)` counts one.
    pub fn report(&self, n: usize, count: impl Fn(usize) -> usize) -> Vec<usize> {
        self.report_at(Instant::now(), n, count)
    }

    fn report_at(&self, now: Instant, n: usize, count: impl Fn(usize) -> usize) -> Vec<usize> {
        let Some(period) = self.period else {
            return (0..n).map(count).collect();
        };
        let elapsed = now.saturating_duration_since(self.started);
        let current = (elapsed.as_nanos() / period.as_nanos().max(1)) as u64;
        if current == 0 {
            return vec![0; n];
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.0 != current {
            *last = (current, (0..n).map(count).collect());
        }
        last.1.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_for_the_first_period_then_a_count_per_period() {
        let c = ObjectCounts::new(Duration::from_secs(60));
        let t0 = c.started;
        let at = |s: u64, stored: usize| c.report_at(t0 + Duration::from_secs(s), 2, |_| stored);
        assert_eq!(at(0, 5), vec![0, 0]);
        assert_eq!(at(59, 5), vec![0, 0]);
        assert_eq!(at(61, 7), vec![7, 7]);
        assert_eq!(at(100, 9), vec![7, 7], "held until the next period");
        assert_eq!(at(125, 9), vec![9, 9]);
    }

    #[test]
    fn without_a_period_every_scrape_counts() {
        let c = ObjectCounts::new(Duration::ZERO);
        assert_eq!(c.report(3, |i| i * 10), vec![0, 10, 20]);
    }
}
