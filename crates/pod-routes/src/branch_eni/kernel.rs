//! The branch ENI rules in the calling thread's network namespace, over rtnetlink (the node's:
//! callers enter it first, `redirect::branch_eni`): the `tcp_early_demux` gate, detection, and
//! Istio's `addBranchENIRules` / `delBranchENIRules`.

use super::{BranchEni, ProbeRule, forward_rule, parse_route, parse_rule, return_rule, rule_body};
use crate::RouteError;
use std::io;
use std::net::IpAddr;

/// The sysctl of the calling thread's namespace (`/proc/sys/net` follows the reader's
/// namespace, whichever procfs mount it is read through).
const EARLY_DEMUX: &str = "/proc/sys/net/ipv4/tcp_early_demux";

fn err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RouteError {
    let what = what.into();
    move |source| RouteError { what, source }
}

fn socket() -> Result<std::os::fd::OwnedFd, RouteError> {
    crate::route_socket().map_err(err("opening an rtnetlink socket"))
}

/// Whether `net.ipv4.tcp_early_demux` is 0 in this namespace (Istio's gate; an error: the
/// caller assumes the default, 1).
pub fn tcp_early_demux_disabled() -> io::Result<bool> {
    std::fs::read(EARLY_DEMUX).map(|b| super::early_demux_disabled(&b))
}

/// Istio's `detectBranchENI` (the gate is the caller's): the rules of `pod`'s family and every
/// table's routes of that family, read here; devices named in this namespace.
pub fn detect(pod: IpAddr) -> Result<Option<BranchEni>, RouteError> {
    let family = if pod.is_ipv6() {
        libc::AF_INET6 as u8
    } else {
        libc::AF_INET as u8
    };
    let sock = socket()?;
    let rules: Vec<_> = crate::dump(&sock, libc::RTM_GETRULE, family)
        .map_err(err("listing the policy routing rules"))?
        .iter()
        .filter_map(|b| parse_rule(b))
        .collect();
    // No iif rule in a table of its own: no branch ENI pod on this node, no route dump.
    if !rules.iter().any(|r| r.iif.is_some()) {
        return Ok(None);
    }
    let routes: Vec<_> = crate::dump(&sock, libc::RTM_GETROUTE, family)
        .map_err(err("listing the routes"))?
        .iter()
        .filter_map(|b| parse_route(b))
        .collect();
    let name = |index: u32| {
        nix::net::if_::if_indextoname(index)
            .ok()
            .map(|n| n.to_string_lossy().into_owned())
    };
    Ok(super::detect(pod, &rules, &routes, name))
}

fn add_rule(sock: &std::os::fd::OwnedFd, rule: &ProbeRule) -> io::Result<bool> {
    let flags = (libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16;
    match crate::request_tolerating(sock, libc::RTM_NEWRULE, flags, &rule_body(rule), &[]) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

fn del_rule(sock: &std::os::fd::OwnedFd, rule: &ProbeRule) -> io::Result<()> {
    let gone = [libc::ENOENT, libc::ESRCH];
    crate::request_tolerating(sock, libc::RTM_DELRULE, 0, &rule_body(rule), &gone)
}

/// Istio's `addBranchENIRules`: the forward rule, then the return rule; a rule already there
/// counts as added (idempotent). When the return rule fails, a forward rule added by this call
/// is taken back (a failure to take it back is part of the error).
pub fn add(pod: IpAddr, eni: &BranchEni) -> Result<(), RouteError> {
    let sock = socket()?;
    let forward = forward_rule(pod, eni);
    let added = add_rule(&sock, &forward).map_err(err(format!(
        "adding the forward ip rule `{}` for branch ENI pod {pod}",
        forward.describe()
    )))?;
    let ret = return_rule(pod, eni);
    if let Err(source) = add_rule(&sock, &ret) {
        let mut what = format!(
            "adding the return ip rule `{}` for branch ENI veth {}",
            ret.describe(),
            eni.veth
        );
        if added && let Err(e) = del_rule(&sock, &forward) {
            what += &format!(" (rolling back the forward rule of pod {pod} also failed: {e})");
        }
        return Err(RouteError { what, source });
    }
    Ok(())
}

/// Istio's `delBranchENIRules`: both rules removed, each tried; a rule not there is not an
/// error. Returns what failed (Istio logs each at debug level).
pub fn remove(pod: IpAddr, eni: &BranchEni) -> Vec<RouteError> {
    let sock = match socket() {
        Ok(s) => s,
        Err(e) => return vec![e],
    };
    let mut failed = Vec::new();
    for rule in [forward_rule(pod, eni), return_rule(pod, eni)] {
        if let Err(e) = del_rule(&sock, &rule) {
            failed.push(err(format!("removing the ip rule `{}`", rule.describe()))(
                e,
            ));
        }
    }
    failed
}
