//! Refusing to program the wrong namespace: a target path that names the caller's own or the
//! host's network namespace (`/proc/1/ns/net`, `/proc/self/ns/net`, a bind mount of either) would
//! put a pod's redirect on the node itself. Identity is device + inode ([`NsId`]), never the path.

use crate::NsId;
use std::io;
use std::path::{Path, PathBuf};

/// Why a target namespace was refused. The text says what is wrong, not which path: the
/// caller names the setting and its value (`CNI_NETNS "…": …`), so the path is shown once.
#[derive(Debug, thiserror::Error)]
pub enum ForeignError {
    #[error("the host's network namespace ({id}, same as /proc/1/ns/net)")]
    Host { path: PathBuf, id: NsId },
    #[error("this process's own network namespace ({id})")]
    Own { path: PathBuf, id: NsId },
    #[error("not a network namespace ({why})")]
    NotNetns { path: PathBuf, why: String },
    #[error("{source}")]
    Io { path: PathBuf, source: io::Error },
}

impl ForeignError {
    /// The namespace does not exist (DEL treats that as success).
    pub fn is_missing(&self) -> bool {
        matches!(self, ForeignError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// The id of the network namespace at `path`, after checking that it is a network namespace
/// and neither the caller's own (`/proc/thread-self/ns/net`, i.e. call this on a thread that
/// has not entered another namespace) nor the host's (`/proc/1/ns/net`).
pub fn ensure_foreign(path: &Path) -> Result<NsId, ForeignError> {
    let io_err = |source| ForeignError::Io {
        path: path.to_path_buf(),
        source,
    };
    let target = NsId::of_path(path).map_err(io_err)?;
    let own = NsId::current().map_err(io_err)?;
    if target == own {
        return Err(ForeignError::Own {
            path: path.to_path_buf(),
            id: target,
        });
    }
    // Unreadable (e.g. another PID namespace hides PID 1's links): the own-namespace test above
    // still holds; the host check needs this file.
    if let Ok(host) = NsId::of_path(Path::new("/proc/1/ns/net"))
        && target == host
    {
        return Err(ForeignError::Host {
            path: path.to_path_buf(),
            id: target,
        });
    }
    check_is_netns(path)?;
    Ok(target)
}

/// nsfs files of every kind share one device; only a net namespace accepts
/// `ioctl(NS_GET_NSTYPE)` == CLONE_NEWNET. A regular file or directory fails the ioctl.
fn check_is_netns(path: &Path) -> Result<(), ForeignError> {
    use nix::libc;
    use std::os::fd::AsRawFd;
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703; // _IO(0xb7, 0x3)
    let not_netns = |why: String| ForeignError::NotNetns {
        path: path.to_path_buf(),
        why,
    };
    let file = std::fs::File::open(path).map_err(|source| ForeignError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd we own.
    let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE as _) };
    if kind < 0 {
        return Err(not_netns(io::Error::last_os_error().to_string()));
    }
    if kind != libc::CLONE_NEWNET {
        return Err(not_netns(format!("namespace type {kind:#x}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_and_host_namespaces_are_refused_by_identity() {
        for p in [
            "/proc/self/ns/net",
            "/proc/thread-self/ns/net",
            &format!("/proc/{}/ns/net", std::process::id()),
        ] {
            let e = ensure_foreign(Path::new(p)).unwrap_err();
            assert!(
                matches!(e, ForeignError::Own { .. } | ForeignError::Host { .. }),
                "{p}: {e}"
            );
            assert!(e.to_string().contains("namespace"), "{e}");
        }
        // "own" when the tests run in the host namespace; unreadable in some sandboxes (then
        // the plugin cannot enter it either).
        let e = ensure_foreign(Path::new("/proc/1/ns/net")).unwrap_err();
        assert!(
            matches!(
                e,
                ForeignError::Own { .. } | ForeignError::Host { .. } | ForeignError::Io { .. }
            ),
            "{e}"
        );
    }

    #[test]
    fn non_network_namespaces_and_plain_files_are_refused() {
        for p in ["/proc/self/ns/mnt", "/etc/hostname", "/"] {
            let e = ensure_foreign(Path::new(p)).unwrap_err();
            assert!(matches!(e, ForeignError::NotNetns { .. }), "{p}: {e}");
        }
        let e = ensure_foreign(Path::new("/nonexistent/ns")).unwrap_err();
        assert!(e.is_missing());
    }
}
