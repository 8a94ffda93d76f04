//! Ambient mode under a real container runtime: Debian's containerd 1.6 runs the install-cni
//! image as the chart's ambient DaemonSet (`deploy/manifests/istio-cni-ambient.yaml`: the node
//! agent, with the chart's mounts for the run dir, `/var/run/ztunnel`, the runtime's netns dir
//! and the host's /proc, and its securityContext); a REAL ztunnel on the node connects to the
//! agent's ZDS socket; containerd calls the chain (bridge + host-local, portmap, istio-cni) for
//! every RunPodSandbox. See `integration::cri::ambient` for the rig.
//!
//! What it proves: RunPodSandbox of a pod labelled `istio.io/dataplane-mode=ambient` and of a
//! pod whose namespace has the label returns with the in-pod rules and ztunnel's listeners
//! (15001/15006/15008/15053) inside the sandbox's netns; a plain pod beside them is left alone;
//! A -> B between two sandboxes is carried over HBONE (B's ztunnel counts it as mutual TLS,
//! B's app sees A's address); containerd SIGKILLed and restarted, the agent's container
//! SIGKILLed and restarted by "kubelet" (the new agent finds the pods through the host's /proc),
//! and the agent's pod replaced (SIGTERM: an uninstall, then a new pod) leave the running
//! sandboxes served (rules untouched, connections still through ztunnel, which restarts no
//! proxy) and a sandbox started afterwards is served too; Stop +
//! Remove release a pod (ztunnel's listeners and the rules gone, out of the node's probe set,
//! lease released), and the last one takes the host probe rule with it.
//!
//! Needs root, Debian's containerd, runc and buildah, cnitool and the ztunnel binary
//! (`integration/scripts/install-deps.sh`); under `CI=true` nothing skips.

use capture::ambient_constants::{HOST_PROBE_SNAT_V4, PROBE_SET_V4};
use integration::ConnectSpec;
use integration::ambient::{ipsets, legacy_save, probe_ipset};
use integration::cri::ambient::{
    AmbientRuntime, AmbientSandbox, Enroll, NetnsHandle, Plans, istio_tables, not_served, served,
};
use integration::host_probe::{LEGACY_HOST_RULE, seen_from};
use integration::ztunnel::ztunnel_binary;
use std::net::IpAddr;
use std::time::{Duration, Instant};

const APP: u16 = integration::cri::ambient::APP_PORT;

/// The pod each process in the namespace `netns` belongs to by its cgroups
/// (`node_view::cgroup`), one entry per distinct answer.
fn cgroup_pods(netns: &std::path::Path) -> Vec<Option<String>> {
    let ino = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .ok()
    };
    let want = ino(netns);
    let mut pods: Vec<Option<String>> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| want.is_some() && ino(&e.path().join("ns/net")) == want)
        .map(|e| {
            let text = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
            node_view::cgroup::pod_uid(&text)
        })
        .collect();
    pods.sort();
    pods.dedup();
    pods
}

/// A -> B lands on B's app from A's own address, and B's ztunnel counts one more mutual-TLS
/// (HBONE) connection from A.
#[track_caller]
fn hbone(n: &AmbientRuntime, a: &AmbientSandbox, b: &AmbientSandbox) {
    let before = n.hbone_count(&a.plan.name, &b.plan.name);
    let o = n.connect(a, b.ip(), APP);
    match o.landed() {
        Some(l) if l.probe == b.plan.name && l.port == APP => {}
        _ => panic!(
            "{} -> {}:{APP}: {o}\n{}",
            a.plan.name,
            b.plan.name,
            n.logs()
        ),
    }
    let peer = b.app.accepted().last().map(|c| c.peer.ip());
    assert_eq!(
        peer,
        Some(a.ip()),
        "{}'s app saw the wrong peer",
        b.plan.name
    );
    n.eventually(
        &format!(
            "{} -> {} counted by ztunnel as mutual TLS",
            a.plan.name, b.plan.name
        ),
        || n.hbone_count(&a.plan.name, &b.plan.name) > before,
    );
}

/// Served by ztunnel, with exactly `tables` in its netns.
#[track_caller]
fn assert_served(n: &AmbientRuntime, s: &AmbientSandbox, tables: &[String]) {
    assert!(
        served(s.netns()),
        "{} not served\n{}",
        s.plan.name,
        n.logs()
    );
    assert_eq!(istio_tables(s.netns()), tables, "{}", s.plan.name);
}

#[test]
fn containerd_runs_the_ambient_agent_and_ambient_pods_talk_hbone_through_restarts() {
    integration::require_root();
    let Some(zt_bin) = ztunnel_binary() else {
        return;
    };
    let t0 = Instant::now();
    let mut plans = Plans::new();
    let a = plans.pod("a", Enroll::PodLabel);
    let b = plans.pod("b", Enroll::NamespaceLabel);
    let plain = plans.pod("plain", Enroll::None);
    let refused = plans.pod("refused", Enroll::PodLabel);
    let late = plans.pod("late", Enroll::PodLabel);
    let pause = integration::cri::images::pause_binary();
    let pause = pause.as_path();
    let workloads = [a.clone(), b.clone(), late.clone()];
    let mut n = AmbientRuntime::start(pause, &zt_bin, plans.range(), &workloads).unwrap();
    let started = t0.elapsed();

    // RunPodSandbox returned after ztunnel took each ambient pod: listeners and rules are
    // there at once (no polling). The plain pod has neither.
    let sa = n.run_ok(&a);
    let sb = n.run_ok(&b);
    let sp = n.run_ok(&plain);
    // The chart's defaults (DNS capture on): ambient's three tables, nothing else of ours.
    let tables = istio_tables(sa.netns());
    let mut sorted = tables.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "inet istio-ambient-mangle",
            "inet istio-ambient-nat",
            "inet istio-ambient-raw"
        ],
        "{}",
        n.logs()
    );
    assert_served(&n, &sa, &tables);
    assert_served(&n, &sb, &tables);
    // containerd put each sandbox in its pod's cgroup, as kubelet asks: the agent pairs
    // namespaces to pods by it (after its restart below, finding A and B again).
    for (s, plan) in [(&sa, &a), (&sb, &b)] {
        let uid = integration::cri::pod_uid(plan.namespace(), &plan.name);
        assert_eq!(cgroup_pods(s.netns()), [Some(uid)], "{}", plan.name);
    }
    assert!(not_served(sp.netns()), "the plain pod is served");
    assert!(
        istio_tables(sp.netns()).is_empty(),
        "{:?}",
        istio_tables(sp.netns())
    );
    assert_eq!(n.probe_set(), [sa.ip(), sb.ip()]);
    assert_eq!(
        (n.proxies_started(), n.active_proxies()),
        (2.0, 2.0),
        "{}",
        n.logs()
    );

    // A -> B and B -> A over HBONE; the plain pod reaches B (B's inbound capture) but is
    // never a ztunnel source.
    hbone(&n, &sa, &sb);
    hbone(&n, &sb, &sa);
    let o = n.connect(&sp, sb.ip(), APP);
    assert_eq!(o.landed().map(|l| l.probe.as_str()), Some("b"), "{o}");

    // containerd crashes and comes back: the sandboxes and the agent's container keep
    // running; nothing is re-programmed, everything is still served.
    n.restart_containerd().unwrap();
    for s in [&sa, &sb] {
        let net = n.rn.cri.pod_net(&s.sandbox.id).unwrap();
        assert!(
            net.ready,
            "{} not ready after containerd's restart",
            s.plan.name
        );
        assert_served(&n, s, &tables);
    }
    hbone(&n, &sa, &sb);
    assert_eq!((n.proxies_started(), n.active_proxies()), (2.0, 2.0));

    // The agent's container crashes (SIGKILL). Meanwhile an ambient pod cannot start: the
    // plugin's ADD fails naming the agent's socket (kubelet retries), containerd runs the DELs,
    // nothing is left (lease, netns mount); A and B stay served by ztunnel.
    let snapshots = n.snapshots();
    let (leases, mounts) = (n.rn.leases(), n.rn.containerd.netns_mounts().len());
    let old_log = n.rn.crash_install_cni().unwrap();
    let err = n
        .run(&refused)
        .err()
        .expect("an ambient pod started without the agent");
    assert!(
        err.message().contains("pluginevent.sock") && err.message().contains("not reachable"),
        "{}",
        err.message()
    );
    assert_eq!(n.rn.leases(), leases, "a lease was left behind");
    assert_eq!(n.rn.containerd.netns_mounts().len(), mounts);
    hbone(&n, &sa, &sb);
    // kubelet restarts the container: the new agent finds A and B through the host's /proc
    // and sends them in its snapshot, so ztunnel keeps them.
    n.rn.restart_install_cni().unwrap();
    n.eventually("ztunnel took the restarted agent's snapshot", || {
        n.snapshots() > snapshots
    });
    std::thread::sleep(Duration::from_millis(500));
    for s in [&sa, &sb] {
        assert_served(&n, s, &tables);
    }
    assert_eq!(n.probe_set(), [sa.ip(), sb.ip()], "old agent:\n{old_log}");
    hbone(&n, &sa, &sb);
    // It found A's and B's namespaces through the host's /proc (neither merely kept; the
    // refused pod, still Pending without an IP, is the only one it could not locate), and
    // ztunnel took them as the same pods: no proxy restarted.
    let log = n.rn.install_cni_log();
    assert!(log.contains("ambient node agent started pods=2"), "{log}");
    let not_found: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("namespace not found"))
        .collect();
    assert!(
        not_found.len() == 1 && not_found[0].contains("pod=default/refused"),
        "{not_found:?}"
    );
    assert_eq!((n.proxies_started(), n.active_proxies()), (2.0, 2.0));

    // The agent's pod is replaced (SIGTERM; with no DaemonSet left to find it uninstalls: the
    // plugin and the host probe rule go), and a new pod starts: ztunnel serves A and B all
    // along, and the new agent takes them back without restarting a proxy.
    let snapshots = n.snapshots();
    let old_log = n.replace_agent().unwrap();
    assert!(old_log.contains("removing the install"), "{old_log}");
    n.eventually("ztunnel took the new agent pod's snapshot", || {
        n.snapshots() > snapshots
    });
    for s in [&sa, &sb] {
        assert_served(&n, s, &tables);
    }
    assert_eq!(n.probe_set(), [sa.ip(), sb.ip()]);
    assert_eq!((n.proxies_started(), n.active_proxies()), (2.0, 2.0));
    hbone(&n, &sb, &sa);

    // A pod started after the restarts is served and talks HBONE both ways.
    let sl = n.run_ok(&late);
    assert_served(&n, &sl, &tables);
    assert_eq!((n.proxies_started(), n.active_proxies()), (3.0, 3.0));
    hbone(&n, &sl, &sb);
    hbone(&n, &sa, &sl);

    // Stop + Remove B: ztunnel lets go of its netns (DelWorkload), its rules go, it leaves
    // the probe set; A and the late pod are untouched. The handle keeps B's namespace
    // alive (the runtime deletes its netns file) so its state can still be read.
    let b_ns = NetnsHandle::open(sb.netns()).unwrap();
    n.rn.stop_and_remove(&sb.sandbox).unwrap();
    n.eventually("ztunnel gone from B after Stop + Remove", || {
        not_served(&b_ns.path())
    });
    assert!(
        istio_tables(&b_ns.path()).is_empty(),
        "{:?}",
        istio_tables(&b_ns.path())
    );
    assert_eq!(n.probe_set(), [sa.ip(), sl.ip()]);
    assert_eq!(n.active_proxies(), 2.0);
    assert_served(&n, &sa, &tables);
    hbone(&n, &sl, &sa);

    // Everything stopped and removed: every lease released, nothing in ztunnel, and the
    // last ambient pod took the node's probe rule with it.
    let handles: Vec<NetnsHandle> = [&sa, &sl]
        .iter()
        .map(|s| NetnsHandle::open(s.netns()).unwrap())
        .collect();
    for s in [&sa, &sp, &sl] {
        n.rn.stop_and_remove(&s.sandbox).unwrap();
    }
    assert_eq!(n.rn.leases(), 0, "leases left after Stop + Remove");
    for h in &handles {
        n.eventually("ztunnel gone after Stop + Remove", || not_served(&h.path()));
        assert!(istio_tables(&h.path()).is_empty());
    }
    n.eventually("ztunnel runs no proxy", || n.active_proxies() == 0.0);
    n.eventually("the host probe rule removed with the last pod", || {
        n.probe_set().is_empty()
            && !n
                .rn
                .node
                .ns
                .exec_ok("nft", &["list", "tables"])
                .unwrap_or_default()
                .contains("istio-ambient")
    });
    let addrs: Vec<IpAddr> = [&sa, &sb, &sl].iter().map(|s| s.ip()).collect();
    eprintln!(
        "cri_ambient: agent + ztunnel up in {:.1} s; pods {addrs:?} served through a containerd \
         restart, an agent crash and an agent pod replacement, released by Stop + Remove; \
         total {:.1} s",
        started.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

/// The same image and chart on an iptables-legacy node (`REDIRECT_BACKEND=iptables-legacy`):
/// the agent's container writes the pods' in-pod rules and Istio's legacy host probe rule with
/// the image's own iptables-legacy and ipset (Debian's, `deploy/scripts/stage-legacy-tools.sh`),
/// under the chart's NET_RAW and the node's xtables lock (hostPath `/run/xtables.lock`; the
/// root filesystem is read-only). No nftables table of ours anywhere; the set follows the pods
/// and the last Stop + Remove takes rule and sets with it.
#[test]
fn containerd_runs_the_ambient_agent_on_an_iptables_legacy_node_with_the_images_tools() {
    integration::require_root();
    let Some(zt_bin) = ztunnel_binary() else {
        return;
    };
    let mut plans = Plans::new();
    let a = plans.pod("a", Enroll::PodLabel);
    let b = plans.pod("b", Enroll::NamespaceLabel);
    let pause = integration::cri::images::pause_binary();
    let pause = pause.as_path();
    let legacy = vec![("REDIRECT_BACKEND", "iptables-legacy")];
    let n = AmbientRuntime::start_with(
        pause,
        &zt_bin,
        plans.range(),
        &[a.clone(), b.clone()],
        legacy,
    )
    .unwrap();
    let node = n.rn.node.ns.path().to_path_buf();
    let (sa, sb) = (n.run_ok(&a), n.run_ok(&b));

    // In-pod rules: iptables-legacy, written from inside the container; no nftables of ours.
    for s in [&sa, &sb] {
        assert!(
            served(s.netns()),
            "{} not served\n{}",
            s.plan.name,
            n.logs()
        );
        let save = legacy_save(s.netns(), false);
        assert!(
            save.contains(":ISTIO_PRERT") && save.contains(":ISTIO_OUTPUT"),
            "{}: {save}\n{}",
            s.plan.name,
            n.logs()
        );
        assert!(istio_tables(s.netns()).is_empty(), "{}", s.plan.name);
    }
    // The host rule: Istio's legacy one with its ipset holding exactly A and B.
    let host = legacy_save(&node, false);
    assert!(host.contains(LEGACY_HOST_RULE), "{host}\n{}", n.logs());
    assert!(istio_tables(&node).is_empty(), "{:?}", istio_tables(&node));
    let members = || {
        let mut m: Vec<IpAddr> = probe_ipset(&n.rn.node.ns, PROBE_SET_V4)
            .into_iter()
            .map(|(ip, _)| ip)
            .collect();
        m.sort();
        m
    };
    assert_eq!(members(), [sa.ip(), sb.ip()]);

    // A node-local probe reaches A's app from the probe address; A -> B goes over HBONE.
    let spec = ConnectSpec::new(sa.ip(), APP).timeout(Duration::from_secs(5));
    assert_eq!(
        seen_from(&sa.app, &node, &spec),
        (APP, IpAddr::V4(HOST_PROBE_SNAT_V4))
    );
    hbone(&n, &sa, &sb);

    // Stop + Remove B: out of the set; then A: rule, jump and sets gone with the last pod.
    let b_ns = NetnsHandle::open(sb.netns()).unwrap();
    n.rn.stop_and_remove(&sb.sandbox).unwrap();
    n.eventually("B out of the probe ipset", || members() == [sa.ip()]);
    assert!(!legacy_save(&b_ns.path(), false).contains("ISTIO_"));
    n.rn.stop_and_remove(&sa.sandbox).unwrap();
    n.eventually(
        "the legacy host rule and its sets removed with the last pod",
        || ipsets(&n.rn.node.ns).is_empty() && !legacy_save(&node, false).contains("ISTIO_POSTRT"),
    );
    assert!(istio_tables(&node).is_empty());
}
