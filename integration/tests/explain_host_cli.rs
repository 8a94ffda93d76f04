//! `istio-nftables explain --host` as a command on an ambient node: the node's host probe rule
//! (nft's `inet istio-ambient-nat`, or Istio's legacy `nat ISTIO_POSTRT` with its ipset)
//! explained from the node's namespace for kubelet's uid and another, confirmed by the kernel
//! (nft's trace; on legacy nodes conntrack and the rule counters); an inbound trace made from
//! the node, which the host rule SNATs, is "not confirmed" and says why; other NAT rules on the
//! node are evaluated or named. The pod and its node are set up through `redirect`
//! (`integration::host_probe`), the command is the shipped `istio-nftables`.

use integration::host_probe::{legacy_pod_on_node, nft_pod_on_node};
use integration::ztunnel::ZTUNNEL_STAND_IN as ZTUNNEL;
use integration::*;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::LazyLock;

const KUBELET: u32 = 4242;

static CLI: LazyLock<PathBuf> = LazyLock::new(|| {
    node::product_bin_dir()
        .expect("the product's binaries")
        .join("istio-nftables")
});

/// Exit status, stdout and stderr, for assertion messages.
fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn explain(args: &[&str]) -> Output {
    Command::new(CLI.as_path())
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

/// `explain --host` from `w`'s node (its world namespace) to `dst`, with `extra`.
fn explain_host(w: &PodWorld, dst: &str, extra: &[&str]) -> Output {
    let node = w.world.path().to_str().unwrap();
    let mut a = vec!["--host", "--network-namespace", node, "--dst", dst];
    a.extend_from_slice(extra);
    explain(&a)
}

#[test]
fn host_probe_rule_is_explained_from_the_node() {
    require_root();
    let (w, _host) = nft_pod_on_node(KUBELET);
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
    let (w, _host) = legacy_pod_on_node();
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
    for (w, _host) in [nft_pod_on_node(0), legacy_pod_on_node()] {
        let _ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
        let (dst, src) = (format!("{}:8080", w.pod_v4), w.world_v4.to_string());
        let o = Command::new("nsenter")
            .arg(format!("--net={}", w.world.path().display()))
            .arg(CLI.as_path())
            .args(["explain", "--network-namespace"])
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
    let (w, _host) = legacy_pod_on_node();
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

    let (w, _host) = nft_pod_on_node(KUBELET);
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
