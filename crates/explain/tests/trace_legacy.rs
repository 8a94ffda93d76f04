//! The kernel trace on iptables-legacy pods (ip_tables' TRACE target, lines over
//! nfnetlink_log) against real rules: each test programs a plan with the legacy backend into a
//! pod/world pair, traces connections, and checks the kernel's path rule by rule against the
//! live `iptables-legacy-save` rules and where a real probe landed, for IPv4 and IPv6,
//! REDIRECT and TPROXY. Throughout, `nft monitor` in the pod must see nothing (no nft object is
//! ever added to a legacy pod), and afterwards nothing of the trace may be left: no TRACE rule,
//! nfnetlink_log unbound; also not after SIGINT/SIGTERM, and the rules of a SIGKILLed run are
//! deleted by the next run.

mod common;

use capture::*;
use common::{apply_legacy, wait_for_trace_rules};
use explain::trace::*;
use explain::{self as ex, ir::TableFamily};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use testbed::legacy_trace::{NftMonitor, left_in_legacy_pod, loggers};
use testbed::*;

const APP_UID: u32 = 1000;
/// Set in the child process the signal tests start (the pod namespace's path).
const CHILD_ENV: &str = "TRACE_LEGACY_TEST_CHILD_NETNS";

/// A legacy pod, watched by `nft monitor` from the start.
struct Pod {
    w: PodWorld,
    monitor: Option<NftMonitor>,
    _probes: [Probe; 2],
}

impl Pod {
    fn new(mode: InterceptionMode, ipv6: Ipv6Mode) -> Pod {
        Pod::with(Config {
            ipv6,
            inbound_mode: mode,
            ..Config::cni_default()
        })
    }

    fn with(cfg: Config) -> Pod {
        let w = match cfg.ipv6 {
            Ipv6Mode::Off => PodWorld::ipv4_only().unwrap(),
            _ => PodWorld::new().unwrap(),
        };
        let monitor = Some(NftMonitor::start(w.pod.path()));
        apply_legacy(w.pod.path(), &Plan::build(&cfg, &Facts::default()).unwrap());
        let probes = [
            Probe::sidecar(w.pod.path()).unwrap(),
            Probe::world(w.world.path()).unwrap(),
        ];
        Pod {
            w,
            monitor,
            _probes: probes,
        }
    }

    fn path(&self) -> &Path {
        self.w.pod.path()
    }

    /// Traces `conn` (inbound from the world) and checks nothing is left afterwards.
    fn traced(&self, conn: &Connection) -> KernelPath {
        let p = match conn.direction {
            Direction::Outbound => trace(Some(self.path()), conn, TraceHow::Connect),
            Direction::Inbound => self
                .w
                .world
                .run(|| trace(Some(self.path()), conn, TraceHow::Connect))
                .unwrap(),
        }
        .unwrap_or_else(|e| panic!("trace {conn:?}: {e}"));
        assert_eq!(left_in_legacy_pod(self.path()), Vec::<String>::new());
        p
    }

    /// The kernel's path as `(family table chain, rule text | policy | end of chain, verdict)`.
    fn described(&self, p: &KernelPath) -> Vec<(String, String, String)> {
        let rs = ex::live_legacy_ruleset(Some(self.path())).unwrap();
        p.events
            .iter()
            .map(|e| {
                let what = match e.kind {
                    EventKind::Rule => {
                        let fam = if e.family == "ip6" {
                            TableFamily::Ip6
                        } else {
                            TableFamily::Ip
                        };
                        let pos = e
                            .rule_position
                            .expect("legacy rule events carry a position");
                        let chain = rs.chain(fam, &e.table, &e.chain).expect("a live chain");
                        chain.rules[pos - 1].text.clone()
                    }
                    EventKind::Policy => "policy".into(),
                    EventKind::Return => "end of chain".into(),
                };
                let v = e
                    .verdict
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                (format!("{} {} {}", e.family, e.table, e.chain), what, v)
            })
            .collect()
    }

    /// The deciding rule's text and verdict: the last rule that accepted, dropped or returned.
    fn decided(&self, p: &KernelPath) -> (String, String) {
        let d = self.described(p);
        let (_, what, v) = d
            .iter()
            .rev()
            .filter(|(_, what, _)| what.starts_with("-A "))
            .find(|(_, _, v)| ["accept", "drop", "return"].contains(&v.as_str()))
            .unwrap_or_else(|| panic!("nothing decided: {d:#?}"));
        (what.clone(), v.clone())
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let seen = self.monitor.take().unwrap().stop();
        if !std::thread::panicking() {
            assert_eq!(seen, "", "nft changes in a legacy pod");
        }
    }
}

fn outbound(dst: IpAddr, port: u16, uid: u32) -> Connection {
    Connection::new(
        Direction::Outbound,
        Protocol::Tcp,
        SocketAddr::new(dst, port),
    )
    .uid(uid)
    .gid(uid)
}

fn inbound(dst: IpAddr, port: u16) -> Connection {
    Connection::new(
        Direction::Inbound,
        Protocol::Tcp,
        SocketAddr::new(dst, port),
    )
}

#[test]
fn redirect_pod_is_traced_rule_by_rule_in_both_families() {
    require_root();
    let pod = Pod::new(InterceptionMode::Redirect, Ipv6Mode::On);
    let w = &pod.w;
    for (fam, world, me) in [
        ("ip", IpAddr::from(w.world_v4), IpAddr::from(w.pod_v4)),
        ("ip6", w.world_v6.unwrap().into(), w.pod_v6.unwrap().into()),
    ] {
        // The app: redirected to Envoy, and the probe behind 15001 got it.
        let p = pod.traced(&outbound(world, 80, APP_UID));
        let d = pod.described(&p);
        assert_eq!(d[0].0, format!("{fam} nat OUTPUT"), "{d:#?}");
        assert_eq!(d[0].2, "jump ISTIO_OUTPUT", "{d:#?}");
        let (rule, v) = pod.decided(&p);
        assert!(rule.contains("-j REDIRECT --to-ports 15001"), "{d:#?}");
        assert_eq!(v, "accept");
        assert!(matches!(p.attempt, Attempt::Connected { .. }), "{p:?}");
        // Then postrouting (the second pass over lo meets no table of ours: raw holds only
        // the trace rules, nat is not consulted again).
        assert!(
            d.iter()
                .any(|(c, _, _)| c == &format!("{fam} nat POSTROUTING")),
            "{d:#?}"
        );
        // Envoy's own traffic: the uid 1337 RETURN decides.
        let p = pod.traced(&outbound(world, 80, 1337));
        let (rule, v) = pod.decided(&p);
        assert!(
            rule.contains("--uid-owner 1337") && rule.ends_with("-j RETURN"),
            "{rule}"
        );
        assert_eq!(v, "return");
        // Inbound from the world: to Envoy's inbound port.
        let p = pod.traced(&inbound(me, 8080));
        let (rule, _) = pod.decided(&p);
        assert!(rule.contains("-j REDIRECT --to-ports 15006"), "{rule}");
        println!("legacy trace [{fam}]: {:#?}", pod.described(&p));
    }
    assert_eq!(loggers(pod.path()), ["nf_log_ipv4", "nf_log_ipv6"]);
}

#[test]
fn tproxy_inbound_is_traced_to_the_tproxy_rule() {
    require_root();
    let pod = Pod::new(InterceptionMode::Tproxy, Ipv6Mode::Off);
    let conn = inbound(pod.w.pod_v4.into(), 8080);
    let p = pod.traced(&conn);
    let (rule, v) = pod.decided(&p);
    assert!(rule.contains("-j TPROXY --on-port 15006"), "{rule}");
    assert_eq!(v, "accept");
    assert!(matches!(p.attempt, Attempt::Connected { .. }), "{p:?}");
}

#[test]
fn tproxy_without_a_listener_drops_at_the_tproxy_rule() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let monitor = NftMonitor::start(w.pod.path());
    let cfg = Config {
        ipv6: Ipv6Mode::Off,
        inbound_mode: InterceptionMode::Tproxy,
        ..Config::cni_default()
    };
    apply_legacy(w.pod.path(), &Plan::build(&cfg, &Facts::default()).unwrap());
    let _app = Probe::start(w.pod.path(), "pod", &[Listen::tcp(8080)]).unwrap();
    let conn = inbound(w.pod_v4.into(), 8080);
    let p = w
        .world
        .run(|| trace(Some(w.pod.path()), &conn, TraceHow::Connect))
        .unwrap()
        .unwrap();
    let last = p.events.last().expect("events");
    assert_eq!(last.kind, EventKind::Rule, "{p:#?}");
    assert_eq!(last.verdict, Some(Verdict::Drop), "{p:#?}");
    assert_eq!(p.attempt, Attempt::TimedOut);
    assert_eq!(left_in_legacy_pod(w.pod.path()), Vec::<String>::new());
    assert_eq!(monitor.stop(), "");
}

#[test]
fn wait_traces_someone_elses_connection_and_one_trace_per_pod_at_a_time() {
    require_root();
    let pod = Pod::new(InterceptionMode::Redirect, Ipv6Mode::Off);
    let world = IpAddr::from(pod.w.world_v4);
    let conn = outbound(world, 443, APP_UID);
    let p = std::thread::scope(|s| {
        let t = s.spawn(|| {
            trace(
                Some(pod.path()),
                &conn,
                TraceHow::Wait(Duration::from_secs(20)),
            )
        });
        assert!(
            wait_for_trace_rules(pod.path(), None),
            "the TRACE rules never appeared"
        );
        // A second trace of the same pod meanwhile: refused by name, nothing left of it.
        let e = trace(
            Some(pod.path()),
            &outbound(world, 80, APP_UID),
            TraceHow::Connect,
        )
        .unwrap_err();
        assert!(e.to_string().contains("another trace"), "{e}");
        let other = connect(
            pod.path(),
            &ConnectSpec::new(world, 443).uid(1337).gid(1337),
        );
        assert_eq!(other.landed_port(), Some(443), "{other}");
        let real = connect(
            pod.path(),
            &ConnectSpec::new(world, 443).uid(APP_UID).gid(APP_UID),
        );
        assert_eq!(real.landed_port(), Some(15001), "{real}");
        t.join().unwrap().unwrap()
    });
    assert_eq!(p.attempt, Attempt::Observed);
    let (rule, _) = pod.decided(&p);
    assert!(rule.contains("-j REDIRECT --to-ports 15001"), "{rule}");
    assert_eq!(left_in_legacy_pod(pod.path()), Vec::<String>::new());
}

/// `--wait` does not know the source port: the DNS query NAT redirects to 127.0.0.1:15053
/// is followed through its second pass over lo all the same (the same path as a traced
/// connect of the same query).
#[test]
fn wait_follows_a_nat_redirected_datagram_through_its_second_pass() {
    require_root();
    let pod = Pod::with(Config {
        ipv6: Ipv6Mode::Off,
        redirect_dns: true,
        capture_all_dns: true,
        ..Config::cni_default()
    });
    let agent = Probe::start(pod.path(), "agent", &[Listen::udp(15053)]).unwrap();
    let world = IpAddr::from(pod.w.world_v4);
    let conn = Connection::new(
        Direction::Outbound,
        Protocol::Udp,
        SocketAddr::new(world, 53),
    )
    .uid(APP_UID)
    .gid(APP_UID);
    let connected = pod.described(&pod.traced(&conn));
    assert!(
        connected.iter().any(|(c, _, _)| c == "ip raw PREROUTING"),
        "the second pass crosses raw PREROUTING: {connected:#?}"
    );
    let p = std::thread::scope(|s| {
        let t = s.spawn(|| {
            trace(
                Some(pod.path()),
                &conn,
                TraceHow::Wait(Duration::from_secs(20)),
            )
        });
        assert!(
            wait_for_trace_rules(pod.path(), None),
            "the TRACE rules never appeared"
        );
        send_udp(
            pod.path(),
            &ConnectSpec::new(world, 53).uid(APP_UID).gid(APP_UID),
        );
        t.join().unwrap().unwrap()
    });
    assert_eq!(p.attempt, Attempt::Observed);
    assert_eq!(pod.described(&p), connected);
    assert_eq!(left_in_legacy_pod(pod.path()), Vec::<String>::new());
    assert_eq!(
        agent.accepted().iter().filter(|a| a.port == 15053).count(),
        2
    );
}

/// A child process (this test binary, running only [`child_waits_for_a_connection`]).
fn spawn_waiting_child(pod: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_waits_for_a_connection", "--nocapture"])
        .env(CHILD_ENV, pod)
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
    let conn = outbound("192.0.2.1".parse().unwrap(), 81, APP_UID);
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
fn sigint_or_sigterm_during_wait_deletes_the_rules() {
    require_root();
    let pod = Pod::new(InterceptionMode::Redirect, Ipv6Mode::Off);
    for signal in [nix::sys::signal::SIGINT, nix::sys::signal::SIGTERM] {
        let child = spawn_waiting_child(pod.path());
        assert!(
            wait_for_trace_rules(pod.path(), Some(child.id())),
            "no rules of the child"
        );
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(128 + signal as i32),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(left_in_legacy_pod(pod.path()), Vec::<String>::new());
    }
}

#[test]
fn rules_left_by_a_killed_run_are_deleted_by_the_next_run() {
    require_root();
    let pod = Pod::new(InterceptionMode::Redirect, Ipv6Mode::Off);
    let mut child = spawn_waiting_child(pod.path());
    let pid = child.id();
    assert!(
        wait_for_trace_rules(pod.path(), Some(pid)),
        "no rules of the child"
    );
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    // The OUTPUT rule and its companion at PREROUTING (the second pass over lo).
    let left = testbed::legacy_trace::trace_rules(pod.path());
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left.iter()
            .all(|r| r.contains(&format!("{TRACE_CHAIN_PREFIX}{pid}-"))),
        "{left:?}"
    );
    // The next run deletes them before tracing, and traces.
    let p = pod.traced(&outbound(pod.w.world_v4.into(), 80, APP_UID));
    assert!(p.touched_our_tables());
    println!("legacy trace: stale rules {left:?} of killed pid {pid} deleted by the next run");
}
