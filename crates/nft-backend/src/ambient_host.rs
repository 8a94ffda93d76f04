//! Ambient's host rule, in the node's own network namespace: kubelet's probes to ambient pods
//! are SNATed to the probe address (169.254.7.127) so the pod's rules let them reach the app
//! without ztunnel. `inet istio-ambient-nat` holds the rule and two named sets of ambient pod
//! IPs (`istio-inpod-probes-v4/v6`); pods come and go as small set-element batches, and the
//! rule is (re)written without touching the elements.
//!
//! Typical use by the node agent: `ensure(&plan)` at start (plan from
//! `capture::Plan::ambient_host` with the kubelet's uid, `node_view::kubelet::kubelet_uid`),
//! `add_pod_ips` / `remove_pod_ips` per pod, `sync_pods_ips` on each reconcile pass (the sets
//! made exactly the served pods' addresses: what a missed DEL left is pruned), `remove_all`
//! when the last ambient pod is gone and on uninstall.

use crate::{NftError, batch, io_err, netlink, open_err};
use capture::{NamedSet, Plan, Table};
use std::io;
use std::net::IpAddr;

/// Creates the host table, its sets and chains if missing and replaces its rules with the
/// plan's, in one atomic batch; set elements already there stay.
pub fn ensure(plan: &Plan) -> Result<(), NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    let built = batch::ensure(plan);
    let nacks = sock
        .send_batch(&built.batch, false)
        .map_err(io_err("sending the nftables batch"))?;
    if let Some(first) = nacks.first() {
        return Err(NftError::Refused {
            what: built.describe(first.seq),
            source: io::Error::from_raw_os_error(first.errno),
        });
    }
    Ok(())
}

/// Adds a pod's IPs to the plan's sets (IPv4 to the v4 set; IPv6 to the v6 set, skipped when
/// the plan has none, i.e. IPv6 off, as Istio does), each element commented with `pod_uid`.
/// One atomic batch per set; adding an IP that is there already is not an error.
pub fn add_pod_ips(plan: &Plan, ips: &[IpAddr], pod_uid: &str) -> Result<(), NftError> {
    for_each_set(plan, ips, |sock, set, keys| {
        let msg = batch::SetElements {
            table: set.table.nft_name(),
            set: &set.name,
            elements: keys
                .into_iter()
                .map(|k| (k, Some(pod_uid.to_string())))
                .collect(),
        };
        send(sock, &batch::add_elements(&msg), &set.name)
    })
}

/// Removes IPs from the plan's sets. IPs that are not there are ignored (a DEL may repeat).
pub fn remove_pod_ips(plan: &Plan, ips: &[IpAddr]) -> Result<(), NftError> {
    for_each_set(plan, ips, |sock, set, keys| {
        let msg = |keys: Vec<Vec<u8>>| batch::SetElements {
            table: set.table.nft_name(),
            set: &set.name,
            elements: keys.into_iter().map(|k| (k, None)).collect(),
        };
        match send(sock, &batch::remove_elements(&msg(keys.clone())), &set.name) {
            // One of them was not there: the batch did nothing; remove them one by one.
            Err(NftError::Refused { source, .. })
                if source.raw_os_error() == Some(libc::ENOENT) =>
            {
                for k in keys {
                    match send(sock, &batch::remove_elements(&msg(vec![k])), &set.name) {
                        Err(NftError::Refused { source, .. })
                            if source.raw_os_error() == Some(libc::ENOENT) => {}
                        other => other?,
                    }
                }
                Ok(())
            }
            other => other,
        }
    })
}

/// The addresses in the plan's sets (a set that is not there holds none).
pub fn pod_ips(plan: &Plan) -> Result<Vec<IpAddr>, NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    let mut out = Vec::new();
    for set in &plan.sets {
        out.extend(live_keys(&sock, set)?.iter().filter_map(|k| key_ip(k)));
    }
    Ok(out)
}

/// Makes the plan's sets hold exactly the addresses of `pods` (`(pod UID, its IPs)`): the
/// missing ones added, commented with their pod's UID, every other one removed, in one atomic
/// batch. Returns the addresses removed.
pub fn sync_pods_ips(plan: &Plan, pods: &[(&str, &[IpAddr])]) -> Result<Vec<IpAddr>, NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    let (mut add, mut del, mut removed) = (Vec::new(), Vec::new(), Vec::new());
    for set in &plan.sets {
        let live = live_keys(&sock, set)?;
        let mut wanted: Vec<(Vec<u8>, Option<String>)> = Vec::new();
        for (uid, ips) in pods {
            for key in set_keys(set, ips) {
                if !wanted.iter().any(|(k, _)| *k == key) {
                    wanted.push((key, Some(uid.to_string())));
                }
            }
        }
        let stale: Vec<(Vec<u8>, Option<String>)> = live
            .iter()
            .filter(|k| !wanted.iter().any(|(w, _)| w == *k))
            .map(|k| (k.clone(), None))
            .collect();
        removed.extend(stale.iter().filter_map(|(k, _)| key_ip(k)));
        wanted.retain(|(k, _)| !live.contains(k));
        let msg = |elements| batch::SetElements {
            table: set.table.nft_name(),
            set: &set.name,
            elements,
        };
        if !wanted.is_empty() {
            add.push(msg(wanted));
        }
        if !stale.is_empty() {
            del.push(msg(stale));
        }
    }
    if add.is_empty() && del.is_empty() {
        return Ok(removed);
    }
    let names: Vec<&str> = plan.sets.iter().map(|s| s.name.as_str()).collect();
    send(
        &sock,
        &batch::set_elements_sync(&add, &del),
        &names.join(", "),
    )?;
    Ok(removed)
}

/// The keys in one of the plan's sets; none when the set (or its table) is not there.
fn live_keys(sock: &netlink::Socket, set: &NamedSet) -> Result<Vec<Vec<u8>>, NftError> {
    match crate::read::set_elements(sock, set.table.nft_name(), &set.name) {
        Ok(elements) => Ok(elements.into_iter().map(|(k, _)| k).collect()),
        Err(NftError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
            Ok(Vec::new())
        }
        Err(e) => Err(e),
    }
}

/// A set key as an address (4 bytes: IPv4, 16: IPv6).
fn key_ip(key: &[u8]) -> Option<IpAddr> {
    match key.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(key).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(key).ok()?)),
        _ => None,
    }
}

/// The keys of `ips` that go into `set` (IPv4-mapped IPv6 counts as IPv4).
fn set_keys(set: &NamedSet, ips: &[IpAddr]) -> Vec<Vec<u8>> {
    ips.iter()
        .map(|ip| ip.to_canonical())
        .filter_map(|ip| match ip {
            IpAddr::V4(a) if !set.v6 => Some(a.octets().to_vec()),
            IpAddr::V6(a) if set.v6 => Some(a.octets().to_vec()),
            _ => None,
        })
        .collect()
}

/// Deletes the host table (rule and sets). Returns whether it existed.
pub fn remove_all() -> Result<bool, NftError> {
    crate::cleanup_tables(&[Table::AmbientNat])
}

fn for_each_set(
    plan: &Plan,
    ips: &[IpAddr],
    mut f: impl FnMut(&netlink::Socket, &NamedSet, Vec<Vec<u8>>) -> Result<(), NftError>,
) -> Result<(), NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    for set in &plan.sets {
        let keys = set_keys(set, ips);
        if !keys.is_empty() {
            f(&sock, set, keys)?;
        }
    }
    Ok(())
}

fn send(sock: &netlink::Socket, b: &nftnl::FinalizedBatch, set: &str) -> Result<(), NftError> {
    let nacks = sock
        .send_batch(b, false)
        .map_err(io_err("sending the nftables batch"))?;
    match nacks.first() {
        None => Ok(()),
        Some(n) => Err(NftError::Refused {
            what: format!("the elements of set {set}"),
            source: io::Error::from_raw_os_error(n.errno),
        }),
    }
}
