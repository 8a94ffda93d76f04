//! The plugin's side of the node agent's socket (`<cni_agent_run_dir>/pluginevent.sock`):
//! one HTTP/1.1 POST over a unix socket, as Istio's plugin does, bounded by one timeout.

use cni_config::ambient::{AddPodRequest, CMD_ADD_PATH, CMD_DEL_PATH, DelPodRequest};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the node agent is not reachable on {socket}: {source}")]
    Unreachable {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("the node agent on {socket} did not answer within {after:?}")]
    Timeout { socket: PathBuf, after: Duration },
    #[error("the node agent on {socket} refused the pod ({status}): {reason}")]
    Refused {
        socket: PathBuf,
        status: u16,
        reason: String,
    },
    #[error("talking to the node agent on {socket}: {reason}")]
    Protocol { socket: PathBuf, reason: String },
}

impl AgentError {
    /// The agent answered 503: it is up but cannot serve pods yet (ztunnel not connected).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            AgentError::Unreachable { .. }
                | AgentError::Timeout { .. }
                | AgentError::Refused { status: 503, .. }
        )
    }
}

/// Hands a new ambient pod to the agent; returns once the agent answered 200 (its rules are
/// in and ztunnel acknowledged it).
pub fn add(socket: &Path, req: &AddPodRequest, timeout: Duration) -> Result<(), AgentError> {
    let body = serde_json::to_vec(req).expect("plain struct serializes");
    post(socket, CMD_ADD_PATH, body, timeout)
}

/// Tells the agent the pod's sandbox is going away.
pub fn del(socket: &Path, req: &DelPodRequest, timeout: Duration) -> Result<(), AgentError> {
    let body = serde_json::to_vec(req).expect("plain struct serializes");
    post(socket, CMD_DEL_PATH, body, timeout)
}

fn post(socket: &Path, path: &str, body: Vec<u8>, timeout: Duration) -> Result<(), AgentError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AgentError::Protocol {
            socket: socket.to_path_buf(),
            reason: format!("starting the async runtime: {e}"),
        })?;
    let outcome =
        rt.block_on(async { tokio::time::timeout(timeout, post_async(socket, path, body)).await });
    match outcome {
        Ok(r) => r,
        Err(_) => Err(AgentError::Timeout {
            socket: socket.to_path_buf(),
            after: timeout,
        }),
    }
}

async fn post_async(socket: &Path, path: &str, body: Vec<u8>) -> Result<(), AgentError> {
    let protocol = |reason: String| AgentError::Protocol {
        socket: socket.to_path_buf(),
        reason,
    };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| AgentError::Unreachable {
            socket: socket.to_path_buf(),
            source,
        })?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| protocol(e.to_string()))?;
    tokio::spawn(conn);
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, "istio-cni-agent")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| protocol(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| protocol(e.to_string()))?;
    let status = response.status().as_u16();
    let text = response
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
        .unwrap_or_default();
    if status == 200 {
        return Ok(());
    }
    Err(AgentError::Refused {
        socket: socket.to_path_buf(),
        status,
        reason: if text.is_empty() {
            "no reason given".into()
        } else {
            text
        },
    })
}
