//! The live ruleset of our tables, read over netlink by nft_backend's reader (its `live` view,
//! the one the read-back check uses) into the evaluator's IR; and the node's other NAT chains.

use super::ir::{Hook, Ruleset, TableFamily};
use capture::Table;
use nft_backend::NftError;
use nft_backend::netlink::Socket;
use nft_ir::ChainType;

/// The sidecar's tables and ambient's (in a pod: `istio-ambient-{nat,mangle,raw}`; on the
/// node: `istio-ambient-nat` with the host probe rule and its sets).
fn ours(table: &str) -> bool {
    Table::ALL
        .iter()
        .chain(Table::AMBIENT.iter())
        .any(|t| t.nft_name() == table)
}

/// Dumps our tables in the current network namespace. Temporary trace chains are left out.
pub fn live(sock: &Socket) -> Result<Ruleset, NftError> {
    nft_backend::live::ruleset(sock, ours, |c| {
        !c.name.starts_with(crate::trace::TRACE_CHAIN_PREFIX)
    })
}

/// The node's base chains of type nat at the postrouting hook other than ours (any family,
/// table and priority), as `family table chain (priority N)`: a connection from the node
/// crosses them too, and the host explanation does not evaluate them.
pub fn other_nat_postrouting(sock: &Socket) -> Result<Vec<String>, NftError> {
    let chains = nft_backend::live::chains(sock, libc::NFPROTO_UNSPEC as u16)?;
    Ok(chains
        .into_iter()
        .filter(|c| !(c.family == TableFamily::Inet && ours(&c.table)))
        .filter_map(|c| match c.base {
            Some(b) if b.kind == ChainType::Nat && b.hook == Hook::Postrouting => Some(format!(
                "{} {} {} (priority {})",
                c.family.name(),
                c.table,
                c.name,
                b.priority
            )),
            _ => None,
        })
        .collect())
}
