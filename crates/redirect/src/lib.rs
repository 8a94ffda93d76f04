//! The path every binary takes: facts from the namespace → `Plan` → backend, inside the
//! target namespace. Policy lives in `capture`; kernel work in the backends.

use capture::{Facts, Plan};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

pub use capture;

/// The mechanism that programs the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Nft,
    IptablesLegacy,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Nft => "nft",
            Backend::IptablesLegacy => "iptables-legacy",
        })
    }
}

/// `--backend` / `redirect_backend` / `REDIRECT_BACKEND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendChoice {
    #[default]
    Auto,
    Fixed(Backend),
}

impl FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" | "" => Ok(BackendChoice::Auto),
            "nft" | "nftables" => Ok(BackendChoice::Fixed(Backend::Nft)),
            "iptables-legacy" | "legacy" => Ok(BackendChoice::Fixed(Backend::IptablesLegacy)),
            _ => Err("expected auto, nft or iptables-legacy".into()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RedirectError {
    #[error(transparent)]
    Netns(#[from] netns::NetnsError),
    #[error("nftables: {0}")]
    Nft(#[from] nft_backend::NftError),
    #[error("iptables-legacy: {0}")]
    Legacy(#[from] iptables_legacy::LegacyError),
    #[error("reading the namespace's addresses: {0}")]
    Addresses(nix::Error),
}

/// The backend chosen for a namespace and why (for logs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection {
    pub backend: Backend,
    pub reason: String,
}

/// Addresses of the namespace's interfaces (+ nameservers from `resolv_conf`, a host path).
pub fn read_facts(
    netns: Option<&Path>,
    resolv_conf: Option<&Path>,
) -> Result<Facts, RedirectError> {
    let local_addrs = netns::run_in(netns, || -> Result<Vec<std::net::IpAddr>, nix::Error> {
        Ok(nix::ifaddrs::getifaddrs()?
            .filter_map(|i| i.address)
            .filter_map(|a| {
                a.as_sockaddr_in()
                    .map(|s| std::net::IpAddr::V4(s.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|s| std::net::IpAddr::V6(s.ip())))
            })
            .collect())
    })?
    .map_err(RedirectError::Addresses)?;
    let resolv_conf_servers = resolv_conf
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| capture::parse_resolv_conf(&t))
        .unwrap_or_default();
    Ok(Facts {
        local_addrs,
        resolv_conf_servers,
    })
}

/// `--backend auto`: nft, unless the kernel has no nf_tables or the namespace already holds
/// iptables-legacy rules (then mixing would make rule order depend on hook registration).
pub fn detect(netns: Option<&Path>) -> Result<Detection, RedirectError> {
    netns::run_in(netns, || -> Result<Detection, RedirectError> {
        if !nft_backend::kernel_supports_nftables() {
            return Ok(Detection {
                backend: Backend::IptablesLegacy,
                reason: "the kernel has no nf_tables support".into(),
            });
        }
        if iptables_legacy::has_legacy_rules().unwrap_or(false) {
            return Ok(Detection {
                backend: Backend::IptablesLegacy,
                reason: "the namespace already holds iptables-legacy rules".into(),
            });
        }
        Ok(Detection {
            backend: Backend::Nft,
            reason: "default".into(),
        })
    })?
}

fn resolve(choice: BackendChoice, netns: Option<&Path>) -> Result<Detection, RedirectError> {
    match choice {
        BackendChoice::Fixed(backend) => Ok(Detection {
            backend,
            reason: "configured".into(),
        }),
        BackendChoice::Auto => detect(netns),
    }
}

/// Programs `plan` into the namespace (atomically per backend). Returns the backend used.
pub fn apply(
    plan: &Plan,
    netns: Option<&Path>,
    choice: BackendChoice,
) -> Result<Detection, RedirectError> {
    let detection = resolve(choice, netns)?;
    netns::run_in(netns, || -> Result<(), RedirectError> {
        // Never both kinds in one namespace: the other backend's rules of ours go first.
        match detection.backend {
            Backend::Nft => {
                if iptables_legacy::has_our_chains().unwrap_or(false) {
                    iptables_legacy::cleanup(netns)?;
                }
                nft_backend::apply(plan)?;
            }
            Backend::IptablesLegacy => {
                nft_backend::cleanup()?;
                iptables_legacy::apply(plan, netns)?;
            }
        }
        Ok(())
    })??;
    Ok(detection)
}

/// Differences between the live rules and `plan`; empty when in sync.
pub fn check(
    plan: &Plan,
    netns: Option<&Path>,
    choice: BackendChoice,
) -> Result<Vec<String>, RedirectError> {
    let detection = resolve(choice, netns)?;
    netns::run_in(netns, || -> Result<Vec<String>, RedirectError> {
        Ok(match detection.backend {
            Backend::Nft => nft_backend::check(plan)?,
            Backend::IptablesLegacy => iptables_legacy::check(plan)?,
        })
    })?
}

/// Removes our rules of both kinds from the namespace.
pub fn cleanup(netns: Option<&Path>) -> Result<(), RedirectError> {
    netns::run_in(netns, || -> Result<(), RedirectError> {
        nft_backend::cleanup()?;
        if iptables_legacy::has_our_chains().unwrap_or(false) {
            iptables_legacy::cleanup(netns)?;
        }
        Ok(())
    })?
}

/// The rules as text for `--dry-run`: nft syntax, or iptables-restore payloads.
pub fn dry_run(plan: &Plan, backend: Backend) -> String {
    match backend {
        Backend::Nft => nft_backend::render_text(plan),
        Backend::IptablesLegacy => {
            iptables_legacy::render_payload(plan, false)
                + &iptables_legacy::render_payload(plan, true)
        }
    }
}
