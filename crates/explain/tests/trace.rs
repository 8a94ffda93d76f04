//! The kernel-trace engine against real rules: each test programs a plan into a pod/world
//! namespace pair, traces a connection, and checks the kernel's path rule by rule against a
//! dump of the live ruleset (`nft -j -a`, matched by handle and comment) and against where a
//! real probe landed. Nothing may be left behind: not after a trace, not after SIGINT, and a
//! chain left by a SIGKILLed run is removed by the next one.

mod common;

use capture::*;
use common::wait_for_trace_rules;
use explain::trace::*;
use serde_json::Value;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use testbed::*;

const APP_UID: u32 = 1000;
/// Set in the child process the signal tests start (the pod namespace's path).
const CHILD_ENV: &str = "TRACE_TEST_CHILD_NETNS";

fn apply(ns: &Path, cfg: &Config) {
    let plan = Plan::build(cfg, &Facts::default()).expect("plan");
    netns::run_in(Some(ns), || nft_backend::apply(&plan))
        .unwrap()
        .expect("apply");
}

fn cni_default(ipv6: Ipv6Mode) -> Config {
    Config {
        ipv6,
        ..Config::cni_default()
    }
}

/// `(table, handle)` → `(chain, comment)` from `nft -j -a list ruleset` (inet tables).
fn live_rules(ns: &TestNetns) -> HashMap<(String, u64), (String, String)> {
    let out = ns.exec_ok("nft", &["-j", "-a", "list", "ruleset"]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let mut map = HashMap::new();
    for item in v["nftables"].as_array().unwrap() {
        let Some(r) = item.get("rule") else { continue };
        if r["family"] != "inet" {
            continue;
        }
        map.insert(
            (
                r["table"].as_str().unwrap().to_string(),
                r["handle"].as_u64().unwrap(),
            ),
            (
                r["chain"].as_str().unwrap().to_string(),
                r["comment"].as_str().unwrap_or("").to_string(),
            ),
        );
    }
    map
}

/// The path as `(chain, what, verdict)`: `what` is the rule's comment from the live dump
/// (looked up by the event's handle), or `policy` / `end of chain`.
fn described(p: &KernelPath, ns: &TestNetns) -> Vec<(String, String, String)> {
    let rules = live_rules(ns);
    p.events
        .iter()
        .map(|e| {
            let what = match e.kind {
                EventKind::Rule => {
                    let h = e.rule_handle.expect("rule events carry a handle");
                    let (chain, comment) = rules
                        .get(&(e.table.clone(), h))
                        .unwrap_or_else(|| panic!("handle {h} not in the live ruleset: {e}"));
                    assert_eq!(chain, &e.chain, "handle {h} belongs to another chain");
                    comment.clone()
                }
                EventKind::Policy => "policy".into(),
                EventKind::Return => "end of chain".into(),
            };
            let verdict = e
                .verdict
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_default();
            (e.chain.clone(), what, verdict)
        })
        .collect()
}

fn assert_path(p: &KernelPath, ns: &TestNetns, want: &[(&str, &str, &str)]) {
    let got = described(p, ns);
    let want: Vec<(String, String, String)> = want
        .iter()
        .map(|(c, w, v)| (c.to_string(), w.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, want, "kernel path: {p:#?}");
}

/// Traces and checks that the temporary chain is gone afterwards.
fn traced(pod: &TestNetns, from: Option<&TestNetns>, conn: &Connection) -> KernelPath {
    let started = std::time::Instant::now();
    let p = match from {
        None => trace(Some(pod.path()), conn, TraceHow::Connect),
        Some(f) => f
            .run(|| trace(Some(pod.path()), conn, TraceHow::Connect))
            .unwrap(),
    }
    .unwrap_or_else(|e| panic!("trace {conn:?}: {e}"));
    let took = started.elapsed();
    assert_eq!(
        list_trace_chains(Some(pod.path())).unwrap(),
        Vec::<String>::new()
    );
    summary(conn, &p);
    println!("  (trace took {took:?})");
    p
}

/// The one-line summary each test prints.
fn summary(conn: &Connection, p: &KernelPath) {
    let chains: Vec<&str> = p.chains().into_iter().map(|(_, c)| c).collect();
    let decided = p
        .deciding_event()
        .map(|e| e.to_string())
        .unwrap_or_else(|| "no decision in our tables".into());
    println!(
        "trace {:?} {} {}: {} => {decided}; attempt {:?}",
        conn.direction,
        conn.protocol.name(),
        conn.dst,
        if chains.is_empty() {
            "-".to_string()
        } else {
            chains.join(" > ")
        },
        p.attempt
    );
}

fn outbound(dst: IpAddr, port: u16) -> Connection {
    Connection::new(
        Direction::Outbound,
        Protocol::Tcp,
        SocketAddr::new(dst, port),
    )
}

fn app(dst: IpAddr, port: u16) -> Connection {
    outbound(dst, port).uid(APP_UID).gid(APP_UID)
}

fn landed_on(probe: &Probe, port: u16) -> Vec<Accepted> {
    probe
        .accepted()
        .into_iter()
        .filter(|a| a.port == port)
        .collect()
}

#[test]
fn app_outbound_tcp_is_traced_to_the_redirect_rule_and_lands_on_envoy() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let world = IpAddr::V4(w.world_v4);

    let p = traced(&w.pod, None, &app(world, 80));
    assert_path(
        &p,
        &w.pod,
        &[
            ("output", "outbound", "jump istio-output"),
            ("istio-output", "outbound to Envoy", "jump istio-redirect"),
            ("istio-redirect", "redirect outbound to Envoy", "accept"),
        ],
    );
    assert_eq!(p.table, "istio-proxy-nat");
    assert_eq!(p.hook, "output");
    let Attempt::Connected { local } = p.attempt else {
        panic!("{:?}", p.attempt)
    };
    // The probe socket's connection is the one Envoy's listener accepted.
    let at_envoy = landed_on(&sidecar, 15001);
    assert!(
        at_envoy
            .iter()
            .any(|a| a.peer == local && a.orig_dst == Some(SocketAddr::new(world, 80))),
        "{at_envoy:?}"
    );
}

#[test]
fn envoy_uid_and_excluded_port_are_traced_to_their_return_rules() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let world_probe = Probe::world(w.world.path()).unwrap();
    let world = IpAddr::V4(w.world_v4);

    let p = traced(&w.pod, None, &outbound(world, 80).uid(1337).gid(1337));
    assert_path(
        &p,
        &w.pod,
        &[
            ("output", "outbound", "jump istio-output"),
            (
                "istio-output",
                "Envoy (uid 1337) traffic: not captured",
                "return",
            ),
            ("output", "end of chain", "continue"),
            ("output", "policy", "accept"),
        ],
    );
    assert!(matches!(p.attempt, Attempt::Connected { .. }), "{p:?}");
    assert_eq!(landed_on(&world_probe, 80).len(), 1);

    // The CNI default excludes 15020 outbound.
    let p = traced(&w.pod, None, &app(world, 15020));
    assert_path(
        &p,
        &w.pod,
        &[
            ("output", "outbound", "jump istio-output"),
            (
                "istio-output",
                "outbound port excluded from capture",
                "return",
            ),
            ("output", "end of chain", "continue"),
            ("output", "policy", "accept"),
        ],
    );
    assert_eq!(landed_on(&world_probe, 15020).len(), 1);
}

#[test]
fn inbound_captured_and_excluded_ports() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let pod = IpAddr::V4(w.pod_v4);
    let inbound = |port| {
        Connection::new(
            Direction::Inbound,
            Protocol::Tcp,
            SocketAddr::new(pod, port),
        )
    };

    // Connected from the world namespace (the caller's thread's namespace).
    let p = traced(&w.pod, Some(&w.world), &inbound(8080));
    assert_eq!(p.hook, "prerouting");
    assert_path(
        &p,
        &w.pod,
        &[
            ("prerouting", "inbound TCP", "jump istio-inbound"),
            (
                "istio-inbound",
                "inbound to Envoy",
                "jump istio-in-redirect",
            ),
            ("istio-in-redirect", "redirect inbound to Envoy", "accept"),
        ],
    );
    assert_eq!(landed_on(&sidecar, 15006).len(), 1);

    let p = traced(&w.pod, Some(&w.world), &inbound(15020));
    assert_path(
        &p,
        &w.pod,
        &[
            ("prerouting", "inbound TCP", "jump istio-inbound"),
            (
                "istio-inbound",
                "inbound port excluded from capture",
                "return",
            ),
            ("prerouting", "end of chain", "continue"),
            ("prerouting", "policy", "accept"),
        ],
    );
    assert_eq!(landed_on(&sidecar, 15020).len(), 1);
}

#[test]
fn tproxy_inbound_is_traced_to_the_tproxy_rule_with_and_without_a_listener() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(
        w.pod.path(),
        &Config {
            inbound_mode: InterceptionMode::Tproxy,
            ..cni_default(Ipv6Mode::Off)
        },
    );
    let pod = IpAddr::V4(w.pod_v4);
    let conn = Connection::new(
        Direction::Inbound,
        Protocol::Tcp,
        SocketAddr::new(pod, 8080),
    );
    // No listener on 15006 yet: the app's port must not be reached around Envoy.
    let app = Probe::start(w.pod.path(), "app", &[Listen::tcp(8080)]).unwrap();
    let p = traced(&w.pod, Some(&w.world), &conn);
    let to_tproxy = [
        ("prerouting", "inbound TCP", "jump istio-inbound"),
        (
            "istio-inbound",
            "new inbound connection to Envoy",
            "jump istio-tproxy",
        ),
    ];
    let no_listener = (
        "istio-tproxy",
        "TPROXY found no Envoy listener: drop (fail closed)",
        "drop",
    );
    assert_path(&p, &w.pod, &[to_tproxy[0], to_tproxy[1], no_listener]);
    assert!(p.events.iter().all(|e| e.table == "istio-proxy-mangle"));
    assert_eq!(p.attempt, Attempt::TimedOut);
    assert!(app.accepted().is_empty());
    drop(app);

    let sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let p = traced(&w.pod, Some(&w.world), &conn);
    let delivered = ("istio-tproxy", "TPROXY inbound to Envoy", "accept");
    assert_path(&p, &w.pod, &[to_tproxy[0], to_tproxy[1], delivered]);
    assert_eq!(landed_on(&sidecar, 15006).len(), 1);
}

/// A pod capturing DNS, its agent on 15053, and an app's query to `world`:53.
fn dns_pod() -> (PodWorld, Probe, Connection) {
    let w = PodWorld::ipv4_only().unwrap();
    let mut cfg = cni_default(Ipv6Mode::Off);
    cfg.redirect_dns = true;
    cfg.capture_all_dns = true;
    apply(w.pod.path(), &cfg);
    let agent = Probe::start(w.pod.path(), "agent", &[Listen::udp(15053)]).unwrap();
    let conn = Connection::new(
        Direction::Outbound,
        Protocol::Udp,
        SocketAddr::new(IpAddr::V4(w.world_v4), 53),
    )
    .uid(APP_UID)
    .gid(APP_UID);
    (w, agent, conn)
}

/// Raw: DNS conntrack zone; then nat: outbound → DNS → redirect to the agent; then the
/// redirected datagram's second pass, over lo: raw prerouting (nat is not consulted again).
fn assert_dns_path(p: &KernelPath, pod: &TestNetns) {
    assert_path(
        p,
        pod,
        &[
            ("output", "DNS conntrack zones", "jump istio-output-dns"),
            ("istio-output-dns", "app DNS queries: zone 2", "continue"),
            ("istio-output-dns", "end of chain", "continue"),
            ("output", "end of chain", "continue"),
            ("output", "policy", "accept"),
            ("output", "outbound", "jump istio-output"),
            ("istio-output", "DNS capture", "jump istio-output-dns"),
            ("istio-output-dns", "DNS to istio-agent", "accept"),
            ("prerouting", "DNS conntrack zones", "jump istio-inbound"),
            ("istio-inbound", "end of chain", "continue"),
            ("prerouting", "end of chain", "continue"),
            ("prerouting", "policy", "accept"),
        ],
    );
    let tables: Vec<&str> = p.events.iter().map(|e| e.table.as_str()).collect();
    assert_eq!(
        tables,
        [
            ["istio-proxy-raw"; 5].as_slice(),
            &["istio-proxy-nat"; 3],
            &["istio-proxy-raw"; 4]
        ]
        .concat()
    );
}

#[test]
fn udp_dns_is_traced_to_the_dns_redirect() {
    require_root();
    let (w, agent, conn) = dns_pod();
    let p = traced(&w.pod, None, &conn);
    assert_dns_path(&p, &w.pod);
    let Attempt::Sent { local } = p.attempt else {
        panic!("{:?}", p.attempt)
    };
    assert!(
        testbed::node::wait_until(Duration::from_secs(5), || landed_on(&agent, 15053)
            .iter()
            .any(|a| a.peer == local)),
        "{:?}",
        agent.accepted()
    );
}

/// `--wait` does not know the source port: the redirected datagram's second pass over lo
/// (to 127.0.0.1:15053 now) is recognised by its connection's original destination.
#[test]
fn wait_follows_a_nat_redirected_datagram_through_its_second_pass() {
    require_root();
    let (w, agent, conn) = dns_pod();
    let p = std::thread::scope(|s| {
        let t = s.spawn(|| {
            trace(
                Some(w.pod.path()),
                &conn,
                TraceHow::Wait(Duration::from_secs(20)),
            )
        });
        assert!(
            wait_for_trace_rules(w.pod.path(), None),
            "the trace chain never appeared"
        );
        let sent = testbed::send_udp(
            w.pod.path(),
            &ConnectSpec::new(conn.dst.ip(), 53)
                .uid(APP_UID)
                .gid(APP_UID),
        );
        assert!(
            testbed::node::wait_until(Duration::from_secs(5), || !landed_on(&agent, 15053)
                .is_empty()),
            "{sent}"
        );
        t.join().unwrap().unwrap()
    });
    assert_eq!(p.attempt, Attempt::Observed);
    assert_dns_path(&p, &w.pod);
    assert_eq!(
        list_trace_chains(Some(w.pod.path())).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn ipv6_is_untouched_when_ipv6_capture_is_off() {
    require_root();
    let w = PodWorld::new().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let world_probe = Probe::world(w.world.path()).unwrap();
    let world6 = IpAddr::V6(w.world_v6.unwrap());
    let p = traced(&w.pod, None, &app(world6, 80));
    // The packet was traced (our chain saw it), but no rule of ours matched it: it fell
    // through the base chain to its policy.
    assert!(p.trace_id.is_some(), "{p:?}");
    assert_path(
        &p,
        &w.pod,
        &[
            ("output", "end of chain", "continue"),
            ("output", "policy", "accept"),
        ],
    );
    assert!(p.events.iter().all(|e| e.kind != EventKind::Rule));
    assert_eq!(p.events[0].nfproto, Some(libc_nfproto_ipv6()));
    assert!(matches!(p.attempt, Attempt::Connected { .. }), "{p:?}");
    assert_eq!(landed_on(&world_probe, 80).len(), 1);
}

fn libc_nfproto_ipv6() -> u32 {
    10 // NFPROTO_IPV6
}

#[test]
fn wait_traces_a_connection_made_by_someone_else() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let world = IpAddr::V4(w.world_v4);
    let conn = app(world, 443);
    let p = std::thread::scope(|s| {
        let t = s.spawn(|| {
            trace(
                Some(w.pod.path()),
                &conn,
                TraceHow::Wait(Duration::from_secs(20)),
            )
        });
        assert!(
            wait_for_trace_rules(w.pod.path(), None),
            "the trace chain never appeared"
        );
        // Another uid first: must not be the traced connection.
        let other = connect(
            w.pod.path(),
            &ConnectSpec::new(world, 443).uid(1337).gid(1337),
        );
        assert_eq!(other.landed_port(), Some(443), "{other}");
        let real = connect(
            w.pod.path(),
            &ConnectSpec::new(world, 443).uid(APP_UID).gid(APP_UID),
        );
        assert_eq!(real.landed_port(), Some(15001), "{real}");
        t.join().unwrap().unwrap()
    });
    summary(&conn, &p);
    assert_eq!(p.attempt, Attempt::Observed);
    assert_path(
        &p,
        &w.pod,
        &[
            ("output", "outbound", "jump istio-output"),
            ("istio-output", "outbound to Envoy", "jump istio-redirect"),
            ("istio-redirect", "redirect outbound to Envoy", "accept"),
        ],
    );
    assert_eq!(
        list_trace_chains(Some(w.pod.path())).unwrap(),
        Vec::<String>::new()
    );

    // Nothing of that shape: a clear error after the wait, and nothing left behind.
    let e = trace(
        Some(w.pod.path()),
        &app(world, 9),
        TraceHow::Wait(Duration::from_millis(300)),
    )
    .unwrap_err();
    assert!(matches!(e, TraceError::NothingSeen { .. }), "{e}");
    assert_eq!(
        list_trace_chains(Some(w.pod.path())).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn concurrent_traces_each_get_their_own_packet_and_leave_nothing() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let world = IpAddr::V4(w.world_v4);
    // Same destination for all, half of them as Envoy: only the source port and uid tell
    // the traced packets apart.
    let paths: Vec<(u32, KernelPath)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8u32)
            .map(|i| {
                let uid = if i % 2 == 0 { APP_UID } else { 1337 };
                let conn = outbound(world, 80).uid(uid).gid(uid);
                let pod = w.pod.path();
                s.spawn(move || (uid, trace(Some(pod), &conn, TraceHow::Connect).unwrap()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (uid, p) in &paths {
        let decided = p.deciding_event().unwrap().to_string();
        let last_rule = p
            .events
            .iter()
            .rev()
            .find(|e| e.kind == EventKind::Rule)
            .unwrap();
        let (_, comment) =
            &live_rules(&w.pod)[&(last_rule.table.clone(), last_rule.rule_handle.unwrap())];
        if *uid == 1337 {
            assert_eq!(
                comment, "Envoy (uid 1337) traffic: not captured",
                "{decided}"
            );
        } else {
            assert_eq!(comment, "redirect outbound to Envoy", "{decided}");
        }
        let ids: std::collections::HashSet<u32> = p.events.iter().map(|e| e.id).collect();
        assert_eq!(ids.len(), 1, "{p:#?}");
    }
    let mut names: Vec<&str> = paths.iter().map(|(_, p)| p.trace_chain.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 8, "chain names must be unique: {names:?}");
    assert_eq!(
        list_trace_chains(Some(w.pod.path())).unwrap(),
        Vec::<String>::new()
    );
    println!("trace: 8 concurrent traces in one namespace, each its own packet, no chain left");
}

#[test]
fn bad_input_is_a_clear_error() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let conn = app("10.0.0.1".parse().unwrap(), 80);
    let e = trace(Some(ns.path()), &conn, TraceHow::Connect).unwrap_err();
    assert!(matches!(e, TraceError::NoIstioRules { .. }), "{e}");
    assert!(
        e.to_string().contains("no istio rules in this namespace"),
        "{e}"
    );
    let e = trace(
        Some(Path::new("/nonexistent/netns")),
        &conn,
        TraceHow::Connect,
    )
    .unwrap_err();
    assert!(e.to_string().contains("/nonexistent/netns"), "{e}");

    // Inbound, connecting from inside the pod itself: not what an inbound connection does.
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let inbound = Connection::new(
        Direction::Inbound,
        Protocol::Tcp,
        SocketAddr::new(IpAddr::V4(w.pod_v4), 8080),
    );
    let e = w
        .pod
        .run(|| trace(Some(w.pod.path()), &inbound, TraceHow::Connect))
        .unwrap()
        .unwrap_err();
    assert!(matches!(e, TraceError::InvalidConnection(_)), "{e}");
    assert_eq!(
        list_trace_chains(Some(w.pod.path())).unwrap(),
        Vec::<String>::new()
    );
}

/// A child process (this test binary, running only [`child_waits_for_a_connection`]) that
/// waits for a connection that never comes.
fn spawn_waiting_child(pod: &TestNetns) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_waits_for_a_connection",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, pod.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Not a test of its own: the body of the child process of the signal tests.
#[test]
fn child_waits_for_a_connection() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let conn = app("192.0.2.1".parse().unwrap(), 81);
    match trace(
        Some(Path::new(&path)),
        &conn,
        TraceHow::Wait(Duration::from_secs(60)),
    ) {
        Err(TraceError::Interrupted { signal }) => {
            println!("child: {}", TraceError::Interrupted { signal });
            std::process::exit(128 + signal);
        }
        other => {
            println!("child: unexpected {other:?}");
            std::process::exit(1);
        }
    }
}

#[test]
fn sigint_or_sigterm_during_wait_removes_the_chain() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    for signal in [nix::sys::signal::SIGINT, nix::sys::signal::SIGTERM] {
        let child = spawn_waiting_child(&w.pod);
        assert!(
            wait_for_trace_rules(w.pod.path(), Some(child.id())),
            "no chain of the child"
        );
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(128 + signal as i32),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("the temporary chain was removed"),
            "{stdout}"
        );
        assert_eq!(
            list_trace_chains(Some(w.pod.path())).unwrap(),
            Vec::<String>::new()
        );
        println!(
            "trace: {signal} during --wait: exit {:?}, no chain left",
            out.status.code()
        );
    }
}

#[test]
fn a_chain_left_by_a_killed_run_is_removed_by_the_next_run() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    apply(w.pod.path(), &cni_default(Ipv6Mode::Off));
    let _sidecar = Probe::sidecar(w.pod.path()).unwrap();
    let mut child = spawn_waiting_child(&w.pod);
    let pid = child.id();
    assert!(
        wait_for_trace_rules(w.pod.path(), Some(pid)),
        "no chain of the child"
    );
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    // The output chain and its companion at prerouting (the second pass over lo).
    let left = list_trace_chains(Some(w.pod.path())).unwrap();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left.iter()
            .all(|c| c.starts_with(&format!("{TRACE_CHAIN_PREFIX}{pid}-"))),
        "{left:?}"
    );

    // The next run cleans it up before tracing.
    let p = traced(&w.pod, None, &app(IpAddr::V4(w.world_v4), 80));
    assert!(p.touched_our_tables());
    assert!(list_trace_chains(Some(w.pod.path())).unwrap().is_empty());
    println!("trace: stale chains {left:?} of killed pid {pid} removed by the next run");
}
