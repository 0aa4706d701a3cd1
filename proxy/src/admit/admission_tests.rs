use super::*;
use crate::config::Config;

/// A static pool of `rate` and `burst` (the adaptive pool holds no burst:
/// these tests are about the bucket's own mechanics).
fn config(rate: f64, burst: f64, max_wait: f64) -> Config {
    let mut c = Config::default();
    c.quota.mode = crate::config::settings::budget::QuotaMode::Static;
    c.quota.bytes_per_second = Some(rate);
    c.quota.burst_bytes = Some(burst);
    c.quota.max_wait_seconds = max_wait;
    c.quota.per_client.requests_per_second = 0.0;
    c.relist_guard.enabled = false;
    c
}

fn admission(c: &Config) -> Arc<Admission> {
    Arc::new(Admission::new(c.admission(), Box::new(|_| {})))
}

fn start_dispatcher(a: &Arc<Admission>, c: &Config) -> CancellationToken {
    let stop = CancellationToken::new();
    let c = Arc::new(c.clone());
    tokio::spawn(
        a.clone()
            .dispatch_loop(move || c.clone(), |c| c.admission(), || 0, stop.clone()),
    );
    stop
}

#[tokio::test(start_paused = true)]
async fn admits_queues_then_rejects_past_max_wait() {
    let c = config(100.0, 100.0, 2.0);
    let a = admission(&c);
    let stop = start_dispatcher(&a, &c);
    let first = a.admit_heavy("a", 100.0, c.admission(), false).await;
    assert_eq!(
        (first.decision, first.reason),
        (Decision::Admit, Reason::Pool)
    );
    // Empty pool: the next waits one second for 100 bytes.
    let second = a.admit_heavy("a", 100.0, c.admission(), false).await;
    assert_eq!(second.decision, Decision::Queue);
    assert!(
        second.waited >= Duration::from_millis(900),
        "{:?}",
        second.waited
    );
    // A refund of what the first did not cost.
    first.hold.settle(20.0, true);
    second.hold.settle(100.0, true);
    // 80 back: 300 bytes need 2.2 s more: past the 2 s wait.
    let third = a.admit_heavy("b", 50.0, c.admission(), false).await;
    assert_eq!(third.decision, Decision::Admit);
    let _keep = third;
    let c2 = config(100.0, 100.0, 0.5);
    let late = a.admit_heavy("b", 90.0, c2.admission(), false).await;
    assert_eq!(
        (late.decision, late.reason),
        (Decision::Reject, Reason::MaxWait)
    );
    assert!(late.retry_after >= 1);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_dropped_ticket_refunds_and_oversize_goes_into_debt() {
    let c = config(100.0, 100.0, 5.0);
    let a = admission(&c);
    let big = a.admit_heavy("a", 500.0, c.admission(), false).await;
    assert_eq!((big.decision, big.reason), (Decision::Admit, Reason::Debt));
    assert_eq!(a.view(c.admission()).level, -400.0);
    drop(big);
    assert_eq!(
        a.view(c.admission()).level,
        100.0,
        "refunded, capped at the burst"
    );
    assert_eq!(a.view(c.admission()).heavy_inflight, 0);
}

#[tokio::test(start_paused = true)]
async fn dry_run_never_waits_and_counts_what_would_be_rejected() {
    let c = config(100.0, 100.0, 1.0);
    let a = admission(&c);
    let v1 = a.admit_heavy("a", 100.0, c.admission(), true).await;
    assert_eq!(v1.decision, Decision::Admit);
    let v2 = a.admit_heavy("a", 90.0, c.admission(), true).await;
    assert_eq!(v2.decision, Decision::Queue, "would wait 0.9 s");
    let v3 = a.admit_heavy("a", 90.0, c.admission(), true).await;
    assert_eq!(
        (v3.decision, v3.reason),
        (Decision::Reject, Reason::MaxWait)
    );
    assert!(matches!(v3.hold, Hold::Nothing));
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_and_the_rate_limit_answer_at_once() {
    let mut c = config(1.0, 10.0, 60.0);
    c.quota.queue.per_flow_depth = 1;
    let a = admission(&c);
    let _held = a.admit_heavy("a", 10.0, c.admission(), false).await;
    let a2 = a.clone();
    let c2 = c.clone();
    let queued = tokio::spawn(async move { a2.admit_heavy("a", 5.0, c2.admission(), false).await });
    tokio::task::yield_now().await;
    let full = a.admit_heavy("a", 5.0, c.admission(), false).await;
    assert_eq!(
        (full.decision, full.reason),
        (Decision::Reject, Reason::QueueFull)
    );
    queued.abort();
    c.quota.per_client.requests_per_second = 1.0;
    c.quota.per_client.burst = 1;
    let _ = a.admit_heavy("r", 1.0, c.admission(), true).await;
    let limited = a.admit_heavy("r", 1.0, c.admission(), true).await;
    assert_eq!(limited.reason, Reason::RateLimit);
}

#[tokio::test(start_paused = true)]
async fn light_lanes_wait_for_a_slot_then_give_up() {
    let mut c = config(1.0, 1.0, 1.0);
    c.lanes.max_inflight.workload = 1;
    c.lanes.max_wait_seconds = 0.5;
    let a = admission(&c);
    let flow = Flow::Source(std::net::Ipv4Addr::LOCALHOST.into());
    let held = a
        .admit_light(Lane::Workload, &flow, c.admission(), false)
        .await;
    assert_eq!(held.decision, Decision::Admit);
    let full = a
        .admit_light(Lane::Workload, &flow, c.admission(), false)
        .await;
    assert_eq!(
        (full.decision, full.reason),
        (Decision::Reject, Reason::Inflight)
    );
    let dry = a
        .admit_light(Lane::Workload, &flow, c.admission(), true)
        .await;
    assert_eq!(
        dry.decision,
        Decision::Queue,
        "dry run: counted, not refused"
    );
    let exempt = a
        .admit_light(Lane::Exempt, &flow, c.admission(), false)
        .await;
    assert_eq!(exempt.reason, Reason::Exempt);
}

#[tokio::test(start_paused = true)]
async fn another_clients_single_request_overtakes_a_queued_flood() {
    let mut c = config(100.0, 100.0, 60.0);
    c.quota.queue.quantum_bytes = 100.0;
    let a = admission(&c);
    let stop = start_dispatcher(&a, &c);
    // The flood empties the pool, then queues five more.
    let first = a.admit_heavy("flood", 100.0, c.admission(), false).await;
    assert_eq!(first.decision, Decision::Admit);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for who in ["flood", "flood", "flood", "flood", "flood", "single"] {
        let (a, c, tx) = (a.clone(), c.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let v = a.admit_heavy(who, 100.0, c.admission(), false).await;
            assert_eq!(v.decision, Decision::Queue);
            let _ = tx.send(who);
            v.hold.settle(100.0, true);
        }));
        // Queued in this order.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut order = Vec::new();
    for _ in 0..6 {
        order.push(rx.recv().await.expect("admitted"));
    }
    // The single request waits for the flood request already chosen (staged
    // for the pool) and at most one quantum (here one request) of the
    // flood's queue, not for all of it.
    let position = order.iter().position(|w| *w == "single");
    assert!(position.is_some_and(|p| p <= 2), "{order:?}");
    for t in tasks {
        t.await.expect("task");
    }
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_protected_sample_holds_what_its_worker_made_it_wait() {
    let c = Config::default();
    let a = admission(&c);
    let heartbeats = |a: &Admission| {
        for _ in 0..60 {
            let started = Instant::now();
            a.record_latency(Lane::System, started);
        }
    };
    heartbeats(&a);
    let p99 = |a: &Admission| a.budget_view(c.admission()).p99_seconds;
    assert_eq!(p99(&a), Some(0.0), "answered at once, on time");
    // The worker ran its ticker 30 ms late: each heartbeat waited that long before its handler
    // and again before its response was written.
    crate::wake_lag::note(Duration::from_millis(30));
    tokio::time::advance(Duration::from_secs(5)).await;
    heartbeats(&a);
    assert_eq!(p99(&a), Some(0.06), "in and out");
}
