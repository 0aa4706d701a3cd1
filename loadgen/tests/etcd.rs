//! `loadgen etcd` without an etcd: bad flags and an unreachable endpoint are
//! refused with what is wrong. The tests against a real etcd (rates, ranges,
//! seeding, watches, the shipped etcd scenarios) live in the `tests` crate
//! (`tests/tests/loadgen_scenarios/etcd.rs`), whose support code starts etcd.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::net::TcpListener;
use std::process::Command;

use clap::Parser;

use loadgen::cli::etcd::EtcdArgs;
use loadgen::etcd::{EtcdConfig, EtcdError};
use tokio_util::sync::CancellationToken;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[derive(Debug, Parser)]
struct Wrap {
    #[command(flatten)]
    args: EtcdArgs,
}

fn config(args: &[&str]) -> Result<EtcdConfig, EtcdError> {
    let mut all = vec!["loadgen-etcd", "--no-progress"];
    all.extend_from_slice(args);
    Wrap::try_parse_from(all).unwrap().args.into_config()
}

#[tokio::test]
async fn an_unreachable_endpoint_is_named_in_the_error() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let err = loadgen::etcd::run(
        config(&["--endpoints", &url, "--puts", "1/s", "--timeout", "3s"]).unwrap(),
        CancellationToken::new(),
    )
    .await
    .expect_err("nothing listens there");
    assert!(matches!(err, EtcdError::Unreachable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("cannot reach etcd at {url}: ")),
        "{text}"
    );
}

#[test]
fn the_binary_refuses_bad_flags_with_what_is_wrong() {
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "etcd",
            "--endpoints",
            "http://127.0.0.1:1",
            "--puts",
            "1/s",
            "--put-size",
            "10",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--put-size: 10 bytes is too small"), "{err}");
    let help = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["etcd", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--endpoints",
        "--ranges",
        "--range-limit",
        "--serializable",
        "--puts",
        "--put-size",
        "--watches",
        "--seed",
        "--output",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
}
