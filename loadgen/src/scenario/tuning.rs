//! Tuning sets: when each unit of a phase (one namespace × replica pair) is
//! meant to start. [`TuningSet::offsets`] is pure; [`spread`] runs units at
//! those offsets, open loop (a slow unit never delays the next one's start).

use std::future::Future;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::rate::Rate;
use crate::schedule::{ScheduleKind, Ticks};

/// How a tuning set spreads units in time.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadShape {
    /// `qpsLoad{qps}`: unit `i` at `i / qps`.
    Qps { qps: f64 },
    /// `randomizedLoad{averageQps}`: each unit at a uniformly random moment in
    /// `[0, units / averageQps)`, so the average rate is `averageQps`.
    Randomized { average_qps: f64 },
    /// `steppedLoad{burstSize, stepDelay}`: `burstSize` units at once, every `stepDelay`.
    Stepped {
        burst_size: u32,
        step_delay: Duration,
    },
    /// `poissonLoad{averageQps}`: exponential gaps with mean `1 / averageQps`
    /// (an open-loop Poisson process).
    Poisson { average_qps: f64 },
}

/// A named tuning set.
#[derive(Debug, Clone, PartialEq)]
pub struct TuningSet {
    pub name: String,
    /// Added to every offset.
    pub initial_delay: Duration,
    pub shape: LoadShape,
}

impl TuningSet {
    /// The intended start of each of `units` units, from the phase's start,
    /// ascending. `seed` fixes the random shapes.
    pub fn offsets(&self, units: usize, seed: u64) -> Vec<Duration> {
        let rate = |qps: f64| Rate::per_second(qps);
        let mut out: Vec<Duration> = match &self.shape {
            LoadShape::Qps { qps } => match rate(*qps) {
                Some(r) => Ticks::new(ScheduleKind::Constant, r).take(units).collect(),
                None => vec![Duration::ZERO; units],
            },
            LoadShape::Poisson { average_qps } => match rate(*average_qps) {
                Some(r) => Ticks::new(ScheduleKind::Poisson { seed }, r)
                    .take(units)
                    .collect(),
                None => vec![Duration::ZERO; units],
            },
            LoadShape::Randomized { average_qps } => {
                let window = units as f64 / average_qps.max(f64::MIN_POSITIVE);
                let mut rng = StdRng::seed_from_u64(seed);
                let mut v: Vec<Duration> = (0..units)
                    .map(|_| {
                        Duration::try_from_secs_f64(rng.random::<f64>() * window)
                            .unwrap_or(Duration::MAX)
                    })
                    .collect();
                v.sort();
                v
            }
            LoadShape::Stepped {
                burst_size,
                step_delay,
            } => {
                let burst = u64::from((*burst_size).max(1));
                (0..units as u64)
                    .map(|i| {
                        step_delay.saturating_mul(u32::try_from(i / burst).unwrap_or(u32::MAX))
                    })
                    .collect()
            }
        };
        for d in &mut out {
            *d = d.saturating_add(self.initial_delay);
        }
        out
    }
}

/// Starts `unit(i)` at `start + offsets[i]` for every `i` and waits for all of
/// them; units run concurrently, each started on time whatever the others do.
/// Once `stop` is cancelled no unit starts; those running finish. Results
/// come back in unit order.
pub async fn spread<F, Fut, T>(
    offsets: &[Duration],
    start: Instant,
    stop: &CancellationToken,
    mut unit: F,
) -> Vec<T>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = T>,
{
    let mut running = FuturesUnordered::new();
    let mut results: Vec<Option<T>> = (0..offsets.len()).map(|_| None).collect();
    let mut next = 0usize;
    while next < offsets.len() || !running.is_empty() {
        let due = offsets.get(next).map(|d| start + *d);
        tokio::select! {
            biased;
            _ = stop.cancelled(), if due.is_some() => next = offsets.len(),
            _ = async { if let Some(at) = due { tokio::time::sleep_until(at).await } },
                if due.is_some() => {
                let i = next;
                next += 1;
                let fut = unit(i);
                running.push(async move { (i, fut.await) });
            }
            Some((i, r)) = running.next(), if !running.is_empty() => {
                results[i] = Some(r);
            }
        }
    }
    results.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn set(shape: LoadShape) -> TuningSet {
        TuningSet {
            name: "t".into(),
            initial_delay: Duration::from_millis(500),
            shape,
        }
    }

    /// Runs `units` units that each take `work` and returns when each started,
    /// measured on the (paused) tokio clock from the phase's start.
    async fn started_at(ts: &TuningSet, units: usize, work: Duration) -> Vec<Duration> {
        let start = Instant::now();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let offsets = ts.offsets(units, 42);
        let done = spread(&offsets, start, &CancellationToken::new(), |i| {
            let seen = seen.clone();
            async move {
                seen.lock().expect("lock").push((i, start.elapsed()));
                tokio::time::sleep(work).await;
                i
            }
        })
        .await;
        assert_eq!(done, (0..units).collect::<Vec<_>>());
        let mut v = seen.lock().expect("lock").clone();
        v.sort();
        v.into_iter().map(|(_, t)| t).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_starts_no_more_units_and_lets_running_ones_finish() {
        let start = Instant::now();
        let stop = CancellationToken::new();
        let offsets = [0, 100, 200, 300, 400].map(Duration::from_millis);
        let stopper = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(250)).await;
            stopper.cancel();
        });
        // Each unit takes 1 s: the three started before the stop all finish.
        let done = spread(&offsets, start, &stop, |i| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            i
        })
        .await;
        assert_eq!(done, vec![0, 1, 2]);
        assert_eq!(start.elapsed(), Duration::from_millis(1200));
    }

    #[tokio::test(start_paused = true)]
    async fn qps_load_starts_units_evenly_even_when_they_are_slow() {
        // Each unit takes 3 s, far longer than the 100 ms gap: open loop.
        let at = started_at(
            &set(LoadShape::Qps { qps: 10.0 }),
            5,
            Duration::from_secs(3),
        )
        .await;
        let ms: Vec<u128> = at.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![500, 600, 700, 800, 900]);
    }

    #[tokio::test(start_paused = true)]
    async fn stepped_load_releases_bursts_at_each_step() {
        let ts = set(LoadShape::Stepped {
            burst_size: 3,
            step_delay: Duration::from_secs(2),
        });
        let at = started_at(&ts, 7, Duration::from_millis(10)).await;
        let s: Vec<u128> = at.iter().map(|d| d.as_millis()).collect();
        assert_eq!(s, vec![500, 500, 500, 2500, 2500, 2500, 4500]);
    }

    #[tokio::test(start_paused = true)]
    async fn randomized_load_stays_in_its_window_with_the_average_rate() {
        let ts = set(LoadShape::Randomized { average_qps: 20.0 });
        let at = started_at(&ts, 200, Duration::from_millis(1)).await;
        // 200 units at 20/s on average: within [0.5 s, 10.5 s), spread over it.
        assert!(at
            .iter()
            .all(|d| *d >= Duration::from_millis(500) && *d < Duration::from_millis(10_500)));
        let first_half = at
            .iter()
            .filter(|d| **d < Duration::from_millis(5_500))
            .count();
        assert!((70..=130).contains(&first_half), "{first_half}");
        assert_ne!(ts.offsets(10, 1), ts.offsets(10, 2), "seeded");
    }

    #[tokio::test(start_paused = true)]
    async fn poisson_load_has_the_average_rate() {
        let ts = set(LoadShape::Poisson { average_qps: 50.0 });
        let at = started_at(&ts, 1000, Duration::from_millis(1)).await;
        let span = (at[at.len() - 1] - at[0]).as_secs_f64();
        let rate = 999.0 / span;
        assert!((40.0..60.0).contains(&rate), "{rate}/s");
        assert!(at
            .windows(2)
            .any(|w| w[1] - w[0] > Duration::from_millis(40)));
    }
}
