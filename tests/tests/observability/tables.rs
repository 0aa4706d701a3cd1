//! The README metrics tables against live scrapes: every documented name is exported, and
//! every exported name is documented.

use std::collections::BTreeSet;

use crate::{repo_root, LoadRun};

/// Metric names in the first markdown table after `heading` whose rows start with
/// `` | `PREFIX``.
fn documented(readme: &str, heading: &str, prefix: &str) -> anyhow::Result<BTreeSet<String>> {
    let section = readme
        .split_once(heading)
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("no {heading:?} section"))?;
    let names: BTreeSet<String> = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect();
    anyhow::ensure!(!names.is_empty(), "no {prefix} names under {heading:?}");
    Ok(names)
}

/// Metric family names in Prometheus/OpenMetrics text: the name a query uses (counters with
/// `_total`), only for families with at least one sample.
fn exported(text: &str) -> BTreeSet<String> {
    let mut types = std::collections::HashMap::new();
    for l in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        if let Some((name, kind)) = l.split_once(' ') {
            types.insert(name.to_string(), kind.to_string());
        }
    }
    let sampled: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    types
        .into_iter()
        .filter(|(name, kind)| {
            let suffixes: &[&str] = match kind.as_str() {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_count", "_sum"],
                _ => &[""],
            };
            suffixes
                .iter()
                .any(|s| sampled.contains(format!("{name}{s}").as_str()))
        })
        .map(|(name, kind)| {
            if kind == "counter" {
                format!("{name}_total")
            } else {
                name
            }
        })
        .collect()
}

#[test]
fn readme_metrics_tables_match_live_scrapes() -> anyhow::Result<()> {
    let run = LoadRun::start()?;
    let root = repo_root();
    let (tollgate, loadgen) = run.scrape()?;
    for (what, readme, heading, prefix, text) in [
        (
            "proxy/README.md",
            "proxy/README.md",
            "## Metrics",
            "tollgate_",
            &tollgate,
        ),
        (
            "loadgen/README.md",
            "loadgen/README.md",
            "## Metrics",
            "loadgen_",
            &loadgen,
        ),
    ] {
        let readme = std::fs::read_to_string(root.join(readme))?;
        let documented = documented(&readme, heading, prefix)?;
        let exported: BTreeSet<String> = exported(text)
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .collect();
        let undocumented: Vec<_> = exported.difference(&documented).collect();
        let missing: Vec<_> = documented.difference(&exported).collect();
        anyhow::ensure!(
            undocumented.is_empty() && missing.is_empty(),
            "{what}: exported but not in the table: {undocumented:?}; in the table but not in a \
             live scrape: {missing:?}\n{}",
            run.logs()
        );
    }
    Ok(())
}
