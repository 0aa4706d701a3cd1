//! When a Stage applies after it is selected (kwok's rules): the delay is
//! `duration`, or — when a jitter bound greater than it is given — uniform in
//! `[duration, jitter)`; a jitter bound not above the duration is the delay
//! itself. `durationFrom`/`jitterDurationFrom` read a value from the object
//! with a jq expression — an RFC 3339 time (the bound is that time minus
//! now, e.g. `.metadata.deletionTimestamp`) or a Go duration (`"10s"`) — and
//! win over the millisecond fields when they find one.

use std::time::Duration;

use rand::Rng;
use serde_json::Value;

use super::jq::Query;

#[derive(Debug, Default, PartialEq)]
pub struct DelaySpec {
    pub duration_ms: Option<i64>,
    pub duration_from: Option<Query>,
    pub jitter_ms: Option<i64>,
    pub jitter_from: Option<Query>,
}

/// Milliseconds (may be negative: a time already past) from a value found
/// in the object, relative to `now_unix_ms`.
fn from_value(q: &Query, obj: &Value, now_unix_ms: i64) -> Option<i64> {
    let s = q.strings(obj).into_iter().next()?;
    if let Some(d) = parse_go_duration(&s) {
        return Some(d);
    }
    Some(parse_rfc3339_ms(&s)? - now_unix_ms)
}

impl DelaySpec {
    /// The bounds `(duration, jitter)` in ms for `obj` at `now_unix_ms`.
    pub fn bounds(&self, obj: &Value, now_unix_ms: i64) -> (i64, Option<i64>) {
        let duration = self
            .duration_from
            .as_ref()
            .and_then(|q| from_value(q, obj, now_unix_ms))
            .or(self.duration_ms)
            .unwrap_or(0);
        let jitter = self
            .jitter_from
            .as_ref()
            .and_then(|q| from_value(q, obj, now_unix_ms))
            .or(self.jitter_ms);
        (duration, jitter)
    }

    /// The delay for `obj` at `now_unix_ms`, drawn with `rng`.
    pub fn delay(&self, obj: &Value, now_unix_ms: i64, rng: &mut impl Rng) -> Duration {
        let (duration, jitter) = self.bounds(obj, now_unix_ms);
        let ms = match jitter {
            Some(j) if j > duration => rng.random_range(duration.max(0)..j.max(1)),
            Some(j) => j,
            None => duration,
        };
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }
}

/// Go's `time.ParseDuration` for the units Stages use (`ns`..`h`), in ms.
pub fn parse_go_duration(s: &str) -> Option<i64> {
    let s = s.trim();
    if s == "0" {
        return Some(0);
    }
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let ms = match &rest[..unit_end] {
            "ns" => 1e-6,
            "us" | "µs" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 60e3,
            "h" => 3600e3,
            _ => return None,
        };
        total += n * ms;
        rest = &rest[unit_end..];
    }
    let ms = total.round() as i64;
    Some(if neg { -ms } else { ms })
}

/// An RFC 3339 time (`2026-11-22T11:00:00Z`, optional fraction and offset)
/// in ms since the epoch.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut i = 19;
    let mut frac_ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        let padded = format!("{digits:0<3}");
        frac_ms = padded.get(..3)?.parse().ok()?;
    }
    let offset_min = match b.get(i)? {
        b'Z' | b'z' => 0,
        b'+' | b'-' => {
            let sign = if b[i] == b'-' { -1 } else { 1 };
            sign * (num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let (yy, m) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_min * 60;
    Some(secs * 1000 + frac_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use serde_json::json;

    #[test]
    fn times_and_durations_parse() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(
            parse_rfc3339_ms("2026-11-22T11:00:00.5Z"),
            Some(1_795_345_200_500)
        );
        assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
        assert_eq!(parse_go_duration("1m30s"), Some(90_000));
        assert_eq!(parse_go_duration("250ms"), Some(250));
        assert_eq!(parse_go_duration("10"), None);
    }

    #[test]
    fn delay_is_uniform_between_duration_and_jitter() {
        let spec = DelaySpec {
            duration_ms: Some(1000),
            jitter_ms: Some(5000),
            ..Default::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let ds: Vec<u128> = (0..2000)
            .map(|_| spec.delay(&json!({}), 0, &mut rng).as_millis())
            .collect();
        assert!(ds.iter().all(|d| (1000..5000).contains(d)));
        let mean = ds.iter().sum::<u128>() as f64 / ds.len() as f64;
        assert!((mean - 3000.0).abs() < 150.0, "mean {mean}");
    }

    #[test]
    fn from_fields_win_and_past_times_mean_now() {
        let spec = DelaySpec {
            duration_ms: Some(1000),
            jitter_from: Some(Query::compile(".metadata.deletionTimestamp").unwrap()),
            duration_from: Some(Query::compile(".metadata.annotations.delay").unwrap()),
            ..Default::default()
        };
        let now = parse_rfc3339_ms("2026-01-01T00:00:00Z").unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let obj = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:30Z"}});
        let d = spec.delay(&obj, now, &mut rng).as_millis();
        assert!((1000..30_000).contains(&d), "{d}");
        let past = json!({"metadata": {"deletionTimestamp": "2025-12-31T23:59:00Z"}});
        assert_eq!(spec.delay(&past, now, &mut rng), Duration::ZERO);
        let annotated = json!({"metadata": {"annotations": {"delay": "2s"}}});
        assert_eq!(spec.bounds(&annotated, now), (2000, None));
    }
}
