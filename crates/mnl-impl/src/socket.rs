// ---------------------------------------------------------------------------------------------
// sockets

/// `struct mnl_socket` (opaque to C): the fd and the address the kernel bound it to.
pub struct MnlSocket {
    fd: c_int,
    addr: libc::sockaddr_nl,
}

fn sockaddr_nl() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain old data; all-zero is valid.
    let mut a: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    a.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    a
}

/// A netlink socket of protocol `bus`; NULL (errno from socket(2)) on failure.
#[unsafe(no_mangle)]
pub extern "C" fn mnl_socket_open(bus: c_int) -> *mut MnlSocket {
    mnl_socket_open2(bus, 0)
}

/// `flags` are OR-ed into the socket type: SOCK_CLOEXEC, SOCK_NONBLOCK, nothing else (EINVAL).
#[unsafe(no_mangle)]
pub extern "C" fn mnl_socket_open2(bus: c_int, flags: c_int) -> *mut MnlSocket {
    if flags & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) != 0 {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | flags, bus) };
    if fd < 0 {
        return ptr::null_mut();
    }
    let mut addr = sockaddr_nl();
    addr.nl_family = 0; // not bound yet
    Box::into_raw(Box::new(MnlSocket { fd, addr }))
}

/// Wraps an existing netlink socket (takes ownership: `mnl_socket_close` closes it).
#[unsafe(no_mangle)]
pub extern "C" fn mnl_socket_fdopen(fd: c_int) -> *mut MnlSocket {
    let mut addr = sockaddr_nl();
    let mut addr_len = size_of::<libc::sockaddr_nl>() as socklen_t;
    // SAFETY: addr is a valid sockaddr_nl-sized out buffer.
    let ret = unsafe { libc::getsockname(fd, ptr::addr_of_mut!(addr).cast(), &mut addr_len) };
    if ret < 0 {
        return ptr::null_mut();
    }
    if i32::from(addr.nl_family) != libc::AF_NETLINK {
        addr = sockaddr_nl();
        addr.nl_family = 0;
    }
    Box::into_raw(Box::new(MnlSocket { fd, addr }))
}

/// Binds to `groups` / `pid` (MNL_SOCKET_AUTOPID: the kernel picks the port id), then records
/// the address the kernel assigned (see `mnl_socket_get_portid`). 0 or -1 with errno. As in
/// libmnl, the requested address is recorded first: after a failed bind, `get_portid` says `pid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_bind(nl: *mut MnlSocket, groups: c_uint, pid: pid_t) -> c_int {
    unsafe {
        let nl = &mut *nl;
        nl.addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        nl.addr.nl_groups = groups;
        nl.addr.nl_pid = pid as u32;
        let len = size_of::<libc::sockaddr_nl>() as socklen_t;
        let ret = libc::bind(nl.fd, ptr::addr_of!(nl.addr).cast(), len);
        if ret < 0 {
            return ret;
        }
        let mut got_len = len;
        let ret = libc::getsockname(nl.fd, ptr::addr_of_mut!(nl.addr).cast(), &mut got_len);
        if ret < 0 {
            return ret;
        }
        if got_len != len || i32::from(nl.addr.nl_family) != libc::AF_NETLINK {
            set_errno(libc::EINVAL);
            return -1;
        }
    }
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_get_fd(nl: *const MnlSocket) -> c_int {
    unsafe { (*nl).fd }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_get_portid(nl: *const MnlSocket) -> c_uint {
    unsafe { (*nl).addr.nl_pid }
}

/// Sends `len` bytes to the kernel (sockaddr_nl with pid 0, groups 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_sendto(
    nl: *const MnlSocket,
    buf: *const c_void,
    len: size_t,
) -> ssize_t {
    let kernel = sockaddr_nl();
    unsafe {
        libc::sendto(
            (*nl).fd,
            buf,
            len,
            0,
            ptr::addr_of!(kernel).cast(),
            size_of::<libc::sockaddr_nl>() as socklen_t,
        )
    }
}

/// Receives one datagram. A datagram larger than `bufsiz` is dropped by the kernel: -1 with
/// errno ENOSPC; a sender address that is not a sockaddr_nl: -1 with EINVAL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_recvfrom(
    nl: *const MnlSocket,
    buf: *mut c_void,
    bufsiz: size_t,
) -> ssize_t {
    let mut addr = sockaddr_nl();
    let mut iov = libc::iovec {
        iov_base: buf,
        iov_len: bufsiz,
    };
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = ptr::addr_of_mut!(addr).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_nl>() as socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let ret = unsafe { libc::recvmsg((*nl).fd, &mut msg, 0) };
    if ret < 0 {
        return ret;
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        set_errno(libc::ENOSPC);
        return -1;
    }
    if msg.msg_namelen as usize != size_of::<libc::sockaddr_nl>() {
        set_errno(libc::EINVAL);
        return -1;
    }
    ret
}

/// Closes the fd and frees the socket; returns close(2)'s result.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_close(nl: *mut MnlSocket) -> c_int {
    let nl = unsafe { Box::from_raw(nl) };
    unsafe { libc::close(nl.fd) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_setsockopt(
    nl: *const MnlSocket,
    ty: c_int,
    buf: *mut c_void,
    len: socklen_t,
) -> c_int {
    unsafe { libc::setsockopt((*nl).fd, SOL_NETLINK, ty, buf, len) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_getsockopt(
    nl: *const MnlSocket,
    ty: c_int,
    buf: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    unsafe { libc::getsockopt((*nl).fd, SOL_NETLINK, ty, buf, len) }
}
