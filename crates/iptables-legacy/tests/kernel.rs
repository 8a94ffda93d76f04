//! The legacy backend on a real kernel: rules applied into a pod namespace, then real
//! connections tell where traffic lands.

use capture::{Config, Facts, InterceptionMode, Ipv6Mode, Plan};
use iptables_legacy::{LegacyError, Tools};
use netns::NsLock;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};
use testbed::*;

fn plan(cfg: &Config) -> Plan {
    Plan::build(cfg, &Facts::default()).expect("valid config")
}

fn cni_default(ipv6: Ipv6Mode) -> Plan {
    plan(&Config {
        ipv6,
        ..Config::cni_default()
    })
}

/// The calling thread's namespace lock, as `redirect` holds it around every backend call.
fn held() -> NsLock {
    NsLock::current(&"test namespace", Instant::now() + Duration::from_secs(10)).expect("lock")
}

fn apply(ns: &TestNetns, plan: &Plan) -> Result<(), LegacyError> {
    ns.run(|| iptables_legacy::apply(plan, &held(), &Tools::default()))
        .expect("enter namespace")
}

/// `iptables-legacy-save` + `ip6tables-legacy-save` without comments and counters.
fn saved(ns: &TestNetns) -> String {
    let mut out = String::new();
    for bin in ["iptables-legacy-save", "ip6tables-legacy-save"] {
        let text = ns.exec_ok(bin, &[]).unwrap();
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            out.push_str(l.split(" [").next().unwrap_or(l));
            out.push('\n');
        }
    }
    out
}

fn rule_lines(ns: &TestNetns) -> Vec<String> {
    saved(ns)
        .lines()
        .filter(|l| l.starts_with("-A"))
        .map(str::to_string)
        .collect()
}

fn sock(ip: impl Into<IpAddr>, port: u16) -> Option<SocketAddr> {
    Some(SocketAddr::new(ip.into(), port))
}

/// Landed on `probe`'s `port` with exactly `orig` as its original destination (`None`: none).
#[track_caller]
fn lands(out: Outcome, probe: &str, port: u16, orig: Option<SocketAddr>) {
    let l = out.assert_lands(probe, port, orig);
    assert_eq!(l.orig_dst, orig, "{out}");
}

/// The default sidecar matrix for one family's addresses.
fn default_matrix(w: &PodWorld, pod: IpAddr, world: IpAddr) {
    let p = w.pod.path();
    // App → world: captured by Envoy outbound, original destination preserved.
    lands(
        connect(p, &ConnectSpec::new(world, 80)),
        "pod",
        15001,
        sock(world, 80),
    );
    // World → app port: captured by Envoy inbound.
    lands(
        connect(w.world.path(), &ConnectSpec::new(pod, 8080)),
        "pod",
        15006,
        sock(pod, 8080),
    );
    // Tunnel, agent, health, metrics ports: never redirected.
    for port in [15008, 15020, 15021, 15090] {
        lands(
            connect(w.world.path(), &ConnectSpec::new(pod, port)),
            "pod",
            port,
            sock(pod, port),
        );
    }
    // Envoy's own traffic (uid 1337 or gid 1337) leaves untouched.
    lands(
        connect(p, &ConnectSpec::new(world, 80).uid(1337)),
        "world",
        80,
        sock(world, 80),
    );
    lands(
        connect(p, &ConnectSpec::new(world, 80).uid(1000).gid(1337)),
        "world",
        80,
        sock(world, 80),
    );
    // Outbound port exclusion (-o 15020).
    lands(
        connect(p, &ConnectSpec::new(world, 15020)),
        "world",
        15020,
        sock(world, 15020),
    );
}

#[test]
fn default_cni_config_ipv4() {
    require_root();
    let w = PodWorld::new().unwrap();
    let _pod = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    apply(&w.pod, &cni_default(Ipv6Mode::Off)).unwrap();
    default_matrix(&w, w.pod_v4.into(), w.world_v4.into());

    // The istio-validation probe: uid 1337 dials 127.0.0.6:15002 from 127.0.0.1 and must
    // reach 15006 with original port 15002.
    let six = Ipv4Addr::new(127, 0, 0, 6);
    lands(
        connect(
            w.pod.path(),
            &ConnectSpec::new(six.into(), 15002)
                .uid(1337)
                .gid(1337)
                .src(Ipv4Addr::LOCALHOST.into()),
        ),
        "pod",
        15006,
        sock(six, 15002),
    );
    // IPv6 is off: IPv6 traffic is left alone.
    let wv6 = w.world_v6.unwrap();
    lands(
        connect(w.pod.path(), &ConnectSpec::new(wv6.into(), 80)),
        "world",
        80,
        sock(wv6, 80),
    );
    let out = w.pod.exec_ok("ip6tables-legacy-save", &[]).unwrap();
    assert!(!out.contains("ISTIO"), "{out}");
}

#[test]
fn default_cni_config_dual_stack() {
    require_root();
    let w = PodWorld::new().unwrap();
    let _pod = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    apply(&w.pod, &cni_default(Ipv6Mode::On)).unwrap();
    default_matrix(&w, w.pod_v4.into(), w.world_v4.into());
    default_matrix(&w, w.pod_v6.unwrap().into(), w.world_v6.unwrap().into());
    // Loopback over IPv6 from the app is not captured (lo RETURN for non-Envoy users).
    lands(
        connect(
            w.pod.path(),
            &ConnectSpec::new(Ipv6Addr::LOCALHOST.into(), 15021),
        ),
        "pod",
        15021,
        sock(Ipv6Addr::LOCALHOST, 15021),
    );
}

#[test]
fn tproxy_inbound_lands_on_the_transparent_listener() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let _pod = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let p = plan(&Config {
        inbound_mode: InterceptionMode::Tproxy,
        ipv6: Ipv6Mode::Off,
        ..Config::cni_default()
    });
    apply(&w.pod, &p).unwrap();
    // TPROXY's policy routing comes with the rules (shared with the nft backend).
    let rules = w.pod.exec_ok("ip", &["rule"]).unwrap();
    assert!(rules.contains("fwmark 0x539 lookup 133"), "{rules}");
    let pod: IpAddr = w.pod_v4.into();
    lands(
        connect(w.world.path(), &ConnectSpec::new(pod, 8080)),
        "pod",
        15006,
        sock(pod, 8080),
    );
    lands(
        connect(w.world.path(), &ConnectSpec::new(pod, 15021)),
        "pod",
        15021,
        sock(pod, 15021),
    );
}

#[test]
fn reapplying_gives_identical_rules_and_check_is_clean() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let p = cni_default(Ipv6Mode::On);
    apply(&ns, &p).unwrap();
    let first = saved(&ns);
    assert!(first.contains("-A ISTIO_OUTPUT"), "{first}");
    assert_eq!(
        ns.run(|| iptables_legacy::check(&p, &Tools::default()))
            .unwrap()
            .unwrap(),
        Vec::<String>::new()
    );
    apply(&ns, &p).unwrap();
    assert_eq!(saved(&ns), first);
    apply(&ns, &p).unwrap();
    assert_eq!(saved(&ns), first);
    assert_eq!(
        ns.run(|| iptables_legacy::check(&p, &Tools::default()))
            .unwrap()
            .unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn reapplying_with_built_in_chain_rules_does_not_duplicate_them() {
    require_root();
    let ns = TestNetns::new().unwrap();
    // -c and TPROXY put rules straight into built-in chains; DNS adds raw-table rules.
    let p = plan(&Config {
        exclude_interfaces: vec!["eth7".into()],
        inbound_mode: InterceptionMode::Tproxy,
        redirect_dns: true,
        capture_all_dns: true,
        drop_invalid: true,
        ipv6: Ipv6Mode::On,
        ..Config::cni_default()
    });
    apply(&ns, &p).unwrap();
    let first = saved(&ns);
    apply(&ns, &p).unwrap();
    assert_eq!(saved(&ns), first);
    assert_eq!(
        ns.run(|| iptables_legacy::check(&p, &Tools::default()))
            .unwrap()
            .unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn reapplying_a_different_plan_replaces_ours() {
    require_root();
    let ns = TestNetns::new().unwrap();
    apply(&ns, &cni_default(Ipv6Mode::On)).unwrap();
    let v4_only = cni_default(Ipv6Mode::Off);
    apply(&ns, &v4_only).unwrap();
    assert_eq!(
        ns.run(|| iptables_legacy::check(&v4_only, &Tools::default()))
            .unwrap()
            .unwrap(),
        Vec::<String>::new()
    );
    let v6 = ns.exec_ok("ip6tables-legacy-save", &[]).unwrap();
    assert!(!v6.contains("ISTIO"), "{v6}");
}

#[test]
fn check_reports_drift_readably() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let p = cni_default(Ipv6Mode::Off);
    let before = ns
        .run(|| iptables_legacy::check(&p, &Tools::default()))
        .unwrap()
        .unwrap();
    assert!(
        before
            .iter()
            .any(|l| l.contains("IPv4 nat ISTIO_OUTPUT: missing chain")),
        "{before:?}"
    );
    apply(&ns, &p).unwrap();
    ns.exec_ok(
        "iptables-legacy",
        &[
            "-w",
            "-t",
            "nat",
            "-D",
            "ISTIO_INBOUND",
            "-p",
            "tcp",
            "--dport",
            "15021",
            "-j",
            "RETURN",
        ],
    )
    .unwrap();
    ns.exec_ok(
        "iptables-legacy",
        &["-w", "-t", "nat", "-A", "ISTIO_REDIRECT", "-j", "RETURN"],
    )
    .unwrap();
    // A foreign rule in a built-in chain is not drift (one of the shapes Istio writes there
    // itself, `-o eth5 -j RETURN`, would be: no_built_in_chain_rule_outlives_the_plan_that_wrote_it).
    ns.exec_ok(
        "iptables-legacy",
        &[
            "-w", "-t", "nat", "-I", "OUTPUT", "-p", "udp", "--dport", "5353", "-j", "RETURN",
        ],
    )
    .unwrap();
    let drift = ns
        .run(|| iptables_legacy::check(&p, &Tools::default()))
        .unwrap()
        .unwrap();
    assert_eq!(
        drift,
        [
            "IPv4 nat ISTIO_INBOUND: missing rule: -A ISTIO_INBOUND -p tcp -m tcp --dport 15021 -j RETURN",
            "IPv4 nat ISTIO_REDIRECT: unexpected rule: -A ISTIO_REDIRECT -j RETURN",
        ]
    );
}

#[test]
fn cleanup_removes_only_ours() {
    require_root();
    let ns = TestNetns::new().unwrap();
    ns.sh(
        "iptables-legacy -w -t nat -N FOREIGN && iptables-legacy -w -t nat -A OUTPUT -j FOREIGN && \
         iptables-legacy -w -t nat -A FOREIGN -p udp -j RETURN && \
         ip6tables-legacy -w -t nat -N FOREIGN6 && ip6tables-legacy -w -t nat -A PREROUTING -j FOREIGN6",
    )
    .unwrap();
    let foreign = rule_lines(&ns);
    assert!(
        !ns.run(|| iptables_legacy::has_our_chains(&Tools::default()))
            .unwrap()
            .unwrap()
    );
    apply(&ns, &cni_default(Ipv6Mode::On)).unwrap();
    assert!(
        ns.run(|| iptables_legacy::has_our_chains(&Tools::default()))
            .unwrap()
            .unwrap()
    );
    assert!(
        ns.run(|| iptables_legacy::cleanup(&held(), &Tools::default()))
            .unwrap()
            .unwrap()
    );
    let after = saved(&ns);
    assert!(!after.contains("ISTIO"), "{after}");
    assert_eq!(rule_lines(&ns), foreign);
    assert!(
        after.contains(":FOREIGN -") && after.contains(":FOREIGN6 -"),
        "{after}"
    );
    assert!(
        !ns.run(|| iptables_legacy::has_our_chains(&Tools::default()))
            .unwrap()
            .unwrap()
    );
    // Nothing left: a second cleanup is a no-op.
    assert!(
        !ns.run(|| iptables_legacy::cleanup(&held(), &Tools::default()))
            .unwrap()
            .unwrap()
    );
}

#[test]
fn detects_legacy_rules() {
    require_root();
    let ns = TestNetns::new().unwrap();
    assert!(
        !ns.run(|| iptables_legacy::has_legacy_rules(&Tools::default()))
            .unwrap()
            .unwrap()
    );
    // A table without rules (e.g. after `iptables-legacy -w -t nat -L`) is not "rules".
    ns.exec_ok("iptables-legacy", &["-w", "-t", "nat", "-L", "-n"])
        .unwrap();
    assert!(
        !ns.run(|| iptables_legacy::has_legacy_rules(&Tools::default()))
            .unwrap()
            .unwrap()
    );
    ns.exec_ok("ip6tables-legacy", &["-w", "-A", "INPUT", "-j", "ACCEPT"])
        .unwrap();
    assert!(
        ns.run(|| iptables_legacy::has_legacy_rules(&Tools::default()))
            .unwrap()
            .unwrap()
    );
    assert!(
        !ns.run(|| iptables_legacy::has_our_chains(&Tools::default()))
            .unwrap()
            .unwrap()
    );
}

#[test]
fn missing_binary_is_a_clear_error_and_touches_nothing() {
    require_root();
    let ns = TestNetns::new().unwrap();
    let empty = std::env::temp_dir().join(format!("no-iptables-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let tools = Tools::in_dirs([&empty]);
    let err = ns
        .run(|| iptables_legacy::apply(&cni_default(Ipv6Mode::On), &held(), &tools))
        .unwrap()
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, LegacyError::BinaryNotFound { .. }), "{msg}");
    assert!(
        msg.contains("iptables-legacy-restore") && msg.contains(&*empty.to_string_lossy()),
        "{msg}"
    );
    // Not even a table was instantiated.
    let names = ns
        .exec_ok(
            "cat",
            &["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"],
        )
        .unwrap();
    assert_eq!(names.trim(), "");

    // Only ip6tables missing, IPv6 requested: fails before IPv4 is touched either.
    let only_v4 = std::env::temp_dir().join(format!("only-v4-iptables-{}", std::process::id()));
    std::fs::create_dir_all(&only_v4).unwrap();
    for b in ["iptables-legacy-restore", "iptables-legacy-save"] {
        let _ = std::os::unix::fs::symlink(format!("/usr/sbin/{b}"), only_v4.join(b));
    }
    let tools = Tools::in_dirs([&only_v4]);
    let err = ns
        .run(|| iptables_legacy::apply(&cni_default(Ipv6Mode::On), &held(), &tools))
        .unwrap()
        .unwrap_err();
    assert!(
        err.to_string().contains("ip6tables-legacy-restore"),
        "{err}"
    );
    assert!(rule_lines(&ns).is_empty(), "{:?}", rule_lines(&ns));
    // With IPv6 off the v4-only toolset is enough.
    ns.run(|| iptables_legacy::apply(&cni_default(Ipv6Mode::Off), &held(), &tools))
        .unwrap()
        .unwrap();
    let _ = std::fs::remove_dir_all(&empty);
    let _ = std::fs::remove_dir_all(&only_v4);
}

#[test]
fn bad_plan_is_refused_and_leaves_the_namespace_as_it_was() {
    require_root();
    let ns = TestNetns::new().unwrap();
    // drop_invalid puts rules in mangle, which iptables-restore commits before reaching the
    // bad nat rule: only the --test pass keeps mangle untouched.
    let bad = plan(&Config {
        exclude_interfaces: vec!["averyveryverylonginterfacename".into()],
        drop_invalid: true,
        ipv6: Ipv6Mode::On,
        ..Config::cni_default()
    });
    let err = apply(&ns, &bad).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("averyveryverylonginterfacename"), "{msg}");
    assert!(rule_lines(&ns).is_empty(), "{:?}", rule_lines(&ns));

    // On top of good rules: they stay exactly as they were.
    apply(&ns, &cni_default(Ipv6Mode::On)).unwrap();
    let good = saved(&ns);
    assert!(apply(&ns, &bad).is_err());
    assert_eq!(saved(&ns), good);
}

#[test]
fn lock_file_is_scoped_to_the_namespace() {
    require_root();
    let ns = TestNetns::new().unwrap();
    // Hold the node-wide lock: a pod-scoped apply must not wait for it.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/xtables.lock")
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a valid fd.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let t = std::time::Instant::now();
    let r = apply(&ns, &cni_default(Ipv6Mode::Off));
    // SAFETY: as above.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_UN) };
    r.unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
}

/// The rules Istio writes straight into built-in chains (`-c` interface RETURNs, TPROXY's
/// mark rules) outlive no plan (outside audit, 2026-11-27). Before: a re-apply with a plan
/// without `-c eth0`, a cleanup and a CHECK all left `-i eth0 -j RETURN`/`-o eth0 -j RETURN`
/// in place, so the pod's traffic through eth0 bypassed the proxy while CHECK said clean.
#[test]
fn no_built_in_chain_rule_outlives_the_plan_that_wrote_it() {
    require_root();
    let w = PodWorld::new().unwrap();
    let _pod = Probe::sidecar(w.pod.path()).unwrap();
    let _world = Probe::world(w.world.path()).unwrap();
    let earlier = plan(&Config {
        exclude_interfaces: vec!["eth0".into()],
        inbound_mode: InterceptionMode::Tproxy,
        ipv6: Ipv6Mode::Off,
        ..Config::cni_default()
    });
    let now = cni_default(Ipv6Mode::Off);
    let foreign = "-A OUTPUT -p tcp -m tcp --dport 9999 -j RETURN";
    w.pod
        .sh("iptables-legacy -w -t nat -A OUTPUT -p tcp --dport 9999 -j RETURN")
        .unwrap();
    let leftovers = |ns: &TestNetns| -> Vec<String> {
        let rules = rule_lines(ns);
        let ours = |l: &&String| l.contains("eth0") || l.contains("mark");
        rules.iter().filter(ours).cloned().collect()
    };

    // Re-applied with another plan: only the new plan's rules, and the world reaches Envoy.
    apply(&w.pod, &earlier).unwrap();
    assert!(!leftovers(&w.pod).is_empty());
    apply(&w.pod, &now).unwrap();
    assert_eq!(leftovers(&w.pod), Vec::<String>::new());
    default_matrix(&w, w.pod_v4.into(), w.world_v4.into());

    // CHECK reports such a rule as drift; the next apply removes it.
    w.pod
        .sh("iptables-legacy -w -t nat -I PREROUTING 1 -i eth0 -j RETURN")
        .unwrap();
    let drift = w
        .pod
        .run(|| iptables_legacy::check(&now, &Tools::default()))
        .unwrap()
        .unwrap();
    assert!(
        drift
            .iter()
            .any(|d| d.contains("unexpected rule: -A PREROUTING -i eth0 -j RETURN")),
        "{drift:?}"
    );

    // A cleanup without the plan removes them too, and nothing foreign.
    apply(&w.pod, &earlier).unwrap();
    assert!(
        w.pod
            .run(|| iptables_legacy::cleanup(&held(), &Tools::default()))
            .unwrap()
            .unwrap()
    );
    assert_eq!(rule_lines(&w.pod), [foreign]);
    assert!(
        !w.pod
            .run(|| iptables_legacy::has_our_chains(&Tools::default()))
            .unwrap()
            .unwrap()
    );
}
