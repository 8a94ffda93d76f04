//! The fake API server's whole-server faults ([`ApiMode`]): what a client of any request sees
//! from a server that hangs, is slow, refuses with a status, or answers something that is not
//! (exactly) the object asked for.

use super::Inner;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How the server answers every request ([`super::FakeKube::set_mode`]); `Up` is the normal
/// server. The plugin's pod lookup is what these are made for: each is one way a lookup fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApiMode {
    #[default]
    Up,
    /// Accepts connections and never answers (the client's per-request timeout).
    Hang,
    /// Answers every request with this HTTP status and a Kubernetes `Status` body.
    Status500,
    Status404,
    Status401,
    Status403,
    Status400,
    /// 200 with a body that is not JSON.
    Garbage,
    /// 200 with a Pod whose `spec.containers` is a string.
    BadPod,
    /// Answers after 1.5 s (slower than a short per-request timeout).
    Slow,
    /// A single object's GET: its answer followed by `}}}}` (not exactly one JSON value).
    TrailingGarbage,
    /// A single object's GET: its answer with a second, empty `metadata` key after its own (one
    /// JSON value; a decoder that keeps the last key reads a pod without annotations).
    DuplicateKey,
}

impl ApiMode {
    /// The HTTP status this mode answers with, when it forces one.
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

/// Answers the request as the server's mode says; `false` when it is to be served as usual
/// (after the delay, for `Slow`). `usual` is the answer the server would give (status line,
/// body), which the corrupting modes start from.
pub(super) fn answer_in_mode(
    conn: &mut TcpStream,
    inner: &Inner,
    usual: impl FnOnce() -> (String, Value),
) -> bool {
    let mode = *inner.mode.lock().unwrap();
    match mode {
        ApiMode::Up => false,
        ApiMode::Hang => {
            // Hold the connection open without answering until the client gives up.
            let _ = conn.read(&mut [0u8; 64]);
            true
        }
        ApiMode::Slow => {
            std::thread::sleep(Duration::from_millis(1500));
            false
        }
        ApiMode::Garbage => {
            raw(conn, "200 OK", "<html>not json");
            true
        }
        ApiMode::BadPod => {
            raw(
                conn,
                "200 OK",
                r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"x"},"spec":{"containers":"istio-proxy"}}"#,
            );
            true
        }
        ApiMode::TrailingGarbage | ApiMode::DuplicateKey => {
            let (line, body) = usual();
            let mut body = body.to_string();
            if mode == ApiMode::TrailingGarbage {
                body.push_str("}}}}");
            } else if body.ends_with('}') {
                body.pop();
                body.push_str(r#","metadata":{}}"#);
            }
            raw(conn, &line, &body);
            true
        }
        forced => {
            let (line, code) = forced.forced_status().expect("a status mode");
            let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": format!("forced {code}"), "reason": "Forced",
                "code": code});
            raw(conn, line, &body.to_string());
            true
        }
    }
}

/// An answer written as it is (the body need not be JSON).
pub(super) fn raw(conn: &mut TcpStream, status: &str, body: &str) {
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
