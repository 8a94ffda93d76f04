//! The server against a REAL ztunnel (built by `integration/scripts/build-ztunnel.sh`), in
//! in-pod mode, handing it real network namespaces: ztunnel's listeners appearing and going
//! inside the pod's namespace are the proof, not our own bookkeeping.
//! Needs root and the binary; under `CI=true` a missing binary or root fails the test.

mod common;

use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::info;
use testbed::TestNetns;
use testbed::ztunnel::{LocalWorkload, Ztunnel, serves_nothing, serves_pod, ztunnel_binary};
use zds::{DelOutcome, ZdsConfig, ZdsError, ZdsServer, ZdsServerBuilder};

/// ztunnel starts, connects, and sets up listeners on a loaded machine well within this.
const BOUND: Duration = Duration::from_secs(30);

/// The binary, or None to skip (only outside CI: `ztunnel_binary` panics under CI=true).
fn prerequisites() -> Option<PathBuf> {
    if !testbed::is_root() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(
            !ci,
            "the real-ztunnel tests need root; CI must not skip them"
        );
        eprintln!("SKIPPED: not root");
        return None;
    }
    ztunnel_binary()
}

fn netns_fd(ns: &TestNetns) -> OwnedFd {
    std::fs::File::open(ns.path()).unwrap().into()
}

fn workload(name: &str) -> LocalWorkload {
    LocalWorkload {
        name: name.into(),
        namespace: "default".into(),
        service_account: "sa".into(),
        ips: vec![],
    }
}

/// Polls `check` (a look into a namespace) until it holds; panics with ztunnel's log if not.
async fn eventually(zt: &Ztunnel, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !check() {
        if Instant::now() > deadline {
            panic!(
                "{what}: not within {BOUND:?}\nztunnel log:\n{}",
                zt.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ready(server: &ZdsServer, zt: &Ztunnel) {
    if !server.wait_ready(BOUND).await {
        panic!(
            "ztunnel did not connect to {} within {BOUND:?}\nztunnel log:\n{}",
            server.socket_path().display(),
            zt.log_tail(40)
        );
    }
}

async fn with_log<T>(
    zt: &Ztunnel,
    what: &str,
    fut: impl Future<Output = Result<T, ZdsError>>,
) -> T {
    match fut.await {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}\nztunnel log:\n{}", zt.log_tail(40)),
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    path: PathBuf,
    server: ZdsServer,
    zt: Ztunnel,
}

/// A server (built by `builder`) and a real ztunnel connected to it, snapshot done.
async fn rig(
    bin: &Path,
    workloads: &[LocalWorkload],
    builder: impl FnOnce(ZdsServerBuilder) -> ZdsServerBuilder,
) -> Rig {
    let (dir, path) = common::socket_dir();
    let server = builder(ZdsServer::builder(&path)).bind().unwrap();
    let zt = Ztunnel::start(bin, &path, workloads).unwrap();
    ready(&server, &zt).await;
    Rig {
        _dir: dir,
        path,
        server,
        zt,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_opens_ztunnels_listeners_in_the_pod_and_del_closes_them() {
    let Some(bin) = prerequisites() else { return };
    let pod = TestNetns::with_prefix("zds-pod").unwrap();
    let r = rig(&bin, &[workload("app")], |b| b).await;
    assert!(serves_nothing(pod.path()).unwrap());

    with_log(
        &r.zt,
        "add",
        r.server
            .add_workload("uid-app", info("app"), netns_fd(&pod)),
    )
    .await;
    eventually(
        &r.zt,
        "listeners 15001/15006/15008/15053 in the pod",
        || serves_pod(pod.path()).unwrap(),
    )
    .await;

    let outcome = with_log(&r.zt, "del", r.server.del_workload("uid-app")).await;
    assert_eq!(outcome, DelOutcome::Acked);
    eventually(&r.zt, "listeners gone from the pod", || {
        serves_nothing(pod.path()).unwrap()
    })
    .await;
    assert!(r.server.known_workloads().is_empty());

    // Deleting a pod ztunnel does not know is acknowledged too (idempotent DEL).
    let outcome = with_log(&r.zt, "del unknown", r.server.del_workload("uid-none")).await;
    assert_eq!(outcome, DelOutcome::Acked);

    // A graceful stop (SIGTERM) ends ztunnel and with it the connection.
    let mut r = r;
    r.zt.stop(BOUND);
    assert!(!r.zt.is_running());
    let mut ready_rx = r.server.ready();
    tokio::time::timeout(BOUND, ready_rx.wait_for(|r| !*r))
        .await
        .unwrap()
        .unwrap();
    assert!(
        r.zt.log().contains("received snapshot sent"),
        "{}",
        r.zt.log_tail(40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_restart_gets_the_snapshot_and_serves_the_pod_again() {
    let Some(bin) = prerequisites() else { return };
    let pod = TestNetns::with_prefix("zds-pod").unwrap();
    let late = TestNetns::with_prefix("zds-pod").unwrap();
    let mut r = rig(&bin, &[workload("app"), workload("late")], |b| b).await;
    with_log(
        &r.zt,
        "add",
        r.server
            .add_workload("uid-app", info("app"), netns_fd(&pod)),
    )
    .await;
    eventually(&r.zt, "pod served", || serves_pod(pod.path()).unwrap()).await;

    // ztunnel crashes: its listeners die with it, the server turns unready, and an add
    // fails at once naming the socket (callers fail closed).
    r.zt.kill();
    let mut ready_rx = r.server.ready();
    tokio::time::timeout(BOUND, ready_rx.wait_for(|r| !*r))
        .await
        .unwrap()
        .unwrap();
    assert!(serves_nothing(pod.path()).unwrap());
    let start = Instant::now();
    let err = r
        .server
        .add_workload("uid-late", info("late"), netns_fd(&late))
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(err, ZdsError::NotConnected { .. }), "{err}");
    assert!(
        err.to_string().contains(&r.path.display().to_string()),
        "{err}"
    );

    // ztunnel comes back: it gets the snapshot (the pod, then SnapshotSent; ready means
    // SnapshotSent was acknowledged) and serves the pod again from scratch.
    r.zt.restart().unwrap();
    ready(&r.server, &r.zt).await;
    eventually(&r.zt, "pod served again after the restart", || {
        serves_pod(pod.path()).unwrap()
    })
    .await;
    let log = r.zt.log();
    assert!(log.contains("uid-app"), "{}", r.zt.log_tail(40));
    assert!(
        log.contains("received snapshot sent"),
        "{}",
        r.zt.log_tail(40)
    );
    // The refused pod was never sent: nothing listens in its namespace.
    assert!(serves_nothing(late.path()).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_ztunnel_reconnects_and_reconciles_to_the_new_snapshot() {
    let Some(bin) = prerequisites() else { return };
    let kept = TestNetns::with_prefix("zds-pod").unwrap();
    let gone = TestNetns::with_prefix("zds-pod").unwrap();
    let r = rig(&bin, &[workload("kept"), workload("gone")], |b| {
        b.config(ZdsConfig::default())
    })
    .await;
    for (uid, name, ns) in [("uid-kept", "kept", &kept), ("uid-gone", "gone", &gone)] {
        with_log(
            &r.zt,
            "add",
            r.server.add_workload(uid, info(name), netns_fd(ns)),
        )
        .await;
    }
    eventually(&r.zt, "both pods served", || {
        serves_pod(kept.path()).unwrap() && serves_pod(gone.path()).unwrap()
    })
    .await;

    // The agent goes away (socket removed, connection closed). ztunnel keeps serving.
    let Rig {
        _dir,
        path,
        server,
        zt,
    } = r;
    drop(server);
    assert!(!path.exists());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(serves_pod(kept.path()).unwrap() && serves_pod(gone.path()).unwrap());

    // The agent comes back knowing only `kept` (say `gone` was deleted meanwhile): ztunnel
    // reconnects, takes the snapshot, and drops `gone`.
    let server = ZdsServer::builder(&path)
        .workload("uid-kept", info("kept"), netns_fd(&kept))
        .bind()
        .unwrap();
    ready(&server, &zt).await;
    eventually(&zt, "the pod left out of the snapshot is dropped", || {
        serves_nothing(gone.path()).unwrap()
    })
    .await;
    assert!(serves_pod(kept.path()).unwrap(), "{}", zt.log_tail(40));
    assert_eq!(server.known_workloads(), ["uid-kept"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_ztunnel_cannot_serve_is_refused_with_its_reason_and_can_be_added_later() {
    let Some(bin) = prerequisites() else { return };
    let pod = TestNetns::with_prefix("zds-pod").unwrap();
    let r = rig(&bin, &[workload("app")], |b| b).await;
    // Something in the pod already holds ztunnel's outbound port.
    let squatter = pod
        .run(|| std::net::TcpListener::bind("[::]:15001"))
        .unwrap()
        .unwrap();
    let err = r
        .server
        .add_workload("uid-app", info("app"), netns_fd(&pod))
        .await
        .unwrap_err();
    assert!(matches!(err, ZdsError::Rejected { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("default/app (uid uid-app)"), "{msg}");
    assert!(msg.contains(&r.path.display().to_string()), "{msg}");
    assert!(r.server.known_workloads().is_empty());
    // Withdrawn: ztunnel would otherwise retry a pending pod every 5 s (RETRY_DURATION in
    // its src/inpod/workloadmanager.rs) and serve it behind the caller's back once the port
    // is free. Free it and wait past one retry period: nothing may start.
    assert!(r.server.is_ready());
    drop(squatter);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(serves_nothing(pod.path()).unwrap(), "{}", r.zt.log_tail(20));

    // Once the port is free, the same pod is added normally.
    with_log(
        &r.zt,
        "add after the conflict",
        r.server
            .add_workload("uid-app", info("app"), netns_fd(&pod)),
    )
    .await;
    eventually(&r.zt, "pod served", || serves_pod(pod.path()).unwrap()).await;
}
