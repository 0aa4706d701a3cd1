//! An `etcd:` phase: `loadgen etcd` flags (see [`crate::etcd::EtcdArgs`]) run
//! for the phase's duration; the endpoints come from the flags or from
//! `loadgen run --etcd-endpoints`.

use tokio_util::sync::CancellationToken;

use crate::report::Report;

#[derive(Debug, clap::Parser)]
#[command(name = "etcd")]
struct EtcdPhaseCli {
    #[command(flatten)]
    args: crate::etcd::EtcdArgs,
}

fn has_endpoints(args: &[String]) -> bool {
    args.iter()
        .any(|a| a == "--endpoints" || a.starts_with("--endpoints="))
}

fn parse(args: &[String], endpoints: Option<&str>) -> Result<crate::etcd::EtcdConfig, String> {
    let mut argv = vec!["etcd".to_string(), "--no-progress".to_string()];
    argv.extend(args.iter().cloned());
    if !has_endpoints(args) {
        if let Some(e) = endpoints {
            argv.extend(["--endpoints".to_string(), e.to_string()]);
        }
    }
    let cli = <EtcdPhaseCli as clap::Parser>::try_parse_from(&argv)
        .map_err(|e| e.render().to_string().trim().to_string())?;
    cli.args.into_config().map_err(|e| e.to_string())
}

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

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}
