//! Ambient's host rule with iptables-legacy, as Istio's node agent builds it on iptables
//! nodes: the ipsets `istio-inpod-probes-v4/v6` (`hash:ip`, one element per ambient pod IP,
//! commented with the pod's UID, as Istio's `cni/pkg/ipset`) and `nat ISTIO_POSTRT`, jumped to
//! first in `POSTROUTING`, SNATing probes to them to 169.254.7.127 (payload byte-identical to
//! Istio's `hostprobe` goldens with `capture::ProbeSource::AnyLocalSocket`). The same calls
//! as `nft_backend::ambient_host`; `sync_pods_ips` is Istio's startup prune of the sets
//! (`pruneHostIPset`), one `ipset restore` per sync.
//!
//! Every function works in the calling thread's network namespace, the node's own (enter it
//! first when it is not the caller's). In it, only `ISTIO_POSTRT` and the jumps to it are
//! ours: kube-proxy's chains and any other `ISTIO_*` chain are never touched. Each call takes
//! the namespace's lock ([`netns::NsLock`]), so calls of ours never interleave; the restores
//! also take the node-wide xtables lock kubelet and kube-proxy use
//! ([`Tools::node_xtables_lock`]).
//!
//! Order, so a failure never leaves a rule naming a missing set: sets are created before the
//! rule (iptables refuses a rule naming a missing set) and destroyed after it.

use crate::save::{Owns, SavedTable};
use crate::tools::{Fam, IPSET};
use crate::{
    LegacyError, Tools, check_owned, live_tables, removal_owned, render_payload,
    tables_instantiated, with_removal,
};
use capture::ambient_constants::{PROBE_SET_V4, PROBE_SET_V6};
use capture::{ChainId, NamedSet, Plan};
use netns::NsLock;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long a call waits for the node namespace's lock (other calls of ours hold it for a few
/// ms; a restore waiting for kube-proxy's xtables lock, up to its `-w 30`).
pub const LOCK_WAIT: Duration = Duration::from_secs(35);

/// The longest comment an ipset element takes (the kernel's `IPSET_MAX_COMMENT_SIZE`).
const MAX_COMMENT: usize = 255;

/// The only chain of ours in the node's namespace.
fn is_host_chain(chain: &str) -> bool {
    chain == ChainId::IstioPostrouting.iptables_name()
}

const HOST: Owns = Owns {
    chain: is_host_chain,
    builtin_shapes: false,
};

/// Creates the plan's sets if missing, then writes the rule: an existing rule of ours is
/// removed and the new one written in the same restore, one per family (atomic per table).
/// Set elements already there stay. A set the plan no longer has (IPv6 turned off) is
/// destroyed after the rule that used it.
/// Every binary is located first: a missing one (`ipset` included) changes nothing and
/// creates no iptables table.
pub fn ensure(plan: &Plan, tools: &Tools) -> Result<(), LegacyError> {
    tools.find(IPSET)?;
    let payloads: Vec<(Fam, String)> = [Fam::V4, Fam::V6]
        .into_iter()
        .map(|fam| (fam, render_payload(plan, fam == Fam::V6)))
        .collect();
    for (fam, payload) in &payloads {
        if !payload.is_empty() {
            tools.find(fam.restore())?;
            tools.find(fam.save())?;
        }
    }
    let held = lock()?;
    tools.ipset(&["restore"], Some(&create_sets(&plan.sets)))?;
    for (fam, payload) in &payloads {
        let live = host_tables(tools, *fam)?;
        let input = with_removal(payload, &removal_owned(&live, &[], HOST));
        if !input.is_empty() {
            tools.restore_on_node(*fam, &input, &held)?;
        }
    }
    let unplanned: Vec<&str> = [PROBE_SET_V4, PROBE_SET_V6]
        .into_iter()
        .filter(|s| !plan.sets.iter().any(|p| p.name == *s))
        .collect();
    destroy_sets(tools, &unplanned)?;
    tracing::debug!(sets = ?plan.sets.iter().map(|s| &s.name).collect::<Vec<_>>(), "iptables-legacy host probe rule written");
    Ok(())
}

/// Adds a pod's IPs to the plan's sets (IPv4, and IPv4-mapped IPv6, to the v4 set; IPv6 to
/// the v6 set, skipped when the plan has none), each element commented with `pod_uid`. One
/// `ipset restore`; an IP already there is not an error (its comment is updated).
pub fn add_pod_ips(
    plan: &Plan,
    ips: &[IpAddr],
    pod_uid: &str,
    tools: &Tools,
) -> Result<(), LegacyError> {
    add_pods_ips(plan, &[(pod_uid, ips)], tools)
}

/// [`add_pod_ips`] of many pods (`(pod UID, its IPs)`) in one `ipset restore`.
pub fn add_pods_ips(
    plan: &Plan,
    pods: &[(&str, &[IpAddr])],
    tools: &Tools,
) -> Result<(), LegacyError> {
    let mut input = String::new();
    for (uid, ips) in pods {
        check_uid(uid)?;
        for (set, ip) in elements(plan, ips) {
            input += &format!("add {set} {ip} comment \"{uid}\" -exist\n");
        }
    }
    if input.is_empty() {
        return Ok(());
    }
    tools.find(IPSET)?;
    let _held = lock()?;
    tools.ipset(&["restore"], Some(&input)).map(drop)
}

/// The addresses in the plan's sets (a set that is not there holds none).
pub fn pod_ips(plan: &Plan, tools: &Tools) -> Result<Vec<IpAddr>, LegacyError> {
    tools.find(IPSET)?;
    let _held = lock()?;
    Ok(live_members(plan, tools)?
        .into_iter()
        .map(|(_, ip)| ip)
        .collect())
}

/// Makes the plan's sets hold exactly the addresses of `pods` (`(pod UID, its IPs)`): each
/// added (or its comment updated) with its pod's UID, every other one removed, in one `ipset
/// restore` (after one `ipset save` per set to read them). Returns the addresses removed.
pub fn sync_pods_ips(
    plan: &Plan,
    pods: &[(&str, &[IpAddr])],
    tools: &Tools,
) -> Result<Vec<IpAddr>, LegacyError> {
    let mut input = String::new();
    let mut wanted: Vec<(&str, IpAddr)> = Vec::new();
    for (uid, ips) in pods {
        check_uid(uid)?;
        for (set, ip) in elements(plan, ips) {
            input += &format!("add {set} {ip} comment \"{uid}\" -exist\n");
            wanted.push((set, ip));
        }
    }
    tools.find(IPSET)?;
    let _held = lock()?;
    let stale: Vec<(String, IpAddr)> = live_members(plan, tools)?
        .into_iter()
        .filter(|(set, ip)| !wanted.contains(&(set.as_str(), *ip)))
        .collect();
    for (set, ip) in &stale {
        input += &format!("del {set} {ip} -exist\n");
    }
    if !input.is_empty() {
        tools.ipset(&["restore"], Some(&input))?;
    }
    Ok(stale.into_iter().map(|(_, ip)| ip).collect())
}

/// Every member of the plan's sets that exist, with its set (the lock held by the caller).
fn live_members(plan: &Plan, tools: &Tools) -> Result<Vec<(String, IpAddr)>, LegacyError> {
    let existing = existing_sets(tools)?;
    let mut out = Vec::new();
    for set in plan.sets.iter().filter(|s| existing.contains(&s.name)) {
        let members = crate::live::ipset_members(tools, &set.name)?;
        out.extend(members.into_iter().map(|m| (set.name.clone(), m.addr)));
    }
    Ok(out)
}

/// Removes IPs from the plan's sets. IPs (or sets) that are not there are ignored (a DEL may
/// repeat).
pub fn remove_pod_ips(plan: &Plan, ips: &[IpAddr], tools: &Tools) -> Result<(), LegacyError> {
    let elements = elements(plan, ips);
    if elements.is_empty() {
        return Ok(());
    }
    tools.find(IPSET)?;
    let _held = lock()?;
    let existing = existing_sets(tools)?;
    let input: String = elements
        .iter()
        .filter(|(set, _)| existing.iter().any(|e| e == set))
        .map(|(set, ip)| format!("del {set} {ip} -exist\n"))
        .collect();
    if input.is_empty() {
        return Ok(());
    }
    tools.ipset(&["restore"], Some(&input)).map(drop)
}

/// Differences between the node's host rule and `plan` (empty: in sync), as readable lines:
/// `ISTIO_POSTRT`, the jump to it and the plan's sets (their elements are the agent's to
/// keep, not compared). Other chains, `ISTIO_*` or not, are not looked at.
pub fn check(plan: &Plan, tools: &Tools) -> Result<Vec<String>, LegacyError> {
    tools.find(IPSET)?;
    let _held = lock()?;
    let existing = existing_sets(tools)?;
    let mut drift: Vec<String> = plan
        .sets
        .iter()
        .filter(|s| !existing.contains(&s.name))
        .map(|s| format!("ipset {}: missing set", s.name))
        .collect();
    // The plan's rule names the sets: they must exist where its canonical form is made.
    let create = create_sets(&plan.sets);
    let prepare = || tools.ipset(&["restore"], Some(&create)).map(drop);
    drift.extend(check_owned(plan, tools, HOST, &prepare)?);
    Ok(drift)
}

/// Removes the rule and the jump to it (both families), then destroys both sets. Returns
/// whether any of them existed. Without an `ipset` binary, only a node where a rule of ours
/// was found is an error (its sets must go too); elsewhere there is nothing to remove.
pub fn remove_all(tools: &Tools) -> Result<bool, LegacyError> {
    let held = lock()?;
    let mut any = false;
    for fam in [Fam::V4, Fam::V6] {
        let live = host_tables(tools, fam)?;
        let removal = removal_owned(&live, &[], HOST);
        if !removal.is_empty() {
            tools.restore_on_node(fam, &with_removal("", &removal), &held)?;
            any = true;
        }
    }
    match tools.find(IPSET) {
        Ok(_) => {}
        Err(_) if !any => return Ok(false),
        Err(e) => return Err(e),
    }
    any |= destroy_sets(tools, &[PROBE_SET_V4, PROBE_SET_V6])?;
    Ok(any)
}

/// The node namespace's lock (see the module doc).
fn lock() -> Result<NsLock, LegacyError> {
    Ok(NsLock::current(
        &"(the node's network namespace)",
        Instant::now() + LOCK_WAIT,
    )?)
}

/// The family's live tables; none (and no process) when legacy iptables was never used here.
fn host_tables(tools: &Tools, fam: Fam) -> Result<Vec<SavedTable>, LegacyError> {
    if tables_instantiated(fam)? {
        live_tables(tools, fam)
    } else {
        Ok(Vec::new())
    }
}

/// `ipset restore` input creating the sets as Istio's `cni/pkg/ipset` does.
fn create_sets(sets: &[NamedSet]) -> String {
    sets.iter()
        .map(|s| {
            let family = if s.v6 { "inet6" } else { "inet" };
            format!("create {} hash:ip family {family} comment -exist\n", s.name)
        })
        .collect()
}

/// Destroys those of `names` that exist. Returns whether any did. Each is emptied first: the
/// kernel refuses to destroy a set another rule (not ours) still uses, and an address left in
/// it would have a later pod's probes SNATed once the address is reused.
fn destroy_sets(tools: &Tools, names: &[&str]) -> Result<bool, LegacyError> {
    let existing = existing_sets(tools)?;
    let mut any = false;
    for name in names.iter().filter(|n| existing.iter().any(|e| e == *n)) {
        tools.ipset(&["flush", name], None)?;
        tools.ipset(&["destroy", name], None)?;
        any = true;
    }
    Ok(any)
}

/// The names of the namespace's ipsets.
fn existing_sets(tools: &Tools) -> Result<Vec<String>, LegacyError> {
    Ok(tools
        .ipset(&["list", "-n"], None)?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// Each IP with the plan's set it belongs to (IPv4-mapped IPv6 counts as IPv4, as Istio's
/// `Unmap`); IPs of a family the plan has no set for are skipped.
fn elements<'p>(plan: &'p Plan, ips: &[IpAddr]) -> Vec<(&'p str, IpAddr)> {
    ips.iter()
        .map(|ip| ip.to_canonical())
        .filter_map(|ip| {
            let set = plan.sets.iter().find(|s| s.v6 == ip.is_ipv6())?;
            Some((set.name.as_str(), ip))
        })
        .collect()
}

/// A pod UID is written into `ipset restore` input as a quoted comment: it must not end the
/// quote or the line, and must fit the kernel's comment size.
fn check_uid(uid: &str) -> Result<(), LegacyError> {
    let reason = if uid.len() > MAX_COMMENT {
        "longer than 255 bytes"
    } else if uid.contains('"') {
        "contains a double quote"
    } else if uid.chars().any(char::is_control) {
        "contains a control character"
    } else {
        return Ok(());
    };
    Err(LegacyError::PodUid {
        uid: uid.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use capture::{HostProbeConfig, ProbeSource};

    fn plan(ipv6: bool) -> Plan {
        HostProbeConfig::default_plan(ProbeSource::AnyLocalSocket, ipv6)
    }

    #[test]
    fn sets_are_created_like_istio() {
        assert_eq!(
            create_sets(&plan(true).sets),
            "create istio-inpod-probes-v4 hash:ip family inet comment -exist\n\
             create istio-inpod-probes-v6 hash:ip family inet6 comment -exist\n"
        );
    }

    #[test]
    fn ips_go_to_their_familys_set() {
        let ips: Vec<IpAddr> = ["10.0.0.1", "fd00::1", "::ffff:10.0.0.2"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let dual = plan(true);
        let both = elements(&dual, &ips);
        let shown: Vec<String> = both.iter().map(|(s, ip)| format!("{s} {ip}")).collect();
        assert_eq!(
            shown,
            [
                "istio-inpod-probes-v4 10.0.0.1",
                "istio-inpod-probes-v6 fd00::1",
                "istio-inpod-probes-v4 10.0.0.2"
            ]
        );
        assert_eq!(
            elements(&plan(false), &ips).len(),
            2,
            "no v6 set: v6 skipped"
        );
    }

    #[test]
    fn uids_that_break_the_comment_are_refused() {
        assert!(check_uid("0b3c9a2e-1f7d-4a55-9c0e-2d8f4b6a1c3e").is_ok());
        for bad in ["a\"b", "a\nb", "a\tb", &"x".repeat(256)] {
            let err = check_uid(bad).unwrap_err().to_string();
            assert!(err.contains("ipset comment"), "{err}");
        }
        assert!(check_uid(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn only_the_host_chain_is_ours_on_the_node() {
        let live = crate::save::parse(
            "*nat\n:POSTROUTING ACCEPT [0:0]\n:ISTIO_POSTRT - [0:0]\n:ISTIO_OTHER - [0:0]\n:KUBE-POSTROUTING - [0:0]\n-A POSTROUTING -j ISTIO_POSTRT\n-A POSTROUTING -j KUBE-POSTROUTING\n-A POSTROUTING -j ISTIO_OTHER\n-A ISTIO_POSTRT -j RETURN\nCOMMIT\n",
        );
        let r = removal_owned(&live, &[], HOST);
        assert_eq!(
            r["nat"],
            [
                "-D POSTROUTING -j ISTIO_POSTRT",
                "-F ISTIO_POSTRT",
                "-X ISTIO_POSTRT"
            ]
        );
    }
}
