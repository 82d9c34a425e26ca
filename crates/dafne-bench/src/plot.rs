//! SVG line charts of a [`Figure`]: what `dafne bench seeds` draws beside
//! each paper's figure.
//!
//! A plot is a plain SVG file written from the points, with no plotting
//! dependency: axes with rounded ticks (the x axis on a log₂ scale where
//! the figure asks, as access sizes and client counts double), one
//! polyline with markers per series, and a legend. Browsers and GitHub
//! render it as is.

use std::fmt::Write as _;

use crate::seed::Figure;

/// The plot area's width; the legend's column is added to it.
const PLOT_WIDTH: f64 = 460.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 72.0;
const TOP: f64 = 40.0;
/// About the width of one character of the 12 px sans-serif text.
const CHAR: f64 = 6.8;
const BOTTOM: f64 = 56.0;
const COLOURS: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
/// Dash patterns, one per round through the colours, so no two series of
/// a figure look alike.
const DASHES: [&str; 3] = ["", "6 3", "2 2"];

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A "nice" step (1, 2 or 5 × 10ⁿ) giving about `ticks` intervals over `span`.
fn nice_step(span: f64, ticks: f64) -> f64 {
    let raw = (span / ticks).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// A tick label: integers plainly, sizes in powers of two as K/M when
/// `bytes` (a log₂ axis of byte counts) and the value is at least 1024.
fn label(v: f64, bytes: bool) -> String {
    if bytes && v >= 1024.0 && v.fract() == 0.0 {
        let n = v as u64;
        if n.is_multiple_of(1 << 20) {
            return format!("{}M", n >> 20);
        }
        if n.is_multiple_of(1 << 10) {
            return format!("{}K", n >> 10);
        }
    }
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Draws `fig` as an SVG document. Points that are not finite, and x ≤ 0
/// on a log axis, are left out; a figure with no point left gets its
/// frame and a "no data" note.
pub fn svg(fig: &Figure) -> String {
    let log2 = fig.log_x;
    let log10 = fig.log_y;
    let keep = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!log2 || x > 0.0) && (!log10 || y > 0.0);
    let pts: Vec<(f64, f64)> = fig.series.iter().flat_map(|s| s.points.iter().copied().filter(keep)).collect();
    let tx = |x: f64| if log2 { x.log2() } else { x };
    let ty = |y: f64| if log10 { y.log10() } else { y };
    let (mut x0, mut x1) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(tx(p.0)), b.max(tx(p.0))));
    if pts.is_empty() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    // The y range in axis units (log₁₀ of the values on a log axis: whole
    // decades; else from 0, or below it, to a nice step above the top).
    let (ylo, yhi, yticks): (f64, f64, Vec<f64>) = if log10 {
        let lo = pts.iter().map(|p| p.1.log10()).fold(f64::MAX, f64::min);
        let hi = pts.iter().map(|p| p.1.log10()).fold(f64::MIN, f64::max);
        let (lo, hi) = if pts.is_empty() { (0.0, 1.0) } else { (lo.floor(), hi.ceil().max(lo.floor() + 1.0)) };
        (lo, hi, (lo as i32..=hi as i32).map(|e| e as f64).collect())
    } else {
        let y1 = pts.iter().fold(0f64, |m, p| m.max(p.1));
        let y0 = pts.iter().fold(0f64, |m, p| m.min(p.1));
        let step = nice_step((y1 - y0).max(1e-9), 5.0);
        let (lo, hi) = ((y0 / step).floor() * step, ((y1 / step).ceil() * step).max(step));
        let n = ((hi - lo) / step).round() as i32;
        (lo, hi, (0..=n).map(|i| lo + i as f64 * step).collect())
    };
    // The legend's column is as wide as its longest name (SVG text does
    // not wrap), the title's font as small as it must be to fit.
    let longest = fig.series.iter().map(|s| s.name.chars().count()).max().unwrap_or(0) as f64;
    let legend = (longest * CHAR + 40.0).clamp(90.0, 480.0);
    let pw = PLOT_WIDTH;
    let width = LEFT + pw + legend;
    let title_size = (14.0f64).min((width - 16.0) / (fig.title.chars().count().max(1) as f64 * 0.62)).max(8.0);
    let ph = HEIGHT - TOP - BOTTOM;
    // Sizes as K/M only on a log₂ axis that says it counts bytes.
    let bytes = log2 && fig.x_label.contains("bytes");
    let px = |x: f64| LEFT + (tx(x) - x0) / (x1 - x0) * pw;
    // `py` takes axis units (already log₁₀ on a log axis).
    let py = |t: f64| TOP + ph - (t - ylo) / (yhi - ylo) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{HEIGHT}" viewBox="0 0 {width:.0} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="22" text-anchor="middle" font-size="{title_size:.1}" font-weight="bold">{}</text>"#,
        width / 2.0,
        esc(&fig.title)
    );
    // Y grid and ticks (decades on a log axis).
    for &t in &yticks {
        let yy = py(t);
        let v = if log10 { 10f64.powf(t) } else { t };
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            yy + 4.0,
            label(v, false)
        );
    }
    // X ticks: every power of two on a log axis (thinned to at most 10),
    // else nice steps.
    let mut xt: Vec<f64> = Vec::new();
    if log2 {
        let (a, b) = (x0.floor() as i32, x1.ceil() as i32);
        let every = (((b - a) as f64 / 10.0).ceil() as i32).max(1);
        xt.extend((a..=b).filter(|e| (e - a) % every == 0).map(|e| 2f64.powi(e)).filter(|&v| {
            let t = v.log2();
            t >= x0 - 1e-9 && t <= x1 + 1e-9
        }));
    } else {
        let step = nice_step(x1 - x0, 6.0);
        let mut v = (x0 / step).ceil() * step;
        while v <= x1 + step * 1e-6 {
            xt.push(v);
            v += step;
        }
    }
    for v in xt {
        let xx = px(v);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#999"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 5.0,
            TOP + ph + 18.0,
            label(v, bytes)
        );
    }
    let _ = writeln!(s, r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        HEIGHT - 14.0,
        esc(&fig.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + ph / 2.0,
        esc(&fig.y_label)
    );
    if pts.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#999">no data</text>"##,
            LEFT + pw / 2.0,
            TOP + ph / 2.0
        );
    }
    for (i, series) in fig.series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let dash = match DASHES[(i / COLOURS.len()) % DASHES.len()] {
            "" => String::new(),
            d => format!(r#" stroke-dasharray="{d}""#),
        };
        let p: Vec<(f64, f64)> = series.points.iter().copied().filter(keep).collect();
        if p.len() > 1 {
            let line: Vec<String> = p.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(ty(y)))).collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{c}" stroke-width="2"{dash} points="{}"/>"#,
                line.join(" ")
            );
        }
        for &(x, y) in &p {
            let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#, px(x), py(ty(y)));
        }
        let ly = TOP + 8.0 + i as f64 * 18.0;
        let lx = LEFT + pw + 12.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 18.0,
            lx + 24.0,
            ly + 4.0,
            esc(&series.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seed::Series;

    fn fig(log_x: bool, series: Vec<Series>) -> Figure {
        Figure {
            id: "t".into(),
            title: "A <title> & more".into(),
            x_label: "access size (bytes)".into(),
            y_label: "MiB/s".into(),
            log_x,
            log_y: false,
            series,
        }
    }

    #[test]
    fn draws_every_point_and_escapes_text() {
        let f = fig(
            true,
            vec![
                Series { name: "unifier".into(), points: vec![(4096.0, 100.0), (65536.0, 900.0), (1048576.0, 1200.0)] },
                Series { name: "normal".into(), points: vec![(4096.0, 50.0), (1048576.0, 600.0)] },
            ],
        );
        let s = svg(&f);
        assert_eq!(s.matches("<circle").count(), 5);
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("A &lt;title&gt; &amp; more"));
        assert!(s.contains(">4K<") && s.contains(">1M<"), "log₂ ticks labelled as sizes: {s}");
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
    }

    #[test]
    fn long_names_widen_the_legend_and_other_axes_keep_plain_numbers() {
        let name = "a long series name that would be cut off in a fixed column";
        let mut f = fig(true, vec![Series { name: name.into(), points: vec![(4.0, 1.0), (1024.0, 2.0)] }]);
        f.x_label = "block size (KiB)".into();
        let s = svg(&f);
        let width: f64 = s.split("width=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        assert!(width >= LEFT + PLOT_WIDTH + name.len() as f64 * CHAR, "{width}");
        assert!(s.contains(">1024<") && !s.contains(">1K<"), "KiB values are not byte counts: {s}");
    }

    #[test]
    fn a_log_y_axis_has_decades_and_drops_nonpositive_values() {
        let mut f =
            fig(false, vec![Series { name: "cpu".into(), points: vec![(1.0, 120.0), (2.0, 55_000.0), (3.0, 0.0)] }]);
        f.log_y = true;
        let s = svg(&f);
        assert_eq!(s.matches("<circle").count(), 2, "0 has no place on a log axis: {s}");
        for decade in [">100<", ">1000<", ">10000<", ">100000<"] {
            assert!(s.contains(decade), "{decade} tick missing: {s}");
        }
    }

    #[test]
    fn eleven_series_do_not_repeat_a_look() {
        let series =
            (0..11).map(|i| Series { name: format!("s{i}"), points: vec![(1.0, 1.0), (2.0, i as f64)] }).collect();
        let s = svg(&fig(false, series));
        assert_eq!(s.matches("stroke-dasharray").count(), 2, "the 11th series is dashed, line and legend: {s}");
    }

    #[test]
    fn bad_points_are_left_out_and_empty_figures_still_draw() {
        let f = fig(
            true,
            vec![Series { name: "x".into(), points: vec![(0.0, 1.0), (2.0, f64::NAN), (4.0, f64::INFINITY)] }],
        );
        let s = svg(&f);
        assert_eq!(s.matches("<circle").count(), 0);
        assert!(s.contains("no data"));
        assert!(!s.contains("NaN") && !s.contains("inf"), "{s}");
        let one = fig(false, vec![Series { name: "x".into(), points: vec![(3.0, 7.0)] }]);
        let s = svg(&one);
        assert_eq!(s.matches("<circle").count(), 1);
        assert!(!s.contains("NaN"), "{s}");
    }
}
