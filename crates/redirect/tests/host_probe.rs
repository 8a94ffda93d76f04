//! The host probe rule through `redirect::host_probe` on each backend, on the real kernel: a
//! "node" namespace (the world side of a pod/world pair) and a pod with ambient's in-pod rules
//! of the same backend and a stand-in ztunnel. Kubelet's probe is SNATed and reaches the app;
//! the node holds the rule of that backend only, also after switching from the other.

use capture::ambient_constants::HOST_PROBE_SNAT_V4;
use capture::{AmbientConfig, HostProbeConfig, Plan};
use redirect::host_probe::{HostProbeRule, remove_all_backends};
use redirect::{Backend, BackendChoice};
use std::net::IpAddr;
use testbed::host_probe::{KUBELET_UID, OTHER_UID, ZTUNNEL, in_ns, seen_from};
use testbed::*;

/// What of each backend's host rule the node holds: (nft tables, legacy `ISTIO_POSTRT` +
/// ipsets).
fn holdings(node: &TestNetns) -> (String, String) {
    let nft = node.exec_ok("nft", &["list", "ruleset"]).unwrap();
    let mut legacy: String = node
        .exec_ok("iptables-legacy-save", &["-t", "nat"])
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("ISTIO_POSTRT"))
        .map(|l| l.to_string() + "\n")
        .collect();
    legacy += &node.exec_ok("ipset", &["list", "-n"]).unwrap();
    (nft.trim().to_string(), legacy.trim().to_string())
}

#[track_caller]
fn only(node: &TestNetns, backend: Backend) {
    let (nft, legacy) = holdings(node);
    match backend {
        Backend::Nft => {
            assert!(nft.contains("istio-ambient-nat"), "{nft}");
            assert!(legacy.is_empty(), "legacy host rule left: {legacy}");
        }
        Backend::IptablesLegacy => {
            assert!(nft.is_empty(), "nftables on a legacy node: {nft}");
            assert!(
                legacy.contains("-A POSTROUTING -j ISTIO_POSTRT"),
                "{legacy}"
            );
            assert!(legacy.contains("istio-inpod-probes-v4"), "{legacy}");
        }
    }
}

/// A pod with ambient's in-pod rules of `backend` and a stand-in ztunnel, on its node (the
/// world side); the host rule of `backend` and its plan, not written yet.
fn pod_on_node(backend: Backend) -> (PodWorld, Probe, HostProbeRule, Plan) {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let inpod = Plan::ambient(&AmbientConfig::default()).unwrap();
    redirect::apply(&inpod, Some(w.pod.path()), BackendChoice::Fixed(backend)).unwrap();
    let ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let rule = HostProbeRule::new(backend);
    let plan = HostProbeConfig::default_plan(rule.probe_source(Some(KUBELET_UID)), false);
    (w, ztunnel, rule, plan)
}

fn probes_are_snatted_on(backend: Backend) {
    let (w, ztunnel, rule, plan) = pod_on_node(backend);
    let (node, pod) = (w.world.path(), IpAddr::V4(w.pod_v4));
    in_ns(node, || {
        rule.ensure(&plan)?;
        rule.add_pod_ips(&plan, &[pod], "uid-a")
    })
    .unwrap();
    only(&w.world, backend);
    let snat = IpAddr::V4(HOST_PROBE_SNAT_V4);
    let kubelet = ConnectSpec::new(pod, 8080).uid(KUBELET_UID);
    assert_eq!(seen_from(&ztunnel, node, &kubelet), (8080, snat));
    let other = ConnectSpec::new(pod, 8080).uid(OTHER_UID);
    let other_lands = match backend {
        // Istio's nft rule matches kubelet's uid only.
        Backend::Nft => (15006, IpAddr::V4(w.world_v4)),
        // Istio's legacy rule: any local socket (`--socket-exists`).
        Backend::IptablesLegacy => (8080, snat),
    };
    assert_eq!(seen_from(&ztunnel, node, &other), other_lands);

    // The node's backend changes (a restart with another decision): the new backend's rule
    // replaces the old one's, and probes still arrive SNATed.
    let switched = match backend {
        Backend::Nft => Backend::IptablesLegacy,
        Backend::IptablesLegacy => Backend::Nft,
    };
    let rule2 = HostProbeRule::new(switched);
    let plan2 = HostProbeConfig::default_plan(rule2.probe_source(Some(KUBELET_UID)), false);
    in_ns(node, || {
        rule2.ensure(&plan2)?;
        rule2.add_pod_ips(&plan2, &[pod], "uid-a")
    })
    .unwrap();
    only(&w.world, switched);
    assert_eq!(seen_from(&ztunnel, node, &kubelet), (8080, snat));

    assert!(in_ns(node, remove_all_backends).unwrap());
    assert_eq!(holdings(&w.world), (String::new(), String::new()));
    assert!(!in_ns(node, remove_all_backends).unwrap());
}

#[test]
fn nft_host_rule_snats_probes_and_leaves_no_legacy_rule() {
    probes_are_snatted_on(Backend::Nft);
}

#[test]
fn legacy_host_rule_snats_probes_and_leaves_no_nft_table() {
    probes_are_snatted_on(Backend::IptablesLegacy);
}

/// What someone else may do to the host rule on the node, per backend: (what, command).
fn damage(backend: Backend) -> Vec<(&'static str, Vec<&'static str>)> {
    match backend {
        Backend::Nft => vec![
            (
                "the table deleted",
                vec!["nft", "delete", "table", "inet", "istio-ambient-nat"],
            ),
            (
                "the nat chain flushed",
                vec![
                    "nft",
                    "flush",
                    "chain",
                    "inet",
                    "istio-ambient-nat",
                    "postrouting",
                ],
            ),
        ],
        Backend::IptablesLegacy => vec![
            (
                "the node's nat table flushed",
                vec!["iptables-legacy", "-t", "nat", "-F"],
            ),
            (
                "the jump deleted",
                vec![
                    "iptables-legacy",
                    "-t",
                    "nat",
                    "-D",
                    "POSTROUTING",
                    "-j",
                    "ISTIO_POSTRT",
                ],
            ),
            (
                "the rule, jump and sets removed",
                vec![
                    "sh",
                    "-c",
                    "iptables-legacy -t nat -F && iptables-legacy -t nat -X ISTIO_POSTRT && ipset destroy",
                ],
            ),
        ],
    }
}

/// Someone else's rules on the node, which the check must not count as ours.
fn foreign_rules(node: &TestNetns, backend: Backend) {
    match backend {
        Backend::Nft => {
            for cmd in [
                "add table ip kube-proxy",
                "add chain ip kube-proxy postrouting { type nat hook postrouting priority srcnat; }",
                "add rule ip kube-proxy postrouting meta mark 0x4000 masquerade",
            ] {
                node.exec_ok("nft", &[cmd]).unwrap();
            }
        }
        Backend::IptablesLegacy => {
            for args in [
                vec!["-t", "nat", "-N", "KUBE-POSTROUTING"],
                vec!["-t", "nat", "-A", "POSTROUTING", "-j", "KUBE-POSTROUTING"],
                vec!["-t", "nat", "-N", "ISTIO_OTHER"],
                vec!["-t", "nat", "-A", "ISTIO_OTHER", "-j", "RETURN"],
            ] {
                node.exec_ok("iptables-legacy", &args).unwrap();
            }
        }
    }
}

/// `HostProbeRule::check` sees each kind of damage an admin or another agent can do to the
/// rule, ignores other rules on the node (kube-proxy's, another `ISTIO_*` chain), and
/// `ensure` after it brings back a rule that SNATs kubelet's probes again.
fn check_sees_damage_and_ensure_repairs(backend: Backend) {
    let (w, ztunnel, rule, plan) = pod_on_node(backend);
    let (node, pod) = (w.world.path(), IpAddr::V4(w.pod_v4));
    let kubelet = ConnectSpec::new(pod, 8080).uid(KUBELET_UID);
    let snatted = (8080, IpAddr::V4(HOST_PROBE_SNAT_V4));
    foreign_rules(&w.world, backend);
    // In sync, and kubelet's probe SNATed.
    let whole = |when: &str| {
        let drift = in_ns(node, || rule.check(&plan)).unwrap();
        assert_eq!(drift, Vec::<String>::new(), "{when}");
        assert_eq!(seen_from(&ztunnel, node, &kubelet), snatted, "{when}");
    };
    for (what, cmd) in damage(backend) {
        in_ns(node, || {
            rule.ensure(&plan)?;
            rule.add_pod_ips(&plan, &[pod], "uid-a")
        })
        .unwrap();
        whole(&format!("before: {what}"));
        w.world.exec_ok(cmd[0], &cmd[1..]).unwrap();
        let drift = in_ns(node, || rule.check(&plan)).unwrap();
        assert!(!drift.is_empty(), "{what}: not seen");
        assert_ne!(
            seen_from(&ztunnel, node, &kubelet),
            snatted,
            "{what}: no damage done"
        );
        in_ns(node, || {
            rule.ensure(&plan)?;
            rule.add_pods_ips(&plan, &[("uid-a", &[pod])])
        })
        .unwrap();
        whole(&format!("after: {what} ({drift:?})"));
    }
    // Nobody else's rule went with ours.
    match backend {
        Backend::Nft => assert!(
            w.world
                .exec_ok("nft", &["list", "table", "ip", "kube-proxy"])
                .is_ok()
        ),
        Backend::IptablesLegacy => {
            let save = w
                .world
                .exec_ok("iptables-legacy-save", &["-t", "nat"])
                .unwrap();
            assert!(
                save.contains(":ISTIO_OTHER") && save.contains(":KUBE-POSTROUTING"),
                "{save}"
            );
        }
    }
    in_ns(node, remove_all_backends).unwrap();
}

#[test]
fn nft_host_rule_damage_is_seen_and_repaired() {
    check_sees_damage_and_ensure_repairs(Backend::Nft);
}

#[test]
fn legacy_host_rule_damage_is_seen_and_repaired() {
    check_sees_damage_and_ensure_repairs(Backend::IptablesLegacy);
}

/// Adds `ip` to the node's probe set of its family by hand (as an admin, or an agent's missed
/// DEL, would leave it).
fn add_by_hand(node: &TestNetns, backend: Backend, ip: IpAddr) {
    let set = if ip.is_ipv6() {
        "istio-inpod-probes-v6"
    } else {
        "istio-inpod-probes-v4"
    };
    match backend {
        Backend::Nft => {
            let element = format!("{{ {ip} }}");
            let args = ["add", "element", "inet", "istio-ambient-nat", set, &element];
            node.exec_ok("nft", &args).unwrap();
        }
        Backend::IptablesLegacy => {
            node.exec_ok("ipset", &["add", set, &ip.to_string()])
                .unwrap();
        }
    }
}

/// `sync_pods_ips` makes the sets hold exactly the wanted pods' addresses (Istio's
/// `pruneHostIPset`): a stray element of each family (one left by an add, others added by
/// hand) is removed and returned, the wanted one stays and its probe is still SNATed, an
/// address taken out comes back, a second sync changes nothing, and no wanted pod empties the
/// sets.
fn sync_prunes_strays_and_keeps_the_wanted(backend: Backend) {
    let (w, ztunnel, rule, _) = pod_on_node(backend);
    let plan = HostProbeConfig::default_plan(rule.probe_source(Some(KUBELET_UID)), true);
    let (node, pod) = (w.world.path(), IpAddr::V4(w.pod_v4));
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let strays = [ip("10.99.0.7"), ip("10.99.0.8"), ip("fd00:99::8")];
    in_ns(node, || {
        rule.ensure(&plan)?;
        rule.add_pod_ips(&plan, &[pod], "uid-a")?;
        rule.add_pod_ips(&plan, &strays[..1], "uid-gone")
    })
    .unwrap();
    for s in &strays[1..] {
        add_by_hand(&w.world, backend, *s);
    }
    let sorted = |mut v: Vec<IpAddr>| {
        v.sort();
        v
    };
    let live = || sorted(in_ns(node, || rule.pod_ips(&plan)).unwrap());
    assert_eq!(live(), sorted([&[pod][..], &strays[..]].concat()));
    let wanted: [(&str, &[IpAddr]); 1] = [("uid-a", &[pod])];

    let removed = in_ns(node, || rule.sync_pods_ips(&plan, &wanted)).unwrap();
    assert_eq!(sorted(removed), strays);
    assert_eq!(live(), [pod]);
    let kubelet = ConnectSpec::new(pod, 8080).uid(KUBELET_UID);
    let snatted = (8080, IpAddr::V4(HOST_PROBE_SNAT_V4));
    assert_eq!(seen_from(&ztunnel, node, &kubelet), snatted);
    assert!(
        in_ns(node, || rule.sync_pods_ips(&plan, &wanted))
            .unwrap()
            .is_empty()
    );

    in_ns(node, || rule.remove_pod_ips(&plan, &[pod])).unwrap();
    assert!(live().is_empty());
    assert!(
        in_ns(node, || rule.sync_pods_ips(&plan, &wanted))
            .unwrap()
            .is_empty()
    );
    assert_eq!(live(), [pod]);
    assert_eq!(seen_from(&ztunnel, node, &kubelet), snatted);

    let removed = in_ns(node, || rule.sync_pods_ips(&plan, &[])).unwrap();
    assert_eq!(removed, [pod]);
    assert!(live().is_empty());
    in_ns(node, remove_all_backends).unwrap();
}

#[test]
fn nft_sync_prunes_stray_probe_addresses() {
    sync_prunes_strays_and_keeps_the_wanted(Backend::Nft);
}

#[test]
fn legacy_sync_prunes_stray_probe_addresses() {
    sync_prunes_strays_and_keeps_the_wanted(Backend::IptablesLegacy);
}
