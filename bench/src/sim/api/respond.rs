//! Building responses: the body type every handler returns, JSON and Status
//! replies, and content negotiation (JSON, `as=Table`, or 406 for what we do not speak).

use apimodel::Status;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use std::convert::Infallible;

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed_unsync()
}

/// A body fed from a channel of chunks; ends when the sender is dropped.
pub fn channel_body(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Body {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    StreamBody::new(stream).boxed_unsync()
}

/// A body produced lazily by an iterator of chunks.
pub fn iter_body<I>(chunks: I) -> Body
where
    I: Iterator<Item = Bytes> + Send + 'static,
{
    let stream = futures_util::stream::iter(chunks.map(|b| Ok::<_, Infallible>(Frame::data(b))));
    StreamBody::new(stream).boxed_unsync()
}

pub fn json(code: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub fn json_value(code: StatusCode, v: &serde_json::Value) -> Response<Body> {
    json(code, serde_json::to_vec(v).unwrap_or_default())
}

/// A `Status` reply, byte for byte as kube-apiserver writes it: its JSON encoder
/// (encoding/json's `Encoder.Encode`) ends the document with a newline.
pub fn status(s: &Status) -> Response<Body> {
    let code = StatusCode::from_u16(s.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut body = s.to_json().into_bytes();
    body.push(b'\n');
    json(code, body)
}

pub fn plain(code: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(full(text));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// What kube-apiserver's max-in-flight filter answers, byte for byte.
pub fn too_many_requests() -> Response<Body> {
    let mut r = plain(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many requests, please try again later.\n",
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// The representation a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    /// `application/json;as=Table;g=meta.k8s.io;v=…`, as `kubectl get` asks; the str is the version.
    Table(&'static str),
}

/// Picks the first representation in `Accept` that we serve. `None`: nothing
/// acceptable (e.g. protobuf only), which is a 406.
pub fn negotiate(accept: Option<&str>) -> Option<Encoding> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Encoding::Json);
    };
    for clause in accept.split(',') {
        let mut parts = clause.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default();
        let params: Vec<(&str, &str)> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        let param = |k: &str| params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
        if !matches!(media, "application/json" | "application/*" | "*/*") {
            continue;
        }
        match param("as") {
            None => return Some(Encoding::Json),
            Some("Table") if param("g") == Some("meta.k8s.io") => {
                return Some(Encoding::Table(if param("v") == Some("v1beta1") {
                    "v1beta1"
                } else {
                    "v1"
                }))
            }
            // Aggregated discovery, partial metadata: not served; a later clause may be.
            Some(_) => continue,
        }
    }
    None
}

pub fn not_acceptable() -> Response<Body> {
    status(&Status::failure(
        406,
        "NotAcceptable",
        "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(None), Some(Encoding::Json));
        assert_eq!(negotiate(Some("application/json")), Some(Encoding::Json));
        assert_eq!(
            negotiate(Some("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")),
            Some(Encoding::Table("v1"))
        );
        assert_eq!(
            negotiate(Some(
                "application/vnd.kubernetes.protobuf, application/json"
            )),
            Some(Encoding::Json)
        );
        assert_eq!(negotiate(Some("application/vnd.kubernetes.protobuf")), None);
        assert_eq!(
            negotiate(Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json")),
            Some(Encoding::Json)
        );
        assert_eq!(negotiate(Some("*/*")), Some(Encoding::Json));
    }
}
