//! The socket: SOCK_SEQPACKET unix sockets (one ZDS message per packet, as ztunnel's
//! `src/inpod/packet.rs`), with a netns fd riding along as SCM_RIGHTS. Bytes only: what the
//! bytes mean is `wire`'s business, when to send them the server's.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::sys::socket::{
    self as sock, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};
use tokio::io::Interest;
use tokio::net::{UnixListener, UnixStream};

use crate::wire::MAX_MESSAGE_LEN;

fn seqpacket_socket() -> io::Result<OwnedFd> {
    Ok(sock::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// A listening SOCK_SEQPACKET socket at `path` (which must not exist), for tokio.
pub fn listen(path: &Path) -> io::Result<UnixListener> {
    let fd = seqpacket_socket()?;
    sock::bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    sock::listen(&fd, Backlog::new(128)?)?;
    UnixListener::from_std(std::os::unix::net::UnixListener::from(fd))
}

/// Connects to a SOCK_SEQPACKET socket, as ztunnel does (the peer's side; for tests and fake
/// peers, and to tell a live server from a stale socket file).
pub fn connect(path: &Path) -> io::Result<SeqpacketConn> {
    let fd = seqpacket_socket()?;
    match sock::connect(fd.as_raw_fd(), &UnixAddr::new(path)?) {
        // A unix connect completes at once unless the backlog is full; then wait for it.
        Ok(()) | Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    let stream = UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))?;
    Ok(SeqpacketConn { stream })
}

/// One received packet.
#[derive(Debug)]
pub struct Packet {
    pub bytes: Vec<u8>,
    /// The fd that came with it as SCM_RIGHTS, if any (now owned by the receiver).
    pub fd: Option<OwnedFd>,
}

/// One end of a SOCK_SEQPACKET connection.
#[derive(Debug)]
pub struct SeqpacketConn {
    stream: UnixStream,
}

impl SeqpacketConn {
    pub fn new(stream: UnixStream) -> Self {
        SeqpacketConn { stream }
    }

    /// Sends one packet, with `fd` as SCM_RIGHTS when given. MSG_NOSIGNAL: a peer that went
    /// away is an EPIPE error, not a SIGPIPE that kills the process.
    pub async fn send(&self, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let raw = fd.map(|fd| [fd.as_raw_fd()]);
        let cmsgs: Vec<ControlMessage<'_>> = raw
            .as_ref()
            .map(|r| ControlMessage::ScmRights(r))
            .into_iter()
            .collect();
        let iov = [IoSlice::new(bytes)];
        let sock = self.stream.as_raw_fd();
        self.stream
            .async_io(Interest::WRITABLE, || {
                sock::sendmsg::<()>(sock, &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(io::Error::from)
            })
            .await
            .map(drop)
    }

    /// Receives one packet; `None` when the peer closed the connection. A packet longer than
    /// the protocol's limit or with more than one fd is an `InvalidData` error (fds closed).
    /// Cancel-safe: a packet is either received whole or left in the socket.
    pub async fn recv(&self) -> io::Result<Option<Packet>> {
        loop {
            self.stream.readable().await?;
            match self.stream.try_io(Interest::READABLE, || self.recv_now()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }

    /// A packet already waiting, without waiting for one: `WouldBlock` when there is none,
    /// `None` when the peer closed the connection.
    pub fn try_recv(&self) -> io::Result<Option<Packet>> {
        self.recv_now()
    }

    fn recv_now(&self) -> io::Result<Option<Packet>> {
        // One byte more than the limit, so that an over-long packet shows as MSG_TRUNC.
        let mut buf = vec![0u8; MAX_MESSAGE_LEN + 1];
        let mut cmsg_space = nix::cmsg_space!([RawFd; 2]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = sock::recvmsg::<()>(
            self.stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let (len, flags) = (msg.bytes, msg.flags);
        // Take ownership of every received fd first, so none leaks whatever follows.
        let mut fds: Vec<OwnedFd> = Vec::new();
        for cmsg in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel just installed these fds in our table for us.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if len == 0 && fds.is_empty() {
            return Ok(None); // orderly shutdown (no ZDS message is empty)
        }
        if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) || fds.len() > 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "packet refused: {len} bytes (limit {MAX_MESSAGE_LEN}), {} fds, flags {flags:?}",
                    fds.len()
                ),
            ));
        }
        buf.truncate(len);
        Ok(Some(Packet {
            bytes: buf,
            fd: fds.pop(),
        }))
    }
}
