//! An iptables-legacy node in ambient mode (`REDIRECT_BACKEND=iptables-legacy`), end to end
//! with the real ztunnel (`integration::ambient` is the rig): the pods' rules AND the host
//! probe rule are iptables-legacy, as Istio pairs them (Istio's legacy host rule: `nat
//! ISTIO_POSTRT` and the ipset `istio-inpod-probes-v4`), and the node never gets an nftables
//! table. The set follows the pods; the last DEL removes the rule and the set; a restarted
//! agent prunes what a DEL missed while it was away.
//!
//! Needs root, cnitool, ipset, the product's binaries (`cargo build --bins`) and the ztunnel
//! binary (`integration/scripts/build-ztunnel.sh`); under `CI=true` nothing skips.

use capture::ambient_constants::{HOST_PROBE_SNAT_V4, PROBE_SET_V4};
use integration::TestNetns;
use integration::ambient::prerequisites;
use integration::ambient::{AmbientNode, AmbientOptions, KUBELET_UID, Mode, PodPlan, tables};
use integration::ambient::{ProbeIpset, lands, last_peer, legacy_save};
use integration::host_probe::LEGACY_HOST_RULE;
use std::net::IpAddr;

const APP: u16 = integration::ambient::APP_PORT;

fn a() -> PodPlan {
    PodPlan::new("a", [10, 88, 1, 10], Mode::Ambient)
}
fn b() -> PodPlan {
    PodPlan::new("b", [10, 88, 1, 11], Mode::Ambient)
}

fn legacy_node() -> AmbientOptions {
    AmbientOptions {
        env: vec![("REDIRECT_BACKEND".into(), "iptables-legacy".into())],
        ..AmbientOptions::default()
    }
}

/// No nftables table in `ns`, anyone's.
#[track_caller]
fn no_nft(n: &AmbientNode, ns: &TestNetns, what: &str) {
    let t = tables(ns);
    assert!(t.is_empty(), "nftables in {what}: {t:?}\n{}", n.logs());
}

fn members(n: &AmbientNode) -> Vec<(IpAddr, String)> {
    let mut m = n.probe_ipset(PROBE_SET_V4);
    m.sort();
    m
}

#[test]
fn a_legacy_node_gets_istios_legacy_host_rule_and_no_nftables() {
    let Some(bin) = prerequisites() else { return };
    let n = AmbientNode::start(&bin, &legacy_node(), &[a(), b()]).unwrap();
    let node = &n.node.ns;
    // No ambient pod yet: no host rule, no set.
    assert!(n.ipsets().is_empty(), "{:?}", n.ipsets());
    let (pa, pb) = (n.start_pod(&a()), n.start_pod(&b()));
    assert!(n.served(&pa) && n.served(&pb), "{}", n.logs());

    // The pods' rules: iptables-legacy, nothing in nftables.
    for p in [&pa, &pb] {
        let save = legacy_save(p.ns.path(), false);
        assert!(
            save.contains(":ISTIO_PRERT") && save.contains(":ISTIO_OUTPUT"),
            "{save}"
        );
        no_nft(&n, &p.ns, p.name());
    }
    // The host rule: Istio's legacy one, jumped to first in POSTROUTING; no nftables at all.
    let host = legacy_save(node.path(), false);
    let postrouting: Vec<&str> = host
        .lines()
        .filter(|l| l.starts_with("-A POSTROUTING"))
        .collect();
    assert_eq!(
        postrouting.first(),
        Some(&"-A POSTROUTING -j ISTIO_POSTRT"),
        "{host}"
    );
    assert!(host.lines().any(|l| l == LEGACY_HOST_RULE), "{host}");
    no_nft(&n, node, "the node");
    // The set holds exactly the ambient pods, each with its UID.
    assert_eq!(members(&n), [(pa.ip(), pa.uid()), (pb.ip(), pb.uid())]);

    // Kubelet's probe reaches A's app directly, from the probe address.
    let o = n.from_node(KUBELET_UID, pa.ip(), APP);
    lands(&n, &o, "a", APP);
    assert_eq!(last_peer(&pa), IpAddr::V4(HOST_PROBE_SNAT_V4));
    // A -> B through ztunnel (HBONE) over the legacy in-pod rules: B's app sees A.
    let o = n.from_pod(&pa, pb.ip(), APP);
    lands(&n, &o, "b", APP);
    assert_eq!(last_peer(&pb), pa.ip());

    // DEL B: its IP leaves the set, its rules go; the host rule stays for A.
    n.del(&pb).assert_ok();
    n.eventually("B out of the probe set", || {
        members(&n) == [(pa.ip(), pa.uid())]
    });
    assert!(!legacy_save(pb.ns.path(), false).contains("ISTIO_"));
    assert!(legacy_save(node.path(), false).contains(LEGACY_HOST_RULE));

    // The last DEL: rule, jump and set are gone; still no nftables on the node.
    n.del(&pa).assert_ok();
    n.eventually(
        "the host rule and its set removed with the last pod",
        || n.ipsets().is_empty() && !legacy_save(node.path(), false).contains("ISTIO_POSTRT"),
    );
    no_nft(&n, node, "the node");
}

/// On a legacy node the host rule is kept true too: someone flushes the node's nat table,
/// deletes `ISTIO_POSTRT` and destroys the ipsets (or flushes a set), and the agent's next
/// reconcile pass writes Istio's rule again with the pods' addresses; kubelet's probe arrives
/// from the probe address again.
#[test]
fn a_legacy_host_rule_and_ipset_removed_on_the_node_come_back() {
    let Some(bin) = prerequisites() else { return };
    let mut opts = legacy_node();
    opts.env.push(("RECONCILE_INTERVAL".into(), "1s".into()));
    let n = AmbientNode::start(&bin, &opts, &[a()]).unwrap();
    let node = &n.node.ns;
    let pa = n.start_pod(&a());
    assert!(n.served(&pa), "{}", n.logs());
    let whole = || {
        legacy_save(node.path(), false).contains(LEGACY_HOST_RULE)
            && members(&n) == [(pa.ip(), pa.uid())]
    };
    assert!(whole(), "{}", legacy_save(node.path(), false));

    let wipe =
        "iptables-legacy -t nat -F && iptables-legacy -t nat -X ISTIO_POSTRT && ipset destroy";
    node.exec_ok("sh", &["-c", wipe]).unwrap();
    assert!(n.ipsets().is_empty());
    n.eventually("rule, jump and set written again", whole);
    let host = legacy_save(node.path(), false);
    let first = host.lines().find(|l| l.starts_with("-A POSTROUTING"));
    assert_eq!(first, Some("-A POSTROUTING -j ISTIO_POSTRT"), "{host}");
    lands(&n, &n.from_node(KUBELET_UID, pa.ip(), APP), "a", APP);
    assert_eq!(last_peer(&pa), IpAddr::V4(HOST_PROBE_SNAT_V4));

    node.exec_ok("ipset", &["flush", PROBE_SET_V4]).unwrap();
    n.eventually("the address back in the ipset", whole);
    lands(&n, &n.from_node(KUBELET_UID, pa.ip(), APP), "a", APP);
    assert_eq!(last_peer(&pa), IpAddr::V4(HOST_PROBE_SNAT_V4));
    no_nft(&n, node, "the node");
}

/// Istio prunes its probe sets at startup (`syncHostIPSets` → `pruneHostIPset`): the set holds
/// exactly the pods the agent serves. A rollout keeps the host rule and its ipset (SIGTERM while
/// the DaemonSet exists); meanwhile the runtime DELs pod B (the agent is away, so its address
/// stays) and B leaves the API, and someone adds an address by hand. The restarted agent
/// removes both once it has found A (at startup, and on every reconcile pass: one added later
/// goes too), keeps A's, and kubelet's probe of A is still SNATed. Left there, B's address, once reused by a pod that is not ambient, would get that pod's kubelet
/// probes SNATed.
#[test]
fn a_restarted_agent_prunes_probe_addresses_of_pods_deleted_while_it_was_down() {
    let Some(bin) = prerequisites() else { return };
    let mut opts = legacy_node();
    opts.env.push(("RECONCILE_INTERVAL".into(), "1s".into()));
    let mut n = AmbientNode::start(&bin, &opts, &[a(), b()]).unwrap();
    n.kube().put_daemonset("istio-system", "istio-cni-node");
    let (pa, pb) = (n.start_pod(&a()), n.start_pod(&b()));
    assert!(n.served(&pa) && n.served(&pb), "{}", n.logs());

    let (_, log) = n.node.stop_daemon().unwrap();
    assert!(log.contains("safe upgrade"), "{log}");
    n.del(&pb).assert_ok();
    n.kube().delete(&pb.uid());
    let by_hand = "10.88.1.99";
    let add = ["add", PROBE_SET_V4, by_hand, "comment", "by-hand"];
    n.node.ns.exec_ok("ipset", &add).unwrap();
    let stale: Vec<IpAddr> = members(&n).into_iter().map(|(ip, _)| ip).collect();
    assert_eq!(stale, [pa.ip(), pb.ip(), by_hand.parse().unwrap()]);

    n.node.start_daemon().unwrap();
    let pruned = "removed from the host probe sets";
    n.eventually("the restarted agent prunes", || {
        n.node.daemon().log().contains(pruned)
    });
    assert_eq!(members(&n), [(pa.ip(), pa.uid())], "{}", n.logs());
    let line = n.node.daemon().log();
    let line = line.lines().find(|l| l.contains(pruned)).unwrap();
    assert!(
        line.contains(&pb.ip().to_string()) && line.contains(by_hand),
        "{line}"
    );
    assert!(n.served(&pa), "{}", n.logs());
    lands(&n, &n.from_node(KUBELET_UID, pa.ip(), APP), "a", APP);
    assert_eq!(last_peer(&pa), IpAddr::V4(HOST_PROBE_SNAT_V4));
    // Each reconcile pass prunes too: an address added now goes within the 1 s interval.
    let add = ["add", PROBE_SET_V4, "10.88.1.98"];
    n.node.ns.exec_ok("ipset", &add).unwrap();
    n.eventually("a reconcile pass prunes the new stray", || {
        members(&n) == [(pa.ip(), pa.uid())]
    });
    assert!(legacy_save(n.node.ns.path(), false).contains(LEGACY_HOST_RULE));
}

/// A failed enroll leaves the pod without in-pod rules. The host probe rule cannot be written
/// (an `istio-inpod-probes-v4` of another type is in the way): the ADD is refused naming the
/// set, and the pod's namespace keeps no chain of ours. Before, its outbound TCP went to
/// 127.0.0.1:15001, where nothing listens, and a pod the agent enrolls by itself (startup, a
/// namespace label) never gets the DEL that would clear it. Once the obstacle goes, the
/// runtime's retry serves the pod.
#[test]
fn an_enroll_whose_host_rule_cannot_be_written_leaves_no_rules_in_the_pod() {
    let Some(bin) = prerequisites() else { return };
    let n = AmbientNode::start(&bin, &legacy_node(), &[a()]).unwrap();
    let node = &n.node.ns;
    node.exec_ok("ipset", &["create", PROBE_SET_V4, "hash:net"])
        .unwrap();
    let pa = n.create_pod(&a()).unwrap();
    let run = n.add(&pa);
    assert!(!run.ok, "the ADD passed: {run:?}\n{}", n.logs());
    let said = format!("{}{}", run.stdout, run.stderr);
    assert!(
        said.contains(PROBE_SET_V4) || said.contains("ipset"),
        "{said}"
    );
    let save = legacy_save(pa.ns.path(), false);
    assert!(
        !save.contains("ISTIO_"),
        "rules left after a failed enroll:\n{save}\n{}",
        n.logs()
    );
    no_nft(&n, &pa.ns, "the pod");

    node.exec_ok("ipset", &["destroy", PROBE_SET_V4]).unwrap();
    n.del(&pa).assert_ok();
    n.add(&pa).assert_ok();
    assert!(n.served(&pa), "{}", n.logs());
    assert_eq!(members(&n), [(pa.ip(), pa.uid())]);
}

/// The probe set goes with the last pod even when a rule that is not ours still uses it: the
/// kernel refuses to destroy a set in use, so the agent empties it at once (no address is
/// SNATed any more), keeps Istio's rule out (no reconcile pass writes it back for no pod), and
/// destroys the set on the first pass after the foreign rule goes.
#[test]
fn a_probe_set_a_foreign_rule_uses_goes_once_that_rule_goes() {
    let Some(bin) = prerequisites() else { return };
    let mut opts = legacy_node();
    opts.env.push(("RECONCILE_INTERVAL".into(), "1s".into()));
    let n = AmbientNode::start(&bin, &opts, &[a()]).unwrap();
    let node = &n.node.ns;
    let pa = n.start_pod(&a());
    assert!(n.served(&pa), "{}", n.logs());
    let foreign = [
        "-t",
        "filter",
        "-I",
        "INPUT",
        "-m",
        "set",
        "--match-set",
        PROBE_SET_V4,
        "src",
        "-j",
        "ACCEPT",
    ];
    node.exec_ok("iptables-legacy", &foreign).unwrap();

    n.del(&pa).assert_ok();
    n.eventually(
        "the set emptied and Istio's rule gone with the last pod",
        || members(&n).is_empty() && !legacy_save(node.path(), false).contains("ISTIO_POSTRT"),
    );
    assert_eq!(n.ipsets(), [PROBE_SET_V4], "the set in use cannot go yet");
    // Several reconcile passes: the rule stays out, the set stays (in use) and empty.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(
        !legacy_save(node.path(), false).contains("ISTIO_POSTRT"),
        "{}",
        n.logs()
    );
    assert!(members(&n).is_empty());

    let mut gone = foreign;
    gone[2] = "-D";
    node.exec_ok("iptables-legacy", &gone).unwrap();
    n.eventually("the set destroyed once nothing uses it", || {
        n.ipsets().is_empty()
    });
    no_nft(&n, node, "the node");
}
