//! Shared by the ZDS tests: a fake ztunnel (ztunnel's side of the protocol, scripted by the
//! test) and small helpers.
#![allow(dead_code)]

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use zds::WorkloadInfo;
use zds::socket::{self, SeqpacketConn};
use zds::wire::{self, Request, Response};

/// Bound for every wait in the tests: long enough for a loaded CI machine, short enough to
/// catch a hang.
pub const WAIT: Duration = Duration::from_secs(10);

/// Short timeouts, so that tests of their expiry run quickly; long enough that a loaded machine
/// pausing the test's one thread between a request and the fake ztunnel's answer does not
/// expire them.
pub fn quick() -> zds::ZdsConfig {
    zds::ZdsConfig {
        ack_timeout: Duration::from_secs(1),
        hello_timeout: Duration::from_secs(1),
        queue_timeout: Duration::from_secs(2),
    }
}

pub fn info(name: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: name.into(),
        namespace: "default".into(),
        service_account: "sa".into(),
    }
}

/// A netns fd that needs no privilege: our own namespace.
pub fn own_netns() -> OwnedFd {
    std::fs::File::open("/proc/self/ns/net").unwrap().into()
}

/// A fresh directory for a socket, removed on drop.
pub fn socket_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ztunnel.sock");
    (dir, path)
}

/// ztunnel's side of the protocol, driven step by step by a test.
pub struct FakeZtunnel {
    pub conn: SeqpacketConn,
}

impl FakeZtunnel {
    /// Connects without saying hello.
    pub fn connect_silent(path: &Path) -> Self {
        FakeZtunnel {
            conn: socket::connect(path).expect("connect to the ZDS socket"),
        }
    }

    /// Connects and says hello (V1), as ztunnel does.
    pub async fn connect(path: &Path) -> Self {
        let zt = Self::connect_silent(path);
        zt.conn.send(&wire::encode_hello(), None).await.unwrap();
        zt
    }

    /// The next request and the fd that came with it.
    pub async fn recv(&self) -> (Request, Option<OwnedFd>) {
        let packet = tokio::time::timeout(WAIT, self.conn.recv())
            .await
            .expect("a request within the bound")
            .expect("recv")
            .expect("a request, not EOF");
        (wire::decode_request(&packet.bytes).unwrap(), packet.fd)
    }

    pub async fn ack(&self) {
        self.answer(Response::Ack).await
    }

    pub async fn nack(&self, error: &str) {
        self.answer(Response::Nack(error.into())).await
    }

    pub async fn answer(&self, resp: Response) {
        self.conn
            .send(&wire::encode_response(&resp), None)
            .await
            .unwrap()
    }

    /// Acks every request up to and including `SnapshotSent`; returns them.
    pub async fn take_snapshot(&self) -> Vec<Request> {
        let mut got = Vec::new();
        loop {
            let (req, fd) = self.recv().await;
            assert_eq!(req.carries_netns(), fd.is_some(), "{req:?}");
            self.ack().await;
            let done = req == Request::SnapshotSent;
            got.push(req);
            if done {
                return got;
            }
        }
    }

    /// Waits until the server closes the connection (EOF); panics on any message.
    pub async fn closed(&self) {
        let got = tokio::time::timeout(WAIT, self.conn.recv())
            .await
            .expect("the server closes the connection within the bound");
        assert!(matches!(got, Ok(None)), "expected EOF, got {got:?}");
    }
}
