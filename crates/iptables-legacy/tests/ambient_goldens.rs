//! Byte-for-byte parity with Istio's 14 ambient iptables goldens
//! (../shared/golden/iptables/cni-ambient): the in-pod rules and the host probe rule.

#[test]
fn ambient_payloads_match_istio_goldens_byte_for_byte() {
    let cases = golden::ambient_cases("iptables");
    assert_eq!(cases.len(), 14, "every iptables ambient golden is checked");
    let mut failures = Vec::new();
    for case in &cases {
        let text = std::fs::read_to_string(&case.golden).unwrap();
        let body: Vec<&str> = text
            .lines()
            .filter(|l| *l != "iptables-save" && *l != "ip6tables-save")
            .collect();
        let expected = body.join("\n") + "\n";
        let actual = iptables_legacy::render_payload(&case.plan, false)
            + &iptables_legacy::render_payload(&case.plan, true);
        if expected != actual {
            failures.push(format!(
                "== {}\n--- expected\n{expected}--- actual\n{actual}",
                case.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 14 differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
