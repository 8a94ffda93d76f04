//! The harness itself, on a real kernel, without any redirect rules.

use integration::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

#[test]
fn namespace_is_created_and_removed_on_drop() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let path = ns.path().to_path_buf();
    assert!(path.exists());
    assert!(ns.name().starts_with(&format!("t-{}-", std::process::id())));
    let links = ns.exec_ok("ip", &["-o", "link", "show", "up"]).unwrap();
    assert!(links.contains("lo:"), "{links}");
    // Different namespace from ours.
    assert_ne!(
        netns::inode(&path).unwrap(),
        netns::inode(Path::new("/proc/self/ns/net")).unwrap()
    );
    drop(ns);
    assert!(!path.exists());
}

#[test]
fn namespace_is_removed_when_the_test_panics() {
    require_root();
    let mut path = None;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let ns = TestNetns::new().unwrap();
        path = Some(ns.path().to_path_buf());
        panic!("boom");
    }));
    assert!(r.is_err());
    assert!(!path.unwrap().exists());
}

#[test]
fn exec_reports_failures_with_stderr() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let err = ns.sh("echo nope >&2; exit 3").unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
}

#[test]
fn plain_connection_lands_on_its_own_port() {
    require_root();
    let w = PodWorld::new().unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let out = connect(w.pod.path(), &ConnectSpec::new(w.world_v4.into(), 80));
    let l = out.landed().unwrap_or_else(|| panic!("{out}"));
    assert_eq!((l.probe.as_str(), l.port), ("world", 80));
    assert_eq!(l.orig_dst, Some(SocketAddr::new(w.world_v4.into(), 80)));
    assert!(!l.redirected());

    let v6 = w.world_v6.unwrap();
    let out = connect(w.pod.path(), &ConnectSpec::new(v6.into(), 443));
    assert_eq!(
        out.orig_dst(),
        Some(SocketAddr::new(v6.into(), 443)),
        "{out}"
    );
}

#[test]
fn world_reaches_the_pod_and_the_probe_records_the_peer() {
    require_root();
    let w = PodWorld::new().unwrap();
    let pod = Probe::sidecar(w.pod.path()).unwrap();
    let out = connect(w.world.path(), &ConnectSpec::new(w.pod_v4.into(), 8080));
    assert_eq!(out.landed_port(), Some(8080), "{out}");
    let out = connect(
        w.world.path(),
        &ConnectSpec::new(w.pod_v6.unwrap().into(), 15021),
    );
    assert_eq!(out.landed_port(), Some(15021), "{out}");
    let acc = pod.accepted();
    assert_eq!(acc.len(), 2);
    assert_eq!(acc[0].peer.ip(), IpAddr::V4(w.world_v4));
    assert_eq!(acc[1].peer.ip(), IpAddr::V6(w.world_v6.unwrap()));
}

#[test]
fn refused_and_timeout_are_distinguished() {
    require_root();
    let w = PodWorld::new().unwrap();
    // No listener: RST.
    let out = connect(w.pod.path(), &ConnectSpec::new(w.world_v4.into(), 81));
    assert_eq!(out, Outcome::Refused);
    // SYNs dropped in the world: timeout, bounded.
    w.world
        .exec_ok(
            "iptables-legacy",
            &[
                "-w", "-A", "INPUT", "-p", "tcp", "--dport", "82", "-j", "DROP",
            ],
        )
        .unwrap();
    let t = std::time::Instant::now();
    let out = connect(
        w.pod.path(),
        &ConnectSpec::new(w.world_v4.into(), 82).timeout(SHORT_TIMEOUT),
    );
    assert_eq!(out, Outcome::Timeout);
    assert!(t.elapsed() < SHORT_TIMEOUT * 3);
}

#[test]
fn client_identity_is_per_thread() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    // Only connections of uid 1337 / gid 1338 are rejected, so landing proves the identity.
    for (flag, id) in [("--uid-owner", "1337"), ("--gid-owner", "1338")] {
        w.pod
            .exec_ok(
                "iptables-legacy",
                &[
                    "-w",
                    "-A",
                    "OUTPUT",
                    "-p",
                    "tcp",
                    "-m",
                    "owner",
                    flag,
                    id,
                    "-j",
                    "REJECT",
                    "--reject-with",
                    "tcp-reset",
                ],
            )
            .unwrap();
    }
    let spec = ConnectSpec::new(w.world_v4.into(), 80);
    assert_eq!(connect(w.pod.path(), &spec).landed_port(), Some(80));
    assert_eq!(
        connect(w.pod.path(), &spec.clone().uid(1337)),
        Outcome::Refused
    );
    assert_eq!(
        connect(w.pod.path(), &spec.clone().gid(1338)),
        Outcome::Refused
    );
    assert_eq!(
        connect(w.pod.path(), &spec.clone().uid(1000).gid(1000)).landed_port(),
        Some(80)
    );
    // The test process itself is still root.
    assert!(is_root());
    // SAFETY: getegid has no preconditions.
    assert_eq!(unsafe { libc::getegid() }, 0);
}

#[test]
fn ipv4_only_pod_has_no_ipv6_addresses_but_loopback() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    assert!(w.pod_v6.is_none());
    let addrs = w.pod.exec_ok("ip", &["-6", "-o", "addr"]).unwrap();
    assert!(!addrs.contains("eth0"), "{addrs}");
    assert!(addrs.contains("::1"), "{addrs}");
}

#[test]
fn source_bind_and_loopback() {
    require_root();
    let w = PodWorld::new().unwrap();
    let _pod = Probe::sidecar(w.pod.path()).unwrap();
    let out = connect(
        w.pod.path(),
        &ConnectSpec::new(Ipv4Addr::new(127, 0, 0, 6).into(), 15020)
            .src(Ipv4Addr::LOCALHOST.into()),
    );
    assert_eq!(out.landed_port(), Some(15020), "{out}");
    let out = connect(
        w.pod.path(),
        &ConnectSpec::new(Ipv6Addr::LOCALHOST.into(), 15090),
    );
    assert_eq!(out.landed_port(), Some(15090), "{out}");
}

#[test]
fn udp_datagrams_are_answered_by_the_listener() {
    require_root();
    let w = PodWorld::new().unwrap();
    let world = Probe::world(w.world.path()).unwrap();
    let _pod = Probe::sidecar(w.pod.path()).unwrap();
    let out = send_udp(w.pod.path(), &ConnectSpec::new(w.world_v4.into(), 53));
    let l = out.landed().unwrap_or_else(|| panic!("{out}"));
    assert_eq!((l.probe.as_str(), l.port), ("world", 53));
    let out = send_udp(
        w.pod.path(),
        &ConnectSpec::new(w.world_v6.unwrap().into(), 53),
    );
    assert_eq!(out.landed_port(), Some(53), "{out}");
    // Nobody listens on 54 in the world: no answer.
    let out = send_udp(
        w.pod.path(),
        &ConnectSpec::new(w.world_v4.into(), 54).timeout(SHORT_TIMEOUT),
    );
    assert_eq!(out, Outcome::Timeout);
    // The local DNS proxy port answers directly.
    let out = send_udp(
        w.pod.path(),
        &ConnectSpec::new(Ipv4Addr::LOCALHOST.into(), 15053),
    );
    assert_eq!(out.landed().map(|l| l.probe.as_str()), Some("pod"), "{out}");
    assert_eq!(world.accepted().len(), 2);
}

#[test]
fn extra_link_carries_traffic_into_the_pod() {
    require_root();
    let mut w = PodWorld::new().unwrap();
    let l = w.add_link("eth1").unwrap();
    assert_ne!(l.pod_v4, w.pod_v4);
    let _pod = Probe::sidecar(w.pod.path()).unwrap();
    let out = connect(w.world.path(), &ConnectSpec::new(l.pod_v4.into(), 8080));
    assert_eq!(out.landed_port(), Some(8080), "{out}");
}

#[test]
fn many_namespaces_in_parallel() {
    require_root();
    let t = std::time::Instant::now();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..3 {
                    let w = PodWorld::new().unwrap();
                    let _world = Probe::world(w.world.path()).unwrap();
                    let out = connect(w.pod.path(), &ConnectSpec::new(w.world_v4.into(), 80));
                    assert_eq!(out.landed_port(), Some(80), "{out}");
                }
            });
        }
    });
    eprintln!("24 pod/world pairs in {:?}", t.elapsed());
}
