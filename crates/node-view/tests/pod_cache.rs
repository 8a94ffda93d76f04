//! The node pod cache in process against the local API server: one list + watch serves every
//! subscriber, late subscribers get a replay, and a re-list emits `Deleted` for pods that
//! vanished while the watch was down.

use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use node_view::cache::{PodCache, PodEvent, Subscription};
use std::time::Duration;
use testbed::kube_api::{FakeKube, broken_pod};

const T: Duration = Duration::from_secs(15);

/// Events until (and including) the first `Synced`, or until `n` events when `n` is given.
async fn take(s: &mut Subscription, n: Option<usize>) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let ev = tokio::time::timeout(T, s.recv())
            .await
            .expect("no pod event within 15 s")
            .expect("cache gone");
        let synced = matches!(ev, PodEvent::Synced);
        out.push(match ev {
            PodEvent::Applied(p) => format!("+{}", p.metadata.name.clone().unwrap_or_default()),
            PodEvent::Deleted(p) => format!("-{}", p.metadata.name.clone().unwrap_or_default()),
            PodEvent::Synced => "synced".into(),
        });
        if n.map_or(synced, |n| out.len() == n) {
            return out;
        }
    }
}

/// The local API server serving pod `shop/a` on `node-a`, its kubeconfig's directory, and a
/// plain kube client for it.
async fn api_with_pod_a() -> (FakeKube, tempfile::TempDir, kube::Client) {
    let kube = FakeKube::start();
    let tmp = tempfile::tempdir().unwrap();
    let kc = Kubeconfig::read_from(kube.kubeconfig(tmp.path())).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    kube.add(broken_pod("shop", "a", "uid-a", "10.0.0.1", "node-a", 126));
    (kube, tmp, client)
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn one_watch_serves_every_subscriber_and_relists_deletions() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (kube, _tmp, client) = api_with_pod_a().await;
        kube.add(broken_pod("shop", "b", "uid-b", "10.0.0.2", "node-a", 126));

        let cache = PodCache::new();
        let mut first = cache.subscribe();
        tokio::spawn(
            cache
                .clone()
                .run(Api::all(client), "node-a".into(), Duration::from_secs(2)),
        );
        assert_eq!(sorted(take(&mut first, None).await), ["+a", "+b", "synced"]);
        let list = &kube.requests()[0];
        assert!(list.query.contains("fieldSelector=spec.nodeName%3Dnode-a"), "{list:?}");

        // A second consumer: replayed from the cache, no second list or watch.
        let mut second = cache.subscribe();
        assert_eq!(sorted(take(&mut second, None).await), ["+a", "+b", "synced"]);
        kube.add(broken_pod("shop", "c", "uid-c", "10.0.0.3", "node-a", 126));
        assert_eq!(take(&mut first, Some(1)).await, ["+c"]);
        assert_eq!(take(&mut second, Some(1)).await, ["+c"]);
        assert_eq!((kube.list_requests(), kube.watch_requests()), (1, 1));

        // The watch hangs; b is deleted and the history compacted meanwhile (its DELETED event
        // is never delivered, a resume would get 410): the cache gives up on the silent watch,
        // re-lists, and reports b as deleted.
        kube.hang_watches();
        kube.delete("uid-b");
        kube.expire();
        assert_eq!(take(&mut first, None).await, ["-b", "synced"]);
        assert_eq!(take(&mut second, None).await, ["-b", "synced"]);
        assert_eq!(sorted(cache.snapshot().iter().map(|p| p.metadata.name.clone().unwrap()).collect()), ["a", "c"]);
        let stats = cache.stats();
        assert_eq!((stats.hangs, stats.lists), (1, 2), "{stats:?}");

        // A brownout: the next 4 watches fail at once. Each failure ends the watch, backs off
        // (exponentially, jittered, capped) and re-lists; then events flow again.
        let (lists0, watches0, errors0) = (
            kube.list_requests(),
            kube.watch_requests(),
            cache.stats().watch_errors,
        );
        kube.fail_next_watches(4);
        kube.reset_watches();
        let t0 = std::time::Instant::now();
        while cache.stats().watch_errors < errors0 + 4 {
            assert!(t0.elapsed() < T, "{:?}", cache.stats());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let brownout = t0.elapsed();
        while kube.watchers() == 0 {
            assert!(t0.elapsed() < T, "no watch after the brownout");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (lists, watches) = (
            kube.list_requests() - lists0,
            kube.watch_requests() - watches0,
        );
        // Bounded: one list per failed watch, no hot loop.
        assert!(lists <= 5 && watches <= 6, "lists {lists}, watches {watches}");
        let t1 = std::time::Instant::now();
        kube.add(broken_pod("shop", "d", "uid-d", "10.0.0.4", "node-a", 126));
        let mut seen = Vec::new();
        while !seen.contains(&"+d".to_string()) {
            seen.extend(take(&mut first, Some(1)).await);
        }
        let took = t1.elapsed();
        eprintln!(
            "summary: pod-cache-brownout: failed watches 4 over {} ms, lists {lists}, watches {watches}, next event then delivered in {} ms",
            brownout.as_millis(),
            took.as_millis()
        );
        eprintln!(
            "summary: pod-cache: subscribers 2, lists {}, watches {}, hangs {}, 410s {}, deletions found by re-list 1/1",
            stats.lists, stats.watches, stats.hangs, stats.gone
        );
    });
}

/// A server answering every watch with 410 Gone: each re-list waits the backoff like any
/// other failed watch. Before, 410 re-listed at once: 136 lists in 10 s against a slow server,
/// as many as a fast one could answer.
#[test]
fn a_server_answering_every_watch_with_410_is_not_listed_in_a_hot_loop() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (kube, _tmp, client) = api_with_pod_a().await;
        kube.expire_next_watches(100_000);
        let cache = PodCache::new();
        tokio::spawn(
            cache
                .clone()
                .run(Api::all(client), "node-a".into(), Duration::from_secs(60)),
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        let lists = kube.list_requests();
        eprintln!("summary: 410 on every watch: {lists} lists in 3 s");
        // 100-200 ms, 200-400, 400-800, 800-1600 ms of backoff: at most 6 lists in 3 s.
        assert!(lists <= 8, "{lists} lists in 3 s");
        assert!(cache.stats().gone >= 3, "{:?}", cache.stats());
    });
}

/// A watch line the API server never ends: the client fails the watch once the line passes
/// its cap (64 MiB) and the cache lists again, instead of buffering the line for ever (before:
/// 700 MB/s of growth until the watch's timeout).
#[test]
fn a_watch_line_that_never_ends_fails_the_watch_at_the_cap() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let kube = FakeKube::start();
        let tmp = tempfile::tempdir().unwrap();
        let api = node_view::client::ApiServer {
            host: "127.0.0.1".into(),
            port: kube.port,
            protocol: "http".into(),
            ca_file: tmp.path().join("ca.crt"),
            skip_tls_verify: true,
            service_account_dir: tmp.path().to_path_buf(),
            kubeconfig: Some(kube.kubeconfig(tmp.path())),
        };
        let client = node_view::client::client(&api).await.unwrap();
        kube.add(broken_pod("shop", "a", "uid-a", "10.0.0.1", "node-a", 126));
        let cache = PodCache::new();
        let mut events = cache.subscribe();
        tokio::spawn(
            cache
                .clone()
                .run(Api::all(client), "node-a".into(), Duration::from_secs(60)),
        );
        assert_eq!(take(&mut events, None).await, ["+a", "synced"]);
        while kube.watchers() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let rss = || {
            std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap()
        };
        let before = rss();
        let sent = tokio::task::spawn_blocking(move || kube.send_unterminated(400 << 20))
            .await
            .unwrap();
        let t0 = std::time::Instant::now();
        while cache.stats().watch_errors == 0 {
            assert!(t0.elapsed() < T, "the watch never failed: {:?}", cache.stats());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let grown_mib = rss().saturating_sub(before) >> 10;
        eprintln!("summary: endless watch line: {} MiB taken by the client, RSS +{grown_mib} MiB, the watch failed", sent >> 20);
        assert!(sent < 400 << 20, "the client took all {} MiB", sent >> 20);
        assert!(grown_mib < 300, "RSS grew {grown_mib} MiB");
    });
}
