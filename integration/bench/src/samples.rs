//! Raw samples as small CSV files: the benches write them into `$BENCH_SAMPLES_DIR` (bench.sh
//! sets it) next to their Markdown tables, `bench-plot` reads them back. Without the variable
//! nothing is written, so a bench run by hand prints only its table.
//!
//! The files and their columns (labels never contain a comma):
//! - `cni-add.csv`, `ambient-add.csv`: `series,ms` — one ADD's latency per line;
//! - `cni-burst.csv`, `ambient-burst.csv`: `burst,start_ms,end_ms` — one ADD of a burst, its
//!   start and end since the burst's first start;
//! - `conn-cidrs.csv`: `method,cidrs,p50_us,p90_us` — connection setup against excluded CIDRs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The variable naming the directory the benches write their samples into.
pub const DIR_ENV: &str = "BENCH_SAMPLES_DIR";

/// Writes `name` into `$BENCH_SAMPLES_DIR`: the header line, then the rows. A sample file
/// that cannot be written is reported, not fatal: the bench's table is its main result.
pub fn write(name: &str, header: &str, rows: impl IntoIterator<Item = String>) {
    let Some(dir) = std::env::var_os(DIR_ENV).map(PathBuf::from) else {
        return;
    };
    let mut text = format!("{header}\n");
    for r in rows {
        text.push_str(&r);
        text.push('\n');
    }
    let path = dir.join(name);
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        eprintln!("bench: cannot write samples {}: {e}", path.display());
    }
}

/// A label safe for a CSV cell.
fn cell(label: &str) -> String {
    label.replace(',', ";")
}

/// `series,ms` rows: one per latency.
pub fn latency_rows(series: &str, d: &[Duration]) -> Vec<String> {
    let s = cell(series);
    d.iter()
        .map(|d| format!("{s},{:.3}", d.as_secs_f64() * 1e3))
        .collect()
}

/// One operation of a burst: when it started and ended.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub start: Instant,
    pub end: Instant,
}

impl Span {
    /// Runs `op`, timing it.
    pub fn time<T>(op: impl FnOnce() -> T) -> (T, Span) {
        let start = Instant::now();
        let t = op();
        (
            t,
            Span {
                start,
                end: Instant::now(),
            },
        )
    }

    pub fn elapsed(&self) -> Duration {
        self.end - self.start
    }
}

/// `burst,start_ms,end_ms` rows, times since the burst's earliest start.
pub fn timeline_rows(burst: &str, spans: &[Span]) -> Vec<String> {
    let Some(t0) = spans.iter().map(|s| s.start).min() else {
        return Vec::new();
    };
    let b = cell(burst);
    let ms = |t: Instant| (t - t0).as_secs_f64() * 1e3;
    spans
        .iter()
        .map(|s| format!("{b},{:.3},{:.3}", ms(s.start), ms(s.end)))
        .collect()
}

/// A sample file read back: its rows, each split at the commas, the header checked.
pub fn read(path: &Path, header: &str) -> Result<Vec<Vec<String>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    match lines.next() {
        Some(h) if h == header => {}
        other => {
            return Err(format!(
                "{}: header {:?}, expected {header:?}",
                path.display(),
                other.unwrap_or("")
            ));
        }
    }
    let width = header.split(',').count();
    lines
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| {
            let row: Vec<String> = l.split(',').map(str::to_string).collect();
            if row.len() == width {
                Ok(row)
            } else {
                Err(format!(
                    "{} line {}: {} cells, expected {width}",
                    path.display(),
                    i + 2,
                    row.len()
                ))
            }
        })
        .collect()
}

/// A numeric cell of a sample file.
pub fn number(path: &Path, cell: &str) -> Result<f64, String> {
    cell.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("{}: {cell:?} is not a number", path.display()))
}
