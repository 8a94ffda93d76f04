//! The live ruleset of our tables, read over netlink by nft_backend's reader (its `live` view,
//! the one the read-back check uses) into the evaluator's IR; and the node's other NAT chains.

use super::ir::Ruleset;
use capture::Table;
use nft_backend::NftError;
use nft_backend::live::{cstr_to_string, msg_type};
use nft_backend::netlink::{self, Socket};
use nftnl::nftnl_sys as sys;

/// The sidecar's tables and ambient's (in a pod: `istio-ambient-{nat,mangle,raw}`; on the
/// node: `istio-ambient-nat` with the host probe rule and its sets).
fn ours(table: &str) -> bool {
    Table::ALL
        .iter()
        .chain(Table::AMBIENT.iter())
        .any(|t| t.nft_name() == table)
}

fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> NftError {
    move |source| NftError::Io { context, source }
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
    let mut out = Vec::new();
    let req = netlink::dump_request(
        libc::NFT_MSG_GETCHAIN as u32,
        libc::NFPROTO_UNSPEC as u16,
        1,
        |_| {},
    );
    sock.dump(&req, |hdr, raw| {
        if hdr.nlmsg_type != msg_type(libc::NFT_MSG_NEWCHAIN as u32) {
            return;
        }
        // SAFETY: `raw` is a complete chain message; the chain object is freed below.
        unsafe {
            let c = sys::nftnl_chain_alloc();
            if sys::nftnl_chain_nlmsg_parse(raw, c) >= 0
                && sys::nftnl_chain_is_set(c, sys::NFTNL_CHAIN_HOOKNUM as u16)
                && sys::nftnl_chain_get_u32(c, sys::NFTNL_CHAIN_HOOKNUM as u16)
                    == libc::NF_INET_POST_ROUTING as u32
                && cstr_to_string(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_TYPE as u16))
                    == "nat"
            {
                let family =
                    match sys::nftnl_chain_get_u32(c, sys::NFTNL_CHAIN_FAMILY as u16) as i32 {
                        libc::NFPROTO_IPV4 => "ip",
                        libc::NFPROTO_IPV6 => "ip6",
                        libc::NFPROTO_INET => "inet",
                        _ => "?",
                    };
                let table =
                    cstr_to_string(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_TABLE as u16));
                let name =
                    cstr_to_string(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_NAME as u16));
                let prio = sys::nftnl_chain_get_s32(c, sys::NFTNL_CHAIN_PRIO as u16);
                if !(family == "inet" && ours(&table)) {
                    out.push(format!("{family} {table} {name} (priority {prio})"));
                }
            }
            sys::nftnl_chain_free(c);
        }
    })
    .map_err(io("dumping the nftables chains"))?;
    Ok(out)
}
