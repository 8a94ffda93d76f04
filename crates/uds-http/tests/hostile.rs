//! Both halves against a hostile peer. The server: clients that connect and never send, send
//! half a request, trickle it byte by byte, send oversized or malformed heads, keep the
//! connection open or never read the answer, and floods of them, while a real request must
//! still be answered in time with the server's connections bounded. The client: a daemon that
//! reads and never answers, answers a byte at a time, declares a huge body, streams an endless
//! one or answers chunked.

mod common;

use common::{BIG, echo_server};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use uds_http::Method;
use uds_http::client::{ClientError, request};
use uds_http::server::{MAX_CONNECTIONS, REQUEST_TIMEOUT};

/// On top of a bound: scheduling on a loaded machine.
const SLACK: Duration = Duration::from_millis(1500);

fn server() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    echo_server(path.clone());
    (dir, path)
}

/// A real request (the plugin's) must be answered, fast.
#[track_caller]
fn answered(path: &Path) -> Duration {
    let start = Instant::now();
    let a = request(path, Method::GET, "/ok", vec![], Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("a real request during the attack: {e}"));
    assert_eq!((a.status, a.text()), (200, "GET /ok ".trim().to_string()));
    start.elapsed()
}

/// Reads until the server closes; how long that took and what it sent, or `None` if it kept
/// the connection past `patience`.
fn closed_within(s: &mut UnixStream, patience: Duration) -> Option<(Duration, Vec<u8>)> {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        let left = patience.saturating_sub(start.elapsed());
        if left.is_zero() {
            return None;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return Some((start.elapsed(), got)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some((start.elapsed(), got));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(e) => panic!("{e}"),
        }
    }
}

/// The server closes `s` within the request bound; what it answered, if anything.
#[track_caller]
fn cut_off(what: &str, s: &mut UnixStream) -> String {
    let patience = REQUEST_TIMEOUT * 5;
    let (took, got) = closed_within(s, patience)
        .unwrap_or_else(|| panic!("{what}: connection still open after {patience:?}"));
    assert!(
        took < REQUEST_TIMEOUT + SLACK,
        "{what}: closed after {took:?}, the bound is {REQUEST_TIMEOUT:?}"
    );
    String::from_utf8_lossy(&got).into_owned()
}

/// Writes `bytes` one at a time, `every` apart, until the peer closes or `bytes` run out.
fn trickle(mut s: UnixStream, bytes: Vec<u8>, every: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for b in bytes {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(every);
        }
    })
}

#[test]
fn a_connection_that_never_sends_is_closed_at_the_bound() {
    let (_d, path) = server();
    let mut s = UnixStream::connect(&path).unwrap();
    cut_off("nothing sent", &mut s);
    answered(&path);
}

#[test]
fn half_a_request_is_closed_at_the_bound() {
    let (_d, path) = server();
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"GET /x HTTP/1.1\r\nHost: a\r\n").unwrap();
    cut_off("half a head", &mut s);
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nhalf")
        .unwrap();
    cut_off("half a body", &mut s);
}

#[test]
fn a_head_trickled_byte_by_byte_is_cut_off_at_the_bound() {
    let (_d, path) = server();
    let s = UnixStream::connect(&path).unwrap();
    let mut head = b"GET /x HTTP/1.1\r\nHost: a\r\nX-Slow: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 1000));
    let writer = trickle(s.try_clone().unwrap(), head, Duration::from_millis(20));
    cut_off("trickled head", &mut s.try_clone().unwrap());
    drop(s);
    writer.join().unwrap();
}

#[test]
fn a_body_trickled_byte_by_byte_is_cut_off_at_the_bound() {
    let (_d, path) = server();
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n")
        .unwrap();
    let writer = trickle(
        s.try_clone().unwrap(),
        vec![b'x'; 1000],
        Duration::from_millis(20),
    );
    let answer = cut_off("trickled body", &mut s);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    drop(s);
    writer.join().unwrap();
}

#[test]
fn oversized_heads_are_refused_at_once() {
    let (_d, path) = server();
    let many: String = (0..2000).map(|i| format!("X-H{i}: v\r\n")).collect();
    let huge = format!("X-Big: {}\r\n", "a".repeat(1 << 20));
    for (what, extra) in [("1 MiB header", huge), ("2000 headers", many)] {
        let mut s = UnixStream::connect(&path).unwrap();
        let head = format!("GET /x HTTP/1.1\r\nHost: a\r\n{extra}\r\n");
        let writer = std::thread::spawn({
            let mut s = s.try_clone().unwrap();
            move || drop(s.write_all(head.as_bytes()))
        });
        let start = Instant::now();
        let (took, got) = closed_within(&mut s, Duration::from_secs(10)).expect("closed");
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 431"), "{what}: {got:?}");
        assert!(took < SLACK, "{what}: {:?}", start.elapsed());
        writer.join().unwrap();
    }
    answered(&path);
}

#[test]
fn malformed_requests_are_refused_and_the_server_goes_on() {
    let (_d, path) = server();
    let cases: [&[u8]; 9] = [
        b"\x00\x01\x02garbage\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
        b"GET / HTTP/9.9\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"GET /\xff\xfe HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
    ];
    for case in cases {
        let what = String::from_utf8_lossy(case).into_owned();
        let mut s = UnixStream::connect(&path).unwrap();
        let _ = s.write_all(case);
        let answer = cut_off(&what, &mut s);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
            "{what:?}: {answer:?}"
        );
    }
    answered(&path);
}

#[test]
fn an_answered_connection_is_not_kept_open() {
    let (_d, path) = server();
    let mut s = UnixStream::connect(&path).unwrap();
    // HTTP/1.1 without `Connection: close`: keep-alive unless the server says otherwise.
    s.write_all(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let answer = cut_off("kept alive", &mut s);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

#[test]
fn a_client_that_never_reads_holds_nothing_else() {
    let (_d, path) = server();
    let readers: Vec<UnixStream> = (0..8)
        .map(|_| {
            let mut s = UnixStream::connect(&path).unwrap();
            s.write_all(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        assert!(answered(&path) < SLACK);
    }
    // The answers were really there, waiting for their readers.
    let mut first = readers.into_iter().next().unwrap();
    let (_, got) = closed_within(&mut first, Duration::from_secs(10)).expect("closed");
    assert!(got.len() > BIG, "{} bytes", got.len());
}

/// The descriptors this process holds for connections accepted on `path`'s listener: the
/// server's side only. Counted by socket inode (the kernel names an accepted socket by its
/// listener's path; the clients' ends have none), so the other tests of this binary, running
/// beside this one with servers of their own, cannot move the count.
fn server_side(path: &Path) -> usize {
    let name = path.to_str().unwrap();
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let on_path: std::collections::HashSet<&str> = table
        .lines()
        .filter(|l| l.ends_with(name))
        .filter_map(|l| l.split_whitespace().nth(6))
        .collect();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(on_path.contains(t))
        })
        .filter(|&ours| ours)
        .count()
}

/// As many descriptors as the hard limit allows (a flood needs thousands).
fn raise_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        l.rlim_cur = l.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &l), 0);
    }
}

#[test]
fn a_flood_of_idle_and_half_requests_is_bounded_and_real_requests_are_answered() {
    const FLOOD: usize = 1500;
    raise_fd_limit();
    let (_d, path) = server();
    let flood: Vec<UnixStream> = (0..FLOOD)
        .map(|i| {
            let mut s = UnixStream::connect(&path).unwrap();
            if i % 2 == 1 {
                let _ = s.write_all(b"GET /x HTTP/1.1\r\nHost: a\r\n");
            }
            s
        })
        .collect();
    let slowest = (0..10).map(|_| answered(&path)).max().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let server_side = server_side(&path);
    println!(
        "flood of {FLOOD}: server-side descriptors {server_side}, slowest real request {slowest:?}"
    );
    assert!(
        server_side <= MAX_CONNECTIONS + 1,
        "{server_side} server-side descriptors for {FLOOD} hostile connections (cap {MAX_CONNECTIONS})"
    );
    assert!(slowest < SLACK, "{slowest:?}");
    drop(flood);

    // A flood that keeps coming while real requests are made.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooder = std::thread::spawn({
        let (path, stop) = (path.clone(), stop.clone());
        move || {
            let mut open = std::collections::VecDeque::new();
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(s) = UnixStream::connect(&path) {
                    open.push_back(s);
                    n += 1;
                }
                if open.len() > 4000 {
                    open.pop_front();
                }
            }
            n
        }
    });
    let slowest = (0..20)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            answered(&path)
        })
        .max()
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened = flooder.join().unwrap();
    println!("ongoing flood of {opened} connections: slowest of 20 real requests {slowest:?}");
    assert!(slowest < SLACK, "{slowest:?}");
}

/// A daemon that accepts and answers each connection with `behave` (on its own thread).
fn fake_daemon(behave: fn(UnixStream)) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.sock");
    let listener = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || behave(s));
        }
    });
    (dir, path)
}

/// Reads the request's head, so the client has sent it all.
fn read_request(s: &mut UnixStream) {
    let mut buf = [0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// The client's error and how long it took, with `timeout`.
fn ask(path: &Path, timeout: Duration) -> (ClientError, Duration) {
    let start = Instant::now();
    let r = request(path, Method::GET, "/", vec![], timeout);
    let took = start.elapsed();
    match r {
        Ok(a) => panic!(
            "a hostile daemon's answer was taken: {} {:?}",
            a.status,
            a.text()
        ),
        Err(e) => (e, took),
    }
}

#[test]
fn a_daemon_that_reads_and_never_answers_costs_the_timeout() {
    let (_d, path) = fake_daemon(|mut s| {
        read_request(&mut s);
        std::thread::sleep(Duration::from_secs(60));
    });
    let (e, took) = ask(&path, Duration::from_millis(400));
    assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
    assert!(took < Duration::from_millis(400) + SLACK, "{took:?}");
}

#[test]
fn an_answer_a_byte_at_a_time_costs_the_timeout_and_no_more() {
    let (_d, path) = fake_daemon(|mut s| {
        read_request(&mut s);
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n{}",
            "x".repeat(10000)
        );
        for b in answer.bytes() {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let (e, took) = ask(&path, Duration::from_millis(500));
    assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
    assert!(took < Duration::from_millis(500) + SLACK, "{took:?}");
}

#[test]
fn a_huge_declared_body_is_refused_at_once() {
    let (_d, path) = fake_daemon(|mut s| {
        read_request(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\nxx");
        std::thread::sleep(Duration::from_secs(60));
    });
    let (e, took) = ask(&path, Duration::from_secs(5));
    assert!(e.to_string().contains("larger than"), "{e}");
    assert!(took < SLACK, "{took:?}");
}

#[test]
fn an_endless_body_is_cut_at_the_size_bound() {
    let (_d, path) = fake_daemon(|mut s| {
        read_request(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
        let chunk = vec![b'x'; 64 * 1024];
        while s.write_all(&chunk).is_ok() {}
    });
    let (e, took) = ask(&path, Duration::from_secs(10));
    assert!(e.to_string().contains("larger than"), "{e}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn a_chunked_answer_is_refused_not_taken_for_the_body() {
    // Finite and well-formed: its framing must not be handed on as the body.
    let (_d, path) = fake_daemon(|mut s| {
        read_request(&mut s);
        let _ = s.write_all(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        );
    });
    let (e, took) = ask(&path, Duration::from_secs(5));
    assert!(e.to_string().contains("chunked"), "{e}");
    assert!(took < SLACK, "{took:?}");
    // Endless: refused at its head, not after reading megabytes.
    let (_d, path) = fake_daemon(|mut s| {
        read_request(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        while s.write_all(b"4000\r\n").is_ok() && s.write_all(&[b'x'; 0x4000]).is_ok() {
            let _ = s.write_all(b"\r\n");
        }
    });
    let (e, took) = ask(&path, Duration::from_secs(5));
    assert!(e.to_string().contains("chunked"), "{e}");
    assert!(took < SLACK, "{took:?}");
}

/// EOF is the server's answer: a daemon that closes without answering (an agent SIGKILLed
/// mid-burst, a lookup socket whose server exits) fails the request at once, whole head or
/// half, instead of spinning on 0-byte reads until the deadline.
#[test]
fn a_daemon_that_closes_without_answering_fails_the_request_at_once() {
    let closes: [fn(UnixStream); 2] = [
        |mut s| read_request(&mut s),
        |mut s| {
            read_request(&mut s);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Le");
        },
    ];
    for (case, behave) in closes.into_iter().enumerate() {
        let (_d, path) = fake_daemon(behave);
        let (e, took) = ask(&path, Duration::from_secs(10));
        assert!(
            matches!(e, ClientError::Protocol { .. }) && e.to_string().contains("closed"),
            "case {case}: {e}"
        );
        assert!(took < SLACK, "case {case}: {took:?}");
    }
}
