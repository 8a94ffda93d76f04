//! `explain` and link-local IPv6 (issue 21, item 3): a destination with its zone
//! (`[fe80::1%eth0]:80`, or `%<index>`), outbound and inbound, with the nft and the
//! iptables-legacy backend. The zone is resolved in the pod's namespace; the static
//! explanation must predict where a real connection through that interface lands, and (nft)
//! the kernel's trace must agree. Bad zones are refused naming `--dst` and the value.

use capture::{Config, Facts, Ipv6Mode, Plan};
use explain::trace::{self, TraceHow};
use explain::{self as ex, Connection, Direction, ExplainError, Landing, Protocol, Zone};
use integration::*;
use redirect::{Backend, BackendChoice};
use std::net::{IpAddr, SocketAddr};

/// A dual-stack pod with fe80::2 on eth0 (the world's side: fe80::1), sidecar and world
/// probes, and the CNI default rules programmed with `backend`.
fn pod(backend: Backend) -> (PodWorld, [Probe; 2]) {
    let w = PodWorld::new().unwrap();
    w.add_link_local().unwrap();
    let cfg = Config {
        ipv6: Ipv6Mode::On,
        ..Config::cni_default()
    };
    let plan = Plan::build(&cfg, &Facts::default()).unwrap();
    redirect::apply(&plan, Some(w.pod.path()), BackendChoice::Fixed(backend)).unwrap();
    let probes = [
        Probe::sidecar(w.pod.path()).unwrap(),
        Probe::world(w.world.path()).unwrap(),
    ];
    (w, probes)
}

fn eth0_index(w: &PodWorld) -> u32 {
    w.pod
        // SAFETY: a NUL-terminated name.
        .run(|| unsafe { libc::if_nametoindex(c"eth0".as_ptr()) })
        .unwrap()
}

fn ruleset(w: &PodWorld, backend: Backend) -> ex::ir::Ruleset {
    match backend {
        Backend::Nft => ex::live_ruleset(Some(w.pod.path())).unwrap(),
        Backend::IptablesLegacy => ex::live_legacy_ruleset(Some(w.pod.path())).unwrap(),
    }
}

/// `(name, connection, where it must land: the probe's name and port)`.
fn cases(w: &PodWorld) -> Vec<(&'static str, Connection, (&'static str, u16))> {
    let out = |port, uid| {
        Connection::new(
            Direction::Outbound,
            Protocol::Tcp,
            SocketAddr::new(WORLD_LINK_LOCAL.into(), port),
        )
        .uid(uid)
        .gid(uid)
        .zone(Zone::Name("eth0".into()))
    };
    let inbound = |port| {
        Connection::new(
            Direction::Inbound,
            Protocol::Tcp,
            SocketAddr::new(POD_LINK_LOCAL.into(), port),
        )
        .src(WORLD_LINK_LOCAL.into())
    };
    vec![
        (
            "app -> [fe80::1%eth0]:80",
            out(80, 1000),
            ("dropped", 15001),
        ),
        ("envoy -> [fe80::1%eth0]:80", out(80, 1337), ("world", 80)),
        (
            "app -> [fe80::1%<index>]:443",
            out(443, 1000).zone(Zone::Index(eth0_index(w))),
            ("dropped", 15001),
        ),
        ("fe80::1 -> [fe80::2]:8080", inbound(8080), ("pod", 15006)),
        (
            "fe80::1 -> [fe80::2%eth0]:15008",
            inbound(15008).zone(Zone::Name("eth0".into())),
            ("pod", 15008),
        ),
    ]
}

#[test]
fn link_local_connections_are_explained_in_both_directions_and_agree_with_reality() {
    require_root();
    for backend in [Backend::Nft, Backend::IptablesLegacy] {
        let (w, _p) = pod(backend);
        let rs = ruleset(&w, backend);
        for (name, conn, (probe_name, port)) in cases(&w) {
            let facts = ex::namespace_facts(Some(w.pod.path()), &conn)
                .unwrap_or_else(|e| panic!("{backend} {name}: {e}"));
            let e = ex::explain_with(&rs, &conn, &facts)
                .unwrap_or_else(|e| panic!("{backend} {name}: {e}"));
            let text = ex::render_text(&e);
            let want = match probe_name {
                "pod" => Landing::Pod(port),
                "dropped" => Landing::Dropped,
                _ => Landing::Away(SocketAddr::new(WORLD_LINK_LOCAL.into(), port)),
            };
            assert_eq!(e.outcome.landing(), want, "{backend} {name}:\n{text}");
            let via = match conn.direction {
                Direction::Outbound => (e.connection.oif.as_deref(), "out via eth0"),
                Direction::Inbound => (e.connection.iif.as_deref(), "in via eth0"),
            };
            assert_eq!(via.0, Some("eth0"), "{backend} {name}:\n{text}");
            assert!(text.contains(via.1), "{text}");
            assert_eq!(e.connection.zone.as_deref(), Some("eth0"), "{text}");
            let got = w.open(&conn, Some("eth0"));
            if probe_name == "dropped" {
                // The app's redirect to [::1]:15001 on a socket bound to eth0: no route.
                assert_eq!(got, Outcome::Timeout, "{backend} {name}");
                assert!(e.summary.contains("no route to ::1 through eth0"), "{text}");
            } else {
                let landed = got.landed().map(|l| (l.probe.as_str(), l.port));
                assert_eq!(landed, Some((probe_name, port)), "{backend} {name}: {got}");
            }
            let kp = match conn.direction {
                Direction::Outbound => trace::trace(Some(w.pod.path()), &conn, TraceHow::Connect),
                Direction::Inbound => netns::run_in(Some(w.world.path()), || {
                    trace::trace(Some(w.pod.path()), &conn, TraceHow::Connect)
                })
                .unwrap(),
            }
            .unwrap_or_else(|e| panic!("{backend} {name}: trace: {e}"));
            let ag = ex::compare::compare(&rs, &e, &kp);
            assert!(ag.agree, "{backend} {name}: {:?}\n{text}", ag.differences);
        }
    }
}

#[test]
fn bad_zones_are_refused_naming_dst_and_the_value() {
    require_root();
    let (w, _p) = pod(Backend::Nft);
    let out = |zone: Option<Zone>| {
        let c = Connection::new(
            Direction::Outbound,
            Protocol::Tcp,
            SocketAddr::new(WORLD_LINK_LOCAL.into(), 80),
        );
        match zone {
            Some(z) => c.zone(z),
            None => c,
        }
    };
    let inbound_on_eth1 = Connection::new(
        Direction::Inbound,
        Protocol::Tcp,
        SocketAddr::new(POD_LINK_LOCAL.into(), 8080),
    )
    .zone(Zone::Name("lo".into()));
    let global = Connection::new(
        Direction::Outbound,
        Protocol::Tcp,
        SocketAddr::new(IpAddr::from(w.world_v6.unwrap()), 80),
    )
    .zone(Zone::Name("eth0".into()));
    for (conn, value, why) in [
        (
            out(Some(Zone::Name("eth9".into()))),
            "[fe80::1%eth9]:80",
            "zone %eth9: no such interface in the pod's namespace (interfaces: eth0, lo)",
        ),
        (
            out(Some(Zone::Index(999))),
            "[fe80::1%999]:80",
            "zone %999: no such interface",
        ),
        (
            out(None),
            "[fe80::1]:80",
            "a link-local destination needs a zone",
        ),
        (
            inbound_on_eth1,
            "[fe80::2%lo]:8080",
            "zone %lo: fe80::2 is not an address of lo",
        ),
        (
            global.clone(),
            &global.dst_shown(),
            "link-local addresses (fe80::/10) only",
        ),
    ] {
        match ex::explain(Some(w.pod.path()), &conn) {
            Err(ExplainError::BadInput {
                arg,
                value: v,
                why: w,
            }) => {
                assert_eq!((arg, v.as_str()), ("--dst", value));
                assert!(w.contains(why), "{value}: {w}");
            }
            other => panic!("{value}: {other:?}"),
        }
    }
}
