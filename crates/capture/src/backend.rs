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
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::IptablesLegacy => "iptables-legacy",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
