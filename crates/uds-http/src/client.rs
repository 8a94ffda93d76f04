//! One request, one answer, bounded by one timeout (connect, send and the whole body).

use http_body_util::{BodyExt, Full, Limited};
use hyper::Method;
use hyper::body::Bytes;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An answer body larger than this is a protocol error (a pod is a few KiB; Kubernetes caps
/// an object at 1.5 MiB).
pub const MAX_ANSWER: usize = 4 * 1024 * 1024;

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

/// Sends `method path` with `body` and waits for the answer, all within `timeout`. Blocks the
/// calling thread on a runtime of its own (the plugin is a short-lived, synchronous process).
pub fn request(
    socket: &Path,
    method: Method,
    path: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Answer, ClientError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClientError::Protocol {
            socket: socket.to_path_buf(),
            reason: format!("starting the async runtime: {e}"),
        })?;
    rt.block_on(request_async(socket, method, path, body, timeout))
}

/// [`request`] on the caller's runtime.
pub async fn request_async(
    socket: &Path,
    method: Method,
    path: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Answer, ClientError> {
    tokio::time::timeout(timeout, exchange(socket, method, path, body))
        .await
        .unwrap_or_else(|_| {
            Err(ClientError::Timeout {
                socket: socket.to_path_buf(),
                after: timeout,
            })
        })
}

async fn exchange(
    socket: &Path,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> Result<Answer, ClientError> {
    let protocol = |reason: String| ClientError::Protocol {
        socket: socket.to_path_buf(),
        reason,
    };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::Unreachable {
            socket: socket.to_path_buf(),
            source,
        })?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| protocol(e.to_string()))?;
    tokio::spawn(conn);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "istio-cni-node")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| protocol(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| protocol(e.to_string()))?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| protocol(format!("reading the answer: {e}")))?
        .to_bytes();
    Ok(Answer { status, body })
}
