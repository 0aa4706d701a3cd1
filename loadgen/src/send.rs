//! Sending one planned request: per-attempt timeout, reading the body to its
//! end (counting bytes), understanding 429s (Kubernetes `Status` JSON or plain
//! text), the server-reported class, and client-go-like Retry-After retries.

use std::future::Future;
use std::time::Duration;

use apimodel::headers::{LANE_HEADER, PRIORITY_LEVEL_HEADER};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::conn::{classify as classify_hyper, Conns, Lease};
use crate::ops::Planned;
use crate::record::{ClassSource, ErrorClass, Outcome, RejectionBody};
use crate::target::ApiClient;

/// What sends a planned request: a driver's own [`Conns`] (the scheduled
/// operations) or the pooled [`ApiClient`] (burst, checks).
pub trait Transport: Sync {
    /// What carried the request, given back once its body was read to the end.
    type Lease: Send;
    /// Sends `planned`; the caller reads the response body.
    fn send_planned(
        &self,
        planned: &Planned,
    ) -> impl Future<Output = Result<(http::Response<Incoming>, Self::Lease), ErrorClass>> + Send;
    /// The response body was read to its end: the connection may carry another request.
    fn release(&self, lease: Self::Lease);
    /// The response was 401: the credentials may need fetching again.
    fn unauthorized(&self);
}

impl Transport for Conns {
    type Lease = Lease;

    fn send_planned(
        &self,
        planned: &Planned,
    ) -> impl Future<Output = Result<(http::Response<Incoming>, Lease), ErrorClass>> + Send {
        self.send(planned)
    }

    fn release(&self, lease: Lease) {
        Conns::release(self, lease);
    }

    fn unauthorized(&self) {
        Conns::unauthorized(self);
    }
}

impl Transport for ApiClient {
    type Lease = ();

    async fn send_planned(
        &self,
        planned: &Planned,
    ) -> Result<(http::Response<Incoming>, ()), ErrorClass> {
        let req = self
            .request(planned.method.clone(), &planned.path, planned.body.clone())
            .map_err(|_| ErrorClass::Protocol)?;
        let resp = self.send(req).await.map_err(|e| classify(&e))?;
        Ok((resp, ()))
    }

    fn release(&self, _lease: ()) {}

    fn unauthorized(&self) {
        ApiClient::unauthorized(self);
    }
}

/// Most of a 429 body kept for parsing; the rest is counted, not kept.
const MAX_KEPT_429_BODY: usize = 64 * 1024;
/// Most of a list body kept to read its `metadata` (which the apiserver writes
/// before `items`); the rest is counted, not kept, so memory stays bounded.
const MAX_KEPT_LIST_PREFIX: usize = 64 * 1024;

/// How requests are sent and retried.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Per attempt, from sending to the body's end.
    pub timeout: Duration,
    /// Retry 429s after their Retry-After, like client-go.
    pub honor_retry_after: bool,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Longest Retry-After honoured; longer ones are cut to this.
    pub max_retry_wait: Duration,
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            timeout: Duration::from_secs(60),
            honor_retry_after: false,
            max_retries: 3,
            max_retry_wait: Duration::from_secs(10),
        }
    }
}

/// `metadata.resourceVersion` and `metadata.continue` of a list response.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    pub resource_version: String,
    #[serde(default, rename = "continue")]
    pub continue_token: String,
}

#[derive(serde::Deserialize)]
struct ListEnvelope {
    #[serde(default)]
    metadata: ListMeta,
}

/// The result of one logical request.
#[derive(Debug, Clone, Default)]
pub struct Sent {
    pub outcome: Outcome,
    /// Present when asked for and the final response was a 2xx JSON list.
    pub list_meta: Option<ListMeta>,
}

/// One attempt's response, read to its end.
pub(crate) struct Attempt {
    status: u16,
    bytes: u64,
    class: Option<(ClassSource, String)>,
    retry_after: Option<Duration>,
    rejection: Option<RejectionBody>,
    list_meta: Option<ListMeta>,
}

/// Sends `planned`, retrying 429s when `opts.honor_retry_after` is set.
pub async fn send<T: Transport>(
    client: &T,
    planned: &Planned,
    opts: &SendOptions,
    want_meta: bool,
) -> Sent {
    retrying(opts, || async {
        tokio::time::timeout(opts.timeout, attempt(client, planned, want_meta))
            .await
            .unwrap_or(Err(ErrorClass::Timeout))
    })
    .await
}

/// Makes attempts (each bounded by `opts.timeout` by `attempt` itself) until
/// one is not a 429 to retry.
pub(crate) async fn retrying<F, A>(opts: &SendOptions, mut attempt: F) -> Sent
where
    F: FnMut() -> A,
    A: Future<Output = Result<Attempt, ErrorClass>>,
{
    let mut outcome = Outcome::default();
    let mut attempt_no = 0u32;
    loop {
        let a = match attempt().await {
            Err(class) => {
                outcome.error = Some(class);
                outcome.status = None;
                return Sent {
                    outcome,
                    list_meta: None,
                };
            }
            Ok(a) => a,
        };
        outcome.status = Some(a.status);
        outcome.bytes += a.bytes;
        outcome.server_class = a.class;
        outcome.rejection = a.rejection;
        if a.status == 429 && attempt_no == 0 {
            outcome.first_try_429 = true;
        }
        if a.status != 429 || !opts.honor_retry_after || attempt_no >= opts.max_retries {
            return Sent {
                outcome,
                list_meta: a.list_meta,
            };
        }
        let wait = a
            .retry_after
            .unwrap_or(Duration::from_secs(1))
            .min(opts.max_retry_wait);
        tokio::time::sleep(wait).await;
        attempt_no += 1;
        outcome.retries = attempt_no;
    }
}

/// How much of a response body is kept for reading: a 429's (its `Status`),
/// a 2xx list's start when its `metadata` is wanted, else none.
pub(crate) fn kept_limit(status: u16, want_meta: bool) -> usize {
    if status == 429 {
        MAX_KEPT_429_BODY
    } else if want_meta && (200..300).contains(&status) {
        MAX_KEPT_LIST_PREFIX
    } else {
        0
    }
}

impl Attempt {
    /// An attempt from its response: `kept` is the body's start (see [`kept_limit`]).
    pub(crate) fn new(
        status: u16,
        bytes: u64,
        class: Option<(ClassSource, String)>,
        retry_after: Option<Duration>,
        kept: &[u8],
        want_meta: bool,
    ) -> Attempt {
        let mut out = Attempt {
            status,
            bytes,
            class,
            retry_after,
            rejection: None,
            list_meta: None,
        };
        if status == 429 {
            let (kind, body_retry) = understand_429(kept);
            out.rejection = Some(kind);
            out.retry_after = out.retry_after.or(body_retry);
        } else if kept_limit(status, want_meta) > 0 {
            out.list_meta = list_meta(kept);
        }
        out
    }
}

/// One attempt over `client`'s hyper connection, the body read to its end.
pub(crate) async fn attempt<T: Transport>(
    client: &T,
    planned: &Planned,
    want_meta: bool,
) -> Result<Attempt, ErrorClass> {
    let (resp, lease) = client.send_planned(planned).await?;
    let status = resp.status().as_u16();
    if status == 401 {
        client.unauthorized();
    }
    let headers = resp.headers();
    let class = [
        (ClassSource::Lane, LANE_HEADER),
        (ClassSource::PriorityLevel, PRIORITY_LEVEL_HEADER),
    ]
    .iter()
    .find_map(|(source, h)| headers.get(*h).map(|v| (*source, v)))
    .and_then(|(source, v)| v.to_str().ok().map(|v| (source, v.to_string())));
    let header_retry_after = headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let limit = kept_limit(status, want_meta);
    let mut body = resp.into_body();
    let mut kept = Vec::new();
    let mut bytes = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| classify_hyper(&e))?;
        if let Some(data) = frame.data_ref() {
            bytes += data.len() as u64;
            let room = limit.saturating_sub(kept.len());
            if room > 0 {
                kept.extend_from_slice(&data[..data.len().min(room)]);
            }
        }
    }
    client.release(lease);
    Ok(Attempt::new(
        status,
        bytes,
        class,
        header_retry_after,
        &kept,
        want_meta,
    ))
}

/// `metadata` of a list from its body or a prefix of it: the whole body if it
/// parses, else the part before `,"items":` closed with `}`.
pub fn list_meta(prefix: &[u8]) -> Option<ListMeta> {
    if let Ok(e) = serde_json::from_slice::<ListEnvelope>(prefix) {
        return Some(e.metadata);
    }
    let marker = b",\"items\":";
    let cut = prefix.windows(marker.len()).position(|w| w == marker)?;
    let mut head = prefix[..cut].to_vec();
    head.push(b'}');
    serde_json::from_slice::<ListEnvelope>(&head)
        .ok()
        .map(|e| e.metadata)
}

/// Reads a 429 body: a Kubernetes `Status` (with `details.retryAfterSeconds`)
/// or plain text such as "Too many requests, please try again later.".
pub fn understand_429(body: &[u8]) -> (RejectionBody, Option<Duration>) {
    match serde_json::from_slice::<apimodel::status::Status>(body) {
        Ok(status) if status.kind == "Status" => {
            let retry = status
                .details
                .and_then(|d| d.retry_after_seconds)
                .map(Duration::from_secs);
            (RejectionBody::StatusJson, retry)
        }
        _ => (RejectionBody::PlainText, None),
    }
}

fn classify(e: &hyper_util::client::legacy::Error) -> ErrorClass {
    if e.is_connect() {
        return ErrorClass::Connection;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return ErrorClass::Connection;
        }
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            return classify_hyper(h);
        }
        source = s.source();
    }
    ErrorClass::Protocol
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_metadata_from_a_prefix() {
        let whole =
            br#"{"kind":"PodList","metadata":{"resourceVersion":"5","continue":"c1"},"items":[]}"#;
        let meta = list_meta(whole).expect("whole");
        assert_eq!(
            (meta.resource_version.as_str(), meta.continue_token.as_str()),
            ("5", "c1")
        );
        let cut = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[{"metadata":{"na"#;
        assert_eq!(list_meta(cut).expect("prefix").resource_version, "9");
        assert_eq!(list_meta(b"{\"items\":[{"), None);
    }

    #[test]
    fn understands_both_429_bodies() {
        let json = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"TooManyRequests","message":"slow down","details":{"retryAfterSeconds":3},"code":429}"#;
        assert_eq!(
            understand_429(json),
            (RejectionBody::StatusJson, Some(Duration::from_secs(3)))
        );
        assert_eq!(
            understand_429(b"Too many requests, please try again later.\n"),
            (RejectionBody::PlainText, None)
        );
        assert_eq!(understand_429(b""), (RejectionBody::PlainText, None));
    }
}
