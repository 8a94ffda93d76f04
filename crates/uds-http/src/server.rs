//! A root-only socket and its accept loop: each request's body is read (bounded in size and
//! time) before the handler sees it, each connection is served in its own task, and the
//! connections are bounded in number, time and memory (see [`serve`]).

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Response, StatusCode};
use std::collections::VecDeque;
use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The whole request (head and body) must arrive within this of the accept. The plugin
/// writes it at once after connecting; only a stalled or hostile client takes longer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections open at once on one socket (each a task and a descriptor).
pub const MAX_CONNECTIONS: usize = 256;
/// A request head (request line and headers) larger than this is answered 431.
pub const MAX_HEAD: usize = 16 * 1024;
/// No connection lives longer: above the plugin's longest wait for an answer (90 s), so
/// only a client that never reads its answer meets it.
pub const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(120);

/// What a handler answers.
pub type Reply = Response<Full<Bytes>>;
/// What a handler gets: the request with its whole body.
pub type Request = hyper::Request<Bytes>;

/// A plain-text answer.
pub fn reply(status: StatusCode, text: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(text.into()));
    *r.status_mut() = status;
    r
}

/// A JSON answer (200).
pub fn json(body: Vec<u8>) -> Reply {
    let mut r = reply(StatusCode::OK, body);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// Binds `path` with mode 0600 (`node_fs::prepare_socket`: its directory ours and never a
/// planted link, a stale socket replaced, anything else at the name refused).
/// Must be called inside a tokio runtime.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    node_fs::prepare_socket(path)?;
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Accepts until the task is dropped. `max_body` bounds every request body (larger: 413
/// without calling the handler); `name` labels the logs.
///
/// Hostile or broken clients are bounded (each bound but the two-minute lifetime is a test in
/// `tests/hostile.rs`): the whole request must arrive within [`REQUEST_TIMEOUT`] of the
/// accept (a head not in by then closes the connection, a body not in is answered 408); a
/// head over [`MAX_HEAD`] is answered 431; one request per connection (no keep-alive); no
/// connection outlives [`MAX_CONNECTION_LIFETIME`]; at most [`MAX_CONNECTIONS`] are open, and
/// a connection over that closes the oldest one that has sent nothing yet (else the oldest
/// still sending its request), so a flood of idle connections cannot starve the plugin, whose
/// request arrives whole right after its connect: its bytes wait in the socket even before
/// its task first reads them.
pub async fn serve<H, F>(listener: UnixListener, name: &'static str, max_body: usize, handler: H)
where
    H: Fn(Request) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    let slots = Arc::new(Slots::new(name));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(socket = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let permit = slots.admit().await;
        let conn = slots.arrived(&stream);
        let stream = Tracked {
            stream,
            conn: conn.clone(),
        };
        tokio::spawn(connection(
            stream,
            conn,
            slots.clone(),
            permit,
            max_body,
            handler.clone(),
        ));
    }
}

/// One connection, from accept to close; `_permit` is its slot.
async fn connection<H, F>(
    stream: Tracked,
    conn: Arc<Conn>,
    slots: Arc<Slots>,
    _permit: OwnedSemaphorePermit,
    max_body: usize,
    handler: H,
) where
    H: Fn(Request) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    let name = slots.name;
    let deadline = conn.accepted + REQUEST_TIMEOUT;
    let svc = hyper::service::service_fn({
        let (conn, slots) = (conn.clone(), slots.clone());
        move |req: hyper::Request<Incoming>| {
            conn.head_in.store(true, Ordering::Release);
            let (handler, conn, slots) = (handler.clone(), conn.clone(), slots.clone());
            async move {
                let reply = match read_body(req, max_body, deadline).await {
                    Ok(req) => {
                        slots.served(&conn);
                        handler(req).await
                    }
                    Err(refused) => refused,
                };
                Ok::<_, std::convert::Infallible>(reply)
            }
        }
    });
    let http = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .max_header_size(MAX_HEAD)
        .max_buf_size(MAX_HEAD.max(64 * 1024))
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
    tokio::select! {
        ended = tokio::time::timeout(MAX_CONNECTION_LIFETIME, http) => match ended {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(socket = name, error = %e, "connection ended"),
            Err(_) => tracing::warn!(socket = name, after = ?MAX_CONNECTION_LIFETIME, "connection closed: open too long"),
        },
        why = conn.cut_off(deadline) => tracing::debug!(socket = name, why, "connection closed before its request arrived"),
    }
    slots.served(&conn);
}

/// The body, read within the request's deadline and `max_body` (else the answer to send).
async fn read_body(
    req: hyper::Request<Incoming>,
    max_body: usize,
    deadline: Instant,
) -> Result<Request, Reply> {
    let (parts, body) = req.into_parts();
    match tokio::time::timeout_at(deadline, Limited::new(body, max_body).collect()).await {
        Ok(Ok(b)) => Ok(hyper::Request::from_parts(parts, b.to_bytes())),
        Ok(Err(e)) => Err(reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("reading the body: {e}"),
        )),
        Err(_) => Err(reply(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request did not arrive within {REQUEST_TIMEOUT:?}"),
        )),
    }
}

/// A connection still sending its request.
struct Conn {
    accepted: Instant,
    /// Its head was parsed (from then on [`read_body`] keeps the deadline).
    head_in: AtomicBool,
    /// Closed to make room for a newer connection.
    evicted: Notify,
    /// Some of its bytes were read.
    sent_any: AtomicBool,
    /// Its socket while it is open (cleared before the descriptor closes, so its number,
    /// once reused, is never asked about).
    fd: Mutex<Option<RawFd>>,
}

impl Conn {
    /// Whether the client has sent anything: bytes read, or bytes waiting to be read.
    fn has_sent(&self) -> bool {
        if self.sent_any.load(Ordering::Acquire) {
            return true;
        }
        let fd = self.fd.lock().unwrap_or_else(|e| e.into_inner());
        fd.is_some_and(|fd| {
            let mut waiting: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int; `fd` is open while its lock is held here (the
            // connection clears it under the lock before closing).
            unsafe { libc::ioctl(fd, libc::FIONREAD, &mut waiting) == 0 && waiting > 0 }
        })
    }

    /// Resolves when the connection must be closed unanswered: evicted, or its head not in
    /// by `deadline`.
    async fn cut_off(&self, deadline: Instant) -> &'static str {
        tokio::select! {
            () = self.evicted.notified() => "evicted: too many connections",
            () = tokio::time::sleep_until(deadline) => {
                if self.head_in.load(Ordering::Acquire) {
                    std::future::pending::<()>().await;
                }
                "no request head within the timeout"
            }
        }
    }
}

/// The socket's connection slots and, oldest first, the connections still sending requests.
struct Slots {
    name: &'static str,
    permits: Arc<Semaphore>,
    waiting: Mutex<VecDeque<Arc<Conn>>>,
}

impl Slots {
    fn new(name: &'static str) -> Slots {
        Slots {
            name,
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            waiting: Mutex::new(VecDeque::new()),
        }
    }

    /// A slot for a new connection; when all are taken, a connection still sending its
    /// request is closed for it: the oldest that has sent nothing, else the oldest (or, none
    /// sending, the first to finish makes room).
    async fn admit(&self) -> OwnedSemaphorePermit {
        if let Ok(p) = self.permits.clone().try_acquire_owned() {
            return p;
        }
        if let Some(oldest) = self.to_evict() {
            tracing::debug!(
                socket = self.name,
                max = MAX_CONNECTIONS,
                "connection limit reached: closing the oldest unfinished request"
            );
            oldest.evicted.notify_one();
        } else {
            tracing::warn!(
                socket = self.name,
                max = MAX_CONNECTIONS,
                "connection limit reached: waiting for one to finish"
            );
        }
        self.permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// The connection to close for a newcomer, out of the waiting list: the oldest that has
    /// sent nothing, else the oldest.
    fn to_evict(&self) -> Option<Arc<Conn>> {
        let mut waiting = self.waiting();
        let idle = waiting.iter().position(|c| !c.has_sent()).unwrap_or(0);
        waiting.remove(idle)
    }

    /// A connection just accepted, now waiting for its request.
    fn arrived(&self, stream: &UnixStream) -> Arc<Conn> {
        let conn = Arc::new(Conn {
            accepted: Instant::now(),
            head_in: AtomicBool::new(false),
            evicted: Notify::new(),
            sent_any: AtomicBool::new(false),
            fd: Mutex::new(Some(stream.as_raw_fd())),
        });
        self.waiting().push_back(conn.clone());
        conn
    }

    /// Its request is in (or it is gone): never evicted from now on.
    fn served(&self, conn: &Arc<Conn>) {
        self.waiting().retain(|c| !Arc::ptr_eq(c, conn));
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Conn>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection's stream that tells its [`Conn`] when bytes were read and when it closes.
struct Tracked {
    stream: UnixStream,
    conn: Arc<Conn>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // Before `stream` (a field) closes the descriptor.
        *self.conn.fd.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.sent_any.store(true, Ordering::Release);
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plugin's request waits whole in its socket before its task first reads it: a
    /// newcomer over the limit closes an idle connection, never that one, even when it is
    /// the oldest. Among connections that all sent something, the oldest goes.
    #[tokio::test]
    async fn a_newcomer_evicts_the_oldest_idle_connection_not_one_with_bytes_waiting() {
        use tokio::io::AsyncWriteExt;
        let slots = Slots::new("test");
        let (real, mut real_client) = UnixStream::pair().unwrap();
        let (idle, _idle_client) = UnixStream::pair().unwrap();
        let (half, mut half_client) = UnixStream::pair().unwrap();
        let real_conn = slots.arrived(&real);
        let idle_conn = slots.arrived(&idle);
        let half_conn = slots.arrived(&half);
        real_client
            .write_all(b"GET /pod HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        half_client.write_all(b"GET /x HTT").await.unwrap();
        half_conn.sent_any.store(true, Ordering::Release);
        let first = slots.to_evict().unwrap();
        assert!(Arc::ptr_eq(&first, &idle_conn), "the idle one goes first");
        let second = slots.to_evict().unwrap();
        assert!(Arc::ptr_eq(&second, &real_conn), "then the oldest");
        // A closed connection's descriptor is never asked about.
        let tracked = Tracked {
            stream: half,
            conn: half_conn.clone(),
        };
        drop(tracked);
        assert!(half_conn.fd.lock().unwrap().is_none());
    }
}
