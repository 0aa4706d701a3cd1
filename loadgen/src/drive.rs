//! One operation's open-loop driver, on an OS thread of its own with a
//! current-thread runtime: the driver, its requests and their connections
//! ([`Conns`]) never leave that thread, so a response wakes nothing on another
//! core: context switches per request are what the multi-threaded runtime and
//! the pooled client cost (figures in bench/RESULTS.md, "loadgen's driver").
//!
//! The driver keeps the schedule itself: whenever it runs (a response came
//! in, or its alarm rang) it issues every tick that is due. The alarm is a
//! timerfd in the runtime's own epoll set: a high-resolution timer (tokio's
//! timer rounds to the next millisecond) that wakes the driver thread
//! directly, where a sleeping tick thread would add a hand-off per wake. Latency runs from each tick's intended
//! start; at `--max-in-flight` outstanding requests a tick is dropped and
//! counted.
//!
//! HTTP/1.1 requests go out on the driver's own client path ([`h1`]): the
//! request future writes and reads its connection itself, and its timeout is
//! a deadline the driver checks when it wakes ([`deadline`]), so a request
//! costs no task, channel or timer besides its own future. Every response
//! that is ready and every due tick are handled in one wakeup. HTTP/2 goes
//! through hyper's client in [`Conns`].

mod deadline;
mod h1;

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::deadline::Deadlines;
use crate::conn::Conns;
use crate::ops::{CreatedPods, OpKind, OpSpec, Planned};
use crate::record::{OpRecorder, Outcome};
use crate::schedule::Ticks;
use crate::send::{self, SendOptions, Sent};
use crate::target::ApiClient;
use crate::Config;

/// Shared by every driver and request of the run.
pub(crate) struct RunCtx {
    /// The pooled client, for the burst and the checks around the run.
    pub(crate) client: ApiClient,
    pub(crate) config: Config,
    pub(crate) created: CreatedPods,
    /// Objects created so far (for `--max-objects`).
    pub(crate) creations: std::sync::atomic::AtomicU64,
    /// The last list revision seen, for `--list-rv exact`.
    pub(crate) last_rv: Mutex<Option<String>>,
}

/// How much earlier than intended a tick may leave: about what waking the
/// thread takes, so that requests leave on time rather than always late.
const TIMER_SLACK: Duration = Duration::from_micros(50);
/// Shortest time between two rings of the alarm: above 1,000/s, ticks due
/// within a millisecond of its last ring leave together (late, never early),
/// so the driver is woken at most 1,000 times a second, not once per request.
const MIN_WAKE_GAP: Duration = Duration::from_millis(1);

/// Starts `op`'s driver thread; the receiver completes when it is done
/// (schedule over or `stop`ped and requests finished, or `abort`).
pub(crate) fn spawn(
    op: Arc<OpSpec>,
    ctx: Arc<RunCtx>,
    rec: Arc<OpRecorder>,
    start: Instant,
    stop: CancellationToken,
    abort: CancellationToken,
    conns: Conns,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(format!("loadgen-{}", op.name))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(operation = %op.name, error = %e, "cannot start the driver's runtime");
                    return;
                }
            };
            rt.block_on(drive(&op, &ctx, &rec, start, [&stop, &abort], &conns));
            // The runtime (and with it every connection task) ends before `done` says so.
            drop(rt);
            drop(done);
        })?;
    Ok(finished)
}

/// Issues `op`'s ticks on schedule without waiting for earlier requests,
/// until the schedule ends or `stop`; then lets the requests in flight
/// finish, unless `abort`.
async fn drive(
    op: &OpSpec,
    ctx: &RunCtx,
    rec: &OpRecorder,
    start: Instant,
    [stop, abort]: [&CancellationToken; 2],
    conns: &Conns,
) {
    let max_in_flight = ctx.config.max_in_flight.max(1);
    let mut ticks = DueTicks::new(op, &ctx.config, start);
    let mut alarm = match Alarm::new() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(operation = %op.name, error = %e, "cannot create the driver's timer");
            return;
        }
    };
    let pool = h1::Pool::new(conns, ctx.config.max_connections);
    let deadlines = RefCell::new(Deadlines::default());
    let client = Client {
        conns,
        pool: &pool,
        deadlines: &deadlines,
    };
    let mut in_flight = FuturesUnordered::new();
    let mut cancelled = std::pin::pin!(abort.cancelled());
    let mut stopped = std::pin::pin!(stop.cancelled());
    let aborted = poll_fn(|cx| {
        if cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        // Polled only until it fires: the schedule is then over for good.
        if !ticks.done && stopped.as_mut().poll(cx).is_ready() {
            ticks.done = true;
        }
        // Rings are taken (and the timer's waker registered) before the
        // schedule is looked at, so none is lost.
        while alarm.poll_ring(cx).is_ready() {}
        loop {
            let now = std::time::Instant::now();
            // Attempts past their deadline end (with a timeout) in this pass.
            deadlines.borrow_mut().expire(now);
            pool.reap();
            let deadline_due = deadlines.borrow().next_due();
            ticks.take_due(now, |i, at, slice| {
                if in_flight.len() >= max_in_flight {
                    rec.drop_one();
                    return;
                }
                let intended = Instant::from_std(at);
                let now = Instant::from_std(now);
                rec.record_start_lag(now.saturating_duration_since(intended));
                // Latency runs from the intended start, or from the actual one
                // if the request left early: never shorter than what the server took.
                in_flight.push(request(op, ctx, &client, rec, i, intended.min(now), slice));
            });
            let wake_at = match (deadline_due, ticks.next_due()) {
                (Some(d), Some(t)) => Some(d.min(t)),
                (d, t) => d.or(t),
            };
            if let Some(due) = wake_at {
                if let Err(e) = alarm.arm(due) {
                    tracing::error!(operation = %op.name, error = %e, "cannot set the driver's timer");
                    return Poll::Ready(true);
                }
            }
            // Every request that can finish now does, before the clock and
            // the schedule are looked at again.
            let mut finished = 0;
            loop {
                match in_flight.poll_next_unpin(cx) {
                    Poll::Ready(Some(())) => finished += 1,
                    Poll::Ready(None) if ticks.done => return Poll::Ready(false),
                    _ if finished > 0 => break,
                    _ => {
                        // A connection closed in a request still running
                        // makes room for one waiting.
                        pool.reap();
                        return Poll::Pending;
                    }
                }
            }
        }
    })
    .await;
    if aborted {
        for _ in 0..in_flight.len() {
            rec.cancel_one();
        }
    }
}

/// The operation's ticks as its driver walks them: which are due now, and
/// when the next one is.
struct DueTicks {
    ticks: std::iter::Peekable<std::iter::Enumerate<Ticks>>,
    /// The schedule has reached the run's duration.
    done: bool,
    start: std::time::Instant,
    /// Shards of a constant schedule interleave: shard i starts i/N of a period late.
    phase: Duration,
    duration: Duration,
    /// A stepped schedule's step, to record each request in its step's slice.
    step: Option<Duration>,
}

impl DueTicks {
    fn new(op: &OpSpec, config: &Config, start: Instant) -> DueTicks {
        let phase = match config.shard {
            Some(s) => Duration::from_secs_f64(
                f64::from(s.index) / f64::from(s.count) / op.rate.as_per_second(),
            ),
            None => Duration::ZERO,
        };
        let step = match config.schedule {
            crate::schedule::ScheduleKind::Steps { step, .. } if !step.is_zero() => Some(step),
            _ => None,
        };
        DueTicks {
            ticks: Ticks::new(config.schedule.clone(), op.rate)
                .enumerate()
                .peekable(),
            done: false,
            start: start.into_std(),
            phase,
            duration: config.duration,
            step,
        }
    }

    /// Hands every tick due by `now` (less [`TIMER_SLACK`]) to `issue`, with
    /// its index, intended start and step slice.
    fn take_due(
        &mut self,
        now: std::time::Instant,
        mut issue: impl FnMut(u64, std::time::Instant, Option<usize>),
    ) {
        if self.done {
            return;
        }
        while let Some(&(i, offset)) = self.ticks.peek() {
            let at = offset + self.phase;
            if at >= self.duration {
                self.done = true;
                return;
            }
            if self.start + at > now + TIMER_SLACK {
                return;
            }
            self.ticks.next();
            let slice = self
                .step
                .map(|s| (offset.as_secs_f64() / s.as_secs_f64()) as usize);
            issue(i as u64, self.start + at, slice);
        }
    }

    /// When the alarm must ring for the next tick; `None` once the schedule is over.
    fn next_due(&mut self) -> Option<std::time::Instant> {
        if self.done {
            return None;
        }
        let &(_, offset) = self.ticks.peek()?;
        Some(
            (self.start + offset + self.phase)
                .checked_sub(TIMER_SLACK)
                .unwrap_or(self.start),
        )
    }
}

/// The driver's alarm clock: a timerfd (CLOCK_MONOTONIC, like `Instant`)
/// registered with the runtime's epoll.
struct Alarm {
    fd: AsyncFd<OwnedFd>,
    /// When it is set to ring; `None` after a ring.
    armed: Option<std::time::Instant>,
    /// When it last rang, as set (not when the thread woke: overshoots must not add up).
    last_ring: Option<std::time::Instant>,
}

impl Alarm {
    fn new() -> std::io::Result<Alarm> {
        let fd = rustix::time::timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // tokio deprecated the safe constructors because a `T: AsRawFd` could
        // close or swap its fd while registered; an `OwnedFd` owned by the
        // `AsyncFd` (only ever lent out shared) cannot, which is the contract
        // of the `unsafe` replacement this crate may not call.
        #[allow(deprecated)]
        let fd = AsyncFd::with_interest(fd, tokio::io::Interest::READABLE)?;
        Ok(Alarm {
            fd,
            armed: None,
            last_ring: None,
        })
    }

    /// Rings at `due`, but not sooner than [`MIN_WAKE_GAP`] after the last
    /// ring. Ticks and deadlines only move forward, so an alarm already set
    /// for no later (an earlier tick the driver issued on its own) is left as
    /// it is: one `settime` per ring.
    fn arm(&mut self, due: std::time::Instant) -> std::io::Result<()> {
        let at = self
            .last_ring
            .map_or(due, |last| due.max(last + MIN_WAKE_GAP));
        if self.armed.is_some_and(|armed| armed <= at) {
            return Ok(());
        }
        // A zero value would disarm the timer: ring at once instead.
        let wait = at
            .saturating_duration_since(std::time::Instant::now())
            .max(Duration::from_nanos(1));
        let value = Timespec {
            tv_sec: wait.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: wait.subsec_nanos().into(),
        };
        rustix::time::timerfd_settime(
            &self.fd,
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value: value,
            },
        )?;
        self.armed = Some(at);
        Ok(())
    }

    /// `Ready` once per ring; `Pending` (with the waker registered) otherwise.
    fn poll_ring(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let mut ready = match self.fd.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                // The fd cannot fail short of a closed runtime; a ring keeps the driver going.
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(guard)) => guard,
            };
            let mut expirations = [0u8; 8];
            match rustix::io::read(self.fd.get_ref(), &mut expirations) {
                Ok(_) => {
                    self.last_ring = self.armed.take();
                    return Poll::Ready(());
                }
                Err(rustix::io::Errno::AGAIN) => ready.clear_ready(),
                Err(_) => return Poll::Ready(()),
            }
        }
    }
}

/// One scheduled request, recorded when it ends.
async fn request(
    op: &OpSpec,
    ctx: &RunCtx,
    client: &Client<'_>,
    rec: &OpRecorder,
    i: u64,
    intended: Instant,
    slice: Option<usize>,
) {
    match execute(op, ctx, client, i).await {
        Some(sent) => {
            let latency = intended.elapsed();
            rec.record(&sent.outcome, latency, ctx.config.send.honor_retry_after);
            if let Some(k) = slice {
                rec.record_slice(k, &sent.outcome, latency);
            }
        }
        None => rec.skip_one(),
    }
}

/// Performs the `i`-th request of `op`: a paged LIST follows `continue` to the
/// end and counts as one request. `None` when there is nothing to do.
async fn execute(op: &OpSpec, ctx: &RunCtx, client: &Client<'_>, i: u64) -> Option<Sent> {
    let opts = &ctx.config.send;
    match &op.kind {
        OpKind::List { limit, rv, .. } => {
            let want_meta = limit.is_some() || *rv == crate::ops::ListRv::Exact;
            let exact = ctx
                .last_rv
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let mut planned = op.plan(i, exact.as_deref(), None)?;
            let base_path = planned.path.clone();
            let mut total = Outcome::default();
            loop {
                let sent = client.send(&planned, opts, want_meta).await;
                merge(&mut total, sent.outcome);
                let Some(meta) = sent.list_meta.filter(|_| total.is_success()) else {
                    return Some(Sent {
                        outcome: total,
                        list_meta: None,
                    });
                };
                if !meta.resource_version.is_empty() {
                    *ctx.last_rv.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(meta.resource_version.clone());
                }
                if meta.continue_token.is_empty() || limit.is_none() {
                    return Some(Sent {
                        outcome: total,
                        list_meta: Some(meta),
                    });
                }
                planned.path = continue_path(&base_path, &meta.continue_token);
            }
        }
        OpKind::Delete => {
            let name = ctx.created.pop()?;
            let planned = op.plan(i, None, Some(&name))?;
            Some(client.send(&planned, opts, false).await)
        }
        OpKind::Create => {
            if ctx.creations.fetch_add(1, Ordering::Relaxed) >= ctx.config.max_objects {
                return None;
            }
            let planned = op.plan(i, None, None)?;
            let sent = client.send(&planned, opts, false).await;
            if sent.outcome.is_success() {
                ctx.created.push(op.created_name(i));
            }
            Some(sent)
        }
        OpKind::Get | OpKind::Patch { .. } => {
            let planned = op.plan(i, None, None)?;
            Some(client.send(&planned, opts, false).await)
        }
    }
}

/// How a driver's requests are sent.
struct Client<'a> {
    conns: &'a Conns,
    pool: &'a h1::Pool<'a>,
    deadlines: &'a RefCell<Deadlines>,
}

impl Client<'_> {
    async fn send(&self, planned: &Planned, opts: &SendOptions, want_meta: bool) -> Sent {
        if self.conns.use_h2() {
            // Boxed: hyper's request state would make every request's future larger.
            Box::pin(send::send(self.conns, planned, opts, want_meta)).await
        } else {
            h1::send(self.pool, self.deadlines, planned, opts, want_meta).await
        }
    }
}

/// The next page of a LIST: like client-go's pager, `continue` replaces
/// `resourceVersion`/`resourceVersionMatch` (the apiserver refuses both together).
fn continue_path(base: &str, token: &str) -> String {
    let (path, query) = base.split_once('?').unwrap_or((base, ""));
    let mut params: Vec<String> = query
        .split('&')
        .filter(|kv| {
            !kv.is_empty()
                && !kv.starts_with("resourceVersion=")
                && !kv.starts_with("resourceVersionMatch=")
        })
        .map(str::to_string)
        .collect();
    params.push(format!("continue={}", crate::ops::encode(token)));
    format!("{path}?{}", params.join("&"))
}

/// Adds one page's outcome to a paged request's total.
fn merge(total: &mut Outcome, page: Outcome) {
    total.first_try_429 |= page.first_try_429 && total.status.is_none();
    total.status = page.status;
    total.error = page.error;
    total.bytes += page.bytes;
    total.retries += page.retries;
    total.server_class = page.server_class;
    total.rejection = page.rejection;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_drops_the_resource_version() {
        assert_eq!(
            continue_path("/api/v1/pods?labelSelector=a%3Db&resourceVersion=7&resourceVersionMatch=Exact&limit=2", "t/1"),
            "/api/v1/pods?labelSelector=a%3Db&limit=2&continue=t%2F1"
        );
        assert_eq!(
            continue_path("/api/v1/pods", "x"),
            "/api/v1/pods?continue=x"
        );
    }
}
