//! Istio's AWS branch ENI probe routing (`AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`, Istio's
//! `cni/pkg/nodeagent/brancheni_linux.go`). On EKS with Security Groups for Pods, aws-vpc-cni
//! gives a pod a branch ENI: its host route lives only in a table of its own (`<podIP> dev
//! <veth> table T`), reached by `iif <veth> lookup T` rules, and the main table has no route to
//! it, so the node's own traffic to the pod (kubelet's probes, SNATed to 169.254.7.127 by the
//! host probe rule) leaves through the VPC fabric, which drops it. Istio adds two rules per
//! such pod address, as this module computes them:
//!
//! - forward: `to <podIP>/32 (/128) lookup T priority 512` (the node's traffic takes the veth);
//! - return: `iif <veth> lookup local priority P-1`, `P` the priority of aws-vpc-cni's iif rule
//!   (the pod's replies are delivered on the node before that rule sends them to the VPC).
//!
//! Gated on `net.ipv4.tcp_early_demux=0` in the node's namespace (AWS requires it for SGP; the
//! kernel's default is 1): on any other node nothing is looked at. The decision here is pure
//! (rules and routes as read → a branch ENI pod or not; which rules); [`kernel`] reads and
//! writes them over rtnetlink.

pub mod kernel;

use std::net::IpAddr;

/// Istio's forward rule's priority ("what aws-vpc-cni uses for regular veth pods").
pub const FORWARD_PRIORITY: u32 = 512;
/// The kernel's `local` table (the return rule's), `main` and `local` are never aws-vpc-cni's.
pub const LOCAL_TABLE: u32 = 255;
const MAIN_TABLE: u32 = 254;

/// aws-vpc-cni's layout for one branch ENI pod address (Istio's `branchENIRoute`): the table
/// holding its host route, the veth that route goes through, and the priority of
/// aws-vpc-cni's `iif <veth> lookup <table>` rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchEni {
    pub table: u32,
    pub veth: String,
    pub iif_priority: u32,
}

/// A policy rule as read, what detection looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleInfo {
    /// 0 when the kernel reports none (the `local` rule).
    pub priority: u32,
    pub iif: Option<String>,
    pub table: u32,
}

/// A route as read, what detection looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteInfo {
    pub table: u32,
    /// `None`: the default route.
    pub dst: Option<IpAddr>,
    pub dst_len: u8,
    /// The output device's index (`None`: none, e.g. a multipath route).
    pub oif: Option<u32>,
    /// A cached clone (`RTM_F_CLONED`), which Istio's route listing skips.
    pub cloned: bool,
}

/// Whether `/proc/sys/net/ipv4/tcp_early_demux` as read says 0 (Istio: the first byte is `0`).
pub fn early_demux_disabled(sysctl: &[u8]) -> bool {
    sysctl.first() == Some(&b'0')
}

/// Istio's `detectBranchENI` once the gate passed: the rules (of the pod address' family) that
/// have an `iif` and a table other than 0, `main` and `local`; of their tables, the first whose
/// routes hold a host route (/32, /128) to `pod` through a device one of those rules names.
/// `routes` are every table's; `link_name` names a device by index. Tables are tried in the
/// order their first iif rule comes (Istio walks a map: any order; aws-vpc-cni writes one
/// table per pod address).
pub fn detect(
    pod: IpAddr,
    rules: &[RuleInfo],
    routes: &[RouteInfo],
    link_name: impl Fn(u32) -> Option<String>,
) -> Option<BranchEni> {
    let mut tables: Vec<(u32, Vec<(&str, u32)>)> = Vec::new();
    for r in rules {
        let Some(iif) = r.iif.as_deref().filter(|i| !i.is_empty()) else {
            continue;
        };
        if matches!(r.table, 0 | MAIN_TABLE | LOCAL_TABLE) {
            continue;
        }
        match tables.iter_mut().find(|(t, _)| *t == r.table) {
            Some((_, iifs)) => iifs.push((iif, r.priority)),
            None => tables.push((r.table, vec![(iif, r.priority)])),
        }
    }
    for (table, iifs) in &tables {
        let host_routes = routes.iter().filter(|r| {
            r.table == *table && !r.cloned && r.dst == Some(pod) && matches!(r.dst_len, 32 | 128)
        });
        for route in host_routes {
            let Some(dev) = route.oif.and_then(&link_name) else {
                continue;
            };
            if let Some((_, priority)) = iifs.iter().find(|(iif, _)| *iif == dev) {
                return Some(BranchEni {
                    table: *table,
                    veth: dev,
                    iif_priority: *priority,
                });
            }
        }
    }
    None
}

/// One rule Istio adds (`addBranchENIRules`), in the pod address' family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeRule {
    pub v6: bool,
    pub priority: u32,
    /// `to <addr>/32` (/128).
    pub to: Option<IpAddr>,
    pub iif: Option<String>,
    pub table: u32,
}

impl ProbeRule {
    /// As `ip rule` writes it, for logs and errors.
    pub fn describe(&self) -> String {
        let mut s = format!("{}: from all", self.priority);
        if let Some(to) = self.to {
            s += &format!(" to {to}");
        }
        if let Some(iif) = &self.iif {
            s += &format!(" iif {iif}");
        }
        match self.table {
            LOCAL_TABLE => s + " lookup local",
            t => s + &format!(" lookup {t}"),
        }
    }
}

/// The forward rule: `to <pod> lookup <table> priority 512`.
pub fn forward_rule(pod: IpAddr, eni: &BranchEni) -> ProbeRule {
    ProbeRule {
        v6: pod.is_ipv6(),
        priority: FORWARD_PRIORITY,
        to: Some(pod),
        iif: None,
        table: eni.table,
    }
}

/// The return rule: `iif <veth> lookup local`, one priority before aws-vpc-cni's iif rule (0
/// at the least).
pub fn return_rule(pod: IpAddr, eni: &BranchEni) -> ProbeRule {
    ProbeRule {
        v6: pod.is_ipv6(),
        priority: eni.iif_priority.saturating_sub(1),
        to: None,
        iif: Some(eni.veth.clone()),
        table: LOCAL_TABLE,
    }
}

// linux/fib_rules.h and linux/rtnetlink.h values the libc crate lacks.
const FR_ACT_TO_TBL: u8 = 1;
const FRA_DST: u16 = 1;
const FRA_IFNAME: u16 = 3;
const FRA_PRIORITY: u16 = 6;
const FRA_TABLE: u16 = 15;
const RTM_F_CLONED: u32 = 0x200;

fn family(v6: bool) -> u8 {
    if v6 {
        libc::AF_INET6 as u8
    } else {
        libc::AF_INET as u8
    }
}

fn ip_octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn ip_from(family: u8, data: &[u8]) -> Option<IpAddr> {
    match family as i32 {
        libc::AF_INET => Some(IpAddr::from(<[u8; 4]>::try_from(data.get(..4)?).ok()?)),
        libc::AF_INET6 => Some(IpAddr::from(<[u8; 16]>::try_from(data.get(..16)?).ok()?)),
        _ => None,
    }
}

/// The `RTM_NEWRULE`/`RTM_DELRULE` body of `rule` (`fib_rule_hdr`, then its attributes).
pub(crate) fn rule_body(rule: &ProbeRule) -> Vec<u8> {
    let dst_len = match (rule.to, rule.v6) {
        (None, _) => 0,
        (Some(_), false) => 32,
        (Some(_), true) => 128,
    };
    // struct fib_rule_hdr { family, dst_len, src_len, tos, table, res1, res2, action, flags }
    let mut body = vec![family(rule.v6), dst_len, 0, 0, 0, 0, 0, FR_ACT_TO_TBL];
    body.extend_from_slice(&0u32.to_ne_bytes());
    if let Some(to) = rule.to {
        netlink_wire::put_attr(&mut body, FRA_DST, &ip_octets(to));
    }
    if let Some(iif) = &rule.iif {
        let mut name = iif.as_bytes().to_vec();
        name.push(0);
        netlink_wire::put_attr(&mut body, FRA_IFNAME, &name);
    }
    netlink_wire::put_attr(&mut body, FRA_PRIORITY, &rule.priority.to_ne_bytes());
    netlink_wire::put_attr(&mut body, FRA_TABLE, &rule.table.to_ne_bytes());
    body
}

/// A rule dump's body (`fib_rule_hdr`: table at 4; attributes after 12 bytes).
pub(crate) fn parse_rule(body: &[u8]) -> Option<RuleInfo> {
    if body.len() < 12 {
        return None;
    }
    let a = crate::attrs(body, 12);
    let iif = a.iter().find(|(k, _)| *k == FRA_IFNAME).map(|(_, d)| {
        let name = d.split(|b| *b == 0).next().unwrap_or_default();
        String::from_utf8_lossy(name).into_owned()
    });
    Some(RuleInfo {
        priority: crate::attr_u32(&a, FRA_PRIORITY).unwrap_or(0),
        iif,
        table: crate::attr_u32(&a, FRA_TABLE).unwrap_or(body[4] as u32),
    })
}

/// A route dump's body (`rtmsg`: family 0, dst_len 1, table 4, flags 8..12; attributes after).
pub(crate) fn parse_route(body: &[u8]) -> Option<RouteInfo> {
    let flags = u32::from_ne_bytes(body.get(8..12)?.try_into().ok()?);
    let a = crate::attrs(body, 12);
    let dst = a
        .iter()
        .find(|(k, _)| *k == libc::RTA_DST)
        .and_then(|(_, d)| ip_from(body[0], d));
    Some(RouteInfo {
        table: crate::attr_u32(&a, libc::RTA_TABLE).unwrap_or(body[4] as u32),
        dst,
        dst_len: body[1],
        oif: crate::attr_u32(&a, libc::RTA_OIF),
        cloned: flags & RTM_F_CLONED != 0,
    })
}

#[cfg(test)]
mod tests;
