//! The connection to explain or trace, and its one validation: what it is by itself (the
//! namespace it is explained in is checked by `first_packet`, the zone by `zone`). Pure: no
//! I/O, nothing of the crate's.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// Which way the connection crosses the pod boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Made by a process inside the pod (traced at hook `output`).
    Outbound,
    /// Arriving at the pod from outside (traced at hook `prerouting`).
    Inbound,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// `tcp` / `udp`.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// The connection to explain or trace. The IP family is the destination's; `src`, if given,
/// must be of the same family ([`Connection::validate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    pub direction: Direction,
    pub protocol: Protocol,
    pub dst: SocketAddr,
    /// Source address; when the trace connects (`trace::TraceHow::Connect`) the socket is
    /// bound to it (IP_FREEBIND, so it need not be local for an inbound probe).
    pub src: Option<IpAddr>,
    /// Sending process's uid/gid (outbound only: matched with `meta skuid/skgid`, and the
    /// connecting thread takes them). `None` = any (and root when connecting).
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The sending socket's mark (`SO_MARK`; outbound only), e.g. ztunnel's 0x539. `None` = 0.
    pub mark: Option<u32>,
    /// The zone of a link-local `dst` (`[fe80::1%eth0]:80`), in the pod's namespace: the
    /// interface it is reached through (outbound) or arrives on (inbound).
    pub zone: Option<Zone>,
}

/// A link-local address's zone as written: an interface name or index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Zone {
    Name(String),
    Index(u32),
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Zone::Name(n) => f.write_str(n),
            Zone::Index(i) => write!(f, "{i}"),
        }
    }
}

/// Why a connection is impossible, naming the argument that says so (`--dst`, `--uid`, …) and
/// its value as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{arg} {value}: {why}")]
pub struct Invalid {
    pub arg: &'static str,
    pub value: String,
    pub why: String,
}

fn invalid(arg: &'static str, value: impl ToString, why: impl Into<String>) -> Invalid {
    Invalid {
        arg,
        value: value.to_string(),
        why: why.into(),
    }
}

impl Connection {
    pub fn new(direction: Direction, protocol: Protocol, dst: SocketAddr) -> Self {
        Self {
            direction,
            protocol,
            dst,
            src: None,
            uid: None,
            gid: None,
            mark: None,
            zone: None,
        }
    }
    pub fn mark(mut self, mark: u32) -> Self {
        self.mark = Some(mark);
        self
    }
    pub fn zone(mut self, zone: Zone) -> Self {
        self.zone = Some(zone);
        self
    }
    /// `--dst` as written: `[fe80::1%eth0]:80` with a zone, else the address.
    pub fn dst_shown(&self) -> String {
        match &self.zone {
            Some(z) => format!("[{}%{z}]:{}", self.dst.ip(), self.dst.port()),
            None => self.dst.to_string(),
        }
    }
    pub fn src(mut self, src: IpAddr) -> Self {
        self.src = Some(src);
        self
    }
    pub fn uid(mut self, uid: u32) -> Self {
        self.uid = Some(uid);
        self
    }
    pub fn gid(mut self, gid: u32) -> Self {
        self.gid = Some(gid);
        self
    }
    pub fn is_ipv6(&self) -> bool {
        self.dst.is_ipv6()
    }
    /// The kernel hook the connection's first packet enters at: `output` or `prerouting`.
    pub fn hook(&self) -> &'static str {
        match self.direction {
            Direction::Outbound => "output",
            Direction::Inbound => "prerouting",
        }
    }

    /// An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) in `--dst` or `--src`: refused naming
    /// it, with the IPv4 form to give instead (a packet on the wire is IPv4 or IPv6, and such
    /// an address is neither a pod's IPv6 address nor, written so, its IPv4 one). The first
    /// check of [`Connection::validate`], also made before anything is looked up for it.
    pub fn refuse_mapped(&self) -> Result<(), Invalid> {
        let mapped = |ip: IpAddr| match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped(),
            IpAddr::V4(_) => None,
        };
        if let Some(v4) = mapped(self.dst.ip()) {
            return Err(invalid(
                "--dst",
                self.dst_shown(),
                format!(
                    "an IPv4-mapped IPv6 address: give the IPv4 address, {v4}:{}",
                    self.dst.port()
                ),
            ));
        }
        if let Some((src, v4)) = self.src.and_then(|s| Some((s, mapped(s)?))) {
            return Err(invalid(
                "--src",
                src,
                format!("an IPv4-mapped IPv6 address: give the IPv4 address, {v4}"),
            ));
        }
        Ok(())
    }

    /// Whether the connection makes sense by itself, wherever it is made: addresses of one
    /// family, a port, a unicast destination; a mark, uid or gid only on an outbound one (an
    /// inbound packet's sender is outside the pod, and crossing namespaces clears the mark).
    pub fn validate(&self) -> Result<(), Invalid> {
        self.refuse_mapped()?;
        if self.dst.port() == 0 {
            return Err(invalid(
                "--dst",
                self.dst_shown(),
                "port 0 is not a connection's port",
            ));
        }
        if let Some(src) = self.src {
            if src.is_ipv6() != self.is_ipv6() {
                return Err(invalid(
                    "--src",
                    src,
                    format!("is not of the same IP family as --dst {}", self.dst_shown()),
                ));
            }
            if src.is_unspecified() {
                return Err(invalid(
                    "--src",
                    src,
                    "the unspecified address sends nothing",
                ));
            }
        }
        if self.dst.ip().is_unspecified() || self.dst.ip().is_multicast() {
            return Err(invalid(
                "--dst",
                self.dst_shown(),
                "not a unicast destination",
            ));
        }
        if self.direction == Direction::Inbound {
            if let Some(m) = self.mark {
                return Err(invalid(
                    "--mark",
                    format!("{m:#x}"),
                    "an inbound packet arrives from another namespace, which clears its mark: --mark applies to outbound only",
                ));
            }
            if self.uid.is_some() || self.gid.is_some() {
                let (arg, v) = match self.uid {
                    Some(u) => ("--uid", u),
                    None => ("--gid", self.gid.unwrap_or(0)),
                };
                return Err(invalid(
                    arg,
                    v,
                    "an inbound connection's sender is outside the pod: uid/gid apply to outbound only",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(dst: &str) -> Connection {
        Connection::new(Direction::Outbound, Protocol::Tcp, dst.parse().unwrap())
    }

    #[test]
    fn inconsistent_connections_are_refused_by_name() {
        let e = out("10.0.0.1:80").src("::1".parse().unwrap()).validate();
        assert_eq!(e.unwrap_err().arg, "--src");
        let mut c = out("10.0.0.1:80").uid(1);
        assert_eq!(c.validate(), Ok(()));
        c.direction = Direction::Inbound;
        let e = c.validate().unwrap_err();
        assert!(e.to_string().starts_with("--uid 1: "), "{e}");
        let e = out("10.0.0.1:0").validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "--dst 10.0.0.1:0: port 0 is not a connection's port"
        );
        let e = out("[::ffff:10.0.0.1]:80").validate().unwrap_err();
        assert!(e.why.contains("10.0.0.1:80"), "{e}");
        assert_eq!(out("224.0.0.1:80").validate().unwrap_err().arg, "--dst");
    }
}
