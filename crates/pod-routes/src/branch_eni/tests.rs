use super::*;

const POD: &str = "10.0.5.7";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn iif_rule(priority: u32, iif: &str, table: u32) -> RuleInfo {
    RuleInfo {
        priority,
        iif: Some(iif.into()),
        table,
    }
}

fn host_route(table: u32, dst: &str, oif: u32) -> RouteInfo {
    let dst = ip(dst);
    RouteInfo {
        table,
        dst: Some(dst),
        dst_len: if dst.is_ipv6() { 128 } else { 32 },
        oif: Some(oif),
        cloned: false,
    }
}

fn names(index: u32) -> Option<String> {
    match index {
        1 => Some("lo".into()),
        2 => Some("eth0".into()),
        7 => Some("vlan.eth.1".into()),
        9 => Some("vlan8c1f0a5e7b2".into()),
        11 => Some("eni4d1e2f3a4b5".into()),
        _ => None,
    }
}

/// aws-vpc-cni's SGP layout (vlan mode) for one branch ENI pod: the trunk's VLAN device and
/// the pod's veth both `iif … lookup 101` at priority 10; table 101 holds the pod's host route
/// through the veth and a default route out the VLAN; a regular pod beside it has `to <ip>
/// lookup main` at 512 and its host route in main. Plus the kernel's own three rules.
fn sgp_layout() -> (Vec<RuleInfo>, Vec<RouteInfo>) {
    let rules = vec![
        RuleInfo {
            priority: 0,
            iif: None,
            table: LOCAL_TABLE,
        },
        iif_rule(10, "vlan.eth.1", 101),
        iif_rule(10, "vlan8c1f0a5e7b2", 101),
        RuleInfo {
            priority: 512,
            iif: None,
            table: MAIN_TABLE,
        },
        RuleInfo {
            priority: 32766,
            iif: None,
            table: MAIN_TABLE,
        },
    ];
    let default = RouteInfo {
        table: 101,
        dst: None,
        dst_len: 0,
        oif: Some(7),
        cloned: false,
    };
    let routes = vec![
        default,
        host_route(101, POD, 9),
        host_route(MAIN_TABLE, "10.0.5.9", 11),
        host_route(LOCAL_TABLE, "10.0.0.1", 2),
    ];
    (rules, routes)
}

#[test]
fn a_pod_routed_only_in_its_own_table_through_an_iif_rules_veth_is_a_branch_eni_pod() {
    let (rules, routes) = sgp_layout();
    let eni = detect(ip(POD), &rules, &routes, names).expect("branch ENI pod");
    assert_eq!(
        eni,
        BranchEni {
            table: 101,
            veth: "vlan8c1f0a5e7b2".into(),
            iif_priority: 10
        }
    );
    assert_eq!(
        forward_rule(ip(POD), &eni).describe(),
        "512: from all to 10.0.5.7 lookup 101"
    );
    assert_eq!(
        return_rule(ip(POD), &eni).describe(),
        "9: from all iif vlan8c1f0a5e7b2 lookup local"
    );
}

#[test]
fn a_regular_pod_or_an_unknown_address_is_not() {
    let (rules, routes) = sgp_layout();
    assert_eq!(detect(ip("10.0.5.9"), &rules, &routes, names), None);
    assert_eq!(detect(ip("10.0.5.8"), &rules, &routes, names), None);
    assert_eq!(detect(ip(POD), &[], &routes, names), None, "no rules");
}

#[test]
fn the_route_must_be_a_host_route_through_a_device_an_iif_rule_of_that_table_names() {
    let (rules, routes) = sgp_layout();
    // Through the VLAN device (an iif rule of 101 names it): still a branch ENI, that device.
    let mut via_vlan = routes.clone();
    via_vlan[1].oif = Some(7);
    let eni = detect(ip(POD), &rules, &via_vlan, names).unwrap();
    assert_eq!((eni.veth.as_str(), eni.table), ("vlan.eth.1", 101));
    // Through a device no iif rule names, or one whose name cannot be read.
    for oif in [Some(2), Some(99), None] {
        let mut r = routes.clone();
        r[1].oif = oif;
        assert_eq!(detect(ip(POD), &rules, &r, names), None, "{oif:?}");
    }
    // Not a host route.
    let mut wide = routes.clone();
    wide[1].dst_len = 24;
    assert_eq!(detect(ip(POD), &rules, &wide, names), None);
    // A cached clone (Istio's listing skips them).
    let mut cloned = routes.clone();
    cloned[1].cloned = true;
    assert_eq!(detect(ip(POD), &rules, &cloned, names), None);
    // In another table than the iif rules'.
    let mut elsewhere = routes;
    elsewhere[1].table = 102;
    assert_eq!(detect(ip(POD), &rules, &elsewhere, names), None);
}

#[test]
fn iif_rules_into_main_local_or_no_table_are_not_aws_vpc_cnis() {
    let (_, routes) = sgp_layout();
    for table in [0, MAIN_TABLE, LOCAL_TABLE] {
        let rules = vec![iif_rule(10, "vlan8c1f0a5e7b2", table)];
        let mut r = routes.clone();
        r[1].table = table;
        assert_eq!(detect(ip(POD), &rules, &r, names), None, "table {table}");
    }
    let empty_iif = vec![iif_rule(10, "", 101)];
    assert_eq!(detect(ip(POD), &empty_iif, &routes, names), None);
}

#[test]
fn the_first_table_in_rule_order_wins_and_its_matching_rules_priority_is_taken() {
    let rules = vec![
        iif_rule(5, "other", 103),
        iif_rule(7, "vlan8c1f0a5e7b2", 103),
        iif_rule(3, "vlan8c1f0a5e7b2", 104),
    ];
    let routes = vec![host_route(104, POD, 9), host_route(103, POD, 9)];
    let eni = detect(ip(POD), &rules, &routes, names).unwrap();
    assert_eq!((eni.table, eni.iif_priority), (103, 7));
}

#[test]
fn ipv6_pods_get_128_rules_and_the_return_priority_stops_at_zero() {
    let pod = ip("fd00:5::7");
    let rules = vec![iif_rule(0, "vlan8c1f0a5e7b2", 101)];
    let routes = vec![host_route(101, "fd00:5::7", 9)];
    let eni = detect(pod, &rules, &routes, names).unwrap();
    let fwd = forward_rule(pod, &eni);
    assert!(fwd.v6);
    assert_eq!(fwd.describe(), "512: from all to fd00:5::7 lookup 101");
    let ret = return_rule(pod, &eni);
    assert_eq!(ret.priority, 0);
    assert!(ret.v6);
}

#[test]
fn the_gate_is_the_sysctls_first_byte() {
    assert!(early_demux_disabled(b"0\n"));
    assert!(!early_demux_disabled(b"1\n"));
    assert!(!early_demux_disabled(b""));
}

/// The wire forms round-trip through the dump parsers: the rule Istio adds reads back as an
/// iif rule of the local table (so a second detection never takes our own return rule for
/// aws-vpc-cni's: local is skipped), the forward rule without iif.
#[test]
fn rule_bodies_read_back_as_written_and_routes_parse() {
    let eni = BranchEni {
        table: 101,
        veth: "vlan8c1f0a5e7b2".into(),
        iif_priority: 10,
    };
    let ret = parse_rule(&rule_body(&return_rule(ip(POD), &eni))).unwrap();
    assert_eq!(ret, iif_rule(9, "vlan8c1f0a5e7b2", LOCAL_TABLE));
    let fwd_body = rule_body(&forward_rule(ip(POD), &eni));
    assert_eq!((fwd_body[0], fwd_body[1]), (libc::AF_INET as u8, 32));
    let fwd = parse_rule(&fwd_body).unwrap();
    assert_eq!(
        fwd,
        RuleInfo {
            priority: 512,
            iif: None,
            table: 101
        }
    );
    assert_eq!(parse_rule(&[0; 8]), None, "shorter than fib_rule_hdr");

    // struct rtmsg for `10.0.5.7 dev #9 table 101` (table only in the attribute), cloned.
    let mut route = vec![libc::AF_INET as u8, 32, 0, 0, 0, 0, 0, 1];
    route.extend_from_slice(&0x200u32.to_ne_bytes());
    netlink_wire::put_attr(&mut route, libc::RTA_TABLE, &101u32.to_ne_bytes());
    netlink_wire::put_attr(&mut route, libc::RTA_DST, &[10, 0, 5, 7]);
    netlink_wire::put_attr(&mut route, libc::RTA_OIF, &9u32.to_ne_bytes());
    let mut want = host_route(101, POD, 9);
    want.cloned = true;
    assert_eq!(parse_route(&route), Some(want));
    assert_eq!(parse_route(&route[..8]), None);
}
