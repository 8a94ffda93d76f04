//! The connection as the walk takes it: checked against the namespace (bad input names the
//! argument), described with every assumption, and turned into the synthetic first packet the
//! walk starts with.

use crate::connection::{Connection, Direction, Protocol};
use crate::eval::{CT_STATE_NEW, Packet};
use crate::facts::NsFacts;
use crate::{ASSUMED_SPORT, ExplainError};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The connection as explained, with every assumption made explicit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Described {
    pub direction: &'static str,
    pub protocol: &'static str,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// The link-local destination's zone (interface name in the pod), if any.
    pub zone: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The packet's mark (`--mark`; outbound only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mark: Option<u32>,
    pub iif: Option<String>,
    pub oif: Option<String>,
    /// Values not given on the command line and what was assumed for them.
    pub assumed: Vec<String>,
}

impl Described {
    pub(super) fn of(
        conn: &Connection,
        pkt: &Packet,
        facts: &NsFacts,
        assumed: Vec<String>,
    ) -> Self {
        Described {
            direction: match conn.direction {
                Direction::Outbound => "outbound",
                Direction::Inbound => "inbound",
            },
            protocol: conn.protocol.name(),
            src: pkt.src,
            dst: pkt.dst,
            zone: facts.zone.as_ref().map(|(n, _)| n.clone()),
            uid: pkt.uid,
            gid: pkt.gid,
            mark: conn.mark,
            iif: pkt.iif.clone(),
            oif: pkt.oif.clone(),
            assumed,
        }
    }
}

fn bad(arg: &'static str, value: impl ToString, why: impl Into<String>) -> ExplainError {
    ExplainError::BadInput {
        arg,
        value: value.to_string(),
        why: why.into(),
    }
}

/// Checks the connection makes sense, by itself ([`Connection::validate`]) and for this
/// namespace (before any evaluation).
pub fn validate(conn: &Connection, facts: &NsFacts) -> Result<(), ExplainError> {
    conn.validate()?;
    match conn.direction {
        Direction::Inbound if !facts.is_local(conn.dst.ip()) => Err(bad(
            "--dst",
            conn.dst_shown(),
            format!(
                "an inbound destination must be an address of the pod ({})",
                facts.address_list()
            ),
        )),
        Direction::Outbound => match conn.src {
            Some(src) if !facts.is_local(src) => Err(bad(
                "--src",
                src,
                format!(
                    "an outbound source must be an address of the pod ({})",
                    facts.address_list()
                ),
            )),
            _ => Ok(()),
        },
        Direction::Inbound => Ok(()),
    }
}

/// The first packet of `conn` as the first hook sees it, and what was assumed.
pub(super) fn first_packet(
    conn: &Connection,
    facts: &NsFacts,
) -> Result<(Packet, Vec<String>), ExplainError> {
    let v6 = conn.is_ipv6();
    let mut assumed = vec![format!("source port {ASSUMED_SPORT}")];
    let l4proto = match conn.protocol {
        Protocol::Tcp => libc::IPPROTO_TCP as u8,
        Protocol::Udp => libc::IPPROTO_UDP as u8,
    };
    let mut p = Packet {
        l4proto,
        src: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), ASSUMED_SPORT),
        dst: conn.dst,
        iif: None,
        oif: None,
        uid: None,
        gid: None,
        mark: match conn.direction {
            Direction::Outbound => conn.mark.unwrap_or(0),
            Direction::Inbound => 0,
        },
        ct_state: CT_STATE_NEW,
        ct_mark: 0,
        ct_zone: 0,
    };
    match conn.direction {
        Direction::Outbound => {
            let Some((oif, src)) = facts.route.clone() else {
                return Err(bad("--dst", conn.dst_shown(), "no route from the pod"));
            };
            p.oif = Some(oif);
            p.src.set_ip(conn.src.unwrap_or(src));
            if conn.src.is_none() {
                assumed.push(format!("source address {src} (the route's)"));
            }
            p.uid = Some(conn.uid.unwrap_or(0));
            p.gid = Some(conn.gid.unwrap_or(0));
            if conn.uid.is_none() {
                assumed.push("uid 0".into());
            }
            if conn.gid.is_none() {
                assumed.push("gid 0".into());
            }
        }
        Direction::Inbound => {
            let iif = match &facts.zone {
                Some((name, _)) => name.clone(),
                None => facts.iface_of(conn.dst.ip()).unwrap_or("lo").to_string(),
            };
            p.iif = Some(iif);
            let src = conn.src.unwrap_or(if v6 {
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1))
            } else {
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))
            });
            if conn.src.is_none() {
                assumed.push(format!("source address {src} (outside the pod)"));
            }
            p.src.set_ip(src);
        }
    }
    Ok((p, assumed))
}
