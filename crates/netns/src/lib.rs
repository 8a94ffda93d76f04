//! Entering a network namespace safely.
//!
//! `setns(CLONE_NEWNET)` changes the namespace of the calling *thread* only. Doing it on a
//! thread of a runtime pool would leak the pod's namespace into unrelated work, so the closure
//! runs on a fresh OS thread that enters the namespace and ends with the closure; the rest of
//! the process never leaves the host namespace.

mod foreign;
mod lock;

pub use foreign::{ForeignError, ForeignNetns, HeldNetns, ensure_foreign};
pub use lock::{LockError, NsLock};

use nix::libc;
use nix::sched::{CloneFlags, setns};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("entering network namespace {path}: {source}")]
    Enter { path: PathBuf, source: nix::Error },
    #[error("network namespace {path}: the worker thread panicked")]
    Panicked { path: PathBuf },
    #[error("could not start a thread for network namespace {path}: {source}")]
    Spawn { path: PathBuf, source: io::Error },
}

impl NetnsError {
    /// True when the namespace itself does not exist (CNI DEL treats that as success).
    pub fn is_missing(&self) -> bool {
        matches!(self, NetnsError::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Runs `f` inside the network namespace at `path` (e.g. `/var/run/netns/pod`, `/proc/PID/ns/net`).
/// With `None`, runs `f` in the caller's namespace, on the caller's thread.
pub fn run_in<T, F>(path: Option<&Path>, f: F) -> Result<T, NetnsError>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    let Some(path) = path else {
        return Ok(f());
    };
    // Open before spawning so a missing namespace is reported without a thread.
    let file = File::open(path).map_err(|source| NetnsError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("netns".into())
            .spawn_scoped(s, move || {
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
                    path: path.to_path_buf(),
                    source,
                })?;
                Ok(f())
            })
            .map_err(|source| NetnsError::Spawn {
                path: path.to_path_buf(),
                source,
            })?;
        handle.join().map_err(|_| NetnsError::Panicked {
            path: path.to_path_buf(),
        })?
    })
}

/// The user namespace owning the calling thread's network namespace, when it is not the
/// process's own (a pod with `hostUsers: false`): some kernel checks want the writer in that
/// user namespace (`xt_owner` refuses `--uid-owner` rules from any other), so a tool run for
/// that namespace enters it first ([`enter_user_ns_before_exec`]). `None`: the same one.
pub fn foreign_user_ns() -> io::Result<Option<std::os::fd::OwnedFd>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;
    const NS_GET_USERNS: libc::c_ulong = 0xb701; // _IO(0xb7, 0x1)
    let net = File::open("/proc/thread-self/ns/net")?;
    // SAFETY: NS_GET_USERNS takes no argument and returns a new descriptor (or -1).
    let fd = unsafe { libc::ioctl(net.as_raw_fd(), NS_GET_USERNS as _) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned to us by the kernel and is owned by nobody else.
    let owner = unsafe { OwnedFd::from_raw_fd(fd) };
    let owner_ino = File::from(owner.try_clone()?).metadata()?.ino();
    let ours = std::fs::metadata("/proc/self/ns/user")?.ino();
    Ok((owner_ino != ours).then_some(owner))
}

/// Makes `cmd`'s child enter the user namespace `user_ns` before it executes (see
/// [`foreign_user_ns`]); `user_ns` must stay open until the child is spawned.
pub fn enter_user_ns_before_exec(cmd: &mut std::process::Command, user_ns: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = user_ns.as_raw_fd();
    // SAFETY: runs in the forked (single-threaded) child before exec and only calls setns(2),
    // setgroups(2), setresgid(2) and setresuid(2), which are async-signal-safe; `fd` is open in
    // the parent, so the child's copy is valid.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWUSER) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Root of that namespace, as nsenter(1) makes it: an exec keeps the capabilities
            // only for its root (setgroups may be denied there; then the groups stay).
            let _ = libc::setgroups(0, std::ptr::null());
            if libc::setresgid(0, 0, 0) != 0 || libc::setresuid(0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The inode identifying the namespace at `path` (to tell namespaces apart, e.g. host vs pod).
pub fn inode(path: &Path) -> io::Result<u64> {
    Ok(NsId::of_path(path)?.ino)
}

/// The identity of a network namespace: device and inode of its nsfs file. Two paths (a
/// `/proc/PID/ns/net` link, a bind mount under `/var/run/netns`) name the same namespace exactly
/// when their ids are equal; paths themselves prove nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
}

impl NsId {
    /// The namespace `path` refers to (follows the `/proc/PID/ns/net` magic link).
    pub fn of_path(path: &Path) -> io::Result<NsId> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(NsId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// The namespace an open namespace file refers to.
    pub fn of_file(file: &File) -> io::Result<NsId> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(NsId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// The calling thread's namespace (threads inside [`run_in`] differ from the process's).
    pub fn current() -> io::Result<NsId> {
        NsId::of_path(Path::new("/proc/thread-self/ns/net"))
    }
}

impl std::fmt::Display for NsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "net:[{}] (dev {})", self.ino, self.dev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_namespace_is_reported_by_path() {
        let err = run_in(Some(Path::new("/nonexistent/netns")), || ()).unwrap_err();
        assert!(err.is_missing());
        assert!(err.to_string().contains("/nonexistent/netns"));
    }

    #[test]
    fn ids_tell_namespaces_apart_not_paths() {
        let own = NsId::current().unwrap();
        assert_eq!(NsId::of_path(Path::new("/proc/self/ns/net")).unwrap(), own);
        assert_eq!(
            NsId::of_file(&File::open("/proc/thread-self/ns/net").unwrap()).unwrap(),
            own
        );
        assert_eq!(inode(Path::new("/proc/self/ns/net")).unwrap(), own.ino);
    }

    #[test]
    fn none_runs_in_place() {
        assert_eq!(run_in(None, || 7).unwrap(), 7);
    }
}
