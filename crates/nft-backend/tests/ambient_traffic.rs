//! Real traffic through ambient's in-pod rules (programmed by the nft backend) in pod/world
//! namespace pairs, with a stand-in ztunnel listening in the pod on 15001/15006/15008/15053
//! and the app on 8080. Also: idempotent re-apply, cleanup removes only ours, policy routing.

use capture::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use testbed::ztunnel::ZTUNNEL_STAND_IN as ZTUNNEL;
use testbed::*;

const APP_UID: u32 = 1000;
const ZTUNNEL_MARK: u32 = 0x539;

fn apply(ns: &Path, cfg: &AmbientConfig) -> Plan {
    let plan = Plan::ambient(cfg).expect("plan");
    netns::run_in(Some(ns), || nft_backend::apply(&plan))
        .unwrap()
        .expect("apply");
    plan
}

fn dns_on() -> AmbientConfig {
    AmbientConfig {
        redirect_dns: true,
        ..AmbientConfig::default()
    }
}

fn as_app(dst: IpAddr, port: u16) -> ConnectSpec {
    ConnectSpec::new(dst, port).uid(APP_UID).gid(APP_UID)
}

#[test]
fn ambient_pod_traffic_lands_where_ztunnel_expects_it() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &dns_on());
    let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let (pod, world) = (IpAddr::V4(w.pod_v4), IpAddr::V4(w.world_v4));
    let (p, wp) = (w.pod.path(), w.world.path());

    // The app's outbound TCP goes to ztunnel's outbound port, original destination kept.
    let o = connect(p, &as_app(world, 80));
    Outcome::assert_lands(&o, "pod", 15001, Some(SocketAddr::new(world, 80)));
    // Inbound TCP to the app goes to ztunnel's plaintext inbound port.
    let o = connect(wp, &ConnectSpec::new(pod, 8080));
    Outcome::assert_lands(&o, "pod", 15006, Some(SocketAddr::new(pod, 8080)));
    // HBONE (15008) reaches ztunnel directly.
    Outcome::assert_lands(
        &connect(wp, &ConnectSpec::new(pod, 15008)),
        "pod",
        15008,
        None,
    );
    // ztunnel's own sockets (SO_MARK 0x539) are never captured.
    let own = ConnectSpec::new(world, 80).mark(ZTUNNEL_MARK);
    Outcome::assert_lands(&connect(p, &own), "world", 80, None);
    // Only the low 12 bits count: another mark with the same low bits is ztunnel's too.
    let own_high_bits = ConnectSpec::new(world, 80).mark(0x7000_0539);
    Outcome::assert_lands(&connect(p, &own_high_bits), "world", 80, None);
    // DNS over UDP and TCP goes to ztunnel's DNS proxy; ztunnel's own queries go out.
    Outcome::assert_lands(&send_udp(p, &as_app(world, 53)), "pod", 15053, None);
    Outcome::assert_lands(&connect(p, &as_app(world, 53)), "pod", 15053, None);
    let own_dns = ConnectSpec::new(world, 53).mark(ZTUNNEL_MARK);
    Outcome::assert_lands(&send_udp(p, &own_dns), "world", 53, None);
    // The app talking to its own pod IP over lo is not captured.
    Outcome::assert_lands(&connect(p, &as_app(pod, 8080)), "pod", 8080, None);
    // Nor is localhost.
    let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
    Outcome::assert_lands(&connect(p, &as_app(local, 8080)), "pod", 8080, None);
}

#[test]
fn kubelet_probe_address_reaches_the_app_untouched() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &AmbientConfig::default());
    let probe_src = IpAddr::V4(ambient_constants::HOST_PROBE_SNAT_V4);
    w.world
        .exec_ok("ip", &["addr", "add", "169.254.7.127/32", "dev", "eth0"])
        .unwrap();
    let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let pod = IpAddr::V4(w.pod_v4);
    // From the probe address: the app itself, no ztunnel.
    let probe = ConnectSpec::new(pod, 8080).src(probe_src);
    Outcome::assert_lands(&connect(w.world.path(), &probe), "pod", 8080, None);
    // Any other source: ztunnel.
    let other = ConnectSpec::new(pod, 8080);
    Outcome::assert_lands(&connect(w.world.path(), &other), "pod", 15006, None);
}

#[test]
fn dns_is_not_captured_when_off_and_ipv6_is_untouched_when_off() {
    require_root();
    // Dual-stack pod, but ambient IPv6 off (AMBIENT_IPV6=false) and DNS capture off.
    let w = PodWorld::new().unwrap();
    let plan = apply(w.pod.path(), &AmbientConfig::default());
    assert!(!plan.ipv6);
    let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let (p, wp) = (w.pod.path(), w.world.path());
    let world = IpAddr::V4(w.world_v4);
    Outcome::assert_lands(&send_udp(p, &as_app(world, 53)), "world", 53, None);
    Outcome::assert_lands(&connect(p, &as_app(world, 53)), "pod", 15001, None);
    let (pod6, world6) = (
        IpAddr::V6(w.pod_v6.unwrap()),
        IpAddr::V6(w.world_v6.unwrap()),
    );
    Outcome::assert_lands(&connect(p, &as_app(world6, 80)), "world", 80, None);
    Outcome::assert_lands(
        &connect(wp, &ConnectSpec::new(pod6, 8080)),
        "pod",
        8080,
        None,
    );
    // The same pod with IPv6 on: IPv6 is captured like IPv4.
    apply(
        w.pod.path(),
        &AmbientConfig {
            ipv6: true,
            ..AmbientConfig::default()
        },
    );
    Outcome::assert_lands(&connect(p, &as_app(world6, 80)), "pod", 15001, None);
    Outcome::assert_lands(
        &connect(wp, &ConnectSpec::new(pod6, 8080)),
        "pod",
        15006,
        None,
    );
}

#[test]
fn reapply_is_idempotent_and_cleanup_removes_only_ours() {
    require_root();
    let ns = TestNetns::with_prefix("amb-idem").unwrap();
    ns.exec_ok(
        "nft",
        &["add table inet foreign; add chain inet foreign c { type filter hook output priority 0; }"],
    )
    .unwrap();
    let cfg = dns_on();
    apply(ns.path(), &cfg);
    let first = ns.exec_ok("nft", &["list", "ruleset"]).unwrap();
    let plan = apply(ns.path(), &cfg);
    assert_eq!(ns.exec_ok("nft", &["list", "ruleset"]).unwrap(), first);
    let drift = netns::run_in(Some(ns.path()), || nft_backend::check(&plan))
        .unwrap()
        .unwrap();
    assert!(drift.is_empty(), "{drift:?}");
    // A sidecar cleanup leaves ambient's tables alone; ambient's cleanup removes them only.
    let removed = netns::run_in(Some(ns.path()), nft_backend::cleanup)
        .unwrap()
        .unwrap();
    assert!(!removed);
    let removed = netns::run_in(Some(ns.path()), nft_backend::cleanup_ambient)
        .unwrap()
        .unwrap();
    assert!(removed);
    let tables = ns.exec_ok("nft", &["list", "tables"]).unwrap();
    assert_eq!(tables.trim(), "table inet foreign");
}

#[test]
fn inpod_policy_routing_sends_marked_replies_to_ztunnel() {
    require_root();
    let ns = TestNetns::with_prefix("amb-rt").unwrap();
    ns.exec_ok("ip", &["link", "set", "lo", "up"]).unwrap();
    for _ in 0..2 {
        apply(
            ns.path(),
            &AmbientConfig {
                ipv6: true,
                ..AmbientConfig::default()
            },
        );
    }
    let rules = ns.exec_ok("ip", &["rule", "show"]).unwrap();
    let ours: Vec<&str> = rules
        .lines()
        .filter(|l| l.contains("0x111/0xfff"))
        .collect();
    assert_eq!(
        ours,
        ["32764:\tfrom all fwmark 0x111/0xfff lookup 100"],
        "{rules}"
    );
    let rules6 = ns.exec_ok("ip", &["-6", "rule", "show"]).unwrap();
    assert!(
        rules6.contains("32764:\tfrom all fwmark 0x111/0xfff lookup 100"),
        "{rules6}"
    );
    let table = ns
        .exec_ok("ip", &["route", "show", "table", "100"])
        .unwrap();
    assert_eq!(table.trim(), "local default dev lo scope host", "{table}");
    // Leaving ambient removes them again (twice: the second finds nothing, no error).
    for _ in 0..2 {
        netns::run_in(Some(ns.path()), nft_backend::cleanup_ambient)
            .unwrap()
            .unwrap();
    }
    let rules = ns.exec_ok("ip", &["rule", "show"]).unwrap();
    assert!(!rules.contains("0x111/0xfff"), "{rules}");
    let rules6 = ns.exec_ok("ip", &["-6", "rule", "show"]).unwrap();
    assert!(!rules6.contains("0x111/0xfff"), "{rules6}");
    let table = ns
        .exec_ok("ip", &["route", "show", "table", "100"])
        .unwrap();
    assert!(table.trim().is_empty(), "{table}");
}

#[test]
fn a_refused_ambient_batch_leaves_the_namespace_as_it_was() {
    require_root();
    let ns = TestNetns::with_prefix("amb-atomic").unwrap();
    let plan = Plan::ambient(&dns_on()).unwrap();
    // Fresh namespace: nothing at all is left behind.
    let r = netns::run_in(Some(ns.path()), || {
        nft_backend::apply(&nft_backend::testing::poisoned(&plan))
    })
    .unwrap();
    assert!(r.is_err());
    assert_eq!(ns.exec_ok("nft", &["list", "ruleset"]).unwrap(), "");
    // Programmed pod: a refused re-apply (with other settings) keeps the old rules exactly.
    apply(ns.path(), &dns_on());
    let before = ns.exec_ok("nft", &["list", "ruleset"]).unwrap();
    let other = Plan::ambient(&AmbientConfig::default()).unwrap();
    let r = netns::run_in(Some(ns.path()), || {
        nft_backend::apply(&nft_backend::testing::poisoned(&other))
    })
    .unwrap();
    assert!(r.is_err());
    assert_eq!(ns.exec_ok("nft", &["list", "ruleset"]).unwrap(), before);
}
