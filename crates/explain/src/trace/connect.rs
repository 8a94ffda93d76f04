//! Making the traced connection. A dedicated thread enters the namespace (outbound), takes the
//! uid/gid on THAT thread only (raw setres*id syscalls: glibc's wrappers change every thread of
//! the process), binds (so the trace rule can match its source port), waits for the trace rule
//! to exist, then connects (TCP) or sends one datagram (UDP).

use super::{Attempt, CONNECT_TIMEOUT, Connection, Direction, Netns, Protocol, TraceError};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrStorage, bind, connect, getsockname, socket, sockopt,
};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

/// A prepared, bound socket on its own thread, waiting for [`Prober::go`].
pub struct Prober {
    pub local: SocketAddr,
    go: mpsc::Sender<()>,
    done: mpsc::Receiver<Attempt>,
    /// The socket's address once the first packet left (the source the kernel chose), even
    /// when the attempt then failed: what conntrack's original tuple holds.
    sent: Arc<OnceLock<SocketAddr>>,
}

fn conn_err(what: &str) -> impl FnOnce(io::Error) -> TraceError + '_ {
    move |source| TraceError::Connect {
        what: what.into(),
        source,
    }
}

impl Prober {
    pub fn start(netns: &Netns, conn: &Connection) -> Result<Prober, TraceError> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<SocketAddr, TraceError>>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<Attempt>();
        let conn = conn.clone();
        let sent = Arc::new(OnceLock::new());
        let sent_by_thread = Arc::clone(&sent);
        let not_entered = ready_tx.clone();
        // Outbound, the attempt is made from inside the namespace (a thread of `netns::run_in`,
        // ended with it, so the credentials it takes die with it too); inbound, from here.
        let inside = match conn.direction {
            Direction::Outbound => netns.clone(),
            Direction::Inbound => Netns::callers(),
        };
        let attempt = move || {
            let (sock, scope) = match prepare(&conn) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
            };
            let local = local_addr(&sock);
            if ready_tx.send(local).is_err() || go_rx.recv().is_err() {
                return Ok(()); // the trace was abandoned before the rule existed
            }
            let _ = done_tx.send(fire(&sock, &conn, scope, &sent_by_thread));
            Ok(())
        };
        std::thread::Builder::new()
            .name("trace-connect".into())
            .spawn(move || {
                if let Err(e) = inside.run(attempt) {
                    let _ = not_entered.send(Err(e));
                }
            })
            .map_err(conn_err("starting the connecting thread"))?;
        let local = ready_rx
            .recv()
            .map_err(|_| conn_err("the connecting thread")(io::Error::other("it panicked")))??;
        Ok(Prober {
            local,
            go: go_tx,
            done: done_rx,
            sent,
        })
    }

    /// Lets the thread connect/send now.
    pub fn go(&self) {
        let _ = self.go.send(());
    }

    /// The attempt's result, if it has finished.
    pub fn poll(&self) -> Option<Attempt> {
        self.done.try_recv().ok()
    }

    /// The attempt's result, waiting up to `timeout` for it (`None`: not finished by then).
    pub fn wait(&self, timeout: Duration) -> Option<Attempt> {
        self.done.recv_timeout(timeout).ok()
    }

    /// The socket's address once its first packet left (`None`: nothing was sent).
    pub fn sent_from(&self) -> Option<SocketAddr> {
        self.sent.get().copied()
    }
}

/// The scope id (interface index, in the namespace the thread is in) a link-local connection
/// is made through; 0 for other addresses. Outbound: the connection's zone (the pod's
/// interface). Inbound, from the caller's namespace: the interface holding `src`, which must
/// then be one of its link-local addresses (the zone names the POD's interface).
fn scope(conn: &Connection) -> Result<u32, TraceError> {
    if !crate::zone::is_link_local(conn.dst.ip()) {
        return Ok(0);
    }
    let invalid = |why: String| Err(TraceError::InvalidConnection(why));
    match conn.direction {
        Direction::Outbound => match conn.zone.as_ref().map(|z| (z, crate::zone::resolve(z))) {
            Some((_, Some((_, index)))) => Ok(index),
            Some((z, None)) => invalid(format!("zone %{z}: no such interface in the pod")),
            None => invalid(format!("link-local {} needs a zone", conn.dst)),
        },
        Direction::Inbound => {
            let owner = conn.src.and_then(|src| {
                nix::ifaddrs::getifaddrs().ok()?.find_map(|ifa| {
                    let a = ifa.address?;
                    (a.as_sockaddr_in6()?.ip() == src).then_some(ifa.interface_name)
                })
            });
            match owner.and_then(|n| crate::zone::resolve(&super::Zone::Name(n))) {
                Some((_, index)) if conn.src.is_some_and(crate::zone::is_link_local) => Ok(index),
                _ => invalid(format!(
                    "an inbound connection to link-local {} made from this namespace needs a \
                     source: a link-local address of this namespace's interface towards the pod",
                    conn.dst.ip()
                )),
            }
        }
    }
}

fn scoped(a: SocketAddr, scope: u32) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) if crate::zone::is_link_local(a.ip()) => {
            SocketAddrV6::new(*v6.ip(), v6.port(), 0, scope).into()
        }
        a => a,
    }
}

/// Takes the credentials (outbound; on a thread inside the namespace), creates and binds the
/// socket; returns it with the scope id of a link-local connection.
fn prepare(conn: &Connection) -> Result<(OwnedFd, u32), TraceError> {
    if conn.direction == Direction::Outbound {
        take_credentials(conn.uid, conn.gid).map_err(conn_err("taking the uid/gid"))?;
    }
    let scope = scope(conn)?;
    let family = if conn.is_ipv6() {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let ty = match conn.protocol {
        Protocol::Tcp => SockType::Stream,
        Protocol::Udp => SockType::Datagram,
    };
    let fd = socket(
        family,
        ty,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| conn_err("creating the socket")(e.into()))?;
    if let Some(mark) = conn.mark {
        // As ztunnel marks its own sockets; needs CAP_NET_ADMIN, which a non-root --uid gave up.
        nix::sys::socket::setsockopt(&fd, sockopt::Mark, &mark).map_err(|e| {
            conn_err(&format!(
                "SO_MARK {mark:#x} (needs CAP_NET_ADMIN: uid 0, as ztunnel runs)"
            ))(e.into())
        })?;
    }
    let any: IpAddr = if conn.is_ipv6() {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    if conn.src.is_some() {
        // The source need not be local (an inbound probe "from" a remote client): only the
        // first packet matters, and it leaves either way.
        let (level, opt) = if conn.is_ipv6() {
            (libc::SOL_IPV6, libc::IPV6_FREEBIND)
        } else {
            (libc::SOL_IP, libc::IP_FREEBIND)
        };
        let one: libc::c_int = 1;
        // Failure only matters for non-local sources, and then bind reports it.
        let _ = netlink_wire::socket::setsockopt(fd.as_fd(), level, opt, &one);
    }
    let src = scoped(SocketAddr::new(conn.src.unwrap_or(any), 0), scope);
    bind(fd.as_raw_fd(), &SockaddrStorage::from(src))
        .map_err(|e| conn_err(&format!("binding to {src}"))(e.into()))?;
    Ok((fd, scope))
}

fn local_addr(fd: &OwnedFd) -> Result<SocketAddr, TraceError> {
    let s: SockaddrStorage =
        getsockname(fd.as_raw_fd()).map_err(|e| conn_err("reading the bound address")(e.into()))?;
    if let Some(a) = s.as_sockaddr_in() {
        Ok(SocketAddr::new(IpAddr::V4(a.ip()), a.port()))
    } else if let Some(a) = s.as_sockaddr_in6() {
        Ok(SocketAddr::new(IpAddr::V6(a.ip()), a.port()))
    } else {
        Err(conn_err("reading the bound address")(io::Error::other(
            "not an IP socket",
        )))
    }
}

/// setgroups/setresgid/setresuid on the calling thread only (raw syscalls).
fn take_credentials(uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    fn check(r: libc::c_long) -> io::Result<()> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    // SAFETY: plain syscalls on the current thread's credentials.
    unsafe {
        check(libc::syscall(
            libc::SYS_setgroups,
            0,
            std::ptr::null::<libc::gid_t>(),
        ))?;
        if let Some(g) = gid {
            check(libc::syscall(libc::SYS_setresgid, g, g, g))?;
        }
        if let Some(u) = uid {
            check(libc::syscall(libc::SYS_setresuid, u, u, u))?;
        }
    }
    Ok(())
}

fn fire(fd: &OwnedFd, conn: &Connection, scope: u32, sent: &OnceLock<SocketAddr>) -> Attempt {
    let dst = SockaddrStorage::from(scoped(conn.dst, scope));
    // The local address right after the first packet left (the SYN is out once connect
    // says EINPROGRESS), before a reset or timeout could clear it.
    let mark_sent = || {
        if let Ok(local) = local_addr(fd) {
            let _ = sent.set(local);
        }
    };
    match conn.protocol {
        // Connected first, so the local address reported is the one the kernel chose.
        Protocol::Udp => match connect(fd.as_raw_fd(), &dst).and_then(|()| {
            nix::sys::socket::send(
                fd.as_raw_fd(),
                b"istio-nftables explain --trace",
                nix::sys::socket::MsgFlags::empty(),
            )
        }) {
            Ok(_) => {
                mark_sent();
                match local_addr(fd) {
                    Ok(local) => Attempt::Sent { local },
                    Err(e) => Attempt::Failed(e.to_string()),
                }
            }
            Err(e) => Attempt::Failed(io::Error::from(e).to_string()),
        },
        Protocol::Tcp => match connect(fd.as_raw_fd(), &dst) {
            Ok(()) => {
                mark_sent();
                connected(fd)
            }
            Err(nix::errno::Errno::EINPROGRESS) => {
                mark_sent();
                wait_connected(fd, CONNECT_TIMEOUT)
            }
            Err(e) => failed(e),
        },
    }
}

fn wait_connected(fd: &OwnedFd, timeout: Duration) -> Attempt {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    let deadline = std::time::Instant::now() + timeout;
    let ready = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32) };
        if r >= 0 {
            break Ok(r);
        }
        let e = nix::errno::Errno::last();
        if e != nix::errno::Errno::EINTR {
            break Err(e);
        }
    };
    match ready {
        Ok(0) => Attempt::TimedOut,
        Ok(_) => match nix::sys::socket::getsockopt(fd, sockopt::SocketError) {
            Ok(0) => connected(fd),
            Ok(errno) => failed(nix::errno::Errno::from_raw(errno)),
            Err(e) => failed(e),
        },
        Err(e) => failed(e),
    }
}

fn connected(fd: &OwnedFd) -> Attempt {
    match local_addr(fd) {
        Ok(local) => Attempt::Connected { local },
        Err(e) => Attempt::Failed(e.to_string()),
    }
}

fn failed(e: nix::errno::Errno) -> Attempt {
    match e {
        nix::errno::Errno::ECONNREFUSED => Attempt::Refused,
        nix::errno::Errno::ETIMEDOUT => Attempt::TimedOut,
        e => Attempt::Failed(io::Error::from(e).to_string()),
    }
}
