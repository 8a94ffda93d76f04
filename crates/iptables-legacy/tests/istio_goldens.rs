//! Byte-for-byte parity with Istio's iptables capture goldens (../shared/golden/iptables).

use capture::*;
use serde_json::Value;
use std::path::PathBuf;

fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden")
}

/// The golden test's `effective_config` as our Config (Istio's test base: -b/-i empty).
fn config_from_effective(e: &Value) -> (Config, Facts) {
    let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
    let b = |k: &str| e[k].as_bool().unwrap_or(false);
    let db = IdDb::parse("", "java:x:1001:\nftp:x:1002:\n");
    let mut cfg = Config {
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
        dns_servers: None,
    };
    let mut servers = Vec::new();
    for k in ["DNSServersV4", "DNSServersV6"] {
        for v in e[k].as_array().into_iter().flatten() {
            servers.push(v.as_str().unwrap().parse().unwrap());
        }
    }
    cfg.dns_servers = Some(servers);
    (cfg, Facts::default())
}

#[test]
fn payloads_match_istio_goldens_byte_for_byte() {
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(shared().join("index.json")).unwrap())
            .unwrap();
    let mut checked = 0;
    let mut failures = Vec::new();
    for case in index.as_array().unwrap() {
        let golden = case["golden"].as_str().unwrap();
        if !(golden.starts_with("iptables/") && golden.matches('/').count() == 1) {
            continue;
        }
        let (cfg, facts) = config_from_effective(&case["effective_config"]);
        let plan = Plan::build(&cfg, &facts).unwrap();
        let text = std::fs::read_to_string(shared().join(golden)).unwrap();
        let body: Vec<&str> = text
            .lines()
            .filter(|l| *l != "iptables-save" && *l != "ip6tables-save")
            .collect();
        let expected = body.join("\n") + "\n";
        let actual = iptables_legacy::render_payload(&plan, false)
            + &iptables_legacy::render_payload(&plan, true);
        if expected.trim() != actual.trim() {
            failures.push(format!(
                "== {golden}\n--- expected\n{expected}--- actual\n{actual}"
            ));
        }
        checked += 1;
    }
    assert_eq!(checked, 27, "every iptables capture golden is checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
