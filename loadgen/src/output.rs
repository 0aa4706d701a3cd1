//! `--output DIR`: `summary.json` (see [`crate::report`] for the schema),
//! `perfdata.json` (ClusterLoader2 PerfData, readable by perfdash),
//! `timeseries.csv` (one row per second per operation) and
//! `histograms/<operation>.hdr` (HdrHistogram V2 serialization, microseconds;
//! mergeable across shards).

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use hdrhistogram::serialization::{Serializer, V2Serializer};
use serde_json::json;

use crate::report::Report;

/// Writes every output file into `dir` (created if missing).
pub fn write_all(dir: &Path, report: &Report) -> io::Result<()> {
    fs::create_dir_all(dir.join("histograms"))?;
    let summary = serde_json::to_vec_pretty(report).map_err(io::Error::other)?;
    fs::write(dir.join("summary.json"), summary)?;
    let perf = serde_json::to_vec_pretty(&perfdata(report)).map_err(io::Error::other)?;
    fs::write(dir.join("perfdata.json"), perf)?;
    fs::write(dir.join("timeseries.csv"), timeseries_csv(report))?;
    for (name, hist) in &report.histograms {
        let mut buf = Vec::new();
        V2Serializer::new()
            .serialize(hist, &mut buf)
            .map_err(|e| io::Error::other(format!("serializing histogram {name}: {e:?}")))?;
        let mut f = fs::File::create(
            dir.join("histograms")
                .join(format!("{}.hdr", file_name(name))),
        )?;
        f.write_all(&buf)?;
    }
    Ok(())
}

/// A file-system-safe form of an operation name.
pub fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// ClusterLoader2 PerfData: one data item per operation, latencies in ms.
pub fn perfdata(report: &Report) -> serde_json::Value {
    let items: Vec<serde_json::Value> = report
        .operations
        .iter()
        .map(|o| {
            json!({
                "data": {
                    "Perc50": o.latency_ms.p50,
                    "Perc90": o.latency_ms.p90,
                    "Perc99": o.latency_ms.p99,
                },
                "unit": "ms",
                "labels": {
                    "Metric": "loadgen",
                    "Operation": o.name,
                    "Verb": o.verb,
                    "Resource": o.resource,
                    "Scope": o.scope,
                    "Count": o.requests.to_string(),
                    "ErrorRate": format!("{:.6}", o.error_rate),
                    "Rate429": format!("{:.6}", o.rate_429),
                },
            })
        })
        .collect();
    // perfdash reads `version` and `dataItems`; `interrupted` says the run
    // ended early (a signal), as summary.json does.
    json!({"version": "v1", "dataItems": items, "interrupted": report.interrupted})
}

/// `second,operation,completed,ok,rejected_429,errors,dropped,bytes,p50_ms,p99_ms,max_ms`.
pub fn timeseries_csv(report: &Report) -> String {
    let mut out = String::from(
        "second,operation,completed,ok,rejected_429,errors,dropped,bytes,p50_ms,p99_ms,max_ms\n",
    );
    for (name, r) in &report.series {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3}\n",
            r.second,
            name,
            r.completed,
            r.ok,
            r.rejected_429,
            r.errors,
            r.dropped,
            r.bytes,
            r.p50_ms,
            r.p99_ms,
            r.max_ms
        ));
    }
    out
}
