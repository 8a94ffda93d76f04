//! The kinds of backend a [`crate::Plan`] is rendered by, by the names users select them with
//! (`--backend`, `REDIRECT_BACKEND`) and readers of live rules report. Defined here, below both
//! `redirect` (which programs with them) and `explain` (which reads what they wrote), so the
//! two name them once.

use serde::Serialize;
use std::fmt;

/// The mechanism that programs (or programmed) the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    Nft,
    IptablesLegacy,
}

impl Backend {
    /// Every kind, the preferred one first.
    pub const ALL: [Backend; 2] = [Backend::Nft, Backend::IptablesLegacy];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::IptablesLegacy => "iptables-legacy",
        }
    }

    /// The other names users select it by (`--backend`, `REDIRECT_BACKEND`).
    fn aliases(self) -> &'static [&'static str] {
        match self {
            Backend::Nft => &["nftables"],
            Backend::IptablesLegacy => &["legacy"],
        }
    }

    /// Its value in Istio's `FORCE_IPTABLES_BINARY` (`--force-iptables-binary`).
    pub fn istio_binary(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::IptablesLegacy => "legacy",
        }
    }

    /// The kind a user named, by its name or an alias.
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == name || b.aliases().contains(&name))
    }

    /// The kind Istio's `FORCE_IPTABLES_BINARY` value selects.
    pub fn from_istio_binary(value: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.istio_binary() == value)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::Backend;

    #[test]
    fn every_kind_is_found_by_its_names_and_by_istios_value_and_nothing_else_is() {
        for b in Backend::ALL {
            assert_eq!(Backend::from_name(b.name()), Some(b));
            for alias in b.aliases() {
                assert_eq!(Backend::from_name(alias), Some(b));
            }
            assert_eq!(Backend::from_istio_binary(b.istio_binary()), Some(b));
        }
        assert_eq!(Backend::from_name("legacy"), Some(Backend::IptablesLegacy));
        assert_eq!(Backend::from_name("iptables"), None);
        assert_eq!(Backend::from_istio_binary("iptables-legacy"), None);
    }
}
