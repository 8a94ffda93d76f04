//! The netlink socket every reader and writer here uses (rtnetlink in `pod-routes`, nfnetlink
//! under `nft-backend`'s batches and `explain`'s tracers): open and bind, send to the kernel,
//! receive into an aligned buffer, iterate the messages, and turn `NLMSG_ERROR` into results.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Receive buffers are this many u64s: 512 KiB, and 8-byte aligned so a `nlmsghdr` can be
/// read in place (netlink messages are 4-byte aligned within it).
pub const RECV_WORDS: usize = 64 * 1024;

/// A bound netlink socket of `protocol` (`NETLINK_ROUTE`, `NETLINK_NETFILTER`, …), close-on-exec
/// plus the `SOCK_*` `flags`; the kernel picks its port id.
pub fn open(protocol: libc::c_int, flags: libc::c_int) -> io::Result<OwnedFd> {
    open_subscribed(protocol, flags, 0)
}

/// [`open`], subscribed to the multicast `groups` (a bit mask) when bound.
pub fn open_subscribed(
    protocol: libc::c_int,
    flags: libc::c_int,
    groups: u32,
) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; a non-negative result is a descriptor we now own.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | flags,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut addr = kernel_addr();
    addr.nl_groups = groups;
    // SAFETY: `addr` is a valid sockaddr_nl of the size passed.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Port 0, no groups: the kernel as a destination, "pick one for me" when binding.
fn kernel_addr() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr
}

/// Sends `msg` to the kernel in one datagram (a netlink batch must not be split).
pub fn send(fd: BorrowedFd<'_>, msg: &[u8]) -> io::Result<()> {
    let addr = kernel_addr();
    let sent = loop {
        // SAFETY: `msg` and `addr` are valid for the sizes passed.
        let n = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    if sent != msg.len() {
        return Err(io::Error::other(format!(
            "short netlink send: {sent} of {} bytes",
            msg.len()
        )));
    }
    Ok(())
}

/// `setsockopt(2)` with `v` as the option's value (`level`: `SOL_SOCKET`, `SOL_NETLINK`, …).
pub fn setsockopt<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    opt: libc::c_int,
    v: &T,
) -> io::Result<()> {
    // SAFETY: `v` points to a live value of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as u32,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One datagram into `buf` (retried on EINTR); its length in bytes.
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u64], flags: i32) -> io::Result<usize> {
    loop {
        // SAFETY: the buffer is valid for its byte length.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(buf),
                flags,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The first `n` bytes of a receive buffer.
pub fn bytes_of(buf: &[u64], n: usize) -> &[u8] {
    // SAFETY: u64 storage viewed as bytes, within its length.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n.min(8 * buf.len())) }
}

/// Iterates the netlink messages in a receive buffer (header, payload after the header), up
/// to the first one that does not fit.
pub fn messages(mut b: &[u8]) -> impl Iterator<Item = (&libc::nlmsghdr, &[u8])> {
    let hl = crate::NLMSG_HDR;
    std::iter::from_fn(move || {
        if b.len() < hl
            || b.as_ptr()
                .align_offset(std::mem::align_of::<libc::nlmsghdr>())
                != 0
        {
            return None;
        }
        // SAFETY: long enough and aligned (checked above); nlmsghdr is plain data.
        let hdr = unsafe { &*(b.as_ptr().cast::<libc::nlmsghdr>()) };
        let len = hdr.nlmsg_len as usize;
        if len < hl || len > b.len() {
            return None;
        }
        let payload = &b[hl..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((hdr, payload))
    })
}

/// What an `NLMSG_ERROR` message says: `Ok` for an acknowledgement, else the errno. `None`
/// for any other message.
pub fn outcome(hdr: &libc::nlmsghdr, payload: &[u8]) -> Option<io::Result<()>> {
    if hdr.nlmsg_type as i32 != libc::NLMSG_ERROR {
        return None;
    }
    Some(match crate::error_code(payload) {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    })
}

/// Sends a request that asks for an acknowledgement (`NLM_F_ACK`) and waits for it; an errno
/// in `tolerated` ("already exists", "not there") counts as done.
pub fn request(fd: BorrowedFd<'_>, msg: &[u8], tolerated: &[i32]) -> io::Result<()> {
    send(fd, msg)?;
    let mut buf = vec![0u64; RECV_WORDS];
    let n = recv(fd, &mut buf, 0)?;
    match messages(bytes_of(&buf, n)).find_map(|(h, p)| outcome(h, p)) {
        Some(Err(e)) if !tolerated.contains(&e.raw_os_error().unwrap_or(0)) => Err(e),
        _ => Ok(()),
    }
}

/// Sends a dump request and passes every reply message to `each` until `NLMSG_DONE` (or an
/// acknowledgement); an error message ends it with its errno.
pub fn dump(
    fd: BorrowedFd<'_>,
    msg: &[u8],
    mut each: impl FnMut(&libc::nlmsghdr, &[u8]),
) -> io::Result<()> {
    send(fd, msg)?;
    let mut buf = vec![0u64; RECV_WORDS];
    loop {
        let n = recv(fd, &mut buf, 0)?;
        for (hdr, payload) in messages(bytes_of(&buf, n)) {
            if hdr.nlmsg_type as i32 == libc::NLMSG_DONE {
                return Ok(());
            }
            match outcome(hdr, payload) {
                Some(r) => return r,
                None => each(hdr, payload),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_split_padded_and_stop_at_a_truncated_one() {
        let mut b = crate::message(0x10, 0, 1, &[1, 2, 3]);
        b.resize(b.len().next_multiple_of(4), 0);
        b.extend(crate::message(
            libc::NLMSG_ERROR as u16,
            0,
            2,
            &(-libc::EEXIST).to_ne_bytes(),
        ));
        b.extend(&crate::message(0x11, 0, 3, &[0; 8])[..10]);
        let mut words = vec![0u64; b.len().div_ceil(8)];
        bytes_of_mut(&mut words)[..b.len()].copy_from_slice(&b);
        let got: Vec<_> = messages(bytes_of(&words, b.len()))
            .map(|(h, p)| {
                (
                    h.nlmsg_seq,
                    p.to_vec(),
                    outcome(h, p).map(|r| r.map_err(|e| e.raw_os_error())),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (1, vec![1, 2, 3], None),
                (
                    2,
                    (-libc::EEXIST).to_ne_bytes().to_vec(),
                    Some(Err(Some(libc::EEXIST)))
                ),
            ]
        );
    }

    fn bytes_of_mut(buf: &mut [u64]) -> &mut [u8] {
        // SAFETY: u64 storage viewed as bytes, within its length.
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), 8 * buf.len()) }
    }
}
