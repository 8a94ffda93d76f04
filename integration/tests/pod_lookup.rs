//! The plugin's pod lookup without the API server (#22 item 1): with install-cni up, a pod
//! start costs ZERO API requests (the daemon answers from its pod watch over `pods.sock`);
//! with the daemon hung (SIGSTOP) or gone (SIGKILL) the plugin asks the API server itself,
//! within the same deadline, and the pod gets the same rules either way. Real CNI chain
//! (cnitool, bridge, host-local), real install-cni, the full fake API.
//!
//! Needs root, cnitool and the product's binaries; under `CI=true` nothing skips.

use integration::cni::{require_cni_tools, rules};
use integration::kube_api::Req;
use integration::node::{GATEWAY_V4, Node, NodeOptions, product_bin_dir};
use integration::pods::{DemoPod, PodKind};
use integration::{ConnectSpec, Probe, TestNetns};
use std::time::{Duration, Instant};

fn node() -> Node {
    require_cni_tools();
    let mut opts = NodeOptions::new(product_bin_dir().unwrap());
    opts.full_api = true;
    opts.plugin_log_level = "debug".into();
    let mut node = Node::new(opts).unwrap();
    node.start_daemon().unwrap();
    node.wait_pod_cache_listed();
    node
}

fn pod_gets(node: &Node, pod: &DemoPod) -> Vec<Req> {
    let path = format!("/api/v1/namespaces/{}/pods/{}", pod.namespace, pod.name);
    let kube = &node.api;
    kube.requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == path)
        .collect()
}

/// ADDs the pod; its namespace and how long the ADD took.
fn add(node: &Node, pod: &DemoPod) -> (TestNetns, Duration) {
    let ns = TestNetns::with_prefix("lookup").unwrap();
    let start = Instant::now();
    node.add(&ns, pod).assert_ok();
    (ns, start.elapsed())
}

/// The pod's rules with its own addresses taken out (they differ per pod; nothing else may).
fn rules_of(ns: &TestNetns) -> String {
    let text = rules(ns);
    let addrs = ns
        .exec_ok("ip", &["-o", "addr", "show", "dev", "eth0"])
        .unwrap();
    let mut out = text;
    for word in addrs.split_whitespace() {
        if let Some((ip, _)) = word.split_once('/')
            && ip.parse::<std::net::IpAddr>().is_ok()
        {
            out = out.replace(ip, "<pod-ip>");
        }
    }
    out
}

#[test]
fn a_pod_start_asks_the_daemon_not_the_api_server_and_falls_back_when_it_cannot_answer() {
    let mut node = node();
    let _world = Probe::world(node.ns.path()).unwrap();

    // Daemon up: no pod GET, and the pod is captured (a real connection lands on Envoy).
    let cached = DemoPod::new(PodKind::Sidecar, "from-cache");
    node.serve(&cached);
    let (cached_ns, _) = add(&node, &cached);
    assert!(pod_gets(&node, &cached).is_empty(), "{}", node.plugin_log());
    assert!(
        node.plugin_log()
            .contains("pod from the node daemon's cache"),
        "{}",
        node.plugin_log()
    );
    let _sidecar = Probe::sidecar(cached_ns.path()).unwrap();
    let world = ConnectSpec::new(GATEWAY_V4.parse().unwrap(), 80);
    let out = integration::connect(cached_ns.path(), &world);
    assert_eq!(
        out.landed_port(),
        Some(15001),
        "outbound did not reach Envoy: {out}"
    );

    // A pod the daemon's watch delivers only after the ADD began: the daemon waits for it.
    let late = DemoPod::new(PodKind::Sidecar, "late");
    let late_ns = TestNetns::with_prefix("lookup").unwrap();
    std::thread::scope(|s| {
        let adding = s.spawn(|| node.add(&late_ns, &late));
        std::thread::sleep(Duration::from_millis(150));
        node.serve(&late);
        adding.join().unwrap().assert_ok();
    });
    assert!(
        pod_gets(&node, &late).is_empty(),
        "{:?}",
        pod_gets(&node, &late)
    );
    assert_eq!(rules_of(&late_ns), rules_of(&cached_ns));

    // Daemon hung: the plugin gives it its share of the deadline, then asks the API server.
    node.daemon().signal(libc::SIGSTOP);
    let hung = DemoPod::new(PodKind::Sidecar, "daemon-hung");
    node.serve(&hung);
    let (hung_ns, took) = add(&node, &hung);
    node.daemon().signal(libc::SIGCONT);
    assert_eq!(
        pod_gets(&node, &hung).len(),
        1,
        "one GET when the daemon hangs"
    );
    assert!(
        took < Duration::from_secs(10),
        "the hung daemon held the ADD {took:?}"
    );
    assert_eq!(
        rules_of(&hung_ns),
        rules_of(&cached_ns),
        "same pod JSON, same rules"
    );

    // Daemon gone (its socket left behind): one GET at once.
    node.daemon().signal(libc::SIGKILL);
    let gone = DemoPod::new(PodKind::Sidecar, "daemon-gone");
    node.serve(&gone);
    let (gone_ns, _) = add(&node, &gone);
    assert_eq!(
        pod_gets(&node, &gone).len(),
        1,
        "one GET when the daemon is gone"
    );
    assert_eq!(rules_of(&gone_ns), rules_of(&cached_ns));
    let _ = node.stop_daemon();
}

/// Claim: the daemon stays responsive and bounded under hostile clients on `pods.sock`
/// (`integration::uds_flood`: thousands of connections that send nothing, half a head, a
/// 64 KiB header, garbage, or never read their answer; a head trickled byte by byte). A pod
/// ADDed during the attack is answered from the daemon's cache (no API GET), the daemon's
/// descriptors stay under the connection cap, and the attack's connections are closed once
/// the request bound has passed. Then valid lookups hold every slot: the plugin falls back to
/// the API server within its deadline.
#[test]
fn a_flood_on_pods_sock_neither_starves_the_plugin_nor_grows_the_daemon() {
    use integration::proc_stats::open_fds;
    use uds_http::server::{MAX_CONNECTIONS, REQUEST_TIMEOUT};
    let mut node = node();
    let pid = node.daemon().pid();
    let idle = open_fds(pid);
    let attack = integration::uds_flood::flood(&node.run_dir.join("pods.sock"), 2000);
    // Settled (every connection accepted), well inside the request bound.
    std::thread::sleep(REQUEST_TIMEOUT / 4);
    let during = open_fds(pid);

    let pod = DemoPod::new(PodKind::Sidecar, "under-attack");
    node.serve(&pod);
    let (pod_ns, took) = add(&node, &pod);
    assert!(
        pod_gets(&node, &pod).is_empty(),
        "the plugin had to ask the API server during the attack:\n{}",
        node.plugin_log()
    );
    assert!(!rules_of(&pod_ns).trim().is_empty());
    assert!(
        during <= idle + MAX_CONNECTIONS + 16,
        "{during} daemon descriptors during a flood of {} ({idle} idle, cap {MAX_CONNECTIONS})",
        attack.len()
    );
    let wait = REQUEST_TIMEOUT + Duration::from_secs(1);
    std::thread::sleep(wait);
    let after = open_fds(pid);
    println!(
        "pods.sock flood of {} connections: daemon descriptors {idle} idle, {during} during, \
         {after} {wait:?} later; an ADD during it took {took:?}, answered from the cache",
        attack.len()
    );
    assert!(
        after <= idle + 8,
        "{after} daemon descriptors after the attack ({idle} idle)"
    );
    drop(attack);

    // Valid lookups that each hold a slot for the longest wait (a pod that never comes):
    // every slot taken, the plugin's lookup waits in the listen queue, gives up after its
    // share of the deadline and asks the API server; the ADD succeeds.
    let slow = cni_config::lookup::PodQuery {
        namespace: "default".into(),
        name: "never".into(),
        uid: None,
        with_namespace: false,
        wait: cni_config::lookup::MAX_WAIT,
    };
    let request = format!("GET {} HTTP/1.1\r\nHost: a\r\n\r\n", slow.to_path());
    let holders: Vec<_> = (0..MAX_CONNECTIONS + 40)
        .filter_map(|_| {
            let mut s =
                std::os::unix::net::UnixStream::connect(node.run_dir.join("pods.sock")).ok()?;
            std::io::Write::write_all(&mut s, request.as_bytes()).ok()?;
            Some(s)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let starved = DemoPod::new(PodKind::Sidecar, "all-slots-held");
    node.serve(&starved);
    let (_starved_ns, took) = add(&node, &starved);
    println!(
        "{} valid lookups holding every slot: the ADD fell back to the API server in {took:?}",
        holders.len()
    );
    assert_eq!(pod_gets(&node, &starved).len(), 1, "one GET: the fallback");
    assert!(took < Duration::from_secs(5), "{took:?}");
    drop(holders);
    let _ = node.stop_daemon();
}

/// Ambient: the plugin needs the pod AND its namespace (the enablement selectors); both come
/// from the daemon's watches, and the agent finds the pod in the same cache: no GET at all.
#[test]
fn ambient_pod_starts_make_no_api_request() {
    use integration::ambient::{AmbientNode, AmbientOptions, Mode, PodPlan};
    require_cni_tools();
    let Some(zt) = integration::ztunnel::ztunnel_binary() else {
        return;
    };
    let plans = [
        PodPlan::new("a", [10, 88, 1, 20], Mode::Ambient),
        PodPlan::new("b", [10, 88, 1, 21], Mode::Ambient),
    ];
    let n = AmbientNode::start(&zt, &AmbientOptions::default(), &plans).unwrap();
    let before = n.kube().requests().len();
    let pods: Vec<_> = plans.iter().map(|p| n.start_pod(p)).collect();
    for p in &pods {
        assert!(
            n.served(p),
            "{} not handed to ztunnel:\n{}",
            p.name(),
            n.logs()
        );
    }
    let gets: Vec<_> = n.kube().requests()[before..]
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with("/api/v1/namespaces/"))
        .cloned()
        .collect();
    assert!(
        gets.is_empty(),
        "pod or namespace GETs during ambient starts: {gets:?}\n{}",
        n.logs()
    );
}
