//! Byte-for-byte parity with Istio's iptables capture goldens (../shared/golden/iptables).

use capture::*;
use serde_json::Value;
use std::path::PathBuf;

fn shared() -> PathBuf {
    golden::golden_dir()
}

/// A case's configuration, through the shared loader.
fn config_from_effective(e: &Value) -> (Config, Facts) {
    (golden::config_from_effective(e), Facts::default())
}

#[test]
fn payloads_match_istio_goldens_byte_for_byte() {
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(shared().join("index.json")).unwrap())
            .unwrap();
    let mut checked = 0;
    let mut failures = Vec::new();
    for case in index.as_array().unwrap() {
        let golden = case["golden"].as_str().unwrap();
        if !(golden.starts_with("iptables/") && golden.matches('/').count() == 1) {
            continue;
        }
        let (cfg, facts) = config_from_effective(&case["effective_config"]);
        let plan = Plan::build(&cfg, &facts).unwrap();
        let text = std::fs::read_to_string(shared().join(golden)).unwrap();
        let body: Vec<&str> = text
            .lines()
            .filter(|l| *l != "iptables-save" && *l != "ip6tables-save")
            .collect();
        let expected = body.join("\n") + "\n";
        let actual = iptables_legacy::render_payload(&plan, false)
            + &iptables_legacy::render_payload(&plan, true);
        if expected.trim() != actual.trim() {
            failures.push(format!(
                "== {golden}\n--- expected\n{expected}--- actual\n{actual}"
            ));
        }
        checked += 1;
    }
    assert_eq!(checked, 27, "every iptables capture golden is checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
