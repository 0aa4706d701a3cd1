use super::*;
use proptest::prelude::*;

const MB: f64 = 1_000_000.0;

fn params() -> Params {
    Params {
        budget: 100.0 * MB,
        reserve: 10.0 * MB,
        floor: 5.0 * MB,
        grant_ttl: Duration::from_secs(3),
    }
}

fn demand(member: &str, mbps: f64, applied: u64) -> Demand {
    Demand {
        member: member.into(),
        bytes_per_second: mbps * MB,
        applied,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6 * MB.max(b.abs())
}

/// Every member acknowledges the grant it has.
fn acked(a: &Allocator, wants: &[(&str, f64)]) -> Vec<Demand> {
    let grants = a.grants();
    wants
        .iter()
        .map(|(m, w)| demand(m, *w, grants.get(*m).map_or(0, |g| g.seq)))
        .collect()
}

#[test]
fn target_gives_demand_plus_spare_when_it_fits_and_proportional_shares_when_not() {
    let t = target(&[10.0 * MB, 20.0 * MB, 0.0], 90.0 * MB, 5.0 * MB);
    // 10 + 20 + 5 (floor) = 35; 55 spare, 18.33 each.
    let spare = 55.0 * MB / 3.0;
    assert!(close(t[0], 10.0 * MB + spare), "{t:?}");
    assert!(close(t[2], 5.0 * MB + spare), "{t:?}");
    // 70/20/10 of a storm far over the capacity: floors, then in proportion.
    let t = target(&[700.0 * MB, 200.0 * MB, 100.0 * MB], 90.0 * MB, 5.0 * MB);
    // 75 above the floors, divided 695 : 195 : 95.
    assert!(close(t[0], 5.0 * MB + 75.0 * MB * 695.0 / 985.0), "{t:?}");
    assert!(close(t.iter().sum::<f64>(), 90.0 * MB));
    assert!(t[0] > t[1] && t[1] > t[2], "{t:?}");
    // Floors that do not fit are lowered to C/N.
    let t = target(&[0.0; 30], 90.0 * MB, 5.0 * MB);
    assert!(t.iter().all(|g| close(*g, 3.0 * MB)), "{t:?}");
    assert!(target(&[], 90.0 * MB, 5.0 * MB).is_empty());
}

#[test]
fn a_new_coordinator_only_shrinks_for_one_grant_ttl() {
    let t0 = Instant::now();
    let found = [
        (
            "a".to_string(),
            Grant {
                bytes_per_second: 60.0 * MB,
                seq: 7,
            },
        ),
        (
            "b".to_string(),
            Grant {
                bytes_per_second: 30.0 * MB,
                seq: 8,
            },
        ),
    ];
    let mut a = Allocator::take_over(params(), found, 8, t0);
    assert!(a.learning(t0));
    // The storm moved from a to b: a shrinks at once, b waits.
    let wants = [("a", 1.0), ("b", 500.0)];
    assert!(a.step(&acked(&a, &wants), 0.0, t0 + Duration::from_secs(1)));
    let g = a.grants();
    assert!(close(g["a"].bytes_per_second, 5.0 * MB), "{g:?}");
    assert_eq!(
        g["b"].bytes_per_second,
        30.0 * MB,
        "no growth while learning"
    );
    assert!(g["a"].seq > 8, "sequence numbers continue");
    // After the learning period, a acknowledged its shrink: b grows.
    let t1 = t0 + Duration::from_secs(4);
    a.step(&acked(&a, &wants), 0.0, t1);
    let g = a.grants();
    assert!(close(g["b"].bytes_per_second, 85.0 * MB), "{g:?}");
    assert!(a.held_total(t1) <= params().capacity() + 1.0);
}

#[test]
fn growth_waits_for_the_shrink_to_be_acknowledged_or_to_expire() {
    let t0 = Instant::now();
    let mut a = Allocator::take_over(params(), [], 0, t0 - Duration::from_secs(60));
    let wants = [("a", 500.0), ("b", 1.0)];
    a.step(&acked(&a, &wants), 0.0, t0);
    let g = a.grants();
    assert!(close(g["a"].bytes_per_second, 85.0 * MB), "{g:?}");
    let a_seq = g["a"].seq;
    // The storm moves to b; a has not read its new grant yet.
    let moved = [("a", 1.0), ("b", 500.0)];
    let t1 = t0 + Duration::from_secs(1);
    a.step(
        &[demand("a", 1.0, a_seq), demand("b", 500.0, g["b"].seq)],
        0.0,
        t1,
    );
    let g = a.grants();
    assert!(close(g["a"].bytes_per_second, 5.0 * MB), "{g:?}");
    assert!(close(g["b"].bytes_per_second, 5.0 * MB), "b waits: {g:?}");
    assert!(a.held_total(t1) <= params().capacity() + 1.0);
    // a acknowledges: b gets what a gave back.
    let t2 = t1 + Duration::from_secs(1);
    a.step(&acked(&a, &moved), 0.0, t2);
    let g = a.grants();
    assert!(close(g["b"].bytes_per_second, 85.0 * MB), "{g:?}");
    // Unacknowledged, a shrink frees its share GRANT_TTL later.
    let mut u = Allocator::take_over(params(), [], 0, t0 - Duration::from_secs(60));
    u.step(&acked(&u, &wants), 0.0, t0);
    let seqs = u.grants();
    let stale = |_: &Allocator| {
        vec![
            demand("a", 1.0, seqs["a"].seq),
            demand("b", 500.0, seqs["b"].seq),
        ]
    };
    u.step(&stale(&u), 0.0, t1);
    u.step(&stale(&u), 0.0, t1 + Duration::from_secs(2));
    assert!(close(u.grants()["b"].bytes_per_second, 5.0 * MB));
    u.step(&stale(&u), 0.0, t1 + Duration::from_secs(3));
    assert!(close(u.grants()["b"].bytes_per_second, 85.0 * MB));
}

#[test]
fn a_member_gone_frees_its_share_and_a_small_change_is_not_written() {
    let t0 = Instant::now();
    let mut a = Allocator::take_over(params(), [], 0, t0 - Duration::from_secs(60));
    let three = [("a", 70.0), ("b", 20.0), ("c", 10.0)];
    assert!(a.step(&acked(&a, &three), 0.0, t0));
    let before = a.grants()["b"].bytes_per_second;
    let hysteresis = 2.0 * MB;
    let slightly = [("a", 70.5), ("b", 20.0), ("c", 10.0)];
    assert!(!a.step(
        &acked(&a, &slightly),
        hysteresis,
        t0 + Duration::from_secs(1)
    ));
    // a died: its lease expired, its share goes to b and c at once.
    let two = [("b", 20.0), ("c", 10.0)];
    assert!(a.step(&acked(&a, &two), hysteresis, t0 + Duration::from_secs(2)));
    let g = a.grants();
    assert!(!g.contains_key("a"));
    assert!(g["b"].bytes_per_second > before);
    assert!(close(
        g["b"].bytes_per_second + g["c"].bytes_per_second,
        90.0 * MB
    ));
}

proptest! {
    /// Whatever the demands, acknowledgements and timing: what all members
    /// may hold never exceeds the capacity, and every grant a member
    /// gets after the learning period with acknowledged grants is at
    /// least its floor.
    #[test]
    fn never_over_the_capacity(
        steps in proptest::collection::vec(
            (
                proptest::collection::vec((0.0f64..200.0, any::<bool>(), any::<bool>()), 5),
                0u64..2_500,
            ),
            1..60,
        ),
    ) {
        let p = params();
        let names = ["a", "b", "c", "d", "e"];
        let t0 = Instant::now();
        let mut a = Allocator::take_over(p, [], 0, t0);
        let mut now = t0;
        for (members, dt) in steps {
            now += Duration::from_millis(dt);
            let grants = a.grants();
            let demands: Vec<Demand> = members
                .iter()
                .zip(names)
                .filter(|((_, live, _), _)| *live)
                .map(|((d, _, ack), m)| {
                    let applied = if *ack { grants.get(m).map_or(0, |g| g.seq) } else { 0 };
                    demand(m, *d, applied)
                })
                .collect();
            a.step(&demands, 0.5 * MB, now);
            prop_assert!(a.held_total(now) <= p.capacity() * (1.0 + 1e-9),
                "held {} > capacity", a.held_total(now));
            let sum: f64 = a.grants().values().map(|g| g.bytes_per_second).sum();
            prop_assert!(sum <= p.capacity() * (1.0 + 1e-9));
        }
    }

    /// Constant demands, every grant acknowledged: the grants converge to
    /// the target (floors, then demand-proportional).
    #[test]
    fn converges_to_the_target(
        wants in proptest::collection::vec(0.0f64..300.0, 1..6),
        start in proptest::collection::vec(0.0f64..300.0, 6),
    ) {
        let p = params();
        let names = ["a", "b", "c", "d", "e", "f"];
        let t0 = Instant::now();
        let mut a = Allocator::take_over(p, [], 0, t0 - Duration::from_secs(60));
        // Some other demand first, then the one that stays.
        let first: Vec<(&str, f64)> = names.iter().zip(&start).take(wants.len()).map(|(m, w)| (*m, *w)).collect();
        a.step(&acked(&a, &first), 0.0, t0);
        let steady: Vec<(&str, f64)> = names.iter().zip(&wants).map(|(m, w)| (*m, *w)).collect();
        let mut now = t0;
        for _ in 0..5 {
            now += Duration::from_secs(1);
            a.step(&acked(&a, &steady), 0.0, now);
        }
        let goal = target(&wants.iter().map(|w| w * MB).collect::<Vec<_>>(), p.capacity(), p.floor);
        let g = a.grants();
        for (i, (m, _)) in steady.iter().enumerate() {
            prop_assert!(close(g[*m].bytes_per_second, goal[i]), "{m}: {:?} vs {goal:?}", g);
            prop_assert!(g[*m].bytes_per_second >= p.floor.min(p.capacity() / wants.len() as f64) - 1.0);
        }
    }
}
