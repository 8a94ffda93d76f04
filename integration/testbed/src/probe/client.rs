//! The client side: a connection (or datagram) made inside a namespace as a given uid/gid,
//! and where the probe's reply says it landed.

use super::sock::*;
use super::{DEFAULT_TIMEOUT, Landed, Outcome};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

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
    /// The interface (in the connecting namespace) link-local `dst` and `src` are scoped to.
    pub zone: Option<String>,
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
            zone: None,
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
    pub fn zone(mut self, interface: &str) -> Self {
        self.zone = Some(interface.to_string());
        self
    }
    /// `ip:port` with the zone's scope id for link-local addresses (in the current namespace).
    fn scoped(&self, ip: IpAddr, port: u16) -> SocketAddr {
        let scope = self.zone.as_ref().map_or(0, |z| {
            let c = std::ffi::CString::new(z.as_str()).unwrap();
            // SAFETY: a NUL-terminated name.
            unsafe { libc::if_nametoindex(c.as_ptr()) }
        });
        match ip {
            IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80 => {
                std::net::SocketAddrV6::new(a, port, 0, scope).into()
            }
            _ => SocketAddr::new(ip, port),
        }
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
    let r = crate::run_in(Some(ns), || {
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
        && let Err(e) = bind(&fd, spec.scoped(src, 0))
    {
        return Outcome::Failed(format!("bind {src}: {e}"));
    }
    if let Some(mark) = spec.mark
        && let Err(e) = setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_MARK, mark as i32)
    {
        return Outcome::Failed(format!("SO_MARK {mark:#x}: {e}"));
    }
    let (sa, sl) = to_storage(spec.scoped(spec.dst, spec.port));
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
        && let Err(e) = bind(&fd, spec.scoped(src, 0))
    {
        return Outcome::Failed(format!("bind {src}: {e}"));
    }
    if let Some(mark) = spec.mark
        && let Err(e) = setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_MARK, mark as i32)
    {
        return Outcome::Failed(format!("SO_MARK {mark:#x}: {e}"));
    }
    let (sa, sl) = to_storage(spec.scoped(spec.dst, spec.port));
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
