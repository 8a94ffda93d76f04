//! `ISTIO_OWNED_CNI_CONFIG` (Istio #55968): the real daemon keeps the primary's config with
//! istio-cni in a file of its own that sorts first, follows the primary's changes into it,
//! never writes the primary's file, removes its file on uninstall; falls back to chaining when
//! another file sorts first; with the option off, removes a copy an earlier daemon left.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

const T: Duration = Duration::from_secs(15);
const OWNED: &str = "02-istio-cni.conflist";

fn types(p: &Path) -> Vec<String> {
    read_json(p)
        .map(|v| testbed::install_fixtures::types(&v))
        .unwrap_or_default()
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn the_owned_file_copies_the_primary_follows_it_and_goes_on_uninstall() {
    let env = Env::new();
    let primary = env.net.join("10-calico.conflist");
    fs::write(&primary, calico()).unwrap();
    let before = snapshot(&env.net);
    let d = env.start(&[("ISTIO_OWNED_CNI_CONFIG", "true")]);
    d.wait_ready(T);
    let owned = env.net.join(OWNED);
    assert_eq!(
        types(&owned),
        ["calico", "portmap", "istio-cni"],
        "{}",
        d.log()
    );
    assert_eq!(mode(&owned), 0o600);
    // The primary's own file is never written.
    assert_eq!(fs::read(&primary).unwrap(), calico());
    let copy = read_json(&owned).unwrap();
    let calico_json: serde_json::Value = serde_json::from_slice(&calico()).unwrap();
    assert_eq!(copy["plugins"][0], calico_json["plugins"][0]);
    assert_eq!(copy["name"], calico_json["name"]);

    // The primary rewrites its file (a changed plugin setting): the copy follows.
    let mut changed = calico_json.clone();
    changed["plugins"][0]["test_marker"] = 1400.into();
    atomic_write(&primary, &serde_json::to_vec_pretty(&changed).unwrap());
    assert!(
        wait_until(T, || read_json(&owned)
            .is_some_and(|v| v["plugins"][0]["test_marker"] == 1400)),
        "the copy did not follow the primary\n{}",
        d.log()
    );
    // Somebody takes istio-cni out of our file, or replaces it by a link: ours again.
    let mut stripped = read_json(&owned).unwrap();
    stripped["plugins"].as_array_mut().unwrap().pop();
    atomic_write(&owned, &serde_json::to_vec_pretty(&stripped).unwrap());
    assert!(wait_until(T, || types(&owned).last().map(String::as_str)
        == Some("istio-cni")));
    let decoy = env.tmp.path().join("decoy.conflist");
    fs::write(&decoy, fs::read(&owned).unwrap()).unwrap();
    let tmp = env.net.join("link.tmp");
    std::os::unix::fs::symlink(&decoy, &tmp).unwrap();
    fs::rename(&tmp, &owned).unwrap();
    assert!(
        wait_until(T, || fs::symlink_metadata(&owned)
            .is_ok_and(|m| m.file_type().is_file())),
        "the link stayed\n{}",
        d.log()
    );
    assert_eq!(fs::read(&decoy).unwrap(), fs::read(&owned).unwrap());

    // Uninstall (no DaemonSet): our file goes, the primary's is as the primary left it.
    atomic_write(&primary, &calico());
    assert!(
        wait_until(T, || read_json(&owned)
            .is_some_and(|v| v["plugins"][0].get("test_marker").is_none())),
        "{}",
        d.log()
    );
    let (st, log) = d.stop().unwrap();
    assert!(st.success(), "{log}");
    assert!(
        log.contains(&format!("removed {}", owned.display())),
        "{log}"
    );
    assert_eq!(snapshot(&env.net), before, "{log}");
    assert!(snapshot(&env.bin).is_empty());
}

/// A file sorting before ours (Multus' `00-multus.conf`) is what the runtime reads: ours would
/// never be; the daemon chains into the primary instead, and says why.
#[test]
fn a_config_sorting_first_falls_back_to_chaining() {
    let env = Env::new();
    let primary = env.net.join("10-calico.conflist");
    fs::write(&primary, calico()).unwrap();
    let d = env.start(&[
        ("ISTIO_OWNED_CNI_CONFIG", "true"),
        ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "20-istio-cni.conflist"),
    ]);
    d.wait_ready(T);
    assert!(
        d.wait_log("sorts before ISTIO_OWNED_CNI_CONFIG_FILENAME", T),
        "{}",
        d.log()
    );
    assert_eq!(
        types(&primary).last().map(String::as_str),
        Some("istio-cni")
    );
    assert!(!env.net.join("20-istio-cni.conflist").exists());
}

/// Turning the option on and off across daemons (a rollout keeps the files: SIGKILL here):
/// on, the copy appears and the primary's file is not written; off again, the copy is removed
/// (it would shadow the primary with a stale copy) and istio-cni is chained into the primary.
#[test]
fn switching_the_option_off_removes_the_copy() {
    let env = Env::new();
    let primary = env.net.join("10-calico.conflist");
    fs::write(&primary, calico()).unwrap();
    let mut on = env.start(&[("ISTIO_OWNED_CNI_CONFIG", "true")]);
    on.wait_ready(T);
    assert!(env.net.join(OWNED).is_file());
    on.kill().unwrap();
    let off = env.start(&[("ISTIO_OWNED_CNI_CONFIG", "false")]);
    off.wait_ready(T);
    assert!(!env.net.join(OWNED).exists(), "{}", off.log());
    assert_eq!(
        types(&primary).last().map(String::as_str),
        Some("istio-cni")
    );
    assert!(
        off.log().contains("ISTIO_OWNED_CNI_CONFIG is off"),
        "{}",
        off.log()
    );
    let (st, log) = off.stop().unwrap();
    assert!(st.success(), "{log}");
    assert_eq!(fs::read(&primary).unwrap(), calico(), "{log}");
}

#[test]
fn bad_file_names_are_refused_naming_the_variable() {
    for (name, conf_name) in [
        ("sub/02-x.conflist", ""),
        ("02-x.json", ""),
        ("10-calico.conflist", "10-calico.conflist"),
        ("10-calico.conf", "10-calico.conflist"),
    ] {
        let env = Env::new();
        let out = env
            .command()
            .env("ISTIO_OWNED_CNI_CONFIG", "true")
            .env("ISTIO_OWNED_CNI_CONFIG_FILENAME", name)
            .env("CNI_CONF_NAME", conf_name)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("ISTIO_OWNED_CNI_CONFIG_FILENAME"),
            "{name}: {err}"
        );
    }
    let out = std::process::Command::new(bin())
        .arg("--list-env")
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    for v in ["ISTIO_OWNED_CNI_CONFIG", "ISTIO_OWNED_CNI_CONFIG_FILENAME"] {
        assert!(
            list.lines().any(|l| l == v),
            "{v} not in --list-env:\n{list}"
        );
    }
}

/// The daemon's default is on (the harness pins Istio's false for the other tests).
#[test]
fn on_by_default() {
    let env = Env::new();
    fs::write(env.net.join("10-calico.conflist"), calico()).unwrap();
    let mut c = env.command();
    c.env_remove("ISTIO_OWNED_CNI_CONFIG");
    let d = spawn(c);
    d.wait_ready(T);
    assert_eq!(
        types(&env.net.join(OWNED)).last().map(String::as_str),
        Some("istio-cni"),
        "{}",
        d.log()
    );
    assert_eq!(
        fs::read(env.net.join("10-calico.conflist")).unwrap(),
        calico()
    );
}
