//! Real traffic through rules programmed by the nft backend, in pod/world namespace pairs.
//! Every test builds its own namespaces (deleted on drop, also on failure).

use capture::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use testbed::*;

const APP_UID: u32 = 1000;

fn apply(ns: &Path, cfg: &Config) -> Plan {
    let plan = Plan::build(cfg, &Facts::default()).expect("plan");
    netns::run_in(Some(ns), || nft_backend::apply(&plan))
        .unwrap()
        .expect("apply");
    plan
}

fn cni_default(ipv6: Ipv6Mode) -> Config {
    Config {
        ipv6,
        ..Config::cni_default()
    }
}

fn as_app(dst: IpAddr, port: u16) -> ConnectSpec {
    ConnectSpec::new(dst, port).uid(APP_UID).gid(APP_UID)
}

fn landed(o: &Outcome, port: u16, orig: Option<SocketAddr>) {
    let l = o
        .landed()
        .unwrap_or_else(|| panic!("expected to land on {port}, got {o}"));
    assert_eq!(l.port, port, "{o}");
    if let Some(orig) = orig {
        assert_eq!(l.orig_dst, Some(orig), "{o}");
    }
}

fn listing(ns: &TestNetns) -> String {
    ns.exec_ok("nft", &["list", "ruleset"]).unwrap()
}

#[test]
fn cni_default_sidecar_traffic_lands_where_istio_sends_it() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let (pod, world) = (IpAddr::V4(w.pod_v4), IpAddr::V4(w.world_v4));
    let p = w.pod.path();

    // Outbound from the app: to Envoy's outbound listener, original destination kept.
    landed(
        &connect(p, &as_app(world, 80)),
        15001,
        Some(SocketAddr::new(world, 80)),
    );
    // Inbound to an app port: to Envoy's inbound listener.
    landed(
        &connect(w.world.path(), &ConnectSpec::new(pod, 8080)),
        15006,
        Some(SocketAddr::new(pod, 8080)),
    );
    // Tunnel, agent, health and Envoy metrics ports are never redirected inbound.
    for port in [15008, 15020, 15021, 15090] {
        landed(
            &connect(w.world.path(), &ConnectSpec::new(pod, port)),
            port,
            None,
        );
    }
    // Envoy itself (uid 1337, or any process in group 1337) goes out directly.
    landed(
        &connect(p, &ConnectSpec::new(world, 80).uid(1337).gid(1337)),
        80,
        None,
    );
    landed(
        &connect(p, &ConnectSpec::new(world, 80).uid(APP_UID).gid(1337)),
        80,
        None,
    );
    // The app talking to localhost or to its own pod IP is not captured.
    landed(
        &connect(p, &as_app(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080)),
        8080,
        None,
    );
    landed(&connect(p, &as_app(pod, 8080)), 8080, None);
    // Envoy calling its own pod IP (app → VIP → Envoy → own endpoint) takes the inbound path.
    landed(
        &connect(p, &ConnectSpec::new(pod, 8080).uid(1337).gid(1337)),
        15006,
        Some(SocketAddr::new(pod, 8080)),
    );
    // istio-validation: uid 1337, 127.0.0.1 → 127.0.0.6:15002 lands on 15006, original port 15002.
    let probe = ConnectSpec::new("127.0.0.6".parse().unwrap(), 15002)
        .uid(1337)
        .gid(1337)
        .src(IpAddr::V4(Ipv4Addr::LOCALHOST));
    landed(
        &connect(p, &probe),
        15006,
        Some("127.0.0.6:15002".parse().unwrap()),
    );
    // Envoy's inbound passthrough (source 127.0.0.6) reaches the app directly.
    let passthrough = ConnectSpec::new(pod, 8080)
        .uid(1337)
        .gid(1337)
        .src("127.0.0.6".parse().unwrap());
    landed(&connect(p, &passthrough), 8080, None);
    // The CNI default excludes 15020 outbound.
    landed(&connect(p, &as_app(world, 15020)), 15020, None);
}

#[test]
fn excluded_cidrs_and_ports_bypass_and_included_ports_are_captured() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let world = IpAddr::V4(w.world_v4);
    let mut cfg = cni_default(Ipv6Mode::Off);
    // Capture only 192.0.2.0/24, but always capture port 443; exclude the world host itself
    // from a second config below.
    cfg.outbound_ranges = OutboundRanges::List(vec!["192.0.2.0/24".parse().unwrap()]);
    cfg.outbound_ports_include = vec![443];
    cfg.outbound_ports_exclude = vec![15020, 9999];
    apply(w.pod.path(), &cfg);
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let p = w.pod.path();
    landed(&connect(p, &as_app(world, 80)), 80, None);
    landed(
        &connect(p, &as_app(world, 443)),
        15001,
        Some(SocketAddr::new(world, 443)),
    );
    landed(&connect(p, &as_app(world, 9999)), 9999, None);

    // Capture everything except the world's /24 (an interval set with many neighbours).
    let mut cfg = cni_default(Ipv6Mode::Off);
    let mut excluded: Vec<IpNet> = (0..200)
        .map(|i| {
            format!("172.{}.{}.0/24", 16 + i / 200, i % 200)
                .parse()
                .unwrap()
        })
        .collect();
    excluded.push(IpNet::new(world, 24).unwrap());
    cfg.outbound_ranges_exclude = excluded;
    apply(w.pod.path(), &cfg);
    landed(&connect(p, &as_app(world, 80)), 80, None);
    // Another excluded range: whatever happens to it (nothing routes there), Envoy never sees it.
    let elsewhere = connect(
        p,
        &as_app("172.16.3.9".parse().unwrap(), 80).timeout(SHORT_TIMEOUT),
    );
    assert_ne!(elsewhere.landed_port(), Some(15001), "{elsewhere}");
    // Not excluded: captured.
    landed(
        &connect(p, &as_app("203.0.113.7".parse().unwrap(), 80)),
        15001,
        None,
    );
}

#[test]
fn dns_capture_sends_udp_and_tcp_53_to_the_agent() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let world = IpAddr::V4(w.world_v4);
    let mut cfg = cni_default(Ipv6Mode::Off);
    cfg.redirect_dns = true;
    cfg.capture_all_dns = true;
    apply(w.pod.path(), &cfg);
    let _agent = Probe::start(
        w.pod.path(),
        "agent",
        &[Listen::udp(15053), Listen::tcp(15053), Listen::tcp(15001)],
    )
    .unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let p = w.pod.path();
    let udp = send_udp(p, &as_app(world, 53));
    assert_eq!(
        udp.landed().map(|l| (l.probe.as_str(), l.port)),
        Some(("agent", 15053)),
        "{udp}"
    );
    landed(
        &connect(p, &as_app(world, 53)),
        15053,
        Some(SocketAddr::new(world, 53)),
    );
    // The agent itself (uid 1337) resolves upstream directly.
    let up = send_udp(p, &ConnectSpec::new(world, 53).uid(1337).gid(1337));
    assert_eq!(
        up.landed().map(|l| (l.probe.as_str(), l.port)),
        Some(("world", 53)),
        "{up}"
    );
}

fn tproxy_config() -> Config {
    Config {
        inbound_mode: InterceptionMode::Tproxy,
        ipv6: Ipv6Mode::Off,
        ..Config::cni_default()
    }
}

#[test]
fn tproxy_delivers_inbound_with_the_original_destination() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let pod = IpAddr::V4(w.pod_v4);
    apply(w.pod.path(), &tproxy_config());
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    landed(
        &connect(w.world.path(), &ConnectSpec::new(pod, 8080)),
        15006,
        Some(SocketAddr::new(pod, 8080)),
    );
    landed(
        &connect(w.world.path(), &ConnectSpec::new(pod, 15021)),
        15021,
        None,
    );
    // Outbound still uses REDIRECT.
    let _world = Probe::world(w.world.path()).unwrap();
    landed(
        &connect(w.pod.path(), &as_app(IpAddr::V4(w.world_v4), 80)),
        15001,
        None,
    );
}

#[test]
fn tproxy_fails_closed_without_listener() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let pod = IpAddr::V4(w.pod_v4);
    apply(w.pod.path(), &tproxy_config());
    // The app listens, Envoy does not (yet): inbound must not reach the app around Envoy.
    let _app = Probe::start(w.pod.path(), "app", &[Listen::tcp(8080)]).unwrap();
    let out = connect(
        w.world.path(),
        &ConnectSpec::new(pod, 8080).timeout(SHORT_TIMEOUT),
    );
    assert_eq!(out, Outcome::Timeout, "inbound bypassed the proxy: {out}");
}

#[test]
fn ipv6_on_redirects_ipv6_too() {
    require_root();
    let w = PodWorld::new().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::On));
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let (pod6, world6) = (
        IpAddr::V6(w.pod_v6.unwrap()),
        IpAddr::V6(w.world_v6.unwrap()),
    );
    landed(
        &connect(w.pod.path(), &as_app(world6, 80)),
        15001,
        Some(SocketAddr::new(world6, 80)),
    );
    landed(
        &connect(w.world.path(), &ConnectSpec::new(pod6, 8080)),
        15006,
        Some(SocketAddr::new(pod6, 8080)),
    );
    landed(
        &connect(
            w.pod.path(),
            &ConnectSpec::new(world6, 80).uid(1337).gid(1337),
        ),
        80,
        None,
    );
    // Envoy's IPv6 inbound passthrough source ::6 exists on lo and bypasses capture.
    let passthrough = ConnectSpec::new(pod6, 8080)
        .uid(1337)
        .gid(1337)
        .src("::6".parse().unwrap());
    landed(&connect(w.pod.path(), &passthrough), 8080, None);
}

#[test]
fn ipv6_off_leaves_ipv6_untouched() {
    require_root();
    let w = PodWorld::new().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let (pod6, world6) = (
        IpAddr::V6(w.pod_v6.unwrap()),
        IpAddr::V6(w.world_v6.unwrap()),
    );
    landed(&connect(w.pod.path(), &as_app(world6, 80)), 80, None);
    landed(
        &connect(w.world.path(), &ConnectSpec::new(pod6, 8080)),
        8080,
        None,
    );
    // IPv4 is still captured.
    landed(
        &connect(w.pod.path(), &as_app(IpAddr::V4(w.world_v4), 80)),
        15001,
        None,
    );
}

/// Sends one ICMP echo reply nobody asked for: conntrack classifies it as INVALID.
fn send_unsolicited_echo_reply(ns: &Path, dst: Ipv4Addr) {
    netns::run_in(Some(ns), || {
        // SAFETY: plain socket syscalls on a descriptor we own and close.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP);
            assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
            let mut pkt = [0u8, 0, 0, 0, 0x12, 0x34, 0, 1];
            let sum = !pkt
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]) as u32)
                .sum::<u32>() as u16;
            pkt[2..4].copy_from_slice(&sum.to_be_bytes());
            let addr = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from(dst).to_be(),
                },
                sin_zero: [0; 8],
            };
            libc::sendto(
                fd,
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                (&addr as *const libc::sockaddr_in).cast(),
                std::mem::size_of_val(&addr) as u32,
            );
            libc::close(fd);
        }
    })
    .unwrap();
}

#[test]
fn drop_invalid_covers_every_protocol_of_the_family() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let cfg = Config {
        drop_invalid: true,
        ..cni_default(Ipv6Mode::Off)
    };
    apply(w.pod.path(), &cfg);
    send_unsolicited_echo_reply(w.world.path(), w.pod_v4);
    // The veth hands the packet to the pod's side in a softirq: under load, a little later.
    let invalid_rule = || {
        listing(&w.pod)
            .lines()
            .find(|l| l.contains("ct state invalid"))
            .expect("invalid rule")
            .to_string()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !invalid_rule().contains("packets 1 ") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let line = invalid_rule();
    assert!(
        !line.contains("tcp"),
        "drop-invalid must not be limited to TCP: {line}"
    );
    assert!(
        line.contains("packets 1 "),
        "the invalid ICMP packet was not seen by the drop rule: {line}"
    );
}

#[test]
fn applying_twice_gives_the_same_rules_and_cleanup_spares_other_tables() {
    require_root();
    let ns = TestNetns::new().unwrap();
    ns.exec_ok(
        "nft",
        &["add table inet someone-else; add chain inet someone-else c"],
    )
    .unwrap();
    let cfg = cni_default(Ipv6Mode::On);
    apply(ns.path(), &cfg);
    let first = listing(&ns);
    let report = netns::run_in(Some(ns.path()), || {
        nft_backend::apply(&Plan::build(&cfg, &Facts::default()).unwrap())
    })
    .unwrap()
    .unwrap();
    assert!(report.replaced);
    assert_eq!(first, listing(&ns));
    assert!(
        netns::run_in(Some(ns.path()), nft_backend::cleanup)
            .unwrap()
            .unwrap()
    );
    let after = listing(&ns);
    assert!(
        after.contains("table inet someone-else") && !after.contains("istio-proxy"),
        "{after}"
    );
}

#[test]
fn a_refused_batch_leaves_the_namespace_as_it_was() {
    require_root();
    let ns = TestNetns::new().unwrap();
    // Fresh namespace: nothing at all afterwards.
    let plan = Plan::build(&cni_default(Ipv6Mode::Off), &Facts::default()).unwrap();
    let err = netns::run_in(Some(ns.path()), || {
        nft_backend::apply(&nft_backend::testing::poisoned(&plan))
    })
    .unwrap()
    .unwrap_err();
    assert!(
        err.to_string().contains("poisoned"),
        "the error names the refused object: {err}"
    );
    assert_eq!(listing(&ns).trim(), "");
    // Existing rules: still exactly the old ones after a refused replacement.
    apply(ns.path(), &cni_default(Ipv6Mode::Off));
    let before = listing(&ns);
    let other = Plan::build(
        &Config {
            drop_invalid: true,
            ..tproxy_config()
        },
        &Facts::default(),
    )
    .unwrap();
    netns::run_in(Some(ns.path()), || {
        nft_backend::apply(&nft_backend::testing::poisoned(&other))
    })
    .unwrap()
    .unwrap_err();
    assert_eq!(before, listing(&ns));
}

#[test]
fn check_reports_drift_and_reapply_repairs_it() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let plan = apply(ns.path(), &cni_default(Ipv6Mode::Off));
    let check = || {
        netns::run_in(Some(ns.path()), || nft_backend::check(&plan))
            .unwrap()
            .unwrap()
    };
    assert_eq!(check(), Vec::<String>::new());
    ns.exec_ok("nft", &["flush chain inet istio-proxy-nat istio-redirect"])
        .unwrap();
    let drift = check();
    assert!(
        drift.iter().any(|d| d.contains("istio-redirect")
            && d.contains("missing rule")
            && d.contains("redirect to :15001")),
        "{drift:?}"
    );
    apply(ns.path(), &cni_default(Ipv6Mode::Off));
    assert_eq!(check(), Vec::<String>::new());
    // Same hook and priority, another chain type: a difference too.
    ns.exec_ok(
        "nft",
        &[
            "flush chain inet istio-proxy-nat output; delete chain inet istio-proxy-nat output; \
             add chain inet istio-proxy-nat output { type filter hook output priority -100; }",
        ],
    )
    .unwrap();
    let drift = check();
    assert!(
        drift.iter().any(|d| d.contains(
            "chain output in table inet istio-proxy-nat: expected type nat hook output priority \
             -100, found type filter hook output priority -100"
        )),
        "{drift:?}"
    );
    apply(ns.path(), &cni_default(Ipv6Mode::Off));
    assert_eq!(check(), Vec::<String>::new());
}

#[test]
fn ten_thousand_excluded_cidrs_apply_in_one_batch() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let mut cfg = cni_default(Ipv6Mode::Off);
    cfg.outbound_ranges_exclude = (0..10_000u32)
        .map(|i| IpNet::new(IpAddr::V4(Ipv4Addr::from(0x6400_0000 + (i << 8))), 24).unwrap())
        .collect();
    let plan = apply(w.pod.path(), &cfg);
    assert_eq!(
        netns::run_in(Some(w.pod.path()), || nft_backend::check(&plan))
            .unwrap()
            .unwrap(),
        Vec::<String>::new()
    );
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    landed(
        &connect(w.pod.path(), &as_app(IpAddr::V4(w.world_v4), 80)),
        15001,
        None,
    );
}

#[test]
fn virtual_interface_traffic_goes_to_envoy_outbound_and_excluded_interfaces_bypass() {
    require_root();
    let mut w = PodWorld::ipv4_only().unwrap();
    let virt = w.add_link("eth1").unwrap();
    let excluded = w.add_link("eth2").unwrap();
    let cfg = Config {
        reroute_virtual_interfaces: vec!["eth1".into()],
        exclude_interfaces: vec!["eth2".into()],
        ..cni_default(Ipv6Mode::Off)
    };
    apply(w.pod.path(), &cfg);
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let pod_on = |ip: Ipv4Addr| ConnectSpec::new(IpAddr::V4(ip), 8080);
    // KubeVirt: what enters on the virtual interface is the VM's outbound traffic → 15001.
    landed(
        &connect(w.world.path(), &pod_on(virt.pod_v4)),
        15001,
        Some(SocketAddr::new(IpAddr::V4(virt.pod_v4), 8080)),
    );
    // Ordinary inbound on eth0 still goes to 15006; nothing on the excluded interface is captured.
    landed(&connect(w.world.path(), &pod_on(w.pod_v4)), 15006, None);
    landed(
        &connect(w.world.path(), &pod_on(excluded.pod_v4)),
        8080,
        None,
    );
}
