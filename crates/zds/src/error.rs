//! Errors of the ZDS server, each naming the socket and, where one is concerned, the pod.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::wire::WireError;

/// What went wrong on a live connection to ztunnel. The connection is dropped after any of
/// these (its state is unknown); ztunnel reconnects and gets a full snapshot.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("no answer from ztunnel within {0:?}")]
    Timeout(Duration),
    #[error("ztunnel closed the connection")]
    Closed,
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol error: {0}")]
    Protocol(#[from] WireError),
    #[error("a {0}-byte message ztunnel sent unasked (a second or late Ack) was waiting")]
    Unsolicited(usize),
}

/// Why the fd given for a pod is not a network namespace (netns fds live on nsfs:
/// `/proc/PID/ns/net`, `/var/run/netns/NAME`).
#[derive(Debug, thiserror::Error)]
pub enum NetnsCheckError {
    #[error("fstatfs: {0}")]
    Statfs(#[source] nix::Error),
    /// The fd's filesystem is not nsfs.
    #[error("filesystem type {0:?}")]
    Filesystem(nix::sys::statfs::FsType),
}

#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    #[error("ZDS socket {}: cannot listen: {source}", socket.display())]
    Listen { socket: PathBuf, source: io::Error },
    #[error("ZDS socket {}: another server is already listening there", socket.display())]
    InUse { socket: PathBuf },
    #[error("ZDS socket {}: {} exists and is not a socket", socket.display(), socket.display())]
    NotASocket { socket: PathBuf },
    #[error("ZDS socket {}: pod {pod}: {source}", socket.display())]
    InvalidRequest {
        socket: PathBuf,
        pod: String,
        source: WireError,
    },
    #[error("ZDS socket {}: pod {pod}: the fd given is not a network namespace ({source})", socket.display())]
    NotANetns {
        socket: PathBuf,
        pod: String,
        source: NetnsCheckError,
    },
    #[error("ZDS socket {}: no ztunnel connected; pod {pod} not sent", socket.display())]
    NotConnected { socket: PathBuf, pod: String },
    #[error("ZDS socket {}: ztunnel refused pod {pod}: {message}", socket.display())]
    Rejected {
        socket: PathBuf,
        pod: String,
        message: String,
    },
    #[error("ZDS socket {}: pod {pod} not confirmed: {source}; connection dropped", socket.display())]
    Link {
        socket: PathBuf,
        pod: String,
        source: LinkError,
    },
    #[error("ZDS socket {}: pod {pod} not sent: the connection stayed busy for {waited:?} (a snapshot or other pods' requests first)", socket.display())]
    Busy {
        socket: PathBuf,
        pod: String,
        waited: Duration,
    },
    #[error("ZDS socket {}: server stopped", socket.display())]
    Stopped { socket: PathBuf },
}

impl ZdsError {
    /// The socket the error is about.
    pub fn socket(&self) -> &std::path::Path {
        match self {
            ZdsError::Listen { socket, .. }
            | ZdsError::InUse { socket }
            | ZdsError::NotASocket { socket }
            | ZdsError::InvalidRequest { socket, .. }
            | ZdsError::NotANetns { socket, .. }
            | ZdsError::NotConnected { socket, .. }
            | ZdsError::Rejected { socket, .. }
            | ZdsError::Link { socket, .. }
            | ZdsError::Busy { socket, .. }
            | ZdsError::Stopped { socket } => socket,
        }
    }
}
