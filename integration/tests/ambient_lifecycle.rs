//! An ambient pod's life at its edges, with the real ztunnel (the rig of `ambient.rs`): a pod
//! draining through its grace period, a pod that left ambient while no agent ran, a DEL of an
//! old sandbox of a pod already served in its new one, and ztunnel's own pod. Each case is
//! Istio's behaviour, and each failed before its fix (the agent released the terminating pod
//! at once; left the former ambient pod's rules in place with ztunnel no longer serving it;
//! released the new sandbox on the old one's DEL; enrolled ztunnel's pod).
//!
//! Needs root, cnitool, the product's binaries and the ztunnel binary; under `CI=true`
//! nothing skips.

use integration::ambient::{
    AmbientNode, AmbientOptions, Mode, NODE_NAME, OTHER_UID, POD_NAMESPACE, PodPlan, lands,
    link_process, sleep_binary, spawn_in, tables,
};
use integration::cni::require_cni_tools;
use integration::node::{GATEWAY_V4, wait_until};
use integration::pods::{DemoPod, PodKind};
use integration::ztunnel::ztunnel_binary;
use integration::{Listen, Probe, TestNetns};
use serde_json::json;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const APP: u16 = integration::ambient::APP_PORT;

fn ztunnel() -> Option<PathBuf> {
    require_cni_tools();
    ztunnel_binary()
}

/// A pod keeps being served while it terminates (Istio removes a pod when its phase is
/// terminal or it is deleted): connections to and from it still go through ztunnel.
#[test]
fn a_terminating_pod_is_served_until_its_containers_are_done() {
    let Some(bin) = ztunnel() else { return };
    let (a, b) = (
        PodPlan::new("drain", [10, 88, 30, 10], Mode::Ambient),
        PodPlan::new("peer", [10, 88, 30, 11], Mode::Ambient),
    );
    let n = AmbientNode::start(&bin, &AmbientOptions::default(), &[a.clone(), b.clone()]).unwrap();
    let (pa, pb) = (n.start_pod(&a), n.start_pod(&b));
    let mut json = n.kube().pod("default", "drain").unwrap();
    json["metadata"]["deletionTimestamp"] = "2026-11-27T03:30:00Z".into();
    json["metadata"]["deletionGracePeriodSeconds"] = 30.into();
    n.kube().modify(json.clone());
    // A pass of the agent's loop (events, the 5 s retry) would have released it by now.
    std::thread::sleep(Duration::from_secs(2));
    assert!(n.served(&pa), "released while terminating\n{}", n.logs());
    assert_eq!(n.ambient_tables(&pa).len(), 3, "{}", n.logs());
    assert!(n.probe_set().contains(&pa.ip()), "{:?}", n.probe_set());
    lands(&n, &n.from_pod(&pb, pa.ip(), APP), "drain", APP);
    lands(&n, &n.from_pod(&pa, pb.ip(), APP), "peer", APP);
    // Its containers done: released.
    json["status"]["phase"] = "Succeeded".into();
    n.kube().modify(json);
    n.eventually("the finished pod released", || {
        n.not_served(&pa) && n.ambient_tables(&pa).is_empty()
    });
    assert_eq!(n.probe_set(), [pb.ip()]);
}

/// A pod taken out of ambient while the agent was down: the restarted agent's snapshot leaves
/// it out (ztunnel drops it), so its leftover rules would send its traffic nowhere. The agent
/// removes them, its probe address and its `redirection` mark (Istio's `RemovePodFromMesh`).
#[test]
fn a_pod_that_left_ambient_while_the_agent_was_down_is_taken_out_of_the_mesh() {
    let Some(bin) = ztunnel() else { return };
    let (a, b) = (
        PodPlan::new("left", [10, 88, 31, 10], Mode::Ambient),
        PodPlan::new("stays", [10, 88, 31, 11], Mode::Ambient),
    );
    let mut n =
        AmbientNode::start(&bin, &AmbientOptions::default(), &[a.clone(), b.clone()]).unwrap();
    let (pa, pb) = (n.start_pod(&a), n.start_pod(&b));
    n.eventually("both marked", || {
        n.redirection_annotation(&pa).as_deref() == Some("enabled")
            && n.redirection_annotation(&pb).as_deref() == Some("enabled")
    });
    n.node.stop_daemon().unwrap();
    n.label(&pa, None);
    n.node.start_daemon().unwrap();
    n.eventually("the former ambient pod's rules removed", || {
        n.not_served(&pa) && n.ambient_tables(&pa).is_empty()
    });
    n.eventually("its mark removed", || {
        n.redirection_annotation(&pa).is_none()
    });
    assert_eq!(n.probe_set(), [pb.ip()]);
    assert!(n.served(&pb));
    // Plain traffic again, both ways (before: refused, its redirect pointing at a ztunnel that
    // no longer served it). Pod-to-pod is not asked: the rig's ztunnel still lists A as a mesh
    // workload, which istiod would correct once the mark is gone.
    let outside = Probe::world(n.node.ns.path()).unwrap();
    let gateway: IpAddr = GATEWAY_V4.parse().unwrap();
    lands(&n, &n.from_pod(&pa, gateway, 80), "world", 80);
    assert_eq!(outside.accepted().last().unwrap().peer.ip(), pa.ip());
    lands(&n, &n.from_pod(&pa, pb.ip(), APP), "stays", APP);
    lands(&n, &n.from_node(OTHER_UID, pa.ip(), APP), "left", APP);
}

/// kubelet removes a pod's old sandbox after its new one was served (same pod, same UID):
/// the old sandbox's DEL must not take the new one out of the mesh.
#[test]
fn a_del_of_an_old_sandbox_leaves_the_pods_new_sandbox_served() {
    let Some(bin) = ztunnel() else { return };
    let old_plan = PodPlan::new("resandboxed", [10, 88, 32, 10], Mode::Ambient);
    let new_plan = PodPlan::new("resandboxed", [10, 88, 32, 20], Mode::Ambient);
    let n = AmbientNode::start(
        &bin,
        &AmbientOptions::default(),
        std::slice::from_ref(&old_plan),
    )
    .unwrap();
    let old = n.start_pod(&old_plan);
    let new = n.create_pod(&new_plan).unwrap();
    let run = n.add(&new);
    assert!(run.ok, "{}{}\n{}", run.stdout, run.stderr, n.logs());
    assert!(n.served(&new));
    let run = n.del(&old);
    assert!(run.ok, "{}{}", run.stdout, run.stderr);
    // The release would be immediate; give a late one time to show.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        n.served(&new),
        "the old sandbox's DEL released the new one\n{}",
        n.logs()
    );
    assert_eq!(n.ambient_tables(&new).len(), 3, "{}", n.logs());
    assert!(n.probe_set().contains(&new.ip()), "{:?}", n.probe_set());
    // The new sandbox's own DEL still releases the pod.
    assert!(n.del(&new).ok);
    n.eventually("released by its own DEL", || {
        n.not_served(&new) && n.ambient_tables(&new).is_empty()
    });
}

/// ztunnel's own pod (`app=ztunnel` in istio-cni's namespace) is never enrolled, even in a
/// namespace labelled ambient (Istio's `IsZtunnelPod`).
#[test]
fn ztunnels_own_pod_is_never_enrolled() {
    let Some(bin) = ztunnel() else { return };
    let n = AmbientNode::start(&bin, &AmbientOptions::default(), &[]).unwrap();
    let system = "istio-system";
    n.kube().put_namespace_meta(
        system,
        json!({"istio.io/dataplane-mode": "ambient"}),
        json!({}),
    );
    let ns = TestNetns::with_prefix("amb-ztunnel").unwrap();
    let mut demo = DemoPod::scheduled(
        PodKind::NoSidecar,
        "ztunnel-x1",
        system,
        "uid-ztunnel-x1",
        NODE_NAME,
        false,
    );
    demo.json["metadata"]["labels"]["app"] = "ztunnel".into();
    n.node.serve(&demo);
    let mut cmd = Command::new(sleep_binary().unwrap());
    cmd.arg("infinity")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut sandbox = spawn_in(&ns, cmd, None).unwrap();
    link_process(&n.proc_root, &sandbox.id().to_string(), sandbox.id()).unwrap();
    let _app = Probe::start(ns.path(), "ztunnel-x1", &[Listen::tcp(APP)]).unwrap();
    let ip = "10.88.33.10";
    let run = n.node.cni_with_args("add", &ns, &demo, &format!("IP={ip}"));
    assert!(run.ok, "{}{}\n{}", run.stdout, run.stderr, n.logs());
    n.kube()
        .set_status(system, "ztunnel-x1", "Running", &[ip.parse().unwrap()]);
    // The agent's retry pass (5 s) would enroll a wanted pod it missed.
    std::thread::sleep(Duration::from_secs(6));
    assert!(tables(&ns).is_empty(), "{:?}\n{}", tables(&ns), n.logs());
    assert!(n.probe_set().is_empty(), "{:?}", n.probe_set());
    let _ = sandbox.kill();
    let _ = sandbox.wait();
}

/// The namespace labelled ambient while the API server has stopped feeding the agent's
/// namespace watch (the connection kept open): a pod started meanwhile is decided from that
/// stale view and passes through, but a namespace watch runs for at most
/// `NAMESPACE_WATCH_TIMEOUT` (60 s): found stalled past it, the cache lists again and the agent
/// enrolls the pod, as it does any running pod of a freshly labelled namespace; the next pod is
/// ambient from its ADD. Before, the namespace watch ran for the pods' 290 s and such a pod
/// stayed outside the mesh for about five minutes.
#[test]
fn a_stalled_namespace_watch_keeps_a_pod_outside_the_mesh_for_at_most_about_a_minute() {
    let Some(bin) = ztunnel() else { return };
    let (late, next) = (
        PodPlan::new("late", [10, 88, 31, 10], Mode::Plain),
        PodPlan::new("next", [10, 88, 31, 11], Mode::Plain),
    );
    let n = AmbientNode::start(
        &bin,
        &AmbientOptions::default(),
        &[late.clone(), next.clone()],
    )
    .unwrap();
    n.kube().hang_namespace_watches();
    n.kube().put_namespace_meta(
        POD_NAMESPACE,
        json!({"istio.io/dataplane-mode": "ambient"}),
        json!({}),
    );
    let started = Instant::now();
    let pl = n.start_pod(&late);
    let bound = node_view::cache::NAMESPACE_WATCH_TIMEOUT + Duration::from_secs(15);
    assert!(
        wait_until(bound, || n.served(&pl)),
        "the pod started during the stall was not enrolled within {bound:?}\n{}",
        n.logs()
    );
    println!(
        "stalled namespace watch: the pod started meanwhile was enrolled {:?} later",
        started.elapsed()
    );
    let pn = n.start_pod(&next);
    assert!(n.served(&pn), "{}", n.logs());
}
