//! A pod's policy routing, shared by both rule backends (the nft batch and the iptables-legacy
//! restore both need it): TPROXY's, over rtnetlink (no `ip` binary): `ip rule add fwmark M lookup T`,
//! `ip route add local default dev lo table T` (v4, and v6 with IPv6), and `::6/128` on lo so
//! Envoy can bind the IPv6 inbound passthrough source. All of it tolerates "already exists",
//! so re-applying is harmless.

use capture::Plan;
use netlink_wire::{put_attr, socket};
use std::io;
use std::os::fd::{AsFd, OwnedFd};

pub mod branch_eni;

#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct RouteError {
    what: String,
    source: io::Error,
}

// linux/fib_rules.h (not in the libc crate).
const FR_ACT_TO_TBL: u8 = 1;
const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_FWMASK: u16 = 16;

/// Sends one rtnetlink request with NLM_F_ACK and returns the kernel's answer ("already
/// exists" counts as done).
fn request(sock: &OwnedFd, msg_type: u16, flags: u16, body: &[u8]) -> io::Result<()> {
    request_tolerating(sock, msg_type, flags, body, &[libc::EEXIST])
}

pub(crate) fn request_tolerating(
    sock: &OwnedFd,
    msg_type: u16,
    flags: u16,
    body: &[u8],
    tolerated: &[i32],
) -> io::Result<()> {
    let msg = netlink_wire::message(msg_type, flags | libc::NLM_F_ACK as u16, 1, body);
    socket::request(sock.as_fd(), &msg, tolerated)
}

/// A bound rtnetlink socket.
pub(crate) fn route_socket() -> io::Result<OwnedFd> {
    socket::open(libc::NETLINK_ROUTE, 0)
}

fn lo_index() -> io::Result<u32> {
    nix::net::if_::if_nametoindex("lo").map_err(io::Error::from)
}

/// Installs what `plan` needs beyond nftables (nothing for REDIRECT-only IPv4 plans).
pub fn apply(plan: &Plan) -> Result<(), RouteError> {
    if plan.tproxy_routes.is_none() && !plan.ipv6_passthrough_addr {
        return Ok(());
    }
    let err = |what: &str| {
        let what = what.to_string();
        move |source| RouteError { what, source }
    };
    let sock = route_socket().map_err(err("opening an rtnetlink socket"))?;
    let lo = lo_index().map_err(err("finding the loopback interface"))?;
    if plan.ipv6_passthrough_addr {
        add_address_v6(&sock, lo, PASSTHROUGH_V6).map_err(err("adding ::6/128 to lo"))?;
    }
    if let Some(r) = &plan.tproxy_routes {
        let families: &[u8] = if r.ipv6 {
            &[libc::AF_INET as u8, libc::AF_INET6 as u8]
        } else {
            &[libc::AF_INET as u8]
        };
        for &family in families {
            // A rule without a priority gets a new one each time, so NLM_F_EXCL never sees a
            // duplicate: look first, or every re-apply (repair, CLI rerun) adds another rule.
            let present = dump(&sock, libc::RTM_GETRULE, family)
                .map_err(err("listing the policy routing rules"))?
                .iter()
                .any(|m| is_fwmark_rule(m, r.mark, r.table));
            if !present {
                add_rule(&sock, family, r).map_err(err(&format!(
                    "adding `ip rule fwmark {} lookup {}`",
                    r.mark, r.table
                )))?;
            }
            add_local_default(&sock, family, lo, r.table).map_err(err(&format!(
                "adding the local default route to table {}",
                r.table
            )))?;
        }
    }
    Ok(())
}

/// What [`apply`] installs that is missing in the current namespace, as readable lines (empty
/// = in place): the `::6` address, TPROXY's `fwmark` rule and its local default route. A
/// kill between the rules and these leaves rules that black-hole (TPROXY) or cannot answer
/// (IPv6 passthrough), so CHECK must see it.
pub fn drift(plan: &Plan) -> Result<Vec<String>, RouteError> {
    let mut out = Vec::new();
    if plan.ipv6_passthrough_addr && !has_passthrough_address()? {
        out.push(format!(
            "lo: missing address {PASSTHROUGH_V6}/128 (source of the IPv6 inbound passthrough)"
        ));
    }
    if let Some(r) = &plan.tproxy_routes {
        let err = |what: &str| {
            let what = what.to_string();
            move |source| RouteError { what, source }
        };
        let sock = route_socket().map_err(err("opening an rtnetlink socket"))?;
        for (family, label) in families(r) {
            let rules = dump(&sock, libc::RTM_GETRULE, family)
                .map_err(err("listing the policy routing rules"))?;
            if !rules.iter().any(|m| is_fwmark_rule(m, r.mark, r.table)) {
                out.push(format!(
                    "{label}: missing policy rule `fwmark {:#x} lookup {}` (TPROXY)",
                    r.mark, r.table
                ));
            }
            let routes =
                dump(&sock, libc::RTM_GETROUTE, family).map_err(err("listing the routes"))?;
            if !routes.iter().any(|m| is_local_default(m, r.table)) {
                out.push(format!(
                    "{label}: missing route `local default dev lo table {}` (TPROXY)",
                    r.table
                ));
            }
        }
    }
    Ok(out)
}

fn families(r: &capture::TproxyRoutes) -> Vec<(u8, &'static str)> {
    let mut f = vec![(libc::AF_INET as u8, "IPv4")];
    if r.ipv6 {
        f.push((libc::AF_INET6 as u8, "IPv6"));
    }
    f
}

/// The bodies (after `nlmsghdr`) of a `msg_type` dump for `family`.
pub(crate) fn dump(sock: &OwnedFd, msg_type: u16, family: u8) -> io::Result<Vec<Vec<u8>>> {
    // rtgenmsg-sized family header, padded to 4 (both fib_rule_hdr and rtmsg start with it).
    let body = [family, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let msg = netlink_wire::message(msg_type, libc::NLM_F_DUMP as u16, 2, &body);
    let mut out = Vec::new();
    socket::dump(sock.as_fd(), &msg, |_, payload| out.push(payload.to_vec()))?;
    Ok(out)
}

/// The attributes after a fixed header of `fixed` bytes: (type, payload).
fn attrs(body: &[u8], fixed: usize) -> Vec<(u16, &[u8])> {
    netlink_wire::attrs(body.get(fixed..).unwrap_or_default()).collect()
}

pub(crate) fn attr_u32(attrs: &[(u16, &[u8])], kind: u16) -> Option<u32> {
    attrs
        .iter()
        .find(|(k, _)| *k == kind)
        .and_then(|(_, d)| Some(u32::from_ne_bytes(d.get(..4)?.try_into().ok()?)))
}

/// `fwmark MARK lookup TABLE` (fib_rule_hdr is 12 bytes; action at offset 7).
fn is_fwmark_rule(body: &[u8], mark: u32, table: u32) -> bool {
    if body.len() < 12 || body[7] != FR_ACT_TO_TBL {
        return false;
    }
    let a = attrs(body, 12);
    attr_u32(&a, FRA_FWMARK) == Some(mark) && attr_u32(&a, FRA_TABLE) == Some(table)
}

/// `local default dev lo table TABLE` (rtmsg is 12 bytes: dst_len at 1, type at 7).
fn is_local_default(body: &[u8], table: u32) -> bool {
    if body.len() < 12 || body[1] != 0 || body[7] != libc::RTN_LOCAL {
        return false;
    }
    let a = attrs(body, 12);
    attr_u32(&a, libc::RTA_TABLE) == Some(table)
}

const PASSTHROUGH_V6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6);

fn has_passthrough_address() -> Result<bool, RouteError> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| RouteError {
        what: "listing the addresses on lo".into(),
        source: e.into(),
    })?;
    Ok(addrs
        .filter(|a| a.interface_name == "lo")
        .filter_map(|a| a.address?.as_sockaddr_in6().map(|s| s.ip()))
        .any(|ip| ip == PASSTHROUGH_V6))
}

fn add_address_v6(sock: &OwnedFd, ifindex: u32, addr: std::net::Ipv6Addr) -> io::Result<()> {
    // struct ifaddrmsg { family, prefixlen, flags, scope, index }
    let mut body = vec![
        libc::AF_INET6 as u8,
        128,
        libc::IFA_F_NODAD as u8,
        libc::RT_SCOPE_HOST,
    ];
    body.extend_from_slice(&ifindex.to_ne_bytes());
    put_attr(&mut body, libc::IFA_LOCAL, &addr.octets());
    put_attr(&mut body, libc::IFA_ADDRESS, &addr.octets());
    request(
        sock,
        libc::RTM_NEWADDR,
        (libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16,
        &body,
    )
}

fn add_rule(sock: &OwnedFd, family: u8, r: &capture::TproxyRoutes) -> io::Result<()> {
    // EXCL alone does not prevent duplicates when no priority is given: `apply` looks first.
    request(
        sock,
        libc::RTM_NEWRULE,
        (libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16,
        &rule_body(family, r),
    )
}

fn rule_body(family: u8, r: &capture::TproxyRoutes) -> Vec<u8> {
    // struct fib_rule_hdr { family, dst_len, src_len, tos, table, res1, res2, action, flags }
    let mut body = vec![family, 0, 0, 0, 0, 0, 0, FR_ACT_TO_TBL];
    body.extend_from_slice(&0u32.to_ne_bytes());
    put_attr(&mut body, FRA_FWMARK, &r.mark.to_ne_bytes());
    if let Some(mask) = r.mask {
        put_attr(&mut body, FRA_FWMASK, &mask.to_ne_bytes());
    }
    if let Some(pref) = r.priority {
        put_attr(&mut body, FRA_PRIORITY, &pref.to_ne_bytes());
    }
    put_attr(&mut body, FRA_TABLE, &r.table.to_ne_bytes());
    body
}

fn add_local_default(sock: &OwnedFd, family: u8, ifindex: u32, table: u32) -> io::Result<()> {
    request(
        sock,
        libc::RTM_NEWROUTE,
        (libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16,
        &local_default_body(family, ifindex, table),
    )
}

fn local_default_body(family: u8, ifindex: u32, table: u32) -> Vec<u8> {
    // struct rtmsg { family, dst_len, src_len, tos, table, protocol, scope, type, flags }
    let mut body = vec![
        family,
        0,
        0,
        0,
        libc::RT_TABLE_UNSPEC,
        libc::RTPROT_BOOT,
        libc::RT_SCOPE_HOST,
        libc::RTN_LOCAL,
    ];
    body.extend_from_slice(&0u32.to_ne_bytes());
    put_attr(&mut body, libc::RTA_TABLE, &table.to_ne_bytes());
    put_attr(&mut body, libc::RTA_OIF, &ifindex.to_ne_bytes());
    body
}

/// Removes the policy rule and local default route of `r` (both families), as Istio's
/// `DelInpodMarkIPRule` / `DelLoopbackRoutes`; what is not there is not an error.
pub fn remove(r: &capture::TproxyRoutes) -> Result<(), RouteError> {
    let err = |what: &str| {
        let what = what.to_string();
        move |source| RouteError { what, source }
    };
    let sock = route_socket().map_err(err("opening an rtnetlink socket"))?;
    let lo = lo_index().map_err(err("finding the loopback interface"))?;
    let gone = [libc::ENOENT, libc::ESRCH, libc::EAFNOSUPPORT];
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        request_tolerating(&sock, libc::RTM_DELRULE, 0, &rule_body(family, r), &gone).map_err(
            err(&format!(
                "removing `ip rule fwmark {:#x} lookup {}`",
                r.mark, r.table
            )),
        )?;
        request_tolerating(
            &sock,
            libc::RTM_DELROUTE,
            0,
            &local_default_body(family, lo, r.table),
            &gone,
        )
        .map_err(err(&format!(
            "removing the local default route of table {}",
            r.table
        )))?;
    }
    Ok(())
}
