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

/// Claim: a flood on `log.sock` (root can write to it; a plugin gone wrong could too) is
/// relayed within the daemon's line budget, not line for line, and never holds an ADD; the
/// plugin's own lines show again once the flood stops.
#[test]
fn a_flood_on_log_sock_is_relayed_within_the_line_budget_and_never_holds_an_add() {
    use node_status::plugin_log::{LINE_BURST, LINES_PER_SECOND};
    const FLOOD: Duration = Duration::from_secs(2);
    let mut node = node();
    node.start_daemon().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooder = std::thread::spawn({
        let (path, stop) = (node.run_dir.join("log.sock"), stop.clone());
        move || {
            let s = std::os::unix::net::UnixDatagram::unbound().unwrap();
            s.connect(path).unwrap();
            s.set_nonblocking(true).unwrap();
            let mut sent = 0usize;
            // Stopped by the test once the ADD is back, or by itself: an ADD the flood held
            // would otherwise wait with it for ever.
            let limit = Instant::now() + Duration::from_secs(10);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < limit {
                if s.send(b"{\"level\":\"WARN\",\"fields\":{\"message\":\"flood\"}}")
                    .is_ok()
                {
                    sent += 1;
                }
            }
            sent
        }
    });
    let start = Instant::now();
    std::thread::sleep(FLOOD / 2);
    let took = add(&node, PodKind::NoSidecar, "during-flood");
    std::thread::sleep(FLOOD.saturating_sub(start.elapsed()));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flooder.join().unwrap();
    let flooded = start.elapsed();
    // Whatever the daemon has queued is printed (or dropped) by now.
    std::thread::sleep(Duration::from_secs(1));
    let relayed = |log: &str| log.lines().filter(|l| l.contains("plugin: flood")).count();
    let shown = relayed(&node.daemon().log());
    let budget = LINE_BURST + (LINES_PER_SECOND as f64 * (flooded.as_secs_f64() + 1.0)) as usize;
    println!(
        "log.sock flood: {sent} datagrams in {flooded:?}, {shown} relayed (budget {budget}); an ADD during it took {took:?}"
    );
    // Held, it would last as long as the flood (10 s); the bound leaves room for a loaded
    // machine (a busy flooder takes one of the two cores).
    assert!(
        took < Duration::from_secs(5),
        "the flood held an ADD {took:?}"
    );
    assert!(
        shown <= budget,
        "{shown} lines relayed for {sent} datagrams"
    );
    // The budget refills: the plugin's next lines show.
    std::thread::sleep(Duration::from_secs(1));
    add(&node, PodKind::NoSidecar, "after-flood");
    assert!(
        wait_until(Duration::from_secs(5), || node
            .daemon()
            .log()
            .contains("pod=default/after-flood")),
        "the plugin's lines after the flood are not relayed"
    );
    assert!(
        node.daemon().log().contains("plugin log relay: dropped"),
        "the drops are not reported"
    );
    let _ = node.stop_daemon();
}
