//! Metrics sampled once a second while an experiment's load runs, written as
//! `second,<column>` CSV files the reports chart (`quota.csv`: tollgate's quota pool level).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::process::Scraper;
use kubeio::promtext::unlabelled;

/// (second of the run, value) pairs.
pub type Samples = Vec<(f64, f64)>;

/// Samples the unlabelled metric `name` at `url` each second until `done`. A scrape that fails
/// (the target is busy or restarting) is a missing second, not an error.
pub async fn each_second(
    scraper: Scraper,
    url: String,
    name: &'static str,
    done: CancellationToken,
) -> Samples {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = done.cancelled() => break,
        }
        let at = t0.elapsed().as_secs_f64().floor();
        if let Some(v) = scraper.text(&url).await.and_then(|t| unlabelled(&t, name)) {
            out.push((at, v));
        }
    }
    out
}

/// Writes `samples` as `second,<column>` CSV.
pub fn write_csv(path: &Path, column: &str, samples: &Samples) -> anyhow::Result<()> {
    let mut s = format!("second,{column}\n");
    for (t, v) in samples {
        s.push_str(&format!("{t},{v}\n"));
    }
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn csv_has_a_header_and_a_row_per_sample() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.csv");
        super::write_csv(
            &path,
            "quota_available_bytes",
            &vec![(0.0, 5.0), (1.0, -2.5)],
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "second,quota_available_bytes\n0,5\n1,-2.5\n");
        let read = crate::report::loadgen::read_samples(&path).unwrap();
        assert_eq!(read, vec![(0.0, 5.0), (1.0, -2.5)]);
    }
}
