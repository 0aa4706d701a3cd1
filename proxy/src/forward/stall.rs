//! Every upstream exchange bounded: how long tollgate waits for an
//! apiserver's response headers, and for the next bytes of a response body,
//! before it gives up on the exchange (issue 34: an upstream that completed
//! TLS and never answered held a watch for 100 s and more; one that sent
//! headers and stalled held watches, LISTs and GETs as long, counted as 200).
//!
//! What bound is right depends on what the apiserver does before it answers:
//!
//! | request | headers within | body: no bytes for |
//! |---|---|---|
//! | watch | `min(watchHeaderSeconds, timeoutSeconds + watchMarginSeconds)` | `timeoutSeconds + watchMarginSeconds`, else `watchIdleSeconds` |
//! | exec, attach, port-forward, followed logs | `watchHeaderSeconds` | none (see below) |
//! | anything else (LISTs, GETs, writes) | `timeouts.requestSeconds` | `bodyIdleSeconds` |
//!
//! - A watch's headers come at once on a real apiserver: it writes and
//!   flushes them before the first event (its watch server does so as the
//!   watch starts). What can delay them is a watch cache still
//!   initialising after a restart (a 5,000-node cluster's pods take tens of
//!   seconds to list), hence a default of 60 s rather than a few. A watch
//!   asking for `timeoutSeconds` is ended by the apiserver then, so nothing
//!   of it, headers or events, can legitimately come later than that plus
//!   a margin.
//! - A LIST's headers come only once the apiserver has read the whole list
//!   (from etcd, for a consistent LIST before 1.31) and begun to encode it:
//!   that may take many seconds on a large cluster, bounded by the
//!   apiserver's own `--request-timeout` (60 s), so `timeouts.requestSeconds`
//!   (70 s) bounds it as before.
//! - A body, once begun, is written as the apiserver encodes it: a LIST or
//!   a GET streams without pauses of many seconds, so `bodyIdleSeconds` of
//!   silence (counted only while tollgate waits for bytes: a client that
//!   reads slowly does not make the upstream look stalled) means a stall.
//! - A watch may be silent for as long as it lasts: a quiet resource has no
//!   events, and bookmarks (`allowWatchBookmarks`) are sent by the watch
//!   cache about once a minute only if it saw an event, never by a watch
//!   served from etcd, and "without guarantees" in the apiserver's words.
//!   So a watch's idle bound is its own `timeoutSeconds` plus the margin;
//!   without one, the apiserver ends it within twice its
//!   `--min-request-timeout` (1800 s), hence `watchIdleSeconds` of 3660 s.
//!   A dead connection under a watch is found sooner, by HTTP/2 pings
//!   (`pingIntervalSeconds`, `pingTimeoutSeconds`) and TCP keepalive.
//! - Exec, attach and port-forward are upgraded connections (a tunnel, not
//!   a body) and followed logs may be silent for hours: only the
//!   connection's liveness (pings, keepalive) bounds them.
//!
//! A header timeout is a 504 Status to the client. A body stall ends the
//! stream with an error (the client sees the body broken, never a clean
//! short end), is counted as an upstream error, under code 504 rather than
//! the 200 its headers said, and in `tollgate_upstream_stalls_total{phase}`.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use apimodel::Verb;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::context::RequestKind;

pub use crate::config::settings::forward::UpstreamTimeouts;

/// The bounds of one exchange.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// Until the response headers.
    pub headers: Duration,
    /// Without a byte of the body while waiting for one; `None`: none.
    pub idle: Option<Duration>,
}

impl Bounds {
    /// The bounds of a request of `kind` to `uri` (see the module doc's
    /// table); `request_seconds` is `timeouts.requestSeconds`.
    pub fn of(
        kind: &RequestKind,
        uri: &http::Uri,
        t: &UpstreamTimeouts,
        request_seconds: f64,
    ) -> Bounds {
        let secs = Duration::from_secs_f64;
        if kind.verb == Verb::Watch {
            let asked = watch_timeout(uri).map(|s| secs(s as f64 + t.watch_margin_seconds));
            let header = secs(t.watch_header_seconds);
            return Bounds {
                headers: asked.map_or(header, |a| a.min(header)),
                idle: Some(asked.unwrap_or_else(|| secs(t.watch_idle_seconds))),
            };
        }
        if kind.long_running {
            return Bounds {
                headers: secs(t.watch_header_seconds),
                idle: None,
            };
        }
        Bounds {
            headers: secs(request_seconds),
            idle: Some(secs(t.body_idle_seconds)),
        }
    }
}

/// A watch's `timeoutSeconds` (`0`, as the apiserver takes it, is none).
/// Read here, for watches only, rather than kept in every request's
/// context. A value that does not parse was refused by classification.
fn watch_timeout(uri: &http::Uri) -> Option<u64> {
    uri.query()?
        .split('&')
        .filter_map(|kv| kv.strip_prefix("timeoutSeconds="))
        .filter_map(|v| v.parse::<u64>().ok())
        .next_back()
        .filter(|&s| s > 0)
        // Past a day the margin no longer matters; `Duration` stays finite.
        .map(|s| s.min(86_400 * 365))
}

/// A response body from the apiserver that passed its idle bound without
/// a byte.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent no bytes of the response body for {}s", .0.as_secs_f64())]
pub struct Stalled(pub Duration);

/// Is `e`, or anything in its chain of causes, a [`Stalled`]?
pub fn is_stall(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.is::<Stalled>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Why an upstream response body ended early.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("upstream response body failed")]
    Upstream(#[source] hyper::Error),
    #[error("upstream response body stalled")]
    Stalled(#[source] Stalled),
}

/// An upstream response body with an idle bound: past `idle` without a
/// frame while it is polled (and so waited for), it ends with
/// [`BodyError::Stalled`]. The timer is allocated at the first wait only
/// (many small bodies arrive whole) and reset, not reallocated, after.
#[derive(Debug)]
pub struct IdleBody<B> {
    inner: B,
    idle: Option<Duration>,
    timer: Option<Pin<Box<Sleep>>>,
    /// The timer runs: armed at a wait, disarmed when a frame comes.
    armed: bool,
}

impl<B> IdleBody<B> {
    pub fn new(inner: B, idle: Option<Duration>) -> IdleBody<B> {
        IdleBody {
            inner,
            idle,
            timer: None,
            armed: false,
        }
    }
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes, Error = hyper::Error> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                this.armed = false;
                Poll::Ready(r.map(|f| f.map_err(BodyError::Upstream)))
            }
            Poll::Pending => {
                let Some(idle) = this.idle else {
                    return Poll::Pending;
                };
                if !this.armed {
                    let deadline = Instant::now() + idle;
                    match &mut this.timer {
                        Some(t) => t.as_mut().reset(deadline),
                        None => this.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                    this.armed = true;
                }
                match this.timer.as_mut().map(|t| t.as_mut().poll(cx)) {
                    Some(Poll::Ready(())) => {
                        // Ended here: never polled again for a frame.
                        this.idle = None;
                        this.armed = false;
                        Poll::Ready(Some(Err(BodyError::Stalled(Stalled(idle)))))
                    }
                    _ => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(verb: Verb, long_running: bool) -> RequestKind {
        RequestKind {
            verb,
            long_running,
            full_list: false,
            streams_initial_events: false,
        }
    }

    fn bounds(verb: Verb, long_running: bool, uri: &str) -> Bounds {
        let uri: http::Uri = uri.parse().expect("a URI");
        Bounds::of(
            &kind(verb, long_running),
            &uri,
            &UpstreamTimeouts::default(),
            70.0,
        )
    }

    type Frames = Vec<Result<Frame<Bytes>, hyper::Error>>;

    /// A body of `n` one-byte frames ready at once, then nothing ever.
    fn frames_then_silence(n: usize) -> impl Body<Data = Bytes, Error = hyper::Error> + Unpin {
        use futures_util::StreamExt;
        let frames: Frames = (0..n)
            .map(|_| Ok(Frame::data(Bytes::from_static(b"x"))))
            .collect();
        http_body_util::StreamBody::new(
            futures_util::stream::iter(frames).chain(futures_util::stream::pending()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_body_ends_with_a_stall_after_its_idle_bound() {
        use http_body_util::BodyExt;
        let idle = Duration::from_secs(5);
        let mut body = IdleBody::new(frames_then_silence(1), Some(idle));
        assert!(body.frame().await.is_some_and(|f| f.is_ok()));
        let waited = Instant::now();
        let end = body.frame().await.expect("an end");
        assert_eq!(
            waited.elapsed(),
            idle,
            "exactly the bound after the last byte"
        );
        let e = end.expect_err("a stall");
        assert!(is_stall(&e), "{e}");
    }

    /// Only waits count: a reader that takes its time between frames
    /// (a slow client) does not make the upstream look stalled.
    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_not_a_stall() {
        use http_body_util::BodyExt;
        let idle = Duration::from_secs(1);
        let mut body = IdleBody::new(frames_then_silence(3), Some(idle));
        for _ in 0..3 {
            assert!(body.frame().await.is_some_and(|f| f.is_ok()));
            tokio::time::sleep(10 * idle).await;
        }
        let waited = Instant::now();
        assert!(body.frame().await.is_some_and(|f| f.is_err()));
        assert_eq!(waited.elapsed(), idle);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_bound_a_silent_body_waits() {
        use http_body_util::BodyExt;
        let mut body = IdleBody::new(frames_then_silence(0), None);
        let r = tokio::time::timeout(Duration::from_secs(86_400), body.frame()).await;
        assert!(r.is_err(), "still waiting after a day");
    }

    #[test]
    fn bounds_by_kind() {
        let s = Duration::from_secs;
        let watch = bounds(Verb::Watch, true, "/api/v1/pods?watch=1&timeoutSeconds=5");
        assert_eq!(watch.headers, s(15), "timeoutSeconds + margin");
        assert_eq!(watch.idle, Some(s(15)));
        let long_watch = bounds(
            Verb::Watch,
            true,
            "/api/v1/pods?timeoutSeconds=600&watch=true",
        );
        assert_eq!(long_watch.headers, s(60), "watchHeaderSeconds when shorter");
        assert_eq!(long_watch.idle, Some(s(610)));
        for open in [
            "/api/v1/pods?watch=1",
            "/api/v1/pods?watch=1&timeoutSeconds=0",
        ] {
            let open_watch = bounds(Verb::Watch, true, open);
            assert_eq!(
                (open_watch.headers, open_watch.idle),
                (s(60), Some(s(3660))),
                "{open}"
            );
        }
        let exec = bounds(Verb::Connect, true, "/api/v1/namespaces/a/pods/p/exec");
        assert_eq!((exec.headers, exec.idle), (s(60), None));
        let list = bounds(Verb::List, false, "/api/v1/pods?timeoutSeconds=5");
        assert_eq!((list.headers, list.idle), (s(70), Some(s(30))));
    }
}
