//! The kernel's trace events: a NETLINK_NETFILTER socket in the namespace subscribed to
//! NFNLGRP_NFTRACE, and the decoding of NFT_MSG_TRACE messages (what `nft monitor trace` reads).

use super::nfnl::{self, nl_err};
use super::{EventKind, TraceError, TraceEvent, Verdict};
use netlink_wire::socket as netlink;
use nftnl::nftnl_sys as sys;
use nix::sys::socket::SockFlag;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

const SOL_NETLINK: libc::c_int = 270;
const NETLINK_ADD_MEMBERSHIP: libc::c_int = 1;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// Room for bursts of events (each ~200 bytes) without ENOBUFS.
const RCVBUF: libc::c_int = 4 << 20;

pub struct TraceSocket {
    fd: OwnedFd,
    buf: Vec<u64>,
}

impl TraceSocket {
    /// Opens and subscribes a socket in the CURRENT namespace (call inside it).
    pub fn open() -> Result<TraceSocket, TraceError> {
        let fd = nfnl::open("the trace socket", SockFlag::SOCK_NONBLOCK)?;
        let group = libc::NFNLGRP_NFTRACE;
        netlink::setsockopt(fd.as_fd(), SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &group)
            .map_err(nl_err("subscribing to nftables trace events"))?;
        if netlink::setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &RCVBUF).is_err()
        {
            let _ = netlink::setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &RCVBUF);
        }
        Ok(TraceSocket {
            fd,
            buf: vec![0u64; netlink::RECV_WORDS],
        })
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Every event queued now (does not block).
    pub fn drain(&mut self) -> Result<Vec<TraceEvent>, TraceError> {
        let mut out = Vec::new();
        loop {
            let n = match netlink::recv(self.fd.as_fd(), &mut self.buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(out),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    return Err(TraceError::Netlink {
                        what: "receiving trace events (the kernel dropped some: too many packets \
                               matched)"
                            .into(),
                        source: e,
                    });
                }
                Err(e) => return Err(nl_err("receiving trace events")(e)),
            };
            let trace_type = (NFNL_SUBSYS_NFTABLES << 8) | libc::NFT_MSG_TRACE as u16;
            for (hdr, _) in netlink::messages(netlink::bytes_of(&self.buf, n)) {
                if hdr.nlmsg_type == trace_type
                    && let Some(e) = decode(hdr)
                {
                    out.push(e);
                }
            }
        }
    }
}

/// Owns an `nftnl_trace` for the duration of one decode.
struct Raw(*mut sys::nftnl_trace);

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: allocated by nftnl_trace_alloc, freed once.
        unsafe { sys::nftnl_trace_free(self.0) }
    }
}

impl Raw {
    fn has(&self, attr: u32) -> bool {
        // SAFETY: valid object.
        unsafe { sys::nftnl_trace_is_set(self.0, attr as u16) }
    }
    fn u32(&self, attr: u32) -> Option<u32> {
        // SAFETY: valid object; the attribute is set.
        self.has(attr)
            .then(|| unsafe { sys::nftnl_trace_get_u32(self.0, attr as u16) })
    }
    fn u64(&self, attr: u32) -> Option<u64> {
        // SAFETY: valid object; the attribute is set.
        self.has(attr)
            .then(|| unsafe { sys::nftnl_trace_get_u64(self.0, attr as u16) })
    }
    fn str(&self, attr: u32) -> Option<String> {
        if !self.has(attr) {
            return None;
        }
        // SAFETY: valid object; strings are NUL-terminated and owned by it.
        let p = unsafe { sys::nftnl_trace_get_str(self.0, attr as u16) };
        (!p.is_null()).then(|| {
            // SAFETY: checked non-null above.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        })
    }
}

fn decode(hdr: &libc::nlmsghdr) -> Option<TraceEvent> {
    // SAFETY: allocation; a null result (out of memory) skips the event.
    let t = Raw(unsafe { sys::nftnl_trace_alloc() });
    if t.0.is_null() {
        return None;
    }
    // SAFETY: `hdr` is a complete message inside the receive buffer.
    if unsafe { sys::nftnl_trace_nlmsg_parse(hdr, t.0) } < 0 {
        return None;
    }
    let handle = t.u64(sys::NFTNL_TRACE_RULE_HANDLE);
    let kind = match t.u32(sys::NFTNL_TRACE_TYPE)? as i32 {
        // Falling off the end of a chain is reported as a rule event without a rule (the
        // chain's end marker), verdict `continue`; `nft monitor trace` does not print it.
        libc::NFT_TRACETYPE_RULE if handle.is_none() => EventKind::Return,
        libc::NFT_TRACETYPE_RULE => EventKind::Rule,
        libc::NFT_TRACETYPE_RETURN => EventKind::Return,
        libc::NFT_TRACETYPE_POLICY => EventKind::Policy,
        _ => return None,
    };
    let verdict = if kind == EventKind::Policy {
        t.u32(sys::NFTNL_TRACE_POLICY)
            .map(|p| verdict(p as i32, None))
    } else {
        t.u32(sys::NFTNL_TRACE_VERDICT)
            .map(|v| verdict(v as i32, t.str(sys::NFTNL_TRACE_JUMP_TARGET)))
    };
    Some(TraceEvent {
        id: t.u32(sys::NFTNL_TRACE_ID)?,
        family: nft_backend::live::family_name(t.u32(sys::NFTNL_TRACE_FAMILY).unwrap_or(0)).into(),
        table: t.str(sys::NFTNL_TRACE_TABLE).unwrap_or_default(),
        chain: t.str(sys::NFTNL_TRACE_CHAIN).unwrap_or_default(),
        rule_handle: handle,
        rule_position: None,
        kind,
        verdict,
        nfproto: t.u32(sys::NFTNL_TRACE_NFPROTO),
    })
}

/// The kernel's verdict code (`NF_*` for final verdicts, with the queue number in the upper
/// 16 bits; `NFT_*` negatives for the rest).
pub fn verdict(code: i32, target: Option<String>) -> Verdict {
    match code {
        libc::NFT_CONTINUE => Verdict::Continue,
        libc::NFT_BREAK => Verdict::Break,
        libc::NFT_RETURN => Verdict::Return,
        libc::NFT_JUMP => Verdict::Jump(target.unwrap_or_default()),
        libc::NFT_GOTO => Verdict::Goto(target.unwrap_or_default()),
        c if c >= 0 => match c & 0xff {
            0 => Verdict::Drop, // also NF_DROP_ERR(errno)
            1 => Verdict::Accept,
            2 => Verdict::Stolen,
            3 => Verdict::Queue((c as u32 >> 16) as u16),
            _ => Verdict::Other(c),
        },
        c => Verdict::Other(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_codes_decode_as_nft_prints_them() {
        assert_eq!(verdict(1, None), Verdict::Accept);
        assert_eq!(verdict(0, None), Verdict::Drop);
        assert_eq!(verdict(libc::EPERM << 16, None), Verdict::Drop);
        assert_eq!(verdict(3 | (7 << 16), None), Verdict::Queue(7));
        assert_eq!(verdict(-1, None), Verdict::Continue);
        assert_eq!(verdict(-5, None), Verdict::Return);
        assert_eq!(
            verdict(-3, Some("istio-output".into())),
            Verdict::Jump("istio-output".into())
        );
        assert_eq!(
            verdict(-4, Some("x".into())).to_string(),
            "goto x".to_string()
        );
    }
}
