//! Hand-written inline SVG: line charts and the verdict grid. Written by hand rather than with
//! `plotters` because the charts are simple and the workspace builds on 2 shared cores: a
//! plotting crate would add build time for four kinds of shape. Everything is inline (no fonts,
//! scripts or stylesheets fetched), so the page is viewable offline.

use std::fmt::Write as _;

/// One line of a chart; its color is its position in the chart (keep an empty series in
/// place so a run has the same color in every chart).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// (x, y) points, x ascending; non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Logarithmic y axis: latencies span milliseconds to tens of seconds in one run.
    pub log_y: bool,
}

/// Colors that stay distinguishable for the usual color-vision deficiencies (Okabe–Ito).
const COLORS: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
];

const W: f64 = 720.0;
const H: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 45.0;

pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A short label for an axis tick.
pub fn tick_label(v: f64) -> String {
    // Three significant digits at most: "165M", "1.5k", "0.25".
    let short = |x: f64, unit: &str| {
        let digits = if x.abs() >= 100.0 {
            0
        } else if x.abs() >= 10.0 {
            1
        } else {
            2
        };
        let s = format!("{x:.digits$}");
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        };
        format!("{s}{unit}")
    };
    let a = v.abs();
    if a >= 1e9 {
        short(v / 1e9, "G")
    } else if a >= 1e6 {
        short(v / 1e6, "M")
    } else if a >= 1e4 {
        short(v / 1e3, "k")
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        short(v, "")
    }
}

impl Chart {
    /// Whether the chart has any point to draw.
    pub fn has_points(&self) -> bool {
        self.series
            .iter()
            .any(|s| s.drawn(self.log_y).next().is_some())
    }

    /// The chart as an `<svg>` element. An empty chart says so instead of drawing axes.
    pub fn to_svg(&self) -> String {
        let mut svg = format!(
            "<svg class=\"chart\" viewBox=\"0 0 {W} {H}\" \
             width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{}\">\n\
             <text x=\"{LEFT}\" y=\"18\" font-weight=\"bold\">{}</text>\n",
            escape(&self.title),
            escape(&self.title)
        );
        if !self.has_points() {
            svg.push_str("<text x=\"70\" y=\"150\">no data</text>\n</svg>\n");
            return svg;
        }
        let frame = Frame::fit(self);
        self.axes(&mut svg, &frame);
        self.lines(&mut svg, &frame);
        svg.push_str("</svg>\n");
        svg
    }

    /// The plot's frame, ticks on both axes and the axis labels.
    fn axes(&self, svg: &mut String, f: &Frame) {
        let (pw, ph) = (f.pw, f.ph);
        let _ = writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>"
        );
        for i in 0..=4 {
            let mut x = f.x0 + (f.x1 - f.x0) * f64::from(i) / 4.0;
            if f.x1 - f.x0 >= 8.0 {
                // Whole seconds (or units) read better than 3.25.
                x = x.round();
            }
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{}</text>",
                f.sx(x),
                TOP + ph + 15.0,
                tick_label(x)
            );
        }
        let y_ticks: Vec<f64> = if self.log_y {
            (f.y0 as i32..=f.y1 as i32).map(|e| 10f64.powi(e)).collect()
        } else {
            (0..=4)
                .map(|i| f.y0 + (f.y1 - f.y0) * f64::from(i) / 4.0)
                .collect()
        };
        for y in y_ticks {
            let _ = writeln!(
                svg,
                "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{py:.1}\" y2=\"{py:.1}\" stroke=\"#eee\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
                LEFT + pw,
                LEFT - 5.0,
                f.sy(y) + 4.0,
                tick_label(y),
                py = f.sy(y),
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\
             <text x=\"14\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" \
             transform=\"rotate(-90 14 {:.1})\">{}</text>",
            LEFT + pw / 2.0,
            H - 8.0,
            escape(&self.x_label),
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            escape(&format!(
                "{}{}",
                self.y_label,
                if self.log_y { " (log)" } else { "" }
            ))
        );
    }

    /// Lines, points (circles carry a <title> with the value), legend.
    fn lines(&self, svg: &mut String, f: &Frame) {
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<(f64, f64)> = s.drawn(self.log_y).collect();
            if points.is_empty() {
                continue;
            }
            let mut d = String::new();
            for (j, (x, y)) in points.iter().enumerate() {
                let _ = write!(
                    d,
                    "{}{:.1},{:.1} ",
                    if j == 0 { "M" } else { "L" },
                    f.sx(*x),
                    f.sy(*y)
                );
            }
            let _ = writeln!(
                svg,
                "<path class=\"series\" d=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"/>",
                d.trim_end()
            );
            for (x, y) in &points {
                let _ = writeln!(
                    svg,
                    "<circle class=\"point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{color}\">\
                     <title>{}: {} = {}</title></circle>",
                    f.sx(*x),
                    f.sy(*y),
                    escape(&s.name),
                    tick_label(*x),
                    tick_label(*y)
                );
            }
            let ly = TOP + 12.0 + 16.0 * i as f64;
            let _ = writeln!(
                svg,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{color}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>",
                LEFT + f.pw + 10.0,
                ly - 9.0,
                LEFT + f.pw + 24.0,
                ly,
                escape(&s.name)
            );
        }
    }
}

/// The data ranges a chart shows (y in log10 units on a log axis) and the plot area they
/// map onto.
struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    log_y: bool,
    pw: f64,
    ph: f64,
}

impl Frame {
    /// The ranges of a chart's drawn points: y from 0 on a linear axis, whole decades on a
    /// log one, never empty.
    fn fit(chart: &Chart) -> Frame {
        let mut f = Frame {
            x0: f64::MAX,
            x1: f64::MIN,
            y0: f64::MAX,
            y1: f64::MIN,
            log_y: chart.log_y,
            pw: W - LEFT - RIGHT,
            ph: H - TOP - BOTTOM,
        };
        for (x, y) in chart.series.iter().flat_map(|s| s.drawn(chart.log_y)) {
            f.x0 = f.x0.min(x);
            f.x1 = f.x1.max(x);
            f.y0 = f.y0.min(f.ty(y));
            f.y1 = f.y1.max(f.ty(y));
        }
        if !f.log_y {
            f.y0 = f.y0.min(0.0);
        } else {
            f.y0 = f.y0.floor();
            f.y1 = f.y1.ceil();
        }
        if f.x1 - f.x0 < 1e-9 {
            f.x1 = f.x0 + 1.0;
        }
        if f.y1 - f.y0 < 1e-9 {
            f.y1 = f.y0 + 1.0;
        }
        f
    }

    fn ty(&self, y: f64) -> f64 {
        if self.log_y {
            y.max(1e-3).log10()
        } else {
            y
        }
    }

    fn sx(&self, x: f64) -> f64 {
        LEFT + (x - self.x0) / (self.x1 - self.x0) * self.pw
    }

    fn sy(&self, y: f64) -> f64 {
        TOP + self.ph - (self.ty(y) - self.y0) / (self.y1 - self.y0) * self.ph
    }
}

impl Series {
    pub fn finite_points(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
    }

    /// The points a chart draws: on a log axis, only positive values.
    fn drawn(&self, log_y: bool) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.finite_points()
            .filter(move |(_, y)| !log_y || *y > 0.0)
    }
}

/// Theodolite's figure: a cell per (load, resource) experiment, loads upwards, resources
/// across; green passed, red failed, grey not run.
pub fn verdict_grid(
    loads: &[f64],
    resources: &[f64],
    grid: &[Vec<Option<bool>>],
    load_name: &str,
    resource_name: &str,
) -> String {
    let cell = 36.0;
    let (left, top) = (90.0, 20.0);
    let w = left + cell * resources.len() as f64 + 20.0;
    let h = top + cell * loads.len() as f64 + 60.0;
    let mut svg = format!(
        "<svg class=\"grid\" viewBox=\"0 0 {w} {h}\" \
         width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"SLO verdicts\">\n"
    );
    for (li, load) in loads.iter().enumerate() {
        // Highest load at the top.
        let y = top + cell * (loads.len() - 1 - li) as f64;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
            left - 6.0,
            y + cell / 2.0 + 4.0,
            tick_label(*load)
        );
        for (ri, resource) in resources.iter().enumerate() {
            let v = grid.get(li).and_then(|row| row.get(ri)).copied().flatten();
            let (fill, mark, word) = match v {
                Some(true) => ("#7fc97f", "✓", "pass"),
                Some(false) => ("#f28e8e", "✗", "fail"),
                None => ("#e5e5e5", "·", "not run"),
            };
            let x = left + cell * ri as f64;
            let _ = writeln!(
                svg,
                "<rect class=\"verdict\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" \
                 fill=\"{fill}\" stroke=\"#fff\"><title>{} × {}: {word}</title></rect>\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"14\" text-anchor=\"middle\">{mark}</text>",
                cell,
                cell,
                tick_label(*load),
                tick_label(*resource),
                x + cell / 2.0,
                y + cell / 2.0 + 5.0
            );
        }
    }
    let yb = top + cell * loads.len() as f64;
    for (ri, resource) in resources.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{}</text>",
            left + cell * ri as f64 + cell / 2.0,
            yb + 14.0,
            tick_label(*resource)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{left}\" y=\"{:.1}\" font-size=\"12\">{} →</text>\
         <text x=\"4\" y=\"12\" font-size=\"12\">↑ {}</text>",
        yb + 34.0,
        escape(resource_name),
        escape(load_name)
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_a_path_and_a_circle_per_point() {
        let c = Chart {
            title: "p99 <ms>".into(),
            x_label: "s".into(),
            y_label: "ms".into(),
            series: vec![Series {
                name: "patch".into(),
                points: vec![(0.0, 1.0), (1.0, 100.0), (2.0, f64::NAN), (3.0, 0.0)],
            }],
            log_y: true,
        };
        let svg = c.to_svg();
        assert_eq!(svg.matches("<circle").count(), 2);
        assert_eq!(svg.matches("<path").count(), 1);
        assert!(svg.contains("p99 &lt;ms&gt;"));
        let empty = Chart {
            series: vec![],
            ..c
        };
        assert!(empty.to_svg().contains("no data"));
    }

    #[test]
    fn the_grid_has_a_cell_per_experiment() {
        let svg = verdict_grid(
            &[60.0, 120.0],
            &[1.0, 2.0, 3.0],
            &[vec![Some(true), Some(true), None], vec![Some(false)]],
            "load",
            "res",
        );
        assert_eq!(svg.matches("class=\"verdict\"").count(), 6);
        assert_eq!(svg.matches(": pass").count(), 2);
        assert_eq!(svg.matches(": fail").count(), 1);
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick_label(40_000_000.0), "40M");
        assert_eq!(tick_label(1500.0), "1500");
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(164_788_000.0), "165M");
        assert_eq!(tick_label(-9_640_000.0), "-9.64M");
        assert_eq!(tick_label(2.5), "2.5");
    }
}
