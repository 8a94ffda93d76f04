//! The netfilter netlink socket every kernel reader here opens (nftables trace events,
//! nfnetlink_log, ctnetlink), in the current namespace.

use super::TraceError;
use netlink_wire::socket as netlink;
use nix::sys::socket::SockFlag;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

/// A netlink error naming what was being done.
pub(super) fn nl_err(what: &str) -> impl FnOnce(io::Error) -> TraceError + '_ {
    move |source| TraceError::Netlink {
        what: what.into(),
        source,
    }
}

/// A bound `NETLINK_NETFILTER` socket (close-on-exec, plus `flags`); `name` names it in
/// errors ("the trace socket").
pub(super) fn open(name: &str, flags: SockFlag) -> Result<OwnedFd, TraceError> {
    netlink::open(libc::NETLINK_NETFILTER, flags.bits())
        .map_err(|e| nl_err(&format!("opening {name}"))(e))
}

/// Receives on `fd` block at most `secs` seconds.
pub(super) fn recv_timeout(fd: &OwnedFd, secs: u32, name: &str) -> Result<(), TraceError> {
    let timeout = libc::timeval {
        tv_sec: secs.into(),
        tv_usec: 0,
    };
    netlink::setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout)
        .map_err(|e| nl_err(&format!("setting {name}'s timeout"))(e))
}
