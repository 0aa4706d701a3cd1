//! Request rates as the user writes them: `500/min`, `20/s`, `1.5/h`.

use std::fmt;
use std::str::FromStr;

/// A request rate in requests per second, parsed from `N/s`, `N/min` or `N/h`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    per_second: f64,
}

/// Why a rate string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("invalid rate `{0}`: expected N/s, N/min or N/h (for example 500/min)")]
    Shape(String),
    #[error("invalid rate `{input}`: `{count}` is not a number")]
    Count { input: String, count: String },
    #[error("invalid rate `{input}`: the count must be finite and greater than zero")]
    NotPositive { input: String },
    #[error(
        "invalid rate `{input}`: unknown unit `{unit}`; use s, min or h (for example 500/min)"
    )]
    Unit { input: String, unit: String },
}

impl Rate {
    /// A rate of `n` requests per second; `None` unless `n` is finite and > 0.
    pub fn per_second(n: f64) -> Option<Rate> {
        (n.is_finite() && n > 0.0).then_some(Rate { per_second: n })
    }

    /// Requests per second.
    pub fn as_per_second(&self) -> f64 {
        self.per_second
    }

    /// This rate divided by `n` (for `--shard i/N`); `n` of 0 is treated as 1.
    pub fn divided(&self, n: u32) -> Rate {
        Rate {
            per_second: self.per_second / f64::from(n.max(1)),
        }
    }
}

impl FromStr for Rate {
    type Err = RateError;

    fn from_str(input: &str) -> Result<Rate, RateError> {
        let trimmed = input.trim();
        let (count, unit) = trimmed
            .split_once('/')
            .ok_or_else(|| RateError::Shape(input.to_string()))?;
        let n: f64 = count.trim().parse().map_err(|_| RateError::Count {
            input: input.to_string(),
            count: count.to_string(),
        })?;
        if !n.is_finite() || n <= 0.0 {
            return Err(RateError::NotPositive {
                input: input.to_string(),
            });
        }
        let seconds = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            other => {
                return Err(RateError::Unit {
                    input: input.to_string(),
                    unit: other.to_string(),
                })
            }
        };
        Ok(Rate {
            per_second: n / seconds,
        })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.per_second >= 1.0 {
            write!(f, "{}/s", trim_float(self.per_second))
        } else if self.per_second * 60.0 >= 1.0 {
            write!(f, "{}/min", trim_float(self.per_second * 60.0))
        } else {
            write!(f, "{}/h", trim_float(self.per_second * 3600.0))
        }
    }
}

fn trim_float(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        let table = [
            ("20/s", 20.0),
            ("500/min", 500.0 / 60.0),
            ("3600/h", 1.0),
            ("1.5/s", 1.5),
            (" 60 / m ", 1.0),
        ];
        for (input, want) in table {
            let got: Rate = input.parse().expect(input);
            assert!((got.as_per_second() - want).abs() < 1e-9, "{input}");
        }
    }

    #[test]
    fn refuses_bad_rates_clearly() {
        let err = "500/fortnight".parse::<Rate>().expect_err("unit");
        assert_eq!(
            err.to_string(),
            "invalid rate `500/fortnight`: unknown unit `fortnight`; use s, min or h (for example 500/min)"
        );
        assert!(matches!("500".parse::<Rate>(), Err(RateError::Shape(_))));
        assert!(matches!(
            "x/s".parse::<Rate>(),
            Err(RateError::Count { .. })
        ));
        assert!(matches!(
            "0/s".parse::<Rate>(),
            Err(RateError::NotPositive { .. })
        ));
        assert!(matches!(
            "-3/s".parse::<Rate>(),
            Err(RateError::NotPositive { .. })
        ));
        assert!(matches!(
            "inf/s".parse::<Rate>(),
            Err(RateError::NotPositive { .. })
        ));
    }

    #[test]
    fn displays_in_a_readable_unit() {
        assert_eq!(
            "500/min".parse::<Rate>().expect("rate").to_string(),
            "8.333/s"
        );
        assert_eq!(
            "30/min".parse::<Rate>().expect("rate").to_string(),
            "30/min"
        );
        assert_eq!("2/h".parse::<Rate>().expect("rate").to_string(), "2/h");
    }
}
