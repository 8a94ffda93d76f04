//! The daemon's part of the project's adversarial suite: the real install-cni binary against a
//! hostile node — a primary CNI rewriting its config hundreds of times, corrupt JSON, symlinks
//! planted to lead writes outside, umask 000, SIGTERM after several files were touched, and a
//! Kubernetes API that sends ERROR events, garbage, 410s, hangs and resets. Each test prints a
//! one-line `summary:` (the README's "Reliability" figures; run with `--nocapture`).

mod common;

use common::kube_api::{FakeKube, broken_pod};
use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(15);

fn other_list(name: &str, plugin: &str) -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "cniVersion": "0.3.1", "name": name,
        "plugins": [{"type": plugin}]
    }))
    .unwrap()
}

fn has_ours(p: &Path) -> bool {
    read_json(p).is_some_and(|v| types(&v).iter().any(|t| t == "istio-cni"))
}

fn ours_count(p: &Path) -> usize {
    read_json(p).map_or(0, |v| {
        types(&v).iter().filter(|t| *t == "istio-cni").count()
    })
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn is_link(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Item 4: while the primary was invalid the daemon chained into the next valid files; on
/// SIGTERM every file it ever inserted into must be clean again, not only the last one.
#[test]
fn sigterm_cleans_every_touched_file() {
    let env = Env::new();
    let (f10, f20, f30) = (
        env.net.join("10-calico.conflist"),
        env.net.join("20-other.conflist"),
        env.net.join("30-third.conflist"),
    );
    fs::write(&f10, b"{ \"cniVersion\": \"0.3.1\", \"plugins\": [").unwrap();
    fs::write(&f20, b"not json at all").unwrap();
    fs::write(&f30, other_list("third", "ptp")).unwrap();
    fs::write(env.net.join("README"), "left alone").unwrap();
    let d = env.start(&[]);
    d.wait_ready(T);
    assert!(wait_until(T, || has_ours(&f30)), "{}", d.log());
    // The primary's files become valid one after the other: the daemon moves along.
    fs::write(&f20, other_list("other", "bridge")).unwrap();
    assert!(wait_until(T, || has_ours(&f20)), "{}", d.log());
    fs::write(&f10, calico()).unwrap();
    assert!(wait_until(T, || has_ours(&f10)), "{}", d.log());
    let touched = [&f10, &f20, &f30].iter().filter(|p| has_ours(p)).count();
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert_eq!(fs::read(&f10).unwrap(), calico(), "{log}");
    assert_eq!(
        fs::read(&f20).unwrap(),
        other_list("other", "bridge"),
        "{log}"
    );
    assert_eq!(fs::read(&f30).unwrap(), other_list("third", "ptp"), "{log}");
    assert_eq!(
        fs::read_to_string(env.net.join("README")).unwrap(),
        "left alone"
    );
    assert_eq!(
        names(&env.net),
        [
            "10-calico.conflist",
            "20-other.conflist",
            "30-third.conflist",
            "README"
        ]
    );
    assert!(
        names(&env.bin).is_empty(),
        "binaries gone: {:?}",
        names(&env.bin)
    );
    assert!(!env.kubeconfig().exists());
    let clean = [&f10, &f20, &f30].iter().filter(|p| !has_ours(p)).count();
    eprintln!(
        "summary: sigterm-touched-files: files touched 3 (with our entry at SIGTERM {touched}), clean after exit {clean}/3, binaries left 0"
    );
}

/// Corrupt JSON in the primary and in every other file: corrupt files are never written, the
/// daemon waits (not ready) while nothing valid exists, and chains once something does.
#[test]
fn corrupt_json_is_never_written() {
    let env = Env::new();
    let corrupt: &[(&str, &[u8])] = &[
        (
            "00-torn.conflist",
            b"{\"cniVersion\":\"0.3.1\",\"name\":\"x\",\"plugins\":[{\"type\":",
        ),
        ("01-array.conflist", b"[1,2,3]"),
        ("02-noplugins.conflist", b"{\"name\":\"x\",\"plugins\":[]}"),
        (
            "03-plugins-object.conflist",
            b"{\"name\":\"x\",\"plugins\":{\"type\":\"a\"}}",
        ),
        ("04-notype.conf", b"{\"name\":\"x\"}"),
        ("05-binary.conflist", b"\x00\xff\xfe{"),
        ("06-empty.conflist", b""),
        ("07-nul.conf", b"{\"type\":\"a\"\x00}"),
        (
            "08-name-number.conflist",
            b"{\"name\":5,\"plugins\":[{\"type\":\"a\"}]}",
        ),
    ];
    for (n, b) in corrupt {
        fs::write(env.net.join(n), b).unwrap();
    }
    let d = env.start(&[]);
    assert!(wait_until(T, || d.get("/readyz").0 == 503));
    assert!(wait_until(T, || env.kubeconfig().exists()));
    std::thread::sleep(Duration::from_millis(300));
    let primary = env.net.join("50-calico.conflist");
    fs::write(&primary, calico()).unwrap();
    d.wait_ready(T);
    assert!(wait_until(T, || has_ours(&primary)));
    // The primary itself goes corrupt for a while, then valid again.
    fs::write(&primary, b"{ torn").unwrap();
    assert!(wait_until(T, || d.get("/readyz").0 == 503), "{}", d.log());
    atomic_write(&primary, &calico());
    assert!(wait_until(T, || has_ours(&primary)), "{}", d.log());
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    let mut untouched = 0;
    for (n, b) in corrupt {
        assert_eq!(
            &fs::read(env.net.join(n)).unwrap()[..],
            *b,
            "{n} changed\n{log}"
        );
        untouched += 1;
    }
    assert_eq!(fs::read(&primary).unwrap(), calico());
    assert!(!log.contains("panicked"), "{log}");
    eprintln!(
        "summary: corrupt-json: corrupt files {} (+ primary corrupted mid-run), written 0, untouched {untouched}, panics 0",
        corrupt.len()
    );
}

/// Rounds of rewrite storms by the primary, each ending in a different state; after every
/// round the end state is our entry exactly once, valid JSON, the primary's plugins intact and
/// no temp files.
#[test]
fn rewrite_storm_rounds_end_clean() {
    let env = Env::new();
    let list = env.net.join("10-calico.conflist");
    let base = golden_json("test-testdata/pre/calico.conflist");
    let plain = serde_json::to_vec_pretty(&base).unwrap();
    fs::write(&list, &plain).unwrap();
    let d = env.start(&[]);
    d.wait_ready(T);
    let with_ours = fs::read(&list).unwrap();
    let ours = read_json(&list).unwrap()["plugins"][2].clone();
    let mut doubled = base.clone();
    doubled["plugins"]
        .as_array_mut()
        .unwrap()
        .insert(0, ours.clone());
    doubled["plugins"].as_array_mut().unwrap().push(ours);
    let doubled = serde_json::to_vec(&doubled).unwrap();
    let finals: [(&str, &[u8]); 4] = [
        ("entry dropped", &plain),
        ("entry twice", &doubled),
        ("torn then whole", &plain),
        ("ours kept", &with_ours),
    ];
    let (mut rewrites, mut rounds_ok) = (0, 0);
    for (round, (what, last)) in finals.iter().enumerate() {
        for i in 0..150 {
            match (i + round) % 5 {
                0 => atomic_write(&list, &plain),
                1 => fs::write(&list, &plain[..plain.len() / 3]).unwrap(),
                2 => atomic_write(&list, &doubled),
                3 => fs::write(&list, &with_ours).unwrap(),
                _ => fs::write(&list, b"{").unwrap(),
            }
            rewrites += 1;
            std::thread::sleep(Duration::from_micros(700));
        }
        if *what == "torn then whole" {
            fs::write(&list, b"{\"torn\":").unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        atomic_write(&list, last);
        rewrites += 1;
        let ok = wait_until(Duration::from_secs(12), || {
            read_json(&list).is_some_and(|v| types(&v) == ["calico", "portmap", "istio-cni"])
        });
        assert!(
            ok,
            "round {round} ({what}): {:?}\n{}",
            fs::read_to_string(&list),
            d.log()
        );
        let v = read_json(&list).unwrap();
        assert_eq!(v["plugins"][0], base["plugins"][0]);
        assert_eq!(v["plugins"][1], base["plugins"][1]);
        assert_eq!(ours_count(&list), 1);
        assert_eq!(names(&env.net), ["10-calico.conflist"], "temp files left");
        rounds_ok += 1;
    }
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert_eq!(fs::read(&list).unwrap(), plain, "restored after the storm");
    eprintln!(
        "summary: rewrite-storm: rounds {rounds_ok}/4 clean, rewrites {rewrites}, end state our entry x1 + valid JSON + 0 temp files each round"
    );
}

/// A symlinked primary inside the net dir stays a symlink (its target is written in place,
/// atomically); one pointing outside the net dir is refused and never written.
#[test]
fn symlinked_conflists() {
    let env = Env::new();
    let real_dir = env.net.join("calico-real");
    fs::create_dir(&real_dir).unwrap();
    let real = real_dir.join("calico.conflist");
    fs::write(&real, calico()).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o644)).unwrap();
    let link = env.net.join("10-calico.conflist");
    symlink("calico-real/calico.conflist", &link).unwrap();
    let d = env.start(&[]);
    d.wait_ready(T);
    assert!(
        is_link(&link),
        "the primary's symlink was replaced\n{}",
        d.log()
    );
    assert!(has_ours(&real));
    assert_eq!(mode(&real), 0o644);
    // The primary rewrites its target: repaired through the link again.
    atomic_write(&real, &calico());
    assert!(wait_until(T, || has_ours(&real)), "{}", d.log());
    assert!(is_link(&link));
    assert_eq!(names(&real_dir), ["calico.conflist"], "temp files left");
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert!(is_link(&link), "a symlink after uninstall");
    assert_eq!(fs::read(&real).unwrap(), calico(), "{log}");

    // Pointing outside the CNI config dir: refused, named in the log, nothing written.
    let env = Env::new();
    let outside = env.tmp.path().join("elsewhere");
    fs::create_dir(&outside).unwrap();
    let target = outside.join("calico.conflist");
    fs::write(&target, calico()).unwrap();
    let link = env.net.join("10-calico.conflist");
    symlink(&target, &link).unwrap();
    let d = env.start(&[]);
    assert!(
        d.wait_log("outside the CNI config dir", T),
        "no refusal in the log\n{}",
        d.log()
    );
    assert!(!d.ready());
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert_eq!(fs::read(&target).unwrap(), calico());
    assert_eq!(names(&outside), ["calico.conflist"]);
    assert!(is_link(&link));

    // A symlinked .conf would have to become a .conflist: renaming would replace the link.
    let env = Env::new();
    fs::create_dir(env.net.join("real")).unwrap();
    let mut single = golden_json("test-testdata/pre/calico.conflist")["plugins"][0].clone();
    single["cniVersion"] = "0.3.1".into();
    single["name"] = "k8s-pod-network".into();
    let single = serde_json::to_vec_pretty(&single).unwrap();
    fs::write(env.net.join("real/calico.conf"), &single).unwrap();
    let link = env.net.join("10-calico.conf");
    symlink("real/calico.conf", &link).unwrap();
    let d = env.start(&[]);
    assert!(
        d.wait_log("converting it to a .conflist would replace the link", T),
        "{}",
        d.log()
    );
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert!(is_link(&link));
    assert_eq!(fs::read(env.net.join("real/calico.conf")).unwrap(), single);
    assert_eq!(names(&env.net), ["10-calico.conf", "real"]);
    eprintln!(
        "summary: conflist-symlinks: inside net dir kept as link through install+repair+uninstall 1/1, outside refused 1/1, symlinked .conf conversion refused 1/1, outside files written 0"
    );
}

/// Symlinks planted where the daemon writes (run dir, kubeconfig, binaries, the plugin's
/// log): no write follows them, cleanup removes nothing behind them.
#[test]
fn planted_symlinks_are_never_followed() {
    let mut followed = 0;
    // 1. The run dir itself is a symlink to a directory outside.
    let env = Env::new();
    fs::write(env.net.join("10-calico.conflist"), calico()).unwrap();
    let outside = env.tmp.path().join("outside-run");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("istio-cni-kubeconfig"), "sentinel").unwrap();
    fs::remove_dir(&env.run).unwrap();
    symlink(&outside, &env.run).unwrap();
    let d = env.start(&[]);
    assert!(d.wait_log("symlink", T), "{}", d.log());
    assert!(!d.ready());
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    if fs::read_to_string(outside.join("istio-cni-kubeconfig"))
        .ok()
        .as_deref()
        != Some("sentinel")
    {
        followed += 1;
    }
    assert_eq!(names(&outside), ["istio-cni-kubeconfig"], "{log}");
    assert_eq!(
        fs::read_to_string(outside.join("istio-cni-kubeconfig")).unwrap(),
        "sentinel"
    );

    // 2. kubeconfig, binary and log file inside the real run/bin dirs are links to outside.
    let env = Env::new();
    fs::write(env.net.join("10-calico.conflist"), calico()).unwrap();
    let outside = env.tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let secret = outside.join("secret");
    let evil = outside.join("evil");
    let log_target = outside.join("log");
    fs::write(&secret, "do not overwrite").unwrap();
    // Same bytes and mode as the real binary: "identical" must not be good enough.
    fs::copy(env.src.join("istio-cni"), &evil).unwrap();
    fs::set_permissions(&evil, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(&log_target, "old log").unwrap();
    symlink(&secret, env.kubeconfig()).unwrap();
    symlink(&evil, env.bin.join("istio-cni")).unwrap();
    symlink(&log_target, env.run.join("istio-cni.log")).unwrap();
    let before = snapshot(&outside);
    let d = env.start(&[]);
    d.wait_ready(T);
    assert!(
        !is_link(&env.kubeconfig()),
        "kubeconfig still a planted link"
    );
    assert!(
        !is_link(&env.bin.join("istio-cni")),
        "binary still a planted link"
    );
    assert_eq!(mode(&env.kubeconfig()), 0o600);
    assert_eq!(mode(&env.bin.join("istio-cni")), 0o755);
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    let after = snapshot(&outside);
    followed += before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(*v))
        .count();
    assert_eq!(after, before, "a file outside changed\n{log}");
    eprintln!(
        "summary: planted-symlinks: links planted 4 (run dir, kubeconfig, binary, plugin log), writes or removals through them {followed}"
    );
    assert_eq!(followed, 0);
}

/// Item 9: every directory and file the daemon creates has an explicit mode, whatever the
/// umask (the daemon runs under `umask 000` here).
#[test]
fn modes_do_not_depend_on_the_umask() {
    let mut checked = 0;
    let run_umask0 = |env: &Env, run: &Path, bin: &Path, extra: &[(&str, &str)]| {
        let mut c = env.command();
        c.env("CNI_AGENT_RUN_DIR", run)
            .env("CNI_BIN_TARGET_DIRS", bin);
        for (k, v) in extra {
            c.env(k, v);
        }
        // SAFETY: umask is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            c.pre_exec(|| {
                nix::sys::stat::umask(nix::sys::stat::Mode::empty());
                Ok(())
            });
        }
        common::spawn(c)
    };
    // Chained: run dir and bin dir (with missing parents) created by the daemon.
    let env = Env::new();
    let list = env.net.join("10-calico.conflist");
    fs::write(&list, calico()).unwrap();
    fs::set_permissions(&list, fs::Permissions::from_mode(0o644)).unwrap();
    let conf = env.net.join("20-single.conf");
    let run = env.tmp.path().join("var/run/istio-cni");
    let bin = env.tmp.path().join("opt/cni/bin");
    let d = run_umask0(&env, &run, &bin, &[]);
    d.wait_ready(T);
    let mut want: BTreeMap<PathBuf, u32> = BTreeMap::new();
    for p in [
        env.tmp.path().join("var"),
        env.tmp.path().join("var/run"),
        run.clone(),
        env.tmp.path().join("opt"),
        env.tmp.path().join("opt/cni"),
        bin.clone(),
    ] {
        want.insert(p, 0o755);
    }
    want.insert(run.join("istio-cni-kubeconfig"), 0o600);
    want.insert(bin.join("istio-cni"), 0o755);
    want.insert(bin.join("istio-nftables"), 0o755);
    want.insert(list.clone(), 0o644);
    let got: BTreeMap<PathBuf, u32> = want.keys().map(|p| (p.clone(), mode(p))).collect();
    assert_eq!(got, want, "{}", d.log());
    checked += want.len();
    let _ = fs::remove_file(&conf);
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");

    // KUBECONFIG_MODE, a net dir created by us, a standalone file with CNI_CONF_GROUP_READ.
    let env = Env::new();
    let net = env.tmp.path().join("etc/cni/net.d");
    let run = env.tmp.path().join("run2");
    let mut c_extra = vec![
        ("CHAINED_CNI_PLUGIN", "false"),
        ("CNI_CONF_GROUP_READ", "true"),
        ("KUBECONFIG_MODE", "0640"),
    ];
    let net_s = net.display().to_string();
    c_extra.push(("MOUNTED_CNI_NET_DIR", &net_s));
    let d = run_umask0(&env, &run, &env.bin, &c_extra);
    d.wait_ready(T);
    let standalone = net.join("YYY-istio-cni.conf");
    let mut want: BTreeMap<PathBuf, u32> = BTreeMap::new();
    want.insert(env.tmp.path().join("etc"), 0o755);
    want.insert(env.tmp.path().join("etc/cni"), 0o755);
    want.insert(net.clone(), 0o755);
    want.insert(run.clone(), 0o755);
    want.insert(run.join("istio-cni-kubeconfig"), 0o640);
    want.insert(standalone.clone(), 0o640);
    let got: BTreeMap<PathBuf, u32> = want.keys().map(|p| (p.clone(), mode(p))).collect();
    assert_eq!(got, want, "{}", d.log());
    checked += want.len();
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    // Nothing world-writable anywhere under the temp dir.
    let mut stack = vec![env.tmp.path().to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let m = fs::symlink_metadata(&p).unwrap();
            if !m.file_type().is_symlink() {
                assert_eq!(m.mode() & 0o002, 0, "{} is world-writable", p.display());
            }
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    eprintln!("summary: umask-000: paths checked {checked}, wrong modes 0, world-writable 0");
}

/// The PATCH that labels `uid`'s pod, if any.
fn labeled_at(kube: &FakeKube, name: &str) -> bool {
    kube.actions()
        .iter()
        .any(|r| r.method == "PATCH" && r.path.ends_with(&format!("/pods/{name}/status")))
}

/// Item 11: watch faults end the watch, one short backoff, re-list; the next real pod event
/// is handled within seconds (measured per fault).
#[test]
fn watch_faults_recover_quickly() {
    let env = Env::new();
    let kube = FakeKube::start();
    let kc = kube.kubeconfig(env.tmp.path());
    let d = env.start(&[
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("REPAIR_NODE_NAME", "node-a"),
        ("REPAIR_REPAIR_PODS", "false"),
        ("REPAIR_LABEL_PODS", "true"),
        ("POD_WATCH_TIMEOUT_SECONDS", "3"),
    ]);
    assert!(wait_until(T, || kube.watchers() > 0), "{}", d.log());
    type Fault = fn(&FakeKube);
    let faults: Vec<(&str, Fault, Duration)> = vec![
        ("none", |_| {}, Duration::from_secs(5)),
        (
            "5 ERROR events (etcdserver: request timed out)",
            |k| {
                for _ in 0..5 {
                    k.send_error(500, "InternalError", "etcdserver: request timed out");
                }
            },
            Duration::from_secs(5),
        ),
        (
            "7 undecodable lines",
            |k| {
                for i in 0..7 {
                    k.send_raw(&format!("{{\"type\": \"ADDED\", \"object\": garbage {i}"));
                }
            },
            Duration::from_secs(5),
        ),
        ("410 Gone", |k| k.expire(), Duration::from_secs(5)),
        (
            "connection reset",
            |k| k.reset_watches(),
            Duration::from_secs(5),
        ),
        // Silent until the watch's own timeout (3 s here) + 2 s grace.
        ("hung watch", |k| k.hang_watches(), Duration::from_secs(12)),
        // 410 forces a re-list, which hangs until the list timeout (watch timeout + 2 s).
        (
            "410 then a hung list",
            |k| {
                k.hang_next_lists(1);
                k.expire();
            },
            Duration::from_secs(12),
        ),
        (
            "ERROR event + 3 garbage lines, twice",
            |k| {
                for _ in 0..2 {
                    k.send_error(500, "InternalError", "etcdserver: leader changed");
                    for _ in 0..3 {
                        k.send_raw("\u{0}\u{1}not json");
                    }
                }
            },
            Duration::from_secs(5),
        ),
    ];
    let mut report = Vec::new();
    for (i, (what, fault, bound)) in faults.iter().enumerate() {
        // Quiet before each fault, so one fault's recovery does not hide the next.
        assert!(
            wait_until(T, || kube.watchers() > 0),
            "no watch before {what}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(1200));
        let name = format!("p{i}");
        fault(&kube);
        let t0 = Instant::now();
        kube.add(broken_pod(
            "shop",
            &name,
            &format!("uid-{i}"),
            "10.255.1.1",
            "node-a",
            126,
        ));
        let ok = wait_until(*bound + Duration::from_secs(10), || {
            labeled_at(&kube, &name)
        });
        let took = t0.elapsed();
        assert!(ok, "{what}: pod never handled\n{}", d.log());
        assert!(
            took <= *bound,
            "{what}: handled after {took:?} (bound {bound:?})\n{}",
            d.log()
        );
        report.push(format!("{what} {} ms", took.as_millis()));
    }
    let lists = kube.list_requests();
    let watches = kube.watch_requests();
    // The faults are visible to operators.
    assert!(
        d.metric("istio_cni_pod_cache_watch_errors_total") >= 3.0,
        "{}",
        d.get("/metrics").1
    );
    assert_eq!(d.metric("istio_cni_pod_cache_watch_hangs_total"), 1.0);
    assert!(d.metric("istio_cni_pod_cache_watch_expired_total") >= 1.0);
    assert_eq!(d.metric("istio_cni_pod_cache_pods"), faults.len() as f64);
    assert!(!d.log().contains("panicked"));
    drop(d);
    eprintln!(
        "summary: watch-faults: faults {} handled {}/{} (lists {lists}, watches {watches}); time to handle the next pod: {}",
        faults.len() - 1,
        faults.len(),
        faults.len(),
        report.join(", ")
    );
}

/// Issue 21 item 1: files and links planted at the daemon's temp names (`<name>.tmp.<pid>.<n>`
/// was predictable) made every install pass fail with EEXIST. Now every repair still goes
/// through, nothing is written through a planted link, and nothing planted is removed but
/// the stale temp files the installer always clears next to the binaries.
#[test]
fn planted_temp_names_do_not_block_the_install() {
    let env = Env::new();
    let (_, d) = env.ready_on_calico(T);
    let outside = env.tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let secret = outside.join("secret");
    fs::write(&secret, "do not overwrite").unwrap();
    // Every name the old scheme would use next, as regular files and as links.
    let mut planted = Vec::new();
    for (dir, name) in [
        (&env.run, "istio-cni-kubeconfig"),
        (&env.net, "10-calico.conflist"),
    ] {
        for n in 0..400 {
            let p = dir.join(format!("{name}.tmp.{}.{n}", d.pid()));
            if n % 2 == 0 {
                fs::write(&p, "planted").unwrap();
            } else {
                symlink(&secret, &p).unwrap();
            }
            planted.push(p);
        }
    }
    // Three repairs: a rotated token, the primary dropping our entry, a deleted binary.
    fs::write(env.sa.join("token"), "rotated-token").unwrap();
    atomic_write(&env.net.join("10-calico.conflist"), &calico());
    fs::remove_file(env.bin.join("istio-cni")).unwrap();
    let deadline = Instant::now() + T;
    let repaired = || {
        fs::read_to_string(env.kubeconfig()).is_ok_and(|k| k.contains("rotated-token"))
            && has_ours(&env.net.join("10-calico.conflist"))
            && env.bin.join("istio-cni").is_file()
    };
    while !repaired() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(repaired(), "not repaired:\n{}", d.log());
    assert_eq!(
        d.metric("istio_cni_installs_total{result=\"CREATE_KUBECONFIG_FAILURE\"}"),
        0.0,
        "{}",
        d.log()
    );
    assert_eq!(
        d.metric("istio_cni_installs_total{result=\"CREATE_CNI_CONFIG_FAILURE\"}"),
        0.0
    );
    assert_eq!(fs::read_to_string(&secret).unwrap(), "do not overwrite");
    let kept = planted
        .iter()
        .filter(|p| fs::symlink_metadata(p).is_ok())
        .count();
    assert_eq!(kept, planted.len(), "planted files were removed");
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    println!(
        "planted temp names: {} planted (files and links), 3 repairs done, 0 install failures, 0 writes through a link",
        planted.len()
    );
}
