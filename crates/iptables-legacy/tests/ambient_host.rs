//! Ambient's host rule with iptables-legacy on the real kernel: a "node" namespace (the world
//! side of a pod/world pair) gets Istio's legacy host rule (`nat ISTIO_POSTRT` + the ipsets
//! `istio-inpod-probes-v4/v6`); the pod gets ambient's in-pod rules (legacy too) and a
//! stand-in ztunnel. Real connections from the node as kubelet's uid and as another uid show
//! where probes land. The node never gets an nftables rule: every step checks `nft list
//! ruleset` is empty there.

use capture::ambient_constants::{HOST_PROBE_SNAT_V4, HOST_PROBE_SNAT_V6};
use capture::{AmbientConfig, HostProbeConfig, Plan, ProbeSource};
use iptables_legacy::{Tools, ambient_host};
use netns::NsLock;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testbed::host_probe::{KUBELET_UID, OTHER_UID, ZTUNNEL, in_ns, seen_from};
use testbed::*;

const V4: &str = "istio-inpod-probes-v4";
const V6: &str = "istio-inpod-probes-v6";

fn kubelet_plan(ipv6: bool) -> Plan {
    HostProbeConfig::default_plan(ProbeSource::KubeletUid(KUBELET_UID), ipv6)
}

/// Istio's own legacy host rule (`-m owner --socket-exists`): the goldens' payload.
fn istio_plan(ipv6: bool) -> Plan {
    HostProbeConfig::default_plan(ProbeSource::AnyLocalSocket, ipv6)
}

/// The node's nat table as iptables-legacy-save prints it, without comments and counters.
fn nat(ns: &TestNetns, v6: bool) -> String {
    let bin = if v6 {
        "ip6tables-legacy-save"
    } else {
        "iptables-legacy-save"
    };
    ns.exec_ok(bin, &["-t", "nat"])
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(" [").next().unwrap_or(l).to_string() + "\n")
        .collect()
}

/// `ipset save` of the node (sets and their elements with comments).
fn ipsets(ns: &TestNetns) -> String {
    ns.exec_ok("ipset", &["save"])
        .unwrap()
        .lines()
        // The hash seed differs per set: not part of what we wrote.
        .map(|l| l.split(" initval").next().unwrap_or(l).to_string() + "\n")
        .collect()
}

/// The members of `set` (`IP comment "uid"` lines), sorted.
fn members(ns: &TestNetns, set: &str) -> Vec<String> {
    let mut m: Vec<String> = ipsets(ns)
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("add {set} ")))
        .map(str::to_string)
        .collect();
    m.sort();
    m
}

/// The node holds no nftables rule, table or set of anyone's.
#[track_caller]
fn no_nft(ns: &TestNetns) {
    let rs = ns.exec_ok("nft", &["list", "ruleset"]).unwrap();
    assert!(rs.trim().is_empty(), "nftables on the node:\n{rs}");
}

fn held() -> NsLock {
    NsLock::current(&"test pod", Instant::now() + Duration::from_secs(10)).unwrap()
}

#[test]
fn kubelet_probes_are_snatted_in_both_families_and_reach_the_app() {
    require_root();
    let w = PodWorld::new().unwrap();
    let node = w.world.path();
    let (pod4, pod6) = (IpAddr::V4(w.pod_v4), IpAddr::V6(w.pod_v6.unwrap()));
    let inpod = Plan::ambient(&AmbientConfig {
        ipv6: true,
        ..AmbientConfig::default()
    })
    .unwrap();
    in_ns(w.pod.path(), || {
        iptables_legacy::apply(&inpod, &held(), &Tools::default())
    })
    .unwrap();
    let ztunnel = Probe::start(w.pod.path(), "pod", &ZTUNNEL).unwrap();
    let host = kubelet_plan(true);
    in_ns(node, || ambient_host::ensure(&host, &Tools::default())).unwrap();
    no_nft(&w.world);

    let node4 = IpAddr::V4(w.world_v4);
    let node6 = IpAddr::V6(w.world_v6.unwrap());
    let (snat4, snat6) = (
        IpAddr::V4(HOST_PROBE_SNAT_V4),
        IpAddr::V6(HOST_PROBE_SNAT_V6),
    );
    let kubelet = |ip| ConnectSpec::new(ip, 8080).uid(KUBELET_UID);
    let other = |ip| ConnectSpec::new(ip, 8080).uid(OTHER_UID);
    // Pods not (yet) in the sets: nothing is SNATed, inbound goes to ztunnel.
    assert_eq!(seen_from(&ztunnel, node, &kubelet(pod4)), (15006, node4));
    assert_eq!(seen_from(&ztunnel, node, &kubelet(pod6)), (15006, node6));

    for _ in 0..2 {
        // Adding twice is harmless.
        in_ns(node, || {
            ambient_host::add_pod_ips(&host, &[pod4, pod6], "uid-a", &Tools::default())
        })
        .unwrap();
    }
    no_nft(&w.world);
    for (pod, snat, node_ip) in [(pod4, snat4, node4), (pod6, snat6, node6)] {
        eprintln!("probing {pod}");
        // Kubelet's probe: SNATed on the node, so the in-pod rules let it reach the app.
        assert_eq!(seen_from(&ztunnel, node, &kubelet(pod)), (8080, snat));
        // Another uid: not a probe, through ztunnel with its own address.
        assert_eq!(seen_from(&ztunnel, node, &other(pod)), (15006, node_ip));
    }

    // Re-ensuring (an agent restart) keeps the members and writes the same rules.
    let before = (nat(&w.world, false), nat(&w.world, true), ipsets(&w.world));
    in_ns(node, || ambient_host::ensure(&host, &Tools::default())).unwrap();
    let after = (nat(&w.world, false), nat(&w.world, true), ipsets(&w.world));
    assert_eq!(before, after);
    assert_eq!(seen_from(&ztunnel, node, &kubelet(pod6)), (8080, snat6));

    for _ in 0..2 {
        // Removing twice (a repeated DEL) is harmless.
        in_ns(node, || {
            ambient_host::remove_pod_ips(&host, &[pod4, pod6], &Tools::default())
        })
        .unwrap();
    }
    assert_eq!(seen_from(&ztunnel, node, &kubelet(pod4)), (15006, node4));
    assert_eq!(seen_from(&ztunnel, node, &kubelet(pod6)), (15006, node6));
    no_nft(&w.world);

    assert!(in_ns(node, || ambient_host::remove_all(&Tools::default())).unwrap());
    assert!(!in_ns(node, || ambient_host::remove_all(&Tools::default())).unwrap());
    for v6 in [false, true] {
        let t = nat(&w.world, v6);
        assert!(!t.contains("ISTIO_POSTRT"), "{t}");
    }
    assert_eq!(ipsets(&w.world), "");
    no_nft(&w.world);
}

/// Istio's own rule (`--socket-exists`, the goldens' payload): every local process's
/// connection to an ambient pod is a probe, whatever its uid; and what iptables is fed on a
/// fresh node is exactly Istio's golden, byte for byte.
#[test]
fn istios_rule_is_fed_byte_for_byte_and_snats_every_local_socket() {
    require_root();
    let w = PodWorld::ipv4_only().unwrap();
    let (node, pod) = (w.world.path(), IpAddr::V4(w.pod_v4));
    let app = Probe::start(w.pod.path(), "pod", &[Listen::tcp(8080)]).unwrap();
    let dir = std::env::temp_dir().join(format!("legacy-host-feed-{}", std::process::id()));
    let tools = recording_tools(&dir);
    let host = istio_plan(true);
    in_ns(node, || {
        ambient_host::ensure(&host, &tools)?;
        ambient_host::add_pod_ips(&host, &[pod], "pod-uid", &tools)
    })
    .unwrap();
    let fed = |bin: &str| std::fs::read_to_string(dir.join(format!("{bin}.in"))).unwrap();
    let golden = |name: &str| {
        let text =
            std::fs::read_to_string(golden::golden_dir().join("iptables/cni-ambient").join(name))
                .unwrap();
        text.lines()
            .filter(|l| *l != "iptables-save" && *l != "ip6tables-save")
            .map(|l| l.to_string() + "\n")
            .collect::<String>()
    };
    let both = fed("iptables-legacy-restore") + &fed("ip6tables-legacy-restore");
    assert_eq!(both, golden("hostprobe_ipv6.golden"));
    for uid in [0, OTHER_UID, KUBELET_UID] {
        let spec = ConnectSpec::new(pod, 8080).uid(uid);
        let snat = IpAddr::V4(HOST_PROBE_SNAT_V4);
        assert_eq!(seen_from(&app, node, &spec), (8080, snat), "uid {uid}");
    }
    no_nft(&w.world);
    let _ = std::fs::remove_dir_all(dir);
}

/// Tools whose restores record their input in `<dir>/<binary>.in`, then run the real ones.
fn recording_tools(dir: &Path) -> Tools {
    std::fs::create_dir_all(dir).unwrap();
    for bin in ["iptables-legacy-restore", "ip6tables-legacy-restore"] {
        let real = Tools::default().find(bin).unwrap();
        let script = format!(
            "#!/bin/sh\ncat > {in_} && exec {real} \"$@\" < {in_}\n",
            in_ = dir.join(format!("{bin}.in")).display(),
            real = real.display()
        );
        let path = dir.join(bin);
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut dirs = vec![dir.to_path_buf()];
    dirs.extend(Tools::default().search_dirs);
    Tools::in_dirs(dirs)
}

#[test]
fn set_members_follow_pods_in_both_families_with_their_uids() {
    require_root();
    let node = TestNetns::with_prefix("lhost-sets").unwrap();
    let host = istio_plan(true);
    let ips = |s: &[&str]| -> Vec<IpAddr> { s.iter().map(|i| i.parse().unwrap()).collect() };
    in_ns(node.path(), || {
        ambient_host::ensure(&host, &Tools::default())?;
        ambient_host::add_pod_ips(
            &host,
            &ips(&["10.1.0.5", "fd00::5"]),
            "uid-a",
            &Tools::default(),
        )?;
        ambient_host::add_pod_ips(&host, &ips(&["10.1.0.6"]), "uid-b", &Tools::default())?;
        // An IPv4-mapped IPv6 address is the IPv4 address (Istio's `Unmap`).
        ambient_host::add_pod_ips(
            &host,
            &ips(&["::ffff:10.1.0.7"]),
            "uid-c",
            &Tools::default(),
        )
    })
    .unwrap();
    assert_eq!(
        members(&node, V4),
        [
            "10.1.0.5 comment \"uid-a\"",
            "10.1.0.6 comment \"uid-b\"",
            "10.1.0.7 comment \"uid-c\""
        ]
    );
    assert_eq!(members(&node, V6), ["fd00::5 comment \"uid-a\""]);
    let sets = ipsets(&node);
    assert!(
        sets.contains(&format!("create {V4} hash:ip family inet "))
            && sets.contains(&format!("create {V6} hash:ip family inet6 ")),
        "{sets}"
    );
    // Pod a goes (a mix of present and absent IPs): b and c stay.
    let gone = ips(&["10.1.0.5", "fd00::5", "10.9.9.9"]);
    in_ns(node.path(), || {
        ambient_host::remove_pod_ips(&host, &gone, &Tools::default())
    })
    .unwrap();
    assert_eq!(
        members(&node, V4),
        ["10.1.0.6 comment \"uid-b\"", "10.1.0.7 comment \"uid-c\""]
    );
    assert!(members(&node, V6).is_empty());

    // A UID that would break out of the comment is refused, nothing added.
    for bad in ["x\" -exist\nflush istio-inpod-probes-v4 \"", "a\u{1}b"] {
        let err = in_ns(node.path(), || {
            ambient_host::add_pod_ips(&host, &ips(&["10.1.0.8"]), bad, &Tools::default())
        })
        .unwrap_err();
        assert!(err.to_string().contains("ipset comment"), "{err}");
    }
    assert_eq!(members(&node, V4).len(), 2);

    // IPv6 off: no v6 set (the one of before is destroyed with its rule), v6 IPs skipped.
    let v4_only = istio_plan(false);
    in_ns(node.path(), || {
        ambient_host::ensure(&v4_only, &Tools::default())?;
        ambient_host::add_pod_ips(
            &v4_only,
            &ips(&["10.1.0.9", "fd00::9"]),
            "uid-d",
            &Tools::default(),
        )
    })
    .unwrap();
    let sets = ipsets(&node);
    assert!(!sets.contains(V6) && sets.contains("10.1.0.9"), "{sets}");
    assert!(!nat(&node, true).contains("ISTIO_POSTRT"));
    no_nft(&node);
}

#[test]
fn foreign_chains_on_the_node_are_never_touched() {
    require_root();
    let node = TestNetns::with_prefix("lhost-foreign").unwrap();
    // kube-proxy-like chains and another ISTIO_ chain, with jumps from built-in chains.
    let foreign = "*nat\n:KUBE-POSTROUTING - [0:0]\n:KUBE-SERVICES - [0:0]\n:ISTIO_OTHER - [0:0]\n-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n-A OUTPUT -j KUBE-SERVICES\n-A POSTROUTING -j ISTIO_OTHER\n-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE\n-A ISTIO_OTHER -p tcp -j RETURN\nCOMMIT\n";
    for bin in ["iptables-legacy-restore", "ip6tables-legacy-restore"] {
        node.run(|| pipe(bin, &["--noflush"], foreign)).unwrap();
    }
    let theirs = |v6: bool| -> Vec<String> {
        nat(&node, v6)
            .lines()
            .filter(|l| !l.contains("ISTIO_POSTRT"))
            .map(String::from)
            .collect()
    };
    let before = (theirs(false), theirs(true));
    let host = istio_plan(true);
    in_ns(node.path(), || {
        ambient_host::ensure(&host, &Tools::default())?;
        ambient_host::ensure(&host, &Tools::default())?;
        ambient_host::add_pod_ips(
            &host,
            &["10.1.0.5".parse().unwrap()],
            "uid-a",
            &Tools::default(),
        )
    })
    .unwrap();
    let with_ours = nat(&node, false);
    // Ours is jumped to first, before kube-proxy's.
    let first = with_ours.lines().find(|l| l.starts_with("-A POSTROUTING"));
    assert_eq!(first, Some("-A POSTROUTING -j ISTIO_POSTRT"), "{with_ours}");
    assert_eq!((theirs(false), theirs(true)), before);
    assert!(in_ns(node.path(), || ambient_host::remove_all(&Tools::default())).unwrap());
    assert_eq!((theirs(false), theirs(true)), before);
    assert!(!nat(&node, false).contains("ISTIO_POSTRT"));
    no_nft(&node);
}

/// Runs `bin args` in the calling thread's namespace with `input` on stdin.
fn pipe(bin: &str, args: &[&str], input: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new(bin)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "{bin} failed");
}

#[test]
fn concurrent_pods_end_with_exactly_the_expected_members() {
    require_root();
    let node = TestNetns::with_prefix("lhost-conc").unwrap();
    let host = istio_plan(true);
    in_ns(node.path(), || {
        ambient_host::ensure(&host, &Tools::default())
    })
    .unwrap();
    const THREADS: u8 = 4;
    const ROUNDS: u8 = 6;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (host, path) = (&host, node.path());
            s.spawn(move || {
                for r in 0..ROUNDS {
                    let ips: Vec<IpAddr> = vec![
                        format!("10.2.{t}.{r}").parse().unwrap(),
                        format!("fd00::{t}:{r}").parse().unwrap(),
                    ];
                    let uid = format!("uid-{t}-{r}");
                    in_ns(path, || {
                        ambient_host::add_pod_ips(host, &ips, &uid, &Tools::default())
                    })
                    .unwrap();
                    // Every other pod leaves again.
                    if r % 2 == 1 {
                        in_ns(path, || {
                            ambient_host::remove_pod_ips(host, &ips, &Tools::default())
                        })
                        .unwrap();
                    }
                }
            });
        }
    });
    let mut want4 = Vec::new();
    let mut want6 = Vec::new();
    for t in 0..THREADS {
        for r in (0..ROUNDS).filter(|r| r % 2 == 0) {
            want4.push(format!("10.2.{t}.{r} comment \"uid-{t}-{r}\""));
            let v6: std::net::Ipv6Addr = format!("fd00::{t}:{r}").parse().unwrap();
            want6.push(format!("{v6} comment \"uid-{t}-{r}\""));
        }
    }
    want4.sort();
    want6.sort();
    assert_eq!(members(&node, V4), want4);
    assert_eq!(members(&node, V6), want6);
    no_nft(&node);
}

/// The host rule's restores wait for the node-wide xtables lock kubelet and kube-proxy hold
/// (`/run/xtables.lock`) instead of writing while they do.
#[test]
fn the_host_rule_waits_for_the_nodes_xtables_lock() {
    require_root();
    let node = TestNetns::with_prefix("lhost-lock").unwrap();
    let lock = Tools::default().node_xtables_lock;
    assert_eq!(lock, PathBuf::from(iptables_legacy::NODE_XTABLES_LOCK));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .unwrap();
    // Taken here, before anything else runs: the holder thread only keeps it, then lets go.
    // SAFETY: flock on a file we own.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) },
        0
    );
    let held = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let releasing = Instant::now();
        drop(file);
        releasing
    });
    in_ns(node.path(), || {
        ambient_host::ensure(&istio_plan(false), &Tools::default())
    })
    .unwrap();
    let done = Instant::now();
    let releasing = held.join().unwrap();
    assert!(
        done > releasing,
        "the host rule was written {:?} before the node's lock was released",
        releasing - done
    );
    assert!(nat(&node, false).contains("-A POSTROUTING -j ISTIO_POSTRT"));
    in_ns(node.path(), || ambient_host::remove_all(&Tools::default())).unwrap();
    no_nft(&node);
}

/// Without `ipset`, the host rule is refused naming it, and no iptables table is created.
#[test]
fn a_missing_ipset_is_named_and_creates_nothing() {
    require_root();
    let node = TestNetns::with_prefix("lhost-noipset").unwrap();
    let dir = std::env::temp_dir().join(format!("legacy-host-noipset-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for bin in [
        "iptables-legacy-restore",
        "ip6tables-legacy-restore",
        "iptables-legacy-save",
        "ip6tables-legacy-save",
    ] {
        let real = Tools::default().find(bin).unwrap();
        let _ = std::fs::remove_file(dir.join(bin));
        std::os::unix::fs::symlink(real, dir.join(bin)).unwrap();
    }
    let tools = Tools::in_dirs([&dir]);
    let err = in_ns(node.path(), || {
        ambient_host::ensure(&istio_plan(true), &tools)
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("ipset not found") && err.contains("install ipset"),
        "{err}"
    );
    let tables = node.run(iptables_legacy::instantiated_ipv4_tables).unwrap();
    assert!(tables.is_empty(), "{tables:?}");
    // Nothing of ours there: removing without ipset is not an error.
    assert!(!in_ns(node.path(), || ambient_host::remove_all(&tools)).unwrap());
    no_nft(&node);
    let _ = std::fs::remove_dir_all(dir);
}
