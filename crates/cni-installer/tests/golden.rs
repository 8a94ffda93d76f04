//! Istio's install fixtures (cni/pkg/install/testdata, cni/test/testdata) through the pure
//! merge/standalone/kubeconfig code. JSON is compared semantically; in the istio-cni entry,
//! Istio's ambient-only fields must be absent or at their off value, ours are extra.

use cni_config::PluginSettings;
use cni_installer::discovery::{self, ConfFile, ConfPlan};
use cni_installer::kubeconfig::{self, Trust};
use kube::config::Kubeconfig;
use serde_json::Value;
use testbed::install_fixtures::{
    assert_conflist_matches, assert_entry_matches, golden, golden_json, types,
};

fn testdata_entry() -> Value {
    PluginSettings {
        plugin_log_level: "debug".into(),
        cni_agent_run_dir: "/path/to/kubeconfig".into(),
        pod_namespace: "my-namespace".into(),
        redirect_backend: "iptables-legacy".into(),
        ..Default::default()
    }
    .to_plugin_entry()
}

fn plan(name: &str, fixture: &str) -> ConfPlan {
    let files = vec![ConfFile {
        name: name.into(),
        content: golden(fixture),
    }];
    discovery::plan_chained(&files, None, &testdata_entry())
}

fn written(p: ConfPlan) -> Value {
    match p {
        ConfPlan::Write { content, .. } => content,
        other => panic!("expected a write, got {other:?}"),
    }
}

#[test]
fn bridge_conf_becomes_list() {
    let p = plan("10-bridge.conf", "testdata/bridge.conf");
    let ConfPlan::Write { rename_to, .. } = &p else {
        panic!()
    };
    assert_eq!(rename_to.as_deref(), Some("10-bridge.conflist"));
    assert_conflist_matches(&written(p), &golden_json("testdata/bridge.conf.golden"));
}

#[test]
fn list_gets_entry_appended() {
    assert_conflist_matches(
        &written(plan("10-list.conflist", "testdata/list.conflist")),
        &golden_json("testdata/list.conflist.golden"),
    );
}

#[test]
fn list_with_old_istio_entry_is_replaced() {
    let out = written(plan(
        "10-list.conflist",
        "testdata/list-with-istio.conflist",
    ));
    assert_conflist_matches(
        &out,
        &golden_json("testdata/list-with-istio.conflist.golden"),
    );
    // Removing our entry gives Istio's "no istio" list.
    let clean = discovery::remove_ours(&golden_json("testdata/list-with-istio.conflist")).unwrap();
    assert_eq!(clean, golden_json("testdata/list-no-istio.conflist"));
}

#[test]
fn invalid_lists_are_not_primaries() {
    for f in [
        "testdata/invalid-arr.conflist",
        "testdata/invalid-map.conflist",
    ] {
        assert!(
            matches!(plan("10-x.conflist", f), ConfPlan::Wait { .. }),
            "{f}"
        );
    }
}

#[test]
fn prefixed_type_is_not_ours() {
    // type "prefix-istio-cni" is some other plugin: chained into, not removed.
    let out = written(plan("10-p.conf", "testdata/istio-cni-prefixed.conf"));
    assert_eq!(types(&out), vec!["prefix-istio-cni", "istio-cni"]);
}

#[test]
fn standalone_matches_istio() {
    let entry = testdata_entry();
    let ours = discovery::standalone_conf(&entry);
    assert_entry_matches(&ours, &golden_json("testdata/istio-cni.conf"));
    let entry2 = PluginSettings {
        plugin_log_level: "debug".into(),
        cni_agent_run_dir: "/tmp".into(),
        exclude_namespaces: vec!["istio-system".into()],
        redirect_backend: "iptables-legacy".into(),
        ..Default::default()
    }
    .to_plugin_entry();
    assert_entry_matches(
        &discovery::standalone_conf(&entry2),
        &golden_json("test-testdata/expected/YYY-istio-cni.conf"),
    );
}

fn kc_json(kc: &Kubeconfig) -> Value {
    serde_json::to_value(kc).unwrap()
}

#[test]
fn kubeconfig_fixtures() {
    let ca = golden("testdata/kube-ca.crt");
    let token = "service_account_token_string";
    for (fixture, host, trust) in [
        (
            "testdata/kubeconfig-tls",
            "10.96.0.1",
            Trust::Ca(ca.clone()),
        ),
        (
            "testdata/kubeconfig-skip-tls",
            "10.96.0.1",
            Trust::SkipVerify,
        ),
        (
            "testdata/kubeconfig-newhost",
            "50.76.2.1",
            Trust::Ca(ca.clone()),
        ),
    ] {
        let ours = kubeconfig::build("https", host, 443, token, &trust).unwrap();
        // Through the YAML text, as the plugin will read it.
        let reparsed = Kubeconfig::from_yaml(&kubeconfig::to_yaml(&ours).unwrap()).unwrap();
        let istio = Kubeconfig::from_yaml(std::str::from_utf8(&golden(fixture)).unwrap()).unwrap();
        assert_eq!(kc_json(&reparsed), kc_json(&istio), "{fixture}");
    }
}
