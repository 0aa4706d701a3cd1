//! Errors turned into Kubernetes `Status` responses, in one place, each
//! tagged with where it came from (for metrics).

use apimodel::Status;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::Body;

/// Which side caused an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    /// The client sent something unusable.
    Downstream,
    /// The apiserver could not be reached or failed mid-way.
    Upstream,
    /// tollgate itself.
    Internal,
}

impl ErrorSource {
    pub const ALL: [ErrorSource; 3] = [
        ErrorSource::Downstream,
        ErrorSource::Upstream,
        ErrorSource::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorSource::Downstream => "downstream",
            ErrorSource::Upstream => "upstream",
            ErrorSource::Internal => "internal",
        }
    }
}

/// Why tollgate answered a request itself.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("malformed request: {0}")]
    BadRequest(#[from] apimodel::ParseError),
    #[error("malformed request body: {0}")]
    BadBody(String),
    #[error("no healthy upstream apiserver")]
    NoUpstream,
    #[error("upstream {upstream} failed")]
    Upstream {
        upstream: String,
        #[source]
        source: crate::BoxError,
    },
    #[error("upstream {upstream} has no room for another request: {reason}")]
    UpstreamBusy { upstream: String, reason: String },
    #[error("upstream {upstream} sent no response headers within {seconds}s")]
    Timeout { upstream: String, seconds: f64 },
    #[error(
        "no connection to upstream {upstream} (TCP connect and TLS handshake) within {seconds}s"
    )]
    ConnectTimeout { upstream: String, seconds: f64 },
    #[error("cannot build the upstream request: {0}")]
    Build(String),
}

impl ProxyError {
    pub fn source_side(&self) -> ErrorSource {
        match self {
            ProxyError::BadRequest(_) | ProxyError::BadBody(_) => ErrorSource::Downstream,
            ProxyError::NoUpstream
            | ProxyError::Upstream { .. }
            | ProxyError::UpstreamBusy { .. }
            | ProxyError::Timeout { .. }
            | ProxyError::ConnectTimeout { .. } => ErrorSource::Upstream,
            ProxyError::Build(_) => ErrorSource::Internal,
        }
    }

    /// The Status the client gets.
    pub fn to_status(&self) -> Status {
        match self {
            ProxyError::BadRequest(e) => Status::bad_request(e.to_string()),
            ProxyError::BadBody(_) => Status::bad_request(self.to_string()),
            ProxyError::NoUpstream | ProxyError::UpstreamBusy { .. } => {
                Status::service_unavailable(self.to_string())
            }
            ProxyError::Upstream { .. } => {
                Status::failure(502, "BadGateway", kubeio::error_chain(self))
            }
            ProxyError::Timeout { .. } | ProxyError::ConnectTimeout { .. } => {
                Status::timeout(self.to_string())
            }
            ProxyError::Build(_) => Status::internal(self.to_string()),
        }
    }

    pub fn into_response(self) -> Response<Body> {
        self.to_response()
    }

    pub fn to_response(&self) -> Response<Body> {
        status_response(&self.to_status())
    }
}

/// A JSON `Status` response, with `Retry-After` when the status has one.
pub fn status_response(status: &Status) -> Response<Body> {
    let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = Response::new(full(Bytes::from(status.to_json())));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(secs) = status.retry_after_seconds() {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// A whole body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_request_is_a_400_status() {
        let e = ProxyError::BadRequest(apimodel::ParseError::Method("BREW".into()));
        assert_eq!(e.source_side(), ErrorSource::Downstream);
        let resp = e.into_response();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
    }

    #[test]
    fn no_upstream_is_503() {
        let s = ProxyError::NoUpstream.to_status();
        assert_eq!(s.code, 503);
        assert_eq!(s.kind, "Status");
    }
}
