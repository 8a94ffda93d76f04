//! Istio's install-cni fixtures (`../shared/golden/install-cni`: cni/pkg/install/testdata and
//! cni/test/testdata) and how our install is compared with them: JSON semantically; in the
//! istio-cni entry, Istio's ambient-only fields must be absent or off, ours are extra.

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// The fixtures' directory: `../shared` beside the checkout, wherever the checkout is.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden/install-cni")
}

/// Fields of Istio's entry we do not write; off/empty in every fixture.
const ISTIO_ONLY: &[&str] = &["ipam", "dns"];
/// Fields we add.
const OURS_ONLY: &[&str] = &[
    "redirect_backend",
    "pod_lookup_attempts",
    "pod_lookup_interval_ms",
    "pod_lookup_timeout_ms",
    "pod_lookup_deadline_ms",
    "ambient_handoff_timeout_ms",
    "system_namespace",
];

fn off(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::Number(_) => false,
    }
}

/// Our istio-cni entry against Istio's.
pub fn assert_entry_matches(ours: &Value, istio: &Value) {
    let (o, i) = (ours.as_object().unwrap(), istio.as_object().unwrap());
    for (k, iv) in i {
        match o.get(k) {
            Some(ov) if ov == iv => {}
            // Istio writes `null` for an empty namespace list.
            Some(ov) if off(ov) && off(iv) => {}
            None if ISTIO_ONLY.contains(&k.as_str()) && off(iv) => {}
            other => panic!("field {k}: ours {other:?}, Istio {iv}"),
        }
    }
    for k in o.keys() {
        assert!(
            i.contains_key(k) || OURS_ONLY.contains(&k.as_str()),
            "unexpected field {k}"
        );
    }
}

/// A chained conflist against Istio's expected file: everything but our entry must be equal.
pub fn assert_conflist_matches(ours: &Value, istio: &Value) {
    let strip = |v: &Value| {
        let mut v = v.clone();
        v["plugins"] = Value::Array(
            v["plugins"].as_array().unwrap()[..v["plugins"].as_array().unwrap().len() - 1].to_vec(),
        );
        v
    };
    assert_eq!(strip(ours), strip(istio), "primary part differs");
    let last = |v: &Value| v["plugins"].as_array().unwrap().last().unwrap().clone();
    assert_entry_matches(&last(ours), &last(istio));
    assert_eq!(
        ours["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "istio-cni")
            .count(),
        1
    );
}

pub fn golden(p: &str) -> Vec<u8> {
    fs::read(golden_dir().join(p)).unwrap()
}

pub fn golden_json(p: &str) -> Value {
    serde_json::from_slice(&golden(p)).unwrap()
}

/// Plugin types of a conflist value, in order.
pub fn types(v: &Value) -> Vec<String> {
    v["plugins"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| p["type"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}
