//! An `etcd:` phase: `loadgen etcd` flags (see [`crate::cli::etcd::EtcdArgs`]) run
//! for the phase's duration; the endpoints come from the flags or from
//! `loadgen run --etcd-endpoints`.

use kubeio::error_chain;
use tokio_util::sync::CancellationToken;

use crate::cli::etcd::{has_endpoints, parse_phase as parse};
use crate::report::Report;

/// Checks the flags; endpoints may still come from `loadgen run --etcd-endpoints`.
pub fn check(args: &[String]) -> Result<(), String> {
    parse(args, Some("http://127.0.0.1:2379")).map(|_| ())
}

/// Runs the phase against `endpoints` unless the flags name their own.
pub async fn run(
    args: &[String],
    endpoints: Option<&str>,
    shutdown: CancellationToken,
) -> Result<Report, String> {
    if !has_endpoints(args) && endpoints.is_none() {
        return Err(
            "an etcd phase needs --endpoints in its flags or `loadgen run --etcd-endpoints URL`"
                .into(),
        );
    }
    let config = parse(args, endpoints)?;
    crate::etcd::run(config, shutdown)
        .await
        .map_err(|e| error_chain(&e))
}
