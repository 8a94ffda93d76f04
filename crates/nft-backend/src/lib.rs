//! nftables backend: a capture `Plan` as ONE netlink batch (libnftnl + libmnl), committed
//! atomically by the kernel in the current network namespace (enter it with the `netns` crate).
//!
//! - Fresh namespace: the batch only creates (no delete/flush, which would cost a 5–24 ms
//!   kernel wait when the socket closes).
//! - Our tables already there: the same batch deletes and re-creates them, so the namespace
//!   goes from the old rules to the new ones in one step.
//! - Tables of others are never touched.

pub mod ambient_host;
mod batch;
mod check;
pub mod expr;
mod ir_exprs;
mod model;
pub mod netlink;
mod read;
#[doc(hidden)]
pub mod testing;

use capture::{Plan, Table};
use mnl_impl as _; // links our Rust libmnl (mnl_* for libnftnl.a and the mnl crate)
use std::io;

pub use model::{expand_for_nft, render_text};

/// A read-only view of the live nftables state, for tools that read it rather than program
/// it (the `explain` crate): a netfilter netlink socket, the table list, and the text and
/// attributes of dumped objects.
pub mod live {
    pub use crate::read::{
        chains, cstr_to_string, family_name, msg_type, rule_text, ruleset, set_elements, tables,
    };

    /// A netfilter netlink socket in the calling thread's namespace.
    pub fn socket() -> Result<crate::netlink::Socket, crate::NftError> {
        crate::netlink::Socket::open().map_err(crate::open_err)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        source: io::Error,
    },
    #[error("the kernel refused {what}: {source}")]
    Refused { what: String, source: io::Error },
    #[error("this kernel has no nf_tables support (netlink: {0})")]
    Unsupported(io::Error),
    #[error("policy routing for TPROXY: {0}")]
    Routes(#[from] pod_routes::RouteError),
}

fn io_err(context: &'static str) -> impl FnOnce(io::Error) -> NftError {
    move |source| NftError::Io { context, source }
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    /// Our tables existed and were replaced atomically.
    pub replaced: bool,
    /// Netlink messages in the batch.
    pub messages: usize,
}

/// Programs `plan` into the current network namespace in one atomic batch, then TPROXY's
/// policy routes. If the routes fail, the tables are removed again: no half-programmed pod.
pub fn apply(plan: &Plan) -> Result<ApplyReport, NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    // Hot path (CNI ADD into a fresh namespace): create-only, tables exclusive. Only if one of
    // our tables already exists do we look at what is there and replace it.
    let mut built = batch::build(plan, &[]);
    let mut nacks = sock
        .send_batch(&built.batch, true)
        .map_err(io_err("sending the nftables batch"))?;
    let mut replaced = false;
    if nacks.iter().any(|n| n.errno == libc::EEXIST) {
        let existing = our_tables(&sock, plan.owned_tables())?;
        built = batch::build(plan, &existing);
        nacks = sock
            .send_batch(&built.batch, false)
            .map_err(io_err("sending the nftables batch"))?;
        replaced = true;
    }
    if let Some(first) = nacks.first() {
        return Err(NftError::Refused {
            what: built.describe(first.seq),
            source: io::Error::from_raw_os_error(first.errno),
        });
    }
    let messages = built.messages;
    drop(sock);
    if let Err(e) = pod_routes::apply(plan) {
        let _ = cleanup();
        return Err(e.into());
    }
    Ok(ApplyReport { replaced, messages })
}

fn open_err(e: io::Error) -> NftError {
    if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) {
        NftError::Unsupported(e)
    } else {
        NftError::Io {
            context: "opening a netfilter netlink socket",
            source: e,
        }
    }
}

/// Differences between the live tables and `plan`, as readable lines (empty = in sync).
pub fn check(plan: &Plan) -> Result<Vec<String>, NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    check::diff(&sock, plan)
}

/// Deletes our tables (only ours) and TPROXY's routes. Returns whether any table existed.
pub fn cleanup() -> Result<bool, NftError> {
    cleanup_tables(&Table::ALL)
}

/// Deletes ambient's in-pod tables (`inet istio-ambient-{nat,mangle,raw}`), nothing else.
/// Returns whether any existed. (In the host namespace use `ambient_host::remove_all`.)
/// Also removes ambient's policy routing (`fwmark 0x111/0xfff lookup 100` and table 100's
/// local default), as Istio's `DeleteInpodRules` does: a pod leaving ambient keeps running.
pub fn cleanup_ambient() -> Result<bool, NftError> {
    let existed = cleanup_tables(&Table::AMBIENT)?;
    let every_family = capture::AmbientConfig {
        ipv6: true,
        ..capture::AmbientConfig::default()
    };
    if let Some(r) = Plan::ambient(&every_family)
        .ok()
        .and_then(|p| p.tproxy_routes)
    {
        pod_routes::remove(&r)?;
    }
    Ok(existed)
}

pub(crate) fn cleanup_tables(tables: &[Table]) -> Result<bool, NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    let existing = our_tables(&sock, tables)?;
    if !existing.is_empty() {
        let b = batch::delete(&existing);
        let nacks = sock
            .send_batch(&b, false)
            .map_err(io_err("sending the nftables batch"))?;
        if let Some(n) = nacks.first() {
            return Err(NftError::Refused {
                what: "deleting our tables".into(),
                source: io::Error::from_raw_os_error(n.errno),
            });
        }
    }
    Ok(!existing.is_empty())
}

/// Whether any of our tables exist in the current namespace.
pub fn has_our_tables() -> Result<bool, NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    Ok(!our_tables(&sock, &Table::ALL)?.is_empty())
}

/// Every nftables table in the current namespace as `(family, name)`.
pub fn list_tables() -> Result<Vec<(String, String)>, NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    read::tables(&sock)
}

/// Whether the kernel speaks nf_tables (a table dump succeeds).
pub fn kernel_supports_nftables() -> bool {
    list_tables().is_ok()
}

fn our_tables(sock: &netlink::Socket, ours: &[Table]) -> Result<Vec<Table>, NftError> {
    let all = read::tables(sock)?;
    Ok(ours
        .iter()
        .copied()
        .filter(|t| all.iter().any(|(f, n)| f == "inet" && n == t.nft_name()))
        .collect())
}
