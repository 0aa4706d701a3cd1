//! When each request is *meant* to start: the open-loop schedule.
//!
//! A schedule is a pure iterator of offsets from the run's start. The runner
//! sleeps until `start + offset` and issues the request whether or not earlier
//! ones have returned; latency is measured from that intended start, so a
//! stalled server shows up in the percentiles (no coordinated omission).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::rate::Rate;

/// The shape of the arrivals.
#[derive(Debug, Clone, PartialEq)]
pub enum ScheduleKind {
    /// Evenly spaced: request `i` at `i / rate`.
    Constant,
    /// Exponential gaps with mean `1 / rate` (a Poisson process), seeded.
    Poisson { seed: u64 },
    /// `steps` equal steps of `step` each, step `k` (1-based) at `rate * k / steps`;
    /// after the last step the full rate holds (ClusterLoader2's SteppedLoad idea).
    Steps { steps: u32, step: Duration },
}

/// An endless iterator of intended start offsets for one operation; a clone
/// yields the same offsets (Poisson gaps included: the generator is cloned).
#[derive(Debug, Clone)]
pub struct Ticks {
    kind: ScheduleKind,
    rate: f64,
    /// Index of the next request within the current segment.
    i: u64,
    /// Poisson: the last offset, in seconds.
    t: f64,
    /// Steps: the current step (0-based) and where it began, in seconds.
    step: u32,
    step_start: f64,
    rng: Option<StdRng>,
}

impl Ticks {
    /// Offsets for `rate` shaped by `kind`.
    pub fn new(kind: ScheduleKind, rate: Rate) -> Ticks {
        let rng = match kind {
            ScheduleKind::Poisson { seed } => Some(StdRng::seed_from_u64(seed)),
            _ => None,
        };
        Ticks {
            kind,
            rate: rate.as_per_second(),
            i: 0,
            t: 0.0,
            step: 0,
            step_start: 0.0,
            rng,
        }
    }
}

impl Iterator for Ticks {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let secs = match &self.kind {
            ScheduleKind::Constant => {
                // Computed from the index, not accumulated, so there is no drift.
                let s = self.i as f64 / self.rate;
                self.i += 1;
                s
            }
            ScheduleKind::Poisson { .. } => {
                let u: f64 = match self.rng.as_mut() {
                    Some(rng) => rng.random::<f64>(),
                    None => 0.5,
                };
                // 1 - u is in (0, 1], so ln is finite.
                let gap = -(1.0 - u).ln() / self.rate;
                let s = self.t;
                self.t += gap;
                s
            }
            ScheduleKind::Steps { steps, step } => {
                let steps = (*steps).max(1);
                let step_len = step.as_secs_f64();
                loop {
                    let k = self.step.min(steps - 1);
                    let rate = self.rate * f64::from(k + 1) / f64::from(steps);
                    let s = self.step_start + self.i as f64 / rate;
                    let last = self.step + 1 >= steps;
                    if last || s < self.step_start + step_len {
                        self.i += 1;
                        break s;
                    }
                    self.step += 1;
                    self.step_start += step_len;
                    self.i = 0;
                }
            }
        };
        Some(Duration::from_secs_f64(secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Rate {
        s.parse().expect("rate")
    }

    #[test]
    fn constant_is_exact_and_has_no_drift() {
        let ticks: Vec<_> = Ticks::new(ScheduleKind::Constant, rate("4/s"))
            .take(5)
            .collect();
        let ms: Vec<_> = ticks.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![0, 250, 500, 750, 1000]);
        let far = Ticks::new(ScheduleKind::Constant, rate("3/s"))
            .nth(300_000)
            .expect("tick");
        assert_eq!(far, Duration::from_secs(100_000));
    }

    #[test]
    fn poisson_has_the_right_mean_and_is_seeded() {
        let n = 20_000;
        let last = Ticks::new(ScheduleKind::Poisson { seed: 7 }, rate("100/s"))
            .nth(n)
            .expect("tick");
        let achieved = n as f64 / last.as_secs_f64();
        assert!((achieved - 100.0).abs() < 3.0, "achieved {achieved}/s");
        let a: Vec<_> = Ticks::new(ScheduleKind::Poisson { seed: 1 }, rate("10/s"))
            .take(10)
            .collect();
        let b: Vec<_> = Ticks::new(ScheduleKind::Poisson { seed: 1 }, rate("10/s"))
            .take(10)
            .collect();
        assert_eq!(a, b);
    }

    #[test]
    fn steps_ramp_up_then_hold() {
        let kind = ScheduleKind::Steps {
            steps: 2,
            step: Duration::from_secs(1),
        };
        let ticks: Vec<_> = Ticks::new(kind, rate("4/s"))
            .take_while(|d| *d < Duration::from_secs(3))
            .collect();
        // Step 1: 2/s for 1 s (2 requests), then 4/s: 4 in [1,2) and 4 in [2,3).
        assert_eq!(ticks.len(), 10);
        let in_first = ticks
            .iter()
            .filter(|d| **d < Duration::from_secs(1))
            .count();
        assert_eq!(in_first, 2);
        assert!(ticks.windows(2).all(|w| w[0] <= w[1]));
    }
}
