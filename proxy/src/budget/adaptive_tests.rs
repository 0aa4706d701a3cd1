use super::*;
use proptest::prelude::*;

const MB: f64 = 1_000_000.0;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn bounds() -> Bounds {
    Bounds {
        min_rate: 1.0 * MB,
        max_rate: 1000.0 * MB,
        min_inflight: 8.0 * MB,
        max_inflight: 4000.0 * MB,
    }
}

/// One step's observation: the p99 (ms), bytes in flight, what waited.
fn obs(p99_ms: Option<u64>, inflight: f64, waiting: f64) -> Observation {
    Observation {
        p99: p99_ms.map(ms),
        target: ms(50),
        inflight_used: inflight,
        inflight_peak: inflight,
        inflight_count: usize::from(inflight > 0.0),
        admitted: 0.0,
        waiting,
        upstream_errors: 0,
        tail: None,
    }
}

/// Steps every 500 ms until an epoch ends; its decision and the time.
fn epoch(c: &mut Controller, mut t: Instant, o: Observation) -> (Decision, Instant) {
    for _ in 0..200 {
        t += ms(500);
        if let Some(d) = c.step(&o, t) {
            return (d, t);
        }
    }
    panic!("no epoch ended in 100 s");
}

#[test]
fn a_cold_start_grows_per_clear_epoch_by_the_heartbeats_headroom() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    assert_eq!((c.state(), c.rate()), (State::Startup, 1.0 * MB));
    assert_eq!(
        c.inflight(),
        8.0 * MB,
        "one request at a time until one completes"
    );
    assert_eq!(
        c.epoch(),
        MIN_WINDOW,
        "no service time yet: the signal's window"
    );
    let (d, t) = epoch(&mut c, t0, obs(Some(0), 10.0 * MB, 99.0 * MB));
    assert_eq!((d.action, d.reason), (Action::Increase, Reason::Clear));
    // The waiting 99 MB request's floor (99 MB / 30 s) doubled: the
    // heartbeats are all headroom.
    assert!((d.rate_after - 2.0 * 99.0 * MB / 30.0).abs() < 1.0, "{d:?}");
    // At 10 ms, 40% of the way to the band's lower edge (25 ms): the step
    // is 60% of a doubling; at 20 ms, 20%.
    let (d2, t) = epoch(&mut c, t, obs(Some(10), 10.0 * MB, 99.0 * MB));
    assert!((d2.rate_after - 1.6 * d.rate_after).abs() < 1.0, "{d2:?}");
    let (d3, t) = epoch(&mut c, t, obs(Some(20), 10.0 * MB, 99.0 * MB));
    assert!((d3.rate_after - 1.2 * d2.rate_after).abs() < 1.0, "{d3:?}");
    assert_eq!(c.state(), State::Startup);
    // Nothing waited: no growth.
    let (d4, _) = epoch(&mut c, t, obs(Some(10), 0.0, 0.0));
    assert_eq!((d4.action, d4.reason), (Action::Hold, Reason::Idle));
}

#[test]
fn the_view_shows_the_pipe_of_the_size_that_waited_when_none_waits_now() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    c.note_service(100.0 * MB, Duration::from_secs(2), t0);
    // A small request's quick completion: per byte far faster.
    c.note_service(1.0 * MB, Duration::from_millis(1), t0);
    let all = c.pipe_rate(0.0).expect("completions");
    assert!((all - 1000.0 * MB).abs() < 1.0, "{all}");
    let (_, t) = epoch(&mut c, t0, obs(Some(10), 10.0 * MB, 100.0 * MB));
    // Nothing waits now: the view keeps the last decision's size.
    c.step(&obs(Some(10), 0.0, 0.0), t + ms(100));
    let shown = c.view(t + ms(100)).pipe_bytes_per_second.expect("a pipe");
    assert!((shown - 50.0 * MB).abs() < 1.0, "{shown}");
}

#[test]
fn congestion_cuts_toward_the_band_then_drains_then_probes() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    c.note_service(100.0 * MB, Duration::from_secs(1), t0);
    assert_eq!(c.epoch(), MIN_WINDOW + Duration::from_secs(1));
    let mut t = t0;
    for _ in 0..6 {
        t = epoch(&mut c, t, obs(Some(10), 50.0 * MB, 100.0 * MB)).1;
    }
    let before = c.rate();
    // Just over the set point (35 ms): the cut aims at the band's lower edge.
    let (d, t) = epoch(&mut c, t, obs(Some(36), 400.0 * MB, 100.0 * MB));
    assert_eq!(
        (d.action, d.reason, c.state()),
        (Action::Decrease, Reason::Congested, State::Drain)
    );
    let want = before * ((HEADROOM / SET_POINT) / (36.0 / 35.0)).max(MIN_CUT);
    assert!((c.rate() - want).abs() < 1.0, "{} vs {want}", c.rate());
    // Far over: at most MIN_CUT.
    let mut c2 = c.clone();
    c2.state = State::Probe;
    let r = c2.rate();
    let (d, _) = epoch(&mut c2, t, obs(Some(500), 0.0, 100.0 * MB));
    assert_eq!(d.action, Action::Decrease);
    assert!((c2.rate() - r * MIN_CUT).abs() < 1.0);
    // Still over the new in-flight budget: draining, however slow.
    let (d, t) = epoch(&mut c, t, obs(Some(200), 4000.0 * MB, 100.0 * MB));
    assert_eq!((d.action, d.reason), (Action::Hold, Reason::Draining));
    // Drained: that epoch is not judged (its signal still shows what was
    // admitted before the cut); the next is (clear: a sixteenth up).
    let (d, t) = epoch(&mut c, t, obs(Some(200), 0.0, 100.0 * MB));
    assert_eq!((d.reason, c.state()), (Reason::Draining, State::Probe));
    let r = c.rate();
    let (d, t) = epoch(&mut c, t, obs(Some(10), 0.0, 100.0 * MB));
    assert_eq!((d.action, c.state()), (Action::Increase, State::Probe));
    assert!((c.rate() - r * PROBE_GAIN).abs() < 1.0);
    // The band holds.
    let (d, _) = epoch(&mut c, t, obs(Some(30), 10.0 * MB, 100.0 * MB));
    assert_eq!((d.action, d.reason), (Action::Hold, Reason::Band));
}

#[test]
fn startup_ends_where_one_heavy_request_is_always_in_flight() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    // 100 MB served in 2 s (and a smaller, slower one, which does not
    // count): one in flight at a time is 50 MB/s.
    c.note_service(100.0 * MB, Duration::from_secs(2), t0);
    c.note_service(10.0 * MB, Duration::from_secs(1), t0);
    assert_eq!(c.pipe_rate(100.0 * MB), Some(50.0 * MB));
    assert_eq!(c.pipe_rate(10.0 * MB), Some(50.0 * MB));
    assert_eq!(c.pipe_rate(199.0 * MB), Some(50.0 * MB), "of that order");
    assert_eq!(c.pipe_rate(201.0 * MB), None, "none that large yet");
    let mut t = t0;
    let mut rates = Vec::new();
    while c.state() == State::Startup {
        let (d, next) = epoch(&mut c, t, obs(Some(10), 10.0 * MB, 100.0 * MB));
        t = next;
        assert_eq!(d.reason, Reason::Clear);
        rates.push(c.rate() / MB);
        assert!(rates.len() < 20, "{rates:?}");
    }
    // From a quarter of the pipe (over the floor's doubling, 100 MB per
    // 30 s twice), 1.6 a step at 10 ms, the last step capped at the pipe;
    // the epoch after, Probe's first step.
    assert!(2.0 * 100.0 / MAX_SPACING.as_secs_f64() < 50.0 / 4.0);
    let want = [12.5, 20.0, 32.0, 50.0, 50.0 * PROBE_GAIN];
    assert_eq!(rates.len(), want.len(), "{rates:?}");
    for (got, want) in rates.iter().zip(want) {
        assert!((got - want).abs() < 1e-6, "{rates:?}");
    }
    assert_eq!(c.state(), State::Probe);
}

#[test]
fn after_a_cut_growth_stops_under_the_edge_for_a_tail_window() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    c.note_service(100.0 * MB, Duration::from_secs(1), t0);
    let mut t = t0;
    for _ in 0..6 {
        t = epoch(&mut c, t, obs(Some(10), 50.0 * MB, 100.0 * MB)).1;
    }
    let edge = c.rate();
    let (d, mut t) = epoch(&mut c, t, obs(Some(60), 0.0, 100.0 * MB));
    assert_eq!(d.action, Action::Decrease);
    let cut_at = t;
    // Clear epochs climb back, but not past one probe step under the edge.
    let mut held = false;
    while t.duration_since(cut_at) < TAIL_WINDOW - Duration::from_secs(4) {
        let (d, next) = epoch(&mut c, t, obs(Some(10), 0.0, 100.0 * MB));
        t = next;
        assert!(c.rate() <= edge / PROBE_GAIN * 1.000_001, "{d:?}");
        held |= d.reason == Reason::Edge;
    }
    assert!(held, "the climb reached the edge and held there");
    // A cut while holding within a tail window of the last growth is an
    // edge too: the level growth reached congested, a few epochs late.
    let r = c.rate();
    let (d, next) = epoch(&mut c, t, obs(Some(60), 10.0 * MB, 100.0 * MB));
    t = next;
    assert_eq!(d.action, Action::Decrease);
    assert_eq!(c.edge.map(|e| e.0), Some(r), "held at {r}, cut");
    let cut_at = t;
    // Until a tail window after that cut it stays under the new edge;
    // then the edge is forgotten and clear epochs probe past it.
    let mut past = None;
    for _ in 0..60 {
        let (d, next) = epoch(&mut c, t, obs(Some(10), 0.0, 100.0 * MB));
        t = next;
        if c.rate() > r / PROBE_GAIN * 1.000_001 {
            past = Some((d, t));
            break;
        }
    }
    let (d, at) = past.expect("past the edge once it is forgotten");
    assert_eq!((d.action, d.reason), (Action::Increase, Reason::Clear));
    assert!(
        at.duration_since(cut_at) >= TAIL_WINDOW,
        "{:?}",
        at.duration_since(cut_at)
    );
}

#[test]
fn a_cut_after_holding_for_a_tail_window_is_the_capacity_moving_not_an_edge() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    c.note_service(100.0 * MB, Duration::from_secs(1), t0);
    let mut t = t0;
    for _ in 0..3 {
        t = epoch(&mut c, t, obs(Some(10), 50.0 * MB, 100.0 * MB)).1;
    }
    let grown_at = t;
    while t.duration_since(grown_at) < TAIL_WINDOW {
        let (d, next) = epoch(&mut c, t, obs(Some(30), 50.0 * MB, 100.0 * MB));
        t = next;
        assert_eq!(d.reason, Reason::Band);
    }
    let (d, _) = epoch(&mut c, t, obs(Some(60), 50.0 * MB, 100.0 * MB));
    assert_eq!(d.action, Action::Decrease);
    assert_eq!(c.edge, None);
}

#[test]
fn the_band_ends_startup_and_slow_heartbeats_without_heavy_load_are_not_ours() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let (d, t) = epoch(&mut c, t0, obs(Some(30), 10.0 * MB, 10.0 * MB));
    assert_eq!((d.reason, c.state()), (Reason::Band, State::Probe));
    let mut idle = obs(Some(300), 0.0, 0.0);
    idle.inflight_peak = 0.0;
    let mut c = Controller::new(bounds(), t);
    let (d, _) = epoch(&mut c, t, idle);
    assert_eq!((d.action, d.reason), (Action::Hold, Reason::NotOurs));
    let (d, _) = epoch(&mut c, t, obs(None, 10.0 * MB, 10.0 * MB));
    assert_eq!(d.reason, Reason::NoSignal);
}

#[test]
fn upstream_errors_cut_deepest_and_the_floor_holds() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    let mut t = t0;
    for _ in 0..4 {
        t = epoch(&mut c, t, obs(Some(5), 10.0 * MB, 10.0 * MB)).1;
    }
    let r = c.rate();
    let mut o = obs(Some(5), 10.0 * MB, 10.0 * MB);
    o.upstream_errors = 1;
    let (d, mut t) = epoch(&mut c, t, o);
    assert_eq!(d.reason, Reason::UpstreamErrors);
    assert!((c.rate() - r * MIN_CUT).abs() < 1.0);
    // Overload forever: the rate falls to the floor and stays, where a
    // 99 MB request waiting is still admitted every 30 s.
    for _ in 0..40 {
        t = epoch(&mut c, t, obs(Some(500), 1.0 * MB, 99.0 * MB)).1;
    }
    assert_eq!(c.last_decision().map(|d| d.reason), Some(Reason::Floor));
    assert!((c.rate() - 99.0 * MB / MAX_SPACING.as_secs_f64()).abs() < 1.0);
    assert!(c.explain().contains("floor"), "{}", c.explain());
}

#[test]
fn the_explanation_names_what_was_measured_and_what_bounds_it() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    assert!(c.explain().starts_with("cold start"));
    epoch(&mut c, t0, obs(Some(12), 10.0 * MB, 10.0 * MB));
    let e = c.explain();
    for part in [
        "p99 12.0 ms",
        "target of 50.0 ms",
        "grew",
        "Startup",
        "ceiling 1000.0 MB/s",
    ] {
        assert!(e.contains(part), "{part} not in {e}");
    }
}

#[test]
fn the_service_time_paces_the_inflight_budget() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    c.rate = 100.0 * MB;
    assert_eq!(c.inflight(), 8.0 * MB);
    c.note_service(33.0 * MB, Duration::from_secs(2), t0);
    c.note_service(33.0 * MB, Duration::from_secs(1), t0);
    let d = c.service_seconds().expect("two completed");
    assert!((d - 1.0).abs() < 1e-9, "the shortest per byte: {d}");
    assert!((c.inflight() - PACE_GAIN * 100.0 * MB).abs() < 1.0);
}

#[test]
fn the_inflight_budget_is_paced_by_the_apiserver_at_rest_for_a_baseline_horizon() {
    let t0 = Instant::now();
    let mut c = Controller::new(bounds(), t0);
    c.note_service(100.0 * MB, Duration::from_secs(1), t0);
    let at_rest = c.inflight();
    // 32 slowed completions push the fast one out of the window…
    for i in 0..32 {
        c.note_service(
            100.0 * MB,
            Duration::from_secs(8),
            t0 + Duration::from_secs(i),
        );
    }
    let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
    assert!(near(c.service_seconds(), 8.0), "{:?}", c.service_seconds());
    // …but not out of what paces the in-flight budget.
    assert!(near(c.unloaded_service_seconds(), 1.0));
    assert_eq!(c.inflight(), at_rest);
    // A horizon after the fast one, the slowed ones are the service time.
    let later = t0 + BASELINE_HORIZON + Duration::from_secs(1);
    c.note_service(100.0 * MB, Duration::from_secs(8), later);
    assert!(near(c.unloaded_service_seconds(), 8.0));
    assert!(c.inflight() > at_rest);
}

fn arb_bounds() -> impl Strategy<Value = Bounds> {
    (1.0f64..100.0, 1.0f64..1000.0, 1.0f64..100.0, 1.0f64..1000.0).prop_map(|(a, b, c, d)| Bounds {
        min_rate: a * MB,
        max_rate: (a + b) * MB,
        min_inflight: c * MB,
        max_inflight: (c + d) * MB,
    })
}

proptest! {
    /// Whatever is observed, the rate stays between its floor and its
    /// ceiling and the in-flight budget within its bounds.
    #[test]
    fn stays_within_bounds(
        b in arb_bounds(),
        steps in proptest::collection::vec((proptest::option::of(0u64..400), 0.0f64..3000.0, 0.0f64..200.0, 0u64..2), 1..300),
    ) {
        let t0 = Instant::now();
        let mut c = Controller::new(b, t0);
        let mut t = t0;
        for (p99, inflight, waiting, errors) in steps {
            t += ms(500);
            let mut o = obs(p99, inflight * MB, waiting * MB);
            o.upstream_errors = errors;
            c.step(&o, t);
            if inflight > 1500.0 {
                c.note_service(inflight * MB, Duration::from_secs_f64(waiting / 10.0 + 0.01), t0);
            }
            let floor = b.min_rate.max(waiting * MB / MAX_SPACING.as_secs_f64()).min(b.max_rate);
            prop_assert!(c.rate() >= floor - 1e-6 && c.rate() <= b.max_rate + 1e-6, "{} not in [{floor}, {}]", c.rate(), b.max_rate);
            prop_assert!(c.inflight() >= b.min_inflight - 1e-6 && c.inflight() <= b.max_inflight + 1e-6);
        }
    }
}
