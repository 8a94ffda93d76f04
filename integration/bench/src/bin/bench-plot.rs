//! The charts of docs/benchmarks.md, drawn from the raw samples the benches write
//! (`bench::samples`): ADD latency distributions (bench-cni, bench-ambient), the 100-at-once
//! bursts as timelines, and the per-connection cost against the number of excluded CIDRs
//! (bench-conn). SVG on a white background, so they read the same in light and dark themes.
//!
//! Usage: `bench-plot <samples dir> <output dir>` — writes `bench-*.svg` for every sample file
//! present, says which are missing, and fails on a file it cannot read.

use bench::samples::{number, read};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, String>;

const SIZE: (u32, u32) = (900, 520);
const FONT: &str = "sans-serif";
/// At most this many points per CDF line: the SVGs stay small, the shape stays.
const CDF_POINTS: usize = 300;
/// Colours that read on white (Tableau 10).
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

#[derive(Clone, Copy)]
enum Kind {
    /// `series,ms`: one cumulative distribution per series, log x.
    Cdf,
    /// `burst,start_ms,end_ms`: one bar per ADD, sorted by start.
    Timeline,
    /// `method,cidrs,p50_us,p90_us`: p50 against the CIDR count, log x.
    Cidrs,
}

/// The charts: sample file, SVG, kind, title.
const CHARTS: [(&str, &str, Kind, &str); 5] = [
    (
        "cni-add.csv",
        "bench-cni-add.svg",
        Kind::Cdf,
        "Sidecar CNI ADD latency (bench-cni), cumulative",
    ),
    (
        "cni-burst.csv",
        "bench-cni-burst.svg",
        Kind::Timeline,
        "Sidecar CNI ADDs released at once (bench-cni): each ADD's start to end",
    ),
    (
        "ambient-add.csv",
        "bench-ambient-add.svg",
        Kind::Cdf,
        "Ambient ADD latency (bench-ambient), cumulative",
    ),
    (
        "ambient-burst.csv",
        "bench-ambient-burst.svg",
        Kind::Timeline,
        "Ambient ADDs released at once (bench-ambient): each ADD's start to end",
    ),
    (
        "conn-cidrs.csv",
        "bench-conn-cidrs.svg",
        Kind::Cidrs,
        "Connection setup cost against excluded CIDRs (bench-conn)",
    ),
];

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Rows grouped by their first cell, in the order each group first appears.
fn groups<T>(rows: Vec<(String, T)>) -> Vec<(String, Vec<T>)> {
    let mut out: Vec<(String, Vec<T>)> = Vec::new();
    for (k, v) in rows {
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, vs)) => vs.push(v),
            None => out.push((k, vec![v])),
        }
    }
    out
}

/// A tick label: whole numbers from 10 up, otherwise up to three significant decimals.
fn tick(v: &f64) -> String {
    if v.abs() >= 10.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A chart's frame: its title (in `size` points), margin and label areas, the same on every
/// chart.
fn frame<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
    size: u32,
) -> ChartBuilder<'a, 'static, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, (FONT, size))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(60);
    builder
}

fn area(out: &Path) -> Result<DrawingArea<SVGBackend<'_>, Shift>> {
    let root = SVGBackend::new(out, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    Ok(root)
}

/// A CDF line's style: one colour per thing measured (the label after "phase: "), thin for
/// one after another, thick for the bursts.
fn cdf_style(label: &str, whats: &mut Vec<String>) -> ShapeStyle {
    let (phase, what) = label.split_once(": ").unwrap_or(("", label));
    let i = match whats.iter().position(|w| w == what) {
        Some(i) => i,
        None => {
            whats.push(what.to_string());
            whats.len() - 1
        }
    };
    let width = if phase == "sequential" { 2 } else { 4 };
    COLORS[i % COLORS.len()].stroke_width(width)
}

/// The CDF's points, at most CDF_POINTS of them, from sorted samples.
fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len();
    let step = n.div_ceil(CDF_POINTS).max(1);
    let mut idx: Vec<usize> = (0..n).step_by(step).collect();
    if idx.last() != Some(&(n - 1)) {
        idx.push(n - 1);
    }
    idx.into_iter()
        .map(|i| (sorted[i], (i + 1) as f64 / n as f64))
        .collect()
}

fn cdf(input: &Path, out: &Path, title: &str) -> Result<()> {
    let rows = read(input, "series,ms")?
        .into_iter()
        .map(|r| Ok((r[0].clone(), number(input, &r[1])?)))
        .collect::<Result<Vec<_>>>()?;
    let mut series = groups(rows);
    for (_, v) in &mut series {
        v.sort_by(f64::total_cmp);
    }
    let all = || series.iter().flat_map(|(_, v)| v.iter().copied());
    let lo = all().fold(f64::INFINITY, f64::min).max(0.01);
    let hi = all().fold(0.0, f64::max).max(lo * 10.0);
    if series.is_empty() {
        return Err(format!("{}: no samples", input.display()));
    }
    let root = area(out)?;
    let mut chart = frame(&root, title, 22)
        .build_cartesian_2d((lo / 1.5..hi * 1.5).log_scale(), 0.0..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency of one ADD, ms (log scale)")
        .y_desc("fraction of ADDs done within x")
        .x_label_formatter(&tick)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(err)?;
    let mut whats = Vec::new();
    for (label, v) in &series {
        let style = cdf_style(label, &mut whats);
        chart
            .draw_series(LineSeries::new(cdf_points(v), style))
            .map_err(err)?
            .label(format!("{label} (n={})", v.len()))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(err)
}

fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
        .map_err(err)
}

fn timeline(input: &Path, out: &Path, title: &str) -> Result<()> {
    let rows = read(input, "burst,start_ms,end_ms")?
        .into_iter()
        .map(|r| Ok((r[0].clone(), (number(input, &r[1])?, number(input, &r[2])?))))
        .collect::<Result<Vec<_>>>()?;
    let mut bursts = groups(rows);
    for (_, v) in &mut bursts {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let n: usize = bursts.iter().map(|(_, v)| v.len()).sum();
    let end = bursts
        .iter()
        .flat_map(|(_, v)| v.iter().map(|s| s.1))
        .fold(0.0, f64::max);
    if n == 0 {
        return Err(format!("{}: no samples", input.display()));
    }
    let root = area(out)?;
    let mut chart = frame(&root, title, 20)
        // Room above the bars for the legend.
        .build_cartesian_2d(0.0..end.max(1.0) * 1.05, 0.0..n as f64 * 1.15)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time since the burst's first ADD started, ms")
        .y_desc("ADDs, one bar each, by start (first on top)")
        .x_label_formatter(&tick)
        .y_label_formatter(&|_| String::new())
        .disable_y_mesh()
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(err)?;
    let mut row = 0usize;
    for (i, (label, spans)) in bursts.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let last = spans.iter().map(|s| s.1).fold(0.0, f64::max);
        let bars = spans.iter().enumerate().map(|(j, &(s, e))| {
            let top = (n - row - j) as f64;
            Rectangle::new([(s, top), (e, top - 0.8)], color.filled())
        });
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(format!(
                "{label}: {} ADDs, the last done at {} ms",
                spans.len(),
                tick(&last)
            ))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], color.filled()));
        row += spans.len();
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(err)
}

fn cidrs(input: &Path, out: &Path, title: &str) -> Result<()> {
    let rows = read(input, "method,cidrs,p50_us,p90_us")?
        .into_iter()
        .map(|r| Ok((r[0].clone(), (number(input, &r[1])?, number(input, &r[2])?))))
        .collect::<Result<Vec<_>>>()?;
    let methods = groups(rows);
    // A log axis has no 0: zero CIDRs sit at 1.
    let x = |c: f64| c.max(1.0);
    let xmax = methods
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| x(p.0)))
        .fold(10.0, f64::max);
    let ymax = methods
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    if methods.is_empty() {
        return Err(format!("{}: no samples", input.display()));
    }
    let root = area(out)?;
    let mut chart = frame(&root, title, 22)
        .build_cartesian_2d((1.0..xmax * 1.5).log_scale(), 0.0..ymax * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("excluded CIDRs (log scale; 0 at the left edge)")
        .y_desc("connection setup, p50 µs")
        .x_label_formatter(&|v| if *v <= 1.0 { "0".into() } else { tick(v) })
        .y_label_formatter(&tick)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(err)?;
    for (i, (label, points)) in methods.iter().enumerate() {
        // The reference (one point, no rules) in grey.
        let color = match points.len() {
            1 => COLORS[COLORS.len() - 1],
            _ => COLORS[i % (COLORS.len() - 1)],
        };
        // One point (the reference without rules) is drawn as a level across the chart.
        let line: Vec<(f64, f64)> = match points.as_slice() {
            [(_, y)] => vec![(1.0, *y), (xmax * 1.5, *y)],
            _ => points.iter().map(|&(c, y)| (x(c), y)).collect(),
        };
        let style = color.stroke_width(if points.len() == 1 { 1 } else { 2 });
        chart
            .draw_series(LineSeries::new(line, style))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        if points.len() > 1 {
            let dots = points
                .iter()
                .map(|&(c, y)| Circle::new((x(c), y), 4, color.filled()));
            chart.draw_series(dots).map_err(err)?;
        }
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(err)
}

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [samples, out] = args.as_slice() else {
        eprintln!("usage: bench-plot <samples dir> <output dir>");
        std::process::exit(2);
    };
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("bench-plot: {}: {e}", out.display());
        std::process::exit(1);
    }
    let mut failed = false;
    for (file, svg, kind, title) in CHARTS {
        let (input, output) = (samples.join(file), out.join(svg));
        if !input.exists() {
            eprintln!("bench-plot: no {}, {svg} not drawn", input.display());
            continue;
        }
        let drawn = match kind {
            Kind::Cdf => cdf(&input, &output, title),
            Kind::Timeline => timeline(&input, &output, title),
            Kind::Cidrs => cidrs(&input, &output, title),
        };
        match drawn {
            Ok(()) => println!("{}", output.display()),
            Err(e) => {
                eprintln!("bench-plot: {svg}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
