//! Settings: every one has Istio's environment variable name and default (istio-reference §5.2)
//! and a `--flag`. Parsing is strict: a value we cannot use is a startup error that names the
//! variable and the value, never a silent fallback (a typo in a ConfigMap must not quietly
//! install a different configuration on every node).
//!
//! One module per job turns its variables into that crate's typed settings: [`installer`]
//! (`cni_installer::Settings`), [`view`] (`node_view::Settings`), [`guard`] (the guardian: repair,
//! reconcile, taint) and [`ambient`] (`ambient_agent::Settings`); the node-wide ones (logging,
//! listeners, the plugin's scope and backend) are here.

pub mod ambient;
pub mod guard;
pub mod installer;
pub mod logging;
pub mod view;

use clap::{ArgAction, Parser};
use redirect::BackendChoice;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

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
    #[command(flatten)]
    pub install: installer::InstallArgs,

    /// Prometheus /metrics port; 0 or negative: no metrics listener (as Istio); `any`: any
    /// free port, logged (ours, for tests).
    #[arg(long, env = "MONITORING_PORT", default_value = "15014", value_parser = parse_monitoring_port, allow_hyphen_values = true)]
    pub monitoring_port: MonitoringPort,

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

    /// Istio's system namespace, where ztunnel runs: its `app=ztunnel` pods bypass the plugin
    /// and the agent (Istio's `IsZtunnelPod`).
    #[arg(long, env = "SYSTEM_NAMESPACE", default_value = "istio-system")]
    pub system_namespace: String,

    /// Istio's: the daemon runs in a pod network (Istio's chart), so its node-level work (the
    /// host probe rule, the node backend's probe) enters the host's namespace,
    /// `<REPAIR_PROC_ROOT>/1/ns/net`. Our chart runs it in the host's network: not needed.
    #[arg(long, env = "ALLOW_SWITCH_TO_HOST_NS", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub allow_switch_to_host_ns: bool,

    /// Istio's switch for nftables; true means REDIRECT_BACKEND=nft.
    #[arg(long, env = "NATIVE_NFTABLES", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub native_nftables: bool,

    /// auto | nft | iptables-legacy: how pods on this node get their rules (auto: decided from
    /// the host namespace at startup).
    #[arg(long, env = "REDIRECT_BACKEND", default_value = "auto", value_parser = parse_backend)]
    pub redirect_backend: BackendChoice,

    /// Istio's: legacy | nft forces that iptables flavour; here it fixes the backend
    /// (iptables-legacy, or nft, this project's nftables) when REDIRECT_BACKEND is auto and
    /// NATIVE_NFTABLES is off (with it, ignored as in Istio).
    #[arg(long, env = "FORCE_IPTABLES_BINARY", default_value = "")]
    pub force_iptables_binary: String,

    /// This daemon's log level (error|warn|info|debug|trace).
    #[arg(long, env = "LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub log_level: String,

    /// The plugin's log level, written into its config as plugin_log_level.
    #[arg(long, env = "PLUGIN_LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub plugin_log_level: String,

    /// On shutdown, remove the install even while the DaemonSet still exists (no safe upgrade,
    /// in either mode; Istio's name).
    #[arg(long, env = "AMBIENT_DISABLE_SAFE_UPGRADE", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub ambient_disable_safe_upgrade: bool,

    #[command(flatten)]
    pub logs: logging::LogArgs,

    #[command(flatten)]
    pub view: view::ViewArgs,

    #[command(flatten)]
    pub ambient: ambient::AmbientArgs,

    #[command(flatten)]
    pub repair: guard::RepairArgs,

    #[command(flatten)]
    pub reconcile: guard::ReconcileArgs,

    /// Print the environment variables this daemon reads, one per line, and exit.
    #[arg(long)]
    pub list_env: bool,
}

/// Every environment variable the daemon reads, in `--help` order (`install-cni --list-env`
/// prints it; the deploy checks compare it with the Helm chart's env).
pub fn env_vars() -> Vec<String> {
    use clap::CommandFactory;
    Args::command()
        .get_arguments()
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect()
}

/// Validated settings: the node-wide ones, and each job's.
#[derive(Debug, Clone)]
pub struct Config {
    /// `None`: no metrics listener (`MONITORING_PORT` 0 or negative); `Some(0)`: any free port.
    pub monitoring_port: Option<u16>,
    pub health_port: u16,
    pub listen_address: IpAddr,
    /// Where node-level work runs when the daemon is not in the host's network
    /// (`ALLOW_SWITCH_TO_HOST_NS`): the host's namespace under the host's /proc.
    pub host_netns: Option<PathBuf>,
    /// The namespaces the plugin leaves alone (`EXCLUDE_NAMESPACES`, `POD_NAMESPACE`).
    pub scope: pod_policy::Scope,
    pub native_nftables: bool,
    pub backend_choice: BackendChoice,
    /// The daemon's logging (LOG_LEVEL and Istio's `--log_*` flags).
    pub logging: logging::Logging,
    pub plugin_log_level: String,
    pub installer: cni_installer::Settings,
    pub view: node_view::Settings,
    pub repair: guardian::RepairSettings,
    pub reconcile: guardian::ReconcileSettings,
    /// NODE_TAINT_KEY: the taint removed from this node (`view.node_name`) once ready.
    pub node_taint_key: Option<String>,
    /// On shutdown, whether the install stays for the next daemon while the DaemonSet lives.
    pub safe_upgrade: cni_installer::upgrade::Context,
    pub ambient: ambient_agent::Settings,
}

/// REDIRECT_BACKEND, else Istio's FORCE_IPTABLES_BINARY (unless NATIVE_NFTABLES, which wins
/// over it in Istio too), else auto.
fn backend_choice(a: &Args) -> Result<BackendChoice, ConfigError> {
    let forced = a.force_iptables_binary.trim();
    if a.redirect_backend != BackendChoice::Auto || a.native_nftables || forced.is_empty() {
        return Ok(a.redirect_backend);
    }
    match redirect::Backend::from_istio_binary(forced) {
        Some(backend) => Ok(BackendChoice::Fixed(backend)),
        None => Err(bad(
            "FORCE_IPTABLES_BINARY",
            forced,
            "expected legacy or nft (Istio's values)",
        )),
    }
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
        let watches_pods =
            a.repair.repair_enabled || a.reconcile.reconcile_enabled || a.ambient.ambient_enabled;
        let view = view::settings(&a.view, watches_pods)?;
        let node_name = view.node_name.clone();
        let installer = installer::settings(&a.install, view.api.clone())?;
        let repair = guard::repair(&a.repair)?;
        let reconcile = guard::reconcile(&a.reconcile)?;
        let node_taint_key = guard::node_taint_key(&a.reconcile.node_taint_key, &view.node_name)?;
        let ambient = ambient::settings(&a.ambient)?;
        let logging = logging::settings(&a.logs, &a.log_level)?;
        Ok(Config {
            monitoring_port: a.monitoring_port.0,
            health_port: a.health_port,
            listen_address: a.listen_address,
            host_netns: a
                .allow_switch_to_host_ns
                .then(|| view.proc_root.join("1/ns/net")),
            scope: pod_policy::Scope {
                exclude_namespaces: split_list(&a.exclude_namespaces),
                cni_namespace: a.pod_namespace.trim().to_string(),
                system_namespace: a.system_namespace.trim().to_string(),
            },
            native_nftables: a.native_nftables,
            backend_choice: backend_choice(&a)?,
            plugin_log_level: logging.plugin_level.clone().unwrap_or(a.plugin_log_level),
            logging,
            installer,
            view,
            repair,
            reconcile,
            node_taint_key,
            safe_upgrade: cni_installer::upgrade::Context {
                disabled: a.ambient_disable_safe_upgrade,
                namespace: a.pod_namespace.trim().to_string(),
                node_name,
            },
            ambient,
        })
    }

    /// The plugin's policy in ambient mode (the node agent's).
    pub fn ambient_policy(&self) -> pod_policy::Policy {
        pod_policy::Policy {
            scope: self.scope.clone(),
            ambient: Some(self.ambient.effective_selectors()),
        }
    }

    /// The plugin's policy for sidecar pods (ambient pods are the node agent's).
    pub fn sidecar_policy(&self) -> pod_policy::Policy {
        pod_policy::Policy {
            scope: self.scope.clone(),
            ambient: None,
        }
    }

    /// The guardian's view of the node, with the node's backend decided at startup.
    pub fn guarded_node(&self, backend: redirect::Backend) -> guardian::Node {
        guardian::Node {
            name: self.view.node_name.clone(),
            proc_root: self.view.proc_root.clone(),
            backend,
            policy: self.sidecar_policy(),
        }
    }

    /// The plugin entry for this node: settings plus the backend decision.
    pub fn plugin_settings(&self, backend: redirect::Backend) -> cni_config::PluginSettings {
        cni_config::PluginSettings {
            plugin_log_level: self.plugin_log_level.clone(),
            cni_agent_run_dir: self.installer.run_dir.display().to_string(),
            exclude_namespaces: self.scope.exclude_namespaces.clone(),
            pod_namespace: self.scope.cni_namespace.clone(),
            system_namespace: self.scope.system_namespace.clone(),
            native_nftables: backend == redirect::Backend::Nft,
            redirect_backend: backend.to_string(),
            ambient_enabled: self.ambient.enabled,
            enablement_selectors: if self.ambient.enabled {
                self.ambient.effective_selectors()
            } else {
                Vec::new()
            },
            enable_ambient_detection_retry: self.ambient.detection_retry,
            ..cni_config::PluginSettings::default()
        }
    }
}

/// An absolute path, or an error naming the variable.
pub(crate) fn absolute<'a>(var: &'static str, p: &'a Path) -> Result<&'a Path, ConfigError> {
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(bad(
            var,
            p.display().to_string(),
            "expected an absolute path",
        ))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid {var}={value:?}: {reason}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub reason: String,
}

pub(crate) fn bad(
    var: &'static str,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> ConfigError {
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

/// An integer as Istio's viper (spf13/cast) and pflag read one: Go's `strconv.ParseInt(s, 0,
/// 64)`, the base from the prefix (`0x` hex, `0o` or a bare leading `0` octal, `0b` binary, else
/// decimal; `_` between digits), after cast's trimming of a zero decimal part (`600.0`).
pub fn parse_go_int(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let t = match t.split_once('.') {
        Some((int, frac))
            if !int.is_empty() && !frac.is_empty() && frac.bytes().all(|b| b == b'0') =>
        {
            int
        }
        _ => t,
    };
    let (neg, body) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(r) = lower.strip_prefix("0x") {
        (16, r)
    } else if let Some(r) = lower.strip_prefix("0o") {
        (8, r)
    } else if let Some(r) = lower.strip_prefix("0b") {
        (2, r)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    let underscores_ok =
        !digits.starts_with('_') && !digits.ends_with('_') && !digits.contains("__");
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    if clean.is_empty() || !underscores_ok || clean.starts_with(['+', '-']) {
        return Err("expected an integer".into());
    }
    let v = i64::from_str_radix(&clean, radix).map_err(|_| "expected an integer")?;
    Ok(if neg { -v } else { v })
}

/// `KUBECONFIG_MODE` as Istio reads it (an integer, [`parse_go_int`]): `0600`, `0o600` and
/// `384` are all mode 0600; `600` is decimal 600 (0o1130), which Istio would apply as 0130 (the
/// owner cannot read), so a value beyond 0777 is refused rather than written.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let v = parse_go_int(s).map_err(|_| "expected a file mode such as 0600 (octal) or 384")?;
    match u32::try_from(v) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!(
            "{v} is {v:#o}, beyond 0777 (Go reads an integer without a leading 0 as decimal: \
             write 0600, not 600)"
        )),
    }
}

/// `MONITORING_PORT`: `None` when 0 or negative (Istio switches /metrics off), `Some(0)` for
/// `any`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MonitoringPort(pub Option<u16>);

fn parse_monitoring_port(s: &str) -> Result<MonitoringPort, String> {
    if s.trim() == "any" {
        return Ok(MonitoringPort(Some(0)));
    }
    let v = parse_go_int(s).map_err(|_| "expected a port number, 0 (off) or any")?;
    if v <= 0 {
        return Ok(MonitoringPort(None));
    }
    u16::try_from(v)
        .map(|p| MonitoringPort(Some(p)))
        .map_err(|_| format!("{v} is not a port (1..65535; 0 or negative: off)"))
}

fn parse_backend(s: &str) -> Result<BackendChoice, redirect::UnknownBackend> {
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
#[cfg(test)]
mod tests {
    use super::*;
    use guardian::RepairAction;
    use std::path::PathBuf;
    use std::time::Duration;

    fn parse(env: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["install-cni", "--kubernetes-service-host", "10.96.0.1"];
        argv.extend_from_slice(env);
        let a = Args::try_parse_from(argv).map_err(|e| e.to_string())?;
        Config::from_args(a).map_err(|e| e.to_string())
    }

    #[test]
    fn istio_defaults() {
        let c = parse(&[]).unwrap();
        let i = &c.installer;
        assert!(i.chained);
        assert_eq!(i.net_dir, PathBuf::from("/host/etc/cni/net.d"));
        assert_eq!(i.run_dir, PathBuf::from("/var/run/istio-cni"));
        assert_eq!(i.kubeconfig_mode, 0o600);
        assert_eq!(i.conf_mode, 0o600);
        assert_eq!(c.monitoring_port, Some(15014));
        assert_eq!(c.health_port, 8000);
        assert_eq!(
            c.view.api.ca_file,
            PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
        );
        assert_eq!(i.bin_target_dirs, vec![PathBuf::from("/host/opt/cni/bin")]);
        assert_eq!(i.binaries, vec!["istio-cni", "istio-nftables"]);
        assert_eq!(c.backend_choice, BackendChoice::Auto);
        assert_eq!(c.view.api.protocol, "https");
        assert_eq!(c.view.api.port, 443);
        assert_eq!(
            i.api, c.view.api,
            "the plugin's kubeconfig points where the daemon goes"
        );
        let r = &c.repair;
        assert!(r.enabled && r.repair_pods && !r.delete_pods && !r.label_pods);
        assert_eq!(r.action(), Some(RepairAction::Repair));
        assert_eq!(r.sidecar_annotation, "sidecar.istio.io/status");
        assert_eq!(r.init_container_name, "istio-validation");
        assert_eq!(r.init_exit_code, 126);
        assert_eq!(r.label_key, "cni.istio.io/uninitialized");
        assert_eq!(r.label_value, "true");
        assert_eq!(c.view.proc_root, PathBuf::from("/host/proc"));
        assert_eq!(c.view.api.kubeconfig, None);
        assert!(!c.view.node_name.is_empty(), "falls back to the hostname");
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
        assert_eq!(c.view.node_name, "node-b");
        assert_eq!(
            r.field_selector(&c.view.node_name),
            "status.phase=Running,spec.nodeName=node-b"
        );
        assert_eq!(r.init_exit_code, 0);
        assert_eq!(c.view.api.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        let c = parse(&[
            "--repair-node-name=node-a",
            "--kubernetes-node-name=node-b",
            "--repair-repair-pods=false",
            "--repair-label-pods=true",
        ])
        .unwrap();
        assert_eq!(c.view.node_name, "node-a");
        assert_eq!(
            c.repair.field_selector(&c.view.node_name),
            "spec.nodeName=node-a"
        );
        assert_eq!(c.repair.action(), Some(RepairAction::Label));
        let c = parse(&["--repair-repair-pods=0"]).unwrap();
        assert_eq!(c.repair.action(), None);
    }

    #[test]
    fn values_parse_like_istio() {
        let c = parse(&[
            "--chained-cni-plugin=F",
            "--kubeconfig-mode=0640",
            "--cni-conf-group-read=1",
            "--exclude-namespaces= kube-system, ,istio-system",
            "--redirect-backend=iptables-legacy",
            "--plugin-log-level=DEBUG",
        ])
        .unwrap();
        assert!(!c.installer.chained);
        assert_eq!(c.installer.kubeconfig_mode, 0o640);
        assert_eq!(c.installer.conf_mode, 0o640);
        assert_eq!(
            c.scope.exclude_namespaces,
            vec!["kube-system", "istio-system"]
        );
        assert_eq!(c.plugin_log_level, "debug");
        assert_eq!(parse_mode("0o600"), Ok(0o600));
    }

    #[test]
    fn kubeconfig_mode_is_a_go_integer() {
        for (text, want) in [
            ("0600", 0o600),
            ("384", 0o600),
            ("0o600", 0o600),
            ("0x180", 0o600),
            ("0640", 0o640),
            (" 0600 ", 0o600),
            ("384.0", 0o600),
            ("0", 0),
        ] {
            let c = parse(&[&format!("--kubeconfig-mode={text}")]).unwrap();
            assert_eq!(c.installer.kubeconfig_mode, want, "{text}");
        }
        // Go reads 600 as decimal (0o1130): refused, not applied as Istio's 0130.
        for text in ["600", "0999", "-1", "0o", "6_", "abc"] {
            let e = parse(&[&format!("--kubeconfig-mode={text}")]).unwrap_err();
            assert!(e.contains("KUBECONFIG_MODE"), "{text}: {e}");
        }
        assert!(
            parse(&["--kubeconfig-mode=600"])
                .unwrap_err()
                .contains("0600")
        );
        assert_eq!(parse_go_int("1_000"), Ok(1000));
        assert_eq!(parse_go_int("0b101"), Ok(5));
    }

    #[test]
    fn monitoring_port_zero_or_negative_is_off() {
        for (text, want) in [
            ("0", None),
            ("-1", None),
            ("any", Some(0)),
            ("15014", Some(15014)),
        ] {
            let c = parse(&[&format!("--monitoring-port={text}")]).unwrap();
            assert_eq!(c.monitoring_port, want, "{text}");
        }
        for text in ["70000", "abc", ""] {
            let e = parse(&[&format!("--monitoring-port={text}")]).unwrap_err();
            assert!(e.contains("MONITORING_PORT"), "{text}: {e}");
        }
    }

    #[test]
    fn istio_log_flags_start_the_daemon() {
        // Istio's DaemonSet args, both flag forms, and the plugin's level from its scope.
        let c = parse(&["--log_output_level=info", "--log_as_json"]).unwrap();
        assert!(c.logging.json);
        assert_eq!(c.logging.filter, "info");
        assert_eq!(c.plugin_log_level, "info");
        let c = parse(&[
            "--log_output_level",
            "default:warn,cni-plugin:debug",
            "--plugin-log-level=error",
        ])
        .unwrap();
        assert_eq!(c.plugin_log_level, "debug", "the scope wins, as in Istio");
        assert!(c.logging.filter.starts_with("warn,"));
        let c = parse(&["--log-level=debug"]).unwrap();
        assert_eq!(c.logging.filter, "debug");
        assert_eq!(
            parse(&[]).unwrap().logging.filter,
            "info",
            "Istio's default"
        );
        let e = parse(&["--log_output_level=default:loud"]).unwrap_err();
        assert!(e.contains("--log_output_level"), "{e}");
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
            (vec!["--host-probe-snat-ip=0.0.0.0"], "HOST_PROBE_SNAT_IP"),
            (vec!["--host-probe-snat-ip=fd00::1"], "HOST_PROBE_SNAT_IP"),
            (
                vec!["--host-probe-snat-ipv6=ff02::1"],
                "HOST_PROBE_SNAT_IPV6",
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
    fn force_iptables_binary_fixes_the_backend_unless_something_stronger_is_set() {
        let legacy = BackendChoice::Fixed(redirect::Backend::IptablesLegacy);
        let nft = BackendChoice::Fixed(redirect::Backend::Nft);
        let choice = |args: &[&str]| parse(args).unwrap().backend_choice;
        assert_eq!(choice(&[]), BackendChoice::Auto);
        assert_eq!(choice(&["--force-iptables-binary=legacy"]), legacy);
        assert_eq!(choice(&["--force-iptables-binary=nft"]), nft);
        let native = ["--force-iptables-binary=legacy", "--native-nftables=true"];
        assert_eq!(choice(&native), BackendChoice::Auto);
        let both = ["--force-iptables-binary=legacy", "--redirect-backend=nft"];
        assert_eq!(choice(&both), nft);
        let e = parse(&["--force-iptables-binary=iptables"]).unwrap_err();
        assert!(e.contains("FORCE_IPTABLES_BINARY"), "{e}");
    }

    #[test]
    fn the_node_name_falls_back_to_istios_node_name() {
        let c = parse(&["--repair-node-name=", "--node-name=node-7"]).unwrap();
        assert_eq!(c.view.node_name, "node-7");
        let c = parse(&["--repair-node-name=a", "--node-name=node-7"]).unwrap();
        assert_eq!(c.view.node_name, "a");
    }

    #[test]
    fn allow_switch_to_host_ns_enters_the_host_procs_pid_1_namespace() {
        assert_eq!(parse(&[]).unwrap().host_netns, None);
        let c = parse(&["--allow-switch-to-host-ns=true"]).unwrap();
        assert_eq!(c.host_netns, Some(PathBuf::from("/host/proc/1/ns/net")));
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
    fn every_env_var_is_named_once() {
        let mut envs = env_vars();
        let n = envs.len();
        envs.sort();
        envs.dedup();
        assert_eq!(envs.len(), n, "an env var is read by two flags");
        for v in [
            "CNI_CONF_NAME",
            "KUBECONFIG",
            "AMBIENT_ENABLED",
            "REPAIR_PROC_ROOT",
            "NODE_TAINT_KEY",
        ] {
            assert!(envs.iter().any(|e| e == v), "{v}");
        }
    }
}
