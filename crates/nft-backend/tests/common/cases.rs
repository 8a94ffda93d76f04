//! The golden cases the kernel tier (`istio_goldens.rs`, `ambient_goldens.rs`) and the
//! root-free tier (`render_goldens.rs`) check, listed once.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use capture::{Config, Ipv6Mode};
use std::path::PathBuf;

/// Istio's owner-group goldens name these groups; our config resolves them to these gids.
pub const GROUP_NAMES: [(&str, u32); 2] = [("java", 1001), ("ftp", 1002)];

/// Our checked-in listings: `nft list ruleset` after our batch, one file per case.
pub fn listings_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../nft/listings")
}

/// One sidecar case: its listing's stem and its configuration (the facts are the defaults).
pub struct SidecarCase {
    pub name: String,
    pub cfg: Config,
}

/// Every nftables capture golden of `index.json` (the 28 directly under `nftables/`).
pub fn sidecar_goldens() -> Vec<SidecarCase> {
    let out: Vec<SidecarCase> = golden::index()
        .iter()
        .filter_map(|case| {
            let golden = case["golden"].as_str()?;
            let name = golden.strip_prefix("nftables/")?.strip_suffix(".golden")?;
            if name.contains('/') {
                return None;
            }
            Some(SidecarCase {
                name: name.to_string(),
                cfg: golden::config_from_effective(&case["effective_config"]),
            })
        })
        .collect();
    assert_eq!(out.len(), 28, "every nftables capture golden is checked");
    out
}

/// The CNI default, IPv4 only and dual stack: no golden of Istio's, our listings only.
pub fn cni_defaults() -> Vec<SidecarCase> {
    [
        ("cni-default-ipv4", Ipv6Mode::Off),
        ("cni-default-dual-stack", Ipv6Mode::On),
    ]
    .into_iter()
    .map(|(name, ipv6)| SidecarCase {
        name: name.into(),
        cfg: Config {
            ipv6,
            ..Config::cni_default()
        },
    })
    .collect()
}

/// Every nftables ambient golden (14).
pub fn ambient_goldens() -> Vec<golden::AmbientCase> {
    let cases = golden::ambient_cases("nftables");
    assert_eq!(cases.len(), 14, "every nftables ambient golden is checked");
    cases
}
