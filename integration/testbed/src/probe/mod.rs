//! The landing probe: where did a connection end up, and what was its original destination?
//!
//! Listeners are created inside the target namespace (a socket belongs to the namespace it
//! was created in) and then served from one ordinary thread per [`Probe`]. Each accepted TCP
//! connection is answered with one line `"<probe> <port> <orig_dst>"`, each UDP datagram
//! with `"<probe> <port> -"`, so the client learns where it landed without sharing state
//! with the server, also when the listener lives in another namespace.

use std::fmt;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

mod client;
mod sock;

pub use client::{ConnectSpec, connect, send_udp};
use sock::*;
use std::time::Duration;

/// Timeout for connections that are expected NOT to connect (dropped SYNs, TPROXY without a
/// listener). Everything in these tests is local, so a real connection takes well under 1 ms.
pub const SHORT_TIMEOUT: Duration = Duration::from_millis(300);

/// Default client timeout. A local connection takes well under 1 ms, but on a loaded 2-core
/// machine a test thread can stall; staying above TCP's 1 s SYN retransmit also survives one
/// lost SYN. Pass [`SHORT_TIMEOUT`] where no connection is expected.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Tcp,
    Udp,
}

/// What kind of listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListenKind {
    Tcp,
    /// TCP with IP_TRANSPARENT/IPV6_TRANSPARENT, as Envoy's inbound listener in TPROXY mode.
    /// It also accepts ordinary (REDIRECTed) connections.
    Tproxy,
    Udp,
}

/// One listening port, bound on 0.0.0.0 and (when the namespace has IPv6) on `[::]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listen {
    pub port: u16,
    pub kind: ListenKind,
}

impl Listen {
    pub const fn tcp(port: u16) -> Self {
        Listen {
            port,
            kind: ListenKind::Tcp,
        }
    }
    pub const fn tproxy(port: u16) -> Self {
        Listen {
            port,
            kind: ListenKind::Tproxy,
        }
    }
    pub const fn udp(port: u16) -> Self {
        Listen {
            port,
            kind: ListenKind::Udp,
        }
    }
}

/// One connection (TCP) or datagram (UDP) a probe received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub probe: String,
    pub transport: Transport,
    /// The listener's port.
    pub port: u16,
    /// The socket's local address (UDP: the listener's bound address).
    pub local: SocketAddr,
    /// See [`Landed::orig_dst`].
    pub orig_dst: Option<SocketAddr>,
    pub peer: SocketAddr,
}

/// Where a client's connection landed. `Eq`, so two backends' results compare directly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Landed {
    /// The name of the probe that accepted it (e.g. "pod" or "world").
    pub probe: String,
    /// The listener port it landed on.
    pub port: u16,
    /// TCP: conntrack's pre-NAT destination (`SO_ORIGINAL_DST` / `IP6T_SO_ORIGINAL_DST`); for
    /// a connection conntrack does not track (no NAT possible) or a TPROXY listener, the
    /// socket's local address, which then is the original destination. UDP: `None`.
    pub orig_dst: Option<SocketAddr>,
}

impl Landed {
    /// Whether the connection was diverted from the port it was sent to.
    pub fn redirected(&self) -> bool {
        self.orig_dst.is_some_and(|o| o.port() != self.port)
    }
}

/// The result of [`connect`] / [`send_udp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Landed(Landed),
    /// RST / ICMP port unreachable.
    Refused,
    /// No answer within the timeout (e.g. dropped, or no UDP listener).
    Timeout,
    /// Anything else (unreachable network, connected but no probe answer, …).
    Failed(String),
}

impl Outcome {
    pub fn landed(&self) -> Option<&Landed> {
        match self {
            Outcome::Landed(l) => Some(l),
            _ => None,
        }
    }
    pub fn landed_port(&self) -> Option<u16> {
        self.landed().map(|l| l.port)
    }
    pub fn orig_dst(&self) -> Option<SocketAddr> {
        self.landed().and_then(|l| l.orig_dst)
    }

    /// Where it landed; panics, naming what was expected and what happened, unless it landed
    /// on `probe`'s `port`, with `orig` as its original destination when `orig` is given.
    #[track_caller]
    pub fn assert_lands(&self, probe: &str, port: u16, orig: Option<SocketAddr>) -> &Landed {
        let l = self
            .landed()
            .unwrap_or_else(|| panic!("expected to land on {probe}:{port}, got {self}"));
        assert_eq!((l.probe.as_str(), l.port), (probe, port), "{self}");
        if orig.is_some() {
            assert_eq!(l.orig_dst, orig, "{self}");
        }
        l
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Landed(l) => {
                write!(f, "landed on {}:{}", l.probe, l.port)?;
                if let Some(o) = l.orig_dst {
                    write!(f, " (orig {o})")?;
                }
                Ok(())
            }
            Outcome::Refused => f.write_str("refused"),
            Outcome::Timeout => f.write_str("timeout"),
            Outcome::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

/// Listeners in one namespace, served by one thread until the probe is dropped.
pub struct Probe {
    name: String,
    records: Arc<Mutex<Vec<Accepted>>>,
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

/// Ports of an Istio sidecar: Envoy outbound/inbound (15006 transparent, so it serves both
/// REDIRECT and TPROXY), tunnel, agent, health, metrics, an app port, the DNS proxy (UDP).
const SIDECAR: [Listen; 8] = [
    Listen::tcp(15001),
    Listen::tproxy(15006),
    Listen::tcp(15008),
    Listen::tcp(15020),
    Listen::tcp(15021),
    Listen::tcp(15090),
    Listen::tcp(8080),
    Listen::udp(15053),
];

/// A "rest of the world" server: HTTP-ish ports, a port Envoy's outbound exclusion tests use,
/// and DNS over TCP and UDP.
const WORLD: [Listen; 7] = [
    Listen::tcp(80),
    Listen::tcp(443),
    Listen::tcp(8080),
    Listen::tcp(15020),
    Listen::tcp(9999),
    Listen::tcp(53),
    Listen::udp(53),
];

struct Socket {
    fd: OwnedFd,
    listen: Listen,
    v6: bool,
}

impl Probe {
    /// Starts listeners for `listen` inside the namespace at `ns`, named `name` in results.
    pub fn start(ns: &Path, name: &str, listen: &[Listen]) -> io::Result<Probe> {
        let listen = listen.to_vec();
        let sockets = crate::run_in(Some(ns), move || open_listeners(&listen))??;
        let (rd, wr) = pipe()?;
        let records = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let records = records.clone();
            let name = name.to_string();
            std::thread::Builder::new()
                .name(format!("probe-{name}"))
                .spawn(move || serve(&name, sockets, rd, &records))?
        };
        Ok(Probe {
            name: name.to_string(),
            records,
            wake: wr,
            thread: Some(thread),
        })
    }

    /// A sidecar's listeners, named "pod": TCP 15001, 15006 (transparent), 15008, 15020,
    /// 15021, 15090, 8080 and UDP 15053.
    pub fn sidecar(ns: &Path) -> io::Result<Probe> {
        Self::start(ns, "pod", &SIDECAR)
    }

    /// Servers for the world side, named "world": TCP 80, 443, 8080, 15020, 9999, 53 and UDP 53.
    pub fn world(ns: &Path) -> io::Result<Probe> {
        Self::start(ns, "world", &WORLD)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Everything received so far, in order.
    pub fn accepted(&self) -> Vec<Accepted> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // SAFETY: writing one byte from a valid buffer to our own pipe.
        unsafe { libc::write(self.wake.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn open_listeners(listen: &[Listen]) -> io::Result<Vec<Socket>> {
    let mut out = Vec::new();
    for l in listen {
        out.push(listener(*l, false)?);
        match listener(*l, true) {
            Ok(s) => out.push(s),
            // IPv6 disabled in this namespace: IPv4 only.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn listener(l: Listen, v6: bool) -> io::Result<Socket> {
    let ty = if l.kind == ListenKind::Udp {
        libc::SOCK_DGRAM
    } else {
        libc::SOCK_STREAM
    };
    // Non-blocking, so a connection reset between poll() and accept() cannot hang the probe.
    let fd = new_socket(v6, ty | libc::SOCK_NONBLOCK)?;
    setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if v6 {
        // Separate v4 and v6 sockets: SO_ORIGINAL_DST on a v4-mapped connection of a
        // dual-stack socket is not something to rely on.
        setsockopt_int(&fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
    }
    if l.kind == ListenKind::Tproxy {
        if v6 {
            setsockopt_int(&fd, libc::SOL_IPV6, libc::IPV6_TRANSPARENT, 1)?;
        } else {
            setsockopt_int(&fd, libc::SOL_IP, libc::IP_TRANSPARENT, 1)?;
        }
    }
    let any = if v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    bind(&fd, SocketAddr::new(any, l.port))?;
    if l.kind != ListenKind::Udp {
        // SAFETY: listen on a valid socket.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    }
    Ok(Socket { fd, listen: l, v6 })
}

fn serve(name: &str, sockets: Vec<Socket>, wake: OwnedFd, records: &Mutex<Vec<Accepted>>) {
    let mut fds: Vec<libc::pollfd> = sockets
        .iter()
        .map(|s| s.fd.as_raw_fd())
        .chain([wake.as_raw_fd()])
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: fds is a valid array of pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds.last().is_some_and(|p| p.revents != 0) {
            return;
        }
        for (p, s) in fds.iter_mut().zip(&sockets) {
            if p.revents == 0 {
                continue;
            }
            p.revents = 0;
            // Recorded before the answer goes out: a client that got its answer must find
            // its connection in `accepted()`.
            let record = |rec: Accepted| {
                if let Ok(mut r) = records.lock() {
                    r.push(rec);
                }
            };
            // `None`: this wake-up had nothing to serve (e.g. the peer already reset).
            let _ = match s.listen.kind {
                ListenKind::Udp => serve_udp(name, s, record),
                _ => serve_tcp(name, s, record),
            };
        }
    }
}

fn serve_tcp(name: &str, s: &Socket, record: impl FnOnce(Accepted)) -> Option<()> {
    // SAFETY: accept4 on a listening socket; the peer address is not needed from it.
    let fd = unsafe {
        libc::accept4(
            s.fd.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: accept4 returned a fresh fd we now own.
    let conn = unsafe { OwnedFd::from_raw_fd(fd) };
    let local = sockname(&conn, false).ok()?;
    let peer = sockname(&conn, true).ok()?;
    let orig = original_dst(&conn, s.v6).unwrap_or(local);
    record(Accepted {
        probe: name.to_string(),
        transport: Transport::Tcp,
        port: s.listen.port,
        local,
        orig_dst: Some(orig),
        peer,
    });
    let line = format!("{name} {} {orig}\n", s.listen.port);
    // MSG_NOSIGNAL: a client that already gave up must not SIGPIPE the test process.
    // SAFETY: sending from a valid buffer on our own socket.
    unsafe {
        libc::send(
            conn.as_raw_fd(),
            line.as_ptr().cast(),
            line.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    Some(())
}

fn serve_udp(name: &str, s: &Socket, record: impl FnOnce(Accepted)) -> Option<()> {
    let mut buf = [0u8; 512];
    // SAFETY: zeroed sockaddr_storage is a valid out-buffer for recvfrom.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: buffers are valid for the lengths given.
    let n = unsafe {
        libc::recvfrom(
            s.fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if n < 0 {
        return None;
    }
    let peer = from_storage(&ss)?;
    record(Accepted {
        probe: name.to_string(),
        transport: Transport::Udp,
        port: s.listen.port,
        local: sockname(&s.fd, false).ok()?,
        orig_dst: None,
        peer,
    });
    let line = format!("{name} {} -\n", s.listen.port);
    let (sa, sl) = to_storage(peer);
    // The reply's source may not be the redirected destination, so the client does not
    // connect() its socket and takes the answer from any address.
    // SAFETY: sockaddr and buffer valid for the lengths given.
    unsafe {
        libc::sendto(
            s.fd.as_raw_fd(),
            line.as_ptr().cast(),
            line.len(),
            libc::MSG_DONTWAIT,
            (&sa as *const libc::sockaddr_storage).cast(),
            sl,
        )
    };
    Some(())
}
