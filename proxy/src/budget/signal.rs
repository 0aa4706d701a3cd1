//! The latency signal: how the lanes tollgate protects (node heartbeats,
//! leases, system and exempt requests) fare right now, against how they
//! fare with no heavy request in flight. Pure: time is passed in.
//!
//! **The short-window p99.** Heartbeats arrive at ~20/s on a cluster of a
//! few hundred nodes, so a 1 s window holds ~20 samples and its p99 is simply the maximum: one
//! garbage-collection pause would read as an overload. The window is the
//! shortest run of newest samples that spans at least [`MIN_WINDOW`] and
//! holds at least [`MIN_SAMPLES`], never older than [`MAX_WINDOW`]; fewer
//! samples than that in `MAX_WINDOW` is no signal from this source (the
//! next one steers, or tollgate probes: [`crate::budget::heavy`]).
//! The quantile is taken by nearest rank, but never the two largest
//! samples (`rank = min(⌈0.99·n⌉, n − 2)`): with 40 samples the p99 is the
//! third largest, so one pause of the apiserver, which slows two or three
//! heartbeats at once, cannot trigger a decrease alone; from 200 samples on
//! it is the plain p99. So a window's reading depends on how many samples
//! it holds: with 20 it would be the 90th percentile, and a source that
//! sparse steers the p99 it is judged by over the target (in the
//! closed-loop harness, heartbeats at 5 and 10 a second read in windows of
//! 20 held within 50 ms in 110 and 160 of 180 runs; at least 40, with the
//! probes taking over below 10 a second, 175 and 180 of 180). At most [`MAX_SAMPLES`] are kept: on a
//! large cluster the window is then the newest `MAX_SAMPLES`, still
//! seconds long.
//!
//! **The tail.** The target is a p99 over minutes: at most 1% of the
//! protected requests over it. The short window cannot see a load that
//! slows one or two heartbeats at a time (each LIST's garbage-collection
//! pause, say): it never takes the two largest samples, yet fifteen such
//! pauses a minute are 15 of 1,200 heartbeats, over the 1%. So the signal
//! also counts, over the last [`TAIL_WINDOW`], the samples and how many
//! were over the target ([`Tail`]), which `/debug/budget` shows beside
//! the decisions; the controller does not steer by it (it answers a
//! minute late; the edge's memory keeps crossings to one a minute
//! instead). Early in the window (a cold start) the count is judged
//! against the samples a whole window will hold at the rate seen so far,
//! as the run's p99 will judge it, so one pause of the first LIST from a
//! cold etcd does not read as the minute's whole budget spent.
//!
//! **The baseline** is the lowest p99 of *quiet* samples: requests that
//! started at least [`SETTLE`] after the last heavy request ended and ended
//! before the next one started (the apiserver's memory and garbage collector
//! stay busy for a moment after a large LIST). The quiet samples are cut
//! into runs of [`MIN_SAMPLES`] in the order they arrive, and the baseline
//! is the smallest complete run's p99 (Envoy's minimum RTT, taken as a
//! p99): the signal's own statistic — the third largest of 40, as the
//! short window takes it — at rest. A run's p99 is taken once, when its
//! last sample arrives, so a controller step only compares the runs'
//! p99s. Runs as short as the window make the baseline err low, never
//! high: one pause of the apiserver that slows three heartbeats sets the
//! p99 of the run it falls in, and with runs of 100 the first two runs
//! of a storm on the real apiserver (a pause of 1.1 s at its first LIST
//! among them) set a baseline of 791 ms and a target of 1.58 s, where the
//! same apiserver at rest answers within 10 ms; the lowest of many short
//! runs finds the rest between the pauses. A baseline too low makes the
//! target stricter (its floor still holds), which fails closed. Tollgate
//! often starts in front of an apiserver that is still digesting load sent
//! before it (a restart in a storm, LISTs that bypassed it), and the p99 of
//! all quiet samples then learned that load as normal — on the real
//! apiserver a baseline of 110 ms after a direct storm, where the same
//! apiserver at rest answers in 10 ms, let the target drift to 220 ms. It
//! is kept honest over time by a horizon: only runs whose samples all lie
//! within the last [`BASELINE_HORIZON`] count (and within the newest
//! [`MAX_SAMPLES`]), so a cluster that grew slower (or faster) moves its
//! baseline within minutes.
//! Under a heavy load that never pauses no quiet sample arrives; the last
//! baseline is then kept and reported stale (its age is in `/debug/budget`)
//! rather than guessed from loaded samples, which would let the target
//! drift up with the overload it should catch. Before any baseline exists
//! the target uses its floor.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// The window spans at least this much time…
pub const MIN_WINDOW: Duration = Duration::from_secs(2);
/// …and holds at least this many samples (never reading less than the
/// 95th percentile: the two largest are never taken)…
pub const MIN_SAMPLES: usize = 40;
/// …but reaches no further back than this: two controller epochs. A
/// sparser source would steer by what it saw several decisions ago; below
/// 10 samples a second the next source, or the probes, steer instead.
pub const MAX_WINDOW: Duration = Duration::from_secs(4);
/// The tail's window: a minute, as long as the target's p99 is usually
/// taken over (and bench/scripts/goodput.sh's runs).
pub const TAIL_WINDOW: Duration = Duration::from_secs(60);
/// Fewer samples than this in [`TAIL_WINDOW`] say nothing about a 1% tail.
pub const TAIL_MIN_SAMPLES: usize = 100;
/// Samples kept (recent and quiet each).
pub const MAX_SAMPLES: usize = 4096;
/// After a heavy request ends, samples count as quiet only from then on.
pub const SETTLE: Duration = Duration::from_secs(2);
/// Quiet samples older than this no longer shape the baseline.
pub const BASELINE_HORIZON: Duration = Duration::from_secs(600);

const QUANTILE: f64 = 0.99;

/// Whose latency a sample is, in the order the budget prefers them as its
/// signal: the first with enough samples in its window steers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The lanes tollgate protects (heartbeats, leases, system, exempt).
    Protected,
    /// Light requests of the `workload` lane, when protected ones are too
    /// few (the kubelets talk to the apiserver directly).
    Workload,
    /// Tollgate's own probes (`quota.adaptive.probe`), sent only while
    /// neither of the others has enough samples.
    Probe,
}

impl Source {
    pub const ALL: [Source; 3] = [Source::Protected, Source::Workload, Source::Probe];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Protected => "protected",
            Source::Workload => "workload",
            Source::Probe => "probe",
        }
    }
}

/// The protected requests of the last [`TAIL_WINDOW`], and how many of
/// them were slower than the target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tail {
    pub samples: usize,
    pub slow: usize,
    /// The time from the oldest of them to now.
    pub span: Duration,
}

impl Tail {
    /// The share of a window's requests that were slow: `slow` against the
    /// samples the whole window holds at the rate seen over `span` — but for
    /// a window cut short by [`MAX_SAMPLES`], whose span is short because
    /// the requests are many, not because they have only begun: there,
    /// `slow` against the samples it holds (at 100 heartbeats a second the
    /// cap holds 41 s, and scaling it to a minute made the tail look a third
    /// smaller than it was).
    pub fn share(&self) -> f64 {
        if self.samples >= MAX_SAMPLES {
            return self.slow as f64 / self.samples as f64;
        }
        scaled_share(self.slow, self.samples, self.span, TAIL_WINDOW)
    }
}

/// `slow` against the samples a whole `window` holds at the rate `samples`
/// over `span` show (at least `samples`).
fn scaled_share(slow: usize, samples: usize, span: Duration, window: Duration) -> f64 {
    let span = span.max(MIN_WINDOW).as_secs_f64();
    let whole = samples as f64 * (window.as_secs_f64() / span).max(1.0);
    slow as f64 / whole.max(1.0)
}

/// The protected lanes' latency.
#[derive(Debug, Clone)]
pub struct Signal {
    /// `(ended at, seconds)`, oldest first.
    recent: VecDeque<(Instant, f64)>,
    quiet: VecDeque<(Instant, f64)>,
    /// Quiet samples recorded so far; `quiet` holds the newest of them.
    quiet_total: u64,
    /// The complete runs of quiet samples still in `quiet`, oldest first.
    runs: VecDeque<Run>,
    /// Reused by each quantile, so a controller step allocates nothing.
    scratch: Vec<f64>,
    heavy_busy: bool,
    /// When the heavy lane last became empty.
    heavy_idle_since: Option<Instant>,
    /// When the heavy lane last became busy.
    heavy_busy_since: Option<Instant>,
    /// The last baseline and when its newest quiet sample ended.
    baseline: Option<(f64, Instant)>,
}

/// A run of [`MIN_SAMPLES`] quiet samples, its p99 taken when
/// its last sample arrived.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// The number (in `quiet_total`'s count) of its first sample.
    first: u64,
    /// When its newest sample ended.
    newest: Instant,
    p99: f64,
}

/// The signal as `/debug/budget` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalView {
    /// Seconds; `None`: too few samples.
    pub p99_seconds: Option<f64>,
    /// Samples in the window.
    pub window_samples: usize,
    /// Seconds the window spans.
    pub window_seconds: f64,
    pub baseline_seconds: Option<f64>,
    /// Seconds since the newest quiet sample behind the baseline.
    pub baseline_age_seconds: Option<f64>,
    pub quiet_samples: usize,
}

impl Default for Signal {
    fn default() -> Self {
        Signal::new()
    }
}

impl Signal {
    pub fn new() -> Signal {
        Signal {
            recent: VecDeque::new(),
            quiet: VecDeque::new(),
            quiet_total: 0,
            runs: VecDeque::new(),
            scratch: Vec::new(),
            heavy_busy: false,
            heavy_idle_since: None,
            heavy_busy_since: None,
            baseline: None,
        }
    }

    /// Whether a heavy request is in flight, as of `now` (called whenever
    /// the heavy lane becomes busy or empty; repeats are harmless).
    pub fn set_heavy_busy(&mut self, busy: bool, now: Instant) {
        if busy && !self.heavy_busy {
            self.heavy_busy_since = Some(now);
        }
        if !busy && self.heavy_busy {
            self.heavy_idle_since = Some(now);
        }
        self.heavy_busy = busy;
    }

    /// A protected request that started at `started` took `latency`, ending
    /// at `now`.
    pub fn record(&mut self, latency: Duration, started: Instant, now: Instant) {
        let secs = latency.as_secs_f64();
        push_bounded(&mut self.recent, (now, secs));
        let settled = self.heavy_idle_since.is_none_or(|t| started >= t + SETTLE);
        let untouched = self.heavy_busy_since.is_none_or(|t| t < started);
        // Busy since before it started is not quiet; neither is busy now.
        if !self.heavy_busy && settled && untouched {
            push_bounded(&mut self.quiet, (now, secs));
            self.quiet_total += 1;
            let n = MIN_SAMPLES;
            // A run is complete if all of it is still here (none aged out).
            if self.quiet_total.is_multiple_of(n as u64) && self.quiet.len() >= n {
                self.scratch.clear();
                let from = self.quiet.len() - n;
                self.scratch.extend(self.quiet.range(from..).map(|s| s.1));
                self.runs.push_back(Run {
                    first: self.quiet_total - n as u64,
                    newest: now,
                    p99: robust_p99(&mut self.scratch),
                });
            }
            self.prune_runs();
        }
    }

    /// Runs with a sample no longer in `quiet` no longer count.
    fn prune_runs(&mut self) {
        let oldest_kept = self.quiet_total - self.quiet.len() as u64;
        while self.runs.front().is_some_and(|r| r.first < oldest_kept) {
            self.runs.pop_front();
        }
    }

    fn prune(&mut self, now: Instant) {
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > TAIL_WINDOW)
        {
            self.recent.pop_front();
        }
        while self
            .quiet
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > BASELINE_HORIZON)
        {
            self.quiet.pop_front();
        }
        self.prune_runs();
    }

    /// The short-window p99 at `now` and the window it was taken over
    /// (`(p99, samples, span)`); `None` with too few samples.
    /// Whether [`Signal::p99`] would give a p99 at `now` (enough samples
    /// within [`MAX_WINDOW`]), without taking it: asked every probe tick
    /// under admission's lock, where sorting the window is not needed.
    pub fn has_p99(&mut self, now: Instant) -> bool {
        self.prune(now);
        let oldest_allowed = now.checked_sub(MAX_WINDOW);
        self.recent
            .iter()
            .rev()
            .take_while(|(t, _)| oldest_allowed.is_none_or(|o| *t >= o))
            .nth(MIN_SAMPLES - 1)
            .is_some()
    }

    pub fn p99(&mut self, now: Instant) -> Option<(Duration, usize, Duration)> {
        self.prune(now);
        let taken = &mut self.scratch;
        taken.clear();
        let mut oldest = None;
        // `now - t >= MIN_WINDOW` as `t <= now - MIN_WINDOW`: one subtraction
        // per step, not one per sample (this walks hundreds of samples).
        let window_start = now.checked_sub(MIN_WINDOW);
        let oldest_allowed = now.checked_sub(MAX_WINDOW);
        for &(t, secs) in self.recent.iter().rev() {
            if oldest_allowed.is_some_and(|o| t < o) {
                break;
            }
            taken.push(secs);
            oldest = Some(t);
            if taken.len() >= MIN_SAMPLES && window_start.is_some_and(|w| t <= w) {
                break;
            }
        }
        if taken.len() < MIN_SAMPLES {
            return None;
        }
        let span = oldest.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        let n = taken.len();
        Some((Duration::from_secs_f64(robust_p99(taken)), n, span))
    }

    /// The tail at `now` against `target`; `None` with fewer than
    /// [`TAIL_MIN_SAMPLES`] in the window.
    pub fn tail(&mut self, target: Duration, now: Instant) -> Option<Tail> {
        self.prune(now);
        if self.recent.len() < TAIL_MIN_SAMPLES {
            return None;
        }
        let limit = target.as_secs_f64();
        let slow = self.recent.iter().filter(|s| s.1 > limit).count();
        let span = self
            .recent
            .front()
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s.0));
        Some(Tail {
            samples: self.recent.len(),
            slow,
            span,
        })
    }

    /// The baseline at `now`: renewed from the complete runs of quiet
    /// samples of the horizon when there is one, else the last one.
    pub fn baseline(&mut self, now: Instant) -> Option<Duration> {
        self.prune(now);
        if let Some(newest) = self.runs.back().map(|r| r.newest) {
            let lowest = self
                .runs
                .iter()
                .map(|r| r.p99)
                .fold(f64::INFINITY, f64::min);
            self.baseline = Some((lowest, newest));
        }
        self.baseline.map(|(b, _)| Duration::from_secs_f64(b))
    }

    pub fn view(&mut self, now: Instant) -> SignalView {
        let p99 = self.p99(now);
        let baseline = self.baseline(now);
        SignalView {
            p99_seconds: p99.map(|p| p.0.as_secs_f64()),
            window_samples: p99.map_or(0, |p| p.1),
            window_seconds: p99.map_or(0.0, |p| p.2.as_secs_f64()),
            baseline_seconds: baseline.map(|b| b.as_secs_f64()),
            baseline_age_seconds: self
                .baseline
                .map(|(_, t)| now.saturating_duration_since(t).as_secs_f64()),
            quiet_samples: self.quiet.len(),
        }
    }
}

fn push_bounded(q: &mut VecDeque<(Instant, f64)>, sample: (Instant, f64)) {
    if q.len() >= MAX_SAMPLES {
        q.pop_front();
    }
    q.push_back(sample);
}

/// Nearest-rank p99 that never picks the single largest of `n ≥ 2`.
fn robust_p99(samples: &mut [f64]) -> f64 {
    let n = samples.len();
    if n == 0 {
        return 0.0;
    }
    let rank = ((QUANTILE * n as f64).ceil() as usize)
        .min(n.saturating_sub(2))
        .max(1);
    let (_, nth, _) = samples.select_nth_unstable_by(rank - 1, f64::total_cmp);
    *nth
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Heartbeats every 50 ms (20/s) for `secs`, of `latency(i)` each.
    fn heartbeats(
        s: &mut Signal,
        from: Instant,
        secs: u64,
        latency: impl Fn(u64) -> u64,
    ) -> Instant {
        let mut now = from;
        for i in 0..secs * 20 {
            now += ms(50);
            let l = ms(latency(i));
            s.record(l, now - l, now);
        }
        now
    }

    #[test]
    fn the_window_is_two_seconds_of_heartbeats_and_one_pause_is_ignored() {
        let mut s = Signal::new();
        let t0 = Instant::now();
        // 20/s, 10..49 ms, one 900 ms pause in the last two seconds.
        let now = heartbeats(&mut s, t0, 3, |i| if i == 50 { 900 } else { 10 + i % 40 });
        let (p99, n, span) = s.p99(now).expect("enough samples");
        assert_eq!((n, span), (41, ms(2000)), "2 s window: 41 samples");
        assert_eq!(p99, ms(48), "neither the outlier nor the next is the p99");
    }

    #[test]
    fn the_tail_counts_the_minutes_slow_requests_against_a_whole_minute() {
        let mut s = Signal::new();
        let t0 = Instant::now();
        // 20/s; every 100th 80 ms (over a 50 ms target), the rest 10 ms.
        let now = heartbeats(&mut s, t0, 4, |i| if i % 100 == 99 { 80 } else { 10 });
        assert_eq!(
            s.tail(ms(50), now),
            None,
            "80 samples say nothing of a 1% tail"
        );
        let now = heartbeats(&mut s, now, 1, |_| 10);
        let t = s.tail(ms(50), now).expect("100 samples");
        assert_eq!((t.samples, t.slow), (100, 0));
        // 15 s in: 3 slow of 300, judged against a minute's 1,200: 0.25%.
        let now = heartbeats(&mut s, now, 10, |i| if i % 100 == 99 { 80 } else { 10 });
        let t = s.tail(ms(50), now).expect("enough");
        assert_eq!((t.samples, t.slow), (300, 2));
        assert!((t.share() - 2.0 / 1200.0).abs() < 1e-3, "{}", t.share());
        // Two minutes on, only the last minute counts: 12 of 1,200.
        let now = heartbeats(&mut s, now, 120, |i| if i % 100 == 50 { 80 } else { 10 });
        let t = s.tail(ms(50), now).expect("enough");
        assert_eq!(t.samples, 1201, "the window's ends are both in");
        assert_eq!(t.slow, 12);
        assert!((t.share() - 0.01).abs() < 1e-3);
    }

    #[test]
    fn a_tail_cut_short_by_the_cap_is_judged_on_what_it_holds() {
        let mut s = Signal::new();
        let mut now = Instant::now();
        // 100/s for a minute, 1% slow: the cap keeps the last 41 s.
        for i in 0..6000u64 {
            now += ms(10);
            let l = ms(if i % 100 == 7 { 80 } else { 10 });
            s.record(l, now - l, now);
        }
        let t = s.tail(ms(50), now).expect("enough");
        assert_eq!(t.samples, MAX_SAMPLES);
        assert!(t.span < Duration::from_secs(42), "{:?}", t.span);
        assert!(
            (t.share() - 0.01).abs() < 1e-3,
            "1% slow, not 0.68%: {}",
            t.share()
        );
    }

    #[test]
    fn too_few_samples_is_no_signal() {
        let mut s = Signal::new();
        let t0 = Instant::now();
        let mut now = t0;
        for _ in 0..39 {
            now += ms(50);
            s.record(ms(5), now, now);
        }
        assert_eq!(s.p99(now), None);
        assert!(!s.has_p99(now));
        now += ms(50);
        s.record(ms(5), now, now);
        assert_eq!(s.p99(now).map(|p| p.1), Some(40), "40 in 2 s");
        assert!(s.has_p99(now));
        assert_eq!(s.p99(now + Duration::from_secs(3)), None, "aged out");
        assert!(!s.has_p99(now + Duration::from_secs(3)));
    }

    #[test]
    fn slow_heartbeats_widen_the_window() {
        let mut s = Signal::new();
        let t0 = Instant::now();
        let mut now = t0;
        // 10/s: 40 samples take 4 s.
        for i in 0..80u64 {
            now += ms(100);
            s.record(ms(i), now, now);
        }
        let (p99, n, span) = s.p99(now).expect("enough");
        assert_eq!((n, span), (40, ms(3900)));
        assert_eq!(p99, ms(77), "of 40..79, the third largest");
        // 5/s: 40 samples would take 8 s, past MAX_WINDOW: no signal (the
        // probes' turn), rather than a lower quantile of fewer.
        let mut s = Signal::new();
        for i in 0..80u64 {
            now += ms(200);
            s.record(ms(i), now, now);
        }
        assert_eq!(s.p99(now), None);
    }

    #[test]
    fn the_baseline_is_learned_only_while_the_heavy_lane_is_quiet() {
        let mut s = Signal::new();
        let t0 = Instant::now();
        let mut now = t0;
        for _ in 0..39 {
            now += ms(50);
            s.record(ms(20), now - ms(20), now);
        }
        assert_eq!(s.baseline(now), None, "39 quiet samples, not yet");
        let now = heartbeats(&mut s, now, 5, |_| 20);
        assert_eq!(s.baseline(now), Some(ms(20)));
        // Heavy traffic: slow heartbeats do not move the baseline.
        s.set_heavy_busy(true, now);
        let now = heartbeats(&mut s, now, 30, |_| 300);
        assert_eq!(s.baseline(now), Some(ms(20)));
        assert_eq!(s.p99(now).map(|p| p.0), Some(ms(300)));
        // Right after the heavy lane empties, samples still are not quiet.
        s.set_heavy_busy(false, now);
        let now = heartbeats(&mut s, now, 2, |_| 200);
        assert_eq!(s.view(now).quiet_samples, 139, "settling: none added");
        // A cluster that became slower moves the baseline within the horizon.
        let now = heartbeats(&mut s, now, 700, |_| 35);
        assert_eq!(s.baseline(now), Some(ms(35)));
        let v = s.view(now);
        // 139 + 14,000 quiet samples: the last complete run ended 19 ago.
        assert_eq!(
            (v.baseline_seconds, v.baseline_age_seconds),
            (Some(0.035), Some(0.95))
        );
    }

    #[test]
    fn a_slow_start_does_not_become_the_baseline() {
        let mut s = Signal::new();
        let t0 = Instant::now();
        // The apiserver still digests load sent before tollgate: 110 ms,
        // then it recovers to 10 ms; no heavy request through tollgate.
        let now = heartbeats(&mut s, t0, 10, |_| 110);
        assert_eq!(s.baseline(now), Some(ms(110)));
        let now = heartbeats(&mut s, now, 10, |i| 10 + i % 3);
        assert_eq!(s.baseline(now), Some(ms(12)), "the quietest run's p99");
    }

    #[test]
    fn a_run_counts_once_complete_and_until_a_sample_of_it_ages_out() {
        let mut s = Signal::new();
        let t0 = Instant::now();
        let now = heartbeats(&mut s, t0, 2, |_| 20);
        assert_eq!(s.baseline(now), Some(ms(20)));
        // 39 faster ones: their run is not complete yet.
        let (fast, mut now) = (ms(5), now);
        for _ in 0..39 {
            now += ms(50);
            s.record(fast, now - fast, now);
        }
        let v = s.view(now);
        assert_eq!((v.baseline_seconds, v.quiet_samples), (Some(0.02), 79));
        now += ms(50);
        s.record(fast, now - fast, now);
        assert_eq!(s.baseline(now), Some(fast), "the 80th sample completes it");
        let now = heartbeats(&mut s, now, 2, |_| 40);
        // The fast run counts while all of it is within the horizon…
        let fast_first = t0 + ms(2050);
        assert_eq!(s.baseline(fast_first + BASELINE_HORIZON), Some(fast));
        // …and not once its first sample left it.
        let later = fast_first + BASELINE_HORIZON + ms(1);
        assert_eq!(s.baseline(later), Some(ms(40)));
        assert_eq!(s.view(later).quiet_samples, 79);
        // Every run aged out: the last baseline is kept, its age grows.
        let much_later = now + BASELINE_HORIZON + ms(1);
        let v = s.view(much_later);
        assert_eq!((v.baseline_seconds, v.quiet_samples), (Some(0.04), 0));
        assert_eq!(
            v.baseline_age_seconds,
            Some((BASELINE_HORIZON + ms(1)).as_secs_f64())
        );
    }

    #[test]
    fn a_request_that_saw_a_heavy_one_is_not_quiet() {
        let mut s = Signal::new();
        let t0 = Instant::now();
        s.set_heavy_busy(true, t0 + ms(10));
        s.set_heavy_busy(false, t0 + ms(20));
        // Started before the heavy one, ended after it left.
        s.record(ms(100), t0, t0 + ms(100));
        assert_eq!(s.view(t0 + ms(100)).quiet_samples, 0);
        s.record(ms(10), t0 + ms(2020), t0 + ms(2030));
        assert_eq!(s.view(t0 + ms(2030)).quiet_samples, 1);
    }

    proptest! {
        /// The baseline is the lowest p99 of the complete runs of 40 quiet
        /// samples, counted from the first, that lie within the horizon
        /// and the newest MAX_SAMPLES: as if taken from scratch each time.
        #[test]
        fn the_baseline_is_the_lowest_complete_run(
            gaps in proptest::collection::vec((0u64..2_000, 0u64..500), 1..1_200),
            at in proptest::collection::vec(0usize..1_200, 1..8),
        ) {
            let mut s = Signal::new();
            let mut now = Instant::now();
            let mut all: Vec<(Instant, u64)> = Vec::new();
            let mut expected = None;
            for (i, (gap, lat)) in gaps.into_iter().enumerate() {
                now += ms(gap);
                s.record(ms(lat), now, now);
                all.push((now, lat));
                if !at.contains(&i) {
                    continue;
                }
                let oldest_kept = all
                    .iter()
                    .position(|(t, _)| now.saturating_duration_since(*t) <= BASELINE_HORIZON)
                    .unwrap_or(all.len())
                    .max(all.len().saturating_sub(MAX_SAMPLES));
                let lowest = all
                    .chunks_exact(MIN_SAMPLES)
                    .enumerate()
                    .filter(|(k, _)| k * MIN_SAMPLES >= oldest_kept)
                    .map(|(_, run)| {
                        let mut v: Vec<u64> = run.iter().map(|s| s.1).collect();
                        v.sort_unstable();
                        // Never the two largest: the third largest of 40.
                        v[MIN_SAMPLES - 3]
                    })
                    .min();
                if lowest.is_some() {
                    expected = lowest;
                }
                prop_assert_eq!(s.baseline(now), expected.map(ms));
            }
        }


        /// The p99 is one of the samples of the last MAX_WINDOW, at least
        /// as large as the window's median and never the lone maximum.
        #[test]
        fn the_p99_is_a_sample_of_the_window(
            gaps in proptest::collection::vec((0u64..400, 0u64..5_000), 1..600),
        ) {
            let mut s = Signal::new();
            let mut now = Instant::now();
            let mut all: Vec<(Instant, u64)> = Vec::new();
            for (gap, lat) in gaps {
                now += ms(gap);
                s.record(ms(lat), now, now);
                all.push((now, lat));
            }
            let recent: Vec<u64> = all
                .iter()
                .filter(|(t, _)| now.saturating_duration_since(*t) <= MAX_WINDOW)
                .map(|s| s.1)
                .collect();
            match s.p99(now) {
                None => prop_assert!(recent.len() < MIN_SAMPLES),
                Some((p, n, span)) => {
                    prop_assert!(n >= MIN_SAMPLES && span <= MAX_WINDOW);
                    let p = p.as_millis() as u64;
                    prop_assert!(recent.contains(&p));
                    let mut window: Vec<u64> = recent[recent.len() - n..].to_vec();
                    window.sort_unstable();
                    prop_assert!(p >= window[n / 2] && p <= window[n - 2]);
                }
            }
        }
    }
}
