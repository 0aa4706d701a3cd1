//! A plant: the apiserver as the heavy lane and the heartbeats see it, in
//! virtual time, seeded, pure. It exists to test the controller in a closed
//! loop (see [`super::harness`]); nothing in the proxy runs it.
//!
//! **The model.** Heavy requests (LISTs) are served by processor sharing
//! over `parallel` workers at `serve_rate` priced bytes/s in all: a LIST
//! alone takes `cost / serve_rate`, three at once on two workers take 1.5×
//! as long each. What they serve fills a *heap* `H` that the garbage
//! collector drains with time constant `heap_tau`: `dH/dt = served − H/τ`.
//! The load the heartbeats feel is `u = H / (safe_rate·τ)`: 1 when bytes are
//! served evenly at `safe_rate`, with a lag of `τ` after a change (the real
//! apiserver answers a step 3–5 s late). A heartbeat takes
//! `base·e^(σ·z)·(1 + k·u^n)` plus whatever is left of a pause in progress,
//! with `k` chosen so that at `u = 1` its p99 is `edge`: the best even rate
//! sent directly is near `safe_rate` by construction, and the oracle
//! ([`super::harness::oracle`]) measures it rather than trusting that.
//! `n` makes the rise a cliff, as on the real apiserver (the short-window
//! p99 read 15–23 ms right up to a 130–206 ms pause). Pauses: a garbage
//! collection every `gc_bytes` served (Poisson), as long as `gc_pause·u`,
//! and load-free pauses of the baseline (`idle_pause_rate`, `idle_pause`).
//! A capacity drop scales `serve_rate` and `safe_rate` by `drop.factor`
//! from `drop.from` to `drop.until` seconds (another tenant, a compaction).
//!
//! **Where the parameters come from** ([`PlantParams`]'s presets):
//! - `slow` — the issue-32 machine, 10,000 pods: a LIST of all pods is
//!   priced 99 MB (33 MB sent + 2 × 33 MB read from etcd) and served alone
//!   in ~1 s; 18–35 LISTs a minute were the most the heartbeats took (one
//!   run within 50 ms at 35/min, another at 87 ms at 18/min), so
//!   `safe_rate` ≈ 30 LISTs/min ≈ 50 MB/s: even back-to-back single LISTs
//!   (100 MB/s) are too many. Heartbeats: 20/s, p99 15.6 ms at rest (base
//!   6 ms, σ 0.4: p99 ≈ 15 ms).
//! - `fast` — the bench/RESULTS.md goodput machine: 240 LISTs/min of 33 MB
//!   (priced 99 MB) sent directly met the 50 ms target (42.6 ms), the best
//!   static pool took all of them; at rest p99 6.6 ms. A LIST alone in
//!   ~0.2 s (serve 500 MB/s), `safe_rate` 450 MB/s (≈ 270 LISTs/min).
//! - `sim` — the modeled simulator at 2 virtual CPUs: a LIST of all pods
//!   in 1.3 s, priced ~48 MB; the best even rate within the target 14
//!   LISTs/min ≈ 11 MB/s; base p99 ~14 ms.
//! - All: `heap_tau` 3 s (the real apiserver's 3–5 s answer to a step),
//!   a collection per 200 MB served pausing up to 40 ms at `u = 1`
//!   (Go's collector pauses are short; the encoder's stalls are not), a
//!   load-free pause of 30 ms every 50 s (the baseline's own tail: 19–48 ms
//!   p99 at rest was seen through tollgate).
//! - `disturbed(x)`: the run starts at load `x`, decaying over 30 s (the
//!   issue's runs that followed a direct storm: the apiserver still at
//!   3–5 GB, heartbeats at rest 19–48 ms against 15.6 ms).

/// Seeded randomness: splitmix64, enough for a plant and reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean `mean`.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.uniform()).ln()
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// A capacity that drops and recovers mid-run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacityDrop {
    pub from: f64,
    pub until: f64,
    pub factor: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlantParams {
    /// Priced bytes/s served in all.
    pub serve_rate: f64,
    /// Requests served at full speed at once (cores).
    pub parallel: f64,
    /// The even rate of priced bytes/s at which the heartbeats' p99 is `edge`.
    pub safe_rate: f64,
    /// Seconds: the garbage collector's time constant.
    pub heap_tau: f64,
    /// The cliff's exponent.
    pub cliff: f64,
    /// Seconds: the heartbeats' median at rest.
    pub base: f64,
    /// Their log-normal spread.
    pub sigma: f64,
    /// Seconds: the heartbeats' p99 at `u = 1`.
    pub edge: f64,
    /// Bytes served per collection.
    pub gc_bytes: f64,
    /// Seconds: a collection's pause at `u = 1`.
    pub gc_pause: f64,
    /// Load-free pauses per second and their length.
    pub idle_pause_rate: f64,
    pub idle_pause: f64,
    pub drop: Option<CapacityDrop>,
    /// Load left by what came before (an apiserver still digesting a
    /// storm sent before tollgate started), decaying over `digest_tau`.
    pub initial_load: f64,
    pub digest_tau: f64,
}

const MB: f64 = 1_000_000.0;
/// z of the 99th percentile.
const Z99: f64 = 2.326;

impl PlantParams {
    fn common(serve_rate: f64, safe_rate: f64, base: f64) -> PlantParams {
        PlantParams {
            serve_rate,
            parallel: 2.0,
            safe_rate,
            heap_tau: 3.0,
            cliff: 4.0,
            base,
            sigma: 0.4,
            edge: 0.050,
            gc_bytes: 200.0 * MB,
            gc_pause: 0.040,
            idle_pause_rate: 0.02,
            idle_pause: 0.030,
            drop: None,
            initial_load: 0.0,
            digest_tau: 30.0,
        }
    }

    pub fn slow() -> PlantParams {
        PlantParams::common(100.0 * MB, 50.0 * MB, 0.006)
    }

    pub fn fast() -> PlantParams {
        PlantParams {
            sigma: 0.3,
            ..PlantParams::common(500.0 * MB, 450.0 * MB, 0.003)
        }
    }

    pub fn sim() -> PlantParams {
        PlantParams::common(37.0 * MB, 11.0 * MB, 0.0055)
    }

    pub fn with_drop(self, from: f64, until: f64, factor: f64) -> PlantParams {
        PlantParams {
            drop: Some(CapacityDrop {
                from,
                until,
                factor,
            }),
            ..self
        }
    }

    /// Starting in front of an apiserver still digesting earlier load.
    pub fn disturbed(self, initial_load: f64) -> PlantParams {
        PlantParams {
            initial_load,
            ..self
        }
    }

    /// The capacity factor at `t` seconds.
    pub fn capacity(&self, t: f64) -> f64 {
        match self.drop {
            Some(d) if t >= d.from && t < d.until => d.factor,
            _ => 1.0,
        }
    }

    /// `k`: at `u = 1` the heartbeats' p99 (of the noise alone) is `edge`.
    fn k(&self) -> f64 {
        (self.edge / (self.base * (self.sigma * Z99).exp()) - 1.0).max(0.0)
    }
}

#[derive(Debug, Clone)]
struct Job {
    id: u64,
    remaining: f64,
}

/// The plant.
#[derive(Debug, Clone)]
pub struct Plant {
    p: PlantParams,
    k: f64,
    rng: Rng,
    jobs: Vec<Job>,
    heap: f64,
    /// Virtual seconds.
    t: f64,
    pause_until: f64,
    gc_credit: f64,
    next_idle_pause: f64,
}

impl Plant {
    pub fn new(p: PlantParams, seed: u64) -> Plant {
        let mut rng = Rng::new(seed);
        let next_idle_pause = rng.exp(1.0 / p.idle_pause_rate.max(1e-9));
        let gc_credit = rng.exp(p.gc_bytes);
        Plant {
            k: p.k(),
            p,
            rng,
            jobs: Vec::new(),
            heap: 0.0,
            t: 0.0,
            pause_until: 0.0,
            gc_credit,
            next_idle_pause,
        }
    }

    /// A heavy request of `cost` priced bytes starts now.
    pub fn start(&mut self, id: u64, cost: f64) {
        self.jobs.push(Job {
            id,
            remaining: cost.max(1.0),
        });
    }

    /// The load the heartbeats feel now.
    pub fn load(&self) -> f64 {
        let safe = self.p.safe_rate * self.p.capacity(self.t) * self.p.heap_tau;
        self.heap / safe.max(1.0) + self.p.initial_load * (-self.t / self.p.digest_tau).exp()
    }

    /// Advance by `dt` seconds; the ids of the requests served whole.
    pub fn advance(&mut self, dt: f64, done: &mut Vec<u64>) {
        let cap = self.p.capacity(self.t);
        let n = self.jobs.len() as f64;
        let mut served = 0.0;
        if n > 0.0 {
            let each = self.p.serve_rate * cap / (n / self.p.parallel).max(1.0) * dt;
            for j in &mut self.jobs {
                let s = each.min(j.remaining);
                j.remaining -= s;
                served += s;
            }
            self.jobs.retain(|j| {
                if j.remaining <= 1e-6 {
                    done.push(j.id);
                    false
                } else {
                    true
                }
            });
        }
        self.heap += served - self.heap * dt / self.p.heap_tau;
        self.t += dt;
        self.gc_credit -= served;
        if self.gc_credit <= 0.0 {
            self.gc_credit = self.rng.exp(self.p.gc_bytes);
            let pause = self.p.gc_pause * self.load();
            self.pause_until = self.pause_until.max(self.t + pause);
        }
        if self.t >= self.next_idle_pause {
            self.next_idle_pause = self.t + self.rng.exp(1.0 / self.p.idle_pause_rate.max(1e-9));
            self.pause_until = self.pause_until.max(self.t + self.p.idle_pause);
        }
    }

    /// The latency of a heartbeat that starts now, seconds.
    pub fn heartbeat(&mut self) -> f64 {
        let u = self.load();
        let noise = self.p.base * (self.p.sigma * self.rng.normal()).exp();
        noise * (1.0 + self.k * u.powf(self.p.cliff)) + (self.pause_until - self.t).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p99(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64) * 0.99).ceil() as usize - 1]
    }

    /// Heartbeats every 50 ms for `secs` with a LIST of `cost` every `gap`.
    fn even(p: PlantParams, cost: f64, gap: f64, secs: f64) -> f64 {
        let mut plant = Plant::new(p, 7);
        let (mut lat, mut done, mut next, mut id) = (Vec::new(), Vec::new(), 0.0, 0);
        let dt = 0.01;
        for i in 0..(secs / dt) as usize {
            let t = i as f64 * dt;
            if gap > 0.0 && t >= next {
                plant.start(id, cost);
                id += 1;
                next += gap;
            }
            if i % 5 == 0 && t > 20.0 {
                lat.push(plant.heartbeat());
            }
            plant.advance(dt, &mut done);
        }
        p99(lat)
    }

    #[test]
    fn the_plant_is_calibrated_as_its_doc_says() {
        let p = PlantParams::slow();
        let at_rest = even(p, 99.0 * MB, 0.0, 120.0);
        assert!(at_rest < 0.025, "p99 at rest {at_rest}");
        // Evenly at three quarters of the safe rate: within the edge.
        let gap = 99.0 * MB / (0.75 * p.safe_rate);
        let under = even(p, 99.0 * MB, gap, 120.0);
        assert!(under < p.edge, "at 0.75 of the safe rate: {under}");
        // Back to back at one LIST at a time: over it (the finding).
        let back_to_back = even(p, 99.0 * MB, 99.0 * MB / p.serve_rate, 120.0);
        assert!(back_to_back > p.edge, "back to back: {back_to_back}");
    }

    #[test]
    fn lists_are_shared_and_a_drop_slows_them() {
        let p = PlantParams::slow().with_drop(0.0, 10.0, 0.5);
        let mut plant = Plant::new(p, 1);
        plant.start(1, 50.0 * MB);
        let mut done = Vec::new();
        let mut t: f64 = 0.0;
        while done.is_empty() {
            plant.advance(0.01, &mut done);
            t += 0.01;
        }
        assert!((t - 1.0).abs() < 0.02, "50 MB at half of 100 MB/s: {t}");
    }
}
