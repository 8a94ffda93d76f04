//! Ambient pods with Istio's real ztunnel: the node agent (install-cni with
//! `AMBIENT_ENABLED=true`) programs each ambient pod's namespace and hands it to ztunnel over
//! ZDS; A → B goes over HBONE (ztunnel counts it with mutual TLS), a non-mesh destination is
//! passed through, a pod without the label is left alone, kubelet's probe reaches the app.

use crate::{Res, verdict};
use capture::ambient_constants::HOST_PROBE_SNAT_V4;
use std::net::IpAddr;
use std::time::Duration;
use testbed::Outcome;
use testbed::Probe;
use testbed::ambient::{
    APP_PORT, AmbientNode, AmbientOptions, KUBELET_UID, Mode, Pod, PodPlan, opened, tables,
};
use testbed::node::{GATEWAY_V4, wait_until};
use testbed::ztunnel::{
    INPOD_PORTS, hbone_labels, listening_tcp_ports, passthrough_labels, ztunnel_binary,
};

fn plans() -> [PodPlan; 3] {
    [
        PodPlan::new("a", [10, 88, 1, 10], Mode::Ambient),
        PodPlan::new("b", [10, 88, 1, 11], Mode::Ambient),
        PodPlan::new("plain", [10, 88, 1, 12], Mode::Plain),
    ]
}

pub fn run() -> Res<bool> {
    testbed::cni::require_cni_tools();
    let zt = ztunnel_binary()
        .ok_or("ztunnel missing: run integration/scripts/install-deps.sh without SKIP_ZTUNNEL")?;
    let [a, b, plain] = plans();
    let n = AmbientNode::start(&zt, &AmbientOptions::default(), &[a.clone(), b.clone()])?;
    println!(
        "== node agent ready, ztunnel ({}) connected over ZDS",
        zt.display()
    );
    let (Some(pa), Some(pb), Some(pp)) = (add(&n, &a)?, add(&n, &b)?, add(&n, &plain)?) else {
        return Ok(false);
    };
    let mut all_ok = print_enrolled(&n, &[&pa, &pb, &pp]);
    let _world = Probe::world(n.node.ns.path())?;
    println!("\n== connections (ztunnel's own counters confirm who carried what)\n");
    all_ok &= hbone(&n, &pa, &pb);
    all_ok &= passthrough(&n, &pa, &pp);
    all_ok &= probe(&n, &pa);
    all_ok &= explain_both(&n, &pa, &pb)?;
    all_ok &= release(&n, &[&pa, &pb, &pp]);
    Ok(all_ok)
}

/// Creates the pod and ADDs it through the chain; a failed ADD is a FAILED line, not a panic.
fn add(n: &AmbientNode, plan: &PodPlan) -> Res<Option<Pod>> {
    let pod = n.create_pod(plan)?;
    let run = n.add(&pod);
    if !run.ok {
        println!(
            "cnitool add {}: {}\n{}{}\n{}",
            plan.name,
            verdict(false),
            run.stdout,
            run.stderr,
            n.logs()
        );
        return Ok(None);
    }
    Ok(Some(pod))
}

/// ztunnel's in-pod ports that listen in the pod's namespace (15053: DNS).
fn ztunnel_ports(p: &Pod) -> String {
    let listening = listening_tcp_ports(p.ns.path()).unwrap_or_default();
    let ports: Vec<String> = INPOD_PORTS
        .iter()
        .filter(|port| listening.contains(port))
        .map(u16::to_string)
        .collect();
    if ports.is_empty() {
        "no".into()
    } else {
        format!("listening ({})", ports.join("/"))
    }
}

fn print_enrolled(n: &AmbientNode, pods: &[&Pod]) -> bool {
    println!(
        "\n{:<8} {:<12} {:<44} ztunnel in the pod",
        "pod", "ip", "tables"
    );
    let mut good = true;
    for p in pods {
        let ambient = p.plan.mode == Mode::Ambient;
        let tables = n.ambient_tables(p);
        let served = n.served(p);
        good &= served == ambient && tables.len() == if ambient { 3 } else { 0 };
        println!(
            "{:<8} {:<12} {:<44} {}",
            p.name(),
            p.ip(),
            tables.join(", "),
            ztunnel_ports(p)
        );
    }
    let set = n.probe_set();
    println!("node probe set istio-inpod-probes-v4: {set:?}");
    good && set.len() == 2
}

fn landed(what: &str, o: &Outcome, probe: &str, port: u16) -> bool {
    let good = o
        .landed()
        .is_some_and(|l| l.probe == probe && l.port == port);
    println!("{what:<52} {:<28} {}", o.to_string(), verdict(good));
    good
}

fn counted(what: &str, mut check: impl FnMut() -> bool) -> bool {
    let good = wait_until(Duration::from_secs(10), &mut check);
    println!("{what:<81} {}", verdict(good));
    good
}

/// A → B:8080, carried by ztunnel over HBONE with mutual TLS.
fn hbone(n: &AmbientNode, pa: &Pod, pb: &Pod) -> bool {
    let o = n.from_pod(pa, pb.ip(), APP_PORT);
    let good = landed("a -> b:8080", &o, "b", APP_PORT);
    let mtls = hbone_labels("a", "b");
    good & counted(
        "  ztunnel: a -> b opened with connection_security_policy=mutual_tls",
        || opened(n, &mtls) >= 1.0,
    )
}

/// A → a non-mesh address: through ztunnel's outbound, passed through to the original
/// destination; the plain pod's own traffic never meets ztunnel.
fn passthrough(n: &AmbientNode, pa: &Pod, pp: &Pod) -> bool {
    let gateway: IpAddr = GATEWAY_V4.parse().expect("address");
    let unknown = passthrough_labels("a");
    let before = opened(n, &unknown);
    let mut good = landed(
        "a -> outside 10.88.0.1:80 (not in the mesh)",
        &n.from_pod(pa, gateway, 80),
        "world",
        80,
    );
    good &= counted(
        "  ztunnel: passed through, destination_workload=unknown",
        || opened(n, &unknown) > before,
    );
    good &= landed(
        "plain -> outside 10.88.0.1:80 (pod not enrolled)",
        &n.from_pod(pp, gateway, 80),
        "world",
        80,
    );
    let plain = [("reporter", "source"), ("source_workload", "plain")];
    good & counted("  ztunnel: nothing from plain", || opened(n, &plain) == 0.0)
}

/// kubelet's probe (its uid, from the node) reaches A's app directly, from 169.254.7.127.
fn probe(n: &AmbientNode, pa: &Pod) -> bool {
    let o = n.from_node(KUBELET_UID, pa.ip(), APP_PORT);
    let good = landed("kubelet (uid 4242) probe -> a:8080", &o, "a", APP_PORT);
    let peer = pa.app.accepted().last().map(|c| c.peer.ip());
    let snat = peer == Some(IpAddr::V4(HOST_PROBE_SNAT_V4));
    println!(
        "  the app saw the probe from {peer:?} (the host probe rule's SNAT)              {}",
        verdict(snat)
    );
    good && snat
}

/// `explain` of A's connection to B (into ztunnel's outbound) and of kubelet's probe through
/// the node's host rule, each confirmed by the kernel's trace.
fn explain_both(n: &AmbientNode, pa: &Pod, pb: &Pod) -> Res<bool> {
    let bins = testbed::node::product_bin_dir()?;
    let pod_ns = pa.ns.path().display().to_string();
    let node_ns = n.node.ns.path().display().to_string();
    let to_b = format!("{}:{APP_PORT}", pb.ip());
    let to_a = format!("{}:{APP_PORT}", pa.ip());
    let kubelet = KUBELET_UID.to_string();
    let app = testbed::pods::APP_UID.to_string();
    let mut good = crate::explain(
        &bins,
        &[
            "--network-namespace",
            &pod_ns,
            "--dst",
            &to_b,
            "--uid",
            &app,
            "--gid",
            &app,
            "--trace",
        ],
    )?;
    good &= crate::explain(
        &bins,
        &[
            "--host",
            "--network-namespace",
            &node_ns,
            "--dst",
            &to_a,
            "--uid",
            &kubelet,
            "--gid",
            &kubelet,
            "--trace",
        ],
    )?;
    Ok(good)
}

/// DEL of every pod: ztunnel stops serving them, their rules and the node's probe rule go.
fn release(n: &AmbientNode, pods: &[&Pod]) -> bool {
    let mut good = true;
    for p in pods {
        good &= n.del(p).ok;
    }
    good &= pods
        .iter()
        .all(|p| n.not_served(p) && n.ambient_tables(p).is_empty());
    // The last pod took the node's host probe rule with it: its table, not only its set.
    let host_gone = tables(&n.node.ns)
        .iter()
        .all(|t| !t.contains("istio-ambient-nat"));
    println!(
        "\n== cnitool del of 3 pods: ztunnel released them, rules gone, node probe table gone: {}",
        verdict(good && host_gone)
    );
    good && host_gone
}
