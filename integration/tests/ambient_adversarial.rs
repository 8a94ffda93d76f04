//! The ambient node agent under hostile input and concurrent callers, with the real ztunnel:
//! malformed plugin events are refused naming the field and touch nothing; concurrent ADDs
//! and DELs of one pod never leave it half served (rules without ztunnel, or ztunnel without
//! rules); a SIGKILLed agent mid-ADD leaves no pod half programmed once the runtime has DELed
//! the failed sandboxes, and the restarted agent serves the rest. Different pods are enrolled
//! concurrently: many pods ADDed and DELed at once each end whole, the probe set holds exactly
//! the served ones, and the host rule is there while any pod is served and gone with the last
//! (on an nftables node and on an iptables-legacy node: legacy in-pod rules, Istio's legacy
//! host rule and its ipset, all written by concurrent enrollments).

use integration::ambient::prerequisites;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use capture::ambient_constants::PROBE_SET_V4;
use integration::ambient::{
    AmbientNode, AmbientOptions, Mode, Pod, PodPlan, ProbeIpset, legacy_save,
};
use std::net::IpAddr;

/// The agent's bound on pod GETs in flight (`ambient_agent::plugin_server::MAX_POD_GETS`).
const MAX_POD_GETS: usize = ambient_agent::plugin_server::MAX_POD_GETS;
/// The agent's bound on plugin events worked on at once.
const MAX_WORKERS: usize = ambient_agent::plugin_server::MAX_WORKERS;

/// One raw HTTP/1.1 exchange on the agent's socket: (status, body).
fn post(socket: &Path, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = UnixStream::connect(socket).expect("connect to pluginevent.sock");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

fn socket(n: &AmbientNode) -> PathBuf {
    n.node.run_dir.join("pluginevent.sock")
}

fn add_body(pod: &Pod, netns: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "Netns": netns, "PodName": pod.name(), "PodNamespace": "default",
        "PodUID": pod.uid(), "IPs": [pod.ip().to_string()],
    }))
    .unwrap()
}

/// A DEL as the plugin sends it: naming the sandbox's namespace it tears down.
fn del_body(pod: &Pod) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "Netns": netns_path(pod), "PodName": pod.name(), "PodNamespace": "default",
        "PodUID": pod.uid(),
    }))
    .unwrap()
}

fn netns_path(pod: &Pod) -> String {
    pod.ns.path().display().to_string()
}

/// The node's backend: where the agent writes in-pod rules and the host probe rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeKind {
    Nft,
    Legacy,
}

impl NodeKind {
    fn options(self) -> AmbientOptions {
        match self {
            NodeKind::Nft => AmbientOptions::default(),
            NodeKind::Legacy => AmbientOptions {
                env: vec![("REDIRECT_BACKEND".into(), "iptables-legacy".into())],
                ..AmbientOptions::default()
            },
        }
    }

    /// The pod's in-pod rules, as (family table or chain) names; empty when none.
    fn rules(self, n: &AmbientNode, pod: &Pod) -> Vec<String> {
        match self {
            NodeKind::Nft => n.ambient_tables(pod),
            NodeKind::Legacy => legacy_save(pod.ns.path(), false)
                .lines()
                .filter(|l| l.starts_with(":ISTIO_"))
                .map(str::to_string)
                .collect(),
        }
    }

    /// How many of [`NodeKind::rules`] a served pod has (nft: three tables; legacy: the
    /// chains ISTIO_PRERT and ISTIO_OUTPUT in raw, mangle and nat).
    fn complete(self) -> usize {
        match self {
            NodeKind::Nft => 3,
            NodeKind::Legacy => 6,
        }
    }

    /// The node's probe set: nft's named set or Istio's ipset.
    fn probe_set(self, n: &AmbientNode) -> Vec<IpAddr> {
        let mut v = match self {
            NodeKind::Nft => n.probe_set(),
            NodeKind::Legacy => n
                .probe_ipset(PROBE_SET_V4)
                .into_iter()
                .map(|(ip, _)| ip)
                .collect(),
        };
        v.sort();
        v
    }

    /// Whether the node's host probe rule is gone (with its sets).
    fn host_rule_gone(self, n: &AmbientNode) -> bool {
        match self {
            NodeKind::Nft => n.host_table().contains("no host table"),
            NodeKind::Legacy => {
                n.ipsets().is_empty()
                    && !legacy_save(n.node.ns.path(), false).contains("ISTIO_POSTRT")
            }
        }
    }
}

/// Served with its rules, or neither.
#[track_caller]
fn whole(n: &AmbientNode, pod: &Pod) -> bool {
    whole_on(NodeKind::Nft, n, pod)
}

/// [`whole`] on a node of `kind`.
#[track_caller]
fn whole_on(kind: NodeKind, n: &AmbientNode, pod: &Pod) -> bool {
    let rules = kind.rules(n, pod);
    if kind == NodeKind::Legacy {
        let nft = n.ambient_tables(pod);
        assert!(nft.is_empty(), "nftables in a legacy node's pod: {nft:?}");
    }
    if n.served(pod) {
        assert_eq!(
            rules.len(),
            kind.complete(),
            "served without its rules: {rules:?}\n{}",
            n.logs()
        );
        true
    } else {
        assert!(
            rules.is_empty(),
            "rules without ztunnel: {rules:?}\n{}",
            n.logs()
        );
        false
    }
}

#[test]
fn hostile_plugin_events_are_refused_naming_the_field_and_touch_nothing() {
    let Some(zt) = prerequisites() else { return };
    let a = PodPlan::new("hostile", [10, 88, 3, 10], Mode::Ambient);
    let n = AmbientNode::start(&zt, &AmbientOptions::default(), std::slice::from_ref(&a)).unwrap();
    let pod = n.create_pod(&a).unwrap();
    let sock = socket(&n);
    let good = String::from_utf8(add_body(&pod, &netns_path(&pod))).unwrap();
    let with = |from: &str, to: &str| good.replace(from, to).into_bytes();
    let host_proc_1 = n.proc_root.join("1/ns/net").display().to_string();
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"not json".to_vec(), 400, "invalid request"),
        (b"[]".to_vec(), 400, "invalid request"),
        (with("\"Netns\":", "\"Netns\":1,\"x\":"), 400, "Netns"),
        (with("\"PodName\"", "\"PodNam\""), 400, "PodName"),
        (with(&pod.ip().to_string(), "10.88.3.999"), 400, "IPs"),
        (with(&netns_path(&pod), "relative/netns"), 400, "absolute"),
        (
            with(&netns_path(&pod), "/etc/hostname"),
            400,
            "/etc/hostname",
        ),
        (
            with(&netns_path(&pod), "/proc/1/ns/net"),
            400,
            "/proc/1/ns/net",
        ),
        (with(&netns_path(&pod), &host_proc_1), 400, "Netns"),
        (
            with(&netns_path(&pod), "/nonexistent/netns"),
            400,
            "/nonexistent",
        ),
        (with(&format!("\"{}\"", pod.ip()), ""), 400, "IPs is empty"),
        // A name that is a path never reaches an API path (`/pods/../../p1` was requested).
        (
            with(
                &format!("\"PodName\":\"{}\"", pod.name()),
                "\"PodName\":\"../../p1\"",
            ),
            400,
            "PodName \"../../p1\" is not a valid pod name",
        ),
        (
            with("\"PodNamespace\":\"default\"", "\"PodNamespace\":\"a/b\""),
            400,
            "PodNamespace",
        ),
        // The path now names another namespace than the one the plugin checked.
        (
            with("\"IPs\"", "\"NetnsID\":{\"dev\":1,\"ino\":2},\"IPs\""),
            400,
            "not the namespace the plugin checked",
        ),
        (vec![b'x'; 200 * 1024], 413, "body"),
    ];
    for (body, status, needle) in &cases {
        let (got, text) = post(&sock, "POST", "/cmdadd", body);
        let shown = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
        assert_eq!(got, *status, "{shown}: {text}");
        assert!(text.contains(needle), "{shown}: {text:?} lacks {needle:?}");
    }
    assert_eq!(post(&sock, "GET", "/cmdadd", b"").0, 405);
    assert_eq!(post(&sock, "POST", "/nope", b"{}").0, 404);
    assert!(
        n.ambient_tables(&pod).is_empty(),
        "{:?}",
        n.ambient_tables(&pod)
    );
    assert!(n.probe_set().is_empty(), "{:?}", n.probe_set());
    assert!(n.not_served(&pod));
    // The agent still serves a good request afterwards.
    assert_eq!(post(&sock, "POST", "/cmdadd", good.as_bytes()).0, 200);
    n.eventually("the good pod served", || n.served(&pod));
    assert!(whole(&n, &pod));
}

/// Claim: the agent stays responsive and bounded under hostile clients on `pluginevent.sock`
/// (`integration::uds_flood`); a real ambient ADD through the plugin during the attack is
/// served in time, the agent's descriptors stay under the connection cap and come back down
/// once the request bound has passed.
#[test]
fn a_flood_on_the_event_socket_neither_starves_an_add_nor_grows_the_agent() {
    use integration::proc_stats::open_fds;
    use uds_http::server::{MAX_CONNECTIONS, REQUEST_TIMEOUT};
    let Some(zt) = prerequisites() else { return };
    let a = PodPlan::new("flooded", [10, 88, 3, 30], Mode::Ambient);
    let n = AmbientNode::start(&zt, &AmbientOptions::default(), std::slice::from_ref(&a)).unwrap();
    let pod = n.create_pod(&a).unwrap();
    let pid = n.node.daemon().pid();
    let idle = open_fds(pid);
    let attack = integration::uds_flood::flood(&socket(&n), 2000);
    // Settled (every connection accepted), well inside the request bound.
    std::thread::sleep(REQUEST_TIMEOUT / 4);
    let during = open_fds(pid);
    let run = n.add(&pod);
    assert!(run.ok, "ADD during the flood: {run:#?}\n{}", n.logs());
    n.eventually("served after an ADD during the flood", || n.served(&pod));
    assert!(whole(&n, &pod));
    assert!(
        during <= idle + MAX_CONNECTIONS + 16,
        "{during} agent descriptors during a flood of {} ({idle} idle, cap {MAX_CONNECTIONS})",
        attack.len()
    );
    let wait = REQUEST_TIMEOUT + Duration::from_secs(1);
    std::thread::sleep(wait);
    let after = open_fds(pid);
    println!(
        "pluginevent.sock flood of {} connections: agent descriptors {idle} idle, {during} \
         during, {after} {wait:?} later; the ambient ADD during it took {:?}",
        attack.len(),
        run.elapsed
    );
    assert!(
        after <= idle + 8,
        "{after} agent descriptors after the attack ({idle} idle)"
    );
    assert!(run.elapsed < Duration::from_secs(5), "{:?}", run.elapsed);
}

/// Claim: plugin events are worked on by a bounded number of tasks. An ADD of a pod the
/// agent's cache has not seen makes it GET the pod from the API server (up to 5 s), in a task
/// that outlives the caller. 1000 such ADDs from callers that hang up at once, the API server
/// never answering a pod GET: the GETs in flight and the agent's descriptors stay bounded, and
/// a real pod's ADD (in the cache) is still served.
#[test]
fn adds_of_unknown_pods_from_callers_that_hang_up_cost_a_bounded_number_of_api_gets() {
    use integration::proc_stats::open_fds;
    const ATTACK: usize = 1000;
    let Some(zt) = prerequisites() else { return };
    let a = PodPlan::new("real", [10, 88, 3, 40], Mode::Ambient);
    let n = AmbientNode::start(&zt, &AmbientOptions::default(), std::slice::from_ref(&a)).unwrap();
    let pod = n.create_pod(&a).unwrap();
    let pid = n.node.daemon().pid();
    let idle = open_fds(pid);
    n.kube().hang_next_pod_gets(u64::MAX);
    let ghost = String::from_utf8(add_body(&pod, &netns_path(&pod))).unwrap();
    for i in 0..ATTACK {
        let body = ghost
            .replace(pod.name(), &format!("ghost-{i}"))
            .replace(pod.uid().as_str(), &format!("ghost-uid-{i}"));
        add_and_hang_up(&socket(&n), body.as_bytes());
    }
    std::thread::sleep(Duration::from_secs(1));
    let gets = n
        .kube()
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/pods/ghost-"))
        .count();
    let during = open_fds(pid);
    println!(
        "{ATTACK} hung-up ADDs of unknown pods, pod GETs never answered: {gets} GETs in flight, \
         agent descriptors {idle} idle, {during} during"
    );
    assert!(
        gets <= MAX_POD_GETS,
        "{gets} pod GETs in flight for {ATTACK} hung-up callers"
    );
    assert!(
        during <= idle + MAX_POD_GETS + 32,
        "{during} agent descriptors ({idle} idle)"
    );
    let run = n.add(&pod);
    assert!(run.ok, "the real ADD: {run:#?}\n{}", n.logs());
    n.eventually("the real pod served", || n.served(&pod));
    assert!(whole(&n, &pod));
}

/// Sends `/cmdadd` with `body` and hangs up without waiting for the answer.
fn add_and_hang_up(sock: &Path, body: &[u8]) {
    if let Ok(mut s) = UnixStream::connect(sock) {
        let head = format!(
            "POST /cmdadd HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let _ = s
            .write_all(head.as_bytes())
            .and_then(|()| s.write_all(body));
    }
}

/// Claim: the agent's work on plugin events is bounded in tasks and descriptors even when its
/// callers hang up. 2000 ADDs of one real pod (each opens the pod's netns, then waits its turn
/// for the pod) from callers that hang up at once: the agent's descriptors stay bounded, an
/// ADD of another pod meanwhile is served, and the hammered pod ends whole.
#[test]
fn re_adds_of_a_pod_from_callers_that_hang_up_hold_a_bounded_number_of_descriptors() {
    use integration::proc_stats::open_fds;
    use uds_http::server::MAX_CONNECTIONS;
    const ATTACK: usize = 2000;
    let Some(zt) = prerequisites() else { return };
    let plans = [
        PodPlan::new("hammered", [10, 88, 3, 50], Mode::Ambient),
        PodPlan::new("bystander", [10, 88, 3, 51], Mode::Ambient),
    ];
    let n = AmbientNode::start(&zt, &AmbientOptions::default(), &plans).unwrap();
    let pod = n.create_pod(&plans[0]).unwrap();
    let other = n.create_pod(&plans[1]).unwrap();
    let pid = n.node.daemon().pid();
    let idle = open_fds(pid);
    let body = add_body(&pod, &netns_path(&pod));
    for _ in 0..ATTACK {
        add_and_hang_up(&socket(&n), &body);
    }
    std::thread::sleep(Duration::from_secs(1));
    let during = open_fds(pid);
    let run = n.add(&other);
    println!(
        "{ATTACK} hung-up re-ADDs of one pod: agent descriptors {idle} idle, {during} a second \
         later; another pod's ADD meanwhile took {:?}",
        run.elapsed
    );
    assert!(run.ok, "the other pod's ADD: {run:#?}\n{}", n.logs());
    n.eventually("the other pod served", || n.served(&other));
    n.eventually("the hammered pod served", || n.served(&pod));
    assert!(whole(&n, &pod) && whole(&n, &other));
    assert!(
        during <= idle + MAX_CONNECTIONS + MAX_WORKERS + 32,
        "{during} agent descriptors ({idle} idle) for {ATTACK} hung-up callers"
    );
}

#[test]
fn concurrent_adds_and_dels_of_one_pod_never_leave_it_half_served() {
    let Some(zt) = prerequisites() else { return };
    let a = PodPlan::new("racy", [10, 88, 3, 20], Mode::Ambient);
    let n = AmbientNode::start(&zt, &AmbientOptions::default(), std::slice::from_ref(&a)).unwrap();
    let pod = n.create_pod(&a).unwrap();
    let sock = socket(&n);
    let (add, del) = (add_body(&pod, &netns_path(&pod)), del_body(&pod));
    for round in 0..5 {
        std::thread::scope(|s| {
            for t in 0..8 {
                let (sock, add, del) = (&sock, &add, &del);
                s.spawn(move || {
                    for i in 0..6 {
                        let (path, body) = if (t + i + round) % 3 == 0 {
                            ("/cmddel", del)
                        } else {
                            ("/cmdadd", add)
                        };
                        let (status, text) = post(sock, "POST", path, body);
                        assert_eq!(status, 200, "{path}: {text}");
                    }
                });
            }
        });
        // Quiescent: ztunnel settles within a moment of the last message.
        std::thread::sleep(Duration::from_millis(300));
        whole(&n, &pod);
    }
    assert_eq!(post(&sock, "POST", "/cmdadd", &add).0, 200);
    n.eventually("served after the last ADD", || n.served(&pod));
    assert!(whole(&n, &pod));
    assert_eq!(n.probe_set(), vec![pod.ip()]);
    assert_eq!(post(&sock, "POST", "/cmddel", &del).0, 200);
    n.eventually("released after the last DEL", || n.not_served(&pod));
    assert!(!whole(&n, &pod));
    assert!(n.probe_set().is_empty(), "{:?}", n.probe_set());
}

#[test]
fn many_pods_added_and_deleted_at_once_each_end_whole_with_the_host_rule_while_needed() {
    burst(NodeKind::Nft, 4);
}

#[test]
fn the_same_burst_on_an_iptables_legacy_node() {
    burst(NodeKind::Legacy, 5);
}

/// 16 pods (10.88.`octet`.10–25) ADDed at once, half DELed again at once, three rounds; then
/// all DELed.
fn burst(kind: NodeKind, octet: u8) {
    let Some(zt) = prerequisites() else { return };
    let plans: Vec<PodPlan> = (0..16u8)
        .map(|i| {
            PodPlan::new(
                &format!("burst-{i}"),
                [10, 88, octet, 10 + i],
                Mode::Ambient,
            )
        })
        .collect();
    let n = AmbientNode::start(&zt, &kind.options(), &plans).unwrap();
    let pods: Vec<Pod> = plans.iter().map(|p| n.create_pod(p).unwrap()).collect();
    let sock = socket(&n);
    for round in 0..3 {
        // Every pod ADDed at once; odd pods DELed again at once while the others still ADD.
        std::thread::scope(|s| {
            for (i, pod) in pods.iter().enumerate() {
                let sock = &sock;
                s.spawn(move || {
                    let (status, text) =
                        post(sock, "POST", "/cmdadd", &add_body(pod, &netns_path(pod)));
                    assert_eq!(status, 200, "ADD {}: {text}", pod.name());
                    if (i + round) % 2 == 1 {
                        let (status, text) = post(sock, "POST", "/cmddel", &del_body(pod));
                        assert_eq!(status, 200, "DEL {}: {text}", pod.name());
                    }
                });
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let mut served: Vec<_> = pods
            .iter()
            .filter(|p| whole_on(kind, &n, p))
            .map(|p| p.ip())
            .collect();
        let set = kind.probe_set(&n);
        served.sort();
        assert_eq!(
            served.len(),
            8,
            "round {round}: served {served:?}\n{}",
            n.logs()
        );
        assert_eq!(
            set,
            served,
            "round {round}: the probe set is not the served pods\n{}",
            n.logs()
        );
    }
    std::thread::scope(|s| {
        for pod in &pods {
            let sock = &sock;
            s.spawn(move || assert_eq!(post(sock, "POST", "/cmddel", &del_body(pod)).0, 200));
        }
    });
    for pod in &pods {
        n.eventually("every pod released", || n.not_served(pod));
        assert!(!whole_on(kind, &n, pod));
    }
    assert!(kind.probe_set(&n).is_empty(), "{:?}", kind.probe_set(&n));
    n.eventually("the host rule gone with the last pod", || {
        kind.host_rule_gone(&n)
    });
}

#[test]
fn a_sigkilled_agent_mid_add_leaves_no_pod_half_programmed() {
    let Some(zt) = prerequisites() else { return };
    let plans: Vec<PodPlan> = (0..16u8)
        .map(|i| PodPlan::new(&format!("kill-{i}"), [10, 88, 4, 10 + i], Mode::Ambient))
        .collect();
    let mut n = AmbientNode::start(&zt, &AmbientOptions::default(), &plans).unwrap();
    let pods: Vec<Pod> = plans.iter().map(|p| n.create_pod(p).unwrap()).collect();
    let pid = n.node.daemon().pid();
    let results: Vec<bool> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|p| {
                let n = &n;
                s.spawn(move || n.add(p).ok)
            })
            .collect();
        // Mid-way through the burst: once a few pods are in, others are in flight.
        let enrolled = || {
            n.node
                .daemon()
                .log()
                .matches("ambient pod enrolled")
                .count()
        };
        let t = std::time::Instant::now();
        while enrolled() < 4 && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // SAFETY: kill(2) on the daemon's pid; no memory is involved.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The runtime DELs every sandbox whose ADD failed (the CNI contract); the agent is down.
    for (p, ok) in pods.iter().zip(&results) {
        if !ok {
            assert!(n.del(p).ok, "DEL of {} failed", p.name());
            assert!(
                n.ambient_tables(p).is_empty(),
                "{}: rules left after the failed ADD's DEL: {:?}",
                p.name(),
                n.ambient_tables(p)
            );
        }
    }
    n.node.start_daemon().unwrap();
    for (p, ok) in pods.iter().zip(&results) {
        if *ok {
            n.eventually("a pod whose ADD succeeded is served", || n.served(p));
            assert!(whole(&n, p), "{}", p.name());
        } else {
            assert!(!whole(&n, p), "{}", p.name());
        }
    }
    let succeeded = results.iter().filter(|ok| **ok).count();
    eprintln!(
        "{succeeded} of {} ADDs succeeded before the SIGKILL",
        pods.len()
    );
    assert!(succeeded >= 1, "the kill came before any ADD finished");
}

/// An address reused while the pod it came from is still enrolled (the agent missed that
/// pod's DEL: the plugin's DEL to the agent is best effort, and IPAM frees the address after
/// it): the old pod's late release must not take the address out of the probe set while the
/// new pod is served with it, or kubelet's probes of the new pod stop being let through.
#[test]
fn releasing_a_pod_keeps_a_probe_address_a_served_pod_holds() {
    let Some(zt) = prerequisites() else { return };
    let a = PodPlan::new("reuse-old", [10, 88, 7, 10], Mode::Ambient);
    let b = PodPlan::new("reuse-new", [10, 88, 7, 11], Mode::Ambient);
    let n = AmbientNode::start(&zt, &AmbientOptions::default(), &[a.clone(), b.clone()]).unwrap();
    let (old, new) = (n.create_pod(&a).unwrap(), n.create_pod(&b).unwrap());
    let sock = socket(&n);
    let (status, text) = post(&sock, "POST", "/cmdadd", &add_body(&old, &netns_path(&old)));
    assert_eq!(status, 200, "{text}");
    // The new pod's sandbox got the old pod's address.
    let mut body: serde_json::Value =
        serde_json::from_slice(&add_body(&new, &netns_path(&new))).unwrap();
    body["IPs"] = serde_json::json!([old.ip().to_string()]);
    let (status, text) = post(
        &sock,
        "POST",
        "/cmdadd",
        &serde_json::to_vec(&body).unwrap(),
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(n.probe_set(), vec![old.ip()]);
    // The old pod's late release.
    assert_eq!(post(&sock, "POST", "/cmddel", &del_body(&old)).0, 200);
    n.eventually("the old pod released", || n.not_served(&old));
    assert!(n.served(&new));
    assert_eq!(
        n.probe_set(),
        vec![old.ip()],
        "the served pod's probe address was removed\n{}",
        n.logs()
    );
    // The new pod's own release takes it out, and the host rule goes with the last pod.
    assert_eq!(post(&sock, "POST", "/cmddel", &del_body(&new)).0, 200);
    n.eventually("the new pod released", || n.not_served(&new));
    assert!(n.probe_set().is_empty(), "{:?}", n.probe_set());
    n.eventually("the host rule gone with the last pod", || {
        NodeKind::Nft.host_rule_gone(&n)
    });
}

/// The DEL containerd repeats when it removes a sandbox whose namespace is already gone names
/// no namespace: it must not release the pod from the sandbox it is served in (kubelet removes
/// a pod's old sandbox after its new one was served). The DEL naming the served sandbox does.
#[test]
fn a_del_that_names_no_namespace_releases_nothing() {
    let Some(zt) = prerequisites() else { return };
    let a = PodPlan::new("no-netns-del", [10, 88, 8, 10], Mode::Ambient);
    let n = AmbientNode::start(&zt, &AmbientOptions::default(), std::slice::from_ref(&a)).unwrap();
    let pod = n.create_pod(&a).unwrap();
    let sock = socket(&n);
    let (status, text) = post(&sock, "POST", "/cmdadd", &add_body(&pod, &netns_path(&pod)));
    assert_eq!(status, 200, "{text}");
    for netns in [None, Some(""), Some("/var/run/netns/gone-long-ago")] {
        let mut body = serde_json::json!({
            "PodName": pod.name(), "PodNamespace": "default", "PodUID": pod.uid(),
        });
        if let Some(path) = netns {
            body["Netns"] = path.into();
        }
        let (status, text) = post(
            &sock,
            "POST",
            "/cmddel",
            &serde_json::to_vec(&body).unwrap(),
        );
        assert_eq!(status, 200, "{text}");
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            n.served(&pod) && whole(&n, &pod),
            "released by a DEL naming {netns:?}\n{}",
            n.logs()
        );
        assert_eq!(n.probe_set(), vec![pod.ip()]);
    }
    assert_eq!(post(&sock, "POST", "/cmddel", &del_body(&pod)).0, 200);
    n.eventually("released by the DEL naming its sandbox", || {
        n.not_served(&pod)
    });
}
