//! The server against a fake ztunnel that the test scripts message by message: every rule of
//! the protocol, and every failure the real ztunnel would make hard to provoke (no answer,
//! refusals, bad hello, a second connection). Unprivileged; no ztunnel binary needed.

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use common::{FakeZtunnel, WAIT, info, own_netns, quick, socket_dir};
use zds::wire::Request;
use zds::{DelOutcome, LinkError, NetnsCheckError, ZdsConfig, ZdsError, ZdsServer};

async fn ready_server_and_ztunnel() -> (tempfile::TempDir, ZdsServer, FakeZtunnel) {
    let (dir, path) = socket_dir();
    let server = ZdsServer::bind(&path, quick()).unwrap();
    let zt = FakeZtunnel::connect(&path).await;
    assert_eq!(zt.take_snapshot().await, [Request::SnapshotSent]);
    assert!(server.wait_ready(WAIT).await);
    (dir, server, zt)
}

#[tokio::test]
async fn add_without_ztunnel_fails_at_once_naming_socket_and_pod() {
    let (_dir, path) = socket_dir();
    let server = ZdsServer::bind(&path, ZdsConfig::default()).unwrap();
    assert!(!server.is_ready());
    let start = Instant::now();
    let err = server
        .add_workload("uid-1", info("app"), own_netns())
        .await
        .unwrap_err();
    // Fails without waiting for any timeout (the default ack timeout is 5 s).
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(err, ZdsError::NotConnected { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("default/app (uid uid-1)"), "{msg}");
    // Not acknowledged, so not remembered for a later snapshot.
    assert!(server.known_workloads().is_empty());
}

#[tokio::test]
async fn hello_then_empty_snapshot_makes_the_server_ready() {
    let (_dir, path) = socket_dir();
    let server = ZdsServer::bind(&path, quick()).unwrap();
    let mut ready = server.ready();
    assert!(!*ready.borrow());
    let zt = FakeZtunnel::connect(&path).await;
    // The empty snapshot is just SnapshotSent; not ready before it is acknowledged.
    let (req, fd) = zt.recv().await;
    assert_eq!(req, Request::SnapshotSent);
    assert!(fd.is_none());
    assert!(!server.is_ready());
    zt.ack().await;
    tokio::time::timeout(WAIT, ready.wait_for(|r| *r))
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn add_sends_the_netns_fd_and_resolves_on_ack() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    let netns = own_netns();
    let want = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
    let add = server.add_workload("uid-1", info("app"), netns);
    let peer = async {
        let (req, fd) = zt.recv().await;
        assert_eq!(
            req,
            Request::Add {
                uid: "uid-1".into(),
                info: info("app")
            }
        );
        // The fd ztunnel receives is the same namespace (same inode), not a copy of bytes.
        let fd = fd.expect("AddWorkload carries the netns fd");
        let got = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .ino();
        assert_eq!(got, want);
        zt.ack().await;
    };
    let (res, ()) = tokio::join!(add, peer);
    res.unwrap();
    assert_eq!(server.known_workloads(), ["uid-1"]);
}

#[tokio::test]
async fn refused_add_names_the_pod_and_is_withdrawn() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    let add = server.add_workload("uid-1", info("app"), own_netns());
    let peer = async {
        let (req, _) = zt.recv().await;
        assert!(matches!(req, Request::Add { .. }));
        zt.nack("failure to start proxy: address in use").await;
        // ztunnel would keep the pod pending and retry; the server withdraws it.
        let (req, fd) = zt.recv().await;
        assert_eq!(
            req,
            Request::Del {
                uid: "uid-1".into()
            }
        );
        assert!(fd.is_none());
        zt.ack().await;
    };
    let (res, ()) = tokio::join!(add, peer);
    let err = res.unwrap_err();
    assert!(matches!(err, ZdsError::Rejected { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("default/app (uid uid-1)"), "{msg}");
    assert!(msg.contains("address in use"), "{msg}");
    assert!(server.known_workloads().is_empty());
    // The connection stays usable.
    assert!(server.is_ready());
}

#[tokio::test]
async fn no_ack_times_out_and_drops_the_connection() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    let start = Instant::now();
    let add = server.add_workload("uid-1", info("app"), own_netns());
    let peer = async {
        let _ = zt.recv().await; // and never answer
        zt.closed().await;
    };
    let (res, ()) = tokio::join!(add, peer);
    let err = res.unwrap_err();
    assert!(start.elapsed() >= quick().ack_timeout);
    assert!(
        matches!(
            err,
            ZdsError::Link {
                source: LinkError::Timeout(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("uid uid-1"), "{err}");
    assert!(!server.is_ready());
    assert!(server.known_workloads().is_empty());
    // With the connection gone, the next add fails fast.
    let err = server
        .add_workload("uid-2", info("b"), own_netns())
        .await
        .unwrap_err();
    assert!(matches!(err, ZdsError::NotConnected { .. }), "{err}");
}

#[tokio::test]
async fn reconnect_gets_every_acknowledged_pod_then_snapshot_sent() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    for uid in ["uid-b", "uid-a", "uid-c"] {
        let add = server.add_workload(uid, info(uid), own_netns());
        let (res, ()) = tokio::join!(add, async {
            zt.recv().await;
            zt.ack().await;
        });
        res.unwrap();
    }
    let del = server.del_workload("uid-c");
    let (res, ()) = tokio::join!(del, async {
        assert_eq!(
            zt.recv().await.0,
            Request::Del {
                uid: "uid-c".into()
            }
        );
        zt.ack().await;
    });
    assert_eq!(res.unwrap(), DelOutcome::Acked);

    // ztunnel restarts: the old connection ends, a new one says hello.
    drop(zt);
    let zt = FakeZtunnel::connect(server.socket_path()).await;
    let snapshot = zt.take_snapshot().await;
    assert_eq!(
        snapshot,
        [
            Request::Add {
                uid: "uid-a".into(),
                info: info("uid-a")
            },
            Request::Add {
                uid: "uid-b".into(),
                info: info("uid-b")
            },
            Request::SnapshotSent,
        ]
    );
    assert!(server.wait_ready(WAIT).await);
}

#[tokio::test]
async fn snapshot_pod_refused_by_ztunnel_does_not_stop_the_snapshot() {
    let (_dir, path) = socket_dir();
    let server = ZdsServer::builder(&path)
        .config(quick())
        .workload("uid-a", info("a"), own_netns())
        .workload("uid-b", info("b"), own_netns())
        .keep("uid-k")
        .bind()
        .unwrap();
    let zt = FakeZtunnel::connect(&path).await;
    let (req, _) = zt.recv().await;
    assert!(matches!(req, Request::Add { ref uid, .. } if uid == "uid-a"));
    zt.nack("failure to start proxy").await; // ztunnel retries it itself
    let (req, _) = zt.recv().await;
    assert!(matches!(req, Request::Add { ref uid, .. } if uid == "uid-b"));
    zt.ack().await;
    let (req, fd) = zt.recv().await;
    assert_eq!(
        req,
        Request::Keep {
            uid: "uid-k".into()
        }
    );
    assert!(fd.is_none());
    zt.ack().await;
    assert_eq!(zt.recv().await.0, Request::SnapshotSent);
    zt.ack().await;
    assert!(server.wait_ready(WAIT).await);
}

#[tokio::test]
async fn a_new_connection_replaces_the_current_one() {
    let (_dir, server, first) = ready_server_and_ztunnel().await;
    let second = FakeZtunnel::connect(server.socket_path()).await;
    assert_eq!(second.take_snapshot().await, [Request::SnapshotSent]);
    first.closed().await;
    assert!(server.wait_ready(WAIT).await);
    // Requests now go to the new connection.
    let add = server.add_workload("uid-1", info("app"), own_netns());
    let (res, ()) = tokio::join!(add, async {
        assert!(matches!(second.recv().await.0, Request::Add { .. }));
        second.ack().await;
    });
    res.unwrap();
}

#[tokio::test]
async fn one_message_in_flight_even_with_many_concurrent_callers() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    let server = std::sync::Arc::new(server);
    let callers: Vec<_> = (0..20)
        .map(|i| {
            let server = server.clone();
            tokio::spawn(async move {
                server
                    .add_workload(&format!("uid-{i:02}"), info("p"), own_netns())
                    .await
            })
        })
        .collect();
    for _ in 0..20 {
        let (req, _) = zt.recv().await;
        assert!(matches!(req, Request::Add { .. }));
        // Before the Ack nothing else may arrive, however long ztunnel takes.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let early = tokio::time::timeout(Duration::from_millis(1), zt.conn.recv()).await;
        assert!(early.is_err(), "a second message before the Ack: {early:?}");
        zt.ack().await;
    }
    for c in callers {
        c.await.unwrap().unwrap();
    }
    assert_eq!(server.known_workloads().len(), 20);
}

#[tokio::test]
async fn bad_hello_or_no_hello_is_not_ready_and_dropped() {
    let (_dir, path) = socket_dir();
    let server = ZdsServer::bind(&path, quick()).unwrap();
    // Version 2 does not exist.
    let zt = FakeZtunnel::connect_silent(&path);
    zt.conn.send(&[0x08, 0x02], None).await.unwrap();
    zt.closed().await;
    // Silence: dropped after the hello timeout.
    let zt = FakeZtunnel::connect_silent(&path);
    zt.closed().await;
    assert!(!server.is_ready());
    // A proper ztunnel still gets served afterwards.
    let zt = FakeZtunnel::connect(&path).await;
    assert_eq!(zt.take_snapshot().await, [Request::SnapshotSent]);
    assert!(server.wait_ready(WAIT).await);
}

#[tokio::test]
async fn ztunnel_going_away_while_idle_makes_the_server_unready() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    let mut ready = server.ready();
    drop(zt);
    tokio::time::timeout(WAIT, ready.wait_for(|r| !*r))
        .await
        .unwrap()
        .unwrap();
    let err = server
        .add_workload("uid-1", info("app"), own_netns())
        .await
        .unwrap_err();
    assert!(matches!(err, ZdsError::NotConnected { .. }), "{err}");
}

#[tokio::test]
async fn del_without_ztunnel_is_deferred_to_the_next_snapshot() {
    let (_dir, path) = socket_dir();
    let server = ZdsServer::builder(&path)
        .config(quick())
        .workload("uid-a", info("a"), own_netns())
        .workload("uid-b", info("b"), own_netns())
        .bind()
        .unwrap();
    assert_eq!(
        server.del_workload("uid-a").await.unwrap(),
        DelOutcome::Deferred
    );
    let zt = FakeZtunnel::connect(&path).await;
    let snapshot = zt.take_snapshot().await;
    assert_eq!(snapshot.len(), 2, "{snapshot:?}");
    assert!(matches!(&snapshot[0], Request::Add { uid, .. } if uid == "uid-b"));
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    let devnull = std::fs::File::open("/dev/null").unwrap().into();
    let err = server
        .add_workload("uid-1", info("app"), devnull)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ZdsError::NotANetns {
                source: NetnsCheckError::Filesystem(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("default/app (uid uid-1)"), "{err}");

    let err = server
        .add_workload("", info("app"), own_netns())
        .await
        .unwrap_err();
    assert!(matches!(err, ZdsError::InvalidRequest { .. }), "{err}");
    assert!(err.to_string().contains("uid is empty"), "{err}");

    let long = info(&"x".repeat(2000));
    let err = server
        .add_workload("uid-2", long, own_netns())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("1024-byte"), "{err}");

    // Nothing reached ztunnel, and the connection is fine.
    let early = tokio::time::timeout(Duration::from_millis(50), zt.conn.recv()).await;
    assert!(early.is_err(), "{early:?}");
    assert!(server.is_ready());
}

#[tokio::test]
async fn bind_replaces_a_stale_socket_refuses_a_live_one_and_drop_removes_it() {
    let (_dir, path) = socket_dir();
    let first = ZdsServer::bind(&path, quick()).unwrap();
    let err = ZdsServer::bind(&path, quick()).err().unwrap();
    assert!(matches!(err, ZdsError::InUse { .. }), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()));
    drop(first);
    assert!(!path.exists(), "drop removes the socket file");

    // A stale socket file (its listener gone without cleanup) is replaced.
    let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
    drop(stale);
    assert!(path.exists());
    let server = ZdsServer::bind(&path, quick()).unwrap();
    let zt = FakeZtunnel::connect(&path).await;
    assert_eq!(zt.take_snapshot().await, [Request::SnapshotSent]);
    drop(server);

    // Anything else at the path is not ours to remove.
    std::fs::write(&path, "not a socket").unwrap();
    let err = ZdsServer::bind(&path, quick()).err().unwrap();
    assert!(matches!(err, ZdsError::NotASocket { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
}

#[tokio::test]
async fn dropping_the_server_closes_ztunnels_connection() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    drop(server);
    zt.closed().await;
}

#[tokio::test]
async fn a_connection_without_hello_does_not_disturb_the_current_ztunnel() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    // A second agent probing the socket (bind refuses: in use) and a silent client.
    let err = ZdsServer::bind(server.socket_path(), quick())
        .err()
        .unwrap();
    assert!(matches!(err, ZdsError::InUse { .. }), "{err}");
    let silent = FakeZtunnel::connect_silent(server.socket_path());
    silent.closed().await; // dropped after the hello timeout
    assert!(server.is_ready());
    let add = server.add_workload("uid-1", info("app"), own_netns());
    let (res, ()) = tokio::join!(add, async {
        assert!(matches!(zt.recv().await.0, Request::Add { .. }));
        zt.ack().await;
    });
    res.unwrap();
}

#[tokio::test]
async fn a_failed_add_forgets_the_uid_even_if_an_earlier_add_stored_it() {
    let (_dir, server, zt) = ready_server_and_ztunnel().await;
    let add = server.add_workload("uid-1", info("app"), own_netns());
    let (res, ()) = tokio::join!(add, async {
        zt.recv().await;
        zt.ack().await;
    });
    res.unwrap();
    assert_eq!(server.known_workloads(), ["uid-1"]);
    // The sandbox got a new netns and ztunnel refuses it: ztunnel has dropped the old proxy
    // (it replaces a uid's netns), so the store must not resend the old one either.
    let add = server.add_workload("uid-1", info("app"), own_netns());
    let (res, ()) = tokio::join!(add, async {
        zt.recv().await;
        zt.nack("failure to start proxy").await;
        assert_eq!(
            zt.recv().await.0,
            Request::Del {
                uid: "uid-1".into()
            }
        );
        zt.ack().await;
    });
    assert!(matches!(res, Err(ZdsError::Rejected { .. })), "{res:?}");
    assert!(server.known_workloads().is_empty());
}

/// A ztunnel that answers one request twice. ZDS Acks carry no id: only order ties an Ack to
/// its request, so the extra Ack must never be read as the answer to the next request (that
/// would report a pod served that ztunnel refused). Many rounds: before the fix, whether the
/// server looked at the queued request or at the stray Ack first was a coin toss.
#[tokio::test]
async fn an_extra_ack_is_never_taken_as_the_answer_to_the_next_request() {
    for round in 0..16 {
        let (_dir, server, zt) = ready_server_and_ztunnel().await;
        let server = std::sync::Arc::new(server);
        let add = |uid: &'static str| {
            let server = server.clone();
            tokio::spawn(async move { server.add_workload(uid, info(uid), own_netns()).await })
        };
        let first = add("uid-1");
        assert!(matches!(zt.recv().await.0, Request::Add { .. }));
        // The second add waits in the queue while the first is in flight.
        let second = add("uid-2");
        tokio::time::sleep(Duration::from_millis(30)).await;
        zt.ack().await;
        zt.ack().await; // answers nothing
        first.await.unwrap().unwrap();
        // ztunnel refuses the second pod if it ever gets it.
        if let Ok(Ok(Some(_))) =
            tokio::time::timeout(Duration::from_millis(500), zt.conn.recv()).await
        {
            zt.nack("refused").await;
        }
        let res = second.await.unwrap();
        assert!(res.is_err(), "round {round}: uid-2 served on a stray Ack");
        assert!(!server.known_workloads().contains(&"uid-2".to_string()));
    }
}

/// A server (ack timeout 600 ms, queue timeout 300 ms) whose snapshot holds `uids`, and a
/// ztunnel connected to it, with the snapshot's first request.
async fn slow_snapshot(
    uids: impl Iterator<Item = String>,
) -> (
    tempfile::TempDir,
    std::sync::Arc<ZdsServer>,
    FakeZtunnel,
    Request,
) {
    let (dir, path) = socket_dir();
    let config = ZdsConfig {
        ack_timeout: Duration::from_millis(600),
        queue_timeout: Duration::from_millis(300),
        ..quick()
    };
    let mut builder = ZdsServer::builder(&path).config(config);
    for uid in uids {
        builder = builder.workload(uid, info("old"), own_netns());
    }
    let server = std::sync::Arc::new(builder.bind().unwrap());
    let zt = FakeZtunnel::connect(&path).await;
    let first = zt.recv().await.0;
    (dir, server, zt, first)
}

/// Acks the snapshot from `req` on, each after 250 ms (well inside the 600 ms ack timeout),
/// through `SnapshotSent`; `each` sees every request after `req`.
async fn ack_slowly(zt: &FakeZtunnel, mut req: Request, mut each: impl FnMut(&Request)) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        zt.ack().await;
        if req == Request::SnapshotSent {
            return;
        }
        req = zt.recv().await.0;
        each(&req);
    }
}

/// A ztunnel that takes its time over a snapshot (each Ack inside the ack timeout) keeps the
/// connection busy for pods x ack_timeout. An add queued behind it gets its answer within its
/// own bound, and is never sent after its caller gave up.
#[tokio::test]
async fn an_add_queued_behind_a_slow_snapshot_is_bounded_and_never_sent_late() {
    let uids = (0..23).map(|i| format!("uid-old-{i:02}"));
    let (_dir, server, zt, req) = slow_snapshot(uids).await;
    assert!(matches!(req, Request::Add { .. }));
    let start = Instant::now();
    let late = tokio::spawn({
        let server = server.clone();
        async move {
            let res = server
                .add_workload("uid-new", info("new"), own_netns())
                .await;
            (res, start.elapsed())
        }
    });
    // 24 slow Acks: about 6 s of snapshot; the add's bound is 300 ms + 3 x 600 ms = 2.1 s.
    ack_slowly(&zt, req, |req| {
        assert!(
            !matches!(req, Request::Add { uid, .. } if uid == "uid-new"),
            "uid-new sent in the middle of the snapshot"
        );
    })
    .await;
    let (res, waited) = tokio::time::timeout(WAIT, late).await.unwrap().unwrap();
    assert!(waited < Duration::from_millis(3000), "{waited:?}");
    let err = res.unwrap_err();
    assert!(matches!(err, ZdsError::Busy { .. }), "{err}");
    assert!(
        err.to_string().contains("default/new (uid uid-new)"),
        "{err}"
    );
    // Once the snapshot is done, the expired add is not sent after all.
    let sent = tokio::time::timeout(Duration::from_millis(700), zt.conn.recv()).await;
    assert!(sent.is_err(), "sent after the caller gave up: {sent:?}");
    assert!(!server.known_workloads().contains(&"uid-new".to_string()));
    assert!(server.is_ready());
}

/// The same slow snapshot, the add queued behind it a re-add of a pod ztunnel already serves
/// (a re-created sandbox): when it expires the pod leaves the store, so ztunnel is told too
/// (`DelWorkload`), not left serving a pod the agent rolls back.
#[tokio::test]
async fn an_expired_re_add_of_a_served_pod_withdraws_it_from_ztunnel() {
    let (_dir, server, zt, req) = slow_snapshot((0..8).map(|i| format!("uid-{i}"))).await;
    let again = tokio::spawn({
        let server = server.clone();
        async move { server.add_workload("uid-3", info("old"), own_netns()).await }
    });
    ack_slowly(&zt, req, |_| {}).await;
    let err = tokio::time::timeout(WAIT, again)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, ZdsError::Busy { .. }), "{err}");
    let (req, _) = zt.recv().await;
    assert_eq!(
        req,
        Request::Del {
            uid: "uid-3".into()
        }
    );
    zt.ack().await;
    assert!(!server.known_workloads().contains(&"uid-3".to_string()));
    assert!(server.is_ready());
}
