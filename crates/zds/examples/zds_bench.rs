//! Benchmark of the ZDS round trip against a real ztunnel (not a test: prints numbers).
//!
//!     cargo run --release -p zds --example zds_bench -- [PODS]      (root; default 200 pods)
//!
//! Measures, with PODS real network namespaces:
//! - `add_workload` round trip (agent -> ztunnel -> Ack; ztunnel opens its 4 listeners in the
//!   pod before it acks), sequentially, p50/p99/max;
//! - the same with min(PODS, 100) callers at once (the protocol serializes them);
//! - `del_workload` round trip;
//! - reconnect: ztunnel restarted with PODS pods in the store, time until the snapshot is
//!   acknowledged.
//!
//! Uses the ztunnel binary of `integration/scripts/build-ztunnel.sh` (`$ZTUNNEL_BIN`).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testbed::TestNetns;
use testbed::ztunnel::{LocalWorkload, Ztunnel, ztunnel_binary};
use zds::{WorkloadInfo, ZdsConfig, ZdsServer};

fn info(i: usize) -> WorkloadInfo {
    WorkloadInfo {
        name: format!("pod-{i}"),
        namespace: "default".into(),
        service_account: "sa".into(),
    }
}

fn fd(ns: &TestNetns) -> OwnedFd {
    std::fs::File::open(ns.path()).unwrap().into()
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let pct =
        |p: f64| samples[((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{what:<40} n={:<4} p50={:>7.3} ms  p99={:>7.3} ms  max={:>7.3} ms",
        samples.len(),
        ms(pct(0.50)),
        ms(pct(0.99)),
        ms(*samples.last().unwrap())
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pods: usize = std::env::args()
        .nth(1)
        .map_or(200, |a| a.parse().expect("PODS"));
    assert!(testbed::is_root(), "needs root (network namespaces)");
    let bin = ztunnel_binary().expect("ztunnel binary");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ztunnel.sock");
    let namespaces: Vec<TestNetns> = (0..pods)
        .map(|_| TestNetns::with_prefix("zb").unwrap())
        .collect();
    let workloads: Vec<LocalWorkload> = (0..pods)
        .map(|i| LocalWorkload {
            name: info(i).name,
            namespace: "default".into(),
            service_account: "sa".into(),
            ips: vec![],
        })
        .collect();
    let config = ZdsConfig {
        ack_timeout: Duration::from_secs(10),
        ..ZdsConfig::default()
    };
    let server = Arc::new(ZdsServer::bind(&sock, config).unwrap());
    let mut zt = Ztunnel::start(&bin, &sock, &workloads).unwrap();
    assert!(
        server.wait_ready(Duration::from_secs(30)).await,
        "{}",
        zt.log_tail(30)
    );
    println!(
        "ztunnel connected; {pods} pods; {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // 1. sequential adds
    let mut adds = Vec::with_capacity(pods);
    for (i, ns) in namespaces.iter().enumerate() {
        let t = Instant::now();
        server
            .add_workload(&format!("uid-{i}"), info(i), fd(ns))
            .await
            .unwrap();
        adds.push(t.elapsed());
    }
    report("add_workload, sequential", adds);

    // 2. reconnect with every pod in the store
    zt.kill();
    let t = Instant::now();
    zt.restart().unwrap();
    assert!(
        server.wait_ready(Duration::from_secs(60)).await,
        "{}",
        zt.log_tail(30)
    );
    println!(
        "{:<40} {:.1} ms from ztunnel start to snapshot of {pods} pods acknowledged",
        "ztunnel restart -> ready",
        t.elapsed().as_secs_f64() * 1e3
    );

    // 3. sequential dels
    let mut dels = Vec::with_capacity(pods);
    for i in 0..pods {
        let t = Instant::now();
        server.del_workload(&format!("uid-{i}")).await.unwrap();
        dels.push(t.elapsed());
    }
    report("del_workload, sequential", dels);

    // 4. many callers at once
    let burst = pods.min(100);
    let t = Instant::now();
    let tasks: Vec<_> = namespaces[..burst]
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            let server = server.clone();
            let netns = fd(ns);
            tokio::spawn(async move {
                let t = Instant::now();
                server
                    .add_workload(&format!("uid-b{i}"), info(i), netns)
                    .await
                    .unwrap();
                t.elapsed()
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(burst);
    for task in tasks {
        lat.push(task.await.unwrap());
    }
    let wall = t.elapsed();
    report(&format!("add_workload, {burst} at once"), lat);
    println!(
        "{:<40} {:.1} ms for all {burst}",
        "  wall time",
        wall.as_secs_f64() * 1e3
    );
}
