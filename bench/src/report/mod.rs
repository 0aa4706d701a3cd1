//! Reports (`tollgate-bench report DIR`, and the end of every capacity run and demo): one
//! self-contained HTML page with inline SVG charts (nothing fetched: it opens offline) and a
//! Markdown summary with the same numbers.
//!
//! - [`svg`]: the charts and Theodolite's verdict grid, hand-written SVG.
//! - [`loadgen`]: reading loadgen's `timeseries.csv`/`summary.json` and sampled metrics.
//! - [`demo`]: the report of a `tollgate-bench demo` directory.
//! - [`capacity`]: the report of a `tollgate-bench capacity` directory, with the sizing
//!   recommendation when the execution named cluster sizes.
//!
//! A report is a [`Document`]: a headline and sections; [`Document::html`] and
//! [`Document::markdown`] render the same content, so the two never disagree.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub mod capacity;
pub mod demo;
pub mod loadgen;
pub mod svg;

#[cfg(test)]
mod render_tests;

use svg::{escape, Chart};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{0} is neither a capacity run (capacity.json), a demo (summary.json of schema \
         tollgate.demo/v1) nor a loadgen output (summary.json and timeseries.csv)"
    )]
    Unknown(PathBuf),
}

/// A table: a header row and rows of cells (already formatted).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// One block of a report.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    Heading(String),
    Text(String),
    Table(Table),
    /// A chart: drawn in HTML, a table of its values (coarsened in time) in Markdown.
    Chart(Chart),
    /// Raw SVG for HTML (the verdict grid) with its Markdown equivalent.
    Figure {
        svg: String,
        markdown: String,
    },
    /// Preformatted text (configuration to copy).
    Code(String),
}

/// A whole report.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub title: String,
    /// The numbers a reader wants first, as a table.
    pub headline: Table,
    pub blocks: Vec<Block>,
}

/// Markdown rows of a chart: at most this many times, so a 5-minute run stays readable.
const MARKDOWN_CHART_ROWS: usize = 12;

impl Table {
    pub(crate) fn markdown(&self) -> String {
        let mut s = format!("| {} |\n|", self.header.join(" | "));
        s.push_str(&"---|".repeat(self.header.len()));
        s.push('\n');
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        s
    }

    fn html(&self, class: &str) -> String {
        let mut s = format!("<table class=\"{class}\"><thead><tr>");
        for h in &self.header {
            let _ = write!(s, "<th>{}</th>", escape(h));
        }
        s.push_str("</tr></thead><tbody>\n");
        for r in &self.rows {
            s.push_str("<tr>");
            for c in r {
                let _ = write!(s, "<td>{}</td>", escape(c));
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</tbody></table>\n");
        s
    }
}

/// A chart's values as a table: one row per time bucket (the mean over the bucket), a column
/// per series.
pub fn chart_table(chart: &Chart) -> Table {
    let xs: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.finite_points().map(|(x, _)| x))
        .collect();
    let (lo, hi) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    let mut header = vec![chart.x_label.clone()];
    header.extend(chart.series.iter().map(|s| s.name.clone()));
    if xs.is_empty() {
        return Table {
            header,
            rows: vec![],
        };
    }
    let distinct = {
        let mut v: Vec<i64> = xs.iter().map(|x| (x * 1000.0) as i64).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    let buckets = distinct.clamp(1, MARKDOWN_CHART_ROWS);
    let width = ((hi - lo) / buckets as f64).max(1e-9);
    let mut rows = Vec::new();
    for b in 0..buckets {
        let (a, z) = (lo + width * b as f64, lo + width * (b + 1) as f64);
        let last = b + 1 == buckets;
        let mut row = vec![if buckets == distinct {
            svg::tick_label(a)
        } else {
            format!("{}–{}", svg::tick_label(a), svg::tick_label(z))
        }];
        for s in &chart.series {
            let vals: Vec<f64> = s
                .finite_points()
                .filter(|(x, _)| *x >= a - 1e-9 && (*x < z - 1e-9 || last))
                .map(|(_, y)| y)
                .collect();
            row.push(if vals.is_empty() {
                "–".into()
            } else {
                svg::tick_label(vals.iter().sum::<f64>() / vals.len() as f64)
            });
        }
        rows.push(row);
    }
    Table { header, rows }
}

impl Document {
    pub fn markdown(&self) -> String {
        let mut s = format!("# {}\n\n", self.title);
        if !self.headline.header.is_empty() {
            s.push_str(&self.headline.markdown());
            s.push('\n');
        }
        for b in &self.blocks {
            match b {
                Block::Heading(h) => {
                    let _ = write!(s, "## {h}\n\n");
                }
                Block::Text(t) => {
                    let _ = write!(s, "{t}\n\n");
                }
                Block::Table(t) => {
                    s.push_str(&t.markdown());
                    s.push('\n');
                }
                Block::Chart(c) => {
                    let _ = write!(s, "**{}** ({}):\n\n", c.title, c.y_label);
                    s.push_str(&chart_table(c).markdown());
                    s.push('\n');
                }
                Block::Figure { markdown, .. } => {
                    s.push_str(markdown);
                    s.push('\n');
                }
                Block::Code(c) => {
                    let _ = write!(s, "```yaml\n{c}```\n\n");
                }
            }
        }
        s
    }

    /// The page: inline CSS and SVG only, no script, no external resource.
    pub fn html(&self) -> String {
        let mut s = format!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <title>{}</title>\n<style>\n\
             body {{ font-family: sans-serif; max-width: 960px; margin: 2em auto; color: #222; }}\n\
             table {{ border-collapse: collapse; margin: 1em 0; }}\n\
             th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}\n\
             th:first-child, td:first-child {{ text-align: left; }}\n\
             table.headline td {{ font-size: 1.2em; font-weight: bold; }}\n\
             svg {{ display: block; margin: 1em 0; font-family: sans-serif; }}\n\
             pre {{ background: #f4f4f4; padding: 1em; }}\n\
             </style></head><body>\n<h1>{}</h1>\n",
            escape(&self.title),
            escape(&self.title)
        );
        if !self.headline.header.is_empty() {
            s.push_str(&self.headline.html("headline"));
        }
        for b in &self.blocks {
            match b {
                Block::Heading(h) => {
                    let _ = writeln!(s, "<h2>{}</h2>", escape(h));
                }
                Block::Text(t) => {
                    let _ = writeln!(s, "<p>{}</p>", escape(t).replace("**", ""));
                }
                Block::Table(t) => s.push_str(&t.html("data")),
                Block::Chart(c) => s.push_str(&c.to_svg()),
                Block::Figure { svg, .. } => s.push_str(svg),
                Block::Code(c) => {
                    let _ = writeln!(s, "<pre>{}</pre>", escape(c));
                }
            }
        }
        s.push_str("</body></html>\n");
        s
    }

    /// Writes `report.html` and the Markdown (as `markdown_name`) into `dir`.
    pub fn write(&self, dir: &Path, markdown_name: &str) -> Result<PathBuf, ReportError> {
        let html = dir.join("report.html");
        for (path, text) in [
            (html.clone(), self.html()),
            (dir.join(markdown_name), self.markdown()),
        ] {
            std::fs::write(&path, text).map_err(|source| ReportError::Write { path, source })?;
        }
        Ok(html)
    }
}

/// Writes the report of `dir`, whatever produced it; returns the HTML page's path.
pub fn write_report(dir: &Path) -> Result<PathBuf, ReportError> {
    if dir.join("capacity.json").exists() || dir.join("sizing.json").exists() {
        // A capacity run keeps its own summary.md; the report's Markdown sits beside it.
        capacity::document(dir)?.write(dir, "report.md")
    } else if demo::is_demo(dir) {
        demo::document(dir)?.write(dir, "summary.md")
    } else if dir.join("summary.json").exists() {
        let run = loadgen::LoadgenRun::read(dir)?;
        loadgen::loadgen_document(&run).write(dir, "report.md")
    } else {
        Err(ReportError::Unknown(dir.to_owned()))
    }
}

/// Formats a count or measure for tables: integers without a fraction, others with 1–3 digits.
pub fn fmt(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::svg::Series;
    use super::*;

    #[test]
    fn html_and_markdown_carry_the_same_numbers() {
        let chart = Chart {
            title: "p99".into(),
            x_label: "second".into(),
            y_label: "ms".into(),
            series: vec![Series {
                name: "patch".into(),
                points: (0..30).map(|i| (f64::from(i), 10.0)).collect(),
            }],
            log_y: false,
        };
        let doc = Document {
            title: "T & <t>".into(),
            headline: Table {
                header: vec!["run".into(), "p99".into()],
                rows: vec![vec!["baseline".into(), "12.5".into()]],
            },
            blocks: vec![Block::Chart(chart.clone()), Block::Code("a: 1\n".into())],
        };
        let html = doc.html();
        assert!(html.contains("T &amp; &lt;t&gt;") && html.contains("12.5"));
        assert!(!html.contains("src=") && !html.contains("href="));
        let md = doc.markdown();
        assert!(md.contains("| baseline | 12.5 |"));
        let t = chart_table(&chart);
        assert_eq!(t.rows.len(), MARKDOWN_CHART_ROWS);
        assert!(t.rows.iter().all(|r| r[1] == "10"), "{t:?}");
    }

    #[test]
    fn numbers_are_formatted_short() {
        assert_eq!(fmt(3.0), "3");
        assert_eq!(fmt(1234.56), "1235");
        assert_eq!(fmt(12.34), "12.3");
        assert_eq!(fmt(f64::NAN), "–");
    }
}
