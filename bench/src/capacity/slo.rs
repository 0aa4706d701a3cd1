//! SLOs of a capacity experiment, checked against loadgen's `summary.json`.
//!
//! An SLO names a loadgen operation (`patch`, `list`, `get`, …; none means all operations
//! together), a measure and a bound. Naming the operation, not a tollgate lane, keeps an SLO
//! meaning the same with and without tollgate in front.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The part of loadgen's `summary.json` (schema `loadgen.summary/v1`, a stable contract) that
/// SLOs read. Read from the file rather than from loadgen's types: the bench judges what the
/// load generator wrote, as a user's script would.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Summary {
    pub duration_s: f64,
    #[serde(default)]
    pub interrupted: bool,
    pub operations: Vec<OperationSummary>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct OperationSummary {
    pub name: String,
    /// `LIST`, `LIST(rv=0)`, `PATCH`, …; empty in summaries that name none.
    #[serde(default)]
    pub verb: String,
    pub requests: u64,
    #[serde(default)]
    pub errors: u64,
    #[serde(default)]
    pub status_codes: BTreeMap<String, u64>,
    pub latency_ms: Latency,
    /// Response body bytes of all its answers.
    #[serde(default)]
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// What an SLO measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Measure {
    /// Latency percentiles (ms) from each request's intended start.
    P50Ms,
    P90Ms,
    P99Ms,
    /// Failed requests (transport errors and non-2xx other than 429) over requests.
    ErrorRate,
    /// 5xx answers and transport errors over requests (a crashed apiserver counts here).
    ServerErrorRate,
    /// 429 answers over requests.
    Rate429,
    /// 429 answers, counted.
    Rejected429,
    /// Requests answered 2xx per minute of the run: a floor keeps "reject everything" from passing.
    OkPerMinute,
}

/// One SLO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Slo {
    /// Shown in reports; defaults to "<operation> <measure>".
    #[serde(default)]
    pub name: Option<String>,
    /// loadgen's operation name; unset means all operations together.
    #[serde(default)]
    pub operation: Option<String>,
    pub measure: Measure,
    /// Upper bound (inclusive).
    #[serde(default)]
    pub max: Option<f64>,
    /// Lower bound (inclusive).
    #[serde(default)]
    pub min: Option<f64>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SloError {
    #[error("slos[{index}] ({name}): give max or min (or both)")]
    NoBound { index: usize, name: String },
}

/// One SLO's verdict on one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub name: String,
    /// The measured value; None when the operation is missing from the run (a failure).
    pub value: Option<f64>,
    /// The bound it was held to (max if given, else min).
    pub limit: f64,
    pub ok: bool,
}

impl Slo {
    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            format!(
                "{} {:?}",
                self.operation.as_deref().unwrap_or("all"),
                self.measure
            )
        })
    }

    pub fn validate(slos: &[Slo]) -> Result<(), SloError> {
        for (index, s) in slos.iter().enumerate() {
            if s.max.is_none() && s.min.is_none() {
                return Err(SloError::NoBound {
                    index,
                    name: s.display_name(),
                });
            }
        }
        Ok(())
    }

    /// Checks the SLO against a run's operations; `duration_s` is the run's scheduling window.
    pub fn check(&self, operations: &[OperationSummary], duration_s: f64) -> Verdict {
        let chosen: Vec<&OperationSummary> = operations
            .iter()
            .filter(|o| self.operation.as_deref().is_none_or(|n| o.name == n))
            .collect();
        let value = if chosen.is_empty() {
            None
        } else {
            Some(measure(self.measure, &chosen, duration_s))
        };
        let ok = value.is_some_and(|v| {
            !v.is_nan() && self.max.is_none_or(|m| v <= m) && self.min.is_none_or(|m| v >= m)
        });
        Verdict {
            name: self.display_name(),
            value,
            limit: self.max.or(self.min).unwrap_or(f64::NAN),
            ok,
        }
    }
}

fn count(o: &OperationSummary, pred: impl Fn(u16) -> bool) -> u64 {
    o.status_codes
        .iter()
        .filter(|(code, _)| code.parse::<u16>().is_ok_and(&pred))
        .map(|(_, n)| n)
        .sum()
}

fn measure(m: Measure, ops: &[&OperationSummary], duration_s: f64) -> f64 {
    let requests: u64 = ops.iter().map(|o| o.requests).sum();
    let rate = |n: u64| {
        if requests == 0 {
            0.0
        } else {
            n as f64 / requests as f64
        }
    };
    // Percentiles of several operations cannot be merged from summaries; the worst one is the
    // conservative answer.
    let worst = |f: fn(&OperationSummary) -> f64| ops.iter().map(|o| f(o)).fold(f64::NAN, f64::max);
    match m {
        Measure::P50Ms => worst(|o| o.latency_ms.p50),
        Measure::P90Ms => worst(|o| o.latency_ms.p90),
        Measure::P99Ms => worst(|o| o.latency_ms.p99),
        Measure::ErrorRate => rate(ops.iter().map(|o| o.errors).sum()),
        Measure::ServerErrorRate => {
            // Requests with no status at all failed in transport (refused, reset, timed out).
            let answered: u64 = ops.iter().map(|o| count(o, |_| true)).sum();
            let s5xx: u64 = ops.iter().map(|o| count(o, |c| c >= 500)).sum();
            rate(s5xx + requests.saturating_sub(answered))
        }
        Measure::Rate429 => rate(ops.iter().map(|o| count(o, |c| c == 429)).sum()),
        Measure::Rejected429 => ops.iter().map(|o| count(o, |c| c == 429)).sum::<u64>() as f64,
        Measure::OkPerMinute => ok_per_minute(ops, duration_s),
    }
}

/// Answers 2xx per minute of a run whose schedule lasted `duration_s`.
pub fn ok_per_minute(ops: &[&OperationSummary], duration_s: f64) -> f64 {
    let ok: u64 = ops
        .iter()
        .map(|o| count(o, |c| (200..300).contains(&c)))
        .sum();
    if duration_s > 0.0 {
        ok as f64 * 60.0 / duration_s
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, codes: &[(&str, u64)], p99: f64) -> OperationSummary {
        let mut o = OperationSummary {
            name: name.into(),
            ..Default::default()
        };
        for (c, n) in codes {
            o.status_codes.insert((*c).into(), *n);
        }
        o.requests = codes.iter().map(|(_, n)| n).sum();
        o.latency_ms.p99 = p99;
        o
    }

    fn slo(operation: Option<&str>, measure: Measure, max: Option<f64>, min: Option<f64>) -> Slo {
        Slo {
            name: None,
            operation: operation.map(Into::into),
            measure,
            max,
            min,
        }
    }

    #[test]
    fn measures_read_the_summary() {
        let ops = vec![
            op("patch", &[("200", 990), ("429", 10)], 40.0),
            op("list", &[("200", 30), ("429", 60), ("503", 10)], 5000.0),
        ];
        let check = |s: Slo| s.check(&ops, 60.0);
        let v = check(slo(Some("patch"), Measure::P99Ms, Some(50.0), None));
        assert!(v.ok && v.value == Some(40.0));
        assert!(!check(slo(Some("patch"), Measure::Rejected429, Some(0.0), None)).ok);
        let v = check(slo(Some("list"), Measure::OkPerMinute, None, Some(30.0)));
        assert!(v.ok && v.value == Some(30.0), "{v:?}");
        let v = check(slo(None, Measure::ServerErrorRate, Some(0.01), None));
        assert_eq!(v.value, Some(10.0 / 1100.0));
        assert!(v.ok);
        let v = check(slo(None, Measure::P99Ms, Some(1000.0), None));
        assert_eq!(v.value, Some(5000.0), "the worst operation's p99");
        assert!(!v.ok);
    }

    #[test]
    fn a_missing_operation_fails_and_unanswered_requests_are_server_errors() {
        let ops = vec![op("patch", &[("200", 90)], 1.0)];
        let v = slo(Some("list"), Measure::P99Ms, Some(1.0), None).check(&ops, 60.0);
        assert!(!v.ok && v.value.is_none());
        let mut crashed = op("patch", &[("200", 90)], 1.0);
        crashed.requests = 100; // 10 refused connections: no status code
        let v = slo(None, Measure::ServerErrorRate, Some(0.05), None).check(&[crashed], 60.0);
        assert_eq!(v.value, Some(0.1));
        assert!(!v.ok);
    }

    #[test]
    fn an_slo_without_bounds_is_refused_by_index() {
        let err = Slo::validate(&[
            slo(None, Measure::P99Ms, Some(1.0), None),
            slo(Some("list"), Measure::P99Ms, None, None),
        ])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "slos[1] (list P99Ms): give max or min (or both)"
        );
    }
}
