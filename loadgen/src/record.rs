//! What happened, per operation: an HDR latency histogram (microseconds),
//! counts by status code and error class, bytes, 429 handling, a split by the
//! server-reported class, and a per-second time series.
//!
//! One `OpRecorder` per operation, shared by its request tasks behind a
//! mutex held only for the few additions of one `record` call.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

/// Highest latency the histograms track exactly (1 h); larger values saturate.
const MAX_MICROS: u64 = 3_600_000_000;
/// At most this many distinct server classes are kept; the rest count as `other`.
const MAX_CLASSES: usize = 32;

/// A request that failed without an HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// No answer within `--timeout`.
    Timeout,
    /// Could not connect, or the connection broke.
    Connection,
    /// The server spoke, but not valid HTTP or the body broke off.
    Protocol,
}

/// Which response header named the server-side class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClassSource {
    /// tollgate's `X-Tollgate-Lane`.
    Lane,
    /// kube-apiserver APF `X-Kubernetes-PF-PriorityLevel-UID` (a UID).
    PriorityLevel,
}

/// How a 429 body was understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionBody {
    /// A Kubernetes `Status` object (tollgate, newer apiservers).
    StatusJson,
    /// Plain text (many apiserver releases).
    PlainText,
}

/// The end of one scheduled request, after any retries.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Final HTTP status, if any response came.
    pub status: Option<u16>,
    pub error: Option<ErrorClass>,
    pub bytes: u64,
    /// `X-Tollgate-Lane` or `X-Kubernetes-PF-PriorityLevel-UID` of the last response.
    pub server_class: Option<(ClassSource, String)>,
    /// Retries made after 429s (`--honor-retry-after`).
    pub retries: u32,
    /// The first attempt was answered 429.
    pub first_try_429: bool,
    /// How the last 429's body was understood.
    pub rejection: Option<RejectionBody>,
}

impl Outcome {
    /// 2xx.
    pub fn is_success(&self) -> bool {
        matches!(self.status, Some(200..=299))
    }
}

/// Per server-class counts and latency.
#[derive(Debug, Clone)]
pub struct ClassStats {
    pub source: ClassSource,
    pub requests: u64,
    pub rejected_429: u64,
    pub errors: u64,
    pub latency: Histogram<u64>,
}

/// One schedule step of one operation (by intended start).
#[derive(Debug, Clone)]
pub struct SliceStats {
    pub requests: u64,
    pub ok: u64,
    pub rejected_429: u64,
    pub latency: Histogram<u64>,
}

/// One second of one operation.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SecondRow {
    pub second: u64,
    pub completed: u64,
    pub ok: u64,
    pub rejected_429: u64,
    pub errors: u64,
    pub dropped: u64,
    pub bytes: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Everything recorded for one operation.
#[derive(Debug, Clone)]
pub struct OpStats {
    pub latency: Histogram<u64>,
    /// How late requests were sent relative to their intended start.
    pub start_lag: Histogram<u64>,
    pub requests: u64,
    pub ok: u64,
    pub by_status: BTreeMap<u16, u64>,
    pub by_error: BTreeMap<ErrorClass, u64>,
    pub bytes: u64,
    /// Not sent: `--max-in-flight` was reached at the intended start.
    pub dropped: u64,
    /// Nothing to do at the intended start (e.g. no created pod left to delete).
    pub skipped: u64,
    /// In flight when the run was interrupted.
    pub cancelled: u64,
    pub first_try_429: u64,
    pub retries: u64,
    /// Requests still 429 after all retries were used (with retries enabled).
    pub retry_exhausted: u64,
    pub rejections_status_json: u64,
    pub rejections_plain_text: u64,
    pub classes: BTreeMap<String, ClassStats>,
    /// Per schedule step (`--schedule steps`), indexed by step.
    pub slices: Vec<SliceStats>,
    pub series: Vec<SecondRow>,
    current: SecondRow,
    current_hist: Histogram<u64>,
}

/// Records one operation's outcomes; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct OpRecorder {
    name: String,
    start: Instant,
    stats: Mutex<OpStats>,
}

/// A fresh latency histogram: 1 µs .. 1 h at 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    // Constant, valid bounds: this cannot fail.
    Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Milliseconds from a microsecond histogram value.
pub fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

impl OpRecorder {
    /// A recorder whose seconds count from `start`.
    pub fn new(name: impl Into<String>, start: Instant) -> OpRecorder {
        OpRecorder {
            name: name.into(),
            start,
            stats: Mutex::new(OpStats {
                latency: new_histogram(),
                start_lag: new_histogram(),
                requests: 0,
                ok: 0,
                by_status: BTreeMap::new(),
                by_error: BTreeMap::new(),
                bytes: 0,
                dropped: 0,
                skipped: 0,
                cancelled: 0,
                first_try_429: 0,
                retries: 0,
                retry_exhausted: 0,
                rejections_status_json: 0,
                rejections_plain_text: 0,
                classes: BTreeMap::new(),
                slices: Vec::new(),
                series: Vec::new(),
                current: SecondRow::default(),
                current_hist: new_histogram(),
            }),
        }
    }

    /// The operation's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn with<R>(&self, f: impl FnOnce(&mut OpStats) -> R) -> R {
        // A panic while holding the lock only loses that one record.
        let mut guard = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Records a finished request: `latency` runs from its intended start.
    pub fn record(&self, outcome: &Outcome, latency: Duration, retries_enabled: bool) {
        let now = self.start.elapsed().as_secs();
        let us = micros(latency);
        self.with(|s| {
            s.roll(now);
            s.latency.saturating_record(us);
            s.current_hist.saturating_record(us);
            s.requests += 1;
            s.current.completed += 1;
            s.bytes += outcome.bytes;
            s.current.bytes += outcome.bytes;
            let failed = !outcome.is_success();
            if !failed {
                s.ok += 1;
                s.current.ok += 1;
            } else {
                s.current.errors += 1;
            }
            if let Some(code) = outcome.status {
                *s.by_status.entry(code).or_default() += 1;
                if code == 429 {
                    s.current.rejected_429 += 1;
                    if retries_enabled {
                        s.retry_exhausted += 1;
                    }
                }
            }
            if let Some(e) = outcome.error {
                *s.by_error.entry(e).or_default() += 1;
            }
            if outcome.first_try_429 {
                s.first_try_429 += 1;
            }
            s.retries += u64::from(outcome.retries);
            match outcome.rejection {
                Some(RejectionBody::StatusJson) => s.rejections_status_json += 1,
                Some(RejectionBody::PlainText) => s.rejections_plain_text += 1,
                None => {}
            }
            if let Some((source, class)) = &outcome.server_class {
                let key = if s.classes.len() >= MAX_CLASSES && !s.classes.contains_key(class) {
                    "other".to_string()
                } else {
                    class.clone()
                };
                let c = s.classes.entry(key).or_insert_with(|| ClassStats {
                    source: *source,
                    requests: 0,
                    rejected_429: 0,
                    errors: 0,
                    latency: new_histogram(),
                });
                c.requests += 1;
                c.latency.saturating_record(us);
                if outcome.status == Some(429) {
                    c.rejected_429 += 1;
                }
                if failed {
                    c.errors += 1;
                }
            }
        });
    }

    /// Adds a finished request to schedule step `slice` as well.
    pub fn record_slice(&self, slice: usize, outcome: &Outcome, latency: Duration) {
        // Bounded: a run has at most a few thousand steps.
        let slice = slice.min(10_000);
        self.with(|s| {
            while s.slices.len() <= slice {
                s.slices.push(SliceStats {
                    requests: 0,
                    ok: 0,
                    rejected_429: 0,
                    latency: new_histogram(),
                });
            }
            let sl = &mut s.slices[slice];
            sl.requests += 1;
            sl.ok += u64::from(outcome.is_success());
            sl.rejected_429 += u64::from(outcome.status == Some(429));
            sl.latency.saturating_record(micros(latency));
        });
    }

    /// Records how late a request was sent relative to its intended start.
    pub fn record_start_lag(&self, lag: Duration) {
        self.with(|s| s.start_lag.saturating_record(micros(lag)));
    }

    /// Counts a request not sent because `--max-in-flight` was reached.
    pub fn drop_one(&self) {
        let now = self.start.elapsed().as_secs();
        self.with(|s| {
            s.roll(now);
            s.dropped += 1;
            s.current.dropped += 1;
        });
    }

    /// Counts a tick with nothing to do.
    pub fn skip_one(&self) {
        self.with(|s| s.skipped += 1);
    }

    /// Counts a request abandoned by Ctrl-C.
    pub fn cancel_one(&self) {
        self.with(|s| s.cancelled += 1);
    }

    /// A copy of everything so far; the time series includes the current second.
    pub fn snapshot(&self) -> OpStats {
        self.with(|s| {
            let mut copy = s.clone();
            copy.flush_current();
            copy
        })
    }
}

impl OpStats {
    /// Moves the time series forward to second `now`, writing finished seconds.
    fn roll(&mut self, now: u64) {
        if now <= self.current.second {
            return;
        }
        self.flush_current();
        for gap in (self.current.second + 1)..now {
            self.series.push(SecondRow {
                second: gap,
                ..Default::default()
            });
        }
        self.current = SecondRow {
            second: now,
            ..Default::default()
        };
        self.current_hist.reset();
    }

    fn flush_current(&mut self) {
        let mut row = self.current.clone();
        if !self.current_hist.is_empty() {
            row.p50_ms = ms(self.current_hist.value_at_quantile(0.5));
            row.p99_ms = ms(self.current_hist.value_at_quantile(0.99));
            row.max_ms = ms(self.current_hist.max());
        }
        self.series.push(row);
    }

    /// Requests whose final answer was 429.
    pub fn rejected_429(&self) -> u64 {
        self.by_status.get(&429).copied().unwrap_or(0)
    }

    /// Requests that did not end in 2xx.
    pub fn errors(&self) -> u64 {
        self.requests - self.ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(class: Option<&str>) -> Outcome {
        Outcome {
            status: Some(200),
            bytes: 10,
            server_class: class.map(|c| (ClassSource::Lane, c.to_string())),
            ..Default::default()
        }
    }

    #[test]
    fn counts_statuses_errors_and_classes() {
        let r = OpRecorder::new("list pods", Instant::now());
        r.record(&ok(Some("workload-low")), Duration::from_millis(5), false);
        r.record(
            &Outcome {
                status: Some(429),
                first_try_429: true,
                rejection: Some(RejectionBody::StatusJson),
                server_class: Some((ClassSource::Lane, "workload-low".into())),
                ..Default::default()
            },
            Duration::from_millis(1),
            false,
        );
        r.record(
            &Outcome {
                error: Some(ErrorClass::Timeout),
                ..Default::default()
            },
            Duration::from_secs(30),
            false,
        );
        r.drop_one();
        let s = r.snapshot();
        assert_eq!(
            (s.requests, s.ok, s.errors(), s.rejected_429()),
            (3, 1, 2, 1)
        );
        assert_eq!(s.by_error.get(&ErrorClass::Timeout), Some(&1));
        assert_eq!(s.dropped, 1);
        assert_eq!(s.bytes, 10);
        assert_eq!(s.rejections_status_json, 1);
        let class = s.classes.get("workload-low").expect("class");
        assert_eq!((class.requests, class.rejected_429), (2, 1));
        assert!(s.latency.max() >= 29_000_000);
        assert_eq!(s.series.len(), 1);
        assert_eq!(s.series[0].completed, 3);
    }
}
