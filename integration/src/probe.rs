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
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// One listening port, bound on 0.0.0.0 and (when the namespace has IPv6) on [::].
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
        let sockets = netns::run_in(Some(ns), move || open_listeners(&listen))
            .map_err(io::Error::other)??;
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

/// A client connection: destination, and who connects from where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectSpec {
    pub dst: IpAddr,
    pub port: u16,
    /// Connect as this uid (`None`: stay root).
    pub uid: Option<u32>,
    /// Connect as this gid (`None`: stay in group 0). Supplementary groups are dropped
    /// whenever uid or gid is set.
    pub gid: Option<u32>,
    /// Bind this source address (port 0) before connecting.
    pub src: Option<IpAddr>,
    /// `SO_MARK` on the client socket (as ztunnel marks its own sockets); needs root.
    pub mark: Option<u32>,
    pub timeout: Duration,
}

impl ConnectSpec {
    pub fn new(dst: IpAddr, port: u16) -> Self {
        ConnectSpec {
            dst,
            port,
            uid: None,
            gid: None,
            src: None,
            mark: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }
    pub fn uid(mut self, uid: u32) -> Self {
        self.uid = Some(uid);
        self
    }
    pub fn gid(mut self, gid: u32) -> Self {
        self.gid = Some(gid);
        self
    }
    pub fn src(mut self, src: IpAddr) -> Self {
        self.src = Some(src);
        self
    }
    pub fn mark(mut self, mark: u32) -> Self {
        self.mark = Some(mark);
        self
    }
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Opens a TCP connection from inside `ns` as described by `spec` and reports where it
/// landed. Runs on its own thread, which alone changes identity (raw setresuid/setresgid,
/// not glibc's process-wide setuid) and ends with the call.
pub fn connect(ns: &Path, spec: &ConnectSpec) -> Outcome {
    in_ns_as(ns, spec, || tcp_client(spec))
}

/// Sends one UDP datagram from inside `ns` as described by `spec` and reports which UDP
/// listener answered (e.g. the DNS proxy on 15053 or a world server on 53).
/// No answer within the timeout is [`Outcome::Timeout`].
pub fn send_udp(ns: &Path, spec: &ConnectSpec) -> Outcome {
    in_ns_as(ns, spec, || udp_client(spec))
}

fn in_ns_as(ns: &Path, spec: &ConnectSpec, f: impl FnOnce() -> Outcome + Send) -> Outcome {
    let r = netns::run_in(Some(ns), || {
        if let Err(e) = become_ids(spec.uid, spec.gid) {
            return Outcome::Failed(format!("changing identity: {e}"));
        }
        f()
    });
    r.unwrap_or_else(|e| Outcome::Failed(e.to_string()))
}

/// Changes the calling thread's credentials only. Linux keeps credentials per thread; glibc's
/// setuid() would broadcast the change to every thread of the test process.
fn become_ids(uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    // SAFETY: raw credential syscalls with plain integer arguments.
    unsafe {
        cvt(libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) as i32)?;
        if let Some(g) = gid {
            cvt(libc::syscall(libc::SYS_setresgid, g, g, g) as i32)?;
        }
        if let Some(u) = uid {
            cvt(libc::syscall(libc::SYS_setresuid, u, u, u) as i32)?;
        }
    }
    Ok(())
}

fn tcp_client(spec: &ConnectSpec) -> Outcome {
    let deadline = Instant::now() + spec.timeout;
    let v6 = spec.dst.is_ipv6();
    let fd = match new_socket(v6, libc::SOCK_STREAM | libc::SOCK_NONBLOCK) {
        Ok(fd) => fd,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    if let Some(src) = spec.src
        && let Err(e) = bind(&fd, SocketAddr::new(src, 0))
    {
        return Outcome::Failed(format!("bind {src}: {e}"));
    }
    if let Some(mark) = spec.mark
        && let Err(e) = setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_MARK, mark as i32)
    {
        return Outcome::Failed(format!("SO_MARK {mark:#x}: {e}"));
    }
    let (sa, sl) = to_storage(SocketAddr::new(spec.dst, spec.port));
    // SAFETY: valid socket and sockaddr.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_storage).cast(),
            sl,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return errno_outcome(e);
        }
        match wait(&fd, libc::POLLOUT, deadline) {
            Ok(true) => {}
            Ok(false) => return Outcome::Timeout,
            Err(e) => return Outcome::Failed(e.to_string()),
        }
        match getsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_ERROR) {
            Ok(0) => {}
            Ok(err) => return errno_outcome(io::Error::from_raw_os_error(err)),
            Err(e) => return Outcome::Failed(e.to_string()),
        }
    }
    match read_reply(&fd, deadline) {
        Ok(Some(line)) => parse_reply(&line),
        Ok(None) => Outcome::Timeout,
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => Outcome::Refused,
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

fn udp_client(spec: &ConnectSpec) -> Outcome {
    let deadline = Instant::now() + spec.timeout;
    let v6 = spec.dst.is_ipv6();
    let fd = match new_socket(v6, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK) {
        Ok(fd) => fd,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    if let Some(src) = spec.src
        && let Err(e) = bind(&fd, SocketAddr::new(src, 0))
    {
        return Outcome::Failed(format!("bind {src}: {e}"));
    }
    if let Some(mark) = spec.mark
        && let Err(e) = setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_MARK, mark as i32)
    {
        return Outcome::Failed(format!("SO_MARK {mark:#x}: {e}"));
    }
    let (sa, sl) = to_storage(SocketAddr::new(spec.dst, spec.port));
    let msg = b"probe";
    // SAFETY: valid socket, buffer and sockaddr.
    let rc = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_storage).cast(),
            sl,
        )
    };
    if rc < 0 {
        return errno_outcome(io::Error::last_os_error());
    }
    match read_reply(&fd, deadline) {
        Ok(Some(line)) => parse_reply(&line),
        Ok(None) => Outcome::Timeout,
        Err(e) => errno_outcome(e),
    }
}

fn errno_outcome(e: io::Error) -> Outcome {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => Outcome::Refused,
        Some(libc::ETIMEDOUT) => Outcome::Timeout,
        _ => Outcome::Failed(e.to_string()),
    }
}

/// Reads until newline or EOF; `None` on timeout.
fn read_reply(fd: &OwnedFd, deadline: Instant) -> io::Result<Option<String>> {
    let mut buf = Vec::new();
    loop {
        if !wait(fd, libc::POLLIN, deadline)? {
            return Ok(None);
        }
        let mut chunk = [0u8; 256];
        // SAFETY: reading into a valid buffer.
        let n = unsafe { libc::recv(fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf.extend_from_slice(&chunk[..n as usize]);
        if n == 0 || buf.contains(&b'\n') {
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
    }
}

fn parse_reply(line: &str) -> Outcome {
    let mut it = line.split_whitespace();
    let (Some(probe), Some(port), Some(orig)) = (it.next(), it.next(), it.next()) else {
        return Outcome::Failed(format!("connected, but no probe answer ({line:?})"));
    };
    let Ok(port) = port.parse() else {
        return Outcome::Failed(format!("bad probe answer {line:?}"));
    };
    Outcome::Landed(Landed {
        probe: probe.to_string(),
        port,
        orig_dst: orig.parse().ok(),
    })
}

/// Polls for `events` until `deadline`; false on timeout.
fn wait(fd: &OwnedFd, events: libc::c_short, deadline: Instant) -> io::Result<bool> {
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

fn cvt(rc: i32) -> io::Result<i32> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn new_socket(v6: bool, ty: i32) -> io::Result<OwnedFd> {
    let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket() has no memory preconditions; the fd is owned right away.
    let fd = cvt(unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn setsockopt_int(fd: &OwnedFd, level: i32, name: i32, v: i32) -> io::Result<()> {
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

fn getsockopt_int(fd: &OwnedFd, level: i32, name: i32) -> io::Result<i32> {
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

fn bind(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
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

fn sockname(fd: &OwnedFd, peer: bool) -> io::Result<SocketAddr> {
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
fn original_dst(fd: &OwnedFd, v6: bool) -> Option<SocketAddr> {
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

fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
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

fn to_storage(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
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

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: valid 2-int array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: fresh fds we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
