//! Golden parity with Istio's CNI plugin tests (cni/pkg/plugin/testdata, istio-reference §3):
//! the pods those tests describe go through the plugin's own pod → Config → Plan path and the
//! iptables-legacy rendering must equal Istio's payload byte for byte.

use capture::{Facts, Plan};
use k8s_openapi::api::core::v1::Pod;
use pod_policy::Decision;
use pod_policy::sidecar::decide;
use redirect::Backend;
use serde_json::{Value, json};
use std::path::PathBuf;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden")
}

/// The pod of `TestIPTablesRuleGeneration` (containers test, istio-proxy, istio-validate) with
/// the case's annotations, istio-proxy env and securityContext.
fn pod_for(case: &Value) -> Pod {
    let p = &case["pod"];
    let env: Vec<Value> = p["istio-proxy env"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let mut sc = serde_json::Map::new();
    if let Some(u) = p["istio-proxy runAsUser"].as_i64() {
        sc.insert("runAsUser".into(), u.into());
    }
    if let Some(g) = p["istio-proxy runAsGroup"].as_i64() {
        sc.insert("runAsGroup".into(), g.into());
    }
    let containers: Vec<Value> = p["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| {
            if name == "istio-proxy" {
                json!({"name": name, "args": ["proxy", "sidecar"], "env": env, "securityContext": sc})
            } else {
                json!({"name": name})
            }
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "test", "namespace": "default", "annotations": p["annotations"]},
        "spec": {"containers": containers},
    }))
    .unwrap()
}

fn plan_for(pod: &Pod) -> Plan {
    let Decision::Sidecar(pc) = decide(pod).unwrap() else {
        panic!("the golden pods are sidecar pods")
    };
    // The goldens come from an IPv4-only pod.
    let facts = Facts {
        local_addrs: vec!["10.244.0.5".parse().unwrap()],
        ..Facts::default()
    };
    Plan::build(&pc.config, &facts).unwrap()
}

fn expected(golden: &str) -> String {
    let text = std::fs::read_to_string(golden_dir().join(golden)).unwrap();
    text.lines()
        .filter(|l| *l != "iptables-save" && *l != "ip6tables-save")
        .map(|l| format!("{l}\n"))
        .collect()
}

fn cases() -> Vec<(String, Pod)> {
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(golden_dir().join("index.json")).unwrap())
            .unwrap();
    let mut out = Vec::new();
    for case in index.as_array().unwrap() {
        let golden = case["golden"].as_str().unwrap();
        if !golden.starts_with("iptables/cni-plugin/") || case["pod"].is_null() {
            continue; // status-ports: orphaned upstream, stale format
        }
        out.push((golden.to_string(), pod_for(case)));
        // Istio's custom-uid-zero case: runAsUser 0 falls back to 1337 and reuses basic.
        if golden.ends_with("/basic.txt.golden") {
            let mut zero = case.clone();
            zero["pod"]["istio-proxy runAsUser"] = 0.into();
            zero["pod"]["istio-proxy runAsGroup"] = 0.into();
            out.push((golden.to_string(), pod_for(&zero)));
        }
    }
    out
}

#[test]
fn legacy_payloads_equal_istios_cni_goldens() {
    let cases = cases();
    assert_eq!(cases.len(), 9, "8 goldens + custom-uid-zero");
    let mut failures = Vec::new();
    for (golden, pod) in &cases {
        let plan = plan_for(pod);
        let actual = iptables_legacy::render_payload(&plan, false)
            + &iptables_legacy::render_payload(&plan, true);
        let expected = expected(golden);
        if actual != expected {
            failures.push(format!(
                "== {golden}\n--- expected\n{expected}--- actual\n{actual}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn nft_dry_run_renders_the_same_plans() {
    for (golden, pod) in cases() {
        let plan = plan_for(&pod);
        let text = redirect::dry_run(&plan, Backend::Nft);
        assert!(
            text.contains("table inet istio-proxy-nat"),
            "{golden}: no nat table in\n{text}"
        );
        let legacy = redirect::dry_run(&plan, Backend::IptablesLegacy);
        // Every port, id, zone and address of the iptables rules appears in the nft rules.
        for value in legacy_values(&legacy) {
            assert!(
                text.contains(&value),
                "{golden}: {value} of the iptables rules is missing from\n{text}"
            );
        }
        assert_eq!(
            legacy.contains("-j TPROXY"),
            text.contains("tproxy"),
            "{golden}: TPROXY in one rendering only\n{text}"
        );
        assert_eq!(
            legacy.contains("CT --zone"),
            text.contains("ct zone"),
            "{golden}: DNS conntrack zones in one rendering only\n{text}"
        );
    }
}

/// The values of `--dport(s)`, `--sport`, `--to-port(s)`, `--uid-owner`, `--gid-owner`,
/// `--zone`, `-d` and `-s` in an iptables payload (`/32` dropped: nft prints host addresses bare).
fn legacy_values(payload: &str) -> Vec<String> {
    const FLAGS: [&str; 10] = [
        "--dport",
        "--dports",
        "--sport",
        "--to-ports",
        "--to-port",
        "--uid-owner",
        "--gid-owner",
        "--zone",
        "-d",
        "-s",
    ];
    let mut out = Vec::new();
    for line in payload.lines().filter(|l| l.starts_with("-A ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            if FLAGS.contains(&pair[0]) {
                for v in pair[1].split(',') {
                    let v = v.trim_end_matches("/32").to_string();
                    if !out.contains(&v) {
                        out.push(v);
                    }
                }
            }
        }
    }
    out
}
