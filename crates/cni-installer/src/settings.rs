//! What the installer needs to know (Istio's install-cni settings, already validated by the
//! daemon's configuration).

use node_view::client::ApiServer;
use std::path::PathBuf;

/// Name of the standalone config file (Istio's).
pub const STANDALONE_CONF_NAME: &str = "YYY-istio-cni.conf";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Primary CNI config file to patch (`None`: the first valid file, as kubelet picks).
    pub cni_conf_name: Option<String>,
    /// Chain into the primary config (`false`: a standalone `YYY-istio-cni.conf`).
    pub chained: bool,
    /// `ISTIO_OWNED_CNI_CONFIG` (chained mode only): keep the primary's config with our entry
    /// in a file of our own, [`Settings::owned_conf_name`], instead of writing into the
    /// primary's file ([`crate::owned`]).
    pub owned_conf: bool,
    /// `ISTIO_OWNED_CNI_CONFIG_FILENAME`: the owned file's name (also known with the option
    /// off: a file of ours left there by an earlier daemon is removed).
    pub owned_conf_name: String,
    /// The host's CNI config directory, as mounted.
    pub net_dir: PathBuf,
    /// The plugin's run dir (kubeconfig, log, sockets, readiness marker).
    pub run_dir: PathBuf,
    pub kubeconfig_mode: u32,
    /// Mode for CNI config files we create (existing files keep theirs).
    pub conf_mode: u32,
    /// The API server the plugin's kubeconfig points at, with the service account's CA and
    /// token (its directory is watched for token rotation).
    pub api: ApiServer,
    pub bin_source_dir: PathBuf,
    pub bin_target_dirs: Vec<PathBuf>,
    pub binaries: Vec<String>,
}

impl Settings {
    /// Settings for tests and the bench (no environment involved).
    pub fn for_dirs(
        net_dir: PathBuf,
        run_dir: PathBuf,
        bin_source: PathBuf,
        bin_target: PathBuf,
        sa_dir: PathBuf,
    ) -> Settings {
        Settings {
            cni_conf_name: None,
            chained: true,
            owned_conf: false,
            owned_conf_name: crate::owned::DEFAULT_NAME.into(),
            net_dir,
            run_dir,
            kubeconfig_mode: 0o600,
            conf_mode: 0o600,
            api: ApiServer {
                host: "10.96.0.1".into(),
                port: 443,
                protocol: "https".into(),
                ca_file: sa_dir.join("ca.crt"),
                skip_tls_verify: false,
                service_account_dir: sa_dir,
                kubeconfig: None,
            },
            bin_source_dir: bin_source,
            bin_target_dirs: vec![bin_target],
            binaries: vec!["istio-cni".into(), "istio-nftables".into()],
        }
    }

    /// Whether this pass writes the owned file (the option applies to chained mode only, as
    /// in Istio).
    pub fn uses_owned_conf(&self) -> bool {
        self.owned_conf && self.chained
    }

    /// The plugin's kubeconfig in the run dir.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.run_dir.join(cni_config::KUBECONFIG_FILE)
    }
}
