//! `loadgen merge DIR...`: combines the `--output` directories of
//! `--shard i/N` runs into one. Counts add up; latency percentiles come from
//! the merged HDR histograms (not averaged). Per-class, per-step and
//! per-second percentiles have no stored histograms, so their merged value is the
//! largest shard value (an upper bound).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hdrhistogram::serialization::Deserializer;
use hdrhistogram::Histogram;

use crate::output::{file_name, write_all};
use crate::record::SecondRow;
use crate::report::{ClassSummary, OperationSummary, Percentiles, Report};
use crate::watch::WatchSummary;

/// Why shard results could not be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("writing {dir}")]
    Write {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn read(path: &Path) -> Result<Vec<u8>, MergeError> {
    std::fs::read(path).map_err(|source| MergeError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Loads one `--output` directory: summary, histograms and time series.
pub fn load(dir: &Path) -> Result<Report, MergeError> {
    let path = dir.join("summary.json");
    let mut report: Report =
        serde_json::from_slice(&read(&path)?).map_err(|e| MergeError::Parse {
            path: path.clone(),
            message: e.to_string(),
        })?;
    for op in &report.operations {
        let path = dir
            .join("histograms")
            .join(format!("{}.hdr", file_name(&op.name)));
        if !path.exists() {
            continue;
        }
        let bytes = read(&path)?;
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| MergeError::Parse {
                path: path.clone(),
                message: format!("not an HdrHistogram V2 file: {e:?}"),
            })?;
        report.histograms.insert(op.name.clone(), h);
    }
    let csv_path = dir.join("timeseries.csv");
    if csv_path.exists() {
        let text = String::from_utf8_lossy(&read(&csv_path)?).to_string();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() != 11 {
                continue;
            }
            let n = |i: usize| f[i].parse::<u64>().unwrap_or(0);
            let x = |i: usize| f[i].parse::<f64>().unwrap_or(0.0);
            let row = SecondRow {
                second: n(0),
                completed: n(2),
                ok: n(3),
                rejected_429: n(4),
                errors: n(5),
                dropped: n(6),
                bytes: n(7),
                p50_ms: x(8),
                p99_ms: x(9),
                max_ms: x(10),
            };
            report.series.push((f[1].to_string(), row));
        }
    }
    Ok(report)
}

fn add_map(into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

fn max_pct(a: &Percentiles, b: &Percentiles) -> Percentiles {
    Percentiles {
        p50: a.p50.max(b.p50),
        p75: a.p75.max(b.p75),
        p90: a.p90.max(b.p90),
        p95: a.p95.max(b.p95),
        p99: a.p99.max(b.p99),
        p99_9: a.p99_9.max(b.p99_9),
        max: a.max.max(b.max),
        mean: a.mean.max(b.mean),
    }
}

fn merge_op(m: &mut OperationSummary, o: &OperationSummary) {
    m.requests += o.requests;
    m.rate_per_s += o.rate_per_s;
    m.target_rate_per_s = match (m.target_rate_per_s, o.target_rate_per_s) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
    m.ok += o.ok;
    m.dropped += o.dropped;
    m.skipped += o.skipped;
    m.cancelled += o.cancelled;
    m.errors += o.errors;
    m.bytes += o.bytes;
    m.latency_ms = max_pct(&m.latency_ms, &o.latency_ms);
    m.start_lag_ms.p99 = m.start_lag_ms.p99.max(o.start_lag_ms.p99);
    m.start_lag_ms.max = m.start_lag_ms.max.max(o.start_lag_ms.max);
    add_map(&mut m.status_codes, &o.status_codes);
    add_map(&mut m.error_classes, &o.error_classes);
    m.retries.first_try_429 += o.retries.first_try_429;
    m.retries.retries += o.retries.retries;
    m.retries.final_429 += o.retries.final_429;
    m.rejections_429_body.status_json += o.rejections_429_body.status_json;
    m.rejections_429_body.plain_text += o.rejections_429_body.plain_text;
    for st in &o.steps {
        match m.steps.iter_mut().find(|x| x.step == st.step) {
            Some(x) => {
                let errors = x.error_rate * x.requests as f64 + st.error_rate * st.requests as f64;
                let rejected = x.rate_429 * x.requests as f64 + st.rate_429 * st.requests as f64;
                x.requests += st.requests;
                x.target_rate_per_s += st.target_rate_per_s;
                x.error_rate = errors / (x.requests.max(1) as f64);
                x.rate_429 = rejected / (x.requests.max(1) as f64);
                x.latency_ms = max_pct(&x.latency_ms, &st.latency_ms);
            }
            None => m.steps.push(st.clone()),
        }
    }
    for c in &o.server_classes {
        match m.server_classes.iter_mut().find(|x| x.class == c.class) {
            Some(x) => {
                x.requests += c.requests;
                x.rejected_429 += c.rejected_429;
                x.errors += c.errors;
                x.latency_ms = max_pct(&x.latency_ms, &c.latency_ms);
            }
            None => m.server_classes.push(ClassSummary { ..c.clone() }),
        }
    }
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

/// Two shards' watch counters added.
fn add_watches(a: &WatchSummary, b: &WatchSummary) -> WatchSummary {
    WatchSummary {
        watchers: a.watchers + b.watchers,
        active_at_end: a.active_at_end + b.active_at_end,
        events: a.events + b.events,
        bookmarks: a.bookmarks + b.bookmarks,
        reconnects: a.reconnects + b.reconnects,
        relists: a.relists + b.relists,
        gone_410: a.gone_410 + b.gone_410,
        errors: a.errors + b.errors,
        stream_refusals: a.stream_refusals + b.stream_refusals,
    }
}

/// Merges shard reports (loaded with [`load`]).
pub fn merge_reports(shards: Vec<Report>) -> Report {
    let mut it = shards.into_iter();
    let Some(mut merged) = it.next() else {
        return Report {
            schema: crate::report::SCHEMA.into(),
            target: String::new(),
            started_at_unix_ms: 0,
            duration_s: 0.0,
            interrupted: false,
            schedule: String::new(),
            operations: Vec::new(),
            watches: None,
            nodes: None,
            server_metrics: Vec::new(),
            shard: None,
            histograms: BTreeMap::new(),
            series: Vec::new(),
        };
    };
    for r in it {
        merged.duration_s = merged.duration_s.max(r.duration_s);
        merged.started_at_unix_ms = merged.started_at_unix_ms.min(r.started_at_unix_ms);
        merged.interrupted |= r.interrupted;
        for o in &r.operations {
            match merged.operations.iter_mut().find(|m| m.name == o.name) {
                Some(m) => merge_op(m, o),
                None => merged.operations.push(o.clone()),
            }
        }
        for (name, h) in r.histograms {
            match merged.histograms.get_mut(&name) {
                Some(m) => {
                    // Same bounds everywhere (loadgen writes them), so this cannot fail;
                    // if a foreign file differs, keep the first shard's.
                    let _ = m.add(&h);
                }
                None => {
                    merged.histograms.insert(name, h);
                }
            }
        }
        merged.watches = match (merged.watches.take(), r.watches) {
            (Some(a), Some(b)) => Some(add_watches(&a, &b)),
            (a, b) => a.or(b),
        };
        // Shards simulate disjoint nodes: their counts add up.
        merged.nodes = match (merged.nodes.take(), r.nodes) {
            (Some(a), Some(b)) => Some(crate::nodes::NodesSummary {
                nodes: a.nodes + b.nodes,
                daemons: a.daemons + b.daemons,
                pods_bound: a.pods_bound + b.pods_bound,
                daemon_watches: add_watches(&a.daemon_watches, &b.daemon_watches),
                ..a
            }),
            (a, b) => a.or(b),
        };
        merged.server_metrics.extend(r.server_metrics);
        merged.series.extend(r.series);
    }
    merged.shard = None;
    for o in &mut merged.operations {
        if let Some(h) = merged.histograms.get(&o.name) {
            o.latency_ms = Percentiles::of(h);
        }
        o.error_rate = ratio(o.errors, o.requests);
        o.rate_429 = ratio(o.status_codes.get("429").copied().unwrap_or(0), o.requests);
        for c in &mut o.server_classes {
            c.rate_429 = ratio(c.rejected_429, c.requests);
        }
    }
    // One row per (operation, second).
    let mut rows: BTreeMap<(String, u64), SecondRow> = BTreeMap::new();
    for (name, r) in std::mem::take(&mut merged.series) {
        let e = rows.entry((name, r.second)).or_insert_with(|| SecondRow {
            second: r.second,
            ..Default::default()
        });
        e.completed += r.completed;
        e.ok += r.ok;
        e.rejected_429 += r.rejected_429;
        e.errors += r.errors;
        e.dropped += r.dropped;
        e.bytes += r.bytes;
        e.p50_ms = e.p50_ms.max(r.p50_ms);
        e.p99_ms = e.p99_ms.max(r.p99_ms);
        e.max_ms = e.max_ms.max(r.max_ms);
    }
    merged.series = rows.into_iter().map(|((name, _), r)| (name, r)).collect();
    merged
}

/// Loads `dirs`, merges them and writes the result to `out`.
pub fn merge_dirs(dirs: &[PathBuf], out: &Path) -> Result<Report, MergeError> {
    let shards = dirs
        .iter()
        .map(|d| load(d))
        .collect::<Result<Vec<_>, _>>()?;
    let merged = merge_reports(shards);
    write_all(out, &merged).map_err(|source| MergeError::Write {
        dir: out.to_path_buf(),
        source,
    })?;
    Ok(merged)
}
