//! Which rule backend pods on this node get (`redirect_backend` in the plugin config). One
//! decision per node, made once by the node daemon from the host namespace and written into
//! the config, so the plugin and anything else on the node cannot disagree (Istio #57827,
//! #49279).

use crate::{Backend, BackendChoice};

/// Chains kubelet creates to advertise which iptables flavour the node uses.
pub const HINT_CHAINS: &[&str] = &["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// What the probes saw in the namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// Tables the legacy ip_tables module has instantiated here (`ip_tables_names`).
    pub legacy_tables: Vec<String>,
    /// Parsed `iptables-legacy-save`; `None` when it could not be run.
    pub legacy_save: Option<LegacySave>,
    /// Why `legacy_save` is missing (for the log).
    pub legacy_save_error: Option<String>,
    /// nftables tables as (family, name); `None` when they could not be listed.
    pub nft_tables: Option<Vec<(String, String)>>,
    /// Why `nft_tables` is missing (for the log).
    pub nft_error: Option<String>,
    /// Whether the kernel has nf_tables; `None` if unknown.
    pub nf_tables_supported: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LegacySave {
    pub hint_chains: Vec<String>,
    pub rules: usize,
    pub user_chains: usize,
}

/// Reads `iptables-legacy-save` output.
pub fn parse_legacy_save(text: &str) -> LegacySave {
    let mut s = LegacySave::default();
    for line in text.lines() {
        if line.starts_with("-A ") {
            s.rules += 1;
        } else if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or("");
            if HINT_CHAINS.contains(&name) {
                s.hint_chains.push(name.to_string());
            }
            // Built-in chains carry a policy, user chains "-".
            if decl.split_whitespace().nth(1) == Some("-") {
                s.user_chains += 1;
            }
        }
    }
    s
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub backend: Backend,
    pub reason: String,
}

/// The pure decision. Order matters: explicit configuration, then kernel capability, then
/// evidence that this node's kubelet/kube-proxy live in iptables-legacy (pods must match the
/// host, or conntrack/NAT from two worlds fight), else nft.
pub fn decide(choice: BackendChoice, native_nftables: bool, f: &NodeFacts) -> Decision {
    let d = |backend, reason: String| Decision { backend, reason };
    if let BackendChoice::Fixed(b) = choice {
        return d(b, "configured by REDIRECT_BACKEND".into());
    }
    if native_nftables {
        return d(Backend::Nft, "NATIVE_NFTABLES=true".into());
    }
    if f.nf_tables_supported == Some(false) {
        return d(
            Backend::IptablesLegacy,
            "the kernel has no nf_tables support".into(),
        );
    }
    let mut evidence = Vec::new();
    match &f.legacy_save {
        Some(s) => {
            if !s.hint_chains.is_empty() {
                evidence.push(format!(
                    "kubelet hint chain {} in iptables-legacy",
                    s.hint_chains.join("/")
                ));
            }
            if s.rules > 0 || s.user_chains > 0 {
                evidence.push(format!(
                    "{} iptables-legacy rules, {} user chains",
                    s.rules, s.user_chains
                ));
            }
        }
        // Without the save tool, instantiated legacy tables are the only evidence we have.
        None if !f.legacy_tables.is_empty() => evidence.push(format!(
            "legacy tables {} (iptables-legacy-save unavailable)",
            f.legacy_tables.join(",")
        )),
        None => {}
    }
    if evidence.is_empty() {
        return d(Backend::Nft, "no iptables-legacy state on the node".into());
    }
    match &f.nft_tables {
        Some(t) if !t.is_empty() => {
            let names: Vec<String> = t.iter().map(|(fam, n)| format!("{fam} {n}")).collect();
            d(
                Backend::Nft,
                format!(
                    "{} but nftables is in use too (tables: {}); preferring nft",
                    evidence.join("; "),
                    names.join(", ")
                ),
            )
        }
        Some(_) => d(
            Backend::IptablesLegacy,
            format!("{} and no nftables tables", evidence.join("; ")),
        ),
        None => d(
            Backend::IptablesLegacy,
            format!(
                "{} and no nftables information ({})",
                evidence.join("; "),
                f.nft_error.as_deref().unwrap_or("unknown")
            ),
        ),
    }
}

/// Probes the namespace of the calling THREAD (usable inside `netns::run_in`): the save tool
/// inherits the thread's namespace, and /proc/thread-self (not /proc/self, which follows the
/// main thread) shows this thread's tables.
pub fn probe() -> NodeFacts {
    let mut f = NodeFacts {
        legacy_tables: iptables_legacy::instantiated_ipv4_tables(),
        ..Default::default()
    };
    if f.legacy_tables.is_empty() {
        // No legacy table was ever used here: nothing to save, and running the tool is skipped.
        f.legacy_save = Some(LegacySave::default());
    } else {
        match iptables_legacy::save_ipv4(&iptables_legacy::Tools::default()) {
            Ok(text) => f.legacy_save = Some(parse_legacy_save(&text)),
            Err(e) => f.legacy_save_error = Some(e.to_string()),
        }
    }
    match nft_backend::list_tables() {
        Ok(t) => {
            f.nft_tables = Some(t);
            f.nf_tables_supported = Some(true);
        }
        Err(e) => {
            f.nft_error = Some(e.to_string());
            // Only a definite "no nf_tables" from the kernel counts; other errors (permissions,
            // a busy socket) leave the question open rather than forcing legacy.
            f.nf_tables_supported = match e {
                nft_backend::NftError::Unsupported(_) => Some(false),
                _ => None,
            };
        }
    }
    f
}

/// The node's decision, probing the node's namespace (the calling thread's, or the one
/// [`crate::host_netns`] switched to) only when the configuration leaves it open; what was
/// seen and decided is logged.
pub fn decide_here(choice: BackendChoice, native_nftables: bool) -> Decision {
    let needs_probe = choice == BackendChoice::Auto && !native_nftables;
    let facts = if needs_probe {
        // The host's namespace, also when Istio's chart runs the daemon in a pod network.
        crate::host_netns::run(|| Ok(probe())).unwrap_or_else(|e| NodeFacts {
            nft_error: Some(e.to_string()),
            legacy_save_error: Some(e.to_string()),
            ..NodeFacts::default()
        })
    } else {
        NodeFacts::default()
    };
    if needs_probe {
        if let Some(e) = &facts.nft_error {
            tracing::info!(error = %e, "no nftables information from the host namespace; deciding without it");
        }
        if let Some(e) = &facts.legacy_save_error {
            tracing::info!(error = %e, "could not read iptables-legacy state");
        }
        tracing::debug!(?facts, "host namespace facts");
    }
    let d = decide(choice, native_nftables, &facts);
    tracing::info!(backend = %d.backend, reason = %d.reason, "node redirect backend");
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBELET_LEGACY: &str = "# Generated by iptables-save\n*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";

    #[test]
    fn parses_save_output() {
        let s = parse_legacy_save(KUBELET_LEGACY);
        assert_eq!(
            s.hint_chains,
            vec!["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"]
        );
        assert_eq!(s.user_chains, 2);
        assert_eq!(s.rules, 0);
        let s = parse_legacy_save("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n");
        assert_eq!((s.rules, s.user_chains), (1, 0));
    }

    #[test]
    fn decision_table() {
        use Backend::*;
        let legacy = Some(parse_legacy_save(KUBELET_LEGACY));
        let rules_only = Some(LegacySave {
            rules: 3,
            ..Default::default()
        });
        let empty = Some(LegacySave::default());
        let nft_some = Some(vec![("ip".to_string(), "kube-proxy".to_string())]);
        let nft_none = Some(vec![]);
        let fact = |legacy_save: Option<LegacySave>,
                    tables: &[&str],
                    nft: Option<Vec<(String, String)>>,
                    nf: Option<bool>| NodeFacts {
            legacy_tables: tables.iter().map(|s| s.to_string()).collect(),
            legacy_save,
            nft_tables: nft.clone(),
            nft_error: nft
                .is_none()
                .then(|| "netlink: permission denied".to_string()),
            nf_tables_supported: nf,
            ..Default::default()
        };
        let auto = BackendChoice::Auto;
        let cases: Vec<(&str, BackendChoice, bool, NodeFacts, Backend, &str)> = vec![
            (
                "fixed nft",
                BackendChoice::Fixed(Nft),
                false,
                fact(legacy.clone(), &["mangle"], None, None),
                Nft,
                "configured",
            ),
            (
                "fixed legacy",
                BackendChoice::Fixed(IptablesLegacy),
                false,
                fact(empty.clone(), &[], nft_some.clone(), Some(true)),
                IptablesLegacy,
                "configured",
            ),
            (
                "native_nftables",
                auto,
                true,
                fact(legacy.clone(), &["mangle"], None, None),
                Nft,
                "NATIVE_NFTABLES",
            ),
            (
                "no nf_tables",
                auto,
                false,
                fact(empty.clone(), &[], None, Some(false)),
                IptablesLegacy,
                "no nf_tables",
            ),
            (
                "clean node",
                auto,
                false,
                fact(empty.clone(), &[], nft_none.clone(), Some(true)),
                Nft,
                "no iptables-legacy",
            ),
            (
                "clean node, nft unknown",
                auto,
                false,
                fact(empty.clone(), &[], None, None),
                Nft,
                "no iptables-legacy",
            ),
            (
                "kubelet hint, no nft tables",
                auto,
                false,
                fact(legacy.clone(), &["mangle"], nft_none.clone(), Some(true)),
                IptablesLegacy,
                "KUBE-IPTABLES-HINT",
            ),
            (
                "kubelet hint, nft unknown",
                auto,
                false,
                fact(legacy.clone(), &["mangle"], None, None),
                IptablesLegacy,
                "no nftables information",
            ),
            (
                "legacy rules, nft in use",
                auto,
                false,
                fact(
                    rules_only.clone(),
                    &["filter"],
                    nft_some.clone(),
                    Some(true),
                ),
                Nft,
                "nftables is in use too",
            ),
            (
                "legacy rules, no nft",
                auto,
                false,
                fact(rules_only, &["filter"], nft_none.clone(), Some(true)),
                IptablesLegacy,
                "3 iptables-legacy rules",
            ),
            (
                "tables but no save tool",
                auto,
                false,
                fact(None, &["nat"], nft_none.clone(), Some(true)),
                IptablesLegacy,
                "unavailable",
            ),
            (
                "empty legacy tables",
                auto,
                false,
                fact(empty, &["filter"], None, None),
                Nft,
                "no iptables-legacy",
            ),
        ];
        for (name, choice, native, facts, want, reason) in cases {
            let d = decide(choice, native, &facts);
            assert_eq!(d.backend, want, "{name}: {}", d.reason);
            assert!(d.reason.contains(reason), "{name}: {}", d.reason);
        }
    }
}
