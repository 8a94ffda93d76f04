//! The plugin's log lines in the node daemon's log (#20 item 4, Istio's `--log-uds-address`):
//! each ADD's decision shows in install-cni's stream with the pod's namespace/name; the
//! plugin's file keeps every line; with the daemon stopped (SIGSTOP: nobody reads) or gone
//! (SIGKILL) every ADD still succeeds at once; a planted file at the socket's name is refused,
//! never followed. Real CNI chain (cnitool), real install-cni, the fake API.
//!
//! Needs root, cnitool and the product's binaries; under `CI=true` nothing skips.

use integration::TestNetns;
use integration::cni::require_cni_tools;
use integration::node::{Node, NodeOptions, product_bin_dir, wait_until};
use integration::pods::{DemoPod, PodKind};
use std::time::{Duration, Instant};

fn node() -> Node {
    require_cni_tools();
    let opts = NodeOptions::new(product_bin_dir().unwrap());
    Node::new(opts).unwrap()
}

fn add(node: &Node, kind: PodKind, name: &str) -> Duration {
    let pod = DemoPod::new(kind, name);
    node.serve(&pod);
    let ns = TestNetns::with_prefix("plog").unwrap();
    let start = Instant::now();
    node.add(&ns, &pod).assert_ok();
    start.elapsed()
}

#[test]
fn the_plugins_decisions_show_in_the_daemons_log_and_never_hold_an_add() {
    let mut node = node();
    node.start_daemon().unwrap();
    add(&node, PodKind::Sidecar, "captured");
    add(&node, PodKind::NoSidecar, "plain");
    let shown = |needle: &str| node.daemon().log().lines().any(|l| l.contains(needle));
    assert!(
        wait_until(Duration::from_secs(5), || shown("pod=default/plain")),
        "daemon log:\n{}",
        node.daemon().log()
    );
    let log = node.daemon().log();
    let line = |pod: &str, what: &str| {
        log.lines()
            .any(|l| l.contains("plugin: ") && l.contains(pod) && l.contains(what))
    };
    assert!(line("pod=default/plain", "not in the mesh"), "{log}");
    assert!(line("pod=default/captured", "command=ADD"), "{log}");
    // The file keeps every line too.
    assert!(node.plugin_log().contains("\"pod_name\":\"plain\""));

    // Nobody reading and the socket's queue full: the plugin drops its lines and goes on.
    node.daemon().signal(libc::SIGSTOP);
    let queued = fill_queue(&node);
    assert!(queued > 0, "the daemon's socket took nothing");
    for i in 0..3 {
        let took = add(&node, PodKind::NoSidecar, &format!("stopped-{i}"));
        assert!(
            took < Duration::from_secs(5),
            "ADD {i} held {took:?} by a stopped daemon"
        );
    }
    node.daemon().signal(libc::SIGCONT);
    assert!(node.plugin_log().contains("\"pod_name\":\"stopped-2\""));

    // Daemon gone, its socket left behind: the file alone.
    node.daemon().signal(libc::SIGKILL);
    add(&node, PodKind::NoSidecar, "after-kill");
    assert!(node.plugin_log().contains("\"pod_name\":\"after-kill\""));
    let _ = node.stop_daemon();
}

/// Sends to the daemon's socket until its queue is full; how many datagrams it took.
fn fill_queue(node: &Node) -> usize {
    let s = std::os::unix::net::UnixDatagram::unbound().unwrap();
    s.connect(node.run_dir.join("log.sock")).unwrap();
    s.set_nonblocking(true).unwrap();
    let mut n = 0;
    while s
        .send(b"{\"level\":\"INFO\",\"fields\":{\"message\":\"filler\"}}")
        .is_ok()
    {
        n += 1;
        assert!(n < 1_000_000, "the queue never filled");
    }
    n
}

#[test]
fn a_planted_file_at_the_sockets_name_is_refused_not_followed() {
    let mut node = node();
    let victim = node.root.join("victim");
    std::fs::write(&victim, "keep").unwrap();
    std::os::unix::fs::symlink(&victim, node.run_dir.join("log.sock")).unwrap();
    node.start_daemon().unwrap();
    add(&node, PodKind::NoSidecar, "plain");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(
        node.daemon().log().contains("not a socket"),
        "{}",
        node.daemon().log()
    );
    assert!(node.plugin_log().contains("\"pod_name\":\"plain\""));
}
