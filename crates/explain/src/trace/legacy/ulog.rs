//! The nfnetlink_log socket that receives ip_tables' TRACE lines in the pod's namespace.
//!
//! ip_tables logs a traced packet with `nf_log_trace`, which goes to the logger bound to the
//! packet's family in THAT namespace. [`LogSocket::open`] binds group 0 (where TRACE lines go),
//! copying up to [`COPY_RANGE`] bytes of each packet and flushing every line at once
//! (`qthresh 1`; the default batches for up to a second), then binds nfnetlink_log to the
//! family (`NFULNL_CFG_CMD_PF_BIND`, replacing what was bound: every namespace starts with
//! nf_log_syslog's `nf_log_ipv4`/`nf_log_ipv6`, which print nothing outside the node's
//! namespace). [`LogSocket::restore`] puts the previous logger back. One socket per namespace
//! may hold group 0: a second trace of the same pod at the same time is refused (the kernel
//! answers EPERM: the group belongs to another socket) before it changed anything. A SIGKILLed
//! trace leaves nfnetlink_log bound to the family with nobody on group 0 (TRACE lines are then
//! dropped, as the default logger drops them): the next trace puts the default back.

use super::lines::LogLine;
use crate::trace::TraceError;
use crate::trace::nfnl::{self, nl_err};
use netlink_wire::socket as netlink;
use nix::sys::socket::SockFlag;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_TIMEOUT: u16 = 4;
const NFULA_CFG_QTHRESH: u16 = 5;
const CMD_BIND: u8 = 1;
const CMD_UNBIND: u8 = 2;
const CMD_PF_BIND: u8 = 3;
const CMD_PF_UNBIND: u8 = 4;
const COPY_PACKET: u8 = 2;
/// Enough of each packet for its IPv6/IPv4 and TCP/UDP headers.
pub const COPY_RANGE: u32 = 128;
/// Room for bursts of lines without ENOBUFS.
const RCVBUF: libc::c_int = 4 << 20;
/// The group TRACE lines are logged to.
const GROUP: u16 = 0;

/// An `NFULNL_MSG_CONFIG` request for `family` and `group` with `attrs`. Pure.
pub fn config_msg(family: u8, group: u16, seq: u32, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![family, 0];
    body.extend(group.to_be_bytes());
    for (kind, v) in attrs {
        netlink_wire::put_attr(&mut body, *kind, v);
    }
    let msg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
    netlink_wire::message(msg_type, libc::NLM_F_ACK as u16, seq, &body)
}

/// The logger bound to `pf` in `/proc/net/netfilter/nf_log` (`None`: `NONE`). Pure.
pub fn bound_logger(nf_log: &str, pf: u8) -> Option<String> {
    nf_log.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next()?.parse::<u8>().ok()? == pf)
            .then(|| w.next())
            .flatten()
            .filter(|n| *n != "NONE")
            .map(str::to_string)
    })
}

pub struct LogSocket {
    fd: OwnedFd,
    buf: Vec<u64>,
    pf: u8,
    /// The logger bound to `pf` before us.
    previous: Option<String>,
    /// Whether we hold group 0 (then the family's binding is ours to restore).
    owns_group: bool,
    seq: u32,
}

impl LogSocket {
    /// Binds nfnetlink_log to `pf` (`NFPROTO_IPV4`/`IPV6`) and group 0 in the CURRENT
    /// namespace (call inside it).
    pub fn open(pf: u8) -> Result<LogSocket, TraceError> {
        let fd = nfnl::open("the nfnetlink_log socket", SockFlag::empty())?;
        nfnl::recv_timeout(&fd, 2, "the nfnetlink_log socket")?;
        if netlink::setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &RCVBUF).is_err()
        {
            let _ = netlink::setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &RCVBUF);
        }
        let previous = std::fs::read_to_string("/proc/thread-self/net/netfilter/nf_log")
            .ok()
            .and_then(|t| bound_logger(&t, pf));
        let mut s = LogSocket {
            fd,
            buf: vec![0u64; netlink::RECV_WORDS],
            pf,
            previous,
            owns_group: false,
            seq: 0,
        };
        // The group first: when another trace holds it, nothing has changed yet.
        let mut mode = COPY_RANGE.to_be_bytes().to_vec();
        mode.extend([COPY_PACKET, 0]);
        let bind_group = [
            (NFULA_CFG_CMD, vec![CMD_BIND]),
            (NFULA_CFG_MODE, mode),
            (NFULA_CFG_QTHRESH, 1u32.to_be_bytes().to_vec()),
            (NFULA_CFG_TIMEOUT, 1u32.to_be_bytes().to_vec()),
        ];
        s.config(pf, GROUP, &bind_group, "binding nfnetlink_log group 0")?;
        s.owns_group = true;
        let pf_bind = [(NFULA_CFG_CMD, vec![CMD_PF_BIND])];
        if let Err(e) = s.config(pf, 0, &pf_bind, "binding nfnetlink_log to the family") {
            let _ = s.restore();
            return Err(e);
        }
        Ok(s)
    }

    /// Sends one config request and waits for its acknowledgement.
    fn config(
        &mut self,
        family: u8,
        group: u16,
        attrs: &[(u16, Vec<u8>)],
        what: &str,
    ) -> Result<(), TraceError> {
        self.seq += 1;
        let msg = config_msg(family, group, self.seq, attrs);
        let group_cmd = attrs.first() == Some(&(NFULA_CFG_CMD, vec![CMD_BIND]));
        netlink::send(self.fd.as_fd(), &msg).map_err(nl_err(what))?;
        loop {
            let n = netlink::recv(self.fd.as_fd(), &mut self.buf, 0).map_err(nl_err(what))?;
            for (hdr, payload) in netlink::messages(netlink::bytes_of(&self.buf, n)) {
                if hdr.nlmsg_type as i32 == libc::NLMSG_ERROR && hdr.nlmsg_seq == self.seq {
                    return match netlink_wire::error_code(payload) {
                        0 => Ok(()),
                        // The group belongs to another socket (EPERM), or is bound (EBUSY).
                        errno @ (libc::EBUSY | libc::EPERM) if group_cmd => {
                            Err(TraceError::Refused {
                                what: format!(
                                    "{what} (another trace of this namespace is running)"
                                ),
                                source: io::Error::from_raw_os_error(errno),
                            })
                        }
                        e => Err(TraceError::Refused {
                            what: what.into(),
                            source: io::Error::from_raw_os_error(e),
                        }),
                    };
                }
            }
        }
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Every line queued now (does not block).
    pub fn drain(&mut self) -> Result<Vec<LogLine>, TraceError> {
        let mut out = Vec::new();
        let packet = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET;
        loop {
            let n = match netlink::recv(self.fd.as_fd(), &mut self.buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(out),
                Err(e) => return Err(nl_err("receiving TRACE lines")(e)),
            };
            for (hdr, payload) in netlink::messages(netlink::bytes_of(&self.buf, n)) {
                if hdr.nlmsg_type == packet
                    && let Some(l) = LogLine::decode(payload)
                {
                    out.push(l);
                }
            }
        }
    }

    /// Gives group 0 up and binds the family's previous logger again (current namespace: call
    /// inside it; writing the sysctl needs it). nfnetlink_log found bound with group 0 free is
    /// what a killed trace leaves behind: the family then gets the kernel's default logger
    /// back (`nf_log_ipv4`/`nf_log_ipv6`, bound in every namespace by nf_log_syslog), or none.
    pub fn restore(&mut self) -> Result<(), TraceError> {
        if !self.owns_group {
            // Another trace holds the group; the binding is its to restore.
            return Ok(());
        }
        let _ = self.config(
            self.pf,
            GROUP,
            &[(NFULA_CFG_CMD, vec![CMD_UNBIND])],
            "unbinding group 0",
        );
        let default = if self.pf as i32 == libc::NFPROTO_IPV6 {
            "nf_log_ipv6"
        } else {
            "nf_log_ipv4"
        };
        let wanted = match self.previous.as_deref() {
            Some("nfnetlink_log") => Some(default),
            other => other,
        };
        let written = wanted.is_some_and(|name| {
            let path = format!("/proc/sys/net/netfilter/nf_log/{}", self.pf);
            std::fs::write(path, name).is_ok()
        });
        if written {
            return Ok(());
        }
        self.config(
            self.pf,
            0,
            &[(NFULA_CFG_CMD, vec![CMD_PF_UNBIND])],
            "unbinding nfnetlink_log from the family",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_messages_are_nfnetlink_requests() {
        let m = config_msg(2, 0, 7, &[(NFULA_CFG_CMD, vec![CMD_PF_BIND])]);
        assert_eq!(m.len(), 16 + 4 + 8);
        assert_eq!(u32::from_ne_bytes(m[..4].try_into().unwrap()), 28);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x0401);
        assert_eq!(&m[16..20], &[2, 0, 0, 0]);
        assert_eq!(&m[20..25], &[5, 0, 1, 0, CMD_PF_BIND]);
    }

    #[test]
    fn the_bound_logger_is_read_per_family() {
        let t = " 2 nf_log_ipv4 (nf_log_ipv4,nfnetlink_log)\n 3 NONE (nfnetlink_log)\n10 nfnetlink_log (nf_log_ipv6,nfnetlink_log)\n";
        assert_eq!(bound_logger(t, 2).as_deref(), Some("nf_log_ipv4"));
        assert_eq!(bound_logger(t, 3), None);
        assert_eq!(bound_logger(t, 10).as_deref(), Some("nfnetlink_log"));
    }
}
