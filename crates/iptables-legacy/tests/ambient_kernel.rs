//! Ambient's in-pod rules through the legacy backend on a real kernel: where real
//! connections land (stand-in ztunnel on 15001/15006/15008/15053, app on 8080), idempotent
//! re-apply, cleanup. (The host probe rule and its ipsets: ambient_host.rs.)
use netns::NsLock;
use std::time::{Duration, Instant};

use capture::{AmbientConfig, Plan};
use std::net::{IpAddr, SocketAddr};
use testbed::ztunnel::ZTUNNEL_STAND_IN as ZTUNNEL;
use testbed::*;

/// The calling thread's namespace lock, as `redirect` holds it around every backend call.
fn held() -> NsLock {
    NsLock::current(&"test namespace", Instant::now() + Duration::from_secs(10)).expect("lock")
}

fn apply(ns: &TestNetns, plan: &Plan) {
    ns.run(|| iptables_legacy::apply(plan, &held(), &iptables_legacy::Tools::default()))
        .expect("enter namespace")
        .expect("apply");
}

fn saved(ns: &TestNetns) -> String {
    let text = ns.exec_ok("iptables-legacy-save", &[]).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(" [").next().unwrap_or(l).to_string() + "\n")
        .collect()
}

#[test]
fn ambient_rules_through_iptables_legacy() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let plan = Plan::ambient(&AmbientConfig {
        redirect_dns: true,
        ..AmbientConfig::default()
    })
    .unwrap();
    apply(&w.pod, &plan);
    let first = saved(&w.pod);
    apply(&w.pod, &plan);
    assert_eq!(saved(&w.pod), first, "re-apply changed the rules");
    let drift = w
        .pod
        .run(|| iptables_legacy::check(&plan, &iptables_legacy::Tools::default()))
        .unwrap()
        .unwrap();
    assert!(drift.is_empty(), "{drift:?}");

    let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let (pod, world) = (IpAddr::V4(w.pod_v4), IpAddr::V4(w.world_v4));
    let (p, wp) = (w.pod.path(), w.world.path());
    let app = |dst, port| ConnectSpec::new(dst, port).uid(1000).gid(1000);
    let o = connect(p, &app(world, 80));
    Outcome::assert_lands(&o, "pod", 15001, Some(SocketAddr::new(world, 80)));
    let o = connect(wp, &ConnectSpec::new(pod, 8080));
    Outcome::assert_lands(&o, "pod", 15006, Some(SocketAddr::new(pod, 8080)));
    Outcome::assert_lands(
        &connect(wp, &ConnectSpec::new(pod, 15008)),
        "pod",
        15008,
        None,
    );
    let own = ConnectSpec::new(world, 80).mark(0x539);
    Outcome::assert_lands(&connect(p, &own), "world", 80, None);
    Outcome::assert_lands(&send_udp(p, &app(world, 53)), "pod", 15053, None);
    Outcome::assert_lands(&connect(p, &app(world, 53)), "pod", 15053, None);
    Outcome::assert_lands(
        &send_udp(p, &ConnectSpec::new(world, 53).mark(0x539)),
        "world",
        53,
        None,
    );

    assert!(
        w.pod
            .run(|| iptables_legacy::cleanup(&held(), &iptables_legacy::Tools::default()))
            .unwrap()
            .unwrap()
    );
    assert!(!saved(&w.pod).contains("ISTIO"), "{}", saved(&w.pod));
}
