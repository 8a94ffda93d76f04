//! CNI config discovery and merging: pure functions over a snapshot of the net dir, so every
//! rule (kubelet's file choice, Istio's `.conf` → `.conflist` conversion, remove-then-append)
//! is unit-testable without a filesystem.

use serde_json::{Map, Value};

/// Name/cniVersion Istio gives a `.conf` it turns into a list (kept for output parity).
pub const CONVERTED_LIST_NAME: &str = "k8s-pod-network";
pub const CONVERTED_LIST_VERSION: &str = "0.3.1";
/// cniVersion of the standalone file (Istio's).
pub const STANDALONE_VERSION: &str = "0.3.1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Conf,
    ConfList,
}

/// Only `.conf` and `.conflist` count, as in Istio (kubelet also reads `.json`; Istio never
/// patches those, and neither do we).
pub fn format_of(name: &str) -> Option<Format> {
    if name.ends_with(".conflist") {
        Some(Format::ConfList)
    } else if name.ends_with(".conf") {
        Some(Format::Conf)
    } else {
        None
    }
}

/// Why a file is not a CNI config kubelet would use (libcni's checks), naming the field.
#[derive(Debug, thiserror::Error)]
pub enum InvalidConf {
    #[error("not a .conf or .conflist file")]
    NotConfName,
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("not a JSON object")]
    NotObject,
    #[error("'name' is not a string")]
    NameNotString,
    #[error("no 'name'")]
    NoName,
    #[error("no 'plugins' key")]
    NoPlugins,
    #[error("'plugins' is not a list")]
    PluginsNotList,
    #[error("no plugins in list")]
    EmptyPlugins,
    #[error("a plugin has no 'type'")]
    PluginWithoutType,
    #[error("no 'type'")]
    NoType,
}

/// Parses `bytes` the way libcni's `ConfFromBytes` / `ConfListFromBytes` accept them (the
/// checks kubelet applies before it uses a file): a list needs a string `name` and a non-empty
/// `plugins` array whose entries all have a `type`; a single conf needs a `type`.
pub fn parse_valid(name: &str, bytes: &[u8]) -> Result<Value, InvalidConf> {
    let format = format_of(name).ok_or(InvalidConf::NotConfName)?;
    let v: Value = crate::gojson::parse(bytes)?;
    let obj = v.as_object().ok_or(InvalidConf::NotObject)?;
    match format {
        Format::ConfList => {
            match obj.get("name") {
                Some(Value::String(_)) => {}
                Some(_) => return Err(InvalidConf::NameNotString),
                None => return Err(InvalidConf::NoName),
            }
            let plugins = obj
                .get("plugins")
                .ok_or(InvalidConf::NoPlugins)?
                .as_array()
                .ok_or(InvalidConf::PluginsNotList)?;
            if plugins.is_empty() {
                return Err(InvalidConf::EmptyPlugins);
            }
            if plugins.iter().any(|p| plugin_type(p).is_none()) {
                return Err(InvalidConf::PluginWithoutType);
            }
        }
        Format::Conf => {
            if plugin_type(&v).is_none() {
                return Err(InvalidConf::NoType);
            }
        }
    }
    Ok(v)
}

fn plugin_type(v: &Value) -> Option<&str> {
    v.get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
}

fn is_ours(v: &Value) -> bool {
    plugin_type(v) == Some(cni_config::PLUGIN_TYPE)
}

/// Plugin types of a parsed config in order (for logs and the storm culprit hint).
pub fn plugin_types(v: &Value) -> Vec<String> {
    match v.get("plugins").and_then(Value::as_array) {
        Some(list) => list
            .iter()
            .filter_map(plugin_type)
            .map(String::from)
            .collect(),
        None => plugin_type(v).map(String::from).into_iter().collect(),
    }
}

/// One file of the net dir.
#[derive(Clone, Debug)]
pub struct ConfFile {
    pub name: String,
    pub content: Vec<u8>,
}

/// kubelet's choice: lexicographically first valid file. Our own standalone file never counts
/// as a primary (chaining into it would put istio-cni into the list twice).
pub fn select_primary(files: &[ConfFile]) -> Option<(&ConfFile, Value)> {
    let mut sorted: Vec<&ConfFile> = files
        .iter()
        .filter(|f| format_of(&f.name).is_some())
        .collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted.into_iter().find_map(|f| {
        let v = parse_valid(&f.name, &f.content).ok()?;
        if format_of(&f.name) == Some(Format::Conf) && is_ours(&v) {
            return None;
        }
        Some((f, v))
    })
}

/// `CNI_CONF_NAME`, tolerating the primary's own `.conf` ⇄ `.conflist` rename (Istio does).
pub fn find_named<'a>(files: &'a [ConfFile], name: &str) -> Option<&'a ConfFile> {
    let alt = if let Some(stem) = name.strip_suffix(".conflist") {
        format!("{stem}.conf")
    } else {
        format!("{name}list")
    };
    files
        .iter()
        .find(|f| f.name == name)
        .or_else(|| files.iter().find(|f| f.name == alt))
}

/// Why our entry cannot be chained into the primary config.
#[derive(Debug, thiserror::Error)]
pub enum UnmergeablePrimary {
    #[error("primary config is not a JSON object")]
    NotObject,
    #[error("primary config has neither 'type' nor a 'plugins' list")]
    NeitherTypeNorPlugins,
}

/// The primary config with our entry: a single `.conf` becomes a list (Istio's shape); a list
/// loses any istio-cni entries (duplicates after a reboot, #27771) and gets ours appended.
/// Neither the primary's plugins nor their order change.
pub fn merge_chained(existing: &Value, entry: &Value) -> Result<Value, UnmergeablePrimary> {
    let mut ours = entry.clone();
    if let Some(o) = ours.as_object_mut() {
        // The list's cniVersion governs every plugin in it.
        o.remove("cniVersion");
    }
    let obj = existing.as_object().ok_or(UnmergeablePrimary::NotObject)?;
    if obj.contains_key("type") {
        let mut single = obj.clone();
        single.remove("cniVersion");
        let mut list = Map::new();
        list.insert("cniVersion".into(), CONVERTED_LIST_VERSION.into());
        list.insert("name".into(), CONVERTED_LIST_NAME.into());
        list.insert(
            "plugins".into(),
            Value::Array(vec![Value::Object(single), ours]),
        );
        return Ok(Value::Object(list));
    }
    let plugins = obj
        .get("plugins")
        .and_then(Value::as_array)
        .ok_or(UnmergeablePrimary::NeitherTypeNorPlugins)?;
    let mut kept: Vec<Value> = plugins.iter().filter(|p| !is_ours(p)).cloned().collect();
    kept.push(ours);
    let mut out = obj.clone();
    out.insert("plugins".into(), Value::Array(kept));
    Ok(Value::Object(out))
}

/// The list without our entries; `None` when there is nothing of ours in it.
pub fn remove_ours(existing: &Value) -> Option<Value> {
    let plugins = existing.get("plugins")?.as_array()?;
    if !plugins.iter().any(is_ours) {
        return None;
    }
    let mut out = existing.clone();
    let kept: Vec<Value> = plugins.iter().filter(|p| !is_ours(p)).cloned().collect();
    out["plugins"] = Value::Array(kept);
    Some(out)
}

/// The standalone file: our entry as a single network config.
pub fn standalone_conf(entry: &Value) -> Value {
    let mut v = entry.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("cniVersion".into(), STANDALONE_VERSION.into());
    }
    v
}

/// What a pass has to do with the CNI config.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfPlan {
    /// Installed and current in `file`; `warning` if kubelet would use another file.
    Valid {
        file: String,
        warning: Option<String>,
    },
    /// Write `content` to `file` (atomically). With `rename_to`, rename it afterwards: the
    /// `.conf` → `.conflist` conversion writes the list into the `.conf` first so that kubelet
    /// never sees the old `.conf` and the new `.conflist` side by side (a `.conf` holding a
    /// list is invalid to kubelet, so the in-between state fails closed).
    Write {
        file: String,
        content: Value,
        rename_to: Option<String>,
        /// The file's content before (the primary's own), for logs.
        before: Option<Value>,
    },
    /// Chained mode without a usable primary config: wait for the primary CNI.
    Wait { reason: String },
}

pub fn plan_chained(files: &[ConfFile], conf_name: Option<&str>, entry: &Value) -> ConfPlan {
    let (file, existing) = match conf_name {
        Some(name) => {
            let Some(f) = find_named(files, name) else {
                return ConfPlan::Wait {
                    reason: format!("CNI_CONF_NAME {name} does not exist yet"),
                };
            };
            match parse_valid(&f.name, &f.content) {
                Ok(v) => (f, v),
                Err(e) => {
                    return ConfPlan::Wait {
                        reason: format!("CNI_CONF_NAME {} is not a valid CNI config: {e}", f.name),
                    };
                }
            }
        }
        None => match select_primary(files) {
            Some(x) => x,
            None => {
                return ConfPlan::Wait {
                    reason: "no valid .conf/.conflist file yet (waiting for the primary CNI)"
                        .into(),
                };
            }
        },
    };
    let merged = match merge_chained(&existing, entry) {
        Ok(m) => m,
        Err(e) => {
            return ConfPlan::Wait {
                reason: format!("{}: {e}", file.name),
            };
        }
    };
    match format_of(&file.name) {
        Some(Format::Conf) => ConfPlan::Write {
            file: file.name.clone(),
            content: merged,
            rename_to: Some(format!("{}list", file.name)),
            before: Some(existing),
        },
        _ if merged == existing => {
            // With CNI_CONF_NAME the operator chose the file; if kubelet prefers another one,
            // pods get no istio-cni. Istio only warns here, and so do we (their choice).
            let warning = match (conf_name, select_primary(files)) {
                (Some(_), Some((first, _))) if first.name != file.name => Some(format!(
                    "CNI_CONF_NAME {} is not the config kubelet uses ({} sorts first); pods will not get istio-cni",
                    file.name, first.name
                )),
                _ => None,
            };
            ConfPlan::Valid {
                file: file.name.clone(),
                warning,
            }
        }
        _ => ConfPlan::Write {
            file: file.name.clone(),
            content: merged,
            rename_to: None,
            before: Some(existing),
        },
    }
}

pub fn plan_standalone(files: &[ConfFile], file_name: &str, entry: &Value) -> ConfPlan {
    let want = standalone_conf(entry);
    if format_of(file_name) == Some(Format::ConfList) {
        return ConfPlan::Wait {
            reason: format!(
                "CNI_CONF_NAME {file_name}: a standalone config is one plugin, which the runtime does not load from a .conflist; name it *.conf"
            ),
        };
    }
    let existing = files.iter().find(|f| f.name == file_name);
    let current = existing.and_then(|f| crate::gojson::parse(&f.content).ok());
    // Never overwrite another plugin's config (e.g. CNI_CONF_NAME naming the primary's file):
    // that would take the node's network away.
    if existing.is_some() && !current.as_ref().is_some_and(is_ours) {
        return ConfPlan::Wait {
            reason: format!(
                "CNI_CONF_NAME {file_name} is another plugin's config; standalone mode writes a file of its own and will not overwrite it"
            ),
        };
    }
    if current.as_ref() != Some(&want) {
        return ConfPlan::Write {
            file: file_name.to_string(),
            content: want,
            rename_to: None,
            before: current,
        };
    }
    // Standalone users pick the order themselves (Istio only warns too).
    let mut sorted: Vec<&ConfFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let first = sorted
        .into_iter()
        .find(|f| parse_valid(&f.name, &f.content).is_ok())
        .map(|f| f.name.clone());
    let warning = match first {
        Some(f) if f != file_name => Some(format!(
            "{f} sorts before {file_name}: kubelet uses {f}, not istio-cni's standalone config"
        )),
        _ => None,
    };
    ConfPlan::Valid {
        file: file_name.to_string(),
        warning,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A config file of the net dir.
    pub(crate) fn f(name: &str, content: &str) -> ConfFile {
        ConfFile {
            name: name.into(),
            content: content.as_bytes().to_vec(),
        }
    }

    /// Our conflist entry, as the tests write it.
    pub(crate) fn entry() -> Value {
        json!({"name": "istio-cni", "type": "istio-cni", "cniVersion": "0.3.1", "x": 1})
    }

    const LIST: &str = r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"a"},{"type":"b"}]}"#;

    #[test]
    fn validity_follows_libcni() {
        assert!(parse_valid("x.conflist", LIST.as_bytes()).is_ok());
        for (name, body) in [
            ("x.conflist", "[]"),
            ("x.conflist", "{}"),
            ("x.conflist", r#"{"name":"n","plugins":[]}"#),
            ("x.conflist", r#"{"name":"n","pugins":[{"type":"a"}]}"#),
            ("x.conflist", r#"{"plugins":[{"type":"a"}]}"#),
            (
                "x.conflist",
                r#"{"name":"n","plugins":[{"name":"no-type"}]}"#,
            ),
            ("x.conf", r#"{"name":"n"}"#),
            ("x.conf", "\"This is not json\""),
            ("x.conf", "{trunc"),
            ("x.json", r#"{"type":"a"}"#),
        ] {
            assert!(parse_valid(name, body.as_bytes()).is_err(), "{name} {body}");
        }
        // cniVersion is optional (nover_calico.conflist).
        assert!(parse_valid("x.conflist", br#"{"name":"n","plugins":[{"type":"a"}]}"#).is_ok());
    }

    #[test]
    fn primary_is_first_valid_sorted() {
        let files = vec![
            f("20-b.conflist", LIST),
            f("10-bad.conf", "{"),
            f("05-ignored.json", r#"{"type":"a"}"#),
            f("15-a.conf", r#"{"type":"bridge","name":"x"}"#),
            f("00-ours.conf", r#"{"type":"istio-cni","name":"istio-cni"}"#),
        ];
        assert_eq!(select_primary(&files).unwrap().0.name, "15-a.conf");
    }

    #[test]
    fn merge_removes_duplicates_and_appends_last() {
        let existing: Value = serde_json::from_str(
            r#"{"name":"n","plugins":[{"type":"istio-cni","old":true},{"type":"a"},{"type":"istio-cni"},{"type":"b"}]}"#,
        )
        .unwrap();
        let m = merge_chained(&existing, &entry()).unwrap();
        assert_eq!(plugin_types(&m), vec!["a", "b", "istio-cni"]);
        assert!(m["plugins"][2].get("cniVersion").is_none());
        // Idempotent: merging again changes nothing.
        assert_eq!(merge_chained(&m, &entry()).unwrap(), m);
        assert_eq!(plugin_types(&remove_ours(&m).unwrap()), vec!["a", "b"]);
        assert!(remove_ours(&remove_ours(&m).unwrap()).is_none());
    }

    #[test]
    fn conf_becomes_conflist_via_rename() {
        let files = vec![f(
            "10-bridge.conf",
            r#"{"cniVersion":"0.4.0","type":"bridge","name":"dbnet"}"#,
        )];
        let ConfPlan::Write {
            file,
            content,
            rename_to,
            ..
        } = plan_chained(&files, None, &entry())
        else {
            panic!("expected a write")
        };
        assert_eq!(file, "10-bridge.conf");
        assert_eq!(rename_to.as_deref(), Some("10-bridge.conflist"));
        assert_eq!(content["name"], "k8s-pod-network");
        assert_eq!(content["cniVersion"], "0.3.1");
        assert!(content["plugins"][0].get("cniVersion").is_none());
        assert_eq!(plugin_types(&content), vec!["bridge", "istio-cni"]);
    }

    #[test]
    fn plan_is_valid_after_merge_and_waits_without_primary() {
        let files = vec![f("10-x.conflist", LIST)];
        let ConfPlan::Write { content, .. } = plan_chained(&files, None, &entry()) else {
            panic!()
        };
        let merged = vec![f("10-x.conflist", &content.to_string())];
        assert!(matches!(
            plan_chained(&merged, None, &entry()),
            ConfPlan::Valid { .. }
        ));
        // A changed entry (new settings) is a rewrite.
        let mut e2 = entry();
        e2["x"] = json!(2);
        assert!(matches!(
            plan_chained(&merged, None, &e2),
            ConfPlan::Write { .. }
        ));
        assert!(matches!(
            plan_chained(&[f("a.conflist", "{")], None, &entry()),
            ConfPlan::Wait { .. }
        ));
        assert!(matches!(
            plan_chained(&[], Some("x.conf"), &entry()),
            ConfPlan::Wait { .. }
        ));
    }

    #[test]
    fn named_config_tolerates_rename() {
        let files = vec![f("00-calico.conflist", LIST), f("01-other.conflist", LIST)];
        assert_eq!(
            find_named(&files, "00-calico.conf").unwrap().name,
            "00-calico.conflist"
        );
        assert_eq!(
            find_named(&files, "01-other.conflist").unwrap().name,
            "01-other.conflist"
        );
        let files = vec![f("00-calico.conf", r#"{"type":"calico","name":"k"}"#)];
        assert_eq!(
            find_named(&files, "00-calico.conflist").unwrap().name,
            "00-calico.conf"
        );
    }

    #[test]
    fn standalone_writes_and_warns_when_not_first() {
        let e = entry();
        let ConfPlan::Write { content, .. } = plan_standalone(&[], "YYY-istio-cni.conf", &e) else {
            panic!()
        };
        let files = vec![
            f("10-x.conflist", LIST),
            f("YYY-istio-cni.conf", &content.to_string()),
        ];
        let ConfPlan::Valid { warning, .. } = plan_standalone(&files, "YYY-istio-cni.conf", &e)
        else {
            panic!()
        };
        assert!(warning.unwrap().contains("10-x.conflist"));
    }

    #[test]
    fn standalone_never_overwrites_another_plugins_config() {
        let e = entry();
        let files = vec![f(
            "10-x.conf",
            r#"{"cniVersion":"0.3.1","name":"n","type":"bridge"}"#,
        )];
        for name in ["10-x.conf", "10-x.conflist"] {
            let ConfPlan::Wait { reason } = plan_standalone(&files, name, &e) else {
                panic!("{name}")
            };
            assert!(reason.contains(name), "{reason}");
        }
    }
}
