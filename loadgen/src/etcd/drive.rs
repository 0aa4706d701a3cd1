//! The open-loop driver of ranges and puts: it sleeps until each tick's
//! intended start (crate::schedule) and issues the request whether or not
//! earlier ones have returned; latency runs from the intended start, so an
//! etcd stalled by a large range shows in the puts' percentiles (no
//! coordinated omission). At `--max-in-flight` outstanding requests a tick is
//! dropped and counted.
//!
//! etcd rates are modest (hundreds per second, not the API drivers' tens of
//! thousands), so tokio's millisecond timer and a task per request do.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{GetOptions, KvClient};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connect::{failed, ok, timed_out};
use super::{value, PutSpec, RangeSpec};
use crate::rate::Rate;
use crate::record::{OpRecorder, Outcome};
use crate::schedule::{ScheduleKind, Ticks};

/// What every driver of a run shares.
#[derive(Debug, Clone)]
pub(crate) struct DriveCtx {
    pub(crate) schedule: ScheduleKind,
    pub(crate) duration: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) timeout: Duration,
    pub(crate) start: Instant,
    /// Ends the schedule early (a signal); requests in flight still finish.
    pub(crate) stop: CancellationToken,
    /// Ends the requests in flight (the drain timed out).
    pub(crate) abort: CancellationToken,
}

/// One operation and the connection it uses.
#[derive(Clone)]
pub(crate) enum Op {
    Range { kv: KvClient, spec: RangeSpec },
    Put { kv: KvClient, spec: PutSpec },
}

impl Op {
    /// Performs the `i`-th request.
    async fn call(&self, i: u64) -> Outcome {
        match self {
            Op::Range { kv, spec } => {
                let mut opts = GetOptions::new().with_prefix();
                if spec.limit > 0 {
                    opts = opts.with_limit(i64::try_from(spec.limit).unwrap_or(i64::MAX));
                }
                if spec.serializable {
                    opts = opts.with_serializable();
                }
                if spec.keys_only {
                    opts = opts.with_keys_only();
                }
                if spec.count_only {
                    opts = opts.with_count_only();
                }
                match kv.clone().get(spec.prefix.as_bytes(), Some(opts)).await {
                    // What etcd sent: every key and value read.
                    Ok(resp) => ok(resp
                        .kvs()
                        .iter()
                        .map(|kv| (kv.key().len() + kv.value().len()) as u64)
                        .sum()),
                    Err(e) => failed(&e),
                }
            }
            Op::Put { kv, spec } => {
                let key = format!("{}{}", spec.prefix, i % spec.keys);
                // Stamped as it leaves, so a watcher times delivery, not our schedule.
                let v = value::encode(spec.size, crate::ops::unix_nanos(), i);
                let bytes = (key.len() + v.len()) as u64;
                match kv.clone().put(key, v, None).await {
                    Ok(_) => ok(bytes),
                    Err(e) => failed(&e),
                }
            }
        }
    }
}

/// Issues `op` at `rate` until the schedule passes `ctx.duration` (or
/// `ctx.stop`), then waits for its requests (they stop early when
/// `ctx.abort` is cancelled).
pub(crate) async fn drive(op: Op, rate: Rate, ctx: DriveCtx, rec: Arc<OpRecorder>) {
    let op = Arc::new(op);
    let slots = Arc::new(Semaphore::new(ctx.max_in_flight.max(1)));
    let step = match ctx.schedule {
        ScheduleKind::Steps { step, .. } if !step.is_zero() => Some(step),
        _ => None,
    };
    let requests = TaskTracker::new();
    for (i, offset) in Ticks::new(ctx.schedule.clone(), rate).enumerate() {
        if offset >= ctx.duration {
            break;
        }
        let intended = ctx.start + offset;
        tokio::select! {
            _ = tokio::time::sleep_until(intended) => {}
            _ = ctx.stop.cancelled() => break,
            _ = ctx.abort.cancelled() => break,
        }
        // The permit travels with the request: no path can leak a slot.
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            rec.drop_one();
            continue;
        };
        rec.record_start_lag(intended.elapsed());
        let slice = step.map(|s| (offset.as_secs_f64() / s.as_secs_f64()) as usize);
        let (op, rec, abort, timeout) = (op.clone(), rec.clone(), ctx.abort.clone(), ctx.timeout);
        requests.spawn(async move {
            let _permit = permit;
            let outcome = tokio::select! {
                r = tokio::time::timeout(timeout, op.call(i as u64)) => r.unwrap_or_else(|_| timed_out()),
                _ = abort.cancelled() => {
                    rec.cancel_one();
                    return;
                }
            };
            let latency = intended.elapsed();
            rec.record(&outcome, latency, false);
            if let Some(k) = slice {
                rec.record_slice(k, &outcome, latency);
            }
        });
    }
    requests.close();
    requests.wait().await;
}
