//! The daemon's latency and failure figures (#33 item 2): the plugin's ADD by mode and result,
//! the pod lookup by source and the daemon's wait for its watch, the ambient enroll up to
//! ztunnel's Ack, reconcile passes, the watches' lag, and failures by reason.
//!
//! One set per process ([`global`]), rendered by [`State::render_metrics`](crate::State) after
//! the jobs' registered families: the plugin's figures arrive on the log relay
//! ([`crate::plugin_log`]), the others are observed where the work happens (`node_view`'s
//! cache and lookup, the guardian's reconciler, the ambient agent), each without plumbing a
//! handle through every job, as Istio's package-level metrics.

use crate::histogram::{CNI_BUCKETS, Histograms, LAG_BUCKETS};
use crate::metrics::{Counters, Metrics};
use cni_config::log::{AddFigures, LOOKUP_SOURCES, MODES, PLUGIN_FAILURE_REASONS, RESULTS};
use std::sync::LazyLock;
use std::time::Duration;

/// The ambient agent's steps an enroll fails at, beside the plugin's
/// ([`PLUGIN_FAILURE_REASONS`]): its in-pod rules (`rules_failed`, shared), the host probe
/// rule, ztunnel not connected, the hand-off to ztunnel (no Ack), the agent's own worker.
pub const AGENT_FAILURE_REASONS: [&str; 4] = [
    "host_rule_failed",
    "ztunnel_not_connected",
    "ztunnel_send_failed",
    "internal_failed",
];

/// `istio_cni_pod_lookup_wait_seconds{result}`: the daemon answered the pod or missed it.
pub const LOOKUP_WAIT_RESULTS: [&str; 2] = ["found", "missed"];
/// `istio_cni_reconcile_pass_duration_seconds{mode}`.
pub const RECONCILE_MODES: [&str; 2] = ["sidecar", "ambient"];
/// `istio_cni_watch_lag_seconds{resource}`.
pub const WATCHED: [&str; 2] = ["pods", "namespaces"];

/// Every failure reason, the plugin's then the agent's.
pub fn failure_reasons() -> Vec<&'static str> {
    PLUGIN_FAILURE_REASONS
        .iter()
        .chain(AGENT_FAILURE_REASONS.iter())
        .copied()
        .collect()
}

/// The families, every series created up front.
#[derive(Debug)]
pub struct Figures {
    pub plugin_add: Histograms,
    pub pod_lookup: Histograms,
    pub lookup_wait: Histograms,
    pub enroll: Histograms,
    pub reconcile_pass: Histograms,
    pub watch_lag: Histograms,
    pub failures: Counters,
}

fn each(values: &[&'static str]) -> Vec<Vec<&'static str>> {
    values.iter().map(|v| vec![*v]).collect()
}

impl Default for Figures {
    fn default() -> Figures {
        Figures {
            plugin_add: Histograms::new(
                "istio_cni_plugin_add_duration_seconds",
                "CNI ADDs of the istio-cni plugin by the pod's mode and result, as the plugin timed them",
                &["mode", "result"],
                CNI_BUCKETS,
                Histograms::product(&MODES, &RESULTS),
            ),
            pod_lookup: Histograms::new(
                "istio_cni_pod_lookup_duration_seconds",
                "The plugin's pod lookups by who answered: the node daemon's cache or the API server (a cache miss's time included)",
                &["source"],
                CNI_BUCKETS,
                each(&LOOKUP_SOURCES),
            ),
            lookup_wait: Histograms::new(
                "istio_cni_pod_lookup_wait_seconds",
                "The node daemon's answers to the plugin's pod lookups: how long each waited for the pod watch to deliver the pod",
                &["result"],
                CNI_BUCKETS,
                each(&LOOKUP_WAIT_RESULTS),
            ),
            enroll: Histograms::new(
                "istio_cni_ambient_enroll_duration_seconds",
                "Ambient pod enrolls by the node agent, from the request (the plugin's event or the pod watch) to ztunnel's Ack, by result",
                &["result"],
                CNI_BUCKETS,
                each(&RESULTS),
            ),
            reconcile_pass: Histograms::new(
                "istio_cni_reconcile_pass_duration_seconds",
                "Reconcile passes: one sidecar pod's check (and repair), or the ambient agent's pass over its pods and the host rule",
                &["mode"],
                CNI_BUCKETS,
                each(&RECONCILE_MODES),
            ),
            watch_lag: Histograms::new(
                "istio_cni_watch_lag_seconds",
                "From an object's last write (its newest managedFields or creation time, whole seconds) to its watch event applied in the node's cache",
                &["resource"],
                LAG_BUCKETS,
                each(&WATCHED),
            ),
            failures: Counters::by(
                "istio_cni_enrollment_failures_total",
                "Failed pod enrollments by the step that failed: the plugin's ADD and the ambient agent's enroll",
                &["reason"],
                &failure_reasons(),
            ),
        }
    }
}

impl Figures {
    /// The plugin's figures for one ADD (from its datagram on the log relay).
    pub fn observe_plugin_add(&self, f: &AddFigures) {
        let elapsed = Duration::from_micros(f.elapsed_us);
        self.plugin_add
            .observe(&[f.mode.as_str(), f.result.as_str()], elapsed);
        if !f.lookup_source.is_empty() {
            self.pod_lookup.observe(
                &[f.lookup_source.as_str()],
                Duration::from_micros(f.lookup_us),
            );
        }
        if f.result == "failure" && PLUGIN_FAILURE_REASONS.contains(&f.reason.as_str()) {
            self.failures.inc(&[f.reason.as_str()]);
        }
    }

    /// An ambient enroll's outcome: its time, and the step that failed.
    pub fn observe_enroll(&self, took: Duration, failed: Option<&'static str>) {
        let result = if failed.is_some() {
            "failure"
        } else {
            "success"
        };
        self.enroll.observe(&[result], took);
        if let Some(reason) = failed {
            self.failures.inc(&[reason]);
        }
    }
}

impl Metrics for Figures {
    fn render(&self, out: &mut String) {
        self.plugin_add.render(out);
        self.pod_lookup.render(out);
        self.lookup_wait.render(out);
        self.enroll.render(out);
        self.reconcile_pass.render(out);
        self.watch_lag.render(out);
        self.failures.render(out);
    }
}

static FIGURES: LazyLock<Figures> = LazyLock::new(Figures::default);

/// The process' figures.
pub fn global() -> &'static Figures {
    &FIGURES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_datagram_becomes_observations_and_a_failure_by_reason() {
        let f = Figures::default();
        f.observe_plugin_add(&AddFigures {
            mode: "sidecar".into(),
            result: "success".into(),
            elapsed_us: 1400,
            lookup_source: "cache".into(),
            lookup_us: 300,
            ..AddFigures::default()
        });
        f.observe_plugin_add(&AddFigures {
            mode: "unknown".into(),
            result: "failure".into(),
            reason: "netns_failed".into(),
            elapsed_us: 200,
            ..AddFigures::default()
        });
        // Values outside the contract create nothing.
        f.observe_plugin_add(&AddFigures {
            mode: "evil\"}".into(),
            result: "failure".into(),
            reason: "made_up".into(),
            ..AddFigures::default()
        });
        assert_eq!(f.plugin_add.count(&["sidecar", "success"]), 1);
        assert_eq!(f.plugin_add.count(&["unknown", "failure"]), 1);
        assert_eq!(f.pod_lookup.count(&["cache"]), 1);
        assert_eq!(f.pod_lookup.sum(&["cache"]), Duration::from_micros(300));
        assert_eq!(f.failures.get(&["netns_failed"]), 1);
        assert_eq!(f.failures.get(&["made_up"]), 0);
        f.observe_enroll(Duration::from_millis(3), Some("ztunnel_not_connected"));
        f.observe_enroll(Duration::from_millis(2), None);
        assert_eq!(f.enroll.count(&["failure"]), 1);
        assert_eq!(f.enroll.count(&["success"]), 1);
        assert_eq!(f.failures.get(&["ztunnel_not_connected"]), 1);
        let mut s = String::new();
        f.render(&mut s);
        for family in [
            "istio_cni_plugin_add_duration_seconds",
            "istio_cni_pod_lookup_duration_seconds",
            "istio_cni_pod_lookup_wait_seconds",
            "istio_cni_ambient_enroll_duration_seconds",
            "istio_cni_reconcile_pass_duration_seconds",
            "istio_cni_watch_lag_seconds",
        ] {
            assert!(
                s.contains(&format!("# TYPE {family} histogram\n")),
                "{family}"
            );
        }
        assert!(s.contains("istio_cni_plugin_add_duration_seconds_bucket{mode=\"sidecar\",result=\"success\",le=\"0.0025\"} 1\n"), "{s}");
        assert!(s.contains("istio_cni_enrollment_failures_total{reason=\"netns_failed\"} 1\n"));
        assert!(!s.contains("evil") && !s.contains("made_up"), "{s}");
    }
}
