//! `explain` for ambient pods (issue 20 item 3) against reality: ambient's in-pod rules are
//! programmed (nft and iptables-legacy, through the backends' own apply) into a pod/world pair
//! with a stand-in ztunnel in the pod (15001/15006/15008/15053, app on 8080), and for every
//! connection of the table the static explanation of the live rules predicts where a real probe
//! lands, and the kernel's trace of the same connection (nft's nftrace, ip_tables' TRACE)
//! agrees with the static path, leaving nothing behind in the legacy pod. The
//! host probe rule is programmed in the world namespace (the "node"): explain from the node as
//! kubelet's uid says SNAT to 169.254.7.127, the pod's inbound explanation from that address
//! says "not captured", and the real probe lands on the app seen from 169.254.7.127.

use capture::{AmbientConfig, Plan, ambient_constants};
use explain::ir::TableFamily;
use explain::trace::{self, TraceHow};
use explain::{self as ex, Connection, Direction, Landing, Protocol};
use integration::host_probe::LEGACY_HOST_RULE;
use integration::ztunnel::ZTUNNEL_STAND_IN as ZTUNNEL;
use integration::*;
use redirect::{Backend, BackendChoice};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

const APP: u32 = 1000;
const KUBELET: u32 = 4242;
const ZTUNNEL_MARK: u32 = ambient_constants::INPOD_MARK;

struct Case {
    name: String,
    conn: Connection,
    /// Where the probe must land: (probe, port).
    want: (&'static str, u16),
}

fn cases(w: &PodWorld) -> Vec<Case> {
    let mut out = Vec::new();
    let probe_src = IpAddr::V4(ambient_constants::HOST_PROBE_SNAT_V4);
    let fams: Vec<(&str, IpAddr, IpAddr)> = vec![
        ("v4", w.pod_v4.into(), w.world_v4.into()),
        ("v6", w.pod_v6.unwrap().into(), w.world_v6.unwrap().into()),
    ];
    for (f, pod, world) in fams {
        let outb = |p: Protocol, dst: IpAddr, port| {
            Connection::new(Direction::Outbound, p, SocketAddr::new(dst, port))
        };
        let inb = |port| {
            Connection::new(
                Direction::Inbound,
                Protocol::Tcp,
                SocketAddr::new(pod, port),
            )
            .src(world)
        };
        let mut add = |name: &str, conn: Connection, want| {
            out.push(Case {
                name: format!("[{f}] {name}"),
                conn,
                want,
            })
        };
        let tcp = Protocol::Tcp;
        let app = |c: Connection| c.uid(APP).gid(APP);
        add("app -> world:80", app(outb(tcp, world, 80)), ("pod", 15001));
        add("world -> app:8080", inb(8080), ("pod", 15006));
        add("world -> HBONE 15008", inb(15008), ("pod", 15008));
        add(
            "ztunnel (mark 0x539) -> world:80",
            outb(tcp, world, 80).mark(ZTUNNEL_MARK),
            ("world", 80),
        );
        add(
            "mark 0x70000539 (same low bits) -> world:80",
            outb(tcp, world, 80).mark(0x7000_0539),
            ("world", 80),
        );
        add(
            "app udp -> world:53",
            app(outb(Protocol::Udp, world, 53)),
            ("pod", 15053),
        );
        add(
            "app tcp -> world:53",
            app(outb(tcp, world, 53)),
            ("pod", 15053),
        );
        add(
            "ztunnel udp -> world:53",
            outb(Protocol::Udp, world, 53).mark(ZTUNNEL_MARK),
            ("world", 53),
        );
        add(
            "app -> own pod:8080",
            app(outb(tcp, pod, 8080)),
            ("pod", 8080),
        );
        if f == "v4" {
            add(
                "app -> 127.0.0.1:8080",
                app(outb(tcp, Ipv4Addr::LOCALHOST.into(), 8080)),
                ("pod", 8080),
            );
            add(
                "kubelet probe (from 169.254.7.127) -> app:8080",
                inb(8080).src(probe_src),
                ("pod", 8080),
            );
        }
    }
    out
}

/// What the static explanation's landing means for the probe.
fn predicted(l: &Landing, w: &PodWorld) -> Option<(&'static str, u16)> {
    let world: [IpAddr; 2] = [w.world_v4.into(), w.world_v6.unwrap().into()];
    match l {
        Landing::Pod(p) => Some(("pod", *p)),
        Landing::Away(a) if world.contains(&a.ip()) => Some(("world", a.port())),
        _ => None,
    }
}

fn live(backend: Backend, ns: &Path) -> ex::ir::Ruleset {
    match backend {
        Backend::Nft => ex::live_ruleset(Some(ns)).unwrap(),
        Backend::IptablesLegacy => ex::live_legacy_ruleset(Some(ns)).unwrap(),
    }
}

/// `conn` explained against `rs` with the facts of the namespace at `netns`.
fn explained(rs: &ex::ir::Ruleset, netns: &Path, conn: &Connection) -> ex::Explanation {
    let facts = ex::namespace_facts(Some(netns), conn).unwrap();
    ex::explain_with(rs, conn, &facts).unwrap()
}

/// A connection made on the node to the pod's app (8080), as `uid`.
fn from_node_to_app(pod: IpAddr, uid: u32) -> Connection {
    Connection::new(
        Direction::Outbound,
        Protocol::Tcp,
        SocketAddr::new(pod, 8080),
    )
    .uid(uid)
}

fn trace_case(w: &PodWorld, c: &Connection) -> trace::KernelPath {
    match c.direction {
        Direction::Outbound => trace::trace(Some(w.pod.path()), c, TraceHow::Connect),
        Direction::Inbound => netns::run_in(Some(w.world.path()), || {
            trace::trace(Some(w.pod.path()), c, TraceHow::Connect)
        })
        .unwrap(),
    }
    .unwrap_or_else(|e| panic!("trace: {e}"))
}

fn scenario(backend: Backend) -> Vec<String> {
    let w = PodWorld::new().unwrap();
    w.world
        .exec_ok("ip", &["addr", "add", "169.254.7.127/32", "dev", "eth0"])
        .unwrap();
    let plan = Plan::ambient(&AmbientConfig {
        redirect_dns: true,
        ipv6: true,
        ..AmbientConfig::default()
    })
    .unwrap();
    redirect::apply(&plan, Some(w.pod.path()), BackendChoice::Fixed(backend))
        .unwrap_or_else(|e| panic!("apply with {backend}: {e}"));
    let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let rs = live(backend, w.pod.path());
    assert!(
        rs.chains
            .iter()
            .any(|c| c.table.contains("ambient") || c.name.starts_with("ISTIO_")),
        "{backend}: the ambient rules were read"
    );
    let mut failures = Vec::new();
    if backend == Backend::Nft {
        // Every live rule is shown as the plan renderer writes it.
        let planned = nft_backend::render_text(&plan);
        let lines: Vec<&str> = planned.lines().map(str::trim).collect();
        for (c, r) in rs
            .chains
            .iter()
            .flat_map(|c| c.rules.iter().map(move |r| (c, r)))
        {
            if !lines.contains(&r.text.as_str()) {
                failures.push(format!(
                    "text of {} {} rule {}: {}",
                    c.table, c.name, r.position, r.text
                ));
            }
        }
    }
    for c in cases(&w) {
        let e = explained(&rs, w.pod.path(), &c.conn);
        let said = predicted(&e.outcome.landing(), &w);
        let got = w.open(&c.conn, None);
        let landed = got.landed().map(|l| (l.probe.as_str(), l.port));
        if said != Some(c.want) || landed != Some(c.want) {
            failures.push(format!(
                "{backend} {}: want {:?}, static says {} ({said:?}), probe {got}\n{}",
                c.name,
                c.want,
                e.summary,
                ex::render_text(&e)
            ));
            continue;
        }
        let ag = ex::compare::compare(&rs, &e, &trace_case(&w, &c.conn));
        if !ag.agree || !ag.not_traced.is_empty() {
            failures.push(format!(
                "{backend} {} trace: {:?} (not traced {:?})\nstatic:\n{}kernel:\n{}",
                c.name,
                ag.differences,
                ag.not_traced,
                ex::render_text(&e),
                ex::render::render_steps(&ag.kernel_steps)
            ));
        }
    }
    if backend == Backend::IptablesLegacy {
        failures.extend(legacy_trace::left_in_legacy_pod(w.pod.path()));
    }
    failures
}

#[test]
fn ambient_pod_explanations_match_probes_and_the_kernel_trace() {
    require_root();
    let mut failures = scenario(Backend::Nft);
    failures.extend(scenario(Backend::IptablesLegacy));
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The connection as kubelet (or another uid) makes it from the node, and who the app saw.
fn from_node(w: &PodWorld, app: &Probe, uid: u32) -> (u16, IpAddr) {
    let before = app.accepted().len();
    let o = connect(
        w.world.path(),
        &ConnectSpec::new(w.pod_v4.into(), 8080).uid(uid),
    );
    let port = o.landed_port().unwrap_or_else(|| panic!("no landing: {o}"));
    (port, app.accepted()[before].peer.ip())
}

#[test]
fn host_probe_rule_is_explained_from_the_node_and_confirmed() {
    require_root();
    let (w, host) = integration::host_probe::nft_pod_on_node(KUBELET);
    let (node, pod) = (w.world.path(), IpAddr::V4(w.pod_v4));
    let ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let snat = IpAddr::V4(ambient_constants::HOST_PROBE_SNAT_V4);
    let host_rs = ex::live_ruleset(Some(node)).unwrap();
    let pod_rs = ex::live_ruleset(Some(w.pod.path())).unwrap();
    let planned = nft_backend::render_text(&host);
    for r in host_rs.chains.iter().flat_map(|c| &c.rules) {
        assert!(
            planned.lines().any(|l| l.trim() == r.text),
            "{} not in\n{planned}",
            r.text
        );
    }

    for (uid, src_in_pod, lands_on) in [(KUBELET, snat, 8080), (APP, IpAddr::V4(w.world_v4), 15006)]
    {
        let conn = from_node_to_app(pod, uid);
        let e = explained(&host_rs, node, &conn);
        assert_eq!(
            e.outcome.landing(),
            Landing::Away(conn.dst),
            "{}",
            e.summary
        );
        if uid == KUBELET {
            assert!(
                matches!(&e.outcome, ex::Outcome::Snatted { from, .. } if *from == snat),
                "{}",
                ex::render_text(&e)
            );
            assert!(
                e.summary.starts_with("source NATed to 169.254.7.127"),
                "{}",
                e.summary
            );
        } else {
            assert!(
                !matches!(e.outcome, ex::Outcome::Snatted { .. }),
                "{}",
                e.summary
            );
        }
        // The kernel agrees (the host table's postrouting chain).
        let kp = trace::trace(Some(node), &conn, TraceHow::Connect).unwrap();
        let ag = ex::compare::compare(&host_rs, &e, &kp);
        assert!(
            ag.agree && ag.not_traced.is_empty(),
            "uid {uid}: {:?} {:?}\n{}",
            ag.differences,
            ag.not_traced,
            ex::render::render_steps(&ag.kernel_steps)
        );
        // In the pod, the connection arrives from that source: explained and probed alike.
        let inbound = Connection::new(Direction::Inbound, Protocol::Tcp, conn.dst).src(src_in_pod);
        let pe = explained(&pod_rs, w.pod.path(), &inbound);
        assert_eq!(
            pe.outcome.landing(),
            Landing::Pod(lands_on),
            "{}",
            pe.summary
        );
        assert_eq!(from_node(&w, &ztunnel, uid), (lands_on, src_in_pod));
    }
}

/// On an iptables-legacy node: Istio's legacy host rule (`nat ISTIO_POSTRT`, any local socket,
/// the ipset `istio-inpod-probes-v4`) read back as the plan rendered it, explained from the
/// node for kubelet's uid and another one (both SNATed: `--socket-exists`), confirmed by the
/// kernel's record of a real connection (its conntrack entry SNATed to the probe address, the
/// rule's counter moved), and the pod's legacy rules let the SNATed probe through to the app,
/// as the real probe shows.
#[test]
fn legacy_host_probe_rule_is_explained_from_the_node_and_matches_the_real_probe() {
    require_root();
    let (w, _host) = integration::host_probe::legacy_pod_on_node();
    let (node, pod) = (w.world.path(), IpAddr::V4(w.pod_v4));
    let ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let snat = IpAddr::V4(ambient_constants::HOST_PROBE_SNAT_V4);
    let host_rs = ex::live_legacy_host_ruleset(Some(node)).unwrap();
    // Exactly Istio's rule (as iptables-legacy-save orders its options) and the jump.
    let texts = |name: &str| -> Vec<String> {
        host_rs
            .chain(TableFamily::Ip, "nat", name)
            .map(|c| c.rules.iter().map(|r| r.text.clone()).collect())
            .unwrap_or_default()
    };
    assert_eq!(texts(ex::live_legacy::HOST_CHAIN), [LEGACY_HOST_RULE]);
    assert_eq!(texts("POSTROUTING"), ["-A POSTROUTING -j ISTIO_POSTRT"]);
    let members = host_rs.set("nat", ambient_constants::PROBE_SET_V4);
    assert_eq!(members.map(|s| s.elements.len()), Some(1), "{host_rs:?}");
    let pod_rs = live(Backend::IptablesLegacy, w.pod.path());
    for uid in [KUBELET, APP] {
        let conn = from_node_to_app(pod, uid);
        let e = explained(&host_rs, node, &conn);
        assert!(
            matches!(&e.outcome, ex::Outcome::Snatted { from, .. } if *from == snat),
            "uid {uid}: {}",
            ex::render_text(&e)
        );
        let rec = trace::record_host(Some(node), &conn).unwrap();
        let ag = ex::compare::compare_record(&e, &rec);
        assert!(ag.agree && ag.not_traced.is_empty(), "uid {uid}: {ag:?}");
        assert_eq!(rec.conntrack.and_then(|c| c.snat()), Some(snat));
        assert_eq!(ag.record.and_then(|r| r.corroborated), Some(true));
        let inbound = Connection::new(Direction::Inbound, Protocol::Tcp, conn.dst).src(snat);
        let pe = explained(&pod_rs, w.pod.path(), &inbound);
        assert_eq!(pe.outcome.landing(), Landing::Pod(8080), "{}", pe.summary);
        assert_eq!(from_node(&w, &ztunnel, uid), (8080, snat));
    }
}
