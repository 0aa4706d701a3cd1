//! A LIST's response relayed in large writes. kube-apiserver sends a response as HTTP/2 DATA
//! frames of 4 KiB (Go's HTTP/2 write buffer), and each frame relayed on its own is a TLS record
//! and a `writev` to the client. The frames that are ready together (a read of the upstream
//! socket decodes several: [`super::read_ahead`]) are joined, up to [`MAX_JOIN`], into one
//! frame: one write of a few records instead of a write per 4 KiB. Nothing waits for more: a
//! frame not yet there is not waited for.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

/// The most bytes one joined frame holds: four of TLS's largest records.
pub const MAX_JOIN: usize = 64 * 1024;

/// `inner`'s data frames, the ready ones joined.
#[derive(Debug)]
pub struct Coalesce<B: Body> {
    inner: B,
    /// A frame or error that came after data that was joined, given next.
    next: Option<Result<Frame<Bytes>, B::Error>>,
    ended: bool,
}

impl<B: Body> Coalesce<B> {
    pub fn new(inner: B) -> Self {
        Coalesce {
            inner,
            next: None,
            ended: false,
        }
    }
}

impl<B> Body for Coalesce<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if let Some(next) = this.next.take() {
            return Poll::Ready(Some(next));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        let first = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let first = match first.into_data() {
            Ok(data) if data.len() < MAX_JOIN => data,
            Ok(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
            Err(frame) => return Poll::Ready(Some(Ok(frame))),
        };
        let mut joined: Option<BytesMut> = None;
        while !this.inner.is_end_stream() {
            let len = joined.as_ref().map_or(first.len(), BytesMut::len);
            if len >= MAX_JOIN {
                break;
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => joined
                        .get_or_insert_with(|| {
                            let mut b = BytesMut::with_capacity(MAX_JOIN.max(first.len()));
                            b.extend_from_slice(&first);
                            b
                        })
                        .extend_from_slice(&data),
                    Err(frame) => {
                        this.next = Some(Ok(frame));
                        break;
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    this.next = Some(Err(e));
                    break;
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        let data = joined.map_or(first, BytesMut::freeze);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.next.is_none() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use std::convert::Infallible;

    type Frames = Vec<Result<Frame<Bytes>, &'static str>>;
    type Listed = StreamBody<
        futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, &'static str>>>,
    >;

    fn body(frames: Frames) -> Listed {
        StreamBody::new(futures_util::stream::iter(frames))
    }

    async fn frames<B: Body<Data = Bytes> + Unpin>(mut b: B) -> Vec<Result<Frame<Bytes>, B::Error>>
    where
        B::Error: Unpin,
    {
        let mut out = Vec::new();
        while let Some(f) = b.frame().await {
            out.push(f);
        }
        out
    }

    #[tokio::test]
    async fn ready_frames_are_joined_up_to_the_limit_and_nothing_is_lost() {
        let chunk = Bytes::from(vec![1u8; 4096]);
        let n = 40; // 160 KiB: two full joins and the rest
        let got = frames(Coalesce::new(body(
            (0..n).map(|_| Ok(Frame::data(chunk.clone()))).collect(),
        )))
        .await;
        let sizes: Vec<usize> = got
            .iter()
            .map(|f| f.as_ref().expect("ok").data_ref().expect("data").len())
            .collect();
        assert_eq!(sizes, vec![MAX_JOIN, MAX_JOIN, 4096 * n - 2 * MAX_JOIN]);
    }

    #[tokio::test]
    async fn trailers_and_errors_keep_their_place_after_the_data() {
        let d = |s: &'static str| Ok(Frame::data(Bytes::from_static(s.as_bytes())));
        let got = frames(Coalesce::new(body(vec![
            d("ab"),
            d("cd"),
            Ok(Frame::trailers(http::HeaderMap::new())),
            d("ef"),
            Err("cut"),
            d("never"),
        ])))
        .await;
        let shown: Vec<String> = got
            .iter()
            .map(|f| match f {
                Ok(f) if f.is_data() => String::from_utf8_lossy(f.data_ref().expect("data")).into(),
                Ok(_) => "trailers".into(),
                Err(e) => format!("error {e}"),
            })
            .collect();
        assert_eq!(shown, vec!["abcd", "trailers", "ef", "error cut", "never"]);
    }

    #[tokio::test]
    async fn a_frame_not_yet_there_is_not_waited_for() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            );
        let mut b = Coalesce::new(StreamBody::new(Box::pin(stream)));
        tx.send(Ok(Frame::data(Bytes::from_static(b"one"))))
            .await
            .expect("send");
        let first = b.frame().await.expect("frame").expect("ok");
        assert_eq!(
            first.data_ref().expect("data").as_ref(),
            b"one",
            "given at once"
        );
        tx.send(Ok(Frame::data(Bytes::from_static(b"two"))))
            .await
            .expect("send");
        drop(tx);
        let second = b.frame().await.expect("frame").expect("ok");
        assert_eq!(second.data_ref().expect("data").as_ref(), b"two");
        assert!(b.frame().await.is_none());
    }
}
