//! The daemon on a node that fights back (outside audit, 2026-11-27): a CNI config dir the
//! uninstall cannot write, a FIFO or a huge file among the CNI configs, a primary config that
//! is not valid UTF-8 but that the runtime (libcni, Go) loads, a config named with non-UTF-8
//! bytes, a plugin binary that loses its exec bit. Each test failed on the audited binaries.

mod common;

use common::*;
use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(15);

fn names_istio_cni(p: &Path) -> bool {
    read_json(p).is_some_and(|v| types(&v).iter().any(|t| t == "istio-cni"))
}

fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(st.success(), "{cmd}");
}

/// `dir` read-only (a read-only bind mount of itself) until dropped.
struct ReadOnly<'a>(&'a Path);

impl<'a> ReadOnly<'a> {
    fn mount(dir: &'a Path) -> Self {
        let d = dir.display();
        sh(&format!(
            "mount --bind '{d}' '{d}' && mount -o remount,ro,bind '{d}'"
        ));
        ReadOnly(dir)
    }
}

impl Drop for ReadOnly<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

/// Istio's `Cleanup` takes our entry out of the config first and stops there on error. An
/// uninstall whose config edit fails must keep the binaries and the kubeconfig (a chain still
/// naming istio-cni without its binary fails every pod's ADD) and exit non-zero. Before: the
/// binaries and the kubeconfig removed, the conflist still naming istio-cni, exit 0.
#[test]
fn an_uninstall_that_cannot_edit_the_config_keeps_the_plugin_and_fails() {
    testbed::require_root();
    let env = Env::new();
    let (conflist, d) = env.ready_on_calico(T);
    assert!(names_istio_cni(&conflist));
    let ro = ReadOnly::mount(&env.net);
    let (st, log) = d.stop().unwrap();
    drop(ro);
    assert!(!st.success(), "exit status {st:?}\n{log}");
    assert!(log.contains("uninstall is incomplete"), "{log}");
    assert!(names_istio_cni(&conflist), "{log}");
    for b in ["istio-cni", "istio-nftables"] {
        assert!(env.bin.join(b).is_file(), "{b} removed\n{log}");
    }
    assert!(env.kubeconfig().is_file(), "kubeconfig removed\n{log}");
    println!(
        "summary: uninstall-config-read-only: exit {:?}, binaries and kubeconfig kept",
        st.code()
    );
}

/// A FIFO named like a CNI config (and a sparse file over the read bound) among the configs:
/// never opened blocking nor read whole. Before: the install pass blocked on the FIFO, with it
/// `/healthz` and the signal handling (SIGTERM ignored, no uninstall).
#[test]
fn a_fifo_among_the_configs_holds_up_nothing() {
    testbed::require_root();
    let env = Env::new();
    let (conflist, d) = env.ready_on_calico(T);
    let fifo = env.net.join("05-x.conflist");
    sh(&format!("mkfifo '{}'", fifo.display()));
    let sparse = fs::File::create(env.net.join("06-sparse.conflist")).unwrap();
    sparse.set_len((64 << 20) + 1).unwrap(); // node_fs::MAX_CONF_BYTES + 1
    // The primary rewrites its file without our entry: a pass runs and must repair it.
    atomic_write(&conflist, &calico());
    assert!(wait_until(T, || names_istio_cni(&conflist)), "{}", d.log());
    assert_eq!(d.get("/healthz").0, 200, "{}", d.log());
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert!(!names_istio_cni(&conflist), "{log}");
    assert!(log.contains("not a regular file"), "{log}");
    println!("summary: fifo-in-net-dir: repaired, healthz 200, uninstalled on SIGTERM");
}

/// A daemon on a net dir holding the config `name` with `bytes` and calico's list after it:
/// istio-cni goes into `name` only (then `ready_check` runs, given the env and the file), and
/// the uninstall puts `bytes` back.
fn chained_into_first_and_restored(name: &OsStr, bytes: &[u8], ready_check: impl Fn(&Env, &Path)) {
    let env = Env::new();
    let first = env.net.join(name);
    fs::write(&first, bytes).unwrap();
    let later = env.net.join("10-calico.conflist");
    fs::write(&later, calico()).unwrap();
    let d = env.start(&[]);
    d.wait_ready(T);
    assert!(names_istio_cni(&first), "{}", d.log());
    assert!(!names_istio_cni(&later), "{}", d.log());
    ready_check(&env, &first);
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert_eq!(fs::read(&first).unwrap(), bytes, "{log}");
}

/// A primary config with a Latin-1 byte in a string (or a lone surrogate escape) is loaded by
/// the runtime (libcni: Go's `encoding/json` reads both as U+FFFD), so it is the primary we
/// chain into. Before: skipped as invalid, istio-cni chained into a later file the runtime
/// does not use, and the daemon said ready (pods started without the plugin).
#[test]
fn a_primary_go_reads_as_valid_is_the_one_chained_into() {
    let cases: [&[u8]; 2] = [
        b"{\"cniVersion\":\"0.4.0\",\"name\":\"net\",\"plugins\":[{\"type\":\"bridge\",\"comment\":\"caf\xe9\"}]}",
        br#"{"cniVersion":"0.4.0","name":"x\ud800","plugins":[{"type":"bridge"}]}"#,
    ];
    for primary in cases {
        chained_into_first_and_restored(OsStr::new("05-primary.conflist"), primary, |_, first| {
            let v = read_json(first).unwrap();
            assert_eq!(types(&v), ["bridge", "istio-cni"], "{v}");
        });
    }
    println!("summary: go-lenient-primary: 2 of 2 chained into the runtime's primary");
}

/// A plugin binary that loses its exec bit (every ADD would fail: `Permission denied`) is
/// repaired like a changed one. Before: a chmod was ignored as a non-change, the binary stayed
/// 0644 until some other event, and readiness said "binaries" were fine.
#[test]
fn a_binary_that_loses_its_exec_bit_is_repaired() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let (_, d) = env.ready_on_calico(T);
    let plugin = env.bin.join("istio-cni");
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    fs::set_permissions(&plugin, fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        wait_until(T, || mode(&plugin) == 0o755),
        "mode {:o}\n{}",
        mode(&plugin),
        d.log()
    );
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    println!("summary: exec-bit-lost: repaired to 0755");
}

/// A primary whose file name is not UTF-8 (`03-\xff\xfe.conflist`): the runtime loads it like
/// any other (Go file names are bytes), so it is chained into and restored byte for byte.
/// Before: its lossy name was written and stamped, the pass found it "kept changing" and was
/// retried for ever; nothing chained, never ready.
#[test]
fn a_primary_named_with_non_utf8_bytes_is_chained_into() {
    use std::os::unix::ffi::OsStrExt;
    let name = OsStr::from_bytes(b"03-\xff\xfe.conflist");
    chained_into_first_and_restored(name, &calico(), |env, _| {
        assert_eq!(fs::read_dir(&env.net).unwrap().count(), 2);
    });
    println!("summary: non-utf8-config-name: chained into and restored");
}

/// Standalone mode pointed at the primary's own file (`CNI_CONF_NAME=10-calico.conflist`):
/// the primary is never overwritten and the daemon is not ready. Before: the primary replaced
/// by a one-plugin body the runtime refuses, "ready", and after SIGTERM an empty net dir.
#[test]
fn standalone_mode_never_overwrites_the_primary() {
    let env = Env::new();
    let primary = env.net.join("10-calico.conflist");
    fs::write(&primary, calico()).unwrap();
    let d = env.start(&[
        ("CHAINED_CNI_PLUGIN", "false"),
        ("CNI_CONF_NAME", "10-calico.conflist"),
    ]);
    assert!(
        d.wait_log("standalone config is one plugin", T),
        "{}",
        d.log()
    );
    assert!(!d.ready());
    assert_eq!(fs::read(&primary).unwrap(), calico(), "{}", d.log());
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert_eq!(fs::read(&primary).unwrap(), calico(), "{log}");
    println!("summary: standalone-on-primary: primary kept byte for byte, not ready");
}

/// A `.conf` primary converted to a `.conflist` (Istio's rename) where a `.conflist` of the
/// same stem already is: the uninstall brings both files back byte for byte. Before: the
/// sibling `.conflist` was renamed over and gone for good.
#[test]
fn a_conflist_the_conversion_renamed_over_comes_back_on_uninstall() {
    let env = Env::new();
    let mut single =
        serde_json::from_slice::<serde_json::Value>(&calico()).unwrap()["plugins"][0].clone();
    single["cniVersion"] = "0.3.1".into();
    single["name"] = "k8s-pod-network".into();
    let conf_bytes = serde_json::to_vec_pretty(&single).unwrap();
    let conf = env.net.join("05-bridge.conf");
    fs::write(&conf, &conf_bytes).unwrap();
    let sibling = env.net.join("05-bridge.conflist");
    let sibling_bytes = br#"{"cniVersion":"0.3.1","name":"other","plugins":[{"type":"loopback"}]}"#;
    fs::write(&sibling, sibling_bytes).unwrap();
    let d = env.start(&[]);
    d.wait_ready(T);
    assert!(!conf.exists() && names_istio_cni(&sibling), "{}", d.log());
    // The primary writes its .conf again: converted again, over our own earlier list.
    atomic_write(&conf, &conf_bytes);
    assert!(
        wait_until(T, || !conf.exists() && names_istio_cni(&sibling)),
        "{}",
        d.log()
    );
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert_eq!(fs::read(&conf).unwrap(), conf_bytes, "{log}");
    assert_eq!(fs::read(&sibling).unwrap(), sibling_bytes, "{log}");
    println!(
        "summary: conf-conversion-sibling: both files back byte for byte, also after a second conversion"
    );
}
