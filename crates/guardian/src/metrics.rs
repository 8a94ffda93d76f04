//! The guardian's metrics. Every family is exported from the start, whether or not its job
//! runs (as Istio's), so dashboards see zeros rather than gaps.

use node_status::State;
use node_status::metrics::{Counters, Gauge};
use std::sync::Arc;

/// `type` and `result` label values of `istio_cni_repair_pods_repaired_total`.
pub const REPAIR_TYPES: [&str; 3] = ["repair", "delete", "label"];
pub const REPAIR_RESULTS: [&str; 3] = ["success", "fail", "skip"];

/// `istio_cni_repair_pods_repaired_total{type,result}` (Istio's).
pub fn repair_counters() -> Counters {
    Counters::new(
        "istio_cni_repair_pods_repaired_total",
        "Total number of pods repaired by repair controller",
        &["type", "result"],
        REPAIR_TYPES
            .iter()
            .flat_map(|t| REPAIR_RESULTS.iter().map(move |r| vec![*t, *r])),
    )
}

/// `result` label values of `istio_cni_pod_rules_checks_total`: a check finds the rules `ok`
/// or in `drift` (or cannot be made: `failed`); a drift is then `repaired`, `migrated` (the
/// rules were on the other backend than the node's), or counts `failed`.
pub const CHECK_RESULTS: [&str; 5] = ["ok", "drift", "repaired", "migrated", "failed"];

/// Checks of pods' live rules against their plan. One family that two jobs report into: the
/// reconciler (sidecar pods) and the ambient agent (ambient pods).
pub fn pod_rules_checks() -> Counters {
    Counters::by(
        "istio_cni_pod_rules_checks_total",
        "Checks of mesh pods' live redirect rules against their plan, by result",
        &["result"],
        &CHECK_RESULTS,
    )
}

#[derive(Clone)]
pub struct Metrics {
    /// `istio_cni_repair_pods_repaired_total{type,result}`.
    pub repaired: Arc<Counters>,
    /// `istio_cni_pod_rules_checks_total{result}` (shared with the ambient agent).
    pub checks: Arc<Counters>,
    /// `istio_cni_reconcile_pods`.
    pub reconciled_pods: Arc<Gauge>,
    /// Each reconciled pod's last check (not a metric: the node's enrollment report reads it).
    pub ledger: crate::reconcile::ledger::Ledger,
}

impl Metrics {
    /// Creates every family and registers it with the daemon's status.
    pub fn registered(state: &State) -> Metrics {
        let m = Metrics {
            repaired: Arc::new(repair_counters()),
            checks: Arc::new(pod_rules_checks()),
            reconciled_pods: Arc::new(Gauge::new(
                "istio_cni_reconcile_pods",
                "Mesh pods of this node whose rules are reconciled",
            )),
            ledger: Default::default(),
        };
        state.register(m.repaired.clone());
        state.register(m.checks.clone());
        state.register(m.reconciled_pods.clone());
        m
    }

    /// What the reconciler reports into.
    pub fn reconcile(&self) -> crate::reconcile::Metrics {
        crate::reconcile::Metrics {
            checks: self.checks.clone(),
            pods: self.reconciled_pods.clone(),
            ledger: self.ledger.clone(),
        }
    }
}
