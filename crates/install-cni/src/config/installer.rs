//! The file installer's settings (`CNI_*`, `MOUNTED_CNI_NET_DIR`, `KUBECONFIG_MODE`, ...).

use super::{ConfigError, absolute, bad, parse_bool, parse_mode, split_list};
use clap::{ArgAction, Args};
use node_view::client::ApiServer;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct InstallArgs {
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

    /// File mode of the kubeconfig, an integer as Istio (Go) reads it: 0600 or 0o600 (octal),
    /// 384 (decimal); a value beyond 0777 (e.g. decimal 600) is refused.
    #[arg(long, env = "KUBECONFIG_MODE", default_value = "0600", value_parser = parse_mode)]
    pub kubeconfig_mode: u32,

    /// New CNI config files get mode 0640 instead of 0600.
    #[arg(long, env = "CNI_CONF_GROUP_READ", default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub cni_conf_group_read: bool,

    /// Directory in the image holding the binaries to install.
    #[arg(long, env = "CNI_BIN_SOURCE_DIR", default_value = "/opt/cni/bin")]
    pub cni_bin_source_dir: PathBuf,

    /// Comma-separated host bin directories to install into.
    #[arg(long, env = "CNI_BIN_TARGET_DIRS", default_value = "/host/opt/cni/bin")]
    pub cni_bin_target_dirs: String,

    /// Comma-separated binary names copied from the source dir.
    #[arg(long, env = "CNI_BINARIES", default_value = "istio-cni,istio-nftables")]
    pub cni_binaries: String,

    /// Keep the primary's config with istio-cni in a file of our own that sorts first
    /// (ISTIO_OWNED_CNI_CONFIG_FILENAME) instead of writing into the primary's file: a primary
    /// that rewrites its file (at boot, before this daemon is back) cannot take istio-cni out of
    /// the chain, so no pod starts uncaptured. Chained mode only, both modes; removed on
    /// uninstall, kept across a rollout. On by default (Istio: opt-in, ambient only).
    #[arg(long, env = "ISTIO_OWNED_CNI_CONFIG", default_value = OWNED_DEFAULT, value_parser = parse_bool, action = ArgAction::Set)]
    pub istio_owned_cni_config: bool,

    /// The file name of that config (empty: 02-istio-cni.conflist); it must sort before the
    /// primary's, or istio-cni is chained into the primary's file instead.
    #[arg(long, env = "ISTIO_OWNED_CNI_CONFIG_FILENAME", default_value = "")]
    pub istio_owned_cni_config_filename: String,
}

/// `ISTIO_OWNED_CNI_CONFIG`'s default: on, in both modes (Istio's is false, and only ambient
/// mode reads it). Measured on a rebooted node (integration/tests/reboot.rs): without it a
/// sidecar pod started before the daemon is back runs with its app's outbound and inbound
/// traffic bypassing the sidecar; with it the pod's ADD fails closed until the daemon is back
/// and the runtime's retry is captured (excluded namespaces start meanwhile).
pub const OWNED_DEFAULT: &str = "true";

/// `ISTIO_OWNED_CNI_CONFIG_FILENAME`: a file name ending `.conflist` (the file is a list; Istio
/// renames a `.conf` it wrote to `.conflist`, so a `.conf` name is taken as that `.conflist`).
fn owned_conf_name(a: &InstallArgs, conf_name: &str) -> Result<String, ConfigError> {
    const VAR: &str = "ISTIO_OWNED_CNI_CONFIG_FILENAME";
    let raw = a.istio_owned_cni_config_filename.trim();
    let name = match raw {
        "" => cni_installer::owned::DEFAULT_NAME.to_string(),
        n if n.ends_with(".conf") => format!("{n}list"),
        n => n.to_string(),
    };
    if name.contains('/') || name.starts_with('.') {
        return Err(bad(VAR, raw, "expected a file name, not a path"));
    }
    if !name.ends_with(".conflist") {
        return Err(bad(VAR, raw, "expected a .conflist file name"));
    }
    let stem = |n: &str| {
        let n = n.strip_suffix("list").unwrap_or(n);
        n.strip_suffix(".conf").map(str::to_string)
    };
    if a.istio_owned_cni_config && stem(conf_name).is_some() && stem(conf_name) == stem(&name) {
        return Err(bad(
            VAR,
            raw,
            "names the primary's file (CNI_CONF_NAME): the copy would replace what it copies",
        ));
    }
    Ok(name)
}

/// The installer's settings; `api` is the API server the plugin's kubeconfig points at.
pub fn settings(a: &InstallArgs, api: ApiServer) -> Result<cni_installer::Settings, ConfigError> {
    let bin_target_dirs: Vec<PathBuf> = split_list(&a.cni_bin_target_dirs)
        .into_iter()
        .map(PathBuf::from)
        .collect();
    if bin_target_dirs.is_empty() {
        return Err(bad(
            "CNI_BIN_TARGET_DIRS",
            &a.cni_bin_target_dirs,
            "no directory given",
        ));
    }
    for d in &bin_target_dirs {
        super::absolute("CNI_BIN_TARGET_DIRS", d)?;
    }
    let binaries = split_list(&a.cni_binaries);
    if binaries.is_empty() || binaries.iter().any(|b| b.contains('/')) {
        return Err(bad(
            "CNI_BINARIES",
            &a.cni_binaries,
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
    let owned_conf_name = owned_conf_name(a, &conf_name)?;
    absolute("MOUNTED_CNI_NET_DIR", &a.mounted_cni_net_dir)?;
    absolute("CNI_AGENT_RUN_DIR", &a.cni_agent_run_dir)?;
    absolute("CNI_BIN_SOURCE_DIR", &a.cni_bin_source_dir)?;
    Ok(cni_installer::Settings {
        cni_conf_name: (!conf_name.is_empty()).then_some(conf_name),
        chained: a.chained_cni_plugin,
        owned_conf: a.istio_owned_cni_config,
        owned_conf_name,
        net_dir: a.mounted_cni_net_dir.clone(),
        run_dir: a.cni_agent_run_dir.clone(),
        kubeconfig_mode: a.kubeconfig_mode,
        conf_mode: if a.cni_conf_group_read { 0o640 } else { 0o600 },
        api,
        bin_source_dir: a.cni_bin_source_dir.clone(),
        bin_target_dirs,
        binaries,
    })
}
