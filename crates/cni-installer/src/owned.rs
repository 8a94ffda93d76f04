//! Istio's own conflist (`ISTIO_OWNED_CNI_CONFIG`, Istio #55968, release note 55968): instead
//! of writing our entry into the primary CNI's file, the installer keeps a file of its own
//! (`ISTIO_OWNED_CNI_CONFIG_FILENAME`, default `02-istio-cni.conflist`) holding the primary's
//! configuration with istio-cni appended. It sorts before the primary's file, so a runtime
//! that picks the lexically first valid file (libcni, containerd, CRI-O) uses it; a primary
//! that rewrites its own file (as most do when they start, e.g. after a node reboot, before
//! our daemon is back) can then no longer take istio-cni out of the chain.
//!
//! As in Istio: the copy is made from the primary (`CNI_CONF_NAME`, else the first valid file
//! other than ours), rewritten whenever the primary changes (we compare the whole merged
//! content; Istio compares plugin types only, so a primary's changed IPAM settings would stay
//! stale there until the daemon restarts), never written into the primary's own file, and
//! removed on uninstall (kept across a rollout, like the entry).
//!
//! Unlike Istio, which then only warns ("undefined behavior and potential bypass"), when
//! another valid file sorts before ours (a `00-multus.conf`), the runtime would never read
//! ours: the installer chains into the primary instead, as without the option. And with the
//! option off, a file of ours left at that name by an earlier daemon (its entry listed) is
//! removed, or it would shadow the primary with a stale copy.
//!
//! Pure: decisions over a snapshot of the net dir; the I/O is in [`crate::install`].

use crate::discovery::{self, ConfFile, ConfPlan, find_named, merge_chained, parse_valid};
use serde_json::Value;

/// Istio's default name (`DefaultIstioOwnedCNIConfigFilename`).
pub const DEFAULT_NAME: &str = "02-istio-cni.conflist";

/// What a pass does with the owned file.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedPlan {
    /// `first`, a valid config other than ours, sorts before `owned`: the runtime would never
    /// read ours. Chain into the primary instead (and say why).
    Fallback { first: String },
    /// Wait for a primary, keep the owned file as it is, or write it (`file` is its name).
    Conf(ConfPlan),
}

/// The config files other than the owned one.
fn others(files: &[ConfFile], owned: &str) -> Vec<ConfFile> {
    files.iter().filter(|f| f.name != owned).cloned().collect()
}

/// The plan for the owned file `owned` given the net dir's `files`, `CNI_CONF_NAME` and our
/// entry.
pub fn plan(files: &[ConfFile], conf_name: Option<&str>, owned: &str, entry: &Value) -> OwnedPlan {
    let rest = others(files, owned);
    // The runtime's choice if ours were not there: the first valid file by name.
    let mut sorted: Vec<&ConfFile> = rest.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let first = sorted
        .into_iter()
        .find(|f| parse_valid(&f.name, &f.content).is_ok())
        .map(|f| f.name.clone());
    if let Some(first) = first
        && first.as_str() < owned
    {
        return OwnedPlan::Fallback { first };
    }
    let primary = match conf_name {
        Some(name) => match find_named(&rest, name) {
            None => {
                return wait(format!("CNI_CONF_NAME {name} does not exist yet"));
            }
            Some(f) => match parse_valid(&f.name, &f.content) {
                Ok(v) => (f.name.clone(), v),
                Err(e) => {
                    return wait(format!(
                        "CNI_CONF_NAME {} is not a valid CNI config: {e}",
                        f.name
                    ));
                }
            },
        },
        None => match discovery::select_primary(&rest) {
            Some((f, v)) => (f.name.clone(), v),
            None => {
                return wait(
                    "no valid .conf/.conflist file yet besides ours (waiting for the primary CNI)"
                        .into(),
                );
            }
        },
    };
    let merged = match merge_chained(&primary.1, entry) {
        Ok(m) => m,
        Err(e) => return wait(format!("{}: {e}", primary.0)),
    };
    let current = files
        .iter()
        .find(|f| f.name == owned)
        .and_then(|f| crate::gojson::parse(&f.content).ok());
    if current.as_ref() == Some(&merged) {
        return OwnedPlan::Conf(ConfPlan::Valid {
            file: owned.to_string(),
            warning: None,
        });
    }
    OwnedPlan::Conf(ConfPlan::Write {
        file: owned.to_string(),
        content: merged,
        rename_to: None,
        // The primary's own content, for the log ("plugins before").
        before: Some(primary.1),
    })
}

fn wait(reason: String) -> OwnedPlan {
    OwnedPlan::Conf(ConfPlan::Wait { reason })
}

/// The primary's file name the copy is made from (for logs and the storm hint).
pub fn source_name(files: &[ConfFile], conf_name: Option<&str>, owned: &str) -> Option<String> {
    let rest = others(files, owned);
    match conf_name {
        Some(name) => find_named(&rest, name).map(|f| f.name.clone()),
        None => discovery::select_primary(&rest).map(|(f, _)| f.name.clone()),
    }
}

/// With the option off: whether `content` at the owned name is a file of ours left by an
/// earlier daemon (it lists istio-cni), to be removed before the primary is chosen.
pub fn is_leftover(content: &[u8]) -> bool {
    crate::gojson::parse(content)
        .map(|v| {
            discovery::plugin_types(&v)
                .iter()
                .any(|t| t == cni_config::PLUGIN_TYPE)
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::tests::{entry, f};

    const CALICO: &str = r#"{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico"},{"type":"portmap"}]}"#;

    fn write(p: OwnedPlan) -> (String, Value) {
        match p {
            OwnedPlan::Conf(ConfPlan::Write { file, content, .. }) => (file, content),
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn copies_the_primary_with_our_entry_under_its_own_name() {
        let files = vec![f("10-calico.conflist", CALICO)];
        let (file, content) = write(plan(&files, None, DEFAULT_NAME, &entry()));
        assert_eq!(file, DEFAULT_NAME);
        assert_eq!(
            discovery::plugin_types(&content),
            ["calico", "portmap", "istio-cni"]
        );
        assert_eq!(content["name"], "k8s-pod-network");
        // Written: valid until the primary changes; then rewritten from the new primary.
        let mut now = files.clone();
        now.push(f(DEFAULT_NAME, &content.to_string()));
        assert!(matches!(
            plan(&now, None, DEFAULT_NAME, &entry()),
            OwnedPlan::Conf(ConfPlan::Valid { .. })
        ));
        now[0] = f(
            "10-calico.conflist",
            &CALICO.replace("portmap", "bandwidth"),
        );
        let (_, content) = write(plan(&now, None, DEFAULT_NAME, &entry()));
        assert_eq!(
            discovery::plugin_types(&content),
            ["calico", "bandwidth", "istio-cni"]
        );
    }

    #[test]
    fn a_single_conf_primary_becomes_a_list_in_the_copy() {
        let files = vec![f(
            "10-bridge.conf",
            r#"{"cniVersion":"0.4.0","type":"bridge","name":"b"}"#,
        )];
        let (file, content) = write(plan(&files, None, DEFAULT_NAME, &entry()));
        assert_eq!(file, DEFAULT_NAME);
        assert_eq!(discovery::plugin_types(&content), ["bridge", "istio-cni"]);
    }

    #[test]
    fn a_file_sorting_before_ours_falls_back_to_chaining() {
        let files = vec![
            f("00-multus.conf", r#"{"type":"multus","name":"m"}"#),
            f("10-calico.conflist", CALICO),
        ];
        assert_eq!(
            plan(&files, None, DEFAULT_NAME, &entry()),
            OwnedPlan::Fallback {
                first: "00-multus.conf".into()
            }
        );
        // An invalid file before ours is not the runtime's choice: no fallback.
        let files = vec![
            f("00-broken.conflist", "{"),
            f("10-calico.conflist", CALICO),
        ];
        assert!(matches!(
            plan(&files, None, DEFAULT_NAME, &entry()),
            OwnedPlan::Conf(ConfPlan::Write { .. })
        ));
    }

    #[test]
    fn conf_name_picks_the_source_and_waits_for_it() {
        let files = vec![
            f("10-calico.conflist", CALICO),
            f("20-other.conflist", &CALICO.replace("calico", "other")),
        ];
        let (_, content) = write(plan(
            &files,
            Some("20-other.conflist"),
            DEFAULT_NAME,
            &entry(),
        ));
        assert_eq!(discovery::plugin_types(&content)[0], "other");
        assert!(matches!(
            plan(&files, Some("30-missing.conflist"), DEFAULT_NAME, &entry()),
            OwnedPlan::Conf(ConfPlan::Wait { .. })
        ));
        assert_eq!(
            source_name(&files, None, DEFAULT_NAME).as_deref(),
            Some("10-calico.conflist")
        );
    }

    /// After a reboot, only our copy may be there (the primary not written yet): wait, and
    /// never take our own file for the primary.
    #[test]
    fn our_file_alone_is_no_primary() {
        let (_, content) = write(plan(
            &[f("10-calico.conflist", CALICO)],
            None,
            DEFAULT_NAME,
            &entry(),
        ));
        let files = vec![f(DEFAULT_NAME, &content.to_string())];
        assert!(matches!(
            plan(&files, None, DEFAULT_NAME, &entry()),
            OwnedPlan::Conf(ConfPlan::Wait { .. })
        ));
        assert!(is_leftover(content.to_string().as_bytes()));
        assert!(!is_leftover(CALICO.as_bytes()));
        assert!(!is_leftover(b"{"));
    }
}
