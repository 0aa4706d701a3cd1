//! Measure a body where it ends: [`CountedBody`] counts the data bytes that
//! pass through it and calls its callback exactly once — at end of stream,
//! on error, or from `Drop` when the client went away first. That one
//! callback is where actual bytes feed the pattern cache and the metrics.
//!
//! For streaming lists (a watch with `sendInitialEvents=true`) it can also
//! note where the initial state ends — the bookmark annotated
//! `k8s.io/initial-events-end` — so the list part is learned, not the
//! stream's lifetime total.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use crate::predict::Completion;

/// What a body carried and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub bytes: u64,
    pub completion: Completion,
    /// From `started` (the request's arrival) to the end.
    pub elapsed: Duration,
    /// Bytes through the chunk that carried the marker, if one was watched
    /// for and seen.
    pub initial_bytes: Option<u64>,
    /// It ended with an error because the upstream stalled
    /// ([`crate::forward::stall`]).
    pub stalled: bool,
}

/// What runs where a streaming list's initial state ends.
pub type MarkerHook = Box<dyn FnOnce(u64) + Send + Sync>;

/// The annotation of the bookmark that ends a streaming list's initial state.
pub const INITIAL_EVENTS_END: &[u8] = b"k8s.io/initial-events-end";

/// Searching a stream for a marker that may straddle two chunks.
struct Marker {
    pattern: &'static [u8],
    /// The last `pattern.len() - 1` bytes seen.
    tail: Vec<u8>,
}

impl Marker {
    fn seen_in(&mut self, data: &[u8]) -> bool {
        let m = self.pattern.len();
        if m == 0 {
            return true;
        }
        let mut joint = self.tail.clone();
        joint.extend_from_slice(&data[..data.len().min(m - 1)]);
        if contains(&joint, self.pattern) || contains(data, self.pattern) {
            return true;
        }
        self.tail
            .extend_from_slice(&data[data.len().saturating_sub(m - 1)..]);
        let excess = self.tail.len().saturating_sub(m - 1);
        self.tail.drain(..excess);
        false
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len() && hay.windows(needle.len()).any(|w| w == needle)
}

/// A body wrapper that reports once.
pub struct CountedBody<B, F>
where
    F: FnOnce(Tally),
{
    inner: B,
    bytes: u64,
    started: Instant,
    /// The body was known to be empty from the start (hyper may never poll it).
    empty: bool,
    marker: Option<Marker>,
    initial_bytes: Option<u64>,
    /// Called with the bytes through the marker when it passes; dropped
    /// with the body if it never does.
    at_marker: Option<MarkerHook>,
    stalled: bool,
    on_end: Option<F>,
}

impl<B: Body, F: FnOnce(Tally)> CountedBody<B, F> {
    pub fn new(inner: B, started: Instant, on_end: F) -> Self {
        CountedBody {
            empty: inner.is_end_stream(),
            inner,
            bytes: 0,
            started,
            marker: None,
            initial_bytes: None,
            at_marker: None,
            stalled: false,
            on_end: Some(on_end),
        }
    }

    /// Also note where `pattern` first passes (see [`Tally::initial_bytes`]).
    pub fn watch_for(mut self, pattern: &'static [u8]) -> Self {
        self.marker = Some(Marker {
            pattern,
            tail: Vec::new(),
        });
        self
    }

    /// When the watched-for marker passes, call `hook` with the bytes
    /// through it (before the stream's end, which may be minutes later).
    pub fn at_marker(mut self, hook: MarkerHook) -> Self {
        self.at_marker = Some(hook);
        self
    }
}

impl<B, F: FnOnce(Tally)> CountedBody<B, F> {
    fn finish(&mut self, completion: Completion) {
        if let Some(f) = self.on_end.take() {
            f(Tally {
                bytes: self.bytes,
                completion,
                elapsed: self.started.elapsed(),
                initial_bytes: self.initial_bytes,
                stalled: self.stalled,
            });
        }
    }
}

impl<B, F> Body for CountedBody<B, F>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + 'static,
    F: FnOnce(Tally) + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                    if let Some(marker) = &mut this.marker {
                        if marker.seen_in(data) {
                            this.initial_bytes = Some(this.bytes);
                            this.marker = None;
                            if let Some(hook) = this.at_marker.take() {
                                hook(this.bytes);
                            }
                        }
                    }
                }
                if this.inner.is_end_stream() {
                    this.finish(Completion::End);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.stalled = crate::forward::is_stall(&e);
                this.finish(Completion::Error);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.finish(Completion::End);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B, F: FnOnce(Tally)> Drop for CountedBody<B, F> {
    fn drop(&mut self) {
        // Never polled to the end: the client went away, unless the body was
        // empty and hyper knew it without polling.
        let completion = if self.empty && self.bytes == 0 {
            Completion::End
        } else {
            Completion::Cancelled
        };
        self.finish(completion);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::sync::{Arc, Mutex};

    type Seen = Arc<Mutex<Vec<Tally>>>;

    fn recorder() -> (Seen, impl FnOnce(Tally) + Unpin) {
        let seen: Seen = Arc::default();
        let s = seen.clone();
        (seen, move |t| s.lock().expect("lock").push(t))
    }

    #[tokio::test]
    async fn reports_once_at_the_end_with_exact_bytes() {
        let (seen, cb) = recorder();
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from(vec![1u8; 1000]))),
            Ok(Frame::data(Bytes::from(vec![2u8; 24]))),
        ];
        let body = CountedBody::new(
            StreamBody::new(futures_util::stream::iter(chunks)),
            Instant::now(),
            cb,
        );
        let collected = body.collect().await.expect("collects").to_bytes();
        assert_eq!(collected.len(), 1024);
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].bytes, seen[0].completion), (1024, Completion::End));
    }

    #[tokio::test]
    async fn the_end_of_the_initial_state_is_found_across_chunks() {
        let (seen, cb) = recorder();
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(
                b"{ADDED}{ADDED}{BOOKMARK k8s.io/init",
            ))),
            Ok(Frame::data(Bytes::from_static(b"ial-events-end}"))),
            Ok(Frame::data(Bytes::from_static(
                b"{MODIFIED k8s.io/initial-events-end}",
            ))),
        ];
        let body = CountedBody::new(
            StreamBody::new(futures_util::stream::iter(chunks)),
            Instant::now(),
            cb,
        )
        .watch_for(INITIAL_EVENTS_END);
        body.collect().await.expect("collects");
        let t = seen.lock().expect("lock")[0];
        assert_eq!(t.initial_bytes, Some(50));
        assert_eq!(t.bytes, 86);

        let mut m = Marker {
            pattern: b"abc",
            tail: Vec::new(),
        };
        assert!(!m.seen_in(b"xxa"));
        assert!(!m.seen_in(b"b"));
        assert!(m.seen_in(b"c"));
        let mut m = Marker {
            pattern: b"abc",
            tail: Vec::new(),
        };
        assert!(m.seen_in(b"zzabczz"));
    }

    #[tokio::test]
    async fn fixed_length_body_ends_without_a_final_poll() {
        let (seen, cb) = recorder();
        let mut body =
            CountedBody::new(Full::new(Bytes::from_static(b"hello")), Instant::now(), cb);
        let frame = body.frame().await.expect("frame").expect("ok");
        assert_eq!(frame.data_ref().map(|d| d.len()), Some(5));
        drop(body);
        let seen = seen.lock().expect("lock");
        assert_eq!((seen.len(), seen[0].completion), (1, Completion::End));
    }

    #[tokio::test]
    async fn error_and_disconnect_are_reported() {
        let (seen, cb) = recorder();
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"abc"))),
            Err(std::io::Error::other("reset")),
        ];
        let body = CountedBody::new(
            StreamBody::new(futures_util::stream::iter(chunks)),
            Instant::now(),
            cb,
        );
        assert!(body.collect().await.is_err());
        assert_eq!(seen.lock().expect("lock")[0].completion, Completion::Error);
        assert_eq!(seen.lock().expect("lock")[0].bytes, 3);

        let (seen, cb) = recorder();
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"abcd"))),
            Ok(Frame::data(Bytes::from_static(b"ef"))),
        ];
        let mut body = CountedBody::new(
            StreamBody::new(futures_util::stream::iter(chunks)),
            Instant::now(),
            cb,
        );
        let _ = body.frame().await;
        drop(body);
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].bytes, seen[0].completion),
            (4, Completion::Cancelled)
        );
    }
}
