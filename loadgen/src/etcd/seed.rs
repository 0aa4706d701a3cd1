//! `--seed N`: makes sure N keys of `--seed-size` bytes exist under
//! `RANGE-PREFIX/loadgen-seed/` before the clock starts, so a whole-prefix
//! range has something to read. Idempotent: if N keys are already there
//! (a count-only range says so), nothing is written, so a benchmark seeds
//! once and runs many times. Written in transactions of many puts, a few at
//! a time: 30,000 keys of 3.3 KB take seconds, not minutes.

use etcd_client::{Client, GetOptions, Txn, TxnOp};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use std::time::Duration;

use super::{EtcdError, SeedSpec};

/// Puts per transaction: under etcd's default `--max-txn-ops` (128).
const MAX_OPS: usize = 100;
/// Bytes per transaction: under etcd's default `--max-request-bytes` (1.5 MiB).
const MAX_TXN_BYTES: usize = 1_000_000;
/// Transactions in flight.
const PARALLEL: usize = 4;

/// The key of seeded object `i`.
pub(crate) fn key(prefix: &str, i: u64) -> String {
    format!("{prefix}pod-{i:08}")
}

/// Writes the seed unless it is already there; returns the keys written.
pub(crate) async fn seed(
    client: Client,
    spec: &SeedSpec,
    timeout: Duration,
) -> Result<u64, EtcdError> {
    let fail = |reason: String| EtcdError::Seed {
        prefix: spec.prefix.clone(),
        reason,
    };
    let mut kv = client.kv_client();
    let have = tokio::time::timeout(
        timeout,
        kv.get(
            spec.prefix.as_bytes(),
            Some(GetOptions::new().with_prefix().with_count_only()),
        ),
    )
    .await
    .map_err(|_| fail(format!("no answer to a count within {timeout:?}")))?
    .map_err(|e| fail(super::connect::chain(&e)))?
    .count();
    if u64::try_from(have).unwrap_or(0) >= spec.count {
        tracing::info!(prefix = %spec.prefix, have, "seed already in place");
        return Ok(0);
    }
    let per_txn = (MAX_TXN_BYTES / (spec.size + 64)).clamp(1, MAX_OPS) as u64;
    let batches = spec.count.div_ceil(per_txn);
    let value = super::value::encode(spec.size, crate::ops::unix_nanos(), 0);
    stream::iter(0..batches)
        .map(|b| {
            let mut kv = kv.clone();
            let value = value.clone();
            let fail = &fail;
            async move {
                let first = b * per_txn;
                let last = (first + per_txn).min(spec.count);
                let ops: Vec<TxnOp> = (first..last)
                    .map(|i| TxnOp::put(key(&spec.prefix, i), value.clone(), None))
                    .collect();
                tokio::time::timeout(timeout, kv.txn(Txn::new().and_then(ops)))
                    .await
                    .map_err(|_| fail(format!("no answer to a transaction within {timeout:?}")))?
                    .map_err(|e| fail(super::connect::chain(&e)))?;
                Ok::<u64, EtcdError>(last - first)
            }
        })
        .buffer_unordered(PARALLEL)
        .try_fold(0u64, |n, k| async move { Ok(n + k) })
        .await
}
