//! Hostile clients on one of the daemon's unix sockets (`pods.sock`, `pluginevent.sock`):
//! connections that send nothing, half a head, a 64 KiB header, garbage, or a whole request
//! whose answer they never read, plus one head trickled a byte every 20 ms.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Opens up to `n` hostile connections to `socket` (each kind in turn) and starts the
/// trickler; the connections stay open until the returned vector is dropped.
pub fn flood(socket: &Path, n: usize) -> Vec<UnixStream> {
    let big_header = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(64 << 10));
    let mut open = Vec::with_capacity(n);
    for i in 0..n {
        let Ok(mut s) = UnixStream::connect(socket) else {
            continue;
        };
        let _ = s.set_nonblocking(true);
        let _ = match i % 5 {
            0 => Ok(()),
            1 => s.write_all(b"POST / HTTP/1.1\r\nHost: a\r\n"),
            2 => s.write_all(big_header.as_bytes()),
            3 => s.write_all(b"\x00\xffnot http\r\n\r\n"),
            _ => s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
        };
        open.push(s);
    }
    if let Ok(mut s) = UnixStream::connect(socket) {
        std::thread::spawn(move || {
            for b in b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: "
                .iter()
                .chain(&[b'a'; 4096])
            {
                if s.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }
    open
}
