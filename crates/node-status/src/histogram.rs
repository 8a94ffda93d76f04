//! Prometheus histograms over fixed label values, in the text exposition (version 0.0.4) the
//! other families use: `<name>_bucket{…,le="…"}` (cumulative, `+Inf` last), `<name>_sum` and
//! `<name>_count`, in seconds. Like [`Counters`](crate::metrics::Counters), every series is
//! created with the family, so each exists from the start (zeros included) and an unknown label
//! value is ignored rather than creating a series no dashboard knows.
//!
//! An observation is two relaxed atomic additions (its bucket, the sum in nanoseconds); the
//! count is rendered as the buckets' total, so `_count` always equals the `+Inf` bucket.

use crate::metrics::{Metrics, header};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) for the CNI work the daemon and the plugin time: a plugin ADD is
/// about 1.4 ms, a cached lookup well under one, an ambient enroll a few ms; an API lookup or a
/// slow node's work runs to seconds.
pub const CNI_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds (seconds) for a watch's lag: the API server's timestamps are whole seconds, so
/// the figures are rounded up to within a second.
pub const LAG_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

#[derive(Debug)]
struct Series {
    /// Observations per bucket (not cumulative), the last one `+Inf`.
    buckets: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

/// A histogram family over fixed label values (or a single unlabelled histogram).
#[derive(Debug)]
pub struct Histograms {
    name: &'static str,
    help: &'static str,
    label_names: &'static [&'static str],
    bounds: &'static [f64],
    series: Vec<(Vec<&'static str>, Series)>,
}

impl Histograms {
    /// `combinations`: every label-value tuple, in exposition order (one value per label
    /// name); `bounds`: the buckets' upper bounds in seconds, ascending.
    pub fn new(
        name: &'static str,
        help: &'static str,
        label_names: &'static [&'static str],
        bounds: &'static [f64],
        combinations: impl IntoIterator<Item = Vec<&'static str>>,
    ) -> Histograms {
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "{name}: bounds ascend"
        );
        let series = combinations
            .into_iter()
            .inspect(|c| assert_eq!(c.len(), label_names.len(), "{name}: label values"))
            .map(|c| {
                let buckets = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
                let s = Series {
                    buckets,
                    sum_ns: AtomicU64::new(0),
                };
                (c, s)
            })
            .collect();
        Histograms {
            name,
            help,
            label_names,
            bounds,
            series,
        }
    }

    /// Every combination of two labels' values (the first label's outer).
    pub fn product(a: &[&'static str], b: &[&'static str]) -> Vec<Vec<&'static str>> {
        a.iter()
            .flat_map(|x| b.iter().map(move |y| vec![*x, *y]))
            .collect()
    }

    fn find(&self, labels: &[&str]) -> Option<&Series> {
        self.series
            .iter()
            .find(|(l, _)| l.as_slice() == labels)
            .map(|(_, s)| s)
    }

    /// Records one duration in the series with these label values (unknown values: ignored).
    pub fn observe(&self, labels: &[&str], d: Duration) {
        let Some(s) = self.find(labels) else { return };
        let secs = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        s.buckets[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        s.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations in the series with these label values.
    pub fn count(&self, labels: &[&str]) -> u64 {
        self.find(labels).map_or(0, |s| {
            s.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
        })
    }

    /// Their sum.
    pub fn sum(&self, labels: &[&str]) -> Duration {
        self.find(labels).map_or(Duration::ZERO, |s| {
            Duration::from_nanos(s.sum_ns.load(Ordering::Relaxed))
        })
    }
}

/// `k="v",…` (empty without labels), with a trailing comma when `more` follows.
fn pairs(names: &[&str], values: &[&str], more: bool) -> String {
    let mut s = String::new();
    for (k, v) in names.iter().zip(values) {
        let _ = write!(s, "{k}=\"{v}\",");
    }
    if !more {
        s.pop();
    }
    s
}

impl Metrics for Histograms {
    fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "histogram");
        let name = self.name;
        for (values, s) in &self.series {
            let with_le = pairs(self.label_names, values, true);
            let mut total = 0u64;
            for (i, b) in s.buckets.iter().enumerate() {
                total += b.load(Ordering::Relaxed);
                let le = self
                    .bounds
                    .get(i)
                    .map_or_else(|| "+Inf".to_string(), f64::to_string);
                let _ = writeln!(out, "{name}_bucket{{{with_le}le=\"{le}\"}} {total}");
            }
            let labels = match pairs(self.label_names, values, false) {
                l if l.is_empty() => l,
                l => format!("{{{l}}}"),
            };
            let sum = s.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "{name}_sum{labels} {sum}");
            let _ = writeln!(out, "{name}_count{labels} {total}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_cumulative_buckets_sum_and_count_per_series() {
        const B: &[f64] = &[0.001, 0.01, 2.5];
        let h = Histograms::new(
            "x_seconds",
            "X",
            &["mode", "result"],
            B,
            Histograms::product(&["a"], &["ok", "fail"]),
        );
        h.observe(&["a", "ok"], Duration::from_micros(500));
        h.observe(&["a", "ok"], Duration::from_millis(1)); // on the bound: counted in it
        h.observe(&["a", "ok"], Duration::from_millis(3));
        h.observe(&["a", "ok"], Duration::from_secs(3));
        h.observe(&["b", "ok"], Duration::from_secs(1)); // unknown: ignored
        let mut s = String::new();
        h.render(&mut s);
        assert_eq!(
            s,
            "# HELP x_seconds X\n# TYPE x_seconds histogram\n\
             x_seconds_bucket{mode=\"a\",result=\"ok\",le=\"0.001\"} 2\n\
             x_seconds_bucket{mode=\"a\",result=\"ok\",le=\"0.01\"} 3\n\
             x_seconds_bucket{mode=\"a\",result=\"ok\",le=\"2.5\"} 3\n\
             x_seconds_bucket{mode=\"a\",result=\"ok\",le=\"+Inf\"} 4\n\
             x_seconds_sum{mode=\"a\",result=\"ok\"} 3.0045\n\
             x_seconds_count{mode=\"a\",result=\"ok\"} 4\n\
             x_seconds_bucket{mode=\"a\",result=\"fail\",le=\"0.001\"} 0\n\
             x_seconds_bucket{mode=\"a\",result=\"fail\",le=\"0.01\"} 0\n\
             x_seconds_bucket{mode=\"a\",result=\"fail\",le=\"2.5\"} 0\n\
             x_seconds_bucket{mode=\"a\",result=\"fail\",le=\"+Inf\"} 0\n\
             x_seconds_sum{mode=\"a\",result=\"fail\"} 0\n\
             x_seconds_count{mode=\"a\",result=\"fail\"} 0\n"
        );
        assert_eq!(h.count(&["a", "ok"]), 4);
        assert_eq!(h.sum(&["a", "ok"]), Duration::from_micros(3_004_500));
    }

    #[test]
    fn an_unlabelled_histogram_has_no_braces_but_its_buckets_le() {
        let h = Histograms::new("y_seconds", "Y", &[], &[1.0], [vec![]]);
        h.observe(&[], Duration::from_millis(250));
        let mut s = String::new();
        h.render(&mut s);
        assert!(s.contains("\ny_seconds_bucket{le=\"1\"} 1\n"), "{s}");
        assert!(s.contains("\ny_seconds_bucket{le=\"+Inf\"} 1\n"), "{s}");
        assert!(
            s.contains("\ny_seconds_sum 0.25\ny_seconds_count 1\n"),
            "{s}"
        );
    }

    #[test]
    fn the_buckets_suit_millisecond_work() {
        assert!(CNI_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        assert!(
            CNI_BUCKETS[0] < 0.0014 && CNI_BUCKETS[1] < 0.002,
            "an ADD's ~1.4 ms is resolved"
        );
        assert!(LAG_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
