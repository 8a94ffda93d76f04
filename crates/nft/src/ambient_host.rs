//! Ambient's host rule, in the node's own network namespace: kubelet's probes to ambient pods
//! are SNATed to the probe address (169.254.7.127) so the pod's rules let them reach the app
//! without ztunnel. `inet istio-ambient-nat` holds the rule and two named sets of ambient pod
//! IPs (`istio-inpod-probes-v4/v6`); pods come and go as small set-element batches, and the
//! rule is (re)written without touching the elements.
//!
//! Typical use by the node agent: `ensure(&plan)` at start (plan from
//! `capture::Plan::ambient_host` with `kubelet_uid`), `add_pod_ips` / `remove_pod_ips` per
//! pod, `sync_pods_ips` on each reconcile pass (the sets made exactly the served pods'
//! addresses: what a missed DEL left is pruned), `remove_all` when the last ambient pod is gone
//! and on uninstall.

use crate::{NftError, batch, io_err, netlink, open_err};
use capture::{NamedSet, Plan, Table};
use std::io;
use std::net::IpAddr;
use std::path::Path;

/// Creates the host table, its sets and chains if missing and replaces its rules with the
/// plan's, in one atomic batch; set elements already there stay.
pub fn ensure(plan: &Plan) -> Result<(), NftError> {
    let sock = netlink::Socket::open().map_err(open_err)?;
    let built = batch::ensure(plan, false);
    let nacks = sock
        .send_batch(&built.batch, false)
        .map_err(io_err("sending the nftables batch"))?;
    if let Some(first) = nacks.first() {
        let described = batch::ensure(plan, true);
        return Err(NftError::Refused {
            what: described.describe(first.seq),
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
        send(sock, &batch::set_elements(&msg, true), &set.name)
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
        match send(
            sock,
            &batch::set_elements(&msg(keys.clone()), false),
            &set.name,
        ) {
            // One of them was not there: the batch did nothing; remove them one by one.
            Err(NftError::Refused { source, .. })
                if source.raw_os_error() == Some(libc::ENOENT) =>
            {
                for k in keys {
                    match send(sock, &batch::set_elements(&msg(vec![k]), false), &set.name) {
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
    match crate::check::set_elements(sock, set.table.nft_name(), &set.name) {
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

/// Why the kubelet's uid could not be found.
#[derive(Debug, thiserror::Error)]
pub enum KubeletUidError {
    #[error("reading {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        source: io::Error,
    },
    #[error("no kubelet process (kubelet, kubelite or k3s) found in {0}")]
    NotFound(std::path::PathBuf),
}

/// Processes that host the kubelet, in Istio's order (`kubeletuid_linux.go`): the name in
/// `/proc/<pid>/comm`, and whether an argument must contain "kubelet" (k3s embeds it).
const KUBELET_PROCESSES: [(&str, bool); 3] =
    [("kubelet", true), ("kubelite", true), ("k3s", false)];

/// The uid of the kubelet process, found through `proc_root` (the host's /proc; in the
/// agent's container usually `/host/proc`) as Istio does: the first process whose `comm` is
/// `kubelet` or `kubelite` with "kubelet" in an argument, or `k3s`; its real uid.
pub fn kubelet_uid(proc_root: &Path) -> Result<u32, KubeletUidError> {
    let entries = std::fs::read_dir(proc_root).map_err(|source| KubeletUidError::Read {
        path: proc_root.to_path_buf(),
        source,
    })?;
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let dir = proc_root.join(pid.to_string());
        // Processes may exit while we look: unreadable ones are skipped, as in Istio.
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let read_cmdline = || std::fs::read(dir.join("cmdline")).ok();
        if !is_kubelet(comm.trim_end_matches('\n'), read_cmdline) {
            continue;
        }
        if let Some(uid) = std::fs::read_to_string(dir.join("status"))
            .ok()
            .and_then(|s| real_uid(&s))
        {
            return Ok(uid);
        }
    }
    Err(KubeletUidError::NotFound(proc_root.to_path_buf()))
}

fn is_kubelet(comm: &str, cmdline: impl FnOnce() -> Option<Vec<u8>>) -> bool {
    let Some(&(_, need_arg)) = KUBELET_PROCESSES.iter().find(|(name, _)| *name == comm) else {
        return false;
    };
    !need_arg
        || cmdline().is_some_and(|c| {
            c.split(|b| *b == 0).any(|arg| {
                String::from_utf8_lossy(arg)
                    .to_lowercase()
                    .contains("kubelet")
            })
        })
}

/// The real uid from `/proc/<pid>/status` (`Uid:\treal\teffective\tsaved\tfs`).
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(procs: &[(u32, &str, &str, u32)]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kubelet-uid-{}-{}",
            std::process::id(),
            procs.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for (pid, comm, cmdline, uid) in procs {
            let p = dir.join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(p.join("cmdline"), cmdline.replace(' ', "\0")).unwrap();
            std::fs::write(
                p.join("status"),
                format!("Name:\t{comm}\nUid:\t{uid}\t0\t0\t0\nGid:\t0\t0\t0\t0\n"),
            )
            .unwrap();
        }
        std::fs::write(dir.join("uptime"), "1 1").unwrap();
        dir
    }

    #[test]
    fn finds_kubelet_like_istio() {
        let proc = fake_proc(&[
            (1, "systemd", "/sbin/init", 0),
            // A process named kubelet without "kubelet" in its arguments is not it.
            (7, "kubelet", "/opt/x --flag", 5),
            (
                42,
                "kubelet",
                "/usr/bin/kubelet --config=/var/lib/kubelet/config.yaml",
                1234,
            ),
        ]);
        assert_eq!(kubelet_uid(&proc).unwrap(), 1234);
        let k3s = fake_proc(&[(9, "bash", "bash", 0), (10, "k3s", "k3s agent", 77)]);
        assert_eq!(kubelet_uid(&k3s).unwrap(), 77);
        let none = fake_proc(&[
            (3, "containerd", "containerd", 0),
            (4, "sshd", "sshd", 0),
            (5, "x", "x", 0),
            (6, "y", "y", 0),
        ]);
        assert!(matches!(
            kubelet_uid(&none),
            Err(KubeletUidError::NotFound(_))
        ));
        for d in [proc, k3s, none] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    #[test]
    fn real_uid_is_the_first_field() {
        assert_eq!(
            real_uid("Name:\tx\nUid:\t1000\t1001\t1002\t1003\n"),
            Some(1000)
        );
        assert_eq!(real_uid("Name:\tx\n"), None);
    }
}
