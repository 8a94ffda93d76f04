//! nftables backend (work in progress: API first).

use capture::Plan;

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("nftables backend not implemented yet")]
    Unimplemented,
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    /// Our tables existed and were replaced atomically.
    pub replaced: bool,
}

/// Programs `plan` into the current network namespace in one atomic batch.
pub fn apply(_plan: &Plan) -> Result<ApplyReport, NftError> {
    Err(NftError::Unimplemented)
}

/// Differences between the live tables and `plan` (empty = in sync).
pub fn check(_plan: &Plan) -> Result<Vec<String>, NftError> {
    Err(NftError::Unimplemented)
}

/// Deletes our tables (only ours). Returns whether any existed.
pub fn cleanup() -> Result<bool, NftError> {
    Err(NftError::Unimplemented)
}

/// Whether any of our tables exist in the current namespace.
pub fn has_our_tables() -> Result<bool, NftError> {
    Err(NftError::Unimplemented)
}

/// The ruleset in `nft -f` syntax.
pub fn render_text(_plan: &Plan) -> String {
    String::new()
}

/// Every nftables table in the current namespace as `(family, name)` (node backend detection).
pub fn list_tables() -> Result<Vec<(String, String)>, NftError> {
    Err(NftError::Unimplemented)
}
