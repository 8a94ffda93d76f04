//! The plugin's side of the node agent's socket (`<cni_agent_run_dir>/pluginevent.sock`):
//! one HTTP/1.1 POST over a unix socket, as Istio's plugin does, bounded by one timeout.

use cni_config::ambient::{AddPodRequest, CMD_ADD_PATH, CMD_DEL_PATH, DelPodRequest};
use std::path::{Path, PathBuf};
use std::time::Duration;
use uds_http::Method;
use uds_http::client::ClientError;

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
    let answer = uds_http::client::request(socket, Method::POST, path, body, timeout).map_err(
        |e| match e {
            ClientError::Unreachable { socket, source } => {
                AgentError::Unreachable { socket, source }
            }
            ClientError::Timeout { socket, after } => AgentError::Timeout { socket, after },
            ClientError::Protocol { socket, reason } => AgentError::Protocol { socket, reason },
        },
    )?;
    if answer.status == 200 {
        return Ok(());
    }
    let text = answer.text();
    Err(AgentError::Refused {
        socket: socket.to_path_buf(),
        status: answer.status,
        reason: if text.is_empty() {
            "no reason given".into()
        } else {
            text
        },
    })
}
