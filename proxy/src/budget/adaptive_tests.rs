use super::*;
use proptest::prelude::*;

#[path = "adaptive_tail_tests.rs"]
mod tail_rules;

const MB: f64 = 1_000_000.0;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn bounds() -> Bounds {
    Bounds {
        min_rate: 1.0 * MB,
        max_rate: 100.0 * MB,
        min_inflight: 8.0 * MB,
        max_inflight: 400.0 * MB,
    }
}

/// A step's observation: p99 in ms against a 50 ms target; `waited`: a
/// request of one byte waited (under any level: no slow-start jump).
fn obs(p99_ms: Option<u64>, used: f64, count: usize, waited: bool) -> Observation {
    Observation {
        p99: p99_ms.map(ms),
        target: ms(50),
        inflight_used: used,
        inflight_peak: used,
        inflight_count: count,
        admitted: 0.0,
        waiting: if waited { 1.0 } else { 0.0 },
        upstream_errors: 0,
        tail: None,
    }
}

/// A healthy step with a request of `bytes` waiting, nothing in flight.
fn waiting(bytes: f64) -> Observation {
    waiting_at(bytes, 10)
}

/// The same at a p99 of `p99_ms`.
fn waiting_at(bytes: f64, p99_ms: u64) -> Observation {
    Observation {
        waiting: bytes,
        ..obs(Some(p99_ms), 0.0, 0, false)
    }
}

/// A minute's tail: `slow` of 1,200 protected requests over the target.
fn tail(slow: usize) -> Option<Tail> {
    Some(Tail {
        samples: 1200,
        slow,
        span: Duration::from_secs(60),
        // None recent: the burn is the minute's share.
        recent_samples: 0,
        recent_slow: 0,
        recent_span: Duration::ZERO,
    })
}

#[test]
fn a_cold_start_grows_then_a_violation_cuts_and_holds_until_drained() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    // Level 4 MB: the in-flight budget at its 8 MB minimum (a 33 MB LIST
    // runs alone), the rate at its 1 MB/s minimum.
    assert_eq!(
        (c.level(), c.inflight(), c.rate()),
        (4.0 * MB, 8.0 * MB, 1.0 * MB)
    );
    let one_list = obs(Some(10), 33.0 * MB, 1, true);
    assert_eq!(c.step(&one_list, t0 + ms(500)), Action::HoldEvidence);
    assert_eq!(
        c.step(&one_list, t0 + ms(4000)),
        Action::HoldEvidence,
        "watched 4 s, but the LIST admitted before has not ended"
    );
    c.note_completion(t0 - ms(100));
    assert_eq!(
        c.step(&one_list, t0 + ms(4500)),
        Action::HoldEvidence,
        "admitted before the change"
    );
    c.note_completion(t0 + ms(100));
    assert_eq!(c.step(&one_list, t0 + ms(5000)), Action::Increase);
    let mut level = 4.0 * MB * SLOW_START_GROWTH;
    assert_eq!((c.level(), c.rate()), (level, level / 4.0));
    assert_eq!(
        c.step(&obs(Some(10), 0.0, 0, true), t0 + ms(9000)),
        Action::HoldEvidence,
        "nothing admitted under the new level has ended: nothing has shown"
    );
    c.note_completion(t0 + ms(5500));
    assert_eq!(
        c.step(&obs(Some(10), 0.0, 0, true), t0 + ms(9200)),
        Action::Increase
    );
    c.note_completion(t0 + ms(9300));
    assert_eq!(
        c.step(&obs(Some(10), 0.0, 0, true), t0 + ms(13_400)),
        Action::Increase
    );
    level *= SLOW_START_GROWTH * SLOW_START_GROWTH;
    assert!((c.level() - level).abs() < 1.0);
    assert_eq!(c.inflight(), c.level(), "over the 8 MB minimum now");
    // 100 ms against a 35 ms set point: cut by half (the most), from the
    // level since the peak (33 MB) is above it.
    let over = obs(Some(100), 33.0 * MB, 1, true);
    assert_eq!(c.step(&over, t0 + ms(13_500)), Action::Decrease);
    level *= 0.5;
    assert!((c.level() - level).abs() < 1.0);
    assert_eq!(c.phase(), Phase::Steady);
    // Still 33 MB in flight: the cut has not taken effect.
    assert_eq!(c.step(&over, t0 + ms(14_000)), Action::HoldDraining);
    assert_eq!(
        c.step(&obs(Some(100), 0.0, 0, true), t0 + ms(15_000)),
        Action::HoldDraining,
        "drained just now"
    );
    assert_eq!(
        c.step(&obs(Some(50), 0.0, 0, true), t0 + ms(17_000)),
        Action::Decrease,
        "a window after draining"
    );
    // 50 ms against the 35 ms set point (0.7 of 50): cut to 0.7 of the
    // level, held at the 4 MB least level.
    level = (level * 0.7).max(4.0 * MB);
    assert!((c.level() - level).abs() < 1.0);
    // Healthy again: evidence for one turnover, then ×1.125 (out of slow start).
    let ok = obs(Some(20), 0.0, 0, true);
    assert_eq!(c.step(&ok, t0 + ms(18_000)), Action::HoldEvidence);
    c.note_completion(t0 + ms(17_500));
    assert_eq!(c.step(&ok, t0 + ms(19_000)), Action::HoldEvidence);
    assert_eq!(
        c.step(&ok, t0 + ms(21_000)),
        Action::HoldEvidence,
        "near the last cut's edge: two turnovers"
    );
    assert_eq!(c.step(&ok, t0 + ms(25_000)), Action::Increase);
    assert!((c.level() - level * GROWTH).abs() < 1.0);
    assert_eq!(c.view(t0 + ms(25_000)).decreases, 2);
}

#[test]
fn holds_in_the_band_when_idle_and_without_a_signal() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let l = c.level();
    assert_eq!(
        c.step(&obs(Some(10), 0.0, 0, false), t0 + ms(3000)),
        Action::HoldIdle,
        "nothing waited, nothing to grow for"
    );
    assert_eq!(
        c.step(&obs(Some(500), 0.0, 0, false), t0 + ms(3500)),
        Action::HoldIdle,
        "slow, but nothing heavy ran"
    );
    assert_eq!(
        c.step(&obs(Some(33), 0.0, 0, true), t0 + ms(6000)),
        Action::HoldBand,
        "between half the target and the set point"
    );
    assert_eq!(
        c.step(&obs(Some(10), 0.0, 0, true), t0 + ms(7000)),
        Action::HoldEvidence,
        "the band restarted the evidence"
    );
    assert_eq!(
        c.step(&obs(None, 0.0, 0, true), t0 + ms(9000)),
        Action::HoldNoSignal
    );
    assert_eq!(c.level(), l);
    c.note_completion(t0 + ms(100));
    assert_eq!(
        c.step(&obs(Some(10), 0.0, 0, true), t0 + ms(13_000)),
        Action::Increase
    );
}

#[test]
fn a_level_grown_for_old_demand_is_cut_to_what_is_used() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let mut now = t0;
    while c.level() < 400.0 * MB {
        now += ms(2000);
        c.note_completion(now - ms(100));
        c.step(&obs(Some(10), 0.0, 0, true), now);
    }
    // 20 MB admitted over a step (2 MB/s over 10 s → an 8 MB level), 12 MB
    // peak in flight; 200 ms: cut by half from 12 MB.
    now += ms(500);
    let o = Observation {
        admitted: 20.0 * MB,
        ..obs(Some(200), 12.0 * MB, 3, false)
    };
    assert_eq!(c.step(&o, now), Action::Decrease);
    assert_eq!(c.level(), 6.0 * MB);
    assert_eq!(c.inflight(), 8.0 * MB);
}

#[test]
fn apiserver_errors_count_as_a_violation() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let level = three_increases(&mut c, t0);
    assert!((level - 4.0 * MB * SLOW_START_GROWTH.powi(3)).abs() < 1.0);
    let o = Observation {
        upstream_errors: 3,
        ..obs(Some(10), level, 1, true)
    };
    assert_eq!(c.step(&o, t0 + ms(12_500)), Action::Decrease);
    assert!((c.level() - level / 1.5).abs() < 1.0);
}

fn arb_bounds() -> impl Strategy<Value = Bounds> {
    (1e3f64..1e8, 1.0f64..1000.0, 1e4f64..1e9, 1.0f64..1000.0).prop_map(
        |(min_rate, rate_span, min_inflight, inflight_span)| Bounds {
            min_rate,
            max_rate: min_rate * rate_span,
            min_inflight,
            max_inflight: min_inflight * inflight_span,
        },
    )
}

fn within(c: &Controller, b: &Bounds) -> Result<(), TestCaseError> {
    let eps = 1e-9;
    prop_assert!(c.rate() >= b.min_rate * (1.0 - eps) && c.rate() <= b.max_rate * (1.0 + eps));
    prop_assert!(
        c.inflight() >= b.min_inflight * (1.0 - eps)
            && c.inflight() <= b.max_inflight * (1.0 + eps)
    );
    let (lo, hi) = c.range();
    prop_assert!(c.level() >= lo * (1.0 - eps) && c.level() <= hi * (1.0 + eps));
    Ok(())
}

proptest! {
    /// Whatever is observed, and whatever bounds a reload brings, the
    /// level and both outputs stay within their bounds.
    #[test]
    fn stays_within_bounds(
        b in arb_bounds(),
        b2 in arb_bounds(),
        steps in proptest::collection::vec(
            (0u64..3000, proptest::option::of(0u64..500), 0.0f64..1e9, 0usize..5, 0.0f64..2e9, 0u64..3, 0u8..20, 0usize..40),
            1..300,
        ),
    ) {
        let t0 = Instant::now();
        let mut c = Controller::new(b, t0);
        let mut bounds = b;
        let mut now = t0;
        within(&c, &bounds)?;
        for (gap, p99, used, count, waiting, errors, extra, slow) in steps {
            now += ms(gap);
            if extra == 0 {
                bounds = b2;
                c.set_bounds(bounds);
            } else if extra < 5 {
                c.note_completion(now - ms(gap / 2));
            } else if extra < 8 {
                c.note_service(used, ms(gap));
            }
            let o = Observation {
                upstream_errors: errors.saturating_sub(1),
                admitted: used / 4.0,
                waiting,
                tail: tail(slow),
                ..obs(p99, used, count, false)
            };
            c.step(&o, now);
            within(&c, &bounds)?;
        }
    }

    /// A sustained violation while heavy requests fill the budget drives
    /// the level down, never up, to its minimum; then healthy demand
    /// brings it back up, never down, to its maximum.
    #[test]
    fn decreases_under_violation_and_recovers_after(
        b in arb_bounds(),
        over in 1.01f64..6.0,
        warm in 0usize..60,
    ) {
        let t0 = Instant::now();
        let mut c = Controller::new(b, t0);
        let (lo, hi) = c.range();
        let mut now = t0;
        // Some healthy growth first.
        for _ in 0..warm {
            now += ms(500);
            c.step(&obs(Some(10), 0.0, 0, true), now);
        }
        // Overloaded: p99 `over` times the target, the budget full of
        // requests that end within a step (the sim's requests end when the
        // next step sees the new budget).
        let target = ms(50);
        let mut prev = c.level();
        let mut reached = false;
        for _ in 0..600 {
            now += ms(500);
            let o = Observation {
                p99: Some(target.mul_f64(over)),
                ..obs(None, c.inflight(), 2, true)
            };
            c.step(&o, now);
            prop_assert!(c.level() <= prev, "rose under violation");
            prev = c.level();
            if c.level() <= lo * (1.0 + 1e-9) {
                reached = true;
                break;
            }
        }
        prop_assert!(reached, "level {} never reached {lo}", c.level());
        let mut reached = false;
        for _ in 0..2000 {
            now += ms(500);
            c.note_completion(now - ms(100));
            c.step(&obs(Some(10), c.inflight(), 2, true), now);
            prop_assert!(c.level() >= prev, "fell while healthy");
            prev = c.level();
            if c.level() >= hi * (1.0 - 1e-9) {
                reached = true;
                break;
            }
        }
        prop_assert!(reached, "level {} never came back to {hi}", c.level());
    }
}

#[test]
fn slow_start_begins_at_one_waiting_request_and_grows_only_on_evidence() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    // A 33 MB LIST waits behind a 4 MB level: a level under it only slows
    // it, so the level goes to one LIST at once.
    let waiting = waiting(33.0 * MB);
    assert_eq!(c.step(&waiting, t0 + ms(500)), Action::Increase);
    assert_eq!((c.level(), c.inflight()), (33.0 * MB, 33.0 * MB));
    // Nothing admitted under it has ended: no doubling, however long the
    // lane stays idle and healthy (up to MAX_HOLD).
    for s in 1..20 {
        assert_eq!(
            c.step(&waiting, t0 + ms(500 + s * 1000)),
            Action::HoldEvidence
        );
    }
    c.note_completion(t0 + ms(600));
    assert_eq!(c.step(&waiting, t0 + ms(21_000)), Action::Increase);
    let grown = 33.0 * MB * SLOW_START_GROWTH;
    assert_eq!(c.level(), grown);
    // After a decrease growth is proportional (in recovery, the slow-start
    // step up to 0.8 of the level at the cut)…
    let over = Observation {
        waiting: 40.0 * MB,
        ..obs(Some(100), 66.0 * MB, 2, false)
    };
    assert_eq!(c.step(&over, t0 + ms(21_500)), Action::Decrease);
    assert_eq!(c.level(), grown / 2.0);
    assert_eq!(c.phase(), Phase::Steady, "cut above one request");
    let small = Observation {
        waiting: 20.0 * MB,
        ..obs(Some(10), 0.0, 0, false)
    };
    c.note_completion(t0 + ms(22_000));
    assert_eq!(c.step(&small, t0 + ms(24_000)), Action::HoldEvidence);
    assert_eq!(c.step(&small, t0 + ms(25_500)), Action::Increase);
    assert!((c.level() - grown / 2.0 * SLOW_START_GROWTH).abs() < 1.0);
    // …but never under one waiting request (it would run alone anyway).
    let big = Observation {
        waiting: 200.0 * MB,
        ..obs(Some(10), 0.0, 0, false)
    };
    c.note_completion(t0 + ms(26_000));
    assert_eq!(c.step(&big, t0 + ms(29_500)), Action::Increase);
    assert_eq!(c.level(), 200.0 * MB);
}

#[test]
fn a_first_cut_at_one_request_keeps_slow_start_and_the_way_back_needs_evidence() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let waiting = |p99, used| Observation {
        waiting: 76.0 * MB,
        ..obs(Some(p99), used, 1, false)
    };
    assert_eq!(c.step(&waiting(10, 0.0), t0 + ms(500)), Action::Increase);
    assert_eq!(c.level(), 76.0 * MB);
    // The first LIST from a cold etcd pauses the apiserver: a cut, but it
    // says nothing of the budget's edge.
    assert_eq!(
        c.step(&waiting(100, 76.0 * MB), t0 + ms(1000)),
        Action::Decrease
    );
    assert_eq!(c.level(), 38.0 * MB);
    assert_eq!(c.phase(), Phase::SlowStart);
    // Healthy again: back to one request at a time, but on evidence as
    // any increase after a cut (a request completed, 4 s healthy).
    assert_eq!(
        c.step(&waiting(10, 0.0), t0 + ms(4000)),
        Action::HoldEvidence
    );
    c.note_completion(t0 + ms(4200));
    assert_eq!(c.step(&waiting(10, 0.0), t0 + ms(5000)), Action::Increase);
    assert_eq!(c.level(), 76.0 * MB);
    c.note_completion(t0 + ms(5500));
    assert_eq!(c.step(&waiting(10, 0.0), t0 + ms(9000)), Action::Increase);
    assert_eq!(c.level(), 76.0 * MB * SLOW_START_GROWTH);
    // A cut above one request ends slow start…
    assert_eq!(
        c.step(&waiting(200, 90.0 * MB), t0 + ms(9500)),
        Action::Decrease
    );
    assert_eq!(c.phase(), Phase::Steady);
    assert_eq!(c.level(), 45.0 * MB);
    // …and from then on the step back to one request needs evidence.
    assert_eq!(
        c.step(&waiting(10, 0.0), t0 + ms(11_000)),
        Action::HoldEvidence,
        "no request admitted since the cut has ended"
    );
    c.note_completion(t0 + ms(9500));
    assert_eq!(c.step(&waiting(33, 0.0), t0 + ms(11_500)), Action::HoldBand);
    assert_eq!(
        c.step(&waiting(10, 0.0), t0 + ms(12_500)),
        Action::HoldEvidence,
        "the band restarted the evidence"
    );
    assert_eq!(c.step(&waiting(10, 0.0), t0 + ms(15_500)), Action::Increase);
    assert_eq!(c.level(), 76.0 * MB, "one request at a time again");
}

/// Three slow-start increases, each on evidence, by `t0` + 12 s: the level.
fn three_increases(c: &mut Controller, t0: Instant) -> f64 {
    for s in 1..=3 {
        c.note_completion(t0 + ms(s * 4000 - 3900));
        assert_eq!(
            c.step(&obs(Some(10), 0.0, 0, true), t0 + ms(s * 4000)),
            Action::Increase
        );
    }
    c.level()
}

/// Three slow-start increases, then at `t0` + 12.5 s `o` with the grown
/// level: that level, and the step's action.
fn grown_then(c: &mut Controller, t0: Instant, o: impl Fn(f64) -> Observation) -> (f64, Action) {
    let grown = three_increases(c, t0);
    let action = c.step(&o(grown), t0 + ms(12_500));
    (grown, action)
}

/// An overload with the whole level in use (cuts by half).
fn overload(level: f64) -> Observation {
    Observation {
        tail: tail(13),
        ..obs(Some(200), level, 3, true)
    }
}

/// A spike over the set point within the target, a quiet tail.
fn spike_within_target(level: f64) -> Observation {
    Observation {
        tail: tail(1),
        ..obs(Some(40), level / 4.0, 1, true)
    }
}

/// `n` increases on healthy evidence from `t`, one evidence period near an
/// edge apart (enough anywhere): the level after each, and the time after
/// the last.
fn healthy_increases(c: &mut Controller, mut t: Instant, n: usize) -> (Vec<f64>, Instant) {
    let healthy = obs(Some(10), 0.0, 0, true);
    let mut levels = vec![];
    for _ in 0..n {
        c.note_completion(t - ms(100));
        assert_eq!(c.step(&healthy, t), Action::Increase);
        levels.push(c.level());
        t += EDGE_EVIDENCE;
    }
    (levels, t)
}

#[test]
fn after_a_cut_the_level_regains_most_of_what_was_in_use_in_slow_start_steps() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    // An overload with the whole level in use: cut by half, out of slow start.
    let (grown, action) = grown_then(&mut c, t0, overload);
    assert_eq!(action, Action::Decrease);
    assert_eq!(c.phase(), Phase::Steady);
    let cut = c.level();
    assert!((cut - grown / 2.0).abs() < 1.0);
    // Healthy again once drained, with LISTs waiting: ×1.3 up to 0.8 of
    // the level in use at the cut, each step on evidence…
    let (levels, _) = healthy_increases(&mut c, t0 + ms(12_500) + MAX_HOLD, 4);
    assert!((levels[0] - cut * SLOW_START_GROWTH).abs() < 1.0);
    assert!(
        (levels[1] - grown * RECOVERY).abs() < 1.0,
        "the second step stops at 0.8 of what was in use: {} vs {}",
        levels[1],
        grown * RECOVERY
    );
    // …then the ×1.125 probe.
    assert!((levels[2] - levels[1] * GROWTH).abs() < 1.0);
    assert!((levels[3] - levels[2] * GROWTH).abs() < 1.0);
}

#[test]
fn a_spike_right_after_a_recovery_step_undoes_it() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let (_, action) = grown_then(&mut c, t0, overload);
    assert_eq!(action, Action::Decrease);
    let cut = c.level();
    let (_, t) = healthy_increases(&mut c, t0 + ms(12_500) + MAX_HOLD, 1);
    let spike = Observation {
        tail: tail(3),
        ..obs(Some(170), c.level(), 2, true)
    };
    assert_eq!(
        c.step(&spike, t - EDGE_EVIDENCE + ms(500)),
        Action::Decrease
    );
    assert!((c.level() - cut).abs() < 1.0, "back to the level cut to");
}

/// Three slow-start increases, a spike within the target right after the
/// last (undone with the one before it, as they came back to back: slow
/// start goes on), the same two steps again and a spike again (undone at
/// the same edge: out of slow start). The level grown to before the first
/// undo, and the time after.
fn undone_twice(c: &mut Controller, t0: Instant) -> (f64, Instant) {
    let two_back = |grown: f64| grown / SLOW_START_GROWTH / SLOW_START_GROWTH;
    let (grown, action) = grown_then(c, t0, spike_within_target);
    assert_eq!(action, Action::Decrease);
    assert!(
        (c.level() - two_back(grown)).abs() < 1.0,
        "{} vs {}",
        c.level(),
        two_back(grown)
    );
    assert_eq!(c.phase(), Phase::SlowStart, "a first step undone");
    let (levels, _) = healthy_increases(c, t0 + ms(12_500) + MAX_HOLD, 2);
    assert!((levels[1] - grown).abs() < 1.0, "the same steps again");
    let t = t0 + ms(12_500) + MAX_HOLD + 2 * EDGE_EVIDENCE;
    assert_eq!(c.step(&spike_within_target(grown), t), Action::Decrease);
    assert!((c.level() - two_back(grown)).abs() < 1.0);
    (grown, t)
}

#[test]
fn a_spike_within_the_target_right_after_a_step_undoes_the_step() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let (grown, t) = undone_twice(&mut c, t0);
    assert_eq!(c.phase(), Phase::Steady, "the same edge twice");
    // The next growth is the probe's.
    healthy_increases(&mut c, t + MAX_HOLD, 1);
    let two_back = grown / SLOW_START_GROWTH / SLOW_START_GROWTH;
    assert!((c.level() - two_back * GROWTH).abs() < 1.0);
}

#[test]
fn past_the_last_edge_by_a_slow_start_step_slow_start_resumes() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let (grown, t) = undone_twice(&mut c, t0);
    assert_eq!(c.phase(), Phase::Steady);
    let start = c.level();
    // ×1.125 from two slow-start steps under `grown` to past one over it
    // (the edge ×1.3), then slow start's steps.
    let probes = (SLOW_START_GROWTH.powi(3).ln() / GROWTH.ln()).ceil() as usize;
    let (levels, _) = healthy_increases(&mut c, t + MAX_HOLD, probes + 1);
    let factors: Vec<f64> = std::iter::once(start)
        .chain(levels.iter().copied())
        .collect::<Vec<_>>()
        .windows(2)
        .map(|w| w[1] / w[0])
        .collect();
    assert!(
        factors[..probes].iter().all(|f| (f - GROWTH).abs() < 1e-9),
        "{factors:?}"
    );
    assert!(c.level() / SLOW_START_GROWTH >= grown * SLOW_START_GROWTH);
    assert!(
        (factors[probes] - SLOW_START_GROWTH).abs() < 1e-9,
        "{factors:?}"
    );
    assert_eq!(c.phase(), Phase::SlowStart);
}

#[test]
fn the_short_window_in_the_band_ends_slow_start_without_a_cut() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let grown = three_increases(&mut c, t0);
    // 32 ms against a 50 ms target: over the headroom, under the set point,
    // with a request in flight.
    let band = obs(Some(32), grown / 4.0, 1, true);
    assert_eq!(c.step(&band, t0 + ms(12_500)), Action::HoldBand);
    assert_eq!((c.phase(), c.level()), (Phase::Steady, grown));
    // The next increase is the probe's, on an edge's evidence.
    let healthy = obs(Some(10), 0.0, 0, true);
    c.note_completion(t0 + ms(12_600));
    let t = t0 + ms(12_500) + EVIDENCE;
    assert_eq!(c.step(&healthy, t), Action::HoldEvidence);
    assert_eq!(
        c.step(&healthy, t0 + ms(12_500) + EDGE_EVIDENCE),
        Action::Increase
    );
    assert!((c.level() - grown * GROWTH).abs() < 1.0);
}

#[test]
fn the_band_at_one_request_at_a_time_keeps_slow_start() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    // A 33 MB LIST waits: the level goes to it at once.
    assert_eq!(c.step(&waiting(33.0 * MB), t0 + ms(500)), Action::Increase);
    let band = Observation {
        waiting: 33.0 * MB,
        ..obs(Some(32), 33.0 * MB, 1, true)
    };
    assert_eq!(c.step(&band, t0 + ms(1500)), Action::HoldBand);
    assert_eq!(
        c.phase(),
        Phase::SlowStart,
        "that request is heavy, no edge"
    );
}

#[test]
fn slow_start_doubles_while_the_heartbeats_do_not_feel_the_heavy_lane() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let at = |p99| waiting_at(76.0 * MB, p99);
    assert_eq!(c.step(&at(4), t0 + ms(500)), Action::Increase);
    assert_eq!(c.level(), 76.0 * MB);
    // 4 ms against a 35 ms set point (under a quarter of it): ×2.
    c.note_completion(t0 + ms(1000));
    assert_eq!(c.step(&at(4), t0 + ms(4600)), Action::Increase);
    assert_eq!(c.level(), 2.0 * 76.0 * MB);
    // 10 ms (over a quarter): the careful ×1.3.
    c.note_completion(t0 + ms(5000));
    assert_eq!(c.step(&at(10), t0 + ms(8700)), Action::Increase);
    assert!((c.level() - 2.0 * 76.0 * MB * SLOW_START_GROWTH).abs() < 1.0);
    // A spike right after the two back-to-back multiplications undoes both.
    let spike = Observation {
        tail: tail(3),
        ..obs(Some(60), 150.0 * MB, 2, true)
    };
    assert_eq!(c.step(&spike, t0 + ms(9200)), Action::Decrease);
    assert_eq!(c.level(), 76.0 * MB);
}

#[test]
fn the_service_time_paces_the_rate_and_the_inflight_budget() {
    let t0 = Instant::now();
    let b = Bounds {
        max_rate: 1000.0 * MB,
        max_inflight: 4000.0 * MB,
        ..bounds()
    };
    let mut c = Controller::new(b, t0);
    let mut now = t0;
    let at = |p99| waiting_at(76.0 * MB, p99);
    assert_eq!(c.step(&at(4), now), Action::Increase);
    for _ in 0..2 {
        now += ms(2000);
        c.note_completion(now - ms(100));
        assert_eq!(c.step(&at(4), now), Action::Increase);
    }
    let level = 4.0 * 76.0 * MB;
    assert_eq!(c.level(), level);
    assert_eq!(
        (c.rate(), c.inflight()),
        (level / 4.0, level),
        "no service time yet: the level turns over in 4 s"
    );
    // A LIST of 76 MB served in 0.5 s, and a small request, slower per
    // byte: the LIST's time per byte, at the byte-weighted mean size.
    c.note_service(76.0 * MB, ms(500));
    c.note_service(1.0 * MB, ms(10));
    let d = c.service_seconds().expect("measured");
    let expected = 0.5 / 76.0 * (76.0 * 76.0 + 1.0) / 77.0;
    assert!((d - expected).abs() < 1e-9, "{d}");
    // The same LIST slowed by the load does not widen the budget.
    c.note_service(76.0 * MB, ms(1500));
    let d = c.service_seconds().expect("measured");
    let expected = 0.5 / 76.0 * (2.0 * 76.0 * 76.0 + 1.0) / 153.0;
    assert!((d - expected).abs() < 1e-9, "{d}");
    // The level turns over in four service times, and the in-flight
    // budget holds twice what that rate keeps in flight: half the level.
    assert!((c.rate() - level / (SERVICE_TURNS * d)).abs() < 1.0);
    assert!((c.inflight() - PACE_GAIN * c.rate() * d).abs() < 1.0);
    assert!(c.inflight() < level);
    // Served in 0.1 s: the turnover stops at its shortest (1 s), and the
    // in-flight budget holds a fifth of the level, two LISTs, not eight.
    for _ in 0..SERVICE_SAMPLES {
        c.note_service(76.0 * MB, ms(100));
    }
    assert!((c.rate() - level / MIN_TURNOVER.as_secs_f64()).abs() < 1.0);
    assert!((c.inflight() - 0.2 * level).abs() < 1.0);
    // Slow LISTs (2 s and more) leave both as they were.
    for _ in 0..SERVICE_SAMPLES {
        c.note_service(76.0 * MB, ms(3000));
    }
    assert_eq!((c.rate(), c.inflight()), (level / 4.0, level));
    // Never under the minimum.
    for _ in 0..SERVICE_SAMPLES {
        c.note_service(76.0 * MB, ms(1));
    }
    assert_eq!(c.inflight(), b.min_inflight);
}

#[test]
fn the_fast_phase_steps_on_shorter_evidence() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let at = |p99| waiting_at(10.0 * MB, p99);
    assert_eq!(c.step(&at(4), t0), Action::Increase);
    c.note_completion(t0 + ms(100));
    assert_eq!(c.step(&at(4), t0 + ms(1900)), Action::HoldEvidence);
    assert_eq!(c.step(&at(4), t0 + ms(2000)), Action::Increase);
    assert_eq!(c.level(), 20.0 * MB);
    // Over a quarter of the set point: the step needs the full 4 s.
    c.note_completion(t0 + ms(2100));
    assert_eq!(c.step(&at(10), t0 + ms(4000)), Action::HoldEvidence);
    assert_eq!(c.step(&at(10), t0 + ms(6000)), Action::Increase);
}
