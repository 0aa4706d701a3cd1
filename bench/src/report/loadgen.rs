//! Reading what loadgen and the samplers wrote: loadgen's `timeseries.csv` (one row per second
//! per operation) and `summary.json`, and the two-column `second,value` files the demo's
//! metric samplers write (quota pool level, modeled apiserver memory); and the report of a
//! plain loadgen output directory, whose per-second charts and operations table the demo's
//! report reuses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::svg::{Chart, Series};
use super::{fmt, Block, Document, ReportError, Table};

/// One row of loadgen's `timeseries.csv`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SecondRow {
    pub second: f64,
    pub completed: f64,
    pub ok: f64,
    pub rejected_429: f64,
    pub errors: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Rows by operation name, each in time order.
pub type Timeseries = BTreeMap<String, Vec<SecondRow>>;

fn read(path: &Path) -> Result<String, ReportError> {
    std::fs::read_to_string(path).map_err(|source| ReportError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Parses `second,operation,completed,ok,rejected_429,errors,dropped,bytes,p50_ms,p99_ms,max_ms`
/// by its header's column names, so added columns do not break it.
pub fn parse_timeseries(path: &Path, text: &str) -> Result<Timeseries, ReportError> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| ReportError::Format {
                path: path.to_owned(),
                message: format!("no `{name}` column"),
            })
    };
    let (sec, op, completed, ok, r429, errors, p50, p99) = (
        col("second")?,
        col("operation")?,
        col("completed")?,
        col("ok")?,
        col("rejected_429")?,
        col("errors")?,
        col("p50_ms")?,
        col("p99_ms")?,
    );
    let mut out = Timeseries::new();
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let num = |c: usize| -> Result<f64, ReportError> {
            f.get(c)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .ok_or_else(|| ReportError::Format {
                    path: path.to_owned(),
                    message: format!("line {}: column {} is not a number", i + 2, c + 1),
                })
        };
        let name = f.get(op).copied().unwrap_or_default().to_owned();
        out.entry(name).or_default().push(SecondRow {
            second: num(sec)?,
            completed: num(completed)?,
            ok: num(ok)?,
            rejected_429: num(r429)?,
            errors: num(errors)?,
            p50_ms: num(p50)?,
            p99_ms: num(p99)?,
        });
    }
    for rows in out.values_mut() {
        rows.sort_by(|a, b| a.second.total_cmp(&b.second));
    }
    Ok(out)
}

/// A loadgen output directory as the reports use it.
#[derive(Debug, Clone)]
pub struct LoadgenRun {
    pub dir: PathBuf,
    /// `summary.json` as loadgen wrote it (kept whole: the demo's summary embeds it).
    pub summary: serde_json::Value,
    pub timeseries: Timeseries,
}

impl LoadgenRun {
    pub fn read(dir: &Path) -> Result<LoadgenRun, ReportError> {
        let summary_path = dir.join("summary.json");
        let summary: serde_json::Value =
            serde_json::from_str(&read(&summary_path)?).map_err(|e| ReportError::Format {
                path: summary_path.clone(),
                message: e.to_string(),
            })?;
        let ts_path = dir.join("timeseries.csv");
        let timeseries = if ts_path.exists() {
            parse_timeseries(&ts_path, &read(&ts_path)?)?
        } else {
            Timeseries::new()
        };
        Ok(LoadgenRun {
            dir: dir.to_owned(),
            summary,
            timeseries,
        })
    }

    /// The summary's entry for operation `name`.
    pub fn operation(&self, name: &str) -> Option<&serde_json::Value> {
        self.summary["operations"]
            .as_array()?
            .iter()
            .find(|o| o["name"] == name)
    }

    /// A latency percentile (`p50`, `p99`, …) of an operation, in ms.
    pub fn latency_ms(&self, op: &str, percentile: &str) -> Option<f64> {
        self.operation(op)?["latency_ms"][percentile].as_f64()
    }

    /// Answers of an operation with this status code.
    pub fn status_count(&self, op: &str, code: &str) -> u64 {
        self.operation(op)
            .and_then(|o| o["status_codes"][code].as_u64())
            .unwrap_or(0)
    }

    /// 2xx answers of an operation per minute of the run.
    pub fn ok_per_minute(&self, op: &str) -> f64 {
        let Some(o) = self.operation(op) else {
            return 0.0;
        };
        let ok: u64 = o["status_codes"]
            .as_object()
            .map(|codes| {
                codes
                    .iter()
                    .filter(|(c, _)| c.starts_with('2'))
                    .filter_map(|(_, n)| n.as_u64())
                    .sum()
            })
            .unwrap_or(0);
        let d = self.summary["duration_s"].as_f64().unwrap_or(0.0);
        if d > 0.0 {
            ok as f64 * 60.0 / d
        } else {
            0.0
        }
    }

    /// Failed requests of an operation other than 429s (transport errors, other 4xx, 5xx):
    /// loadgen's `errors` counts 429s too, and the reports show those on their own.
    pub fn errors(&self, op: &str) -> u64 {
        self.operation(op)
            .and_then(|o| o["errors"].as_u64())
            .unwrap_or(0)
            .saturating_sub(self.status_count(op, "429"))
    }

    /// A per-second series of one operation.
    pub fn series(&self, op: &str, name: &str, f: impl Fn(&SecondRow) -> f64) -> Series {
        Series {
            name: name.to_owned(),
            points: self
                .timeseries
                .get(op)
                .map(|rows| rows.iter().map(|r| (r.second, f(r))).collect())
                .unwrap_or_default(),
        }
    }

    /// A per-second latency series of one operation: seconds in which none of its requests
    /// completed have no latency, not a latency of 0.
    pub fn latency_series(&self, op: &str, name: &str, f: impl Fn(&SecondRow) -> f64) -> Series {
        let mut s = self.series(op, name, f);
        if let Some(rows) = self.timeseries.get(op) {
            s.points = rows
                .iter()
                .zip(s.points)
                .filter(|(r, _)| r.completed > 0.0)
                .map(|(_, p)| p)
                .collect();
        }
        s
    }

    /// A per-second series summed over every operation.
    pub fn total_series(&self, name: &str, f: impl Fn(&SecondRow) -> f64) -> Series {
        let mut by: BTreeMap<i64, f64> = BTreeMap::new();
        for rows in self.timeseries.values() {
            for r in rows {
                *by.entry(r.second as i64).or_default() += f(r);
            }
        }
        Series {
            name: name.to_owned(),
            points: by.into_iter().map(|(s, v)| (s as f64, v)).collect(),
        }
    }
}

/// A `second,value` file (header line first), as the demo's samplers write; missing file: none.
pub fn read_samples(path: &Path) -> Result<Vec<(f64, f64)>, ReportError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = read(path)?;
    Ok(text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (a, b) = l.split_once(',')?;
            Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
        })
        .collect())
}

// === the report of a loadgen run ===

/// The report of a plain loadgen output directory.
pub fn loadgen_document(lg: &LoadgenRun) -> Document {
    let ops: Vec<&String> = lg.timeseries.keys().collect();
    let per_op = |f: fn(&SecondRow) -> f64| -> Vec<Series> {
        ops.iter().map(|o| lg.latency_series(o, o, f)).collect()
    };
    let per_op_count = |f: fn(&SecondRow) -> f64| -> Vec<Series> {
        ops.iter().map(|o| lg.series(o, o, f)).collect()
    };
    Document {
        title: format!("loadgen run: {}", lg.dir.display()),
        headline: operations_table(lg),
        blocks: vec![
            chart("p99 per second", "ms", per_op(|x| x.p99_ms), true),
            chart("p50 per second", "ms", per_op(|x| x.p50_ms), true),
            chart(
                "429 answers per second",
                "429/s",
                per_op_count(|x| x.rejected_429),
                false,
            ),
            chart(
                "Errors per second (other than 429)",
                "errors/s",
                per_op_count(|x| x.errors - x.rejected_429),
                false,
            ),
        ],
    }
}

/// Per-operation figures of one loadgen run.
pub fn operations_table(lg: &LoadgenRun) -> Table {
    let mut t = Table {
        header: [
            "operation",
            "requests",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "429s",
            "errors (not 429)",
        ]
        .map(String::from)
        .to_vec(),
        rows: vec![],
    };
    for o in lg.summary["operations"].as_array().into_iter().flatten() {
        let name = o["name"].as_str().unwrap_or("?");
        let l = |p: &str| opt(o["latency_ms"][p].as_f64());
        t.rows.push(vec![
            name.to_owned(),
            o["requests"].as_u64().unwrap_or(0).to_string(),
            l("p50"),
            l("p90"),
            l("p99"),
            l("max"),
            lg.status_count(name, "429").to_string(),
            lg.errors(name).to_string(),
        ]);
    }
    t
}

/// A chart over the seconds of a run.
pub(super) fn chart(title: &str, y: &str, series: Vec<Series>, log_y: bool) -> Block {
    Block::Chart(Chart {
        title: title.into(),
        x_label: "second of the run".into(),
        y_label: y.into(),
        series,
        log_y,
    })
}

/// A figure, or a dash when there is none.
pub(super) fn opt(v: Option<f64>) -> String {
    v.map_or("–".into(), fmt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeseries_by_header() {
        let text = "second,operation,completed,ok,rejected_429,errors,dropped,bytes,p50_ms,p99_ms,max_ms\n\
                    1,patch,100,100,0,0,0,5000,9.8,40.0,50.0\n\
                    0,patch,100,99,1,0,0,5000,9.0,30.0,50.0\n\
                    0,list,2,1,1,0,0,1,900,2000,2000\n";
        let ts = parse_timeseries(Path::new("t.csv"), text).unwrap();
        assert_eq!(ts["patch"].len(), 2);
        assert_eq!(ts["patch"][0].second, 0.0, "sorted by second");
        assert_eq!(ts["list"][0].rejected_429, 1.0);
        let bad = parse_timeseries(Path::new("t.csv"), "second,operation\n");
        assert!(bad.unwrap_err().to_string().contains("completed"));
        let garbled = text.replace("9.8", "x");
        let err = parse_timeseries(Path::new("t.csv"), &garbled).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
