//! The ambient node agent's settings (Istio's `AMBIENT_*`, `ZTUNNEL_UDS_ADDRESS`).

use super::{ConfigError, bad, parse_bool};
use clap::{ArgAction, Args};
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct AmbientArgs {
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

    /// Where kubelet's probes appear to come from inside an ambient pod (IPv4): the host rule
    /// SNATs them to it, the in-pod rules let it in.
    #[arg(long, env = "HOST_PROBE_SNAT_IP", default_value = "169.254.7.127")]
    pub host_probe_snat_ip: std::net::Ipv4Addr,

    /// The same for IPv6.
    #[arg(
        long,
        env = "HOST_PROBE_SNAT_IPV6",
        default_value = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"
    )]
    pub host_probe_snat_ipv6: std::net::Ipv6Addr,

    /// The ZDS socket this agent serves; ztunnel connects to it.
    #[arg(
        long,
        env = "ZTUNNEL_UDS_ADDRESS",
        default_value = "/var/run/ztunnel/ztunnel.sock"
    )]
    pub ztunnel_uds_address: PathBuf,

    /// On EKS with Security Groups for Pods (nodes with net.ipv4.tcp_early_demux=0): ambient
    /// pods aws-vpc-cni routes through a branch ENI get ip rules that send kubelet's probes
    /// through their veth instead of the VPC fabric (Istio's default: on).
    #[arg(long, env = "AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub ambient_enable_aws_branch_eni_probe: bool,
}

/// `AMBIENT_ENABLEMENT_SELECTOR`: YAML (Istio's chart renders `toYaml`) or JSON.
pub fn settings(a: &AmbientArgs) -> Result<ambient_agent::Settings, ConfigError> {
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
    let probe_snat = capture::ProbeSnat {
        v4: a.host_probe_snat_ip,
        v6: a.host_probe_snat_ipv6,
    };
    probe_snat.validate().map_err(|e| {
        let var = match e.field.as_str() {
            "HOST_PROBE_SNAT_IPV6" => "HOST_PROBE_SNAT_IPV6",
            _ => "HOST_PROBE_SNAT_IP",
        };
        bad(var, e.value, e.reason)
    })?;
    Ok(ambient_agent::Settings {
        enabled: a.ambient_enabled,
        probe_snat,
        selectors,
        dns_capture: a.ambient_dns_capture,
        ipv6: a.ambient_ipv6,
        reconcile_on_startup: a.ambient_reconcile_pod_rules_on_startup,
        detection_retry: a.enable_ambient_detection_retry,
        ztunnel_socket: a.ztunnel_uds_address.clone(),
        aws_branch_eni_probe: a.ambient_enable_aws_branch_eni_probe,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::{Args, Config};
    use clap::Parser;

    fn ambient(flags: &[&str]) -> ambient_agent::Settings {
        let mut argv = vec!["install-cni", "--kubernetes-service-host", "10.96.0.1"];
        argv.extend_from_slice(flags);
        Config::from_args(Args::try_parse_from(argv).unwrap())
            .unwrap()
            .ambient
    }

    /// `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`: on unless turned off, as Istio has it.
    #[test]
    fn the_aws_branch_eni_probe_is_on_by_default() {
        assert!(ambient(&[]).aws_branch_eni_probe);
        assert!(ambient_agent::Settings::disabled().aws_branch_eni_probe);
        let off = ambient(&["--ambient-enable-aws-branch-eni-probe=false"]);
        assert!(!off.aws_branch_eni_probe);
    }
}
