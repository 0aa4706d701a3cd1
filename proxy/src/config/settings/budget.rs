//! The budget's settings: `quota.mode`, `quota.inflightBytes` and
//! `quota.adaptive` in the YAML file, their defaults and their validation.
//!
//! ```yaml
//! quota:
//!   mode: adaptive          # or static: bytesPerSecond and inflightBytes as given
//!   bytesPerSecond: 268435456   # static rate; in adaptive mode a hard ceiling if set
//!   inflightBytes: 1073741824   # static in-flight budget; likewise
//!   adaptive:
//!     target: auto          # p99 ≤ max(baselineFactor × baseline, floor); or "200ms"
//!     baselineFactor: 2
//!     floor: 50ms
//!     minBytesPerSecond: 1048576
//!     minInflightBytes: 8388608
//!     maxBytesPerSecond: 4294967296   # default: bytesPerSecond if set, else 4 GiB/s
//!     maxInflightBytes: 17179869184   # default: inflightBytes if set, else 16 GiB
//!     probe: true           # tollgate's own GETs when too few light requests give a signal
//! ```
//!
//! The static pool's defaults are a guess at a cluster tollgate has never
//! seen; they do not bound the adaptive budget, which finds the
//! apiserver's own limit (on an apiserver that served 240 LISTs of all
//! pods a minute within the target, the static defaults held the adaptive
//! budget to 211). A static value set in the file or by a flag is the
//! operator's, and stays a hard ceiling.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::enforce::{positive, Invalid};

/// `quota.inflightBytes`'s default: 1 GiB, what the pool's default burst
/// lets through at once.
pub const DEFAULT_INFLIGHT_BYTES: f64 = 1_073_741_824.0;
/// `quota.bytesPerSecond`'s default: 256 MiB/s.
pub const DEFAULT_BYTES_PER_SECOND: f64 = 268_435_456.0;
/// `quota.burstBytes`'s default: 1 GiB (a full LIST of 150,000 pods fits).
pub const DEFAULT_BURST_BYTES: f64 = 1_073_741_824.0;
/// The adaptive rate's ceiling when neither `maxBytesPerSecond` nor
/// `quota.bytesPerSecond` is set: 4 GiB/s, sixteen times the static
/// default. Only a runaway guard: the level grows only while heavy
/// requests wait and the protected lanes are healthy.
pub const ADAPTIVE_MAX_BYTES_PER_SECOND: f64 = 4_294_967_296.0;
/// The adaptive in-flight ceiling likewise: 16 GiB, one turnover of that rate.
pub const ADAPTIVE_MAX_INFLIGHT_BYTES: f64 = 17_179_869_184.0;
const _: () = assert!(ADAPTIVE_MAX_BYTES_PER_SECOND > DEFAULT_BYTES_PER_SECOND);
const _: () = assert!(ADAPTIVE_MAX_INFLIGHT_BYTES > DEFAULT_INFLIGHT_BYTES);

/// How the heavy lane's budget is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum QuotaMode {
    /// `quota.bytesPerSecond`, `quota.burstBytes` and `quota.inflightBytes`
    /// as given (scaled by cluster size, ramped by the relist guard).
    Static,
    /// Steered by the protected lanes' latency between
    /// `quota.adaptive`'s bounds, with the static values as ceilings. Default.
    #[default]
    Adaptive,
}

impl QuotaMode {
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaMode::Static => "static",
            QuotaMode::Adaptive => "adaptive",
        }
    }
}

/// The latency the protected lanes must keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Target {
    /// `auto`: p99 ≤ max(`baselineFactor` × the learned baseline, `floor`).
    #[default]
    Auto,
    /// A fixed p99 (`200ms`, `1.5s`).
    Absolute(Duration),
}

/// `quota.adaptive`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Adaptive {
    /// `auto` (default) or an absolute p99 such as `200ms`.
    #[serde(deserialize_with = "target")]
    pub target: Target,
    /// With `target: auto`: how many times the baseline the p99 may be.
    /// Default `2`.
    pub baseline_factor: f64,
    /// With `target: auto`: the target is never below this. Default `50ms`.
    #[serde(deserialize_with = "latency")]
    pub floor: Duration,
    /// The rate never goes below this, bytes/s (never starve). Default
    /// `1048576` (1 MiB/s).
    pub min_bytes_per_second: f64,
    /// The rate never goes above this, bytes/s. Default:
    /// `quota.bytesPerSecond` if set (which caps it anyway), else
    /// `4294967296` (4 GiB/s).
    pub max_bytes_per_second: Option<f64>,
    /// The in-flight budget never goes below this, bytes. A larger request
    /// still runs, alone. Default `8388608` (8 MiB).
    pub min_inflight_bytes: f64,
    /// The in-flight budget never goes above this, bytes. Default:
    /// `quota.inflightBytes` if set (which caps it anyway), else
    /// `17179869184` (16 GiB).
    pub max_inflight_bytes: Option<f64>,
    /// Seconds between controller steps. Default `0.5`.
    pub interval_seconds: f64,
    /// While neither the protected lanes nor the workload lane carry
    /// enough requests for a signal (a small cluster, kubelets that talk
    /// to the apiserver directly, nodes not yet back after a restart),
    /// tollgate measures the apiserver with GETs of its own
    /// ([`crate::signal_probe`]). Off: the controller holds at its level
    /// without a signal. Default `true`.
    pub probe: bool,
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            target: Target::Auto,
            baseline_factor: 2.0,
            floor: Duration::from_millis(50),
            min_bytes_per_second: 1_048_576.0,
            max_bytes_per_second: None,
            min_inflight_bytes: 8_388_608.0,
            max_inflight_bytes: None,
            interval_seconds: 0.5,
            probe: true,
        }
    }
}

/// The controller's range, resolved against the static ceilings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub min_rate: f64,
    pub max_rate: f64,
    pub min_inflight: f64,
    pub max_inflight: f64,
}

impl Adaptive {
    /// The target p99 given the baseline (none yet: the floor).
    pub fn target(&self, baseline: Option<Duration>) -> Duration {
        match self.target {
            Target::Absolute(d) => d,
            Target::Auto => baseline
                .map_or(Duration::ZERO, |b| b.mul_f64(self.baseline_factor))
                .max(self.floor),
        }
    }

    /// The bounds under the static `ceiling_rate` (`quota.bytesPerSecond`,
    /// scaled) and `ceiling_inflight` (`quota.inflightBytes`), where those
    /// were set (`None`: not set): a ceiling below a minimum wins (the
    /// static values are hard).
    pub fn bounds(&self, ceiling_rate: Option<f64>, ceiling_inflight: Option<f64>) -> Bounds {
        fn max(own: Option<f64>, ceiling: Option<f64>, default: f64) -> f64 {
            match (own, ceiling) {
                (Some(m), Some(c)) => m.min(c),
                (None, Some(c)) => c,
                (m, None) => m.unwrap_or(default),
            }
        }
        let max_rate = max(
            self.max_bytes_per_second,
            ceiling_rate,
            ADAPTIVE_MAX_BYTES_PER_SECOND,
        );
        let max_inflight = max(
            self.max_inflight_bytes,
            ceiling_inflight,
            ADAPTIVE_MAX_INFLIGHT_BYTES,
        );
        Bounds {
            min_rate: self.min_bytes_per_second.min(max_rate),
            max_rate,
            min_inflight: self.min_inflight_bytes.min(max_inflight),
            max_inflight,
        }
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        if let Target::Absolute(d) = self.target {
            if d.is_zero() {
                return Err(("quota.adaptive.target", "must be above 0".into()));
            }
        }
        if !(self.baseline_factor.is_finite() && self.baseline_factor >= 1.0) {
            return Err((
                "quota.adaptive.baselineFactor",
                format!("must be at least 1, got {}", self.baseline_factor),
            ));
        }
        if self.floor.is_zero() {
            return Err(("quota.adaptive.floor", "must be above 0".into()));
        }
        positive(
            "quota.adaptive.minBytesPerSecond",
            self.min_bytes_per_second,
        )?;
        if let Some(max) = self.max_bytes_per_second {
            at_least(
                "quota.adaptive.maxBytesPerSecond",
                max,
                self.min_bytes_per_second,
                "minBytesPerSecond",
            )?;
        }
        positive("quota.adaptive.minInflightBytes", self.min_inflight_bytes)?;
        if let Some(max) = self.max_inflight_bytes {
            at_least(
                "quota.adaptive.maxInflightBytes",
                max,
                self.min_inflight_bytes,
                "minInflightBytes",
            )?;
        }
        if !(self.interval_seconds.is_finite()
            && self.interval_seconds >= 0.05
            && self.interval_seconds <= 10.0)
        {
            return Err((
                "quota.adaptive.intervalSeconds",
                format!("must be in [0.05, 10], got {}", self.interval_seconds),
            ));
        }
        Ok(())
    }
}

fn at_least(field: &'static str, v: f64, min: f64, min_name: &str) -> Result<(), Invalid> {
    if v.is_finite() && v >= min {
        Ok(())
    } else {
        Err((
            field,
            format!("must be at least {min_name} ({min}), got {v}"),
        ))
    }
}

/// `200ms`, `1.5s`, `250us`: a latency setting.
pub fn parse_latency(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => return Err(format!("{s:?} has no unit (ms or s)")),
    };
    let n: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number with a unit"))?;
    let secs = match unit {
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (us, ms or s)")),
    };
    if !(secs.is_finite() && (0.0..=3600.0).contains(&secs)) {
        return Err(format!("{s:?} is out of range (0 to 1 hour)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn latency<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_latency(&s).map_err(|e| serde::de::Error::custom(format!("quota.adaptive.floor: {e}")))
}

fn target<'de, D: Deserializer<'de>>(d: D) -> Result<Target, D::Error> {
    let s = String::deserialize(d)?;
    if s.trim() == "auto" {
        return Ok(Target::Auto);
    }
    parse_latency(&s).map(Target::Absolute).map_err(|e| {
        serde::de::Error::custom(format!(
            "quota.adaptive.target: {e}; use auto or a latency such as 200ms"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Adaptive, String> {
        serde_saphyr::from_str::<Adaptive>(yaml).map_err(|e| e.to_string())
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_and_the_default_target() {
        let a = parse("{}").expect("empty is the defaults");
        assert_eq!(a, Adaptive::default());
        assert_eq!(a.target(None), ms(50), "no baseline: the floor");
        assert_eq!(a.target(Some(ms(21))), ms(50));
        assert_eq!(a.target(Some(ms(61))), ms(122));
        assert_eq!(QuotaMode::default(), QuotaMode::Adaptive);
        assert!(a.validate().is_ok());
    }

    #[test]
    fn an_absolute_target_and_other_fields() {
        let a = parse(
            "target: 200ms\nfloor: 0.1s\nbaselineFactor: 3\nminBytesPerSecond: 5000000\nmaxBytesPerSecond: 9000000\nminInflightBytes: 1000\nmaxInflightBytes: 2000\nintervalSeconds: 1\n",
        )
        .expect("valid");
        assert_eq!(a.target, Target::Absolute(ms(200)));
        assert_eq!(
            a.target(Some(ms(500))),
            ms(200),
            "absolute ignores the baseline"
        );
        assert_eq!(a.floor, ms(100));
        assert_eq!(
            a.bounds(Some(8_000_000.0), Some(1e9)),
            Bounds {
                min_rate: 5e6,
                max_rate: 8e6,
                min_inflight: 1000.0,
                max_inflight: 2000.0
            },
            "the static rate is a hard ceiling"
        );
        assert_eq!(
            a.bounds(Some(1e6), Some(500.0)),
            Bounds {
                min_rate: 1e6,
                max_rate: 1e6,
                min_inflight: 500.0,
                max_inflight: 500.0
            },
            "a ceiling under a minimum wins"
        );
        assert_eq!(
            a.bounds(None, None),
            Bounds {
                min_rate: 5e6,
                max_rate: 9e6,
                min_inflight: 1000.0,
                max_inflight: 2000.0
            },
            "no static value set: the adaptive maxima"
        );
        let d = Adaptive::default().bounds(Some(3e8), Some(2e9));
        assert_eq!((d.max_rate, d.max_inflight), (3e8, 2e9));
        let d = Adaptive::default().bounds(None, None);
        assert_eq!(
            (d.max_rate, d.max_inflight),
            (ADAPTIVE_MAX_BYTES_PER_SECOND, ADAPTIVE_MAX_INFLIGHT_BYTES),
            "nothing set: the static defaults do not cap the adaptive budget"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse("target: fast\n").expect_err("not a latency");
        assert!(e.contains("quota.adaptive.target"), "{e}");
        let e = parse("target: 200\n").expect_err("no unit");
        assert!(e.contains("no unit"), "{e}");
        let e = parse("floor: 5m\n").expect_err("minutes are not a unit here");
        assert!(e.contains("quota.adaptive.floor"), "{e}");
        let e = parse("tagret: 200ms\n").expect_err("unknown field");
        assert!(e.contains("tagret"), "{e}");
        let field = |yaml: &str| parse(yaml).expect("parses").validate().map_err(|e| e.0);
        assert_eq!(
            field("maxBytesPerSecond: 100\n"),
            Err("quota.adaptive.maxBytesPerSecond")
        );
        assert_eq!(
            field("minBytesPerSecond: 0\n"),
            Err("quota.adaptive.minBytesPerSecond")
        );
        assert_eq!(
            field("minInflightBytes: 10\nmaxInflightBytes: 5\n"),
            Err("quota.adaptive.maxInflightBytes")
        );
        assert_eq!(
            field("baselineFactor: 0.5\n"),
            Err("quota.adaptive.baselineFactor")
        );
        assert_eq!(field("target: 0ms\n"), Err("quota.adaptive.target"));
        assert_eq!(
            field("intervalSeconds: 0\n"),
            Err("quota.adaptive.intervalSeconds")
        );
    }

    #[test]
    fn latencies() {
        assert_eq!(parse_latency("200ms"), Ok(ms(200)));
        assert_eq!(parse_latency(" 1.5s "), Ok(ms(1500)));
        assert_eq!(parse_latency("250us"), Ok(Duration::from_micros(250)));
        assert!(parse_latency("-1s").is_err());
        assert!(parse_latency("ms").is_err());
    }
}
