//! Both halves against each other on a real socket: answers, bounds, and a hostile run dir.

mod common;

use common::echo_server;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::{Duration, Instant};
use uds_http::Method;
use uds_http::client::{ClientError, request};
use uds_http::server::bind;

#[test]
fn a_request_gets_the_handlers_answer_on_a_root_only_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    echo_server(path.clone());
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let a = request(
        &path,
        Method::POST,
        "/x?a=1",
        b"hi".to_vec(),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!((a.status, a.text()), (200, "POST /x?a=1 hi".to_string()));
}

#[test]
fn a_body_over_the_bound_is_refused_without_the_handler() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    echo_server(path.clone());
    let a = request(
        &path,
        Method::POST,
        "/",
        vec![b'x'; 4096],
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(a.status, 413, "{}", a.text());
}

#[test]
fn a_server_that_never_answers_costs_the_timeout_and_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hung.sock");
    // Accepts (the kernel's backlog) but never reads or answers.
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let start = Instant::now();
    let e = request(&path, Method::GET, "/", vec![], Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn no_socket_is_unreachable_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let e = request(
        &dir.path().join("none.sock"),
        Method::GET,
        "/",
        vec![],
        Duration::from_secs(5),
    )
    .unwrap_err();
    assert!(matches!(e, ClientError::Unreachable { .. }), "{e}");
}

#[test]
fn bind_replaces_a_stale_socket_but_never_a_planted_file_or_link() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _g = rt.enter();
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    bind(&stale).expect("a stale socket is replaced");

    let target = dir.path().join("victim");
    std::fs::write(&target, "keep").unwrap();
    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = bind(&link).unwrap_err();
    assert!(e.to_string().contains("not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");

    let file = dir.path().join("file.sock");
    std::fs::write(&file, "x").unwrap();
    assert!(bind(&file).is_err());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
}

#[test]
fn a_full_backlog_costs_the_timeout_and_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stopped.sock");
    // A daemon that stopped accepting: its listen queue fills up.
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let queued = fill_backlog(&path);
    let start = Instant::now();
    let e = request(&path, Method::GET, "/", vec![], Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    drop(queued);
}

#[test]
fn a_listen_queue_that_drains_within_the_deadline_is_connected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("burst.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let queued = fill_backlog(&path);
    // The daemon catches up after 200 ms: answers everything queued, then the newcomer.
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        for mut s in listener.incoming().flatten() {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    let a = request(&path, Method::GET, "/", vec![], Duration::from_secs(5))
        .expect("connected once the queue drained");
    assert_eq!((a.status, a.text()), (200, "ok".to_string()));
    drop(queued);
}

/// Connects until the listener's queue is full; the queued connections.
fn fill_backlog(path: &std::path::Path) -> Vec<socket2::Socket> {
    let addr = socket2::SockAddr::unix(path).unwrap();
    let mut queued = Vec::new();
    loop {
        let s = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        match s.connect(&addr) {
            Ok(()) => queued.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
        assert!(queued.len() < 100_000, "the backlog never filled");
    }
    queued
}
