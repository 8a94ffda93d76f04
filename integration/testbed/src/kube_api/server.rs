//! The fake API server's HTTP side: one request per connection, read, recorded, answered as
//! the server's mode says ([`super::faults`]) or routed by method and path to a handler that
//! answers like the API server does.

use super::{
    Inner, Req, WATCH_HEAD, Watcher, chunked, faults, is_watch, merge_metadata, node_selected,
    push, resource_version_param, selected_node, status, watch_end,
};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Reads one request (head, then `Content-Length` bytes of body).
fn read_request(conn: &mut TcpStream) -> Option<Req> {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
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
    Some(Req {
        method,
        path: path.to_string(),
        query: query.to_string(),
        content_type: header("content-type"),
        body,
    })
}

fn reply(conn: &mut TcpStream, status: &str, v: &Value) {
    faults::raw(conn, status, &v.to_string());
}

fn not_found(conn: &mut TcpStream, what: &str) {
    reply(conn, "404 Not Found", &status(404, "NotFound", what));
}

/// A 500 when the test asked for failures of this method (`FakeKube::fail_next`).
fn injected_failure(inner: &Inner, method: &str) -> bool {
    let mut fail = inner.fail.lock().unwrap();
    match fail.get_mut(method) {
        Some(n) if *n > 0 => {
            *n -= 1;
            true
        }
        _ => false,
    }
}

/// Takes one from a fault counter; `true` while there were some left.
fn take(counter: &std::sync::atomic::AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

pub(super) fn serve(mut conn: TcpStream, inner: &Inner) {
    let Some(req) = read_request(&mut conn) else {
        return;
    };
    inner.requests.lock().unwrap().push(req.clone());
    if faults::answer_in_mode(&mut conn, inner, || object_answer(inner, &req)) {
        return;
    }
    if injected_failure(inner, &req.method) {
        return reply(
            &mut conn,
            "500 Internal Server Error",
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "injected failure", "reason": "InternalError", "code": 500}),
        );
    }
    let canned = inner.canned.lock().unwrap().contains_key(&req.path);
    if inner.objects_only.load(Ordering::SeqCst) || (canned && req.method == "GET") {
        let (line, body) = match req.method.as_str() {
            "GET" => object_answer(inner, &req),
            _ => (
                "404 Not Found".into(),
                status(404, "NotFound", "objects only"),
            ),
        };
        return reply(&mut conn, &line, &body);
    }
    let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let (query, body) = (req.query.as_str(), req.body.as_str());
    match (req.method.as_str(), parts.as_slice()) {
        ("GET", ["api", "v1", "pods"]) if is_watch(query) => watch_pods(conn, inner, query),
        ("GET", ["api", "v1", "pods"]) if take(&inner.hang_lists) => {
            inner.hung.lock().unwrap().push(conn)
        }
        ("GET", ["api", "v1", "pods"]) => list_pods(&mut conn, inner, query),
        ("GET", ["api", "v1", "namespaces", _, "pods", _]) if take(&inner.hang_pod_gets) => {
            inner.hung.lock().unwrap().push(conn)
        }
        ("GET", ["api", "v1", "namespaces", _, "pods", _]) => {
            let (line, body) = object_answer(inner, &req);
            reply(&mut conn, &line, &body)
        }
        ("GET", ["api", "v1", "namespaces"]) if is_watch(query) => {
            watch_namespaces(conn, inner, query)
        }
        ("GET", ["api", "v1", "namespaces"]) => list_namespaces(&mut conn, inner),
        ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => match find(inner, ns, name) {
            Some(p) => reply(&mut conn, "200 OK", &p),
            None => reply(
                &mut conn,
                "404 Not Found",
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "reason": "NotFound", "code": 404}),
            ),
        },
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            patch_pod_status(&mut conn, inner, ns, name, body)
        }
        ("GET", ["api", "v1", "namespaces", name]) => {
            match inner.namespaces.lock().unwrap().get(*name).cloned() {
                Some(ns) => reply(&mut conn, "200 OK", &ns),
                None => not_found(&mut conn, "namespace not found"),
            }
        }
        ("PATCH", ["api", "v1", "namespaces", _, "pods", _]) if take(&inner.hang_pod_patches) => {
            inner.hung.lock().unwrap().push(conn)
        }
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name]) => {
            patch_pod_annotations(&mut conn, inner, ns, name, body)
        }
        ("GET", ["api", "v1", "nodes", name]) => get_node(&mut conn, inner, name),
        ("GET", ["apis", "apps", "v1", "namespaces", _, "daemonsets", _]) => {
            let (line, body) = object_answer(inner, &req);
            reply(&mut conn, &line, &body)
        }
        ("PATCH", ["api", "v1", "nodes", name]) => patch_node(&mut conn, inner, name, body),
        ("POST", ["api", "v1", "namespaces", _, "events"]) if take(&inner.hang_event_posts) => {
            inner.hung.lock().unwrap().push(conn)
        }
        ("POST", ["api", "v1", "namespaces", _, "events"]) => {
            let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
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

/// The answer to a GET of one object: a canned answer at its path, else the stored pod or
/// DaemonSet, else a 404 `Status`.
pub(super) fn object_answer(inner: &Inner, req: &Req) -> (String, Value) {
    if let Some(answer) = inner.canned.lock().unwrap().get(&req.path) {
        return answer.clone();
    }
    let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let found = match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name] => {
            find(inner, ns, name).ok_or(format!("pods \"{name}\" not found"))
        }
        ["apis", "apps", "v1", "namespaces", ns, "daemonsets", name] => {
            let key = format!("{ns}/{name}");
            let ds = inner.daemonsets.lock().unwrap().get(&key).cloned();
            ds.ok_or(format!("daemonsets.apps \"{name}\" not found"))
        }
        _ => Err(format!("{} not found", req.path)),
    };
    match found {
        Ok(object) => ("200 OK".into(), object),
        Err(message) => ("404 Not Found".into(), status(404, "NotFound", &message)),
    }
}

pub(super) fn find(inner: &Inner, ns: &str, name: &str) -> Option<Value> {
    inner
        .pods
        .lock()
        .unwrap()
        .iter()
        .find(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name)
        .cloned()
}

/// A pod watch: the history after the requested version, then every change as it happens;
/// or, as the test asked, an ERROR event (a brownout) or `410 Gone` (a compacted version).
fn watch_pods(mut conn: TcpStream, inner: &Inner, query: &str) {
    let from = resource_version_param(query);
    let _ = conn.write_all(WATCH_HEAD);
    let mut ws = inner.watchers.lock().unwrap();
    let brownout = take(&inner.failing_watches);
    let expired = take(&inner.expiring_watches) || from < inner.compacted.load(Ordering::SeqCst);
    if brownout || expired {
        let st = if expired {
            status(410, "Expired", "too old resource version")
        } else {
            status(500, "InternalError", "etcdserver: request timed out")
        };
        let line = format!("{}\n", json!({"type": "ERROR", "object": st}));
        let _ = conn.write_all(chunked(&line).as_bytes());
        let _ = conn.write_all(b"0\r\n\r\n");
        return;
    }
    let watcher = Watcher {
        stream: conn,
        node: selected_node(query),
        ends: watch_end(query),
    };
    for (rv, line, node) in inner.history.lock().unwrap().iter() {
        if *rv > from && watcher.wants(node.as_deref()) {
            let _ = (&watcher.stream).write_all(chunked(line).as_bytes());
        }
    }
    ws.push(watcher);
}

fn list_pods(conn: &mut TcpStream, inner: &Inner, query: &str) {
    let want = selected_node(query);
    let items: Vec<Value> = inner
        .pods
        .lock()
        .unwrap()
        .iter()
        .filter(|p| node_selected(want.as_deref(), p["spec"]["nodeName"].as_str()))
        .cloned()
        .collect();
    // The version of the newest change (next_rv hands out the counter, then bumps it).
    let rv = (inner.rv.load(Ordering::SeqCst) - 1).to_string();
    reply(
        conn,
        "200 OK",
        &json!({"kind": "PodList", "apiVersion": "v1",
                "metadata": {"resourceVersion": rv}, "items": items}),
    );
}

fn watch_namespaces(mut conn: TcpStream, inner: &Inner, query: &str) {
    let from = resource_version_param(query);
    let _ = conn.write_all(WATCH_HEAD);
    let mut ws = inner.ns_watchers.lock().unwrap();
    for (rv, line, _) in inner.ns_history.lock().unwrap().iter() {
        if *rv > from {
            let _ = conn.write_all(chunked(line).as_bytes());
        }
    }
    ws.push((conn, watch_end(query)));
}

fn list_namespaces(conn: &mut TcpStream, inner: &Inner) {
    let items: Vec<Value> = inner.namespaces.lock().unwrap().values().cloned().collect();
    let rv = (inner.rv.load(Ordering::SeqCst) - 1).to_string();
    reply(
        conn,
        "200 OK",
        &json!({"kind": "NamespaceList", "apiVersion": "v1",
                "metadata": {"resourceVersion": rv}, "items": items}),
    );
}

/// A new resourceVersion for a changed stored pod (under the pods' lock); the copy to announce.
fn bump(inner: &Inner, p: &mut Value) -> Value {
    p["metadata"]["resourceVersion"] = inner.rv.fetch_add(1, Ordering::SeqCst).to_string().into();
    p.clone()
}

/// Tells the watches (MODIFIED) and answers the changed pod.
fn announce(conn: &mut TcpStream, inner: &Inner, p: &Value) {
    push(inner, "MODIFIED", p);
    reply(conn, "200 OK", p);
}

/// Merge patch of labels and annotations (what the status subresource lets a client change
/// in metadata): stored, and sent to the watches as MODIFIED, as a real API server does. A pod
/// not stored is answered but not kept.
fn patch_pod_status(conn: &mut TcpStream, inner: &Inner, ns: &str, name: &str, body: &str) {
    let patch: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let mut pods = inner.pods.lock().unwrap();
    let stored = pods
        .iter_mut()
        .find(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name);
    let Some(p) = stored else {
        drop(pods);
        let mut p = json!({"metadata": {}});
        merge_metadata(&mut p, &patch);
        return reply(conn, "200 OK", &p);
    };
    merge_metadata(p, &patch);
    let p = bump(inner, p);
    drop(pods);
    announce(conn, inner, &p);
}

/// Merge patch of annotations: stored, and sent to the watches as MODIFIED.
fn patch_pod_annotations(conn: &mut TcpStream, inner: &Inner, ns: &str, name: &str, body: &str) {
    let patch: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let mut pods = inner.pods.lock().unwrap();
    let Some(p) = pods
        .iter_mut()
        .find(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name)
    else {
        drop(pods);
        return not_found(conn, "pod not found");
    };
    if let Some(a) = patch["metadata"]["annotations"].as_object() {
        for (k, v) in a {
            p["metadata"]["annotations"][k] = v.clone();
        }
    }
    let p = bump(inner, p);
    drop(pods);
    announce(conn, inner, &p);
}

fn get_node(conn: &mut TcpStream, inner: &Inner, name: &str) {
    let mut nodes = inner.nodes.lock().unwrap();
    let Some(node) = nodes.get_mut(name) else {
        drop(nodes);
        return not_found(conn, "node not found");
    };
    let got = node.clone();
    if take(&inner.race_node_gets) {
        // Another writer (say, the node lifecycle controller) changes the node.
        node["metadata"]["resourceVersion"] =
            inner.rv.fetch_add(1, Ordering::SeqCst).to_string().into();
        node["metadata"]["labels"]["touched"] = "yes".into();
    }
    drop(nodes);
    reply(conn, "200 OK", &got);
}

/// Merge patch of the taints; a resourceVersion that is not the node's current one gets
/// `409 Conflict`, as on a real API server.
fn patch_node(conn: &mut TcpStream, inner: &Inner, name: &str, body: &str) {
    let patch: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let mut nodes = inner.nodes.lock().unwrap();
    let Some(node) = nodes.get_mut(name) else {
        drop(nodes);
        return not_found(conn, "node not found");
    };
    let want = &patch["metadata"]["resourceVersion"];
    if !want.is_null() && *want != node["metadata"]["resourceVersion"] {
        drop(nodes);
        return reply(
            conn,
            "409 Conflict",
            &status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version and try again",
            ),
        );
    }
    if let Some(t) = patch["spec"].get("taints") {
        node["spec"]["taints"] = t.clone();
    }
    node["metadata"]["resourceVersion"] =
        inner.rv.fetch_add(1, Ordering::SeqCst).to_string().into();
    let n = node.clone();
    drop(nodes);
    reply(conn, "200 OK", &n);
}
