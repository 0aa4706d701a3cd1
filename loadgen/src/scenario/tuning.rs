//! Tuning sets: when each unit of a phase (one namespace × replica pair) is
//! meant to start. [`TuningSet::offsets`] is pure; [`spread`] runs units at
//! those offsets, open loop (a slow unit never delays the next one's start),
//! except where the set itself closes the loop: ClusterLoader2's
//! `parallelismLimitedLoad` (at most N units running) and `globalQPSLoad`
//! (one token bucket shared by every phase that names the set, so two
//! parallel phases together stay under its rate).

use std::future::Future;
use std::sync::{Arc, Mutex};
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
    /// CL2's `timeLimitedLoad{timeLimit}`: unit `i` at `i × timeLimit / units`.
    TimeLimited { time_limit: Duration },
    /// CL2's `randomizedTimeLimitedLoad{timeLimit}`: each unit at a uniformly
    /// random moment in `[0, timeLimit)`.
    RandomizedTimeLimited { time_limit: Duration },
    /// CL2's `parallelismLimitedLoad{parallelismLimit}`: every unit due at
    /// once, at most `limit` running.
    ParallelismLimited { limit: usize },
    /// CL2's `globalQPSLoad{qps, burst}`: every unit due at once, each waiting
    /// for a token of the bucket all phases naming this set share.
    GlobalQps { bucket: SharedBucket },
}

/// A token bucket shared by every phase that uses one `globalQPSLoad` set
/// (clones share it). Tokens are reserved in order: each caller learns when
/// its token is due, so waiting needs no lock.
#[derive(Debug, Clone)]
pub struct SharedBucket(Arc<Mutex<Bucket>>);

#[derive(Debug)]
struct Bucket {
    interval: Duration,
    burst: u32,
    /// When the next token is due if none were saved up.
    next: Option<Instant>,
}

impl PartialEq for SharedBucket {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl SharedBucket {
    /// `qps` tokens a second, up to `burst` (at least 1) at once.
    pub fn new(qps: f64, burst: u32) -> SharedBucket {
        let interval = Duration::try_from_secs_f64(1.0 / qps).unwrap_or(Duration::MAX);
        SharedBucket(Arc::new(Mutex::new(Bucket {
            interval,
            burst: burst.max(1),
            next: None,
        })))
    }

    /// Reserves the next token at `now`: when it may be used.
    pub fn reserve(&self, now: Instant) -> Instant {
        let mut b = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Saved-up tokens: at most `burst`, so an idle bucket lets `burst` go at once.
        let saved = b.interval.saturating_mul(b.burst - 1);
        let earliest = now.checked_sub(saved).unwrap_or(now);
        let at = b.next.map_or(earliest, |n| n.max(earliest));
        b.next = Some(at + b.interval);
        at.max(now)
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        tokio::time::sleep_until(self.reserve(Instant::now())).await;
    }
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
            LoadShape::TimeLimited { time_limit } => (0..units)
                .map(|i| {
                    Duration::try_from_secs_f64(
                        time_limit.as_secs_f64() * i as f64 / units.max(1) as f64,
                    )
                    .unwrap_or(Duration::MAX)
                })
                .collect(),
            LoadShape::RandomizedTimeLimited { time_limit } => {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut v: Vec<Duration> = (0..units)
                    .map(|_| time_limit.mul_f64(rng.random::<f64>()))
                    .collect();
                v.sort();
                v
            }
            LoadShape::ParallelismLimited { .. } | LoadShape::GlobalQps { .. } => {
                vec![Duration::ZERO; units]
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
    unit: F,
) -> Vec<T>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = T>,
{
    spread_shaped(offsets, None, start, stop, unit).await
}

/// [`spread`], closing the loop where `shape` asks: at most
/// `parallelismLimit` units running, or each unit first taking a token of its
/// `globalQPSLoad` bucket.
pub async fn spread_shaped<F, Fut, T>(
    offsets: &[Duration],
    shape: Option<&LoadShape>,
    start: Instant,
    stop: &CancellationToken,
    mut unit: F,
) -> Vec<T>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = T>,
{
    let limit = match shape {
        Some(LoadShape::ParallelismLimited { limit }) => (*limit).max(1),
        _ => usize::MAX,
    };
    let bucket = match shape {
        Some(LoadShape::GlobalQps { bucket }) => Some(bucket.clone()),
        _ => None,
    };
    let mut running = FuturesUnordered::new();
    let mut results: Vec<Option<T>> = (0..offsets.len()).map(|_| None).collect();
    let mut next = 0usize;
    while next < offsets.len() || !running.is_empty() {
        let due = offsets
            .get(next)
            .filter(|_| running.len() < limit)
            .map(|d| start + *d);
        tokio::select! {
            biased;
            _ = stop.cancelled(), if next < offsets.len() => next = offsets.len(),
            _ = async { if let Some(at) = due { tokio::time::sleep_until(at).await } },
                if due.is_some() => {
                let i = next;
                next += 1;
                let bucket = bucket.clone();
                let fut = unit(i);
                running.push(async move {
                    if let Some(b) = bucket {
                        b.acquire().await;
                    }
                    (i, fut.await)
                });
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
    async fn parallelism_limited_load_runs_at_most_its_limit() {
        let ts = TuningSet {
            name: "seq".into(),
            initial_delay: Duration::ZERO,
            shape: LoadShape::ParallelismLimited { limit: 2 },
        };
        let start = Instant::now();
        let offsets = ts.offsets(5, 1);
        let now_running = Arc::new(Mutex::new((0usize, 0usize)));
        spread_shaped(
            &offsets,
            Some(&ts.shape),
            start,
            &CancellationToken::new(),
            |_| {
                let r = now_running.clone();
                async move {
                    {
                        let mut g = r.lock().expect("lock");
                        g.0 += 1;
                        g.1 = g.1.max(g.0);
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    r.lock().expect("lock").0 -= 1;
                }
            },
        )
        .await;
        assert_eq!(now_running.lock().expect("lock").1, 2, "peak in flight");
        // 5 units of 1 s, two at a time: 3 s.
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_global_qps_bucket_paces_every_phase_that_shares_it() {
        let bucket = SharedBucket::new(10.0, 1);
        let shape = LoadShape::GlobalQps { bucket };
        let start = Instant::now();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let offsets = vec![Duration::ZERO; 10];
        let phase = |shape: LoadShape| {
            let seen = seen.clone();
            let offsets = offsets.clone();
            async move {
                spread_shaped(
                    &offsets,
                    Some(&shape),
                    start,
                    &CancellationToken::new(),
                    |_| {
                        let seen = seen.clone();
                        async move { seen.lock().expect("lock").push(start.elapsed()) }
                    },
                )
                .await
            }
        };
        // Two phases at once, one bucket: 20 units at 10/s together.
        futures_util::future::join(phase(shape.clone()), phase(shape)).await;
        let mut at = seen.lock().expect("lock").clone();
        at.sort();
        assert_eq!(at.len(), 20);
        assert_eq!(at[19], Duration::from_millis(1900));
        assert!(at
            .windows(2)
            .all(|w| w[1] - w[0] == Duration::from_millis(100)));
    }

    #[test]
    fn time_limited_loads_stay_inside_their_limit() {
        let even = set(LoadShape::TimeLimited {
            time_limit: Duration::from_secs(10),
        });
        let ms: Vec<u128> = even.offsets(4, 1).iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![500, 3000, 5500, 8000]);
        let random = set(LoadShape::RandomizedTimeLimited {
            time_limit: Duration::from_secs(10),
        });
        let v = random.offsets(100, 3);
        assert!(v
            .iter()
            .all(|d| *d >= Duration::from_millis(500) && *d < Duration::from_millis(10_500)));
        assert!(v.windows(2).all(|w| w[0] <= w[1]));
        assert_ne!(random.offsets(10, 1), random.offsets(10, 2), "seeded");
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
