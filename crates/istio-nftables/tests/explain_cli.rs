//! `istio-nftables explain` as a command: text and JSON on a real namespace, `--trace`
//! agreement and its exit status, the legacy path (`--trace` with ip_tables' TRACE, a killed
//! run cleaned up by the next), and bad input
//! naming the argument and value with exit status 2.

mod common;

use capture::{Config, Facts, InterceptionMode, Ipv6Mode, Plan};
use common::{CLI, text};
use redirect::{Backend, BackendChoice};
use serde_json::Value;
use std::process::{Command, Output};
use testbed::*;

fn explain(args: &[&str]) -> Output {
    Command::new(CLI.as_str())
        .arg("explain")
        .args(args)
        .output()
        .unwrap()
}

fn pod(backend: Backend, mode: InterceptionMode) -> (PodWorld, [Probe; 2]) {
    let w = PodWorld::ipv4_only().unwrap();
    let cfg = Config {
        ipv6: Ipv6Mode::Off,
        inbound_mode: mode,
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

#[test]
fn explains_in_text_and_json_and_confirms_with_the_kernel() {
    require_root();
    let (w, _p) = pod(Backend::Nft, InterceptionMode::Redirect);
    let ns = w.pod.path().to_str().unwrap();
    let dst = format!("{}:80", w.world_v4);

    let o = explain(&[
        "--network-namespace",
        ns,
        "--dst",
        &dst,
        "--uid",
        "1000",
        "--gid",
        "1000",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("outcome: redirected to 127.0.0.1:15001"), "{t}");
    assert!(t.contains("inet istio-proxy-nat istio-redirect"), "{t}");
    assert!(
        t.contains("redirect to :15001 comment \"redirect outbound to Envoy\""),
        "{t}"
    );

    let o = explain(&[
        "--network-namespace",
        ns,
        "--dst",
        &dst,
        "--uid",
        "1337",
        "--gid",
        "1337",
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["backend"], "nft");
    assert_eq!(v["outcome"]["kind"], "not-captured");
    assert_eq!(
        v["outcome"]["by"]["rule"]["comment"],
        "Envoy (uid 1337) traffic: not captured"
    );
    assert_eq!(v["connection"]["uid"], 1337);
    assert!(
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["kind"] == "policy")
    );
    assert!(
        v["summary"]
            .as_str()
            .unwrap()
            .starts_with("not captured: Envoy (uid 1337)")
    );

    let o = explain(&[
        "--network-namespace",
        ns,
        "--dst",
        &dst,
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--trace",
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["trace"]["agree"], true, "{v}");
    assert_eq!(v["trace"]["kernel_outcome"], "redirected to port 15001");

    // Inbound, run from the world's namespace, which the connection comes from (from the
    // node's namespace it would never reach the pod, and an empty trace would agree).
    let inbound = format!("{}:15021", w.pod_v4);
    let args = [
        "explain",
        "--network-namespace",
        ns,
        "--direction",
        "inbound",
        "--dst",
        &inbound,
        "--trace",
    ];
    let o = exec_at(w.world.path(), CLI.as_str(), &args).unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("not captured: inbound port excluded from capture"),
        "{t}"
    );
    assert!(t.contains("kernel trace:"), "{t}");
    assert!(!t.contains("did not report"), "{t}");
    assert!(t.contains("agree: yes"), "{t}");

    // From the node's namespace the connection never reaches the pod: the kernel reports
    // nothing, which confirms nothing (exit 4), however well it "agrees".
    let o = explain(&args[1..]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(4), "{t}");
    assert!(t.contains("did not report hook(s) prerouting"), "{t}");
    assert!(t.contains("agree: not confirmed"), "{t}");
}

#[test]
fn explains_iptables_legacy_rules_and_confirms_with_the_kernel() {
    require_root();
    let (w, _p) = pod(Backend::IptablesLegacy, InterceptionMode::Tproxy);
    let monitor = legacy_trace::NftMonitor::start(w.pod.path());
    let ns = w.pod.path().to_str().unwrap();
    let inbound = format!("{}:8080", w.pod_v4);
    let o = explain(&[
        "--network-namespace",
        ns,
        "--direction",
        "inbound",
        "--dst",
        &inbound,
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("rules: live iptables-legacy rules"), "{t}");
    assert!(
        t.contains("diverted by TPROXY to the listener on port 15006"),
        "{t}"
    );
    assert!(t.contains("-A ISTIO_TPROXY"), "{t}");

    // The backend found by itself: the kernel's TRACE lines agree. Run from the world's
    // namespace, which the inbound connection comes from (the pod is reached from there).
    let mut args = vec![
        "explain",
        "--network-namespace",
        ns,
        "--direction",
        "inbound",
        "--dst",
        &inbound,
        "--trace",
    ];
    let o = exec_at(w.world.path(), CLI.as_str(), &args).unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("kernel trace:"), "{t}");
    assert!(t.contains("ip mangle ISTIO_TPROXY"), "{t}");
    assert!(
        t.contains("kernel: diverted by TPROXY to port 15006"),
        "{t}"
    );
    assert!(!t.contains("did not report"), "{t}");
    assert!(t.contains("agree: yes"), "{t}");
    // Named, and outbound as the app, as JSON.
    let dst = format!("{}:80", w.world_v4);
    args = vec![
        "explain",
        "--network-namespace",
        ns,
        "--backend",
        "iptables-legacy",
        "--dst",
        &dst,
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--trace",
        "--json",
    ];
    let o = explain(&args[1..]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["backend"], "iptables-legacy", "{v}");
    assert_eq!(v["trace"]["not_traced"], serde_json::json!([]), "{v}");
    assert_eq!(v["trace"]["agree"], true, "{v}");
    assert_eq!(
        v["trace"]["kernel_outcome"], "redirected to port 15001",
        "{v}"
    );
    let steps = v["trace"]["kernel_steps"].as_array().unwrap();
    assert!(
        steps
            .iter()
            .any(|s| s["rule"]["text"] == "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001"),
        "{v}"
    );
    assert_eq!(
        legacy_trace::left_in_legacy_pod(w.pod.path()),
        Vec::<String>::new()
    );
    assert_eq!(monitor.stop(), "", "nft changes in a legacy pod");
}

/// SIGKILL of the CLI in the middle of a legacy trace leaves its TRACE rules; the next run
/// deletes them (and gives the family its logger back) before tracing.
#[test]
fn a_killed_legacy_trace_is_cleaned_up_by_the_next_run() {
    require_root();
    let (w, _p) = pod(Backend::IptablesLegacy, InterceptionMode::Redirect);
    let monitor = legacy_trace::NftMonitor::start(w.pod.path());
    let ns = w.pod.path().to_str().unwrap();
    let dst = format!("{}:80", w.world_v4);
    let mut child = Command::new(CLI.as_str())
        .args(["explain", "--network-namespace", ns, "--dst", &dst])
        .args(["--uid", "1000", "--gid", "1000", "--trace", "--wait", "30"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let rules = || legacy_trace::trace_rules(w.pod.path());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rules().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no TRACE rule appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left = rules();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left.iter()
            .all(|r| r.contains(&format!("istio-explain-{}-", child.id()))),
        "{left:?}"
    );
    let o = explain(&[
        "--network-namespace",
        ns,
        "--dst",
        &dst,
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--trace",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("agree: yes"), "{}", text(&o));
    assert_eq!(
        legacy_trace::left_in_legacy_pod(w.pod.path()),
        Vec::<String>::new()
    );
    assert_eq!(monitor.stop(), "", "nft changes in a legacy pod");
}

#[test]
fn bad_input_names_the_argument_and_exits_2() {
    require_root();
    let (w, _p) = pod(Backend::Nft, InterceptionMode::Redirect);
    let ns = w.pod.path().to_str().unwrap().to_string();
    let bare = TestNetns::with_prefix("exbare").unwrap();
    let bare_ns = bare.path().to_str().unwrap().to_string();
    let world = format!("{}:80", w.world_v4);
    let pod_in = format!("{}:8080", w.pod_v4);
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec![
                "--network-namespace",
                "/var/run/netns/no-such-ns-xyz",
                "--dst",
                &world,
            ],
            vec!["--network-namespace", "no-such-ns-xyz"],
        ),
        (
            vec!["--network-namespace", "/etc/hostname", "--dst", &world],
            vec!["--network-namespace", "/etc/hostname"],
        ),
        (
            vec!["--network-namespace", &bare_ns, "--dst", &world],
            vec!["no istio rules", &bare_ns],
        ),
        (
            vec!["--network-namespace", &ns, "--dst", "10.0.0.300:80"],
            vec!["--dst", "10.0.0.300:80"],
        ),
        (
            vec!["--network-namespace", &ns, "--dst", "10.0.0.1"],
            vec!["--dst", "10.0.0.1"],
        ),
        (
            vec!["--network-namespace", &ns, "--dst", "10.0.0.1:0"],
            vec!["--dst", "port 0"],
        ),
        (
            vec![
                "--network-namespace",
                &ns,
                "--dst",
                &world,
                "--src",
                "fd00::9",
            ],
            vec!["--src", "fd00::9", "family"],
        ),
        (
            vec![
                "--network-namespace",
                &ns,
                "--dst",
                &world,
                "--src",
                "10.77.0.1",
            ],
            vec!["--src", "10.77.0.1", "address of the pod"],
        ),
        (
            vec![
                "--network-namespace",
                &ns,
                "--direction",
                "inbound",
                "--dst",
                &pod_in,
                "--uid",
                "1337",
            ],
            vec!["--uid", "1337", "outbound only"],
        ),
        (
            vec![
                "--network-namespace",
                &ns,
                "--direction",
                "inbound",
                "--protocol",
                "udp",
                "--dst",
                &pod_in,
                "--gid",
                "5",
            ],
            vec!["--gid", "5"],
        ),
        (
            vec![
                "--network-namespace",
                &ns,
                "--direction",
                "inbound",
                "--dst",
                &world,
            ],
            vec!["--dst", "address of the pod"],
        ),
        (
            vec![
                "--network-namespace",
                &ns,
                "--dst",
                &world,
                "--protocol",
                "sctp",
            ],
            vec!["--protocol", "sctp"],
        ),
        (
            vec![
                "--network-namespace",
                &ns,
                "--dst",
                &world,
                "--uid",
                "nobody1",
            ],
            vec!["--uid", "nobody1"],
        ),
        (
            vec!["--network-namespace", &ns, "--dst", &world, "--wait", "3"],
            vec!["--wait", "--trace"],
        ),
        (
            // Longer than a run may live: its chain would be taken for a dead run's.
            vec![
                "--network-namespace",
                &ns,
                "--dst",
                &world,
                "--trace",
                "--wait",
                "3601",
            ],
            vec!["--wait", "3601", "at most 3600"],
        ),
        (vec!["--network-namespace", &ns], vec!["--dst"]),
        (
            vec!["--network-namespace", &ns, "--dst", "[::ffff:10.77.0.1]:80"],
            vec!["--dst", "IPv4-mapped", "10.77.0.1:80"],
        ),
        (
            vec![
                "--network-namespace",
                &ns,
                "--direction",
                "inbound",
                "--dst",
                &pod_in,
                "--src",
                "::ffff:10.77.0.1",
            ],
            vec!["--src", "IPv4-mapped", "10.77.0.1"],
        ),
    ];
    for (args, needles) in cases {
        let o = explain(&args);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {t}");
        for n in &needles {
            assert!(t.contains(n), "{args:?}: expected {n:?} in\n{t}");
        }
        assert!(!t.contains("panicked"), "{t}");
    }
}

/// A rule the evaluator cannot read is named, not guessed past.
#[test]
fn an_unknown_expression_is_reported_honestly() {
    require_root();
    let (w, _p) = pod(Backend::Nft, InterceptionMode::Redirect);
    w.pod
        .exec_ok(
            "nft",
            &[
                "insert",
                "rule",
                "inet",
                "istio-proxy-nat",
                "istio-output",
                "limit",
                "rate",
                "100/second",
                "counter",
            ],
        )
        .unwrap();
    let ns = w.pod.path().to_str().unwrap();
    let dst = format!("{}:80", w.world_v4);
    let o = explain(&["--network-namespace", ns, "--dst", &dst, "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outcome"]["kind"], "cannot-evaluate", "{v}");
    assert_eq!(
        v["summary"],
        "cannot evaluate rule 1 of inet istio-proxy-nat istio-output: unknown expression limit"
    );
}

/// Interrupted while waiting for a connection to trace: exit 128+SIGINT, temporary chain gone.
#[test]
fn sigint_during_trace_wait_leaves_nothing_behind() {
    require_root();
    let (w, _p) = pod(Backend::Nft, InterceptionMode::Redirect);
    let ns = w.pod.path().to_str().unwrap();
    let dst = format!("{}:80", w.world_v4);
    let child = Command::new(CLI.as_str())
        .args([
            "explain",
            "--network-namespace",
            ns,
            "--dst",
            &dst,
            "--trace",
            "--wait",
            "30",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let chains = || explain::trace::list_trace_chains(Some(w.pod.path())).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while chains().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no trace chain appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(128 + libc::SIGINT), "{}", text(&o));
    assert!(chains().is_empty(), "{:?}", chains());
}

/// Link-local destinations (issue 21, item 3): `[fe80::1%eth0]:80` (zone by name or index)
/// is accepted and explained through that interface, outbound (and confirmed by --trace) and
/// inbound; a bad zone exits 2 naming --dst and the value.
#[test]
fn link_local_destinations_take_a_zone() {
    require_root();
    let w = PodWorld::new().unwrap();
    w.add_link_local().unwrap();
    let cfg = Config {
        ipv6: Ipv6Mode::On,
        ..Config::cni_default()
    };
    let plan = Plan::build(&cfg, &Facts::default()).unwrap();
    redirect::apply(
        &plan,
        Some(w.pod.path()),
        BackendChoice::Fixed(Backend::Nft),
    )
    .unwrap();
    let _p = [
        Probe::sidecar(w.pod.path()).unwrap(),
        Probe::world(w.world.path()).unwrap(),
    ];
    let ns = w.pod.path().to_str().unwrap();
    // `ip -o link show eth0` in the pod: "N: eth0@...". (/sys is the host's.)
    let link = w
        .pod
        .exec_ok("ip", &["-o", "link", "show", "eth0"])
        .unwrap();
    let index = link.split(':').next().unwrap();
    let by_index = format!("[fe80::1%{}]:80", index.trim());
    for dst in ["[fe80::1%eth0]:80", by_index.as_str()] {
        let o = explain(&[
            "--network-namespace",
            ns,
            "--dst",
            dst,
            "--uid",
            "1337",
            "--gid",
            "1337",
            "--trace",
        ]);
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        assert!(t.contains("-> [fe80::1%eth0]:80"), "{t}");
        assert!(t.contains("out via eth0"), "{t}");
        assert!(t.contains("agree: yes"), "{t}");
    }
    let o = explain(&[
        "--network-namespace",
        ns,
        "--direction",
        "inbound",
        "--dst",
        "[fe80::2]:8080",
        "--src",
        "fe80::1",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("in via eth0"), "{t}");
    assert!(t.contains("-> [fe80::2%eth0]:8080, in via eth0"), "{t}");
    assert!(t.contains("outcome: redirected to ["), "{t}");
    assert!(t.contains("]:15006 (redirect inbound to Envoy)"), "{t}");
    for (dst, want) in [
        (
            "[fe80::1%eth9]:80",
            "--dst [fe80::1%eth9]:80: zone %eth9: no such interface",
        ),
        (
            "[fe80::1%999]:80",
            "--dst [fe80::1%999]:80: zone %999: no such interface",
        ),
        (
            "[fe80::1]:80",
            "--dst [fe80::1]:80: a link-local destination needs a zone",
        ),
        ("[fd00::1%eth0]:80", "link-local addresses (fe80::/10) only"),
        ("[fe80::1%]:80", "empty zone"),
    ] {
        let o = explain(&["--network-namespace", ns, "--dst", dst]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{t}");
        assert!(t.contains(want), "{t}");
        assert!(t.contains(dst) && !t.contains("panicked"), "{t}");
    }
}

/// `--network-namespace` naming a FIFO (or a link to one), with or without `--trace`, is
/// refused at once naming the argument, as the plugin refuses it; before, the open blocked
/// for want of a writer and the command never answered.
#[test]
fn a_fifo_as_the_namespace_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("netns-fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a plain syscall on a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let link = dir.path().join("netns-link");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    for path in [&fifo, &link] {
        for trace in [false, true] {
            let mut args = vec!["explain", "--network-namespace", path.to_str().unwrap()];
            args.extend(["--dst", "10.0.0.1:80"]);
            if trace {
                args.push("--trace");
            }
            let mut child = Command::new(CLI.as_str())
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let start = std::time::Instant::now();
            while child.try_wait().unwrap().is_none() {
                if start.elapsed() > std::time::Duration::from_secs(10) {
                    let _ = child.kill();
                    panic!("{args:?}: no answer within 10 s");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let o = child.wait_with_output().unwrap();
            let t = text(&o);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {t}");
            assert!(
                t.contains("--network-namespace") && t.contains("FIFO"),
                "{args:?}: {t}"
            );
        }
    }
}
