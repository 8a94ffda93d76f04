//! CNI client side of a node: the real `cnitool`, a local Kubernetes API server that serves
//! Pod JSON, and helpers to read what a command printed. Shared by the plugin's end-to-end
//! tests (`crates/istio-cni/tests`) and the whole-product harness ([`crate::node`]).

use crate::TestNetns;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The upstream CNI reference client (built by `integration/scripts/build-cnitool.sh`).
pub const CNITOOL: &str = "/usr/local/bin/cnitool";
/// Debian's reference plugins (`containernetworking-plugins`).
pub const DEBIAN_CNI_DIR: &str = "/usr/lib/cni";
/// A self-signed CA (test only): the plugin's kubeconfig carries CA data, as in production,
/// which keeps the client from loading the system trust store; the test server speaks HTTP.
pub const TEST_CA_PEM: &str = include_str!("../fixtures/ca.crt");

/// Fails clearly when the machine lacks what the end-to-end tests drive.
pub fn require_cni_tools() {
    crate::require_root();
    for p in [CNITOOL, "bridge", "host-local", "portmap", "loopback"]
        .map(|p| Path::new(DEBIAN_CNI_DIR).join(p))
    {
        assert!(
            p.exists(),
            "{} is missing: run `integration/scripts/install-deps.sh`",
            p.display()
        );
    }
}

/// How the local API server behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiMode {
    Up = 0,
    /// Accepts connections and never answers (per-request timeout).
    Hang = 1,
    /// Answers every GET with this HTTP status and a Kubernetes `Status` body.
    Status500 = 2,
    Status404 = 3,
    Status401 = 4,
    Status403 = 5,
    Status400 = 6,
    /// 200 with a body that is not JSON.
    Garbage = 7,
    /// 200 with a Pod whose `spec.containers` is a string.
    BadPod = 8,
    /// Answers after 1.5 s (slower than a short per-request timeout).
    Slow = 9,
    /// 200 with the real Pod followed by `}}}}` (not exactly one JSON value).
    TrailingGarbage = 10,
    /// 200 with the real Pod and a second, empty `metadata` key after its own (one JSON
    /// value; a decoder that keeps the last key reads a pod without annotations).
    DuplicateKey = 11,
}

impl ApiMode {
    fn from_u8(v: u8) -> ApiMode {
        use ApiMode::*;
        [
            Up,
            Hang,
            Status500,
            Status404,
            Status401,
            Status403,
            Status400,
            Garbage,
            BadPod,
            Slow,
            TrailingGarbage,
            DuplicateKey,
        ]
        .into_iter()
        .find(|m| *m as u8 == v)
        .unwrap_or(Up)
    }

    /// The HTTP status line this mode answers with, when it forces one.
    fn forced_status(self) -> Option<(&'static str, u16)> {
        Some(match self {
            ApiMode::Status500 => ("500 Internal Server Error", 500),
            ApiMode::Status404 => ("404 Not Found", 404),
            ApiMode::Status401 => ("401 Unauthorized", 401),
            ApiMode::Status403 => ("403 Forbidden", 403),
            ApiMode::Status400 => ("400 Bad Request", 400),
            _ => return None,
        })
    }
}

/// `GET /api/v1/namespaces/{ns}/pods/{name}` (and the istio-cni DaemonSet, for the safe upgrade)
/// from a map keyed by the object's path (a stored 403 `Status` is answered as such); a 404
/// `Status` otherwise. Plain HTTP/1.1, one thread
/// per connection, bound to 127.0.0.1 inside a namespace.
pub struct FakeApi {
    pub port: u16,
    pods: Arc<Mutex<HashMap<String, Value>>>,
    mode: Arc<AtomicU8>,
    pub requests: Arc<AtomicUsize>,
    listener: TcpListener,
}

impl FakeApi {
    /// Starts the server inside `ns` (a socket belongs to the namespace it was created in, so
    /// it is reachable where the plugin runs).
    pub fn start(ns: &TestNetns) -> std::io::Result<FakeApi> {
        let listener = ns.run(|| TcpListener::bind("127.0.0.1:0"))??;
        let port = listener.local_addr()?.port();
        let api = FakeApi {
            port,
            pods: Arc::default(),
            mode: Arc::new(AtomicU8::new(ApiMode::Up as u8)),
            requests: Arc::default(),
            listener: listener.try_clone()?,
        };
        let (pods, mode, requests) = (api.pods.clone(), api.mode.clone(), api.requests.clone());
        std::thread::Builder::new()
            .name("fake-api".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { break };
                    if mode.load(Ordering::SeqCst) == u8::MAX {
                        break; // shut down by Drop
                    }
                    let (pods, mode, requests) = (pods.clone(), mode.clone(), requests.clone());
                    std::thread::spawn(move || serve(conn, &pods, &mode, &requests));
                }
            })?;
        Ok(api)
    }

    /// Serves `pod` as `namespace/name` (metadata.name/namespace are set accordingly).
    pub fn put(&self, namespace: &str, name: &str, mut pod: Value) {
        pod["metadata"]["name"] = name.into();
        pod["metadata"]["namespace"] = namespace.into();
        self.pods
            .lock()
            .unwrap()
            .insert(format!("/api/v1/namespaces/{namespace}/pods/{name}"), pod);
    }

    /// Serves `pod` as it is at `namespace/name`'s path (an answer naming another pod).
    pub fn put_verbatim(&self, namespace: &str, name: &str, pod: Value) {
        self.pods
            .lock()
            .unwrap()
            .insert(format!("/api/v1/namespaces/{namespace}/pods/{name}"), pod);
    }

    /// Serves the DaemonSet `namespace/name` (`deleting`: with a deletionTimestamp, as while
    /// `helm uninstall` deletes it); `None` removes it.
    pub fn put_daemonset(&self, namespace: &str, name: &str, deleting: Option<bool>) {
        let path = format!("/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}");
        let mut objects = self.pods.lock().unwrap();
        match deleting {
            None => {
                objects.remove(&path);
            }
            Some(deleting) => {
                let mut ds = json!({"kind": "DaemonSet", "apiVersion": "apps/v1",
                    "metadata": {"name": name, "namespace": namespace, "uid": "ds-uid"},
                    "spec": {"selector": {}, "template": {}}});
                if deleting {
                    ds["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
                }
                objects.insert(path, ds);
            }
        }
    }

    /// The DaemonSet `namespace/name` answers 403 Forbidden, as the API server does once `helm
    /// uninstall` deleted the ServiceAccount (or RBAC grants no `get` on it).
    pub fn forbid_daemonset(&self, namespace: &str, name: &str) {
        let path = format!("/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}");
        let forbidden = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "Forbidden", "code": 403,
            "message": format!("daemonsets.apps \"{name}\" is forbidden: User \"system:serviceaccount:{namespace}:istio-cni\" cannot get resource \"daemonsets\" in API group \"apps\" in the namespace \"{namespace}\"")});
        self.pods.lock().unwrap().insert(path, forbidden);
    }

    pub fn set_mode(&self, mode: ApiMode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        // shutdown() on a listening socket makes the blocked accept() fail (EINVAL), which
        // ends the accept loop and its thread.
        use std::os::fd::AsRawFd;
        self.mode.store(u8::MAX, Ordering::SeqCst);
        // SAFETY: shutdown on a socket fd we own (a clone of the listener).
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

fn serve(
    mut conn: TcpStream,
    pods: &Mutex<HashMap<String, Value>>,
    mode: &AtomicU8,
    requests: &AtomicUsize,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    requests.fetch_add(1, Ordering::SeqCst);
    let mode = ApiMode::from_u8(mode.load(Ordering::SeqCst));
    if mode == ApiMode::Hang {
        // Hold the connection open without answering until the client gives up.
        let _ = conn.read(&mut chunk);
        return;
    }
    if mode == ApiMode::Slow {
        std::thread::sleep(Duration::from_millis(1500));
    }
    let reply = |conn: &mut TcpStream, status: &str, body: &str| {
        let _ = write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    };
    if let Some((line, code)) = mode.forced_status() {
        let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": format!("forced {code}"), "reason": "Forced", "code": code});
        return reply(&mut conn, line, &body.to_string());
    }
    if mode == ApiMode::Garbage {
        return reply(&mut conn, "200 OK", "<html>not json");
    }
    if mode == ApiMode::BadPod {
        return reply(
            &mut conn,
            "200 OK",
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"x"},"spec":{"containers":"istio-proxy"}}"#,
        );
    }
    let head = String::from_utf8_lossy(&buf);
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .split('?')
        .next()
        .unwrap_or("")
        .to_string();
    let pod = pods.lock().unwrap().get(&path).cloned();
    let (status, body) = match pod {
        // A stored Status is answered with its code (`forbid_daemonset`).
        Some(p) if p["kind"] == "Status" && p["code"] == 403 => ("403 Forbidden", p),
        Some(p) => ("200 OK", p),
        None => (
            "404 Not Found",
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": format!("{path} not found"), "reason": "NotFound", "code": 404}),
        ),
    };
    let mut body = body.to_string();
    if mode == ApiMode::TrailingGarbage {
        body.push_str("}}}}");
    }
    if mode == ApiMode::DuplicateKey && body.ends_with('}') {
        body.pop();
        body.push_str(r#","metadata":{}}"#);
    }
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// What one command printed and how long it took.
#[derive(Debug)]
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn from_output(out: Output, elapsed: Duration) -> Run {
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed,
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    #[track_caller]
    pub fn assert_ok(&self) -> &Self {
        assert!(self.ok, "command failed: {self:#?}");
        self
    }

    /// cnitool prints the plugin's CNI error as its own error text: the code and message.
    #[track_caller]
    pub fn assert_err(&self, code: u32, msg_contains: &[&str]) -> &Self {
        assert!(!self.ok, "command unexpectedly succeeded: {self:#?}");
        let all = format!("{}{}", self.stdout, self.stderr);
        for m in msg_contains {
            assert!(all.contains(m), "{m:?} not in the error: {self:#?}");
        }
        if let Ok(v) = serde_json::from_str::<Value>(self.stdout.trim()) {
            assert_eq!(v["code"], code, "{self:#?}");
        } else {
            assert!(
                all.contains(&code.to_string()),
                "code {code} not in {self:#?}"
            );
        }
        self
    }
}

/// How to call `cnitool` on a node.
#[derive(Clone, Debug)]
pub struct CniTool<'a> {
    /// The node namespace cnitool (and so every plugin) runs in.
    pub node: &'a TestNetns,
    /// `NETCONFPATH`: the directory with the conflists.
    pub netconf: &'a Path,
    /// `CNI_PATH`, colon-separated.
    pub cni_path: String,
}

impl CniTool<'_> {
    /// `cnitool <command> <net> <pod netns>` inside the node with `CNI_ARGS`, as a runtime
    /// calls the chain (`CNI_IFNAME=eth0`).
    pub fn run(&self, net: &str, command: &str, pod: &Path, cni_args: &str) -> Run {
        self.run_with_caps(net, command, pod, cni_args, None)
    }

    /// [`CniTool::run`] with `CAP_ARGS` (cnitool's capability arguments, e.g.
    /// `{"ips": [..]}`, passed as `runtimeConfig` to plugins that declare the capability).
    pub fn run_with_caps(
        &self,
        net: &str,
        command: &str,
        pod: &Path,
        cni_args: &str,
        cap_args: Option<&str>,
    ) -> Run {
        let start = Instant::now();
        let out = self
            .node
            .run(|| {
                let mut cmd = Command::new(CNITOOL);
                cmd.args([command, net])
                    .arg(pod)
                    .env("NETCONFPATH", self.netconf)
                    .env("CNI_PATH", &self.cni_path)
                    .env("CNI_ARGS", cni_args)
                    .env("CNI_IFNAME", "eth0")
                    .env_remove("CAP_ARGS")
                    .stdin(Stdio::null());
                if let Some(caps) = cap_args {
                    cmd.env("CAP_ARGS", caps);
                }
                cmd.output()
            })
            .expect("thread in the node namespace")
            .expect("cnitool runs");
        Run::from_output(out, start.elapsed())
    }
}

/// nft (stateless: no counters) and iptables-legacy rules in a namespace ("" when none).
pub fn rules(ns: &TestNetns) -> String {
    let nft = ns.exec_ok("nft", &["-s", "list", "ruleset"]).unwrap();
    let legacy = ns
        .exec("iptables-legacy-save", &[])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let legacy: String = legacy
        .lines()
        .filter(|l| l.starts_with("-A"))
        .map(|l| format!("{l}\n"))
        .collect();
    nft.trim().to_string() + legacy.trim()
}

/// The pod's first address of the given family from an ADD result.
pub fn result_ip(result: &Value, v6: bool) -> Option<std::net::IpAddr> {
    result["ips"].as_array()?.iter().find_map(|ip| {
        let a: std::net::IpAddr = ip["address"].as_str()?.split('/').next()?.parse().ok()?;
        (a.is_ipv6() == v6).then_some(a)
    })
}

/// The pod's IPv4 address from an ADD result.
pub fn pod_ip(result: &Value) -> std::net::IpAddr {
    result_ip(result, false).expect("an IPv4 address in the ADD result")
}

/// Standard base64 (kubeconfig CA data).
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// CNI_ARGS as kubelet/containerd send them.
pub fn k8s_args(k8s_ns: &str, name: &str) -> String {
    if k8s_ns.is_empty() {
        "IgnoreUnknown=1".to_string()
    } else {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={k8s_ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=0123456789abcdef"
        )
    }
}

/// The plugin's own ADD durations, from its JSON log (`command succeeded`, `elapsed_us`).
pub fn plugin_adds(log: &str) -> Vec<Duration> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            l["fields"]["message"] == "command succeeded" && l["spans"][0]["command"] == "ADD"
        })
        .filter_map(|l| l["fields"]["elapsed_us"].as_u64())
        .map(Duration::from_micros)
        .collect()
}

/// Percentile of sorted samples (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
