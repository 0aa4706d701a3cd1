#![doc = include_str!("adaptive.md")]

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::signal::{Tail, BASELINE_HORIZON, MIN_WINDOW, TAIL_WINDOW};
use crate::config::settings::budget::Bounds;

/// Over this share of the target the p99 is congestion.
pub const SET_POINT: f64 = 0.7;
/// Under this share of the target the p99 is clear; between, the band.
pub const HEADROOM: f64 = 0.5;
/// Growth per clear epoch in startup.
pub const STARTUP_GAIN: f64 = 2.0;
/// Growth per clear epoch once an edge was found.
pub const PROBE_GAIN: f64 = 1.0625;
/// The deepest cut per epoch.
pub const MIN_CUT: f64 = 0.7;
/// The in-flight budget holds this many times what the rate keeps in flight.
pub const PACE_GAIN: f64 = 2.0;
/// While requests wait, one is admitted at least this often.
pub const MAX_SPACING: Duration = Duration::from_secs(30);
/// Completed heavy requests the service time is measured over.
const SERVICE_SAMPLES: usize = 32;

/// What the heavy lane and the signal did since the last step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The protected lanes' short-window p99; `None`: too few samples.
    pub p99: Option<Duration>,
    pub target: Duration,
    /// Predicted bytes in flight now.
    pub inflight_used: f64,
    /// Most bytes in flight since the last step.
    pub inflight_peak: f64,
    /// Heavy requests in flight now.
    pub inflight_count: usize,
    /// Bytes admitted since the last step.
    pub admitted: f64,
    /// The largest predicted cost that waited for the in-flight budget or
    /// the rate (0: nothing waited).
    pub waiting: f64,
    /// 429s and 5xx the apiserver answered since the last step.
    pub upstream_errors: u64,
    /// The protected requests of the last minute against the target
    /// (shown, not steered by).
    pub tail: Option<Tail>,
}

/// The controller's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    /// From a cold start: doubling per clear epoch until the first
    /// congestion or the band.
    Startup,
    /// After a cut: waiting for what was admitted before it to finish.
    Drain,
    /// Near the last edge: a sixteenth per clear epoch, hold in the band;
    /// not past the level growth last ran into for a tail window.
    Probe,
}

/// What an epoch's end decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    Increase,
    Decrease,
    Hold,
}

/// Why: a bounded set, the `reason` label of the decisions metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Reason {
    /// Too few protected requests to judge.
    NoSignal,
    /// Clear, and heavy requests waited: growth.
    Clear,
    /// Over the set point while heavy requests ran: a cut.
    Congested,
    /// The apiserver answered 429/5xx: the deepest cut.
    UpstreamErrors,
    /// Over the set point with nothing heavy running: not ours to fix.
    NotOurs,
    /// Between headroom and set point: hold.
    Band,
    /// Clear, but nothing waited: growth would only open the gate.
    Idle,
    /// After a cut, what was admitted before it is still in flight (or
    /// the epoch after it has not ended).
    Draining,
    /// Wanted to grow, at `maxBytesPerSecond`.
    Ceiling,
    /// Wanted to cut, at the floor.
    Floor,
    /// Wanted to grow past the level that last congested, less than a
    /// tail window after that cut.
    Edge,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NoSignal => "noSignal",
            Reason::Clear => "clear",
            Reason::Congested => "congested",
            Reason::UpstreamErrors => "upstreamErrors",
            Reason::NotOurs => "notOurs",
            Reason::Band => "band",
            Reason::Idle => "idle",
            Reason::Draining => "draining",
            Reason::Ceiling => "ceiling",
            Reason::Floor => "floor",
            Reason::Edge => "edge",
        }
    }

    /// Every reason, for the metric's labels and the docs' table.
    pub const ALL: [Reason; 11] = [
        Reason::NoSignal,
        Reason::Clear,
        Reason::Congested,
        Reason::UpstreamErrors,
        Reason::NotOurs,
        Reason::Band,
        Reason::Idle,
        Reason::Draining,
        Reason::Ceiling,
        Reason::Floor,
        Reason::Edge,
    ];
}

/// The last epoch's decision, as `/debug/budget` and the log show it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub action: Action,
    pub reason: Reason,
    pub state: State,
    /// What it measured: the short-window p99 and the target, seconds.
    pub p99_seconds: Option<f64>,
    pub target_seconds: f64,
    /// The rate before and after, bytes/s.
    pub rate_before: f64,
    pub rate_after: f64,
    /// Heavy requests admitted over the epoch, bytes/s.
    pub admitted_per_second: f64,
    /// The largest request that waited in the epoch, bytes (0: none).
    pub waiting_bytes: f64,
    pub epoch_seconds: f64,
}

/// The controller.
#[derive(Debug, Clone)]
pub struct Controller {
    bounds: Bounds,
    rate: f64,
    state: State,
    epoch_start: Instant,
    /// Bytes admitted in this epoch.
    admitted: f64,
    /// The largest cost that waited in this epoch (and the last step's,
    /// for the floor).
    waiting: f64,
    waiting_now: f64,
    /// Heavy requests ran in this epoch.
    busy: bool,
    upstream_errors: u64,
    /// After a cut: the bytes in flight fell within the budget.
    drained: bool,
    last_change: Instant,
    last_decrease: Option<Instant>,
    /// The last growth, while no cut has followed it.
    grown: Option<Instant>,
    /// The rate the last cut that followed growth was made from, and
    /// when: growth stops one probe step under it for [`TAIL_WINDOW`].
    edge: Option<(f64, Instant)>,
    /// `(bytes, seconds from admission to the whole response)`.
    services: VecDeque<(f64, f64)>,
    /// The shortest seconds per byte of any completion, and when it was
    /// seen: kept for [`BASELINE_HORIZON`], as the latency baseline is.
    fastest: Option<(f64, Instant)>,
    decision: Option<Decision>,
    increases: u64,
    decreases: u64,
}

/// The controller as `/debug/budget` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerView {
    pub state: State,
    /// The rate in force (the floor applied), bytes/s.
    pub bytes_per_second: f64,
    pub inflight_bytes: f64,
    /// The heavy requests' service time the in-flight budget is paced by.
    pub service_seconds: Option<f64>,
    /// Where startup ends: the largest waiting request always in flight,
    /// bytes/s (`None`: none waits, or none as large has completed).
    pub pipe_bytes_per_second: Option<f64>,
    pub epoch_seconds: f64,
    /// What bounds it now: `minBytesPerSecond` or the waiting request's
    /// cost per 30 s, whichever is larger; `maxBytesPerSecond`.
    pub floor_bytes_per_second: f64,
    pub ceiling_bytes_per_second: f64,
    pub last_decision: Option<Decision>,
    /// The last decision in words: what it measured, what it decided and
    /// why, what bounds it, which setting would change that.
    pub explanation: String,
    pub seconds_since_change: f64,
    pub seconds_since_decrease: Option<f64>,
    pub increases: u64,
    pub decreases: u64,
}

impl Controller {
    /// A cold start: the floor, in startup.
    pub fn new(bounds: Bounds, now: Instant) -> Controller {
        Controller {
            rate: bounds.min_rate,
            bounds,
            state: State::Startup,
            epoch_start: now,
            admitted: 0.0,
            waiting: 0.0,
            waiting_now: 0.0,
            busy: false,
            upstream_errors: 0,
            drained: true,
            last_change: now,
            last_decrease: None,
            grown: None,
            edge: None,
            services: VecDeque::new(),
            fastest: None,
            decision: None,
            increases: 0,
            decreases: 0,
        }
    }

    /// The floor: `minBytesPerSecond`, or the largest waiting request once
    /// per [`MAX_SPACING`].
    fn floor(&self) -> f64 {
        let b = &self.bounds;
        let spaced = self.waiting_now / MAX_SPACING.as_secs_f64();
        b.min_rate.max(spaced).min(b.max_rate.max(b.min_rate))
    }

    /// The pool's rate, bytes/s.
    pub fn rate(&self) -> f64 {
        self.rate.max(self.floor())
    }

    /// The in-flight budget, bytes: [`PACE_GAIN`] times what the rate keeps
    /// in flight once the service time is known; before, the minimum (one
    /// request at a time: a larger one runs alone).
    pub fn inflight(&self) -> f64 {
        let b = &self.bounds;
        let paced = self
            .unloaded_service_seconds()
            .map_or(b.min_inflight, |d| PACE_GAIN * self.rate() * d);
        paced.clamp(b.min_inflight, b.max_inflight.max(b.min_inflight))
    }

    /// The rate at which one heavy request of `size` bytes is always in
    /// flight, bytes/s: the apiserver's unloaded seconds per byte for
    /// requests of that order of size (at least half of it), inverted
    /// (Little's law: in flight = rate × seconds per byte). `None`: none
    /// that large has completed — a small request's fixed costs (a round
    /// trip, authentication, an etcd range's setup) per byte would put it
    /// far too low (the mix's namespace LISTs of a few kB put it at 8 MB/s
    /// where LISTs of all pods run back to back at 300). Half, not all of
    /// it: a pattern's prediction moves by a few percent as it is learned,
    /// and its own completions must count.
    pub fn pipe_rate(&self, size: f64) -> Option<f64> {
        let per_byte = self.shortest_per_byte(size / 2.0);
        (per_byte.is_finite() && per_byte > 0.0).then(|| 1.0 / per_byte)
    }

    /// The shortest seconds per byte of the last completions of at least
    /// `size` bytes (infinite: none).
    fn shortest_per_byte(&self, size: f64) -> f64 {
        self.services
            .iter()
            .filter(|&&(b, _)| b >= size)
            .map(|&(b, took)| took / b)
            .fold(f64::INFINITY, f64::min)
    }

    /// The last completions' byte-weighted mean size, bytes (`None`: none).
    fn mean_size(&self) -> Option<f64> {
        let (bytes, squares) = self
            .services
            .iter()
            .fold((0.0, 0.0), |(bytes, squares), &(b, _)| {
                (bytes + b, squares + b * b)
            });
        (bytes > 0.0).then(|| squares / bytes)
    }

    /// The heavy requests' service time, seconds, as the apiserver serves
    /// them unloaded: the shortest time per byte of the last completions,
    /// at their byte-weighted mean size. `None`: none completed yet.
    pub fn service_seconds(&self) -> Option<f64> {
        Some(self.mean_size()? * self.shortest_per_byte(0.0))
    }

    /// The service time the in-flight budget is paced by: as
    /// [`Self::service_seconds`], at the shortest time per byte of the last
    /// [`BASELINE_HORIZON`] if that is shorter. The last 32 completions
    /// alone are all slowed once the apiserver is loaded, and a longer
    /// service time widens the in-flight budget, which lets more in and
    /// slows them further: on kube-apiserver 1.37.2 (LISTs from the watch
    /// cache, priced 26 MB each) it grew from 0.28 to 6.9 s and let 32
    /// LISTs run at once. BBR keeps its minimum round trip for 10 s and
    /// then drains to measure it again; here the apiserver at rest is
    /// remembered as long as the latency baseline is.
    pub fn unloaded_service_seconds(&self) -> Option<f64> {
        let fastest = self.fastest.map_or(f64::INFINITY, |(f, _)| f);
        Some(self.mean_size()? * self.shortest_per_byte(0.0).min(fastest))
    }

    /// The epoch: a request admitted at its start finishes, and the
    /// signal's window sees it.
    pub fn epoch(&self) -> Duration {
        MIN_WINDOW + Duration::from_secs_f64(self.service_seconds().unwrap_or(0.0).min(60.0))
    }

    /// A heavy request of predicted cost `bytes` was served whole in
    /// `took`, from admission, ending at `now`.
    pub fn note_service(&mut self, bytes: f64, took: Duration, now: Instant) {
        if !(bytes.is_finite() && bytes > 0.0) {
            return;
        }
        let per_byte = took.as_secs_f64() / bytes;
        let fresh = self.fastest.filter(|&(f, at)| {
            f <= per_byte && now.saturating_duration_since(at) <= BASELINE_HORIZON
        });
        self.fastest = fresh.or(Some((per_byte, now)));
        if self.services.len() == SERVICE_SAMPLES {
            self.services.pop_front();
        }
        self.services.push_back((bytes, took.as_secs_f64()));
    }

    /// Kept for the budget's interface: completions are seen through the
    /// service time and the epoch.
    pub fn note_completion(&mut self, _admitted_at: Instant) {}

    pub fn state(&self) -> State {
        self.state
    }

    pub fn last_decision(&self) -> Option<Decision> {
        self.decision
    }

    /// New bounds (a reload, cluster-size scaling): the rate is clamped.
    pub fn set_bounds(&mut self, bounds: Bounds) {
        self.bounds = bounds;
        self.rate = self
            .rate
            .clamp(bounds.min_rate, bounds.max_rate.max(bounds.min_rate));
    }

    /// One step at `now` (every `intervalSeconds`): what happened is
    /// summed over the epoch; at its end, one decision.
    pub fn step(&mut self, o: &Observation, now: Instant) -> Option<Decision> {
        self.admitted += o.admitted.max(0.0);
        self.waiting = self.waiting.max(o.waiting);
        self.waiting_now = o.waiting;
        self.busy |= o.inflight_count > 0 || o.inflight_peak > 0.0 || o.admitted > 0.0;
        self.upstream_errors += o.upstream_errors;
        if o.inflight_used <= self.inflight() {
            self.drained = true;
        }
        let elapsed = now.saturating_duration_since(self.epoch_start);
        if elapsed < self.epoch() {
            return None;
        }
        let before = self.rate();
        let (action, reason) = self.decide(o, now);
        let d = Decision {
            action,
            reason,
            state: self.state,
            p99_seconds: o.p99.map(|p| p.as_secs_f64()),
            target_seconds: o.target.as_secs_f64(),
            rate_before: before,
            rate_after: self.rate(),
            admitted_per_second: self.admitted / elapsed.as_secs_f64().max(1e-9),
            waiting_bytes: self.waiting,
            epoch_seconds: elapsed.as_secs_f64(),
        };
        if action != Action::Hold {
            self.last_change = now;
        }
        if action == Action::Decrease {
            self.last_decrease = Some(now);
        }
        self.epoch_start = now;
        self.admitted = 0.0;
        self.waiting = 0.0;
        self.busy = o.inflight_count > 0;
        self.upstream_errors = 0;
        self.decision = Some(d);
        Some(d)
    }

    fn decide(&mut self, o: &Observation, now: Instant) -> (Action, Reason) {
        // The epoch after a cut is not judged: its signal still shows what
        // was admitted before the cut. Probe starts once it has drained.
        if self.state == State::Drain {
            if self.drained {
                self.state = State::Probe;
            }
            return (Action::Hold, Reason::Draining);
        }
        let target = o.target.as_secs_f64().max(1e-9);
        let errors = self.upstream_errors > 0;
        let ratio = match (o.p99, errors) {
            (_, true) => f64::INFINITY,
            (Some(p), false) => p.as_secs_f64() / (SET_POINT * target),
            (None, false) => return (Action::Hold, Reason::NoSignal),
        };
        if ratio > 1.0 {
            if !self.busy {
                return (Action::Hold, Reason::NotOurs);
            }
            let reason = if errors {
                Reason::UpstreamErrors
            } else {
                Reason::Congested
            };
            let floor = self.floor();
            if self.rate <= floor * 1.000_001 {
                self.rate = floor;
                return (Action::Hold, Reason::Floor);
            }
            let cut = ((HEADROOM / SET_POINT) / ratio).max(MIN_CUT);
            let from = self.rate.min(self.rate());
            // An edge is what growth ran into. A cut while holding is the
            // apiserver's capacity moving (another load, a drop): its
            // level says nothing about where growth should stop once the
            // capacity is back.
            if self
                .grown
                .is_some_and(|at| now.saturating_duration_since(at) < TAIL_WINDOW)
            {
                self.edge = Some((from, now));
            }
            self.grown = None;
            self.rate = (from * cut).max(floor);
            self.state = State::Drain;
            self.drained = o.inflight_used <= self.inflight();
            self.decreases += 1;
            return (Action::Decrease, reason);
        }
        if ratio * SET_POINT > HEADROOM {
            if self.state == State::Startup && self.busy {
                self.state = State::Probe;
            }
            return (Action::Hold, Reason::Band);
        }
        if self.waiting <= 0.0 {
            return (Action::Hold, Reason::Idle);
        }
        let hi = self.bounds.max_rate.max(self.bounds.min_rate);
        if self.rate() >= hi {
            return (Action::Hold, Reason::Ceiling);
        }
        // Startup ends where one heavy request is always in flight: up to
        // there each runs alone and doubling is safe; past it they share
        // the apiserver, and what that costs the protected lanes is found
        // a probe step at a time (HyStart++ leaves slow start on the
        // delay's rise, before the loss; here the rise is predictable).
        let pipe = self.pipe_rate(self.waiting).unwrap_or(f64::INFINITY);
        if self.state == State::Startup && self.rate() >= pipe * 0.999_999 {
            self.state = State::Probe;
        }
        let mut next = match self.state {
            State::Startup => {
                // The step shrinks as the heartbeats near the band (the
                // gradient of Envoy's controller): on an apiserver whose
                // delay rises before its edge, the epoch that enters the
                // band comes from a small step, not a doubling.
                let clear = (1.0 - ratio * SET_POINT / HEADROOM).clamp(0.0, 1.0);
                let step = self.rate() * (1.0 + (STARTUP_GAIN - 1.0) * clear);
                // Once the pipe is known the climb keeps only its last two
                // doublings: the signal sees one request in flight a
                // quarter and half of the time before they run back to
                // back. Below a quarter each runs alone with idle time
                // after it, and the doublings from the floor only spent
                // epochs (on kube-apiserver 1.37.2, 20 of a fresh run's
                // first 30 s).
                let from = if pipe.is_finite() {
                    pipe / (STARTUP_GAIN * STARTUP_GAIN)
                } else {
                    0.0
                };
                step.max(from).min(pipe)
            }
            _ => self.rate() * PROBE_GAIN,
        }
        .min(hi);
        if let Some(edge) = self.edge_in_force(now) {
            let under = edge / PROBE_GAIN;
            if self.rate() >= under * 0.999_999 {
                return (Action::Hold, Reason::Edge);
            }
            next = next.min(under);
        }
        self.rate = next;
        self.grown = Some(now);
        self.increases += 1;
        (Action::Increase, Reason::Clear)
    }

    /// The level growth last ran into, while it is remembered: for one
    /// [`TAIL_WINDOW`] after the cut it caused.
    fn edge_in_force(&self, now: Instant) -> Option<f64> {
        let (edge, at) = self.edge?;
        (now.saturating_duration_since(at) < TAIL_WINDOW).then_some(edge)
    }

    /// The last decision in words.
    pub fn explain(&self) -> String {
        let Some(d) = self.decision else {
            return format!(
                "cold start: no epoch has ended yet; rate {} (minBytesPerSecond), one heavy request at a time until one completes",
                mbps(self.rate())
            );
        };
        let measured = match d.p99_seconds {
            Some(p) => format!(
                "protected p99 {:.1} ms against a target of {:.1} ms (congestion over {:.1} ms, clear under {:.1} ms)",
                p * 1e3,
                d.target_seconds * 1e3,
                SET_POINT * d.target_seconds * 1e3,
                HEADROOM * d.target_seconds * 1e3
            ),
            None => "too few protected requests for a p99".to_string(),
        };
        let why = match d.reason {
            Reason::NoSignal => "held: nothing to judge by (send heartbeats through tollgate, or set quota.adaptive.target)",
            Reason::Clear => "grew: the heartbeats are clear and heavy requests waited",
            Reason::Congested => "cut: the heartbeats are over the set point while heavy requests ran",
            Reason::UpstreamErrors => "cut as deep as a cut goes: the apiserver answered 429/5xx",
            Reason::NotOurs => "held: the heartbeats are slow but nothing heavy ran",
            Reason::Band => "held: the heartbeats feel the heavy lane (between clear and congestion)",
            Reason::Idle => "held: clear, but no heavy request waited",
            Reason::Draining => "held: requests admitted before the last cut are still in flight",
            Reason::Ceiling => "held at the ceiling (quota.adaptive.maxBytesPerSecond or quota.bytesPerSecond raises it)",
            Reason::Edge => "held one probe step under the level that last congested, for a minute after that cut (a crossing costs seconds of slow heartbeats: at most one a minute)",
            Reason::Floor => "held at the floor (quota.adaptive.minBytesPerSecond; a waiting request is admitted at least every 30 s; quota.adaptive.target or floor loosens the target)",
        };
        format!(
            "{measured}; {why}; state {:?}; rate {} -> {} (floor {}, ceiling {}); admitted {} over a {:.1} s epoch",
            d.state,
            mbps(d.rate_before),
            mbps(d.rate_after),
            mbps(self.floor()),
            mbps(self.bounds.max_rate),
            mbps(d.admitted_per_second),
            d.epoch_seconds
        )
    }

    /// The size the view's pipe is for: the heavy request waiting now,
    /// else the largest that waited this epoch, else the last decision's.
    /// With none of them it would be the pipe of every size, which small
    /// requests' quick completions put far above the large ones' (a trace
    /// of 25 MB LISTs read 200-500 MB/s where their own was ~60).
    fn pipe_size(&self) -> f64 {
        [
            self.waiting_now,
            self.waiting,
            self.decision.map_or(0.0, |d| d.waiting_bytes),
        ]
        .into_iter()
        .find(|&w| w > 0.0)
        .unwrap_or(0.0)
    }

    pub fn view(&self, now: Instant) -> ControllerView {
        ControllerView {
            state: self.state,
            bytes_per_second: self.rate(),
            inflight_bytes: self.inflight(),
            service_seconds: self.unloaded_service_seconds(),
            pipe_bytes_per_second: self.pipe_rate(self.pipe_size()),
            epoch_seconds: self.epoch().as_secs_f64(),
            floor_bytes_per_second: self.floor(),
            ceiling_bytes_per_second: self.bounds.max_rate,
            last_decision: self.decision,
            explanation: self.explain(),
            seconds_since_change: now
                .saturating_duration_since(self.last_change)
                .as_secs_f64(),
            seconds_since_decrease: self
                .last_decrease
                .map(|d| now.saturating_duration_since(d).as_secs_f64()),
            increases: self.increases,
            decreases: self.decreases,
        }
    }
}

fn mbps(b: f64) -> String {
    format!("{:.1} MB/s", b / 1e6)
}

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
