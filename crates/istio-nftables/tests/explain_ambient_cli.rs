//! `istio-nftables explain` for ambient pods as a command, and `--pod NAMESPACE/NAME`: the
//! pod's IP from a (fake) API server, its namespace found through a node /proc holding a real
//! sandbox process in the pod's namespace (as the node daemon finds running pods), for a
//! sidecar and an ambient pod; `--mark`; `--host` (the node's probe rule, kubelet's uid);
//! bad pods and flags exit 2 naming the argument and the pod.

mod common;

use capture::{AmbientConfig, Config, Facts, Ipv6Mode, Plan};
use common::{CLI, text};
use redirect::{Backend, BackendChoice};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use testbed::ambient::{link_process, sleep_binary, spawn_in};
use testbed::kube_api::FakeKube;
use testbed::*;

const KUBELET: u32 = 4242;

fn explain(args: &[&str]) -> Output {
    Command::new(CLI.as_str())
        .arg("explain")
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

/// A running pod: its namespace pair and the sandbox process living in the pod's namespace.
struct RunningPod {
    w: PodWorld,
    sandbox: Child,
    _probes: Vec<Probe>,
}

impl Drop for RunningPod {
    fn drop(&mut self) {
        let _ = self.sandbox.kill();
        let _ = self.sandbox.wait();
    }
}

fn sandbox(ns: &TestNetns, proc_root: &Path) -> Child {
    let mut cmd = Command::new(sleep_binary().unwrap());
    cmd.arg("infinity")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = spawn_in(ns, cmd, None).unwrap();
    link_process(proc_root, &child.id().to_string(), child.id()).unwrap();
    child
}

fn pod_json(ns: &str, name: &str, ip: Option<String>, host_network: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
        "spec": {"nodeName": "node-a", "hostNetwork": host_network,
                 "containers": [{"name": "app", "image": "app"}]},
        "status": match ip {
            Some(ip) => json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}),
            None => json!({"phase": "Pending"}),
        },
    })
}

/// The node: a fake API server, its /proc (`1` is this process, in the node's namespace).
struct Node {
    kube: FakeKube,
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("proc")).unwrap();
        link_process(&dir.path().join("proc"), "1", std::process::id()).unwrap();
        Node {
            kube: FakeKube::start(),
            dir,
        }
    }
    fn proc_root(&self) -> String {
        self.dir.path().join("proc").display().to_string()
    }
    fn kubeconfig(&self) -> String {
        self.kube.kubeconfig(self.dir.path()).display().to_string()
    }
    /// Programs `plan` in a fresh pod with `backend`, starts its sandbox and listeners, and
    /// serves the pod `default/<name>`.
    fn pod(&self, name: &str, plan: &Plan, backend: Backend, listen: &[Listen]) -> RunningPod {
        let w = PodWorld::ipv4_only().unwrap();
        redirect::apply(plan, Some(w.pod.path()), BackendChoice::Fixed(backend)).unwrap();
        let probes = vec![
            Probe::start(w.pod.path(), "pod", listen).unwrap(),
            Probe::world(w.world.path()).unwrap(),
        ];
        let sandbox = sandbox(&w.pod, self.dir.path().join("proc").as_path());
        self.kube
            .add(pod_json("default", name, Some(w.pod_v4.to_string()), false));
        RunningPod {
            w,
            sandbox,
            _probes: probes,
        }
    }
    /// `explain --pod default/<name> --kubeconfig … --proc-root … ARGS`.
    fn explain_pod(&self, pod: &str, args: &[&str]) -> Output {
        let (kc, pr) = (self.kubeconfig(), self.proc_root());
        let mut all = vec!["--pod", pod, "--kubeconfig", &kc, "--proc-root", &pr];
        all.extend_from_slice(args);
        explain(&all)
    }
}

const ZTUNNEL: [Listen; 5] = [
    Listen::tcp(15001),
    Listen::tproxy(15006),
    Listen::tcp(15008),
    Listen::udp(15053),
    Listen::tcp(8080),
];

fn outcome(v: &Value) -> (&str, String) {
    let o = &v["outcome"];
    let to = o["to"]
        .as_str()
        .map(str::to_string)
        .or_else(|| o["port"].as_u64().map(|p| p.to_string()))
        .unwrap_or_default();
    (o["kind"].as_str().unwrap_or(""), to)
}

#[test]
fn pods_are_found_by_name_and_explained_sidecar_and_ambient_alike() {
    require_root();
    let node = Node::new();
    let sidecar_plan = Plan::build(
        &Config {
            ipv6: Ipv6Mode::Off,
            ..Config::cni_default()
        },
        &Facts::default(),
    )
    .unwrap();
    let side = node.pod(
        "web",
        &sidecar_plan,
        Backend::Nft,
        &[Listen::tcp(15001), Listen::tcp(15006)],
    );
    let ambient_plan = Plan::ambient(&AmbientConfig {
        redirect_dns: true,
        ..AmbientConfig::default()
    })
    .unwrap();
    let amb = node.pod("amb", &ambient_plan, Backend::Nft, &ZTUNNEL);
    let amb_legacy = node.pod(
        "amb-legacy",
        &ambient_plan,
        Backend::IptablesLegacy,
        &ZTUNNEL,
    );

    let world = |p: &RunningPod, port: u16| format!("{}:{port}", p.w.world_v4);
    let app = ["--uid", "1000", "--gid", "1000"];
    // Sidecar: outbound to Envoy's 15001, confirmed by the kernel.
    let d = world(&side, 80);
    let mut args = vec!["--dst", d.as_str(), "--trace", "--json"];
    args.extend_from_slice(&app);
    let o = node.explain_pod("default/web", &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json_of(&o);
    assert_eq!(outcome(&v), ("redirected", "127.0.0.1:15001".into()), "{v}");
    assert_eq!(v["trace"]["agree"], true, "{v}");
    assert!(
        v["steps"][0]["table"]
            .as_str()
            .unwrap()
            .starts_with("istio-proxy-"),
        "{v}"
    );

    // Ambient (nft): outbound to ztunnel's 15001 (kernel agrees), ztunnel's mark bypasses,
    // DNS to 15053, inbound to 15006, HBONE untouched.
    let d = world(&amb, 80);
    let mut args = vec!["--dst", d.as_str(), "--trace", "--json"];
    args.extend_from_slice(&app);
    let o = node.explain_pod("default/amb", &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json_of(&o);
    assert_eq!(outcome(&v), ("redirected", "127.0.0.1:15001".into()), "{v}");
    assert_eq!(v["trace"]["agree"], true, "{v}");
    assert_eq!(v["outcome"]["by"]["table"], "istio-ambient-nat", "{v}");

    let o = node.explain_pod("default/amb", &["--dst", &d, "--mark", "0x539", "--trace"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("mark 0x539"), "{t}");
    assert!(t.contains("leaves the pod for"), "{t}");
    assert!(t.contains("agree: yes"), "{t}");

    for pod in ["default/amb", "default/amb-legacy"] {
        let p = if pod.ends_with("legacy") {
            &amb_legacy
        } else {
            &amb
        };
        let dns = world(p, 53);
        let o = node.explain_pod(pod, &["--dst", &dns, "--protocol", "udp", "--json"]);
        assert_eq!(o.status.code(), Some(0), "{pod}: {}", text(&o));
        assert_eq!(outcome(&json_of(&o)).1, "127.0.0.1:15053", "{pod}");
        let (pod_ip, src) = (p.w.pod_v4.to_string(), p.w.world_v4.to_string());
        for (port, want) in [("8080", "15006"), ("15008", "15008")] {
            let dst = format!("{pod_ip}:{port}");
            let o = node.explain_pod(
                pod,
                &[
                    "--direction",
                    "inbound",
                    "--dst",
                    &dst,
                    "--src",
                    &src,
                    "--json",
                ],
            );
            assert_eq!(o.status.code(), Some(0), "{pod}: {}", text(&o));
            let v = json_of(&o);
            let to = v["outcome"]["to"].as_str().unwrap_or_default().to_string();
            assert!(to.ends_with(&format!(":{want}")), "{pod} {port}: {v}");
        }
        let legacy = pod.ends_with("legacy");
        assert_eq!(
            json_of(&node.explain_pod(pod, &["--dst", &dns, "--protocol", "udp", "--json"]))["backend"],
            if legacy { "iptables-legacy" } else { "nft" }
        );
    }
}

#[test]
fn bad_pods_exit_2_naming_the_pod() {
    require_root();
    let node = Node::new();
    node.kube.add(pod_json("default", "pending", None, false));
    node.kube.add(pod_json(
        "default",
        "hostnet",
        Some("10.9.9.9".into()),
        true,
    ));
    node.kube.add(pod_json(
        "default",
        "elsewhere",
        Some("10.254.254.7".into()),
        false,
    ));
    let mut done = pod_json("default", "done", Some("10.254.254.8".into()), false);
    done["status"]["phase"] = "Succeeded".into();
    node.kube.add(done);
    node.kube.add(pod_json(
        "default",
        "web",
        Some("10.254.254.9".into()),
        false,
    ));
    let cases: [(&str, &[&str]); 8] = [
        ("default/nope", &["default/nope", "no such pod"]),
        ("default/done", &["default/done", "phase Succeeded"]),
        // Not a pod name: refused before any request (it would GET pods/web).
        (
            "default/web?x=1",
            &["--pod", "web?x=1", "not a valid pod name"],
        ),
        ("Default/web", &["--pod", "not a valid namespace name"]),
        ("nope", &["--pod", "NAMESPACE/NAME"]),
        ("default/pending", &["default/pending", "no IP", "Pending"]),
        ("default/hostnet", &["default/hostnet", "host network"]),
        (
            "default/elsewhere",
            &["default/elsewhere", "10.254.254.7", "running on this node"],
        ),
    ];
    for (pod, needles) in cases {
        let o = node.explain_pod(pod, &["--dst", "10.0.0.1:80"]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{pod}: {t}");
        for n in needles {
            assert!(t.contains(n), "{pod}: expected {n:?} in {t}");
        }
        assert!(!t.contains("panicked"), "{t}");
    }
    // No way to the API server at all; no namespace at all; --pod with a namespace.
    let o = explain(&["--pod", "default/x", "--dst", "10.0.0.1:80"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--kubeconfig"), "{}", text(&o));
    let o = explain(&["--dst", "10.0.0.1:80"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--network-namespace"), "{}", text(&o));
    let o = explain(&[
        "--pod",
        "a/b",
        "--network-namespace",
        "/x",
        "--dst",
        "10.0.0.1:80",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// `explain --host` from `w`'s node (its world namespace) to `dst`, with `extra`.
fn explain_host(w: &testbed::PodWorld, dst: &str, extra: &[&str]) -> Output {
    let node = w.world.path().to_str().unwrap();
    let mut a = vec!["--host", "--network-namespace", node, "--dst", dst];
    a.extend_from_slice(extra);
    explain(&a)
}

#[test]
fn host_probe_rule_is_explained_from_the_node() {
    require_root();
    let (w, _host) = common::nft_pod_on_node(KUBELET);
    let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let dst = format!("{}:8080", w.pod_v4);
    let with = |extra: &[&str]| explain_host(&w, &dst, extra);
    let o = with(&["--uid", "4242", "--trace", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json_of(&o);
    assert_eq!(v["outcome"]["kind"], "snatted", "{v}");
    assert_eq!(v["outcome"]["from"], "169.254.7.127", "{v}");
    assert_eq!(v["trace"]["agree"], true, "{v}");
    assert_eq!(v["steps"][0]["hook"], "postrouting", "{v}");
    let o = with(&["--uid", "1000", "--trace"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("not captured") || t.contains("untouched"), "{t}");
    for (extra, needle) in [
        (&["--direction", "inbound"][..], "--direction"),
        // This node's rule is nft's: none in iptables-legacy.
        (
            &["--backend", "iptables-legacy"][..],
            "no host probe rule (iptables-legacy",
        ),
    ] {
        let o = with(extra);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(needle), "{}", text(&o));
    }
    // A namespace without the host rule (the pod's) is no node.
    let o = explain(&[
        "--host",
        "--network-namespace",
        w.pod.path().to_str().unwrap(),
        "--dst",
        &dst,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no host probe rule"), "{}", text(&o));
}

#[test]
fn legacy_host_probe_rule_is_explained_from_the_node() {
    require_root();
    let (w, _host) = common::legacy_pod_on_node();
    let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let dst = format!("{}:8080", w.pod_v4);
    let with = |extra: &[&str]| explain_host(&w, &dst, extra);
    // Istio's legacy rule matches any local socket: kubelet's uid and another alike.
    for uid in ["4242", "1000"] {
        let o = with(&["--uid", uid, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let v = json_of(&o);
        assert_eq!(v["backend"], "iptables-legacy", "{v}");
        assert_eq!(v["outcome"]["kind"], "snatted", "{v}");
        assert_eq!(v["outcome"]["from"], "169.254.7.127", "{v}");
        assert_eq!(v["steps"][0]["hook"], "postrouting", "{v}");
    }
    let t = text(&with(&["--uid", "4242"]));
    assert!(t.contains("--match-set istio-inpod-probes-v4 dst"), "{t}");
    // --trace: confirmed from the kernel's record (conntrack + counters), nothing traced.
    let o = with(&["--uid", "4242", "--trace"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    for needle in [
        "kernel's record (conntrack + rule counters); not a rule-by-rule path",
        "conntrack: tcp",
        "169.254.7.127",
        "agree: yes (conntrack confirms the same outcome)",
    ] {
        assert!(t.contains(needle), "{needle}: {t}");
    }
    let v = json_of(&with(&["--uid", "1000", "--trace", "--json"]));
    assert_eq!(v["trace"]["agree"], true, "{v}");
    assert_eq!(v["trace"]["kernel_steps"], json!([]), "{v}");
    assert_eq!(
        v["trace"]["kernel_outcome"], "source NATed to 169.254.7.127",
        "{v}"
    );
    let record = &v["trace"]["record"];
    assert_eq!(
        record["method"], "kernel's record (conntrack + rule counters)",
        "{v}"
    );
    assert!(
        record["conntrack"]
            .as_str()
            .is_some_and(|c| c.ends_with(&format!("-> 169.254.7.127:{}", c_port(c)))),
        "{v}"
    );
    assert_eq!(record["corroborated"], true, "{v}");
    // An address of the pod that is not in the set: not SNATed, and the kernel agrees.
    let v4 = w.pod_v4.octets();
    let other = format!("{}.{}.{}.3", v4[0], v4[1], v4[2]);
    w.pod
        .sh(&format!("ip addr add {other}/24 dev eth0"))
        .unwrap();
    let o = explain_host(&w, &format!("{other}:8080"), &["--trace", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json_of(&o);
    assert_eq!(v["trace"]["kernel_outcome"], "not captured", "{v}");
    assert_eq!(v["trace"]["agree"], true, "{v}");
    // The node's admin exempts a destination from conntrack (raw NOTRACK, outbound only: the
    // answer may start an entry the other way round, which is no record of this connection):
    // nothing confirms the explanation.
    w.world
        .sh("iptables-legacy -t raw -A OUTPUT -d 198.51.100.7/32 -j CT --notrack")
        .unwrap();
    let o = explain_host(&w, "198.51.100.7:8080", &["--trace"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(4), "{t}");
    assert!(t.contains("not confirmed"), "{t}");
    assert!(t.contains("conntrack: none"), "{t}");
    // Asked for nft's rule, which this node does not have; the record is of a connection
    // this command makes, so there is nothing to wait for.
    for (extra, needle) in [
        (
            &["--backend", "nft"][..],
            "no host probe rule (inet istio-ambient-nat",
        ),
        (&["--trace", "--wait", "1"][..], "--wait 1"),
    ] {
        let o = with(extra);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(needle), "{}", text(&o));
    }
}

/// The source port of a conntrack line's original tuple (`tcp A:P -> B:Q, reply ...`).
fn c_port(c: &str) -> &str {
    c.split_whitespace()
        .nth(1)
        .and_then(|src| src.rsplit(':').next())
        .unwrap_or("")
}

/// An inbound `--trace` of an ambient pod made from its node's namespace: the node's host
/// probe rule SNATs the connection (kubelet's uid 0 here, or Istio's legacy rule: any local
/// socket) to 169.254.7.127, so the trace rule, matching the source given, sees nothing. That
/// is "not confirmed" (4), not a disagreement, and the output says why and what to trace.
#[test]
fn inbound_trace_from_an_ambient_node_is_not_confirmed_and_says_why() {
    require_root();
    for (w, _host) in [common::nft_pod_on_node(0), common::legacy_pod_on_node()] {
        let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
        let (dst, src) = (format!("{}:8080", w.pod_v4), w.world_v4.to_string());
        let o = Command::new("nsenter")
            .arg(format!("--net={}", w.world.path().display()))
            .args([CLI.as_str(), "explain", "--network-namespace"])
            .arg(w.pod.path())
            .args(["--direction", "inbound", "--dst", &dst, "--src", &src])
            .arg("--trace")
            .output()
            .unwrap();
        let t = text(&o);
        assert_eq!(o.status.code(), Some(4), "{t}");
        assert!(t.contains("agree: not confirmed"), "{t}");
        assert!(t.contains("kernel: nothing reported"), "{t}");
        assert!(t.contains("--src 169.254.7.127"), "{t}");
    }
}

/// Other NAT rules on the node beside the host probe rule. Legacy: nat POSTROUTING's rules
/// before the jump to ISTIO_POSTRT are evaluated and numbered as the kernel numbers them (one
/// the evaluator cannot read is named, exit 1, instead of claiming the probe SNAT the kernel
/// did not apply); those after it are named in a note. nft: other NAT base chains at
/// postrouting are named in a note.
#[test]
fn other_nat_rules_on_the_node_are_evaluated_or_named() {
    require_root();
    let (w, _host) = common::legacy_pod_on_node();
    let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let dst = format!("{}:8080", w.pod_v4);
    let ipt = |rule: &str| {
        w.world
            .sh(&format!("iptables-legacy -t nat {rule}"))
            .unwrap()
    };
    ipt("-I POSTROUTING 1 -d 192.0.2.1/32 -j MASQUERADE");
    ipt("-A POSTROUTING -d 192.0.2.2/32 -j MASQUERADE");
    let o = explain_host(&w, &dst, &["--uid", "4242"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("rule 2 -> jump ISTIO_POSTRT"), "{t}");
    assert!(t.contains("source NATed to 169.254.7.127"), "{t}");
    assert!(
        t.contains("ip nat POSTROUTING: rule 3 after the jump to ISTIO_POSTRT (rule 2)"),
        "{t}"
    );
    // A rule before our jump that NATs this very connection, as the kernel's conntrack shows.
    ipt(&format!(
        "-I POSTROUTING 1 -d {}/32 -p tcp --dport 8080 -j MASQUERADE",
        w.pod_v4
    ));
    let o = explain_host(&w, &dst, &["--uid", "4242"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(!t.contains("source NATed to 169.254.7.127"), "{t}");
    assert!(t.contains("MASQUERADE"), "{t}");

    let (w, _host) = common::nft_pod_on_node(KUBELET);
    w.world
        .sh("nft add table ip kubeish && nft add chain ip kubeish post '{ type nat hook postrouting priority 100; }'")
        .unwrap();
    let o = explain_host(&w, &format!("{}:8080", w.pod_v4), &["--uid", "4242"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains("ip kubeish post (priority 100) is a NAT chain at postrouting too"),
        "{t}"
    );
}
