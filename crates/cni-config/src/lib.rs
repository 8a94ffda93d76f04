//! The contracts between the plugin (istio-cni) and the node daemon (install-cni), each defined
//! once so the two can never disagree on a field name, a default or a path:
//!
//! - the plugin's entry in the CNI network configuration ([`PluginSettings`]): install-cni
//!   writes it, istio-cni reads it;
//! - [`ready`]: the readiness marker the daemon holds and the plugin's CNI STATUS reads;
//! - [`ambient`]: the ambient plugin → node agent event messages (`pluginevent.sock`);
//! - [`lookup`]: the pod lookup the plugin asks the daemon's caches (`pods.sock`);
//! - [`log`]: the plugin's log lines relayed to the daemon's log (`log.sock`);
//! - [`status`]: the node's enrollment report the daemon serves `istio-nftables status`
//!   (`status.sock`).

use serde::{Deserialize, Serialize};

pub mod ambient;
pub mod log;
pub mod lookup;
pub mod ready;
pub mod status;

/// Plugin type and name as installed.
pub const PLUGIN_TYPE: &str = "istio-cni";
/// File name of the kubeconfig inside `cni_agent_run_dir`.
pub const KUBECONFIG_FILE: &str = "istio-cni-kubeconfig";
/// File name of the plugin's log inside `cni_agent_run_dir`.
pub const LOG_FILE: &str = "istio-cni.log";
pub const DEFAULT_RUN_DIR: &str = "/var/run/istio-cni";

/// istio-cni's own settings (Istio's field names, plus ours). Unknown fields are ignored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PluginSettings {
    /// `panic|fatal|error|warn|info|debug`.
    pub plugin_log_level: String,
    /// Host directory with the kubeconfig and the log file.
    pub cni_agent_run_dir: String,
    /// Pods in these namespaces are passed through untouched.
    pub exclude_namespaces: Vec<String>,
    /// Namespace of the istio-cni DaemonSet (its own pods bypass the plugin).
    pub pod_namespace: String,
    /// Istio's `SYSTEM_NAMESPACE`, where ztunnel's pods are (they bypass the plugin); absent:
    /// `pod_namespace`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub system_namespace: String,
    /// Istio's switch; `true` means `redirect_backend: nft`.
    pub native_nftables: bool,
    /// `auto|nft|iptables-legacy`.
    pub redirect_backend: String,
    /// Pod GET attempts before the ADD fails (Istio: 30).
    pub pod_lookup_attempts: u32,
    /// Pause between attempts, in milliseconds (Istio: 1000).
    pub pod_lookup_interval_ms: u64,
    /// Timeout of one pod GET, in milliseconds.
    pub pod_lookup_timeout_ms: u64,
    /// The whole pod lookup (kubeconfig, DNS, connect, TLS, body, every attempt and pause), in
    /// milliseconds: ADD fails when it is reached. See [`DEFAULT_POD_LOOKUP_DEADLINE_MS`].
    pub pod_lookup_deadline_ms: u64,
    /// Ambient mode: pods the selectors enroll are handed to the node agent on ADD.
    pub ambient_enabled: bool,
    /// Which pods are ambient (Istio's `enablement_selectors`); empty: Istio's defaults.
    pub enablement_selectors: Vec<pod_policy::EnablementSelector>,
    /// Istio's `enable_ambient_detection_retry`: a failed ambient lookup fails the ADD (after
    /// the lookup's retries) instead of treating the pod as not ambient.
    pub enable_ambient_detection_retry: bool,
    /// How long ADD waits for the node agent to program an ambient pod and ztunnel to
    /// acknowledge it, in milliseconds.
    pub ambient_handoff_timeout_ms: u64,
}

/// The agent bounds its own work on a pod (namespace lock, rules, ztunnel's Ack) well inside
/// this, so a slow agent answers with its reason instead of the plugin timing out.
pub const DEFAULT_AMBIENT_HANDOFF_TIMEOUT_MS: u64 = 20_000;

/// 30 s, well inside what the runtimes give the whole CNI chain: kubelet calls RunPodSandbox
/// with twice its `runtimeRequestTimeout` (2 min by default, so 4 min); CRI-O gives the network
/// setup of a sandbox 2 min of that ("half of a RunPodSandbox request timeout limit", its
/// `networkStart`); containerd 1.6/1.7 run the chain under the RunPodSandbox request context
/// itself. A lookup that has not answered in 30 s is better reported (the runtime retries the
/// sandbox) than held; the plugin accepts at most 90 s (room for the rest of the chain).
pub const DEFAULT_POD_LOOKUP_DEADLINE_MS: u64 = 30_000;

impl Default for PluginSettings {
    fn default() -> Self {
        Self {
            plugin_log_level: "info".into(),
            cni_agent_run_dir: DEFAULT_RUN_DIR.into(),
            exclude_namespaces: Vec::new(),
            pod_namespace: String::new(),
            system_namespace: String::new(),
            native_nftables: false,
            redirect_backend: "auto".into(),
            pod_lookup_attempts: 30,
            pod_lookup_interval_ms: 1000,
            pod_lookup_timeout_ms: 5000,
            pod_lookup_deadline_ms: DEFAULT_POD_LOOKUP_DEADLINE_MS,
            ambient_enabled: false,
            enablement_selectors: Vec::new(),
            enable_ambient_detection_retry: false,
            ambient_handoff_timeout_ms: DEFAULT_AMBIENT_HANDOFF_TIMEOUT_MS,
        }
    }
}

impl PluginSettings {
    /// The JSON object install-cni puts into the conflist (`name` and `type` included).
    pub fn to_plugin_entry(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("plain struct serializes");
        let obj = v.as_object_mut().expect("object");
        obj.insert("name".into(), PLUGIN_TYPE.into());
        obj.insert("type".into(), PLUGIN_TYPE.into());
        v
    }

    pub fn kubeconfig_path(&self) -> std::path::PathBuf {
        std::path::Path::new(&self.cni_agent_run_dir).join(KUBECONFIG_FILE)
    }

    pub fn log_path(&self) -> std::path::PathBuf {
        std::path::Path::new(&self.cni_agent_run_dir).join(LOG_FILE)
    }

    pub fn run_dir(&self) -> &std::path::Path {
        std::path::Path::new(&self.cni_agent_run_dir)
    }

    /// The node daemon's socket for the plugin's log lines.
    pub fn log_socket(&self) -> std::path::PathBuf {
        self.run_dir().join(log::LOG_SOCKET)
    }

    /// The node daemon's pod lookup socket.
    pub fn pod_lookup_socket(&self) -> std::path::PathBuf {
        self.run_dir().join(lookup::POD_LOOKUP_SOCKET)
    }

    /// The node daemon's enrollment report socket.
    pub fn status_socket(&self) -> std::path::PathBuf {
        self.run_dir().join(status::STATUS_SOCKET)
    }

    /// The node agent's socket for plugin events.
    pub fn plugin_event_socket(&self) -> std::path::PathBuf {
        self.run_dir().join(ambient::PLUGIN_EVENT_SOCKET)
    }

    /// The selectors in force: the configured ones, or Istio's defaults when none are.
    pub fn effective_selectors(&self) -> Vec<pod_policy::EnablementSelector> {
        if self.enablement_selectors.is_empty() {
            pod_policy::selector::default_selectors()
        } else {
            self.enablement_selectors.clone()
        }
    }

    /// What the plugin decides pods with (the same policy install-cni builds from its env).
    pub fn policy(&self) -> pod_policy::Policy {
        pod_policy::Policy {
            scope: pod_policy::Scope {
                exclude_namespaces: self.exclude_namespaces.clone(),
                cni_namespace: self.pod_namespace.clone(),
                system_namespace: self.system_namespace.clone(),
            },
            ambient: self.ambient_enabled.then(|| self.effective_selectors()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_ignored_and_defaults_apply() {
        let s: PluginSettings = serde_json::from_str(
            r#"{"type":"istio-cni","exclude_namespaces":["kube-system"],"ambient_enabled":false}"#,
        )
        .unwrap();
        assert_eq!(s.exclude_namespaces, vec!["kube-system"]);
        assert_eq!(s.pod_lookup_attempts, 30);
        assert_eq!(s.pod_lookup_deadline_ms, 30_000);
        let entry = s.to_plugin_entry();
        assert_eq!(entry["type"], "istio-cni");
        assert_eq!(entry["redirect_backend"], "auto");
    }
}
