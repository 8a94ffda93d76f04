//! Which of our rule sets a namespace holds, read without a plan and without its lock (a
//! reader's snapshot: `istio-nftables status`, the daemon's report): our nftables sidecar
//! tables, our ambient in-pod tables, our iptables-legacy chains.

use crate::RedirectError;
use capture::Table;
use std::path::Path;

/// Our rules found in one namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Present {
    /// An `inet` table of the sidecar plan (`Table::ALL`).
    pub nft_sidecar: bool,
    /// An `inet` table of the ambient in-pod plan (`Table::AMBIENT`).
    pub nft_ambient: bool,
    /// An iptables-legacy chain of ours (`ISTIO_*`, sidecar or ambient).
    pub legacy: bool,
}

impl Present {
    pub fn nft(&self) -> bool {
        self.nft_sidecar || self.nft_ambient
    }

    pub fn any(&self) -> bool {
        self.nft() || self.legacy
    }

    /// `nft`, `iptables-legacy` or `both`; `None` when nothing of ours is there.
    pub fn backend(&self) -> Option<&'static str> {
        match (self.nft(), self.legacy) {
            (true, true) => Some("both"),
            (true, false) => Some("nft"),
            (false, true) => Some("iptables-legacy"),
            (false, false) => None,
        }
    }
}

/// Our rules in `netns` (`None`: the caller's namespace). A kernel without nf_tables holds no
/// tables of ours; legacy chains that cannot be read are an error.
pub fn present(netns: Option<&Path>) -> Result<Present, RedirectError> {
    netns::run_in(netns, || -> Result<Present, RedirectError> {
        let tables = nft_backend::list_tables().unwrap_or_default();
        let has = |ours: &[Table]| {
            ours.iter()
                .any(|t| tables.iter().any(|(f, n)| f == "inet" && n == t.nft_name()))
        };
        Ok(Present {
            nft_sidecar: has(&Table::ALL),
            nft_ambient: has(&Table::AMBIENT),
            legacy: iptables_legacy::has_our_chains(&iptables_legacy::Tools::default())?,
        })
    })?
}
