//! Raw socket helpers (libc): the options, addresses and original destinations the probe needs
//! and std does not expose.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

/// Polls for `events` until `deadline`; false on timeout.
pub(super) fn wait(fd: &OwnedFd, events: libc::c_short, deadline: Instant) -> io::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(n > 0);
    }
}

// ---- thin libc wrappers ----

pub(super) fn cvt(rc: i32) -> io::Result<i32> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub(super) fn new_socket(v6: bool, ty: i32) -> io::Result<OwnedFd> {
    let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket() has no memory preconditions; the fd is owned right away.
    let fd = cvt(unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn setsockopt_int(fd: &OwnedFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: an int option value of the right size.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    })
    .map(drop)
}

pub(super) fn getsockopt_int(fd: &OwnedFd, level: i32, name: i32) -> io::Result<i32> {
    let mut v: i32 = 0;
    let mut len = size_of::<i32>() as libc::socklen_t;
    // SAFETY: an int-sized out buffer.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut v as *mut i32).cast(),
            &mut len,
        )
    })?;
    Ok(v)
}

pub(super) fn bind(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    let (sa, sl) = to_storage(addr);
    // SAFETY: valid sockaddr for its length.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_storage).cast(),
            sl,
        )
    })
    .map(drop)
}

pub(super) fn sockname(fd: &OwnedFd, peer: bool) -> io::Result<SocketAddr> {
    // SAFETY: zeroed storage is a valid out-buffer.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let raw: RawFd = fd.as_raw_fd();
    let p = (&mut ss as *mut libc::sockaddr_storage).cast();
    // SAFETY: out-buffer valid for len.
    cvt(unsafe {
        if peer {
            libc::getpeername(raw, p, &mut len)
        } else {
            libc::getsockname(raw, p, &mut len)
        }
    })?;
    from_storage(&ss).ok_or_else(|| io::Error::other("unexpected address family"))
}

/// conntrack's pre-NAT destination of an accepted TCP connection; `None` when untracked.
pub(super) fn original_dst(fd: &OwnedFd, v6: bool) -> Option<SocketAddr> {
    // SAFETY: zeroed storage is a valid out-buffer large enough for sockaddr_in/_in6.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let (level, len) = if v6 {
        (libc::SOL_IPV6, size_of::<libc::sockaddr_in6>())
    } else {
        (libc::SOL_IP, size_of::<libc::sockaddr_in>())
    };
    let mut len = len as libc::socklen_t;
    // SO_ORIGINAL_DST and IP6T_SO_ORIGINAL_DST are both 80, at their family's level.
    // SAFETY: out-buffer valid for len.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            libc::SO_ORIGINAL_DST,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return None;
    }
    from_storage(&ss)
}

pub(super) fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: family says this is a sockaddr_in.
            let a: &libc::sockaddr_in = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: family says this is a sockaddr_in6.
            let a: &libc::sockaddr_in6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

pub(super) fn to_storage(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: zeroed storage, then filled as the family's struct.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let s: &mut libc::sockaddr_in =
                unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = a.port().to_be();
            s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let s: &mut libc::sockaddr_in6 =
                unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = a.port().to_be();
            s.sin6_addr.s6_addr = a.ip().octets();
            s.sin6_flowinfo = a.flowinfo();
            s.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

pub(super) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: valid 2-int array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: fresh fds we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
