//! `explain` against reality (issue 15): for every scenario of `nft/listings/` (the 28 Istio
//! nftables goldens and the two CNI defaults), the plan is programmed into a fresh pod/world
//! pair, and for a table of connections (the e2e's cases: app, Envoy uid/gid 1337, loopback,
//! excluded ports and CIDRs, DNS, IPv6, TPROXY, inbound captured and excluded, via eth1) the
//! static explanation of the live rules must predict where a real probe connection lands, and
//! the kernel's trace of the same connection must agree with the static path (same deciding
//! rule per table, same rules matched, same outcome), through every hook the static path
//! crosses (a packet to a local address also on its second pass, over lo). A subset of
//! scenarios is also programmed with the iptables-legacy backend, explained from
//! `iptables-legacy-save` and traced with ip_tables' TRACE target, the same way: static =
//! probe = kernel trace, and the pod holds no nft object at any time and nothing of the
//! trace's afterwards.

use capture::{Config, Facts, Ipv6Mode, Plan};
use explain::trace::{self, TraceHow};
use explain::{self as ex, Connection, Direction, Landing, Protocol};
use integration::*;
use redirect::{Backend, BackendChoice};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;

/// Every scenario of nft/listings: the 28 nftables goldens, then the CNI defaults.
fn scenarios() -> Vec<(String, Config)> {
    let mut out: Vec<(String, Config)> = golden::index()
        .iter()
        .filter_map(|case| {
            let golden = case["golden"].as_str()?;
            let name = golden.strip_prefix("nftables/")?.strip_suffix(".golden")?;
            (!name.contains('/')).then(|| {
                (
                    name.to_string(),
                    golden::config_from_effective(&case["effective_config"]),
                )
            })
        })
        .collect();
    assert_eq!(out.len(), 28, "every nftables golden scenario");
    for (name, ipv6) in [
        ("cni-default-ipv4", Ipv6Mode::Off),
        ("cni-default-dual-stack", Ipv6Mode::On),
    ] {
        out.push((
            name.into(),
            Config {
                ipv6,
                ..Config::cni_default()
            },
        ));
    }
    out
}

/// A pod/world pair with eth0 and eth1, a sidecar probe in the pod and servers in the world.
struct World {
    w: PodWorld,
    _probes: [Probe; 2],
}

fn world() -> World {
    let mut w = PodWorld::new().expect("pod/world");
    w.add_link("eth1").expect("eth1");
    let probes = [
        Probe::sidecar(w.pod.path()).expect("pod probe"),
        Probe::world(w.world.path()).expect("world probe"),
    ];
    World { w, _probes: probes }
}

/// One connection of the table.
struct Case {
    name: String,
    conn: Connection,
}

fn cases(w: &PodWorld) -> Vec<Case> {
    let mut out = Vec::new();
    let mut add = |name: String, conn: Connection| out.push(Case { name, conn });
    let fams: [(bool, IpAddr, IpAddr, IpAddr, IpAddr); 2] = [
        (
            false,
            w.pod_v4.into(),
            w.world_v4.into(),
            w.links[1].pod_v4.into(),
            Ipv4Addr::LOCALHOST.into(),
        ),
        (
            true,
            w.pod_v6.unwrap().into(),
            w.world_v6.unwrap().into(),
            w.links[1].pod_v6.unwrap().into(),
            Ipv6Addr::LOCALHOST.into(),
        ),
    ];
    for (v6, pod, world, pod1, lo) in fams {
        let f = if v6 { "v6" } else { "v4" };
        let out_tcp = |dst: IpAddr, port| {
            Connection::new(
                Direction::Outbound,
                Protocol::Tcp,
                SocketAddr::new(dst, port),
            )
        };
        for port in [80, 15020, 9999] {
            add(
                format!("[{f}] app -> world:{port}"),
                out_tcp(world, port).uid(1000).gid(1000),
            );
        }
        add(
            format!("[{f}] root -> world:443"),
            out_tcp(world, 443).uid(0).gid(0),
        );
        for (label, uid, gid) in [
            ("uid+gid 1337", 1337, 1337),
            ("uid 1337", 1337, 1000),
            ("gid 1337", 1000, 1337),
        ] {
            add(
                format!("[{f}] {label} -> world:80"),
                out_tcp(world, 80).uid(uid).gid(gid),
            );
        }
        add(
            format!("[{f}] app -> lo:15021"),
            out_tcp(lo, 15021).uid(1000).gid(1000),
        );
        add(
            format!("[{f}] app -> own pod:8080"),
            out_tcp(pod, 8080).uid(1000).gid(1000),
        );
        add(
            format!("[{f}] envoy -> own pod:8080"),
            out_tcp(pod, 8080).uid(1337).gid(1337),
        );
        if !v6 {
            add(
                format!("[{f}] 127.0.0.6 -> own pod:8080"),
                out_tcp(pod, 8080)
                    .src(Ipv4Addr::new(127, 0, 0, 6).into())
                    .uid(1337)
                    .gid(1337),
            );
        }
        let udp = |port| {
            Connection::new(
                Direction::Outbound,
                Protocol::Udp,
                SocketAddr::new(world, port),
            )
        };
        add(
            format!("[{f}] app udp -> world:53"),
            udp(53).uid(1000).gid(1000),
        );
        add(
            format!("[{f}] envoy udp -> world:53"),
            udp(53).uid(1337).gid(1337),
        );
        add(
            format!("[{f}] app tcp -> world:53"),
            out_tcp(world, 53).uid(1000).gid(1000),
        );
        for port in [8080, 15008, 15021] {
            add(
                format!("[{f}] world -> pod:{port}"),
                Connection::new(
                    Direction::Inbound,
                    Protocol::Tcp,
                    SocketAddr::new(pod, port),
                )
                .src(world),
            );
        }
        add(
            format!("[{f}] world -> pod eth1:8080"),
            Connection::new(
                Direction::Inbound,
                Protocol::Tcp,
                SocketAddr::new(pod1, 8080),
            )
            .src(if v6 {
                w.links[1].world_v6.unwrap().into()
            } else {
                w.links[1].world_v4.into()
            }),
        );
    }
    out.extend(tproxy_loopback_cases(w));
    out
}

/// Loopback connections of the proxy identity that TPROXY pods send back in over lo (mark
/// 1337, route table 133) and divert to 15006 on the second pass.
fn tproxy_loopback_cases(w: &PodWorld) -> Vec<Case> {
    let tcp = |ip: IpAddr, port, uid, gid| Case {
        name: format!("uid {uid} gid {gid} -> {}", SocketAddr::new(ip, port)),
        conn: Connection::new(
            Direction::Outbound,
            Protocol::Tcp,
            SocketAddr::new(ip, port),
        )
        .uid(uid)
        .gid(gid),
    };
    vec![
        tcp(Ipv4Addr::new(127, 0, 0, 2).into(), 8080, 1337, 1337),
        tcp(w.pod_v4.into(), 15008, 1337, 1337),
        tcp(Ipv4Addr::new(127, 0, 0, 6).into(), 15002, 1337, 1337),
        tcp(Ipv4Addr::new(127, 0, 0, 53).into(), 53, 1000, 1337),
    ]
}

/// What the probe should report for a predicted landing: a listener there, or refused/timeout.
fn expected(
    landing: &Landing,
    proto: Protocol,
    w: &PodWorld,
) -> Result<(String, u16), &'static str> {
    const POD_TCP: [u16; 7] = [15001, 15006, 15008, 15020, 15021, 15090, 8080];
    const WORLD_TCP: [u16; 6] = [80, 443, 8080, 15020, 9999, 53];
    let listens = |pod: bool, port: u16| match (pod, proto) {
        (true, Protocol::Tcp) => POD_TCP.contains(&port),
        (true, Protocol::Udp) => port == 15053,
        (false, Protocol::Tcp) => WORLD_TCP.contains(&port),
        (false, Protocol::Udp) => port == 53,
    };
    let none = if proto == Protocol::Tcp {
        "refused"
    } else {
        "timeout"
    };
    match landing {
        Landing::Pod(p) if listens(true, *p) => Ok(("pod".into(), *p)),
        Landing::Away(a)
            if [IpAddr::from(w.world_v4)].contains(&a.ip())
                || Some(a.ip()) == w.world_v6.map(IpAddr::from) =>
        {
            if listens(false, a.port()) {
                Ok(("world".into(), a.port()))
            } else {
                Err(none)
            }
        }
        Landing::Dropped => Err("timeout"),
        Landing::Unknown => Err("unknown"),
        _ => Err(none),
    }
}

fn agrees_with_probe(exp: &Result<(String, u16), &'static str>, out: &Outcome) -> bool {
    match (exp, out) {
        (Ok((probe, port)), Outcome::Landed(l)) => &l.probe == probe && l.port == *port,
        (Err("refused"), Outcome::Refused) => true,
        (Err("timeout"), Outcome::Timeout) => true,
        _ => false,
    }
}

/// How many times each outcome kind was predicted (and confirmed), across all scenarios.
type Tally = std::collections::BTreeMap<&'static str, usize>;

fn kind(o: &ex::Outcome) -> &'static str {
    match o {
        ex::Outcome::Redirected { .. } => "redirected",
        ex::Outcome::Tproxied { .. } => "tproxied",
        ex::Outcome::Dropped { .. } => "dropped",
        ex::Outcome::NotCaptured { .. } => "not-captured",
        ex::Outcome::Untouched { .. } => "untouched",
        ex::Outcome::Snatted { .. } => "snatted",
        ex::Outcome::CannotEvaluate { .. } => "cannot-evaluate",
    }
}

/// Programs `plan` with `backend`, then checks every case. Returns (cases, failures).
fn run_scenario(
    name: &str,
    cfg: &Config,
    backend: Backend,
    with_trace: bool,
    tally: &Mutex<Tally>,
) -> (usize, Vec<String>) {
    let t = world();
    let w = &t.w;
    let plan = Plan::build(cfg, &Facts::default()).expect("plan");
    redirect::apply(&plan, Some(w.pod.path()), BackendChoice::Fixed(backend))
        .unwrap_or_else(|e| panic!("{name}: apply with {backend}: {e}"));
    let cases = cases(w);
    let mut failures = Vec::new();
    let monitor =
        (backend == Backend::IptablesLegacy).then(|| legacy_trace::NftMonitor::start(w.pod.path()));
    let rs = match backend {
        Backend::Nft => ex::live_ruleset(Some(w.pod.path())).unwrap(),
        Backend::IptablesLegacy => ex::live_legacy_ruleset(Some(w.pod.path())).unwrap(),
    };
    if backend == Backend::Nft {
        failures.extend(text_differences(name, &rs, &plan));
    }
    for c in &cases {
        let facts = ex::namespace_facts(Some(w.pod.path()), &c.conn).unwrap();
        let e = match ex::explain_with(&rs, &c.conn, &facts) {
            Ok(e) => e,
            Err(err) => {
                failures.push(format!(
                    "{name} [{backend}] {}: explain failed: {err}",
                    c.name
                ));
                continue;
            }
        };
        *tally.lock().unwrap().entry(kind(&e.outcome)).or_default() += 1;
        let want = expected(&e.outcome.landing(), c.conn.protocol, w);
        let got = w.open(&c.conn, None);
        if !agrees_with_probe(&want, &got) {
            failures.push(format!(
                "{name} [{backend}] {}: static says {} (expect {want:?}), probe {got}\n{}",
                c.name,
                e.summary,
                ex::render_text(&e)
            ));
            continue;
        }
        if with_trace {
            let traced = || {
                let kp = match c.conn.direction {
                    Direction::Outbound => {
                        trace::trace(Some(w.pod.path()), &c.conn, TraceHow::Connect)
                    }
                    Direction::Inbound => netns::run_in(Some(w.world.path()), || {
                        trace::trace(Some(w.pod.path()), &c.conn, TraceHow::Connect)
                    })
                    .unwrap(),
                };
                kp.map(|kp| ex::compare::compare(&rs, &e, &kp))
            };
            // A hook missing from one trace is taken once more (and said): seen once in many
            // CI runs, never reproduced, and a second miss still fails.
            let mut compared = traced();
            if let Ok(ag) = &compared
                && !ag.not_traced.is_empty()
            {
                eprintln!(
                    "{name} {}: kernel's path not captured in {:?}; tracing again",
                    c.name, ag.not_traced
                );
                compared = traced();
            }
            match compared {
                Ok(ag) => {
                    // Also the second pass over lo (loopback, redirects, TPROXY's reroute).
                    if !ag.not_traced.is_empty() {
                        failures.push(format!(
                            "{name} {}: kernel's path not captured in {:?}",
                            c.name, ag.not_traced
                        ));
                    }
                    if !ag.agree {
                        failures.push(format!(
                            "{name} {}: trace disagrees: {:?}\nstatic:\n{}kernel:\n{}",
                            c.name,
                            ag.differences,
                            ex::render_text(&e),
                            ex::render::render_steps(&ag.kernel_steps)
                        ));
                    }
                }
                Err(err) => failures.push(format!("{name} {}: trace failed: {err}", c.name)),
            }
        }
    }
    if let Some(m) = monitor {
        let seen = m.stop();
        if !seen.trim().is_empty() {
            failures.push(format!(
                "{name} [{backend}]: nft changes in a legacy pod:\n{seen}"
            ));
        }
    }
    if backend == Backend::IptablesLegacy && with_trace {
        // Nothing left behind by the traces.
        failures.extend(
            legacy_trace::left_in_legacy_pod(w.pod.path())
                .into_iter()
                .map(|l| format!("{name} [{backend}]: {l}")),
        );
    }
    (cases.len(), failures)
}

/// Every live rule is shown exactly as the plan renderer (`--dry-run`) writes it: the text
/// read back from the kernel's expressions is the text of the rule that was programmed.
fn text_differences(name: &str, rs: &ex::ir::Ruleset, plan: &Plan) -> Vec<String> {
    // The one spelling difference: nft (and the kernel's bits) order ct states
    // established,related; the plan writes them in Istio's order.
    let planned =
        nft_backend::render_text(plan).replace("related,established", "established,related");
    let lines: Vec<&str> = planned.lines().map(str::trim).collect();
    rs.chains
        .iter()
        .flat_map(|c| c.rules.iter().map(move |r| (c, r)))
        .filter(|(_, r)| !lines.contains(&r.text.as_str()))
        .map(|(c, r)| {
            format!(
                "{name}: {} {} rule {}: {}",
                c.table, c.name, r.position, r.text
            )
        })
        .collect()
}

/// Runs `jobs` on a few threads (each scenario has its own namespaces).
fn parallel(
    jobs: Vec<(String, Config)>,
    backend: Backend,
    with_trace: bool,
) -> (usize, Vec<String>, Tally) {
    let queue = Mutex::new(jobs);
    let tally = Mutex::new(Tally::new());
    let results = Mutex::new((0usize, Vec::new()));
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let Some((name, cfg)) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    let (n, f) = run_scenario(&name, &cfg, backend, with_trace, &tally);
                    let mut r = results.lock().unwrap();
                    r.0 = r.0.max(n);
                    r.1.extend(f);
                }
            });
        }
    });
    let (n, f) = results.into_inner().unwrap();
    (n, f, tally.into_inner().unwrap())
}

#[test]
fn static_explanation_matches_probe_and_kernel_trace_for_every_scenario() {
    require_root();
    let all = scenarios();
    let count = all.len();
    let (n, failures, tally) = parallel(all, Backend::Nft, true);
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    // The table exercises every outcome the rules can produce.
    for k in ["redirected", "tproxied", "not-captured", "untouched"] {
        assert!(
            tally.get(k).is_some_and(|n| *n > 0),
            "no {k} case: {tally:?}"
        );
    }
    assert!(!tally.contains_key("cannot-evaluate"), "{tally:?}");
    eprintln!(
        "explain: {count} scenarios × {n} connections: static = probe in all, trace = static in all ({tally:?})"
    );
}

#[test]
fn legacy_static_explanation_matches_probe_and_kernel_trace() {
    require_root();
    // (The owner-group scenarios name groups, java/ftp, that iptables-restore must resolve on
    // this host; the nft backend writes the numbers.)
    let pick = [
        "cni-default-ipv4",
        "cni-default-dual-stack",
        "tproxy",
        "dns-uid-gid",
        "ipv6-uid-gid",
        "ipnets",
        "kube-virt-interfaces",
        "inbound-ports-include",
    ];
    let subset: Vec<(String, Config)> = scenarios()
        .into_iter()
        .filter(|(n, _)| pick.contains(&n.as_str()))
        .collect();
    assert_eq!(subset.len(), pick.len());
    let count = subset.len();
    let (n, failures, tally) = parallel(subset, Backend::IptablesLegacy, true);
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    for k in ["redirected", "tproxied", "not-captured", "untouched"] {
        assert!(
            tally.get(k).is_some_and(|n| *n > 0),
            "no {k} case: {tally:?}"
        );
    }
    eprintln!(
        "explain (iptables-legacy): {count} scenarios × {n} connections: static = probe in all, trace = static in all ({tally:?})"
    );
}

/// TPROXY with no Envoy listener: static says dropped (nft: the fail-closed drop rule after the
/// tproxy rule that did not match; legacy: the TPROXY target itself drops), the probe times
/// out, and the kernel trace agrees (legacy: the TPROXY rule is the packet's last line).
#[test]
fn tproxy_without_listener_is_dropped_by_static_probe_and_trace() {
    require_root();
    let cfg = Config {
        inbound_mode: capture::InterceptionMode::Tproxy,
        ipv6: Ipv6Mode::Off,
        ..Config::cni_default()
    };
    let plan = Plan::build(&cfg, &Facts::default()).unwrap();
    for backend in [Backend::Nft, Backend::IptablesLegacy] {
        let w = PodWorld::ipv4_only().unwrap();
        let _app = Probe::start(w.pod.path(), "pod", &[Listen::tcp(8080)]).unwrap();
        redirect::apply(&plan, Some(w.pod.path()), BackendChoice::Fixed(backend)).unwrap();
        let conn = Connection::new(
            Direction::Inbound,
            Protocol::Tcp,
            SocketAddr::new(w.pod_v4.into(), 8080),
        )
        .src(w.world_v4.into());
        let rs = match backend {
            Backend::Nft => ex::live_ruleset(Some(w.pod.path())).unwrap(),
            Backend::IptablesLegacy => ex::live_legacy_ruleset(Some(w.pod.path())).unwrap(),
        };
        let facts = ex::namespace_facts(Some(w.pod.path()), &conn).unwrap();
        let e = ex::explain_with(&rs, &conn, &facts).unwrap();
        assert_eq!(
            e.outcome.landing(),
            Landing::Dropped,
            "{backend}:\n{}",
            ex::render_text(&e)
        );
        assert!(
            e.summary
                .starts_with("dropped: TPROXY with no listener on port 15006"),
            "{}",
            e.summary
        );
        let spec = ConnectSpec::new(conn.dst.ip(), 8080).timeout(SHORT_TIMEOUT);
        assert_eq!(
            connect(w.world.path(), &spec),
            Outcome::Timeout,
            "{backend}"
        );
        let kp = netns::run_in(Some(w.world.path()), || {
            trace::trace(Some(w.pod.path()), &conn, TraceHow::Connect)
        })
        .unwrap()
        .unwrap();
        let ag = ex::compare::compare(&rs, &e, &kp);
        assert!(ag.agree, "{backend}: {:?}", ag.differences);
        assert_eq!(ag.kernel_outcome, "dropped", "{backend}");
    }
}

/// The comparison is not vacuous: a kernel path of another connection disagrees, and says
/// where.
#[test]
fn a_different_kernel_path_is_reported_as_disagreement() {
    require_root();
    for (backend, table) in [
        (Backend::Nft, "table istio-proxy-nat"),
        (Backend::IptablesLegacy, "table nat"),
    ] {
        let w = PodWorld::ipv4_only().unwrap();
        let _probes = [
            Probe::sidecar(w.pod.path()).unwrap(),
            Probe::world(w.world.path()).unwrap(),
        ];
        let cfg = Config {
            ipv6: Ipv6Mode::Off,
            ..Config::cni_default()
        };
        let plan = Plan::build(&cfg, &Facts::default()).unwrap();
        redirect::apply(&plan, Some(w.pod.path()), BackendChoice::Fixed(backend)).unwrap();
        let dst = SocketAddr::new(w.world_v4.into(), 80);
        let app = Connection::new(Direction::Outbound, Protocol::Tcp, dst)
            .uid(1000)
            .gid(1000);
        let envoy = Connection::new(Direction::Outbound, Protocol::Tcp, dst)
            .uid(1337)
            .gid(1337);
        let rs = match backend {
            Backend::Nft => ex::live_ruleset(Some(w.pod.path())).unwrap(),
            Backend::IptablesLegacy => ex::live_legacy_ruleset(Some(w.pod.path())).unwrap(),
        };
        let facts = ex::namespace_facts(Some(w.pod.path()), &app).unwrap();
        let e = ex::explain_with(&rs, &app, &facts).unwrap();
        assert!(
            matches!(e.outcome, ex::Outcome::Redirected { .. }),
            "{backend}: {}",
            e.summary
        );
        let other = trace::trace(Some(w.pod.path()), &envoy, TraceHow::Connect).unwrap();
        let ag = ex::compare::compare(&rs, &e, &other);
        assert!(!ag.agree, "{backend}");
        // Which rule decided, named by handle (nft) or position (legacy), and the outcome.
        assert!(
            ag.differences
                .iter()
                .any(|d| d.contains(table) && d.contains("decided by rule")),
            "{backend}: {:?}",
            ag.differences
        );
        assert!(
            ag.differences.iter().any(|d| d.starts_with("outcome:")),
            "{backend}: {:?}",
            ag.differences
        );
    }
}

/// The proxy identity's loopback connections in a TPROXY pod (issue 21, item 4): the packet
/// leaves through `output`, where the mangle rules mark it so the pod's policy route sends it
/// back over lo, and only its second pass (prerouting on lo) meets TPROXY. The static
/// explanation, the real connection and the kernel's trace, followed through that second
/// pass, must all say: TPROXY to 15006.
#[test]
fn tproxy_loopback_of_the_proxy_identity_is_traced_through_its_second_pass() {
    require_root();
    for backend in [Backend::Nft, Backend::IptablesLegacy] {
        tproxy_loopback_with(backend);
    }
}

fn tproxy_loopback_with(backend: Backend) {
    let (_, cfg) = scenarios()
        .into_iter()
        .find(|(n, _)| n == "inbound-ports-wildcard-tproxy")
        .expect("the golden");
    let t = world();
    let w = &t.w;
    let plan = Plan::build(&cfg, &Facts::default()).unwrap();
    redirect::apply(&plan, Some(w.pod.path()), BackendChoice::Fixed(backend)).unwrap();
    let rs = match backend {
        Backend::Nft => ex::live_ruleset(Some(w.pod.path())).unwrap(),
        Backend::IptablesLegacy => ex::live_legacy_ruleset(Some(w.pod.path())).unwrap(),
    };
    let mut tproxied = 0;
    for c in tproxy_loopback_cases(w) {
        let facts = ex::namespace_facts(Some(w.pod.path()), &c.conn).unwrap();
        let e = ex::explain_with(&rs, &c.conn, &facts).unwrap();
        assert_eq!(
            e.outcome.landing(),
            Landing::Pod(15006),
            "{backend} {}: {}\n{}",
            c.name,
            e.summary,
            ex::render_text(&e)
        );
        let got = w.open(&c.conn, None);
        assert!(
            agrees_with_probe(&Ok(("pod".into(), 15006)), &got),
            "{backend} {}: probe {got}",
            c.name
        );
        let kp = trace::trace(Some(w.pod.path()), &c.conn, TraceHow::Connect).unwrap();
        let ag = ex::compare::compare(&rs, &e, &kp);
        assert!(
            ag.agree && ag.not_traced.is_empty(),
            "{backend} {}: {:?} (not traced: {:?}), kernel {}\nstatic:\n{}kernel:\n{}",
            c.name,
            ag.differences,
            ag.not_traced,
            ag.kernel_outcome,
            ex::render_text(&e),
            ex::render::render_steps(&ag.kernel_steps)
        );
        if matches!(e.outcome, ex::Outcome::Tproxied { .. }) {
            tproxied += 1;
            assert_eq!(ag.kernel_outcome, "diverted by TPROXY to port 15006");
        }
    }
    // Envoy -> its own pod IP:15008 and gid 1337 -> 127.0.0.53:53 meet TPROXY on the second
    // pass; the other two are redirected to 15006 by the nat rule for Envoy over lo.
    assert_eq!(tproxied, 2, "{backend}");
}
