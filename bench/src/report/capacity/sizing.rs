//! The sizing recommendation (`sizing.json`): what each cluster size needed to sustain the
//! target load, a linear fit against size (KEP-5546's node or container count), and the
//! tollgate quota settings that follow from it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{capacity_blocks, headline_of, read_capacity, CapacityJson};
use crate::report::svg::{Chart, Series};
use crate::report::{fmt, Block, Document, ReportError, Table};

/// `sizing.json`: what each cluster size needed, and the fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sizing {
    pub execution: String,
    /// `nodes` or `containers`.
    pub unit: String,
    pub load_name: String,
    pub resource_name: String,
    /// The load the recommendation must sustain.
    pub target_load: f64,
    pub sizes: Vec<SizeNeed>,
    pub fit: Option<Fit>,
    /// Whether the resource dimension is tollgate's quota rate (`--quota-bytes-per-second`):
    /// then the fit is the quota configuration itself.
    pub resource_is_quota_rate: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SizeNeed {
    pub size: f64,
    /// The size's capacity directory, relative to the sizing one.
    pub dir: String,
    /// The least resource amount sustaining the target load (none: no amount tried did).
    pub needed: Option<f64>,
}

/// needed ≈ intercept + slope × size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fit {
    pub intercept: f64,
    pub slope: f64,
    /// Coefficient of determination (1: a perfect line; NaN written as null with one point).
    pub r2: Option<f64>,
}

/// Least squares over (size, needed); one point gives a line through the origin (needed
/// proportional to size, KEP-5546's proportional mode).
pub fn linear_fit(points: &[(f64, f64)]) -> Option<Fit> {
    match points {
        [] => None,
        [(x, y)] if *x != 0.0 => Some(Fit {
            intercept: 0.0,
            slope: y / x,
            r2: None,
        }),
        [_] => None,
        _ => {
            let n = points.len() as f64;
            let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
            let my = points.iter().map(|p| p.1).sum::<f64>() / n;
            let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
            let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
            let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
            if sxx == 0.0 {
                return None;
            }
            let slope = sxy / sxx;
            let r2 = if syy == 0.0 {
                1.0
            } else {
                sxy * sxy / (sxx * syy)
            };
            Some(Fit {
                intercept: my - slope * mx,
                slope,
                r2: Some(r2),
            })
        }
    }
}

/// From one size's outcome, the least resource amount that sustains `target_load`: demand at
/// that load, or the smallest resource whose capacity reaches it — with tollgate in front
/// (`maximises: goodput`), whose LISTs served per minute reach it: a load tollgate mostly
/// answers with 429s is not sustained.
pub fn needed(c: &CapacityJson, target_load: f64) -> Option<f64> {
    if c.metric == "demand" {
        c.values
            .iter()
            .find(|p| (p.at - target_load).abs() < 1e-9)
            .and_then(|p| p.value)
    } else {
        c.values
            .iter()
            .find(|p| p.value.is_some_and(|v| v >= target_load - 1e-9))
            .map(|p| p.at)
    }
}

/// The quota settings the fit recommends (tollgate's configuration file keys). Burst keeps
/// tollgate's default ratio of 4 s of rate.
pub fn quota_settings(s: &Sizing, fit: Fit) -> String {
    let mode = if s.unit == "containers" {
        "containerProportional"
    } else {
        "nodeProportional"
    };
    let base = fit.intercept.max(0.0).round();
    let per = fit.slope.max(0.0).round();
    // The fit measured fixed pools: in the adaptive mode (the default) these would be ceilings.
    format!(
        "quota:\n  mode: static\n  bytesPerSecond: {base}          # the fit's intercept{}\n  \
         burstBytes: {}\n  scaling:\n    mode: {mode}\n    bytesPerSecondPerUnit: {per}   # per {}\n    \
         burstBytesPerUnit: {}\n",
        if fit.intercept < 0.0 {
            " (negative, clamped to 0)"
        } else {
            ""
        },
        (base * 4.0).max(1.0),
        s.unit.trim_end_matches('s'),
        per * 4.0
    )
}

/// The report of a directory with cluster sizes: the fit, then each size's capacity report.
pub(super) fn document(dir: &Path, s: &Sizing) -> Result<Document, ReportError> {
    let mut headline = Table {
        header: vec![
            s.unit.clone(),
            format!(
                "{} needed for {} {}",
                s.resource_name,
                fmt(s.target_load),
                s.load_name
            ),
        ],
        rows: vec![],
    };
    for z in &s.sizes {
        headline
            .rows
            .push(vec![fmt(z.size), z.needed.map_or("none".into(), fmt)]);
    }
    let mut blocks = vec![Block::Heading("Sizing recommendation".into())];
    match s.fit {
        Some(f) => {
            blocks.push(Block::Text(format!(
                "Linear fit: {} needed ≈ {} + {} × {}{}.",
                s.resource_name,
                fmt(f.intercept),
                fmt(f.slope),
                s.unit,
                f.r2.map_or(" (one size: proportional)".into(), |r| format!(
                    " (R² = {r:.3})"
                ))
            )));
            let mut fit_series = Series {
                name: "fit".into(),
                points: vec![],
            };
            for z in &s.sizes {
                fit_series
                    .points
                    .push((z.size, f.intercept + f.slope * z.size));
            }
            blocks.push(Block::Chart(Chart {
                title: format!("{} needed against cluster size", s.resource_name),
                x_label: s.unit.clone(),
                y_label: s.resource_name.clone(),
                series: vec![
                    Series {
                        name: "measured".into(),
                        points: s
                            .sizes
                            .iter()
                            .filter_map(|z| Some((z.size, z.needed?)))
                            .collect(),
                    },
                    fit_series,
                ],
                log_y: false,
            }));
            if s.resource_is_quota_rate {
                blocks.push(Block::Text(
                    "Tollgate quota settings (configuration file) from the fit:".into(),
                ));
                blocks.push(Block::Code(quota_settings(s, f)));
            } else {
                blocks.push(Block::Text(format!(
                    "The resource dimension is not tollgate's quota rate; size {} as the fit says.",
                    s.resource_name
                )));
            }
        }
        None => blocks.push(Block::Text(
            "No fit: fewer than one cluster size met the target load with any resource amount tried."
                .into(),
        )),
    }
    for z in &s.sizes {
        let sub = dir.join(&z.dir);
        if let Ok(c) = read_capacity(&sub) {
            blocks.push(Block::Heading(format!("{} {}", fmt(z.size), s.unit)));
            blocks.push(Block::Table(headline_of(&c)));
            blocks.extend(capacity_blocks(
                &sub,
                &c,
                &format!("{} {}: ", fmt(z.size), s.unit),
            ));
        }
    }
    Ok(Document {
        title: format!("Capacity and sizing: {}", s.execution),
        headline,
        blocks,
    })
}
