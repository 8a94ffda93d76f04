//! The 0.1.0/0.2.0 result shape (`ip4`/`ip6`, each with its own `routes`) and libcni's two
//! converters to and from the 0.3.x/0.4.0 shape (`types040.convertFrom02x`, `convertTo02x`),
//! on the JSON so that a result is read and printed exactly as libcni would.

use super::{CniError, ErrorCode};
use serde_json::{Map, Value, json};

/// 0.1.0/0.2.0 → 0.4.0 shape: `ip4` then `ip6` become `ips` entries with their `version`,
/// their routes go to the top-level `routes`; `dns` is kept; there are no interfaces.
pub(super) fn up(from: &Map<String, Value>) -> Map<String, Value> {
    let mut ips = Vec::new();
    let mut routes = Vec::new();
    for (key, version) in [("ip4", "4"), ("ip6", "6")] {
        let Some(cfg) = from.get(key).and_then(Value::as_object) else {
            continue;
        };
        let mut ip = Map::new();
        ip.insert("version".into(), version.into());
        copy(cfg, "ip", &mut ip, "address");
        copy(cfg, "gateway", &mut ip, "gateway");
        ips.push(Value::Object(ip));
        routes.extend(items(cfg.get("routes")).map(route));
    }
    let mut out = Map::new();
    if !ips.is_empty() {
        out.insert("ips".into(), Value::Array(ips));
    }
    if !routes.is_empty() {
        out.insert("routes".into(), Value::Array(routes));
    }
    out.insert("dns".into(), dns(from));
    out
}

/// 0.3.x/0.4.0 shape → 0.1.0/0.2.0: the first address of each family (0.2.0 has room for one
/// of each), every route under the family of its destination when that family has an address.
/// Without any address there is no 0.2.0 result (libcni: "cannot convert").
pub(super) fn down(
    from: &Map<String, Value>,
    target: &str,
) -> Result<Map<String, Value>, CniError> {
    let mut out = Map::new();
    for ip in items(from.get("ips")) {
        let key = match ip.get("version").and_then(Value::as_str) {
            Some("4") => "ip4",
            Some("6") => "ip6",
            _ => continue,
        };
        if out.contains_key(key) {
            continue;
        }
        let mut cfg = Map::new();
        copy(ip, "address", &mut cfg, "ip");
        copy(ip, "gateway", &mut cfg, "gateway");
        out.insert(key.into(), Value::Object(cfg));
    }
    for r in items(from.get("routes")) {
        let v6 = r
            .get("dst")
            .and_then(Value::as_str)
            .is_some_and(|d| d.contains(':'));
        let family = if v6 { "ip6" } else { "ip4" };
        if let Some(Value::Object(cfg)) = out.get_mut(family) {
            let routes = cfg.entry("routes").or_insert_with(|| json!([]));
            if let Value::Array(list) = routes {
                list.push(route(r));
            }
        }
    }
    require_address(&out, target)?;
    out.insert("dns".into(), dns(from));
    Ok(out)
}

/// A 0.1.0/0.2.0 result must carry an address (`ip4` or `ip6`); what libcni's converter
/// refuses to print is refused here, before any rule is programmed.
pub(super) fn require_address(result: &Map<String, Value>, target: &str) -> Result<(), CniError> {
    if result.contains_key("ip4") || result.contains_key("ip6") {
        return Ok(());
    }
    Err(no_address(target))
}

pub(super) fn no_address(target: &str) -> CniError {
    CniError::new(
        ErrorCode::IncompatibleVersion,
        format!(
            "cannot give a cniVersion {target:?} result: it needs an address (ip4 or ip6) and the chain's prevResult gives none"
        ),
    )
}

/// The objects of an array field (nothing when absent).
fn items(v: Option<&Value>) -> impl Iterator<Item = &Map<String, Value>> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

/// A route as both shapes know it: `dst` and `gw` (1.1.0's extra fields have no place).
fn route(r: &Map<String, Value>) -> Value {
    let mut out = Map::new();
    copy(r, "dst", &mut out, "dst");
    copy(r, "gw", &mut out, "gw");
    Value::Object(out)
}

/// Copies a field, leaving out an empty address (Go reads `""` as none and omits it).
fn copy(from: &Map<String, Value>, key: &str, to: &mut Map<String, Value>, as_key: &str) {
    match from.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(v) => {
            to.insert(as_key.into(), v.clone());
        }
    }
}

/// `dns` is a struct in libcni: always printed, `{}` when empty.
fn dns(from: &Map<String, Value>) -> Value {
    from.get("dns").cloned().unwrap_or_else(|| json!({}))
}

#[cfg(test)]
mod tests {
    use super::super::{ErrorCode, convert_result, result_ips};
    use serde_json::{Value, json};

    /// What bridge + host-local print at 0.2.0 (a dual-stack pod).
    fn bridge_020() -> Value {
        json!({
            "cniVersion": "0.2.0",
            "ip4": {"ip": "10.88.0.5/16", "gateway": "10.88.0.1",
                    "routes": [{"dst": "0.0.0.0/0", "gw": "10.88.0.1"}]},
            "ip6": {"ip": "fd00::5/64", "routes": [{"dst": "::/0"}]},
            "dns": {"nameservers": ["10.96.0.10"]}
        })
    }

    #[test]
    fn a_020_result_passes_through_a_020_chain_unchanged() {
        for v in ["0.2.0", "0.1.0"] {
            let mut expected = bridge_020();
            expected["cniVersion"] = v.into();
            assert_eq!(convert_result(Some(&bridge_020()), v).unwrap(), expected);
        }
        // No cniVersion in the prevResult: read in the configuration's version, as libcni does.
        let mut bare = bridge_020();
        bare.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(
            convert_result(Some(&bare), "0.2.0").unwrap()["ip4"],
            bridge_020()["ip4"]
        );
    }

    #[test]
    fn a_020_result_converts_up_as_libcni_does() {
        let r = convert_result(Some(&bridge_020()), "0.4.0").unwrap();
        assert_eq!(
            r,
            json!({
                "cniVersion": "0.4.0",
                "ips": [
                    {"version": "4", "address": "10.88.0.5/16", "gateway": "10.88.0.1"},
                    {"version": "6", "address": "fd00::5/64"}
                ],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.88.0.1"}, {"dst": "::/0"}],
                "dns": {"nameservers": ["10.96.0.10"]}
            })
        );
        let r = convert_result(Some(&bridge_020()), "1.1.0").unwrap();
        assert_eq!(r["cniVersion"], "1.1.0");
        assert_eq!(r["ips"][1], json!({"address": "fd00::5/64"}));
        assert_eq!(r["routes"][0]["gw"], "10.88.0.1");
    }

    #[test]
    fn newer_results_convert_down_to_one_address_per_family() {
        let prev = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/p"}],
            "ips": [
                {"interface": 0, "address": "10.0.0.5/24", "gateway": "10.0.0.1"},
                {"interface": 0, "address": "10.0.0.6/24"},
                {"interface": 0, "address": "fd00::5/64", "gateway": ""}
            ],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "10.0.0.1", "mtu": 1400},
                {"dst": "::/0", "gw": "fd00::1"}
            ],
        });
        for v in ["0.2.0", "0.1.0"] {
            assert_eq!(
                convert_result(Some(&prev), v).unwrap(),
                json!({
                    "cniVersion": v,
                    "ip4": {"ip": "10.0.0.5/24", "gateway": "10.0.0.1",
                            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}]},
                    "ip6": {"ip": "fd00::5/64", "routes": [{"dst": "::/0", "gw": "fd00::1"}]},
                    "dns": {}
                })
            );
        }
        // A route whose family has no address has nowhere to go.
        let v4 = json!({"cniVersion": "0.3.1",
            "ips": [{"version": "4", "address": "10.0.0.5/24"}], "routes": [{"dst": "::/0"}]});
        let r = convert_result(Some(&v4), "0.2.0").unwrap();
        assert_eq!(r["ip4"], json!({"ip": "10.0.0.5/24"}), "{r}");
        assert!(r.get("ip6").is_none());
    }

    #[test]
    fn no_address_no_020_result() {
        for prev in [
            None,
            Some(json!({"cniVersion": "1.0.0", "ips": []})),
            Some(json!({"cniVersion": "0.2.0", "dns": {}})),
            // 0.2.0 has no `ips`: libcni reads none there either.
            Some(json!({"ips": [{"address": "10.0.0.5/24"}]})),
        ] {
            let e = convert_result(prev.as_ref(), "0.2.0").unwrap_err();
            assert_eq!(e.code, ErrorCode::IncompatibleVersion, "{prev:?}");
            assert!(e.msg.contains("ip4 or ip6"), "{e}");
        }
    }

    #[test]
    fn malformed_020_results_name_the_path() {
        for (bad, path) in [
            (json!({"ip4": {"gateway": "10.0.0.1"}}), "prevResult.ip4"),
            (json!({"ip4": {"ip": "10.0.0.5"}}), "prevResult.ip4.ip"),
            (
                json!({"ip6": {"ip": "fd00::5/64", "gateway": "x"}}),
                "prevResult.ip6.gateway",
            ),
            (
                json!({"ip4": {"ip": "10.0.0.5/24", "routes": [{"dst": "x"}]}}),
                "prevResult.ip4.routes[0].dst",
            ),
            (json!({"ip4": []}), "prevResult.ip4"),
        ] {
            let mut prev = bad.clone();
            prev["cniVersion"] = "0.2.0".into();
            let e = convert_result(Some(&prev), "0.2.0").unwrap_err();
            assert_eq!(e.code, ErrorCode::Decode, "{bad}");
            assert!(e.msg.contains(path), "{bad}: {e}");
        }
    }

    #[test]
    fn the_ambient_hand_off_reads_addresses_of_every_shape() {
        let ips = |r: &Value| {
            result_ips(r)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(ips(&bridge_020()), ["10.88.0.5", "fd00::5"]);
        let up = convert_result(Some(&bridge_020()), "1.0.0").unwrap();
        assert_eq!(ips(&up), ["10.88.0.5", "fd00::5"]);
        assert!(ips(&json!({"cniVersion": "0.2.0", "dns": {}})).is_empty());
    }
}
