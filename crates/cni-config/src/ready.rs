//! The readiness contract between install-cni (a long-lived daemon) and the plugin (a process
//! the runtime starts for each STATUS): both live on the node's run dir.
//!
//! - `istio-cni-ready.lock`: the daemon holds an exclusive `flock` on it for as long as it runs.
//!   The kernel drops the lock when the process dies, however it dies (SIGKILL, OOM, panic), so
//!   a held lock means "a daemon is alive" without comparing pids across pid namespaces (the
//!   daemon runs in its pod's pid namespace, the plugin in the host's).
//! - `istio-cni-ready`: JSON [`ReadyMarker`], written atomically by the daemon when its install
//!   pass is valid and removed when it is not (and on shutdown).
//!
//! Ready = the marker is a regular file from this boot that parses AND the lock is held.

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The marker's file name inside `cni_agent_run_dir`.
pub const READY_FILE: &str = "istio-cni-ready";
/// The liveness lock's file name inside `cni_agent_run_dir` (never removed: a new daemon must
/// lock the same inode as the one it replaces).
pub const READY_LOCK_FILE: &str = "istio-cni-ready.lock";
/// Format version of [`ReadyMarker`]; a plugin refuses markers of another version.
pub const READY_VERSION: u32 = 1;
/// Mode of both files: the plugin runs as root, but operators may want to read them.
pub const READY_MODE: u32 = 0o644;
/// Markers larger than this are not ours.
const MAX_MARKER_BYTES: u64 = 64 * 1024;

/// What the daemon writes when the node is ready for the plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyMarker {
    pub version: u32,
    /// The conditions met, e.g. `["binaries", "kubeconfig", "cni_config"]` (+ `"ztunnel"` in
    /// ambient mode, once it exists).
    pub ready: Vec<String>,
    /// The daemon's pid in its own pid namespace and its start time (clock ticks since boot,
    /// `/proc/<pid>/stat` field 22): for people reading the file; liveness is the lock.
    pub pid: u32,
    pub pid_start_ticks: u64,
    /// /proc/sys/kernel/random/boot_id when written: a marker from another boot is stale.
    pub boot_id: String,
    pub written_at_unix_ms: u64,
}

impl ReadyMarker {
    /// A marker for this process, now.
    pub fn for_this_process(ready: Vec<String>) -> ReadyMarker {
        let pid = std::process::id();
        ReadyMarker {
            version: READY_VERSION,
            ready,
            pid,
            pid_start_ticks: process_start_ticks(pid).unwrap_or(0),
            boot_id: boot_id().unwrap_or_default(),
            written_at_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }
}

/// Why the node is not ready (the text goes into the plugin's CNI error).
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("{0} does not exist (install-cni has not finished installing, or is not running)")]
    NoMarker(PathBuf),
    #[error("{path} is not a regular file; refusing to trust it")]
    NotRegular { path: PathBuf },
    #[error("reading {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is not a readiness marker (version {READY_VERSION}): {why}")]
    Malformed { path: PathBuf, why: String },
    #[error("{path} was written before this boot (boot id {marker}, now {now})")]
    OtherBoot {
        path: PathBuf,
        marker: String,
        now: String,
    },
    #[error("install-cni (pid {pid} in its namespace) is no longer running: nobody holds {lock}")]
    DaemonGone { pid: u32, lock: PathBuf },
}

pub fn marker_path(run_dir: &Path) -> PathBuf {
    run_dir.join(READY_FILE)
}

pub fn lock_path(run_dir: &Path) -> PathBuf {
    run_dir.join(READY_LOCK_FILE)
}

/// The plugin's check: the marker is valid and its daemon is alive.
pub fn check(run_dir: &Path) -> Result<ReadyMarker, NotReady> {
    let marker = read_marker(&marker_path(run_dir))?;
    let lock = lock_path(run_dir);
    if !lock_is_held(&lock).map_err(|source| NotReady::Io {
        path: lock.clone(),
        source,
    })? {
        return Err(NotReady::DaemonGone {
            pid: marker.pid,
            lock,
        });
    }
    Ok(marker)
}

fn read_marker(path: &Path) -> Result<ReadyMarker, NotReady> {
    let io_err = |source: io::Error| NotReady::Io {
        path: path.to_path_buf(),
        source,
    };
    // O_NOFOLLOW: a link planted at the marker's name is not the daemon's marker.
    let f = match open_nofollow(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(NotReady::NoMarker(path.to_path_buf()));
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(NotReady::NotRegular {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(io_err(e)),
    };
    let meta = f.metadata().map_err(io_err)?;
    if !meta.is_file() {
        return Err(NotReady::NotRegular {
            path: path.to_path_buf(),
        });
    }
    let mut text = String::new();
    f.take(MAX_MARKER_BYTES)
        .read_to_string(&mut text)
        .map_err(io_err)?;
    let malformed = |why: String| NotReady::Malformed {
        path: path.to_path_buf(),
        why,
    };
    let marker: ReadyMarker = serde_json::from_str(&text).map_err(|e| malformed(e.to_string()))?;
    if marker.version != READY_VERSION {
        return Err(malformed(format!("version {}", marker.version)));
    }
    if let Some(now) = boot_id()
        && marker.boot_id != now
    {
        return Err(NotReady::OtherBoot {
            path: path.to_path_buf(),
            marker: marker.boot_id,
            now,
        });
    }
    Ok(marker)
}

fn open_nofollow(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Whether some process holds a lock on `path` that excludes a shared one. Our probe's own
/// shared lock (taken when nobody holds it) goes when the file is closed, at return.
pub fn lock_is_held(path: &Path) -> io::Result<bool> {
    let f = match open_nofollow(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(false);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(true)
    } else {
        Err(e)
    }
}

/// Takes the daemon's exclusive lock on `file` (blocking while another daemon holds it).
/// The lock lasts as long as the returned file is open.
pub fn lock_exclusive(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor the caller owns; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The running kernel's boot id (None where /proc is unavailable).
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Start time of `pid` in clock ticks since boot (`/proc/<pid>/stat` field 22).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces or ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields after the name start at field 3 (state); field 22 is the 20th of them.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &Path, m: &ReadyMarker) {
        std::fs::write(marker_path(dir), serde_json::to_vec(m).unwrap()).unwrap();
    }

    #[test]
    fn ready_only_with_a_valid_marker_and_a_held_lock() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(check(d.path()), Err(NotReady::NoMarker(_))));
        let m = ReadyMarker::for_this_process(vec!["binaries".into()]);
        assert!(m.pid_start_ticks > 0);
        write(d.path(), &m);
        // Marker without a daemon (the SIGKILL case): not ready.
        assert!(matches!(check(d.path()), Err(NotReady::DaemonGone { .. })));
        let lock = File::create(lock_path(d.path())).unwrap();
        assert!(matches!(check(d.path()), Err(NotReady::DaemonGone { .. })));
        lock_exclusive(&lock).unwrap();
        // flock locks belong to the open file description: a second open sees it held.
        assert_eq!(check(d.path()).unwrap(), m);
        drop(lock);
        assert!(matches!(check(d.path()), Err(NotReady::DaemonGone { .. })));
    }

    #[test]
    fn stale_malformed_and_linked_markers_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let lock = File::create(lock_path(d.path())).unwrap();
        lock_exclusive(&lock).unwrap();
        let mut m = ReadyMarker::for_this_process(vec![]);
        m.boot_id = "00000000-0000-0000-0000-000000000000".into();
        write(d.path(), &m);
        assert!(matches!(check(d.path()), Err(NotReady::OtherBoot { .. })));
        m = ReadyMarker::for_this_process(vec![]);
        m.version = 2;
        write(d.path(), &m);
        assert!(matches!(check(d.path()), Err(NotReady::Malformed { .. })));
        let mut f = File::create(marker_path(d.path())).unwrap();
        f.write_all(b"ready").unwrap();
        assert!(matches!(check(d.path()), Err(NotReady::Malformed { .. })));
        let real = d.path().join("elsewhere");
        std::fs::write(
            &real,
            serde_json::to_vec(&ReadyMarker::for_this_process(vec![])).unwrap(),
        )
        .unwrap();
        std::fs::remove_file(marker_path(d.path())).unwrap();
        std::os::unix::fs::symlink(&real, marker_path(d.path())).unwrap();
        assert!(matches!(check(d.path()), Err(NotReady::NotRegular { .. })));
    }

    #[test]
    fn start_ticks_survive_odd_command_names() {
        // Our own entry parses; the parser skips a ')' inside the name.
        assert!(process_start_ticks(std::process::id()).is_some());
        assert_eq!(process_start_ticks(u32::MAX), None);
    }
}
