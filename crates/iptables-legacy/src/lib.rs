//! iptables-legacy backend: the same `Plan` as the nft backend, rendered in istio-iptables'
//! restore format (byte-identical to Istio's payloads).

mod render;

pub use render::{render_payload, rule_args};

use capture::Plan;
use std::path::Path;

#[derive(Debug)]
pub enum LegacyError {
    Unimplemented,
}

impl std::fmt::Display for LegacyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("iptables-legacy backend not implemented yet")
    }
}

impl std::error::Error for LegacyError {}

/// Programs `plan` into the current network namespace with iptables-legacy-restore.
/// `lock_file` scopes the xtables lock (e.g. to the pod's namespace file).
pub fn apply(_plan: &Plan, _lock_file: Option<&Path>) -> Result<(), LegacyError> {
    Err(LegacyError::Unimplemented)
}

/// Differences between the live rules and `plan` (empty = in sync).
pub fn check(_plan: &Plan) -> Result<Vec<String>, LegacyError> {
    Err(LegacyError::Unimplemented)
}

/// Removes our chains and the jumps to them. Returns whether any existed.
pub fn cleanup(_lock_file: Option<&Path>) -> Result<bool, LegacyError> {
    Err(LegacyError::Unimplemented)
}

/// Whether the current namespace holds any iptables-legacy tables with rules.
pub fn has_legacy_rules() -> Result<bool, LegacyError> {
    Err(LegacyError::Unimplemented)
}

/// Whether our ISTIO_* chains exist in iptables-legacy in the current namespace.
pub fn has_our_chains() -> Result<bool, LegacyError> {
    Err(LegacyError::Unimplemented)
}
