//! One conntrack entry, read over ctnetlink (`NFNL_SUBSYS_CTNETLINK`, `IPCTNL_MSG_CT_GET`
//! with the connection's original tuple): the kernel's own record of what NAT it applied to a
//! connection. The reply tuple is the original one reversed, with the NAT applied: its
//! destination is the address an SNAT gave the connection, its source the one a DNAT gave it.
//! Reading changes nothing (no logger, no rule). [`Events`] also keeps the entry of a
//! connection the kernel has already destroyed (a refused one: the RST ends an unassured
//! entry at once) from conntrack's NEW/DESTROY events, subscribed before it is made.

use super::nfnl::{self, nl_err};
use super::{Protocol, TraceError};
use netlink_wire::socket as netlink;
use netlink_wire::{attrs, error_code, message, put_attr};
use nix::sys::socket::SockFlag;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NFNLGRP_CONNTRACK_NEW: u32 = 1;
const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;
/// Both groups as `nl_groups` bits (group N is bit N - 1).
const EVENT_GROUPS: u32 =
    (1 << (NFNLGRP_CONNTRACK_NEW - 1)) | (1 << (NFNLGRP_CONNTRACK_DESTROY - 1));
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const NLA_F_NESTED: u16 = 1 << 15;
/// How long the kernel may take to answer (it answers at once; a bound, not a wait).
const ANSWER_TIMEOUT_SECS: u32 = 2;

/// One direction of a connection as conntrack records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtTuple {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

impl fmt::Display for CtTuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}", self.src, self.dst)
    }
}

/// A conntrack entry: the connection as it was sent and as its replies must look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtEntry {
    pub protocol: Protocol,
    pub original: CtTuple,
    pub reply: CtTuple,
    /// `CTA_STATUS` (`IPS_*` bits: `IPS_SRC_NAT` = 0x10, `IPS_DST_NAT` = 0x20, ...).
    pub status: u32,
}

impl CtEntry {
    /// The source address the kernel gave the connection (SNAT), if it changed it.
    pub fn snat(&self) -> Option<IpAddr> {
        (self.reply.dst.ip() != self.original.src.ip()).then_some(self.reply.dst.ip())
    }

    /// The destination the kernel gave the connection (DNAT/REDIRECT), if it changed it.
    pub fn dnat(&self) -> Option<SocketAddr> {
        (self.reply.src != self.original.dst).then_some(self.reply.src)
    }
}

impl fmt::Display for CtEntry {
    /// `tcp 10.0.0.1:40000 -> 10.0.0.2:8080, reply 10.0.0.2:8080 -> 169.254.7.127:40000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}, reply {}",
            self.protocol.name(),
            self.original,
            self.reply
        )
    }
}

fn proto_num(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => libc::IPPROTO_TCP as u8,
        Protocol::Udp => libc::IPPROTO_UDP as u8,
    }
}

fn ip_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// `CTA_TUPLE_*`'s nested attributes for `t`.
fn tuple_attrs(protocol: Protocol, t: &CtTuple) -> Vec<u8> {
    let (src, dst) = if t.src.is_ipv6() {
        (CTA_IP_V6_SRC, CTA_IP_V6_DST)
    } else {
        (CTA_IP_V4_SRC, CTA_IP_V4_DST)
    };
    let mut ip = Vec::new();
    put_attr(&mut ip, src, &ip_bytes(t.src.ip()));
    put_attr(&mut ip, dst, &ip_bytes(t.dst.ip()));
    let mut proto = Vec::new();
    put_attr(&mut proto, CTA_PROTO_NUM, &[proto_num(protocol)]);
    put_attr(&mut proto, CTA_PROTO_SRC_PORT, &t.src.port().to_be_bytes());
    put_attr(&mut proto, CTA_PROTO_DST_PORT, &t.dst.port().to_be_bytes());
    let mut out = Vec::new();
    put_attr(&mut out, CTA_TUPLE_IP | NLA_F_NESTED, &ip);
    put_attr(&mut out, CTA_TUPLE_PROTO | NLA_F_NESTED, &proto);
    out
}

/// The `IPCTNL_MSG_CT_GET` request for the entry whose original tuple is `t`. Pure.
pub fn get_request(protocol: Protocol, t: &CtTuple, seq: u32) -> Vec<u8> {
    let family = if t.src.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    } as u8;
    // nfgenmsg: family, version 0, resource id 0.
    let mut body = vec![family, 0, 0, 0];
    put_attr(
        &mut body,
        CTA_TUPLE_ORIG | NLA_F_NESTED,
        &tuple_attrs(protocol, t),
    );
    let msg_type = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
    message(msg_type, libc::NLM_F_ACK as u16, seq, &body)
}

fn ip_of(b: &[u8]) -> Option<IpAddr> {
    if let Ok(a) = <[u8; 4]>::try_from(b) {
        Some(Ipv4Addr::from(a).into())
    } else {
        <[u8; 16]>::try_from(b)
            .ok()
            .map(|a| Ipv6Addr::from(a).into())
    }
}

fn port_of(b: &[u8]) -> Option<u16> {
    <[u8; 2]>::try_from(b).ok().map(u16::from_be_bytes)
}

/// A `CTA_TUPLE_*` attribute's value back into a tuple.
fn decode_tuple(b: &[u8]) -> Option<CtTuple> {
    let (mut src, mut dst, mut sport, mut dport) = (None, None, None, None);
    for (kind, v) in attrs(b) {
        match kind {
            CTA_TUPLE_IP => {
                for (k, a) in attrs(v) {
                    match k {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = ip_of(a),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => dst = ip_of(a),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (k, a) in attrs(v) {
                    match k {
                        CTA_PROTO_SRC_PORT => sport = port_of(a),
                        CTA_PROTO_DST_PORT => dport = port_of(a),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(CtTuple {
        src: SocketAddr::new(src?, sport?),
        dst: SocketAddr::new(dst?, dport?),
    })
}

/// An `IPCTNL_MSG_CT_NEW` message's payload (after the netlink header) as an entry. Pure.
pub fn decode_entry(protocol: Protocol, payload: &[u8]) -> Option<CtEntry> {
    let (mut original, mut reply, mut status) = (None, None, 0);
    for (kind, v) in attrs(payload.get(4..)?) {
        match kind {
            CTA_TUPLE_ORIG => original = decode_tuple(v),
            CTA_TUPLE_REPLY => reply = decode_tuple(v),
            CTA_STATUS => status = <[u8; 4]>::try_from(v).map(u32::from_be_bytes).unwrap_or(0),
            _ => {}
        }
    }
    Some(CtEntry {
        protocol,
        original: original?,
        reply: reply?,
        status,
    })
}

fn open() -> Result<OwnedFd, TraceError> {
    let fd = nfnl::open("the ctnetlink socket", SockFlag::empty())?;
    nfnl::recv_timeout(&fd, ANSWER_TIMEOUT_SECS, "the ctnetlink socket")?;
    Ok(fd)
}

/// The entry whose original tuple is `t`, in the CURRENT namespace (call inside it); `None`
/// when conntrack holds none (the kernel answers ENOENT).
pub fn get(protocol: Protocol, t: &CtTuple) -> Result<Option<CtEntry>, TraceError> {
    let what = format!("reading the conntrack entry of {} {t}", protocol.name());
    let fd = open()?;
    let seq = 1;
    netlink::send(fd.as_fd(), &get_request(protocol, t, seq)).map_err(nl_err(&what))?;
    let mut buf = vec![0u64; netlink::RECV_WORDS];
    let mut entry = None;
    let new = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW;
    // The entry comes first, then the acknowledgement (NLMSG_ERROR, 0) that ends the answer.
    loop {
        let n = netlink::recv(fd.as_fd(), &mut buf, 0).map_err(nl_err(&what))?;
        for (hdr, payload) in netlink::messages(netlink::bytes_of(&buf, n)) {
            if hdr.nlmsg_seq != seq {
                continue;
            }
            if hdr.nlmsg_type == new {
                entry = decode_entry(protocol, payload);
            } else if hdr.nlmsg_type as i32 == libc::NLMSG_ERROR {
                return match error_code(payload) {
                    0 => Ok(made_by(entry, t)),
                    libc::ENOENT => Ok(None),
                    e => Err(TraceError::Refused {
                        what,
                        source: io::Error::from_raw_os_error(e),
                    }),
                };
            }
        }
    }
}

/// `entry` if the kernel tracked it from `t`'s side: the lookup also matches an entry whose
/// REPLY tuple is `t`, i.e. one the kernel started from the answer because it did not track
/// the connection's own first packet (a `NOTRACK` rule). That is no record of this
/// connection's NAT.
fn made_by(entry: Option<CtEntry>, t: &CtTuple) -> Option<CtEntry> {
    match entry {
        Some(e) if e.original == *t => Some(e),
        Some(e) => {
            tracing::debug!(entry = %e, "conntrack holds the connection the other way round only: no record of it");
            None
        }
        None => None,
    }
}

/// Conntrack's NEW and DESTROY events in the namespace the socket was opened in, from then on
/// (nonblocking; events are what the kernel reports anyway, nothing is changed).
pub struct Events {
    fd: OwnedFd,
}

impl Events {
    /// Subscribes in the CURRENT namespace (call inside it).
    pub fn subscribe() -> Result<Events, TraceError> {
        let name = "the conntrack event socket";
        let fd =
            netlink::open_subscribed(libc::NETLINK_NETFILTER, libc::SOCK_NONBLOCK, EVENT_GROUPS)
                .map_err(|e| nl_err(&format!("subscribing {name}"))(e))?;
        Ok(Events { fd })
    }

    /// The entry whose original tuple is `t` among the events queued so far (its NEW event
    /// when the kernel sent it, else its DESTROY event); `None` if none is. Events lost to
    /// an overflowing queue (a busy node) are skipped.
    pub fn find(&self, protocol: Protocol, t: &CtTuple) -> Result<Option<CtEntry>, TraceError> {
        let what = format!("reading conntrack events for {} {t}", protocol.name());
        let mut buf = vec![0u64; netlink::RECV_WORDS];
        let kinds =
            [IPCTNL_MSG_CT_NEW, IPCTNL_MSG_CT_DELETE].map(|k| (NFNL_SUBSYS_CTNETLINK << 8) | k);
        let mut found = None;
        loop {
            let n = match netlink::recv(self.fd.as_fd(), &mut buf, 0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(found),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
                Err(e) => return Err(nl_err(&what)(e)),
            };
            for (hdr, payload) in netlink::messages(netlink::bytes_of(&buf, n)) {
                if found.is_none()
                    && kinds.contains(&hdr.nlmsg_type)
                    && let Some(e) = decode_entry(protocol, payload)
                    && e.original == *t
                {
                    found = Some(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_the_kernel_started_from_the_answer_is_no_record() {
        let ours = CtTuple {
            src: "10.1.2.1:58533".parse().unwrap(),
            dst: "198.51.100.7:8080".parse().unwrap(),
        };
        let back = CtTuple {
            src: ours.dst,
            dst: ours.src,
        };
        let entry = |original, reply| CtEntry {
            protocol: Protocol::Tcp,
            original,
            reply,
            status: 0,
        };
        assert_eq!(made_by(Some(entry(back, ours)), &ours), None);
        let tracked = entry(ours, back);
        assert_eq!(made_by(Some(tracked.clone()), &ours), Some(tracked));
        assert_eq!(made_by(None, &ours), None);
    }

    fn t(src: &str, dst: &str) -> CtTuple {
        CtTuple {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
        }
    }

    #[test]
    fn a_get_request_names_the_original_tuple() {
        let m = get_request(Protocol::Tcp, &t("10.0.0.1:40000", "10.0.0.2:8080"), 3);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x0101);
        assert_eq!(&m[16..20], &[libc::AF_INET as u8, 0, 0, 0]);
        let (kind, orig) = attrs(&m[20..]).next().unwrap();
        assert_eq!(kind, CTA_TUPLE_ORIG);
        assert_eq!(
            decode_tuple(orig),
            Some(t("10.0.0.1:40000", "10.0.0.2:8080"))
        );
        let m = get_request(Protocol::Udp, &t("[fd00::1]:5", "[fd00::2]:53"), 4);
        assert_eq!(m[16], libc::AF_INET6 as u8);
    }

    /// An entry as the kernel sends it: nfgenmsg, then the two tuples and the status.
    fn entry_payload(orig: &CtTuple, reply: &CtTuple, status: u32) -> Vec<u8> {
        let mut b = vec![libc::AF_INET as u8, 0, 0, 0];
        put_attr(
            &mut b,
            CTA_TUPLE_ORIG | NLA_F_NESTED,
            &tuple_attrs(Protocol::Tcp, orig),
        );
        put_attr(
            &mut b,
            CTA_TUPLE_REPLY | NLA_F_NESTED,
            &tuple_attrs(Protocol::Tcp, reply),
        );
        put_attr(&mut b, CTA_STATUS, &status.to_be_bytes());
        b
    }

    #[test]
    fn the_reply_tuple_says_which_nat_the_kernel_applied() {
        let orig = t("10.0.0.1:40000", "10.0.0.2:8080");
        let snatted = t("10.0.0.2:8080", "169.254.7.127:40000");
        let e = decode_entry(Protocol::Tcp, &entry_payload(&orig, &snatted, 0x1be)).unwrap();
        assert_eq!(e.snat(), Some("169.254.7.127".parse().unwrap()));
        assert_eq!(e.dnat(), None);
        assert_eq!(e.status, 0x1be);
        assert_eq!(
            e.to_string(),
            "tcp 10.0.0.1:40000 -> 10.0.0.2:8080, reply 10.0.0.2:8080 -> 169.254.7.127:40000"
        );
        let plain = t("10.0.0.2:8080", "10.0.0.1:40000");
        let e = decode_entry(Protocol::Tcp, &entry_payload(&orig, &plain, 0)).unwrap();
        assert_eq!((e.snat(), e.dnat()), (None, None));
        assert_eq!(decode_entry(Protocol::Tcp, &[2, 0, 0, 0]), None);
    }
}
