//! One request, one answer, bounded by one timeout (connect, send and the whole body).
//!
//! Blocking on purpose: the plugin is a short-lived process that asks once, and a runtime plus
//! an HTTP client stack cost it more, cold, than the whole exchange (≈0.6 ms of a ≈2 ms ADD).
//! The request is written as HTTP/1.1 with `Connection: close`; the answer is parsed with
//! `httparse` and must carry its length (a chunked answer is refused: our server never sends
//! one); the connect itself is non-blocking with the same deadline (a full listen queue is
//! tried again until then, never waited on past it).

use socket2::{Domain, SockAddr, Socket, Type};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper::Method;
use hyper::body::Bytes;

/// An answer body larger than this is a protocol error (a pod is a few KiB; Kubernetes caps
/// an object at 1.5 MiB).
pub const MAX_ANSWER: usize = 4 * 1024 * 1024;
/// Headers larger than this are a protocol error.
const MAX_HEAD: usize = 16 * 1024;
/// How often a full listen queue is tried again.
const CONNECT_RETRY: Duration = Duration::from_millis(2);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{socket} is not reachable: {source}")]
    Unreachable {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("{socket} did not answer within {after:?}")]
    Timeout { socket: PathBuf, after: Duration },
    #[error("talking to {socket}: {reason}")]
    Protocol { socket: PathBuf, reason: String },
}

/// The status and the whole body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

impl Answer {
    /// The body as text, trimmed (reasons in error answers).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim().to_string()
    }
}

/// Why an exchange ended at EOF with no complete answer head.
fn closed_before_head(read: usize) -> String {
    match read {
        0 => "the server closed the connection without answering".into(),
        n => {
            format!("the server closed the connection after {n} bytes of an unfinished answer head")
        }
    }
}

/// Sends `method path` with `body` and waits for the answer, all within `timeout`.
pub fn request(
    socket: &Path,
    method: Method,
    path: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Answer, ClientError> {
    let ex = Exchange {
        socket,
        deadline: Instant::now() + timeout,
        timeout,
    };
    let mut stream = ex.connect()?;
    ex.send(&mut stream, &method, path, &body)?;
    ex.receive(&mut stream)
}

struct Exchange<'a> {
    socket: &'a Path,
    deadline: Instant,
    timeout: Duration,
}

impl Exchange<'_> {
    fn protocol(&self, reason: impl Into<String>) -> ClientError {
        ClientError::Protocol {
            socket: self.socket.to_path_buf(),
            reason: reason.into(),
        }
    }

    fn timed_out(&self) -> ClientError {
        ClientError::Timeout {
            socket: self.socket.to_path_buf(),
            after: self.timeout,
        }
    }

    /// What is left of the deadline (never zero: zero means "no timeout" to the socket).
    fn left(&self) -> Result<Duration, ClientError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timed_out());
        }
        Ok(left)
    }

    fn io(&self, e: std::io::Error) -> ClientError {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => self.timed_out(),
            _ => self.protocol(e.to_string()),
        }
    }

    /// Connects within the deadline. A unix socket's connect never waits: a full listen queue
    /// (a burst, a flood, a daemon that stopped accepting) is `EAGAIN` at once, so it is tried
    /// again every [`CONNECT_RETRY`] until the deadline.
    fn connect(&self) -> Result<UnixStream, ClientError> {
        let unreachable = |source| ClientError::Unreachable {
            socket: self.socket.to_path_buf(),
            source,
        };
        let addr = SockAddr::unix(self.socket).map_err(unreachable)?;
        let s = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(unreachable)?;
        s.set_nonblocking(true).map_err(unreachable)?;
        loop {
            match s.connect(&addr) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(self.left()?.min(CONNECT_RETRY));
                }
                Err(e) => return Err(unreachable(e)),
            }
        }
        s.set_nonblocking(false).map_err(unreachable)?;
        Ok(UnixStream::from(std::os::fd::OwnedFd::from(s)))
    }

    fn send(
        &self,
        stream: &mut UnixStream,
        method: &Method,
        path: &str,
        body: &[u8],
    ) -> Result<(), ClientError> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: istio-cni-node\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream
            .set_write_timeout(Some(self.left()?))
            .map_err(|e| self.io(e))?;
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body))
            .map_err(|e| self.io(e))
    }

    fn receive(&self, stream: &mut UnixStream) -> Result<Answer, ClientError> {
        let mut buf = Vec::with_capacity(8192);
        let (status, head_len, length) = loop {
            // EOF before a whole head is the server's answer: it will say nothing more, so
            // waiting on (a 0-byte read at once, again and again) only spins to the deadline.
            if self.read_some(stream, &mut buf)? == 0 {
                return Err(self.protocol(closed_before_head(buf.len())));
            }
            if let Some(head) = self.parse_head(&buf)? {
                break head;
            }
        };
        let want = length.map(|n| head_len + n);
        while want.is_none_or(|w| buf.len() < w) {
            if self.read_some(stream, &mut buf)? == 0 {
                break;
            }
        }
        if want.is_some_and(|w| buf.len() < w) {
            return Err(self.protocol("the answer ended before its Content-Length"));
        }
        buf.truncate(want.unwrap_or(buf.len()));
        Ok(Answer {
            status,
            body: Bytes::from(buf.split_off(head_len)),
        })
    }

    /// Reads what is there (0 at EOF), within the deadline and the size bound.
    fn read_some(&self, stream: &mut UnixStream, buf: &mut Vec<u8>) -> Result<usize, ClientError> {
        stream
            .set_read_timeout(Some(self.left()?))
            .map_err(|e| self.io(e))?;
        let mut chunk = [0u8; 16 * 1024];
        let n = stream.read(&mut chunk).map_err(|e| self.io(e))?;
        if buf.len() + n > MAX_HEAD + MAX_ANSWER {
            return Err(self.protocol(format!("answer larger than {MAX_ANSWER} bytes")));
        }
        buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// `(status, header length, Content-Length)` once the head is complete.
    fn parse_head(&self, buf: &[u8]) -> Result<Option<(u16, usize, Option<usize>)>, ClientError> {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let head_len = match resp.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(self.protocol("answer headers too large"));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(self.protocol(format!("bad answer: {e}"))),
        };
        if let Some(te) = resp
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("transfer-encoding"))
        {
            return Err(self.protocol(format!(
                "a chunked answer (Transfer-Encoding: {}) is not supported",
                String::from_utf8_lossy(te.value)
            )));
        }
        let length = resp
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .map(|h| {
                std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .ok_or_else(|| self.protocol("bad Content-Length"))
            })
            .transpose()?;
        if length.is_some_and(|n| n > MAX_ANSWER) {
            return Err(self.protocol(format!("answer larger than {MAX_ANSWER} bytes")));
        }
        let status = resp.code.ok_or_else(|| self.protocol("no status"))?;
        Ok(Some((status, head_len, length)))
    }
}
