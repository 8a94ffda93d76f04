//! The plugin's pod lookup (issue 22 item 1): API requests per pod start and istio-cni's own
//! ADD time, with the API server behind TLS on loopback as on a real cluster (socat with a
//! throwaway CA in front of the fake API), through the node daemon's cache (`pods.sock`) and
//! through the plugin's own GET (the socket removed, so the plugin cannot reach the daemon).
//!
//! Usage: bench-lookup [pods per path] — prints a Markdown table. Run the release build.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use testbed::TestNetns;
use testbed::cni::{percentile, plugin_adds, require_cni_tools, rules};
use testbed::node::{Node, NodeOptions, product_bin_dir};
use testbed::pods::{DemoPod, PodKind};

/// socat terminating TLS in the node's namespace, forwarding to the fake API.
struct TlsFront(Child);

impl Drop for TlsFront {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A CA and a server certificate for 127.0.0.1 (openssl); returns (ca.crt, server.pem).
fn certificates(dir: &Path) -> (String, String) {
    std::fs::create_dir_all(dir).unwrap();
    let sh = format!(
        "set -e; cd {d}; \
         openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=bench-ca -keyout ca.key -out ca.crt 2>/dev/null; \
         openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr 2>/dev/null; \
         printf 'subjectAltName=IP:127.0.0.1' > san; \
         openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile san -out server.crt 2>/dev/null; \
         cat server.crt server.key > server.pem",
        d = dir.display()
    );
    let ok = Command::new("sh")
        .arg("-c")
        .arg(&sh)
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl failed");
    (
        std::fs::read_to_string(dir.join("ca.crt")).unwrap(),
        dir.join("server.pem").display().to_string(),
    )
}

fn tls_front(node: &Node, pem: &str, port: u16) -> TlsFront {
    let child = Command::new("nsenter")
        .arg(format!("--net={}", node.ns.path().display()))
        .args([
            "socat",
            &format!("OPENSSL-LISTEN:{port},reuseaddr,fork,bind=127.0.0.1,cert={pem},verify=0"),
        ])
        .arg(format!("TCP:127.0.0.1:{}", node.api_port()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("socat");
    TlsFront(child)
}

/// ADDs `n` sidecar pods one after another; istio-cni's own ADD times and the pod GETs the
/// API server saw.
fn adds(node: &Node, tag: &str, n: usize) -> (Vec<Duration>, usize) {
    let kube = node.kube.as_ref().expect("full API");
    let before_log = plugin_adds(&node.plugin_log()).len();
    let before_gets = pod_gets(kube);
    for i in 0..n {
        let spec = DemoPod::new(PodKind::Sidecar, &format!("{tag}-{i}"));
        node.serve(&spec);
        let ns = TestNetns::with_prefix("blook").unwrap();
        node.add(&ns, &spec).assert_ok();
        assert!(
            rules(&ns).contains("istio-proxy-nat"),
            "pod {i} has no rules"
        );
        node.del(&ns, &spec).assert_ok();
    }
    let mut own = plugin_adds(&node.plugin_log())[before_log..].to_vec();
    own.sort();
    (own, pod_gets(kube) - before_gets)
}

fn pod_gets(kube: &testbed::kube_api::FakeKube) -> usize {
    kube.requests()
        .iter()
        .filter(|r| {
            r.method == "GET"
                && r.path.starts_with("/api/v1/namespaces/")
                && r.path.contains("/pods/")
        })
        .count()
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("pods"))
        .unwrap_or(100);
    require_cni_tools();
    let mut opts = NodeOptions::new(product_bin_dir().unwrap());
    opts.full_api = true;
    opts.dual_stack = false;
    let mut node = Node::new(opts).unwrap();
    let (ca, pem) = certificates(&node.root.join("tls"));
    let tls_port = node.api_port() + 1;
    let _front = tls_front(&node, &pem, tls_port);
    std::fs::write(node.sa_dir.join("ca.crt"), ca).unwrap();
    node.opts.env.extend([
        (
            "KUBERNETES_SERVICE_PROTOCOL".to_string(),
            "https".to_string(),
        ),
        ("KUBERNETES_SERVICE_PORT".to_string(), tls_port.to_string()),
    ]);
    node.start_daemon().unwrap();
    node.wait_pod_cache_listed();

    let (cache, cache_gets) = adds(&node, "cache", n);
    std::fs::remove_file(node.run_dir.join("pods.sock")).unwrap();
    let (api, api_gets) = adds(&node, "api", n);
    let _ = node.stop_daemon();

    println!(
        "| sidecar pod ADD, API server over TLS on loopback ({n} pods each) | API requests per pod start | istio-cni's own ADD p50 ms | p99 ms |"
    );
    println!("|---|---:|---:|---:|");
    for (what, own, gets) in [
        ("the node daemon's cache (`pods.sock`)", &cache, cache_gets),
        ("the plugin's own GET (no daemon to ask)", &api, api_gets),
    ] {
        println!(
            "| {what} | {:.2} | {} | {} |",
            gets as f64 / n as f64,
            ms(percentile(own, 0.5)),
            ms(percentile(own, 0.99))
        );
    }
}
