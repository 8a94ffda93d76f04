//! A private containerd: Debian's `containerd` 1.6 with its own config, root, state, runc root
//! and socket under one temporary directory, running inside a [`Node`]'s network namespace so
//! the CNI chain it calls (bridge, portmap, istio-cni) and the host-network containers it runs
//! live in the node, never in the machine's root namespace. The system's containerd (socket,
//! `/var/lib/containerd`, `/run/containerd/containerd.sock`) is neither used nor touched.
//!
//! Drop stops and removes every sandbox through the CRI (both CNI DELs), then kills containerd,
//! force-deletes whatever runc still runs under our runc root, unmounts everything mounted below
//! the directory (sandbox netns bind mounts, rootfs mounts) and removes it.

use crate::node::Node;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The CRI's image namespace (what `ctr -n` must import into for the CRI to see an image).
pub const K8S_NAMESPACE: &str = "k8s.io";
/// The sandbox image the config names; [`crate::cri::images::pause_archive`] builds it.
pub const PAUSE_IMAGE: &str = "localhost/istio-cni-test/pause:1";
/// Bound on containerd's start.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// containerd's default place for sandbox namespaces (`netns_mounts_under_state_dir` false).
pub const MACHINE_NETNS_DIR: &str = "/var/run/netns";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A running (or killed, see [`Containerd::kill`]) private containerd.
pub struct Containerd {
    /// Everything it owns: config, root, state, runc root, socket, log.
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The node namespace it runs in (its CNI calls and host-network containers run there).
    node_netns: PathBuf,
    child: Option<Child>,
    /// It came up once: Drop may start it again to tear down through the CRI.
    came_up: bool,
    /// Sandbox namespaces under its state dir (else under the node's `/var/run/netns`, as
    /// containerd's default: Istio's chart mounts that directory into its agent).
    netns_under_state_dir: bool,
}

impl Containerd {
    /// Writes the config for `node` (CNI conf/bin dirs = the node's layout) and starts it.
    pub fn start(node: &Node) -> io::Result<Containerd> {
        Self::start_with(node, true)
    }

    /// [`Containerd::start`]; `netns_under_state_dir` false: sandbox namespaces mounted at
    /// `/var/run/netns/cni-<uuid>` (containerd's default: the machine's directory, shared by
    /// every runtime on it; names are unique, and Drop removes any of ours left there).
    pub fn start_with(node: &Node, netns_under_state_dir: bool) -> io::Result<Containerd> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("istio-cni-ctrd-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let mut c = Containerd {
            socket: dir.join("containerd.sock"),
            dir,
            node_netns: node.ns.path().to_path_buf(),
            child: None,
            came_up: false,
            netns_under_state_dir,
        };
        fs::write(c.dir.join("config.toml"), c.config(node))?;
        c.spawn()?;
        Ok(c)
    }

    fn config(&self, node: &Node) -> String {
        let d = self.dir.display();
        format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
plugin_dir = ""
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.overlayfs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # runc cannot lower oom_score_adj below its own on this machine (unprivileged parent limits).
  restrict_oom_score_adj = true
  # Sandbox netns bind mounts under our state dir, or /var/run/netns.
  netns_mounts_under_state_dir = {netns_under_state}
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    # native: plain directory copies (no overlay mount, works on any filesystem)
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
"#,
            bin = node.bin_dir.display(),
            conf = node.net_dir.display(),
            netns_under_state = self.netns_under_state_dir,
        )
    }

    /// Starts containerd inside the node namespace and waits until the CRI answers.
    fn spawn(&mut self) -> io::Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let ns_file = fs::File::open(&self.node_netns)?;
        let ns_fd = ns_file.as_raw_fd();
        let mut cmd = Command::new("containerd");
        cmd.arg("--config")
            .arg(self.dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns_fd, libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // Dies with the test process (its shims, which outlive it by design, are
                // cleaned up by Drop).
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.child = Some(cmd.spawn()?);
        drop(ns_file);
        // Up when the CRI answers: after a restart it first recovers its sandboxes and refuses
        // calls ("server is not initialized yet") until done.
        let deadline = Instant::now() + START_TIMEOUT;
        let cri_answers = || {
            self.socket.exists()
                && super::Cri::connect(&self.socket).is_ok_and(|c| c.list_pods().is_ok())
        };
        let mut ready = cri_answers();
        while !ready && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            ready = cri_answers();
        }
        if !ready {
            return Err(io::Error::other(format!(
                "containerd did not start within {START_TIMEOUT:?}:\n{}",
                self.log_tail()
            )));
        }
        self.came_up = true;
        Ok(())
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// The last lines of containerd's log (for failure messages).
    pub fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// `ctr --address <ours> -n k8s.io <args>`.
    pub fn ctr(&self, args: &[&str]) -> io::Result<Output> {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", K8S_NAMESPACE])
            .args(args)
            .stdin(Stdio::null())
            .output()
    }

    /// Imports an OCI archive into the CRI's namespace, unpacked for the CRI's snapshotter.
    pub fn import(&self, archive: &Path) -> io::Result<()> {
        let out = self.ctr(&[
            "images",
            "import",
            "--snapshotter",
            "native",
            &archive.display().to_string(),
        ])?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "ctr images import {}: {}{}",
                archive.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    /// SIGKILL, as a crash would: shims and sandboxes keep running.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts containerd again with the same config, root and state.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    /// Where the CRI plugin mounts sandbox network namespaces (`netns_mounts_under_state_dir`:
    /// its state dir, else [`MACHINE_NETNS_DIR`]), created and made a shared mount (bound onto
    /// itself, as `ip netns add` does), unless a mount point already: a container mounting it
    /// with HostToContainer propagation (the ambient agent's `cniNetnsDir`) then sees the
    /// namespaces mounted after it started, and the CRI accepts the propagation (it refuses
    /// it for a source on a private mount, looked up without resolving links: a hostPath
    /// should be this canonical path). Drop unmounts the state dir's with everything below
    /// `dir`; the machine's stays shared, as `ip netns` leaves it.
    pub fn shared_netns_dir(&self) -> io::Result<PathBuf> {
        let dir = match self.netns_under_state_dir {
            true => self.dir.join("state/io.containerd.grpc.v1.cri/netns"),
            false => PathBuf::from(MACHINE_NETNS_DIR),
        };
        fs::create_dir_all(&dir)?;
        let dir = fs::canonicalize(&dir)?;
        if !mounts_under(&dir).contains(&dir) {
            let bind = [dir.as_os_str(), dir.as_os_str()];
            for (flag, paths) in [("--bind", &bind[..]), ("--make-shared", &bind[..1])] {
                let out = Command::new("mount").arg(flag).args(paths).output()?;
                if !out.status.success() {
                    return Err(io::Error::other(format!(
                        "mount {flag} {}: {}",
                        dir.display(),
                        String::from_utf8_lossy(&out.stderr)
                    )));
                }
            }
        }
        Ok(dir)
    }

    /// Sandbox network namespaces containerd currently has mounted.
    pub fn netns_mounts(&self) -> Vec<PathBuf> {
        mounts_under(&self.dir)
            .into_iter()
            .filter(|m| m.components().any(|c| c.as_os_str() == "netns"))
            // Not the directory itself (see `shared_netns_dir`).
            .filter(|m| m.file_name().is_some_and(|n| n != "netns"))
            .collect()
    }

    /// Last-resort teardown of whatever containerd left running under our runc root.
    fn force_delete_containers(&self) {
        let root = self.dir.join("runc").join(K8S_NAMESPACE);
        let Ok(out) = Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["list", "-q"])
            .output()
        else {
            return;
        };
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(&root)
                .args(["delete", "--force", id])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Shims started by this containerd (their command line names our socket): they outlive
    /// containerd by design, so Drop ends them by pid.
    fn shim_pids(&self) -> Vec<libc::pid_t> {
        let needle = self.socket.display().to_string();
        let Ok(procs) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| {
                        let c = String::from_utf8_lossy(&c).replace('\0', " ");
                        c.contains("containerd-shim") && c.contains(&needle)
                    })
                    .unwrap_or(false)
            })
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // A killed containerd (a test failing between kill and restart) is started again: only
        // it can run the CNI DELs (releasing leases and its CNI result cache) and stop its shims
        // cleanly (they remove their sockets).
        if self.child.is_none() && self.came_up {
            let _ = self.spawn();
        }
        let mut outside = Vec::new();
        if let Ok(cri) = super::Cri::connect(&self.socket) {
            if !self.netns_under_state_dir {
                for p in cri.list_pods().unwrap_or_default() {
                    outside.extend(cri.pod_net(&p.id).ok().and_then(|n| n.netns));
                }
            }
            cri.remove_everything();
        }
        // Namespaces of ours in /var/run/netns that a failed teardown left.
        for ns in outside.iter().filter(|p| p.starts_with(MACHINE_NETNS_DIR)) {
            let _ = nix_umount(ns);
            let _ = fs::remove_file(ns);
        }
        self.kill();
        self.force_delete_containers();
        for pid in self.shim_pids() {
            // SAFETY: kill on a pid we identified as one of our shims.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // Deepest first, lazily: a mount still in use does not keep the directory.
        let mut mounts = mounts_under(&self.dir);
        mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        for m in mounts {
            let _ = nix_umount(&m);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Mount points at or below `dir` (from /proc/self/mountinfo).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect()
}

fn nix_umount(p: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())?;
    // SAFETY: umount2 with a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
