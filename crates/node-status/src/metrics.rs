//! Prometheus text exposition (version 0.0.4) of counters and gauges that every job of the
//! daemon owns and registers with [`State`](crate::State). Families are created with every label
//! value they can take, so each series is exported from the start (zeros included), as Istio's.

use std::sync::atomic::{AtomicU64, Ordering};

/// Something that renders its own metric families.
pub trait Metrics: Send + Sync {
    fn render(&self, out: &mut String);
}

/// A counter family over fixed label values (or a single unlabelled counter).
#[derive(Debug)]
pub struct Counters {
    name: &'static str,
    help: &'static str,
    label_names: &'static [&'static str],
    series: Vec<(Vec<&'static str>, AtomicU64)>,
}

impl Counters {
    /// `combinations`: every label-value tuple, in exposition order (one value per label name).
    pub fn new(
        name: &'static str,
        help: &'static str,
        label_names: &'static [&'static str],
        combinations: impl IntoIterator<Item = Vec<&'static str>>,
    ) -> Counters {
        let series: Vec<_> = combinations
            .into_iter()
            .inspect(|c| assert_eq!(c.len(), label_names.len(), "{name}: label values"))
            .map(|c| (c, AtomicU64::new(0)))
            .collect();
        Counters {
            name,
            help,
            label_names,
            series,
        }
    }

    /// One label, each of `values`.
    pub fn by(
        name: &'static str,
        help: &'static str,
        label: &'static [&'static str; 1],
        values: &[&'static str],
    ) -> Counters {
        Counters::new(name, help, label, values.iter().map(|v| vec![*v]))
    }

    fn find(&self, labels: &[&str]) -> Option<&AtomicU64> {
        self.series
            .iter()
            .find(|(l, _)| l.as_slice() == labels)
            .map(|(_, v)| v)
    }

    /// Adds one to the series with these label values; unknown values are ignored (a typo
    /// must not create a series the dashboards do not know).
    pub fn inc(&self, labels: &[&str]) {
        if let Some(v) = self.find(labels) {
            v.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, labels: &[&str]) -> u64 {
        self.find(labels).map_or(0, |v| v.load(Ordering::Relaxed))
    }
}

impl Metrics for Counters {
    fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "counter");
        for (values, v) in &self.series {
            let labels: Vec<String> = self
                .label_names
                .iter()
                .zip(values)
                .map(|(k, v)| format!("{k}=\"{v}\""))
                .collect();
            let labels = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", labels.join(","))
            };
            out.push_str(&format!(
                "{}{labels} {}\n",
                self.name,
                v.load(Ordering::Relaxed)
            ));
        }
    }
}

/// One gauge.
#[derive(Debug)]
pub struct Gauge {
    name: &'static str,
    help: &'static str,
    value: AtomicU64,
}

impl Gauge {
    pub const fn new(name: &'static str, help: &'static str) -> Gauge {
        Gauge {
            name,
            help,
            value: AtomicU64::new(0),
        }
    }

    pub fn set(&self, v: u64) {
        self.value.store(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

impl Metrics for Gauge {
    fn render(&self, out: &mut String) {
        gauge(out, self.name, self.help, self.get());
    }
}

/// `# HELP` and `# TYPE` lines.
pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
}

/// A whole unlabelled gauge family.
pub fn gauge(out: &mut String, name: &str, help: &str, v: u64) {
    header(out, name, help, "gauge");
    out.push_str(&format!("{name} {v}\n"));
}

/// A whole unlabelled counter family.
pub fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    header(out, name, help, "counter");
    out.push_str(&format!("{name} {v}\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_export_every_series_and_ignore_unknown_labels() {
        let c = Counters::new(
            "x_total",
            "X",
            &["type", "result"],
            [vec!["a", "ok"], vec!["a", "fail"]],
        );
        c.inc(&["a", "ok"]);
        c.inc(&["a", "ok"]);
        c.inc(&["b", "ok"]);
        let mut s = String::new();
        c.render(&mut s);
        assert_eq!(
            s,
            "# HELP x_total X\n# TYPE x_total counter\nx_total{type=\"a\",result=\"ok\"} 2\nx_total{type=\"a\",result=\"fail\"} 0\n"
        );
        let g = Gauge::new("g", "G");
        g.set(7);
        let mut s = String::new();
        g.render(&mut s);
        assert_eq!(s, "# HELP g G\n# TYPE g gauge\ng 7\n");
    }
}
