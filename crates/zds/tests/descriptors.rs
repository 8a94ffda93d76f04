//! Tests that count the process's descriptors, alone in their binary and one at a time (a
//! test running beside them would open and close descriptors of its own): a flood of silent
//! connections, and flapping, hostile peers.

mod common;

use std::time::Duration;

use common::{FakeZtunnel, WAIT, info, own_netns, quick, socket_dir};
use zds::ZdsServer;
use zds::wire::Request;

/// Held by each test for its whole run.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `test` alone, on a runtime built after the lock is taken and dropped before it is
/// released: a runtime's own descriptors (epoll, eventfd, the signal socket's copy) must not
/// appear in the middle of the other test's count.
fn alone(test: impl std::future::Future<Output = ()>) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(test);
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The process's descriptors and what each is, for a failure message.
fn fd_table() -> Vec<String> {
    let mut table: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            format!("{}->{}", e.file_name().to_string_lossy(), target.display())
        })
        .collect();
    table.sort();
    table
}

/// 2000 connections that never say hello, all within the hello timeout: the server holds a
/// bounded number of them (the oldest dropped first), and a ztunnel that says hello is served.
#[test]
fn a_flood_of_silent_connections_holds_a_bounded_number_of_descriptors() {
    alone(flood_of_silent_connections());
}

async fn flood_of_silent_connections() {
    let (_dir, path) = socket_dir();
    let config = zds::ZdsConfig {
        hello_timeout: Duration::from_secs(30),
        ..quick()
    };
    let server = ZdsServer::bind(&path, config).unwrap();
    let before = fds();
    let mut silent = Vec::new();
    for i in 0..2000 {
        silent.push(FakeZtunnel::connect_silent(&path));
        if i % 16 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = fds() - before - silent.len();
    assert!(
        held <= zds::MAX_PENDING_HELLOS + 16,
        "the server holds {held} descriptors for 2000 silent connections"
    );
    let zt = FakeZtunnel::connect(&path).await;
    assert_eq!(zt.take_snapshot().await, [Request::SnapshotSent]);
    assert!(server.wait_ready(WAIT).await);
}

/// 60 peers in a row, each misbehaving once it has the first pod's netns: gone mid-snapshot,
/// an oversized frame, garbage, a refused `SnapshotSent`, gone mid-`AddWorkload`. The server
/// holds no descriptor more afterwards, never reports the cut-off add served, and the next
/// good ztunnel gets every pod again.
#[test]
fn flapping_and_hostile_peers_leak_nothing_and_a_good_one_gets_every_pod() {
    alone(flapping_and_hostile_peers());
}

async fn flapping_and_hostile_peers() {
    let (_dir, path) = socket_dir();
    let mut builder = ZdsServer::builder(&path).config(quick());
    for i in 0..3 {
        builder = builder.workload(format!("uid-{i}"), info("p"), own_netns());
    }
    let server = std::sync::Arc::new(builder.bind().unwrap());
    let before = fds();
    let table_before = fd_table();
    for round in 0..60 {
        let zt = FakeZtunnel::connect(&path).await;
        let (_, fd) = zt.recv().await;
        drop(fd);
        match round % 5 {
            0 => {}
            1 => zt.conn.send(&[0u8; 4096], None).await.unwrap(),
            2 => zt.conn.send(&[0xff, 0xff, 0xff], None).await.unwrap(),
            3 => {
                zt.ack().await;
                for _ in 0..2 {
                    drop(zt.recv().await.1);
                    zt.ack().await;
                }
                assert_eq!(zt.recv().await.0, Request::SnapshotSent);
                zt.nack("no").await;
            }
            _ => {
                zt.ack().await;
                let rest = zt.take_snapshot().await;
                assert_eq!(rest.len(), 3, "{rest:?}");
                assert!(server.wait_ready(WAIT).await);
                let add = server.add_workload("uid-new", info("new"), own_netns());
                let (res, ()) = tokio::join!(add, async {
                    drop(zt.recv().await.1);
                    zt.conn.send(&[], None).await.ok();
                    drop(zt);
                });
                assert!(res.is_err(), "round {round}: a cut-off add reported served");
                assert!(!server.known_workloads().contains(&"uid-new".to_string()));
                continue;
            }
        }
        drop(zt);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!server.is_ready());
    // Descriptors close as the server's tasks notice; a leak never gets back to the start.
    let start = std::time::Instant::now();
    while fds() > before && start.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = fds();
    assert!(
        after <= before,
        "descriptors {before} before, {after} after\nbefore: {table_before:?}\nafter: {:?}",
        fd_table()
    );
    let zt = FakeZtunnel::connect(&path).await;
    let snapshot = zt.take_snapshot().await;
    assert_eq!(snapshot.len(), 4, "{snapshot:?}");
    assert!(server.wait_ready(WAIT).await);
    assert_eq!(server.known_workloads(), ["uid-0", "uid-1", "uid-2"]);
}
