//! What the guardian's jobs are configured with (validated by the daemon's configuration).

use std::path::PathBuf;
use std::time::Duration;

/// What every job knows about the node it guards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// This node's name (its pods' `spec.nodeName`; the node the taint is removed from).
    pub name: String,
    /// The host's /proc as mounted (running pods' namespaces are found there).
    pub proc_root: PathBuf,
    /// The node's backend, as written into the plugin config.
    pub backend: redirect::Backend,
    /// The plugin's policy for sidecar pods (ambient pods are the node agent's).
    pub policy: pod_policy::Policy,
}

/// Which action the repair controller takes on a broken pod (Istio's precedence).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairAction {
    Repair,
    Delete,
    Label,
}

impl RepairAction {
    /// The `type` label of `istio_cni_repair_pods_repaired_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            RepairAction::Repair => "repair",
            RepairAction::Delete => "delete",
            RepairAction::Label => "label",
        }
    }
}

/// Repair controller settings (Istio's `RepairSettings`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairSettings {
    pub enabled: bool,
    pub repair_pods: bool,
    pub delete_pods: bool,
    pub label_pods: bool,
    pub field_selectors: String,
    pub label_selectors: String,
    pub sidecar_annotation: String,
    pub init_container_name: String,
    pub init_exit_code: i32,
    pub init_termination_message: String,
    pub label_key: String,
    pub label_value: String,
}

impl RepairSettings {
    /// Istio's defaults, repair off (for tests and the bench).
    pub fn disabled() -> RepairSettings {
        RepairSettings {
            enabled: false,
            repair_pods: true,
            delete_pods: false,
            label_pods: false,
            field_selectors: String::new(),
            label_selectors: String::new(),
            sidecar_annotation: "sidecar.istio.io/status".into(),
            init_container_name: "istio-validation".into(),
            init_exit_code: 126,
            init_termination_message: String::new(),
            label_key: "cni.istio.io/uninitialized".into(),
            label_value: "true".into(),
        }
    }

    /// repair > delete > label; `None`: detect only.
    pub fn action(&self) -> Option<RepairAction> {
        if self.repair_pods {
            Some(RepairAction::Repair)
        } else if self.delete_pods {
            Some(RepairAction::Delete)
        } else if self.label_pods {
            Some(RepairAction::Label)
        } else {
            None
        }
    }

    /// The pod watch's field selector: ours first, then spec.nodeName (Istio's order).
    pub fn field_selector(&self, node_name: &str) -> String {
        let mut parts = Vec::new();
        if !self.field_selectors.trim().is_empty() {
            parts.push(self.field_selectors.trim().to_string());
        }
        parts.push(format!("spec.nodeName={node_name}"));
        parts.join(",")
    }
}

/// Continuous reconcile settings (RECONCILE_*).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcileSettings {
    pub enabled: bool,
    /// Each mesh pod is checked once per interval (and on its pod events).
    pub interval: Duration,
    /// CONTROLLER_MODE: program opted-in pods on first sight and annotate them.
    pub controller_mode: bool,
}

impl ReconcileSettings {
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);

    pub fn disabled() -> ReconcileSettings {
        ReconcileSettings {
            enabled: false,
            interval: Self::DEFAULT_INTERVAL,
            controller_mode: false,
        }
    }
}
