//! A local Kubernetes API server for the repair controller: the pod LIST and WATCH a watcher
//! makes (real watch JSON events over a chunked response), DELETE pod, PATCH pods/status and
//! POST events, every request recorded (method, path, query, content type, body).
#![allow(dead_code)]

use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Req {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: String,
}

impl Req {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

#[derive(Default)]
struct Inner {
    pods: Mutex<Vec<Value>>,
    requests: Mutex<Vec<Req>>,
    watchers: Mutex<Vec<TcpStream>>,
    rv: AtomicU64,
    /// Method → how many more requests of it get a 500.
    fail: Mutex<HashMap<String, u32>>,
}

pub struct FakeKube {
    pub port: u16,
    inner: Arc<Inner>,
}

impl FakeKube {
    pub fn start() -> FakeKube {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let inner = Arc::new(Inner {
            rv: AtomicU64::new(100),
            ..Default::default()
        });
        let i2 = inner.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { break };
                let i = i2.clone();
                std::thread::spawn(move || serve(conn, &i));
            }
        });
        FakeKube { port, inner }
    }

    /// A kubeconfig pointing at this server (plain HTTP, a dummy token).
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let p = dir.join("repair-kubeconfig");
        std::fs::write(
            &p,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{}\nusers:\n- name: u\n  user:\n    token: test-token\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\ncurrent-context: c\n",
                self.port
            ),
        )
        .unwrap();
        p
    }

    fn next_rv(&self) -> String {
        self.inner.rv.fetch_add(1, Ordering::SeqCst).to_string()
    }

    fn push(&self, kind: &str, pod: &Value) {
        let line = format!("{}\n", json!({"type": kind, "object": pod}));
        let chunk = format!("{:x}\r\n{line}\r\n", line.len());
        let mut ws = self.inner.watchers.lock().unwrap();
        ws.retain_mut(|s| s.write_all(chunk.as_bytes()).is_ok());
    }

    /// Stores `pod` (listed from now on) and sends ADDED to every open watch.
    pub fn add(&self, mut pod: Value) -> Value {
        pod["metadata"]["resourceVersion"] = self.next_rv().into();
        self.inner.pods.lock().unwrap().push(pod.clone());
        self.push("ADDED", &pod);
        pod
    }

    /// Sends MODIFIED for `pod` (new resourceVersion).
    pub fn modify(&self, mut pod: Value) -> Value {
        pod["metadata"]["resourceVersion"] = self.next_rv().into();
        let mut pods = self.inner.pods.lock().unwrap();
        pods.retain(|p| p["metadata"]["uid"] != pod["metadata"]["uid"]);
        pods.push(pod.clone());
        drop(pods);
        self.push("MODIFIED", &pod);
        pod
    }

    pub fn watchers(&self) -> usize {
        self.inner.watchers.lock().unwrap().len()
    }

    pub fn requests(&self) -> Vec<Req> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// Requests other than the pod list/watch.
    pub fn actions(&self) -> Vec<Req> {
        self.requests()
            .into_iter()
            .filter(|r| !(r.method == "GET" && r.path == "/api/v1/pods"))
            .collect()
    }

    pub fn events(&self) -> Vec<Value> {
        self.actions()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .map(Req::json)
            .collect()
    }

    /// The next `n` requests with `method` get a 500.
    pub fn fail_next(&self, method: &str, n: u32) {
        self.inner.fail.lock().unwrap().insert(method.into(), n);
    }
}

/// A pod on `node` whose istio-validation init container last exited with `code` and is now
/// waiting in CrashLoopBackOff; a sidecar pod in every other respect.
pub fn broken_pod(ns: &str, name: &str, uid: &str, ip: &str, node: &str, code: i32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid,
                     "annotations": {"sidecar.istio.io/status": "{\"initContainers\":[\"istio-validation\"]}"}},
        "spec": {
            "nodeName": node,
            "initContainers": [{"name": "istio-validation", "image": "proxyv2"}],
            "containers": [
                {"name": "app", "image": "app"},
                {"name": "istio-proxy", "image": "proxyv2", "args": ["proxy", "sidecar"],
                 "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}
            ]
        },
        "status": {
            "phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}],
            "initContainerStatuses": [{
                "name": "istio-validation", "ready": false, "restartCount": 2,
                "image": "proxyv2", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": code, "reason": "Error"}}
            }]
        }
    })
}

fn serve(mut conn: TcpStream, inner: &Inner) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let header = |name: &str| -> String {
        head.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default()
    };
    let len: usize = header("content-length").parse().unwrap_or(0);
    while buf.len() < head_end + len {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = String::from_utf8_lossy(&buf[head_end..(head_end + len).min(buf.len())]).to_string();
    let mut words = head.split_whitespace();
    let method = words.next().unwrap_or("").to_string();
    let target = words.next().unwrap_or("").to_string();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let req = Req {
        method: method.clone(),
        path: path.to_string(),
        query: query.to_string(),
        content_type: header("content-type"),
        body: body.clone(),
    };
    inner.requests.lock().unwrap().push(req);

    let reply = |conn: &mut TcpStream, status: &str, v: &Value| {
        let b = v.to_string();
        let _ = write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        );
    };
    {
        let mut fail = inner.fail.lock().unwrap();
        if let Some(n) = fail.get_mut(&method)
            && *n > 0
        {
            *n -= 1;
            drop(fail);
            return reply(
                &mut conn,
                "500 Internal Server Error",
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "injected failure", "reason": "InternalError", "code": 500}),
            );
        }
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let find = |ns: &str, name: &str| -> Option<Value> {
        inner
            .pods
            .lock()
            .unwrap()
            .iter()
            .find(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name)
            .cloned()
    };
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["api", "v1", "pods"]) if query.split('&').any(|kv| kv == "watch=true") => {
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            inner.watchers.lock().unwrap().push(conn);
        }
        ("GET", ["api", "v1", "pods"]) => {
            let items = inner.pods.lock().unwrap().clone();
            let rv = inner.rv.load(Ordering::SeqCst).to_string();
            reply(
                &mut conn,
                "200 OK",
                &json!({"kind": "PodList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": rv}, "items": items}),
            );
        }
        ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => match find(ns, name) {
            Some(p) => reply(&mut conn, "200 OK", &p),
            None => reply(
                &mut conn,
                "404 Not Found",
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "reason": "NotFound", "code": 404}),
            ),
        },
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            let mut p = find(ns, name).unwrap_or_else(|| json!({"metadata": {}}));
            if let Some(l) = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["metadata"]["labels"].as_object().cloned())
            {
                for (k, v) in l {
                    p["metadata"]["labels"][k] = v;
                }
            }
            reply(&mut conn, "200 OK", &p);
        }
        ("POST", ["api", "v1", "namespaces", _, "events"]) => {
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            reply(&mut conn, "201 Created", &v);
        }
        _ => reply(
            &mut conn,
            "404 Not Found",
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "reason": "NotFound", "code": 404}),
        ),
    }
}
