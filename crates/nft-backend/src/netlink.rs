//! Talking to nf_tables over netlink: one `sendmsg` per batch, ACK collection, dumps. The
//! socket is libmnl's (whose `mnl_*` reference also pulls `mnl-impl` in ahead of `libnftnl.a`
//! for GNU ld); receiving, message iteration and errors are `netlink_wire::socket`'s, as for
//! every other netlink reader and writer.

use netlink_wire::socket::{self as nl, RECV_WORDS, bytes_of, messages, setsockopt};
use nftnl::nftnl_sys as sys;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

pub struct Socket {
    sock: mnl::Socket,
}

/// One answer from the kernel for a message sent with NLM_F_ACK.
pub struct Nack {
    pub seq: u32,
    pub errno: i32,
}

impl Socket {
    pub fn open() -> io::Result<Self> {
        let sock = mnl::Socket::new(mnl::Bus::Netfilter)?;
        let s = Self { sock };
        // A lost reply must not hang a CNI ADD forever.
        s.set_timeout(Some(Duration::from_secs(5)))?;
        Ok(s)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor lives as long as `self.sock`.
        unsafe { BorrowedFd::borrow_raw(mnl_fd(&self.sock)) }
    }

    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        let tv = t
            .map(|t| libc::timeval {
                tv_sec: t.as_secs() as _,
                tv_usec: t.subsec_micros() as _,
            })
            .unwrap_or(libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            });
        setsockopt(self.fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
    }

    /// Sizes the send buffer for a batch of `bytes` (as `nft` does; the FORCE variant works
    /// because we run with CAP_NET_ADMIN) and the receive buffer for the error replies, which
    /// echo the refused message.
    fn size_buffers(&self, bytes: usize) -> io::Result<()> {
        let snd = (bytes + 64 * 1024) as libc::c_int;
        let rcv = (bytes + 256 * 1024) as libc::c_int;
        if setsockopt(self.fd(), libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &snd).is_err() {
            setsockopt(self.fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &snd)?;
        }
        if setsockopt(self.fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &rcv).is_err() {
            setsockopt(self.fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &rcv)?;
        }
        Ok(())
    }

    /// Sends a whole batch in ONE sendmsg (a batch split over several datagrams is rejected
    /// with EINVAL) and returns the messages the kernel refused; empty means committed.
    ///
    /// nfnetlink processes a batch synchronously inside `sendmsg`, so every reply is queued
    /// when it returns: instead of one ACK per message (nftnl asks for them), we clear
    /// NLM_F_ACK and drain what is there without blocking, as `nft` does. Errors are reported
    /// whether or not an ACK was asked for. With `exclusive_tables`, creating a table that
    /// already exists fails (EEXIST) instead of silently merging into it.
    pub fn send_batch(
        &self,
        batch: &nftnl::FinalizedBatch,
        exclusive_tables: bool,
    ) -> io::Result<Vec<Nack>> {
        let mut buf: Vec<u8> = Vec::new();
        for page in batch.iter() {
            buf.extend_from_slice(page);
        }
        rewrite_flags(&mut buf, exclusive_tables);
        self.size_buffers(buf.len())?;
        nl::send(self.fd(), &buf)?;
        self.drain_replies()
    }

    fn drain_replies(&self) -> io::Result<Vec<Nack>> {
        let mut nacks = Vec::new();
        let mut buf = vec![0u64; RECV_WORDS];
        let portid = self.sock.portid();
        loop {
            let n = match nl::recv(self.fd(), &mut buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(nacks),
                Err(e) => return Err(e),
            };
            for (hdr, payload) in messages(bytes_of(&buf, n)) {
                if hdr.nlmsg_pid != portid && hdr.nlmsg_pid != 0 {
                    continue;
                }
                if let Some(Err(e)) = nl::outcome(hdr, payload) {
                    nacks.push(Nack {
                        seq: hdr.nlmsg_seq,
                        errno: e.raw_os_error().unwrap_or(libc::EIO),
                    });
                }
            }
        }
    }

    /// Sends a dump request and passes every reply message to `each` until NLMSG_DONE.
    pub fn dump(
        &self,
        request: &[u8],
        mut each: impl FnMut(&libc::nlmsghdr, *const libc::nlmsghdr),
    ) -> io::Result<()> {
        nl::dump(self.fd(), request, |hdr, _| {
            each(hdr, hdr as *const libc::nlmsghdr)
        })
    }
}

fn mnl_fd(sock: &mnl::Socket) -> i32 {
    // SAFETY: mnl_socket_get_fd only reads the socket struct.
    unsafe { mnl::mnl_sys::mnl_socket_get_fd(sock.as_raw_socket()) }
}

/// Builds a dump request (`NFT_MSG_GET*` with NLM_F_DUMP) for one family.
pub fn dump_request(
    msg_type: u32,
    family: u16,
    seq: u32,
    fill: impl FnOnce(*mut libc::nlmsghdr),
) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: the buffer is larger than any header + table-name payload we build.
    unsafe {
        let hdr = sys::nftnl_nlmsg_build_hdr(
            buf.as_mut_ptr().cast(),
            msg_type as u16,
            family,
            (libc::NLM_F_DUMP | libc::NLM_F_ACK) as u16,
            seq,
        );
        fill(hdr);
        let len = (*hdr).nlmsg_len as usize;
        buf.truncate(len);
    }
    buf
}

const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// Clears NLM_F_ACK on every message of a batch buffer and, with `exclusive_tables`, marks
/// table creations NLM_F_EXCL (so an existing table fails the batch instead of being merged).
fn rewrite_flags(buf: &mut [u8], exclusive_tables: bool) {
    let hl = std::mem::size_of::<libc::nlmsghdr>();
    let new_table = (NFNL_SUBSYS_NFTABLES << 8) | libc::NFT_MSG_NEWTABLE as u16;
    let mut off = 0;
    while off + hl <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
        if len < hl || off + len > buf.len() {
            break;
        }
        let ty = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap());
        let mut flags = u16::from_ne_bytes(buf[off + 6..off + 8].try_into().unwrap());
        flags &= !(libc::NLM_F_ACK as u16);
        if exclusive_tables && ty == new_table {
            flags |= (libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16;
        }
        buf[off + 6..off + 8].copy_from_slice(&flags.to_ne_bytes());
        off += (len + 3) & !3;
    }
}
