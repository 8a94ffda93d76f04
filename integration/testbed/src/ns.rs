//! Throwaway network namespaces and the pod/world topology.

use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Per-process counter for namespace names; with the pid it makes names unique across
/// the parallel test threads of one binary and across concurrently running binaries.
static NS_COUNTER: AtomicU32 = AtomicU32::new(0);
/// Per-process counter for subnets. Every namespace pair is isolated, so equal subnets in
/// two worlds would not clash; distinct ones only make failures easier to read.
static SUBNET_COUNTER: AtomicU32 = AtomicU32::new(0);

const NETNS_DIR: &str = "/var/run/netns";

/// A named network namespace (`/var/run/netns/NAME`) with loopback up; deleted on drop.
#[derive(Debug)]
pub struct TestNetns {
    name: String,
    path: PathBuf,
}

impl TestNetns {
    /// A new namespace named `t-<pid>-<n>`.
    pub fn new() -> io::Result<Self> {
        Self::with_prefix("t")
    }

    /// A new namespace named `<prefix>-<pid>-<n>` (the prefix tells which test leaked it,
    /// should a process be killed before its destructors run).
    pub fn with_prefix(prefix: &str) -> io::Result<Self> {
        let n = NS_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        run_ok(Command::new(ip_binary()).args(["netns", "add", &name]))?;
        let ns = TestNetns {
            path: Path::new(NETNS_DIR).join(&name),
            name,
        };
        // From here on Drop removes the namespace, also when bringing lo up fails.
        ns.run(|| set_link_up("lo"))??;
        Ok(ns)
    }

    /// A new namespace owned by a user namespace of its own, mapped as kubelet maps a pod with
    /// `hostUsers: false` (its IDs 0..65536 onto 200000..265536 on the node): made by
    /// `unshare --user --net`, the maps written from here, named with `ip netns attach`, then
    /// the process that made it is gone.
    pub fn in_user_namespace(prefix: &str) -> io::Result<Self> {
        let n = NS_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        let mut maker = Command::new("unshare")
            .args(["--user", "--net", "sleep", "60"])
            .spawn()?;
        let pid = maker.id().to_string();
        let own = std::fs::metadata("/proc/self/ns/net")?.ino();
        let theirs = Path::new("/proc").join(&pid).join("ns/net");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::metadata(&theirs).map(|m| m.ino()).unwrap_or(own) == own {
            if std::time::Instant::now() > deadline {
                let _ = maker.kill();
                return Err(io::Error::other("unshare did not make its namespace"));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let proc_dir = Path::new("/proc").join(&pid);
        let mapped = std::fs::write(proc_dir.join("uid_map"), "0 200000 65536\n")
            .and_then(|()| std::fs::write(proc_dir.join("gid_map"), "0 200000 65536\n"));
        let attached = mapped.and_then(|()| {
            run_ok(Command::new(ip_binary()).args(["netns", "attach", &name, &pid]))
        });
        let _ = maker.kill();
        let _ = maker.wait();
        attached?;
        let ns = TestNetns {
            path: Path::new(NETNS_DIR).join(&name),
            name,
        };
        ns.run(|| set_link_up("lo"))??;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/var/run/netns/NAME`, what the CNI runtime passes as `CNI_NETNS`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a thread inside this namespace (see [`run_in`]).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        run_in(Some(&self.path), f)
    }

    /// Runs `program args…` inside the namespace and returns its output, whatever its exit
    /// status. The child inherits the namespace from the thread that forks it, which is
    /// cheaper than `ip netns exec` (no mount namespace, no /sys remount).
    pub fn exec(&self, program: &str, args: &[&str]) -> io::Result<Output> {
        exec_at(&self.path, program, args)
    }

    /// Like [`exec`](Self::exec) but fails on a non-zero exit (with the command's stderr) and
    /// returns stdout as text.
    pub fn exec_ok(&self, program: &str, args: &[&str]) -> io::Result<String> {
        let out = self.exec(program, args)?;
        check_status(&format!("{program} {}", args.join(" ")), &out)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs a shell script inside the namespace (`sh -c`); fails on a non-zero exit.
    pub fn sh(&self, script: &str) -> io::Result<String> {
        self.exec_ok("sh", &["-c", script])
    }

    /// Feeds `lines` to `ip -n NAME -batch -` (one `ip` process for many commands).
    pub fn ip_batch(&self, lines: &[String]) -> io::Result<()> {
        ip_batch(Some(&self.name), lines)
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        // What `ip netns del` does, done in-process so cleanup works even if `ip` is gone
        // from PATH (some tests hide binaries). The namespace itself dies with its last user.
        if let Ok(c) = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()) {
            // SAFETY: c is a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The addresses of one veth pair between the pod and the world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Interface name, the same on both sides.
    pub name: String,
    pub pod_v4: Ipv4Addr,
    pub world_v4: Ipv4Addr,
    pub pod_v6: Option<Ipv6Addr>,
    pub world_v6: Option<Ipv6Addr>,
}

/// The pod's link-local address on eth0 ([`PodWorld::add_link_local`]).
pub const POD_LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2);
/// The world's link-local address on eth0 ([`PodWorld::add_link_local`]).
pub const WORLD_LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// A pod namespace and a world namespace joined by `eth0` (veth), like a pod and the rest of
/// the cluster: pod 10.X.Y.2/24 + fd00:X:Y::2/64, world 10.X.Y.1 + fd00:X:Y::1, default routes
/// both ways. IPv6 addresses are added with `nodad`, so they are usable at once.
#[derive(Debug)]
pub struct PodWorld {
    pub pod: TestNetns,
    pub world: TestNetns,
    pub pod_v4: Ipv4Addr,
    pub world_v4: Ipv4Addr,
    /// `None` for IPv4-only pods.
    pub pod_v6: Option<Ipv6Addr>,
    pub world_v6: Option<Ipv6Addr>,
    /// `eth0` and any links added later.
    pub links: Vec<Link>,
}

impl PodWorld {
    /// Dual-stack pod.
    pub fn new() -> io::Result<Self> {
        Self::build(true)
    }

    /// IPv4-only pod: no global IPv6 address and no link-local one on eth0 either (so IPv6
    /// auto-detection sees an IPv4 pod); lo keeps ::1.
    pub fn ipv4_only() -> io::Result<Self> {
        Self::build(false)
    }

    fn build(ipv6: bool) -> io::Result<Self> {
        let pod = TestNetns::with_prefix("tp")?;
        let world = TestNetns::with_prefix("tw")?;
        let link = add_link(&pod, &world, "eth0", ipv6, true)?;
        Ok(PodWorld {
            pod_v4: link.pod_v4,
            world_v4: link.world_v4,
            pod_v6: link.pod_v6,
            world_v6: link.world_v6,
            links: vec![link],
            pod,
            world,
        })
    }

    /// Gives eth0 the link-local pair: [`POD_LINK_LOCAL`] on the pod's side,
    /// [`WORLD_LINK_LOCAL`] on the world's (no DAD wait), for connections with a zone.
    pub fn add_link_local(&self) -> io::Result<()> {
        self.pod
            .ip_batch(&[format!("addr add {POD_LINK_LOCAL}/64 dev eth0 nodad")])?;
        self.world
            .ip_batch(&[format!("addr add {WORLD_LINK_LOCAL}/64 dev eth0 nodad")])?;
        Ok(())
    }

    /// Adds another veth pair named `name` on both sides with a fresh subnet (same IPv6 choice
    /// as eth0), without routes: traffic from the world to the pod's address on this link
    /// enters the pod through it.
    pub fn add_link(&mut self, name: &str) -> io::Result<Link> {
        let link = add_link(&self.pod, &self.world, name, self.pod_v6.is_some(), false)?;
        self.links.push(link.clone());
        Ok(link)
    }
}

fn add_link(
    pod: &TestNetns,
    world: &TestNetns,
    name: &str,
    ipv6: bool,
    default_routes: bool,
) -> io::Result<Link> {
    let n = SUBNET_COUNTER.fetch_add(1, Ordering::Relaxed);
    let (x, y) = (1 + (n / 254) % 250, 1 + n % 254);
    let link = Link {
        name: name.to_string(),
        pod_v4: Ipv4Addr::new(10, x as u8, y as u8, 2),
        world_v4: Ipv4Addr::new(10, x as u8, y as u8, 1),
        // fd00:X:Y::/64 with X and Y written in decimal digits (valid hex groups).
        pod_v6: ipv6.then(|| format!("fd00:{x}:{y}::2").parse().unwrap()),
        world_v6: ipv6.then(|| format!("fd00:{x}:{y}::1").parse().unwrap()),
    };
    let side = |me_v4: Ipv4Addr, peer_v4: Ipv4Addr, me_v6: Option<Ipv6Addr>, peer_v6| {
        let mut l = Vec::new();
        if me_v6.is_none() {
            // No link-local address either: must be set before the link goes up.
            l.push(format!("link set {name} addrgenmode none"));
        }
        l.push(format!("link set {name} up"));
        l.push(format!("addr add {me_v4}/24 dev {name}"));
        if default_routes {
            l.push(format!("route add default via {peer_v4} dev {name}"));
        }
        if let (Some(me), Some(peer)) = (me_v6, peer_v6) {
            l.push(format!("addr add {me}/64 dev {name} nodad"));
            if default_routes {
                l.push(format!("route add ::/0 via {peer} dev {name}"));
            }
        }
        l
    };
    // The veth pair is created in the pod with its peer moved straight into the world.
    let mut pod_lines = vec![format!(
        "link add {name} type veth peer name {name} netns {}",
        world.name()
    )];
    pod_lines.extend(side(link.pod_v4, link.world_v4, link.pod_v6, link.world_v6));
    pod.ip_batch(&pod_lines)?;
    world.ip_batch(&side(
        link.world_v4,
        link.pod_v4,
        link.world_v6,
        link.pod_v6,
    ))?;
    // The kernel attaches the real qdisc only when its link watcher sees the carrier (it
    // drops packets until then), which can lag under load; a SYN lost that way costs a
    // 1 s retransmit, so wait until both ends report RUNNING.
    for ns in [pod, world] {
        ns.run(|| wait_running(name))??;
    }
    Ok(link)
}

fn ip_binary() -> &'static str {
    // Tests may narrow PATH to provoke "binary not found" in the code under test; the
    // harness itself must keep working, so it uses the absolute path when there is one.
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("ip")
}

fn ip_batch(netns: Option<&str>, lines: &[String]) -> io::Result<()> {
    let mut cmd = Command::new(ip_binary());
    if let Some(n) = netns {
        cmd.args(["-n", n]);
    }
    cmd.args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let mut script = lines.join("\n");
    script.push('\n');
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    check_status(&format!("ip -batch:\n{script}"), &out)
}

fn run_ok(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.stdin(Stdio::null()).output()?;
    check_status(&format!("{cmd:?}"), &out)
}

/// Runs `f` inside the network namespace at `path` on a fresh thread that enters it
/// (`setns(CLONE_NEWNET)` changes the calling thread only) and ends with `f`; with `None`, on
/// the caller's thread. The rigs' own way in, not the product's `netns::run_in`: testbed
/// depends on no crate of the workspace, so every crate's tests can use it.
pub fn run_in<T: Send>(path: Option<&Path>, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let Some(path) = path else {
        return Ok(f());
    };
    let ns = std::fs::File::open(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("network namespace {}: {e}", path.display()),
        )
    })?;
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("testbed-netns".into())
            .spawn_scoped(s, move || {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
                    io::Error::other(format!(
                        "entering network namespace {}: {e}",
                        path.display()
                    ))
                })?;
                Ok(f())
            })?;
        worker.join().map_err(|_| {
            io::Error::other(format!(
                "network namespace {}: the worker thread panicked",
                path.display()
            ))
        })?
    })
}

/// [`TestNetns::exec`] in the network namespace at `netns`, any nsfs path (a runtime's
/// sandbox namespace, `/proc/PID/ns/net`, a handle's fd path).
pub fn exec_at(netns: &Path, program: &str, args: &[&str]) -> io::Result<Output> {
    run_in(Some(netns), || {
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
    })?
}

fn check_status(what: &str, out: &Output) -> io::Result<()> {
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{what}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Polls until `name` is RUNNING (carrier seen by the link watcher), at most 5 s.
fn wait_running(name: &str) -> io::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if link_flags(name, None)? & libc::IFF_RUNNING as libc::c_short != 0 {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(io::Error::other(format!(
                "{name} did not come up within 5 s"
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// `ip link set NAME up` via SIOCSIFFLAGS, in the calling thread's namespace.
fn set_link_up(name: &str) -> io::Result<()> {
    link_flags(name, Some(libc::IFF_UP as libc::c_short)).map(drop)
}

/// Reads a link's flags (SIOCGIFFLAGS) and, with `add`, sets those flags too.
fn link_flags(name: &str, add: Option<libc::c_short>) -> io::Result<libc::c_short> {
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq whose name fits IFNAMSIZ; the fd is
    // owned and closed by OwnedFd.
    unsafe {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        if name.len() >= req.ifr_name.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "interface name too long",
            ));
        }
        for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = req.ifr_ifru.ifru_flags;
        if let Some(add) = add {
            req.ifr_ifru.ifru_flags |= add;
            if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(flags)
    }
}
