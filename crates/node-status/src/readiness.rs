//! What "ready" means for this node, and how the plugin learns it: the daemon's side of the
//! contract in `cni_config::ready` (marker file + liveness lock in the run dir).
//!
//! The marker is written (atomically, never through a link) when the conditions become met and
//! removed when they stop being met or the daemon shuts down; a SIGKILLed daemon cannot remove
//! it, which is why the plugin also checks the lock the daemon holds for its whole life.

use cni_config::ready::{self as contract, READY_MODE, ReadyMarker};
use node_fs::DIR_MODE;
use std::fs::File;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Everything the plugin needs before pods may be created on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conditions {
    /// The install pass is valid: binaries, kubeconfig and the CNI config entry are in place.
    pub installed: bool,
    /// Ambient mode: ztunnel is connected to the daemon. `None` while ambient is not in use.
    /// Part of `/readyz` and of the node taint's removal, not of the plugin's STATUS (see
    /// `State::publish`).
    pub ztunnel_connected: Option<bool>,
}

impl Conditions {
    pub fn installed() -> Conditions {
        Conditions {
            installed: true,
            ztunnel_connected: None,
        }
    }

    pub fn ready(&self) -> bool {
        self.installed && self.ztunnel_connected.unwrap_or(true)
    }

    /// The names written into the marker's `ready` list.
    pub fn met(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.installed {
            v.extend(["binaries", "kubeconfig", "cni_config"].map(String::from));
        }
        if self.ztunnel_connected == Some(true) {
            v.push("ztunnel".into());
        }
        v
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// The liveness lock, once taken (held until the process exits).
    lock: Option<File>,
    /// What the marker should say: `Some` = ready with these conditions.
    want: Option<Vec<String>>,
    /// What the marker file says now, as far as we wrote it.
    written: Option<Vec<String>>,
}

/// Publishes readiness into the run dir. Cheap to call on every install pass: the file is only
/// touched when the wanted state differs from the written one or the marker went missing.
#[derive(Clone, Debug)]
pub struct Publisher {
    run_dir: PathBuf,
    inner: Arc<Mutex<Inner>>,
}

/// Pause between attempts to open the lock file (run dir not writable yet, say).
const LOCK_RETRY: Duration = Duration::from_secs(1);

impl Publisher {
    /// Starts taking the liveness lock on a thread of its own: `flock` blocks while a previous
    /// daemon (rolling update) still runs, and the install loop must not wait for it. Until the
    /// lock is ours no marker is written.
    pub fn start(run_dir: &Path) -> Publisher {
        let p = Publisher {
            run_dir: run_dir.to_path_buf(),
            inner: Arc::default(),
        };
        let p2 = p.clone();
        std::thread::Builder::new()
            .name("ready-lock".into())
            .spawn(move || p2.take_lock())
            .expect("spawning a thread");
        p
    }

    fn take_lock(&self) {
        let path = contract::lock_path(&self.run_dir);
        let mut warned = false;
        let file = loop {
            match open_lock(&self.run_dir, &path).and_then(|f| {
                if let Err(e) = try_lock(&f) {
                    if !warned {
                        tracing::warn!(lock = %path.display(), error = %e, "waiting for the readiness lock (another install-cni still running?)");
                        warned = true;
                    }
                    contract::lock_exclusive(&f)?;
                }
                Ok(f)
            }) {
                // The daemon we waited for removes the file at shutdown: a lock on the inode
                // it unlinked is seen by no plugin, so lock the file now at the path instead.
                Ok(f) if !still_at(&f, &path) => continue,
                Ok(f) => break f,
                Err(e) => {
                    if !warned {
                        tracing::warn!(lock = %path.display(), error = %e, "cannot take the readiness lock yet; retrying");
                        warned = true;
                    }
                    std::thread::sleep(LOCK_RETRY);
                }
            }
        };
        tracing::debug!(lock = %path.display(), "readiness lock held");
        let mut g = self.lock_inner();
        g.lock = Some(file);
        self.sync(&mut g);
    }

    fn lock_inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets what the marker should say and writes it if we hold the lock.
    pub fn set(&self, c: &Conditions) {
        let mut g = self.lock_inner();
        g.want = c.ready().then(|| c.met());
        self.sync(&mut g);
    }

    /// Whether the marker is on disk now (as far as we know).
    pub fn published(&self) -> bool {
        self.lock_inner().written.is_some()
    }

    fn sync(&self, g: &mut Inner) {
        if g.lock.is_none() {
            return;
        }
        let path = contract::marker_path(&self.run_dir);
        match &g.want {
            Some(met) => {
                let present = node_fs::regular_mode(&path).is_some();
                if g.written.as_ref() == Some(met) && present {
                    return;
                }
                let m = ReadyMarker::for_this_process(met.clone());
                let bytes = serde_json::to_vec(&m).expect("plain struct serializes");
                match node_fs::atomic_write_mode(&path, &bytes, READY_MODE) {
                    Ok(()) => {
                        tracing::info!(ready = ?met, marker = %path.display(), "node ready: the plugin's STATUS now succeeds");
                        g.written = Some(met.clone());
                    }
                    Err(e) => {
                        tracing::warn!(marker = %path.display(), error = %e, "writing the readiness marker");
                        g.written = None;
                    }
                }
            }
            None => {
                if g.written.is_none() && !path.exists() && !node_fs::is_symlink(&path) {
                    return;
                }
                remove_marker(&path);
                g.written = None;
            }
        }
    }

    /// Shutdown: the marker goes, then the lock file (a plugin now finds neither); the lock
    /// itself is held until exit, so a successor waiting on this inode re-opens the path.
    pub fn shutdown(&self) {
        let mut g = self.lock_inner();
        g.want = None;
        self.sync(&mut g);
        if let Some(f) = &g.lock {
            let path = contract::lock_path(&self.run_dir);
            if still_at(f, &path) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Whether `path` is still the file `f` has open (same device and inode).
fn still_at(f: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

fn remove_marker(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::info!(marker = %path.display(), "node not ready: readiness marker removed")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(marker = %path.display(), error = %e, "removing the readiness marker")
        }
    }
}

/// Opens (creating, mode READY_MODE) the lock file. A link planted at its name is replaced,
/// never followed: the lock must be on a file in our run dir.
fn open_lock(run_dir: &Path, path: &Path) -> std::io::Result<File> {
    node_fs::ensure_dir(run_dir, DIR_MODE, true)?;
    if node_fs::is_symlink(path) {
        std::fs::remove_file(path)?;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(READY_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(READY_MODE))?;
    Ok(f)
}

fn try_lock(f: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn wait(mut f: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn conditions_leave_room_for_ztunnel() {
        assert!(!Conditions::default().ready());
        assert!(Conditions::installed().ready());
        let mut c = Conditions::installed();
        c.ztunnel_connected = Some(false);
        assert!(!c.ready());
        c.ztunnel_connected = Some(true);
        assert!(c.ready());
        assert_eq!(c.met().last().map(String::as_str), Some("ztunnel"));
    }

    #[test]
    fn marker_follows_the_conditions_and_replaces_a_planted_link() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        let p = Publisher::start(&run);
        p.set(&Conditions::installed());
        assert!(wait(|| contract::check(&run).is_ok()));
        let marker = contract::marker_path(&run);
        assert_eq!(node_fs::regular_mode(&marker), Some(READY_MODE));
        assert_eq!(
            node_fs::regular_mode(&contract::lock_path(&run)),
            Some(READY_MODE)
        );
        // Deleted behind our back: the next pass puts it back.
        std::fs::remove_file(&marker).unwrap();
        p.set(&Conditions::installed());
        assert!(contract::check(&run).is_ok());
        // A link planted at the marker's name is replaced, its target untouched.
        let target = d.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        std::fs::remove_file(&marker).unwrap();
        std::os::unix::fs::symlink(&target, &marker).unwrap();
        p.set(&Conditions::installed());
        assert!(!node_fs::is_symlink(&marker));
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        p.set(&Conditions::default());
        assert!(!marker.exists());
        assert!(matches!(
            contract::check(&run),
            Err(contract::NotReady::NoMarker(_))
        ));
    }

    #[test]
    fn a_successor_waits_for_the_lock_and_takes_over_after_shutdown() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        let first = Publisher::start(&run);
        first.set(&Conditions::installed());
        assert!(wait(|| contract::check(&run).is_ok()));
        // Rolling update: the successor starts while the first still runs; it must wait.
        let second = Publisher::start(&run);
        second.set(&Conditions::installed());
        // Its thread is queued on the first's lock (the kernel lists it as a waiter: "->").
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(contract::lock_path(&run)).unwrap().ino();
        assert!(wait(|| std::fs::read_to_string("/proc/locks")
            .unwrap()
            .lines()
            .any(|l| l.contains("->") && l.contains(&format!(":{ino} ")))));
        assert!(!second.published());
        first.shutdown();
        assert!(!contract::marker_path(&run).exists());
        assert!(!contract::lock_path(&run).exists());
        assert!(!second.published());
        // The first exits: the successor gets the lock on the unlinked inode, notices, and
        // locks the file at the path instead, where the plugin looks.
        drop(first);
        assert!(wait(|| second.published()));
        assert!(contract::check(&run).is_ok());
    }
}
