//! Istio's reference test data (`../shared/golden`) as our types, for the parity tests of
//! every backend: one loader, so all of them read a case's configuration the same way.

use capture::*;
use serde_json::Value;
use std::path::PathBuf;

/// Groups the owner-group goldens name (`java`, `ftp`): Istio's test host resolves them; ours
/// is told their numbers.
pub const GOLDEN_GROUPS: &str = "java:x:1001:\nftp:x:1002:\n";

/// `../shared/golden`, beside the repository (where CI and developers have it).
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden")
}

/// Every entry of `index.json`.
pub fn index() -> Vec<Value> {
    let text = std::fs::read_to_string(golden_dir().join("index.json"))
        .expect("../shared/golden/index.json");
    match serde_json::from_str(&text).expect("index.json is JSON") {
        Value::Array(cases) => cases,
        _ => panic!("index.json is not a list"),
    }
}

/// A capture test's `effective_config` as our `Config` (Istio's test base leaves -b/-i empty;
/// IPv6 and DNS servers are given, not detected).
pub fn config_from_effective(e: &Value) -> Config {
    let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
    let b = |k: &str| e[k].as_bool().unwrap_or(false);
    let db = IdDb::parse("", GOLDEN_GROUPS);
    let dns_servers = ["DNSServersV4", "DNSServersV6"]
        .iter()
        .flat_map(|k| e[*k].as_array().into_iter().flatten())
        .map(|v| v.as_str().expect("server").parse().expect("server address"))
        .collect();
    Config {
        proxy_port: parse_port("-p", &s("ProxyPort")).unwrap(),
        inbound_capture_port: parse_port("-z", &s("InboundCapturePort")).unwrap(),
        inbound_tunnel_port: parse_port("-e", &s("InboundTunnelPort")).unwrap(),
        proxy_uids: parse_id_list("-u", &s("ProxyUID"), IdKind::User, &db).unwrap(),
        proxy_gids: parse_id_list("-g", &s("ProxyGID"), IdKind::Group, &db).unwrap(),
        inbound_mode: parse_interception_mode("-m", &s("InboundInterceptionMode")).unwrap(),
        inbound_ports: parse_inbound_ports("-b", &s("InboundPortsInclude")).unwrap(),
        inbound_ports_exclude: parse_port_list("-d", &s("InboundPortsExclude")).unwrap(),
        exclude_interfaces: parse_interface_list("-c", &s("ExcludeInterfaces")).unwrap(),
        outbound_ranges: parse_outbound_ranges("-i", &s("OutboundIPRangesInclude")).unwrap(),
        outbound_ranges_exclude: parse_cidr_list("-x", &s("OutboundIPRangesExclude")).unwrap(),
        outbound_ports_include: parse_port_list("-q", &s("OutboundPortsInclude")).unwrap(),
        outbound_ports_exclude: parse_port_list("-o", &s("OutboundPortsExclude")).unwrap(),
        reroute_virtual_interfaces: parse_interface_list("-k", &s("RerouteVirtualInterfaces"))
            .unwrap(),
        tproxy_mark: parse_u32("-t", &s("InboundTProxyMark")).unwrap(),
        tproxy_route_table: parse_u32("-r", &s("InboundTProxyRouteTable")).unwrap(),
        redirect_dns: b("RedirectDNS"),
        capture_all_dns: b("CaptureAllDNS"),
        drop_invalid: b("DropInvalid"),
        dual_stack: false,
        owner_groups: parse_owner_groups(
            "G",
            &s("OwnerGroupsInclude"),
            "X",
            &s("OwnerGroupsExclude"),
            &db,
        )
        .unwrap(),
        host_ipv4_loopback: parse_loopback_cidr("L", &s("HostIPv4LoopbackCidr")).unwrap(),
        ipv6: if b("EnableIPv6") {
            Ipv6Mode::On
        } else {
            Ipv6Mode::Off
        },
        dns_servers: Some(dns_servers),
    }
}

/// One of Istio's ambient goldens (`<backend>/cni-ambient/<name>.golden`) as our plan input.
pub struct AmbientCase {
    /// The golden's file stem, e.g. `default_ipv6`.
    pub name: String,
    /// `iptables` or `nftables`.
    pub backend: String,
    pub golden: PathBuf,
    pub plan: Plan,
}

/// Every ambient case of `index.json` for `backend`: in-pod cases from `ambient_config` +
/// `pod_overrides`; the `hostprobe` cases as host rules with the probe source each of Istio's
/// backends uses (iptables: any local socket; nftables: the kubelet uid its test mocks, 1000).
pub fn ambient_cases(backend: &str) -> Vec<AmbientCase> {
    index()
        .into_iter()
        .filter_map(|case| {
            let golden = case["golden"].as_str()?.to_string();
            let rest = golden.strip_prefix(&format!("{backend}/cni-ambient/"))?;
            let name = rest.strip_suffix(".golden")?.to_string();
            let plan = ambient_plan(backend, &case["ambient_config"], &case["pod_overrides"]);
            Some(AmbientCase {
                name,
                backend: backend.to_string(),
                golden: golden_dir().join(&golden),
                plan,
            })
        })
        .collect()
}

fn ambient_plan(backend: &str, cfg: &Value, pod: &Value) -> Plan {
    let ipv6 = cfg["EnableIPv6"].as_bool().unwrap_or(false);
    let addr = |k: &str| cfg[k].as_str().expect(k).to_string();
    let v4: std::net::Ipv4Addr = addr("HostProbeSNATAddress").parse().unwrap();
    let v6: std::net::Ipv6Addr = addr("HostProbeV6SNATAddress").parse().unwrap();
    if pod.is_null() {
        let source = if backend == "nftables" {
            ProbeSource::KubeletUid(1000)
        } else {
            ProbeSource::AnyLocalSocket
        };
        let host = HostProbeConfig {
            ipv6,
            host_probe_snat_v4: v4,
            host_probe_snat_v6: v6,
            source,
        };
        return Plan::ambient_host(&host).unwrap();
    }
    let dns = match pod["DNSProxy"].as_str() {
        Some("PodDNSEnabled") => PodDns::Enabled,
        Some("PodDNSDisabled") => PodDns::Disabled,
        _ => PodDns::Unset,
    };
    let virtual_interfaces = pod["VirtualInterfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let cfg = AmbientConfig {
        redirect_dns: cfg["RedirectDNS"].as_bool().unwrap_or(false),
        ipv6,
        host_probe_snat_v4: v4,
        host_probe_snat_v6: v6,
        pod: AmbientPod {
            dns,
            ingress_mode: pod["IngressMode"].as_bool().unwrap_or(false),
            virtual_interfaces,
        },
    };
    Plan::ambient(&cfg).unwrap()
}
