//! Settings: every one has Istio's environment variable name and default (istio-reference §5.2)
//! and a `--flag`. Parsing is strict: a value we cannot use is a startup error that names the
//! variable and the value, never a silent fallback (a typo in a ConfigMap must not quietly
//! install a different configuration on every node).

use clap::{ArgAction, Parser};
use redirect::BackendChoice;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

/// Every environment variable the daemon reads, in `--help` order. Compared against the Helm
/// chart's ConfigMap/DaemonSet env in tests (`install-cni --list-env` prints it).
pub const ENV_VARS: &[&str] = &[
    "CNI_CONF_NAME",
    "CHAINED_CNI_PLUGIN",
    "MOUNTED_CNI_NET_DIR",
    "CNI_AGENT_RUN_DIR",
    "KUBECONFIG_MODE",
    "CNI_CONF_GROUP_READ",
    "KUBE_CA_FILE",
    "SKIP_TLS_VERIFY",
    "MONITORING_PORT",
    "HEALTH_PORT",
    "LISTEN_ADDRESS",
    "EXCLUDE_NAMESPACES",
    "POD_NAMESPACE",
    "NATIVE_NFTABLES",
    "REDIRECT_BACKEND",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "KUBERNETES_SERVICE_PROTOCOL",
    "LOG_LEVEL",
    "PLUGIN_LOG_LEVEL",
    "CNI_BIN_SOURCE_DIR",
    "CNI_BIN_TARGET_DIRS",
    "CNI_BINARIES",
    "SERVICE_ACCOUNT_DIR",
    "AMBIENT_ENABLED",
    "AMBIENT_ENABLEMENT_SELECTOR",
    "AMBIENT_DNS_CAPTURE",
    "AMBIENT_IPV6",
    "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP",
    "ENABLE_AMBIENT_DETECTION_RETRY",
    "ZTUNNEL_UDS_ADDRESS",
    "AMBIENT_DISABLE_SAFE_UPGRADE",
    "REPAIR_ENABLED",
    "REPAIR_REPAIR_PODS",
    "REPAIR_DELETE_PODS",
    "REPAIR_LABEL_PODS",
    "REPAIR_RUN_AS_DAEMON",
    "REPAIR_NODE_NAME",
    "KUBERNETES_NODE_NAME",
    "NODE_TAINT_KEY",
    "REPAIR_FIELD_SELECTORS",
    "REPAIR_LABEL_SELECTORS",
    "REPAIR_SIDECAR_ANNOTATION",
    "REPAIR_INIT_CONTAINER_NAME",
    "REPAIR_INIT_CONTAINER_EXIT_CODE",
    "REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE",
    "REPAIR_BROKEN_POD_LABEL_KEY",
    "REPAIR_BROKEN_POD_LABEL_VALUE",
    "REPAIR_PROC_ROOT",
    "POD_WATCH_TIMEOUT_SECONDS",
    "RECONCILE_ENABLED",
    "RECONCILE_INTERVAL",
    "CONTROLLER_MODE",
    "KUBECONFIG",
];

pub use cni_installer::settings::STANDALONE_CONF_NAME;

const LOG_LEVELS: &[&str] = &["panic", "fatal", "error", "warn", "info", "debug", "trace"];

/// Raw command line / environment. Field names are the lowercase env names on purpose: clap
/// prints the value name (= the env name) in its errors, so a bad `MONITORING_PORT=abc` says
/// `invalid value 'abc' for '--monitoring-port <MONITORING_PORT>'`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "install-cni",
    version,
    about = "Installs the istio-cni plugin on this node, keeps it installed, removes it on SIGTERM",
    long_about = "Installs the istio-cni plugin on this node (binaries, kubeconfig, chained CNI \
config), repairs the install whenever something changes it, and removes it on SIGTERM/SIGINT.\n\
Every option can be set by its environment variable (Istio's names); flags win over the environment."
)]
pub struct Args {
    /// Primary CNI config file to patch (empty: the first valid file in the net dir, like kubelet).
    #[arg(long, env = "CNI_CONF_NAME", default_value = "")]
    pub cni_conf_name: String,

    /// Chain into the primary CNI config (true) or write a standalone YYY-istio-cni.conf (false).
    #[arg(long, env = "CHAINED_CNI_PLUGIN", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub chained_cni_plugin: bool,

    /// Host CNI config directory as mounted in the container.
    #[arg(
        long,
        env = "MOUNTED_CNI_NET_DIR",
        default_value = "/host/etc/cni/net.d"
    )]
    pub mounted_cni_net_dir: PathBuf,

    /// Host directory for the plugin's kubeconfig and log (the plugin reads it from its config).
    #[arg(long, env = "CNI_AGENT_RUN_DIR", default_value = cni_config::DEFAULT_RUN_DIR)]
    pub cni_agent_run_dir: PathBuf,

    /// File mode of the kubeconfig, octal.
    #[arg(long, env = "KUBECONFIG_MODE", default_value = "0600", value_parser = parse_mode)]
    pub kubeconfig_mode: u32,

    /// New CNI config files get mode 0640 instead of 0600.
    #[arg(long, env = "CNI_CONF_GROUP_READ", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub cni_conf_group_read: bool,

    /// CA bundle for the API server (empty: <SERVICE_ACCOUNT_DIR>/ca.crt).
    #[arg(long, env = "KUBE_CA_FILE", default_value = "")]
    pub kube_ca_file: String,

    /// Write insecure-skip-tls-verify instead of the CA into the kubeconfig.
    #[arg(long, env = "SKIP_TLS_VERIFY", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub skip_tls_verify: bool,

    /// Prometheus /metrics port (0: any free port, logged).
    #[arg(long, env = "MONITORING_PORT", default_value = "15014")]
    pub monitoring_port: u16,

    /// /healthz and /readyz port (0: any free port, logged).
    #[arg(long, env = "HEALTH_PORT", default_value = "8000")]
    pub health_port: u16,

    /// Address the HTTP servers bind to.
    #[arg(long, env = "LISTEN_ADDRESS", default_value = "0.0.0.0")]
    pub listen_address: IpAddr,

    /// Comma-separated namespaces the plugin leaves alone (the chart sets kube-system).
    #[arg(long, env = "EXCLUDE_NAMESPACES", default_value = "")]
    pub exclude_namespaces: String,

    /// Namespace of this DaemonSet (downward API); its pods bypass the plugin.
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    pub pod_namespace: String,

    /// Istio's switch for nftables; true means REDIRECT_BACKEND=nft.
    #[arg(long, env = "NATIVE_NFTABLES", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub native_nftables: bool,

    /// auto | nft | iptables-legacy: how pods on this node get their rules (auto: decided from
    /// the host namespace at startup).
    #[arg(long, env = "REDIRECT_BACKEND", default_value = "auto", value_parser = parse_backend)]
    pub redirect_backend: BackendChoice,

    /// API server host for the plugin's kubeconfig (set by Kubernetes in every pod).
    #[arg(long, env = "KUBERNETES_SERVICE_HOST", default_value = "")]
    pub kubernetes_service_host: String,

    /// API server port for the plugin's kubeconfig.
    #[arg(long, env = "KUBERNETES_SERVICE_PORT", default_value = "443")]
    pub kubernetes_service_port: u16,

    /// http | https.
    #[arg(long, env = "KUBERNETES_SERVICE_PROTOCOL", default_value = "https", value_parser = ["http", "https"])]
    pub kubernetes_service_protocol: String,

    /// This daemon's log level (error|warn|info|debug|trace).
    #[arg(long, env = "LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub log_level: String,

    /// The plugin's log level, written into its config as plugin_log_level.
    #[arg(long, env = "PLUGIN_LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub plugin_log_level: String,

    /// Directory in the image holding the binaries to install.
    #[arg(long, env = "CNI_BIN_SOURCE_DIR", default_value = "/opt/cni/bin")]
    pub cni_bin_source_dir: PathBuf,

    /// Comma-separated host bin directories to install into.
    #[arg(long, env = "CNI_BIN_TARGET_DIRS", default_value = "/host/opt/cni/bin")]
    pub cni_bin_target_dirs: String,

    /// Comma-separated binary names copied from the source dir.
    #[arg(long, env = "CNI_BINARIES", default_value = "istio-cni,istio-nftables")]
    pub cni_binaries: String,

    /// Projected service-account directory (token, ca.crt), watched for token rotation.
    #[arg(
        long,
        env = "SERVICE_ACCOUNT_DIR",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount"
    )]
    pub service_account_dir: PathBuf,

    /// Ambient mode: this daemon is also the node agent that hands ambient pods to ztunnel.
    #[arg(long, env = "AMBIENT_ENABLED", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub ambient_enabled: bool,

    /// Which pods are ambient: a YAML or JSON list of {podSelector, namespaceSelector}
    /// (Kubernetes label selectors); empty: Istio's defaults (istio.io/dataplane-mode=ambient on
    /// the pod, or on its namespace with the pod not "none").
    #[arg(long, env = "AMBIENT_ENABLEMENT_SELECTOR", default_value = "")]
    pub ambient_enablement_selector: String,

    /// DNS of ambient pods to ztunnel's DNS proxy (15053), unless a pod says otherwise.
    #[arg(long, env = "AMBIENT_DNS_CAPTURE", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub ambient_dns_capture: bool,

    /// IPv6 rules in ambient pods and the host probe rule (else IPv6 is left untouched).
    #[arg(long, env = "AMBIENT_IPV6", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub ambient_ipv6: bool,

    /// At startup, re-program the in-pod rules of every ambient pod found on the node.
    #[arg(long, env = "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub ambient_reconcile_pod_rules_on_startup: bool,

    /// Written into the plugin's entry (`enable_ambient_detection_retry`).
    #[arg(long, env = "ENABLE_AMBIENT_DETECTION_RETRY", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub enable_ambient_detection_retry: bool,

    /// On shutdown, clean up even while the DaemonSet still exists (no safe upgrade).
    #[arg(long, env = "AMBIENT_DISABLE_SAFE_UPGRADE", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub ambient_disable_safe_upgrade: bool,

    /// The ZDS socket this agent serves; ztunnel connects to it.
    #[arg(
        long,
        env = "ZTUNNEL_UDS_ADDRESS",
        default_value = "/var/run/ztunnel/ztunnel.sock"
    )]
    pub ztunnel_uds_address: PathBuf,

    /// Repair controller (istio-reference §6): watch this node's pods and fix those that started
    /// without the plugin (their istio-validation init container fails with 126).
    #[arg(long, env = "REPAIR_ENABLED", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_enabled: bool,

    /// Repair a broken pod by programming its redirect rules in place (first in precedence).
    #[arg(long, env = "REPAIR_REPAIR_PODS", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_repair_pods: bool,

    /// Delete a broken pod (UID and resourceVersion preconditions) when REPAIR_REPAIR_PODS is false.
    #[arg(long, env = "REPAIR_DELETE_PODS", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_delete_pods: bool,

    /// Label a broken pod (pods/status) when neither repair nor delete is on.
    #[arg(long, env = "REPAIR_LABEL_PODS", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_label_pods: bool,

    /// Accepted for Istio's chart (always a daemon here); must be a boolean.
    #[arg(long, env = "REPAIR_RUN_AS_DAEMON", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub repair_run_as_daemon: bool,

    /// This node's name (the chart sets it from spec.nodeName; empty: KUBERNETES_NODE_NAME,
    /// then the hostname).
    #[arg(long, env = "REPAIR_NODE_NAME", default_value = "")]
    pub repair_node_name: String,

    /// Fallback for REPAIR_NODE_NAME (Istio's K8sNodeName).
    #[arg(long, env = "KUBERNETES_NODE_NAME", default_value = "")]
    pub kubernetes_node_name: String,

    /// Once ready, remove every taint with this key from this node (the node name as for
    /// REPAIR_NODE_NAME), e.g. cni.istio.io/not-ready; empty: leave taints alone.
    #[arg(long, env = "NODE_TAINT_KEY", default_value = "")]
    pub node_taint_key: String,

    /// Extra field selectors for the pod watch (spec.nodeName=<node> is always added).
    #[arg(long, env = "REPAIR_FIELD_SELECTORS", default_value = "")]
    pub repair_field_selectors: String,

    /// Label selectors for the pod watch.
    #[arg(long, env = "REPAIR_LABEL_SELECTORS", default_value = "")]
    pub repair_label_selectors: String,

    /// Only pods with this annotation are considered (empty: any pod).
    #[arg(
        long,
        env = "REPAIR_SIDECAR_ANNOTATION",
        default_value = "sidecar.istio.io/status"
    )]
    pub repair_sidecar_annotation: String,

    /// Init container that fails when the plugin did not run (empty: any init container).
    #[arg(
        long,
        env = "REPAIR_INIT_CONTAINER_NAME",
        default_value = "istio-validation"
    )]
    pub repair_init_container_name: String,

    /// Its exit code when the redirect is missing (0: any non-zero exit).
    #[arg(long, env = "REPAIR_INIT_CONTAINER_EXIT_CODE", default_value = "126")]
    pub repair_init_container_exit_code: i32,

    /// Its expected termination message (empty: any).
    #[arg(
        long,
        env = "REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE",
        default_value = ""
    )]
    pub repair_init_container_termination_message: String,

    /// Label key set on broken pods in label mode.
    #[arg(
        long,
        env = "REPAIR_BROKEN_POD_LABEL_KEY",
        default_value = "cni.istio.io/uninitialized"
    )]
    pub repair_broken_pod_label_key: String,

    /// Label value set on broken pods in label mode.
    #[arg(long, env = "REPAIR_BROKEN_POD_LABEL_VALUE", default_value = "true")]
    pub repair_broken_pod_label_value: String,

    /// The host's /proc as mounted in the container (pod network namespaces are found there;
    /// <dir>/1/ns/net is the host's).
    #[arg(long, env = "REPAIR_PROC_ROOT", default_value = "/host/proc")]
    pub repair_proc_root: PathBuf,

    /// timeoutSeconds of the node pod cache's watch: the API server ends a quiet watch then
    /// and the cache resumes; a watch still silent 2 s later counts as hung and is re-listed.
    #[arg(long, env = "POD_WATCH_TIMEOUT_SECONDS", default_value = "290", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub pod_watch_timeout_seconds: u64,

    /// Continuous reconcile: check every mesh pod's live redirect rules against its plan (on
    /// pod events and once per RECONCILE_INTERVAL) and re-apply them atomically on drift.
    #[arg(long, env = "RECONCILE_ENABLED", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub reconcile_enabled: bool,

    /// How often each mesh pod is checked (Go duration such as 5m, 90s, 1m30s, or seconds);
    /// the checks are spread evenly over it (one pod every interval/pods).
    #[arg(long, env = "RECONCILE_INTERVAL", default_value = "5m")]
    pub reconcile_interval: String,

    /// Controller mode (for clusters where the CNI chain cannot be used): the reconciler
    /// programs running pods opted in with the annotation
    /// `istio-pod-network-controller/initialize: "true"` (on the pod or its namespace) on first
    /// sight, and marks them `istio-pod-network-controller/initialized: "true"`.
    #[arg(long, env = "CONTROLLER_MODE", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub controller_mode: bool,

    /// Kubeconfig for the repair controller's API client (empty: in-cluster, from
    /// KUBERNETES_SERVICE_* and the service-account directory).
    #[arg(long, env = "KUBECONFIG", default_value = "")]
    pub kubeconfig: String,

    /// Print the environment variables this daemon reads, one per line, and exit.
    #[arg(long)]
    pub list_env: bool,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub cni_conf_name: Option<String>,
    pub chained: bool,
    pub net_dir: PathBuf,
    pub run_dir: PathBuf,
    pub kubeconfig_mode: u32,
    /// Mode for CNI config files we create (existing files keep theirs).
    pub conf_mode: u32,
    pub kube_ca_file: PathBuf,
    pub skip_tls_verify: bool,
    pub monitoring_port: u16,
    pub health_port: u16,
    pub listen_address: IpAddr,
    pub exclude_namespaces: Vec<String>,
    pub pod_namespace: String,
    pub native_nftables: bool,
    pub backend_choice: BackendChoice,
    pub k8s_host: String,
    pub k8s_port: u16,
    pub k8s_protocol: String,
    pub log_level: String,
    pub plugin_log_level: String,
    pub bin_source_dir: PathBuf,
    pub bin_target_dirs: Vec<PathBuf>,
    pub binaries: Vec<String>,
    pub sa_dir: PathBuf,
    pub repair: RepairConfig,
    /// The node pod cache's watch timeout (POD_WATCH_TIMEOUT_SECONDS).
    pub pod_watch_timeout: std::time::Duration,
    pub reconcile: ReconcileConfig,
    /// NODE_TAINT_KEY: the taint removed from this node (`repair.node_name`) once ready.
    pub node_taint_key: Option<String>,
    pub ambient: AmbientSettings,
}

/// Ambient mode (the node agent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AmbientSettings {
    pub enabled: bool,
    /// The configured selectors; empty: Istio's defaults (see `effective_selectors`).
    pub selectors: Vec<pod_policy::EnablementSelector>,
    pub dns_capture: bool,
    pub ipv6: bool,
    pub reconcile_on_startup: bool,
    pub detection_retry: bool,
    pub ztunnel_socket: PathBuf,
    pub disable_safe_upgrade: bool,
}

impl AmbientSettings {
    pub fn disabled() -> AmbientSettings {
        AmbientSettings {
            enabled: false,
            selectors: Vec::new(),
            dns_capture: true,
            ipv6: true,
            reconcile_on_startup: true,
            detection_retry: false,
            ztunnel_socket: PathBuf::from("/var/run/ztunnel/ztunnel.sock"),
            disable_safe_upgrade: false,
        }
    }

    pub fn effective_selectors(&self) -> Vec<pod_policy::EnablementSelector> {
        if self.selectors.is_empty() {
            pod_policy::selector::default_selectors()
        } else {
            self.selectors.clone()
        }
    }
}

/// `AMBIENT_ENABLEMENT_SELECTOR`: YAML (Istio's chart renders `toYaml`) or JSON.
fn ambient_settings(a: &Args) -> Result<AmbientSettings, ConfigError> {
    let text = a.ambient_enablement_selector.trim();
    let selectors: Vec<pod_policy::EnablementSelector> = if text.is_empty() {
        Vec::new()
    } else {
        serde_saphyr::from_str(text)
            .map_err(|e| bad("AMBIENT_ENABLEMENT_SELECTOR", text, e.to_string()))?
    };
    for (i, s) in selectors.iter().enumerate() {
        s.validate().map_err(|e| {
            bad(
                "AMBIENT_ENABLEMENT_SELECTOR",
                text,
                format!("selector {i}: {e}"),
            )
        })?;
    }
    if !a.ztunnel_uds_address.is_absolute() {
        return Err(bad(
            "ZTUNNEL_UDS_ADDRESS",
            a.ztunnel_uds_address.display().to_string(),
            "expected an absolute path",
        ));
    }
    Ok(AmbientSettings {
        enabled: a.ambient_enabled,
        selectors,
        dns_capture: a.ambient_dns_capture,
        ipv6: a.ambient_ipv6,
        reconcile_on_startup: a.ambient_reconcile_pod_rules_on_startup,
        detection_retry: a.enable_ambient_detection_retry,
        ztunnel_socket: a.ztunnel_uds_address.clone(),
        disable_safe_upgrade: a.ambient_disable_safe_upgrade,
    })
}

/// Continuous reconcile settings (RECONCILE_*).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcileConfig {
    pub enabled: bool,
    /// Each mesh pod is checked once per interval (and on its pod events).
    pub interval: Duration,
    /// CONTROLLER_MODE: program opted-in pods on first sight and annotate them.
    pub controller_mode: bool,
}

impl ReconcileConfig {
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);

    pub fn disabled() -> ReconcileConfig {
        ReconcileConfig {
            enabled: false,
            interval: Self::DEFAULT_INTERVAL,
            controller_mode: false,
        }
    }
}

/// Shortest and longest RECONCILE_INTERVAL accepted.
pub const RECONCILE_INTERVAL_MIN: Duration = Duration::from_millis(100);
pub const RECONCILE_INTERVAL_MAX: Duration = Duration::from_secs(24 * 3600);

/// Go's `time.ParseDuration` (a sequence of decimal numbers with units ns, us, µs, ms, s, m, h,
/// such as `5m`, `1.5s`, `1m30s`), plus a bare number meaning seconds.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let err = || "expected a duration such as 5m, 90s, 1m30s or 300 (seconds)".to_string();
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let n: f64 = rest[..num_len].parse().map_err(|_| err())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        rest = &rest[unit_len..];
        total += n * scale;
    }
    Duration::try_from_secs_f64(total).map_err(|_| err())
}

fn reconcile_config(a: &Args) -> Result<ReconcileConfig, ConfigError> {
    let text = a.reconcile_interval.trim();
    let interval = parse_go_duration(text).map_err(|why| bad("RECONCILE_INTERVAL", text, why))?;
    if !(RECONCILE_INTERVAL_MIN..=RECONCILE_INTERVAL_MAX).contains(&interval) {
        return Err(bad(
            "RECONCILE_INTERVAL",
            text,
            "expected a duration between 100ms and 24h",
        ));
    }
    if a.controller_mode && !a.reconcile_enabled {
        return Err(bad(
            "CONTROLLER_MODE",
            "true",
            "controller mode is part of the reconciler: it needs RECONCILE_ENABLED=true",
        ));
    }
    Ok(ReconcileConfig {
        enabled: a.reconcile_enabled,
        interval,
        controller_mode: a.controller_mode,
    })
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

/// Repair controller settings (Istio's `RepairConfig`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairConfig {
    pub enabled: bool,
    pub repair_pods: bool,
    pub delete_pods: bool,
    pub label_pods: bool,
    pub node_name: String,
    pub field_selectors: String,
    pub label_selectors: String,
    pub sidecar_annotation: String,
    pub init_container_name: String,
    pub init_exit_code: i32,
    pub init_termination_message: String,
    pub label_key: String,
    pub label_value: String,
    pub proc_root: PathBuf,
    pub kubeconfig: Option<PathBuf>,
}

impl RepairConfig {
    /// Istio's defaults, repair off (for tests and the bench).
    pub fn disabled() -> RepairConfig {
        RepairConfig {
            enabled: false,
            repair_pods: true,
            delete_pods: false,
            label_pods: false,
            node_name: String::new(),
            field_selectors: String::new(),
            label_selectors: String::new(),
            sidecar_annotation: "sidecar.istio.io/status".into(),
            init_container_name: "istio-validation".into(),
            init_exit_code: 126,
            init_termination_message: String::new(),
            label_key: "cni.istio.io/uninitialized".into(),
            label_value: "true".into(),
            proc_root: PathBuf::from("/host/proc"),
            kubeconfig: None,
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
    pub fn field_selector(&self) -> String {
        let mut parts = Vec::new();
        if !self.field_selectors.trim().is_empty() {
            parts.push(self.field_selectors.trim().to_string());
        }
        parts.push(format!("spec.nodeName={}", self.node_name));
        parts.join(",")
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid {var}={value:?}: {reason}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub reason: String,
}

fn bad(var: &'static str, value: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        value: value.into(),
        reason: reason.into(),
    }
}

/// Go's `strconv.ParseBool` (what Istio's viper accepts), so existing ConfigMaps keep working.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

/// File modes are octal whether or not they carry a leading 0 / 0o ("600" means 0600, as in chmod).
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let digits = t.strip_prefix("0o").unwrap_or(t);
    let mode =
        u32::from_str_radix(digits, 8).map_err(|_| "expected an octal file mode such as 0600")?;
    if mode > 0o777 {
        return Err("expected an octal file mode no larger than 0777".into());
    }
    Ok(mode)
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    s.parse::<BackendChoice>()
}

fn parse_log_level(s: &str) -> Result<String, String> {
    let l = s.trim().to_ascii_lowercase();
    if LOG_LEVELS.contains(&l.as_str()) {
        Ok(l)
    } else {
        Err(format!("expected one of {}", LOG_LEVELS.join("|")))
    }
}

/// Comma list with blanks dropped (Istio splits `EXCLUDE_NAMESPACES` on commas).
pub fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(String::from)
        .collect()
}

fn repair_config(a: &Args) -> Result<RepairConfig, ConfigError> {
    let node_name = [&a.repair_node_name, &a.kubernetes_node_name]
        .into_iter()
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_else(hostname);
    if (a.repair_enabled || a.reconcile_enabled || a.ambient_enabled) && node_name.is_empty() {
        return Err(bad(
            "REPAIR_NODE_NAME",
            "",
            "not set and neither KUBERNETES_NODE_NAME nor the hostname gives the node name",
        ));
    }
    if node_name.contains(',') || node_name.contains('=') {
        return Err(bad("REPAIR_NODE_NAME", node_name, "not a node name"));
    }
    if a.repair_init_container_exit_code < 0 || a.repair_init_container_exit_code > 255 {
        return Err(bad(
            "REPAIR_INIT_CONTAINER_EXIT_CODE",
            a.repair_init_container_exit_code.to_string(),
            "expected an exit code in 0..255 (0: any)",
        ));
    }
    let label_pods = a.repair_label_pods;
    if label_pods && a.repair_broken_pod_label_key.trim().is_empty() {
        return Err(bad(
            "REPAIR_BROKEN_POD_LABEL_KEY",
            "",
            "REPAIR_LABEL_PODS=true needs a label key",
        ));
    }
    if !a.repair_proc_root.is_absolute() {
        return Err(bad(
            "REPAIR_PROC_ROOT",
            a.repair_proc_root.display().to_string(),
            "expected an absolute path",
        ));
    }
    for (var, text, parsed) in [
        (
            "REPAIR_LABEL_SELECTORS",
            &a.repair_label_selectors,
            pod_policy::selector_text::Selector::labels(&a.repair_label_selectors),
        ),
        (
            "REPAIR_FIELD_SELECTORS",
            &a.repair_field_selectors,
            pod_policy::selector_text::Selector::fields(&a.repair_field_selectors),
        ),
    ] {
        if let Err(e) = parsed {
            return Err(bad(var, text.trim(), e.why));
        }
    }
    let kubeconfig = a.kubeconfig.trim();
    Ok(RepairConfig {
        enabled: a.repair_enabled,
        repair_pods: a.repair_repair_pods,
        delete_pods: a.repair_delete_pods,
        label_pods,
        node_name,
        field_selectors: a.repair_field_selectors.trim().to_string(),
        label_selectors: a.repair_label_selectors.trim().to_string(),
        sidecar_annotation: a.repair_sidecar_annotation.trim().to_string(),
        init_container_name: a.repair_init_container_name.trim().to_string(),
        init_exit_code: a.repair_init_container_exit_code,
        init_termination_message: a.repair_init_container_termination_message.clone(),
        label_key: a.repair_broken_pod_label_key.trim().to_string(),
        label_value: a.repair_broken_pod_label_value.trim().to_string(),
        proc_root: a.repair_proc_root.clone(),
        kubeconfig: (!kubeconfig.is_empty()).then(|| PathBuf::from(kubeconfig)),
    })
}

/// A taint key is a label key: `[prefix/]name`, name 1..63 of `[A-Za-z0-9._-]`, the prefix a
/// DNS subdomain. Checked here so a typo fails at startup instead of never matching a taint.
fn node_taint_key(raw: &str, node_name: &str) -> Result<Option<String>, ConfigError> {
    let key = raw.trim();
    if key.is_empty() {
        return Ok(None);
    }
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        (1..=253).contains(&p.len())
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    if !name_ok || !prefix_ok {
        return Err(bad(
            "NODE_TAINT_KEY",
            key,
            "expected a taint key such as cni.istio.io/not-ready ([dns-prefix/]name)",
        ));
    }
    if node_name.is_empty() {
        return Err(bad(
            "NODE_TAINT_KEY",
            key,
            "needs this node's name (KUBERNETES_NODE_NAME)",
        ));
    }
    Ok(Some(key.to_string()))
}

impl Config {
    pub fn from_args(a: Args) -> Result<Config, ConfigError> {
        if a.native_nftables
            && a.redirect_backend == BackendChoice::Fixed(redirect::Backend::IptablesLegacy)
        {
            return Err(bad(
                "REDIRECT_BACKEND",
                "iptables-legacy",
                "contradicts NATIVE_NFTABLES=true; set one of them",
            ));
        }
        let host = a.kubernetes_service_host.trim().to_string();
        if host.is_empty() {
            return Err(bad(
                "KUBERNETES_SERVICE_HOST",
                "",
                "not set (Kubernetes sets it in every pod; set it explicitly outside a pod)",
            ));
        }
        if host.contains('/') || host.contains(' ') || host.starts_with('[') {
            return Err(bad(
                "KUBERNETES_SERVICE_HOST",
                host,
                "expected a bare hostname or IP address (no scheme, port or brackets)",
            ));
        }
        if a.kubernetes_service_port == 0 {
            return Err(bad(
                "KUBERNETES_SERVICE_PORT",
                "0",
                "expected a port in 1..65535",
            ));
        }
        let bin_target_dirs: Vec<PathBuf> = split_list(&a.cni_bin_target_dirs)
            .into_iter()
            .map(PathBuf::from)
            .collect();
        if bin_target_dirs.is_empty() {
            return Err(bad(
                "CNI_BIN_TARGET_DIRS",
                a.cni_bin_target_dirs,
                "no directory given",
            ));
        }
        let binaries = split_list(&a.cni_binaries);
        if binaries.is_empty() || binaries.iter().any(|b| b.contains('/')) {
            return Err(bad(
                "CNI_BINARIES",
                a.cni_binaries,
                "expected comma-separated file names",
            ));
        }
        let conf_name = a.cni_conf_name.trim().to_string();
        if conf_name.contains('/') {
            return Err(bad(
                "CNI_CONF_NAME",
                conf_name,
                "expected a file name, not a path",
            ));
        }
        if !conf_name.is_empty() && cni_installer::discovery::format_of(&conf_name).is_none() {
            return Err(bad(
                "CNI_CONF_NAME",
                conf_name,
                "expected a .conf or .conflist file name",
            ));
        }
        for (var, p) in [
            ("MOUNTED_CNI_NET_DIR", &a.mounted_cni_net_dir),
            ("CNI_AGENT_RUN_DIR", &a.cni_agent_run_dir),
            ("CNI_BIN_SOURCE_DIR", &a.cni_bin_source_dir),
            ("SERVICE_ACCOUNT_DIR", &a.service_account_dir),
        ] {
            if !p.is_absolute() {
                return Err(bad(
                    var,
                    p.display().to_string(),
                    "expected an absolute path",
                ));
            }
        }
        let kube_ca_file = if a.kube_ca_file.trim().is_empty() {
            a.service_account_dir.join("ca.crt")
        } else {
            PathBuf::from(a.kube_ca_file.trim())
        };
        let repair = repair_config(&a)?;
        let reconcile = reconcile_config(&a)?;
        let node_taint_key = node_taint_key(&a.node_taint_key, &repair.node_name)?;
        let ambient = ambient_settings(&a)?;
        Ok(Config {
            cni_conf_name: (!conf_name.is_empty()).then_some(conf_name),
            chained: a.chained_cni_plugin,
            net_dir: a.mounted_cni_net_dir,
            run_dir: a.cni_agent_run_dir,
            kubeconfig_mode: a.kubeconfig_mode,
            conf_mode: if a.cni_conf_group_read { 0o640 } else { 0o600 },
            kube_ca_file,
            skip_tls_verify: a.skip_tls_verify,
            monitoring_port: a.monitoring_port,
            health_port: a.health_port,
            listen_address: a.listen_address,
            exclude_namespaces: split_list(&a.exclude_namespaces),
            pod_namespace: a.pod_namespace.trim().to_string(),
            native_nftables: a.native_nftables,
            backend_choice: a.redirect_backend,
            k8s_host: host,
            k8s_port: a.kubernetes_service_port,
            k8s_protocol: a.kubernetes_service_protocol,
            log_level: a.log_level,
            plugin_log_level: a.plugin_log_level,
            bin_source_dir: a.cni_bin_source_dir,
            bin_target_dirs,
            binaries,
            sa_dir: a.service_account_dir,
            repair,
            pod_watch_timeout: std::time::Duration::from_secs(a.pod_watch_timeout_seconds),
            reconcile,
            node_taint_key,
            ambient,
        })
    }

    /// Settings for tests and the bench (no environment involved).
    pub fn for_dirs(
        net_dir: PathBuf,
        run_dir: PathBuf,
        bin_source: PathBuf,
        bin_target: PathBuf,
        sa_dir: PathBuf,
    ) -> Config {
        Config {
            cni_conf_name: None,
            chained: true,
            net_dir,
            run_dir,
            kubeconfig_mode: 0o600,
            conf_mode: 0o600,
            kube_ca_file: sa_dir.join("ca.crt"),
            skip_tls_verify: false,
            monitoring_port: 0,
            health_port: 0,
            listen_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            exclude_namespaces: Vec::new(),
            pod_namespace: String::new(),
            native_nftables: false,
            backend_choice: BackendChoice::Auto,
            k8s_host: "10.96.0.1".into(),
            k8s_port: 443,
            k8s_protocol: "https".into(),
            log_level: "info".into(),
            plugin_log_level: "info".into(),
            bin_source_dir: bin_source,
            bin_target_dirs: vec![bin_target],
            binaries: vec!["istio-cni".into(), "istio-nftables".into()],
            sa_dir,
            repair: RepairConfig::disabled(),
            pod_watch_timeout: node_view::cache::DEFAULT_WATCH_TIMEOUT,
            reconcile: ReconcileConfig::disabled(),
            node_taint_key: None,
            ambient: AmbientSettings::disabled(),
        }
    }

    /// The namespaces the plugin leaves alone.
    pub fn scope(&self) -> pod_policy::Scope {
        pod_policy::Scope {
            exclude_namespaces: self.exclude_namespaces.clone(),
            cni_namespace: self.pod_namespace.clone(),
        }
    }

    /// The plugin's policy in ambient mode (the node agent's).
    pub fn ambient_policy(&self) -> pod_policy::Policy {
        pod_policy::Policy {
            scope: self.scope(),
            ambient: Some(self.ambient.effective_selectors()),
        }
    }

    /// The plugin's policy for sidecar pods (ambient pods are the node agent's).
    pub fn sidecar_policy(&self) -> pod_policy::Policy {
        pod_policy::Policy {
            scope: self.scope(),
            ambient: None,
        }
    }

    /// The installer's part.
    pub fn installer(&self) -> cni_installer::Settings {
        cni_installer::Settings {
            cni_conf_name: self.cni_conf_name.clone(),
            chained: self.chained,
            net_dir: self.net_dir.clone(),
            run_dir: self.run_dir.clone(),
            kubeconfig_mode: self.kubeconfig_mode,
            conf_mode: self.conf_mode,
            api: self.api_server(),
            bin_source_dir: self.bin_source_dir.clone(),
            bin_target_dirs: self.bin_target_dirs.clone(),
            binaries: self.binaries.clone(),
            sa_dir: self.sa_dir.clone(),
        }
    }

    /// How the daemon reaches the API server.
    pub fn api_server(&self) -> node_view::client::ApiServer {
        node_view::client::ApiServer {
            host: self.k8s_host.clone(),
            port: self.k8s_port,
            protocol: self.k8s_protocol.clone(),
            ca_file: self.kube_ca_file.clone(),
            skip_tls_verify: self.skip_tls_verify,
            token_file: self.token_path(),
            kubeconfig: self.repair.kubeconfig.clone(),
        }
    }

    pub fn kubeconfig_path(&self) -> PathBuf {
        self.run_dir.join(cni_config::KUBECONFIG_FILE)
    }

    pub fn token_path(&self) -> PathBuf {
        self.sa_dir.join("token")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(env: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["install-cni", "--kubernetes-service-host", "10.96.0.1"];
        argv.extend_from_slice(env);
        let a = Args::try_parse_from(argv).map_err(|e| e.to_string())?;
        Config::from_args(a).map_err(|e| e.to_string())
    }

    #[test]
    fn istio_defaults() {
        let c = parse(&[]).unwrap();
        assert!(c.chained);
        assert_eq!(c.net_dir, PathBuf::from("/host/etc/cni/net.d"));
        assert_eq!(c.run_dir, PathBuf::from("/var/run/istio-cni"));
        assert_eq!(c.kubeconfig_mode, 0o600);
        assert_eq!(c.conf_mode, 0o600);
        assert_eq!(c.monitoring_port, 15014);
        assert_eq!(c.health_port, 8000);
        assert_eq!(
            c.kube_ca_file,
            PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
        );
        assert_eq!(c.bin_target_dirs, vec![PathBuf::from("/host/opt/cni/bin")]);
        assert_eq!(c.binaries, vec!["istio-cni", "istio-nftables"]);
        assert_eq!(c.backend_choice, BackendChoice::Auto);
        assert_eq!(c.k8s_protocol, "https");
        assert_eq!(c.k8s_port, 443);
        let r = &c.repair;
        assert!(r.enabled && r.repair_pods && !r.delete_pods && !r.label_pods);
        assert_eq!(r.action(), Some(RepairAction::Repair));
        assert_eq!(r.sidecar_annotation, "sidecar.istio.io/status");
        assert_eq!(r.init_container_name, "istio-validation");
        assert_eq!(r.init_exit_code, 126);
        assert_eq!(r.label_key, "cni.istio.io/uninitialized");
        assert_eq!(r.label_value, "true");
        assert_eq!(r.proc_root, PathBuf::from("/host/proc"));
        assert_eq!(r.kubeconfig, None);
        assert!(!r.node_name.is_empty(), "falls back to the hostname");
    }

    #[test]
    fn repair_settings() {
        let c = parse(&[
            "--repair-repair-pods=false",
            "--repair-delete-pods=true",
            "--repair-label-pods=true",
            "--kubernetes-node-name=node-b",
            "--repair-field-selectors=status.phase=Running",
            "--repair-init-container-exit-code=0",
            "--kubeconfig=/tmp/kc",
        ])
        .unwrap();
        let r = &c.repair;
        assert_eq!(r.action(), Some(RepairAction::Delete));
        assert_eq!(r.node_name, "node-b");
        assert_eq!(
            r.field_selector(),
            "status.phase=Running,spec.nodeName=node-b"
        );
        assert_eq!(r.init_exit_code, 0);
        assert_eq!(r.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        let c = parse(&[
            "--repair-node-name=node-a",
            "--kubernetes-node-name=node-b",
            "--repair-repair-pods=false",
            "--repair-label-pods=true",
        ])
        .unwrap();
        assert_eq!(c.repair.node_name, "node-a");
        assert_eq!(c.repair.field_selector(), "spec.nodeName=node-a");
        assert_eq!(c.repair.action(), Some(RepairAction::Label));
        let c = parse(&["--repair-repair-pods=0"]).unwrap();
        assert_eq!(c.repair.action(), None);
    }

    #[test]
    fn values_parse_like_istio() {
        let c = parse(&[
            "--chained-cni-plugin=F",
            "--kubeconfig-mode=640",
            "--cni-conf-group-read=1",
            "--exclude-namespaces= kube-system, ,istio-system",
            "--redirect-backend=iptables-legacy",
            "--plugin-log-level=DEBUG",
        ])
        .unwrap();
        assert!(!c.chained);
        assert_eq!(c.kubeconfig_mode, 0o640);
        assert_eq!(c.conf_mode, 0o640);
        assert_eq!(c.exclude_namespaces, vec!["kube-system", "istio-system"]);
        assert_eq!(c.plugin_log_level, "debug");
        assert_eq!(parse_mode("0o600"), Ok(0o600));
    }

    #[test]
    fn node_taint_key_is_checked() {
        assert_eq!(parse(&[]).unwrap().node_taint_key, None);
        let c = parse(&["--node-taint-key", " cni.istio.io/not-ready "]).unwrap();
        assert_eq!(c.node_taint_key.as_deref(), Some("cni.istio.io/not-ready"));
        assert!(parse(&["--node-taint-key", "plain-key"]).is_ok());
        for bad in ["a b", "x/", "/x", "Upper.Case/x", "-x", &"k".repeat(64)] {
            let e = parse(&[&format!("--node-taint-key={bad}")]).unwrap_err();
            assert!(e.contains("NODE_TAINT_KEY"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (args, needle) in [
            (vec!["--monitoring-port=abc"], "MONITORING_PORT"),
            (vec!["--kubeconfig-mode=0999"], "KUBECONFIG_MODE"),
            (vec!["--kubeconfig-mode=1777"], "KUBECONFIG_MODE"),
            (vec!["--chained-cni-plugin=yes"], "CHAINED_CNI_PLUGIN"),
            (vec!["--redirect-backend=ebpf"], "REDIRECT_BACKEND"),
            (
                vec![
                    "--native-nftables=true",
                    "--redirect-backend=iptables-legacy",
                ],
                "REDIRECT_BACKEND",
            ),
            (vec!["--cni-conf-name=../x.conf"], "CNI_CONF_NAME"),
            (vec!["--cni-conf-name=x.json"], "CNI_CONF_NAME"),
            (
                vec!["--mounted-cni-net-dir=relative"],
                "MOUNTED_CNI_NET_DIR",
            ),
            (
                vec!["--kubernetes-service-host=https://x"],
                "KUBERNETES_SERVICE_HOST",
            ),
            (
                vec!["--ambient-enablement-selector=[{podSelectr: {}}]"],
                "AMBIENT_ENABLEMENT_SELECTOR",
            ),
            (
                vec![
                    "--ambient-enablement-selector=[{podSelector: {matchExpressions: [{key: k, operator: In}]}}]",
                ],
                "AMBIENT_ENABLEMENT_SELECTOR",
            ),
            (
                vec!["--ztunnel-uds-address=ztunnel.sock"],
                "ZTUNNEL_UDS_ADDRESS",
            ),
            (vec!["--log-level=chatty"], "LOG_LEVEL"),
            (vec!["--repair-enabled=yes"], "REPAIR_ENABLED"),
            (
                vec!["--repair-init-container-exit-code=300"],
                "REPAIR_INIT_CONTAINER_EXIT_CODE",
            ),
            (
                vec!["--repair-init-container-exit-code=x"],
                "REPAIR_INIT_CONTAINER_EXIT_CODE",
            ),
            (vec!["--repair-proc-root=proc"], "REPAIR_PROC_ROOT"),
            (
                vec!["--repair-label-pods=true", "--repair-broken-pod-label-key="],
                "REPAIR_BROKEN_POD_LABEL_KEY",
            ),
            (
                vec!["--repair-label-selectors=app in web"],
                "REPAIR_LABEL_SELECTORS",
            ),
            (
                vec!["--repair-field-selectors=status.phase"],
                "REPAIR_FIELD_SELECTORS",
            ),
            (vec!["--pod-watch-timeout-seconds=0"], "0"),
        ] {
            let err = parse(&args).unwrap_err();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn reconcile_interval_is_a_go_duration() {
        let c = parse(&[]).unwrap();
        assert!(c.reconcile.enabled);
        assert_eq!(c.reconcile.interval, Duration::from_secs(300));
        for (text, want) in [
            ("90s", Duration::from_secs(90)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("500ms", Duration::from_millis(500)),
            ("120", Duration::from_secs(120)),
        ] {
            let c = parse(&["--reconcile-interval", text]).unwrap();
            assert_eq!(c.reconcile.interval, want, "{text}");
        }
        for (text, why) in [
            ("5 minutes", "expected a duration"),
            ("m", "expected a duration"),
            ("-1s", "expected a duration"),
            ("", "expected a duration"),
            ("1ms", "between 100ms and 24h"),
            ("0", "between 100ms and 24h"),
            ("25h", "between 100ms and 24h"),
        ] {
            let arg = format!("--reconcile-interval={text}");
            let err = parse(&[&arg]).unwrap_err();
            assert!(
                err.contains("RECONCILE_INTERVAL") && err.contains(why),
                "{text}: {err}"
            );
        }
        let c = parse(&["--reconcile-enabled", "false"]).unwrap();
        assert!(!c.reconcile.enabled);
        assert!(!c.reconcile.controller_mode);
        let c = parse(&["--controller-mode", "true"]).unwrap();
        assert!(c.reconcile.controller_mode);
        let err = parse(&["--controller-mode", "true", "--reconcile-enabled", "false"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("CONTROLLER_MODE"), "{err}");
    }

    #[test]
    fn every_env_var_is_a_flag() {
        use clap::CommandFactory;
        let cmd = Args::command();
        let mut envs: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
            .collect();
        envs.sort();
        let mut listed: Vec<String> = ENV_VARS.iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(envs, listed);
    }
}
