//! Connections to etcd: one client per operation (each its own HTTP/2
//! connection), checked by a Status call before any load, and the mapping of
//! etcd-client's errors onto the recorder's outcomes.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, KvClient};

use super::EtcdError;
use crate::record::{ErrorClass, Outcome};

/// Largest response decoded: a whole-prefix range of 150k pods is ~500 MB;
/// etcd-client's default (4 MB) would fail every large range.
const MAX_MESSAGE: usize = 1 << 30;
/// How long the first connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client on `endpoints`, after one Status call answered (within `timeout`, at most 10 s).
pub(crate) async fn client(endpoints: &[String], timeout: Duration) -> Result<Client, EtcdError> {
    let unreachable = |reason: String| EtcdError::Unreachable {
        endpoints: endpoints.join(","),
        reason,
    };
    let opts = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
    let mut client = Client::connect(endpoints, Some(opts))
        .await
        .map_err(|e| unreachable(chain(&e)))?;
    let limit = timeout.min(Duration::from_secs(10));
    match tokio::time::timeout(limit, client.status()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(unreachable(chain(&e))),
        Err(_) => Err(unreachable(format!(
            "no answer to a Status call within {limit:?}"
        ))),
    }
}

/// The client's KV service, allowed to decode large ranges.
pub(crate) fn kv(client: &Client) -> KvClient {
    client.kv_client().max_decoding_message_size(MAX_MESSAGE)
}

/// An error and its causes, `: `-separated (tonic hides the useful part in sources).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        source = cause.source();
    }
    s
}

/// A successful call that moved `bytes`.
pub(crate) fn ok(bytes: u64) -> Outcome {
    Outcome {
        status: Some(200),
        bytes,
        ..Default::default()
    }
}

/// A timed-out call.
pub(crate) fn timed_out() -> Outcome {
    Outcome {
        error: Some(ErrorClass::Timeout),
        ..Default::default()
    }
}

/// A failed call, as an HTTP status (grpc-gateway's mapping) or an error class.
pub(crate) fn failed(e: &etcd_client::Error) -> Outcome {
    use tonic::Code;
    let status = match e {
        etcd_client::Error::GRpcStatus(s) => s,
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            return Outcome {
                error: Some(ErrorClass::Connection),
                ..Default::default()
            }
        }
        _ => {
            return Outcome {
                error: Some(ErrorClass::Protocol),
                ..Default::default()
            }
        }
    };
    // tonic reports a refused or broken connection as Unavailable too; only
    // etcd's own Unavailable (no leader, leader changed, …) is a 503.
    if status.code() == Code::Unavailable && !status.message().starts_with("etcdserver:") {
        return Outcome {
            error: Some(ErrorClass::Connection),
            ..Default::default()
        };
    }
    let code = match status.code() {
        Code::Ok => 200,
        Code::Cancelled => 499,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::DeadlineExceeded => 504,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::PermissionDenied => 403,
        Code::Unauthenticated => 401,
        Code::ResourceExhausted => 429,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        Code::Unknown | Code::Internal | Code::DataLoss => 500,
    };
    Outcome {
        status: Some(code),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_become_http_statuses() {
        let e = |code, msg: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg));
        use tonic::Code;
        assert_eq!(
            failed(&e(Code::ResourceExhausted, "etcdserver: too many requests")).status,
            Some(429)
        );
        assert_eq!(
            failed(&e(Code::Unavailable, "etcdserver: leader changed")).status,
            Some(503)
        );
        let refused = failed(&e(Code::Unavailable, "tcp connect error"));
        assert_eq!(
            (refused.status, refused.error),
            (None, Some(ErrorClass::Connection))
        );
        assert_eq!(failed(&e(Code::DeadlineExceeded, "x")).status, Some(504));
    }
}
