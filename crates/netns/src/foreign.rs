//! Refusing to program the wrong namespace: a target path that names the caller's own or the
//! host's network namespace (`/proc/1/ns/net`, `/proc/self/ns/net`, a bind mount of either) would
//! put a pod's redirect on the node itself. Identity is device + inode ([`NsId`]), never the path.
//!
//! The path is opened once and the check runs on that descriptor; the work after it reaches the
//! namespace through the same descriptor ([`ForeignNetns::path`]). Checking a path and opening
//! it again later would let whoever re-points it in between (a symlink swapped, a bind mount
//! replaced while the pod is looked up) move the work into the node's namespace.

use crate::NsId;
use nix::libc;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a target namespace was refused. The text says what is wrong, not which path: the
/// caller names the setting and its value (`CNI_NETNS "…": …`), so the path is shown once.
#[derive(Debug, thiserror::Error)]
pub enum ForeignError {
    #[error("the host's network namespace ({id}, PID 1's)")]
    Host { path: PathBuf, id: NsId },
    #[error("this process's own network namespace ({id})")]
    Own { path: PathBuf, id: NsId },
    #[error("not a network namespace ({why})")]
    NotNetns { path: PathBuf, why: String },
    #[error("{source}")]
    Io { path: PathBuf, source: io::Error },
}

impl ForeignError {
    /// The namespace does not exist (DEL treats that as success). A path that cannot name
    /// anything (a component that is a file, a name too long) is as missing as a removed one.
    pub fn is_missing(&self) -> bool {
        matches!(self, ForeignError::Io { source, .. } if matches!(
            source.raw_os_error(),
            Some(libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG)
        ))
    }
}

/// A network namespace held open, any one (the node's own included): the path it was given
/// was opened once, its type read first through `O_PATH` (a FIFO, a device or a directory is
/// refused without being opened, so it can never block the caller), then checked to be a
/// network namespace. [`ForeignNetns`] adds that it is neither ours nor the host's.
#[derive(Debug)]
pub struct HeldNetns {
    file: File,
    id: NsId,
    path: PathBuf,
}

impl HeldNetns {
    pub fn open(path: &Path) -> Result<HeldNetns, ForeignError> {
        let file = open_namespace_file(path)?;
        check_is_netns(&file, path)?;
        let id = NsId::of_file(&file).map_err(|source| io_error(path, source))?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        Ok(HeldNetns { file, id, path })
    }

    pub fn id(&self) -> NsId {
        self.id
    }

    /// A path naming exactly this namespace while `self` lives, in this process (its own
    /// descriptor's `/proc/self/fd` link).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` inside this namespace on a fresh thread ([`crate::run_in`] through
    /// [`HeldNetns::path`]): it lands here whatever becomes of the path first given.
    pub fn run<T, F>(&self, f: F) -> Result<T, crate::NetnsError>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        crate::run_in(Some(&self.path), f)
    }

    /// Whether the calling thread is in this namespace.
    pub fn is_current(&self) -> io::Result<bool> {
        Ok(NsId::current()? == self.id)
    }
}

/// A network namespace that is neither the caller's own nor the host's, held open.
#[derive(Debug)]
pub struct ForeignNetns(HeldNetns);

impl ForeignNetns {
    /// Opens the namespace at `path` once ([`HeldNetns::open`]) and checks it: neither the
    /// caller's own (`/proc/thread-self/ns/net`, i.e. call this on a thread that has not
    /// entered another namespace) nor the host's (`/proc/1/ns/net`).
    pub fn open(path: &Path) -> Result<ForeignNetns, ForeignError> {
        Self::open_on_node(path, Path::new("/proc"))
    }

    /// [`ForeignNetns::open`], and not the node's by `node_proc` either (the host's /proc as
    /// mounted): a daemon without the host's PID namespace sees its container's own init as
    /// its `/proc/1`.
    pub fn open_on_node(path: &Path, node_proc: &Path) -> Result<ForeignNetns, ForeignError> {
        let held = HeldNetns::open(path)?;
        let id = held.id();
        let own = NsId::current().map_err(|source| io_error(path, source))?;
        if id == own {
            return Err(ForeignError::Own {
                path: path.to_path_buf(),
                id,
            });
        }
        // Unreadable (e.g. another PID namespace hides PID 1's links): the own-namespace test
        // above still holds; the host check needs this file.
        let is_node = |proc: &Path| NsId::of_path(&proc.join("1/ns/net")).is_ok_and(|n| n == id);
        if is_node(Path::new("/proc")) || is_node(node_proc) {
            return Err(ForeignError::Host {
                path: path.to_path_buf(),
                id,
            });
        }
        Ok(ForeignNetns(held))
    }

    pub fn id(&self) -> NsId {
        self.0.id
    }

    /// A path naming exactly this namespace while `self` lives, in this process (its own
    /// descriptor's `/proc/self/fd` link): what the work after the check opens, so it lands
    /// where the check looked whatever becomes of the path the caller was given.
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    pub fn into_fd(self) -> OwnedFd {
        self.0.file.into()
    }
}

/// The id of the network namespace at `path`, after the checks of [`ForeignNetns::open`].
pub fn ensure_foreign(path: &Path) -> Result<NsId, ForeignError> {
    ForeignNetns::open(path).map(|ns| ns.id())
}

fn io_error(path: &Path, source: io::Error) -> ForeignError {
    ForeignError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `path` opened for reading if it is a regular file (what nsfs files are); its type is read
/// through an `O_PATH` descriptor first, which opens nothing: opening a FIFO for reading
/// blocks until a writer comes, and opening a device can act on it.
fn open_namespace_file(path: &Path) -> Result<File, ForeignError> {
    let located = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .map_err(|source| io_error(path, source))?;
    let kind = located
        .metadata()
        .map_err(|source| io_error(path, source))?
        .file_type();
    if !kind.is_file() {
        return Err(ForeignError::NotNetns {
            path: path.to_path_buf(),
            why: format!("{} is {}", path.display(), type_name(kind)),
        });
    }
    // Reopening the located file itself, not the path again.
    File::open(format!("/proc/self/fd/{}", located.as_raw_fd()))
        .map_err(|source| io_error(path, source))
}

fn type_name(kind: std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// nsfs files of every kind share one device; only a net namespace accepts
/// `ioctl(NS_GET_NSTYPE)` == CLONE_NEWNET. A regular file fails the ioctl.
fn check_is_netns(file: &File, path: &Path) -> Result<(), ForeignError> {
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703; // _IO(0xb7, 0x3)
    let not_netns = |why: String| ForeignError::NotNetns {
        path: path.to_path_buf(),
        why,
    };
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
        for p in ["/proc/self/ns/mnt", "/etc/hostname", "/", "/dev/null"] {
            let e = ensure_foreign(Path::new(p)).unwrap_err();
            assert!(matches!(e, ForeignError::NotNetns { .. }), "{p}: {e}");
        }
        for p in ["/nonexistent/ns", "/etc/hostname/x", &"n".repeat(5000)] {
            let e = ensure_foreign(Path::new(p)).unwrap_err();
            assert!(e.is_missing(), "{p}: {e}");
        }
    }

    #[test]
    fn a_held_namespace_is_entered_through_its_descriptor() {
        let held = HeldNetns::open(Path::new("/proc/self/ns/net")).unwrap();
        assert!(held.is_current().unwrap());
        let inside = held.run(|| NsId::current().unwrap()).unwrap();
        assert_eq!(inside, held.id());
    }

    /// A FIFO would block an open for reading until a writer came: refused from its type.
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("netns-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("ns");
        let _ = std::fs::remove_file(&fifo);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = ensure_foreign(&fifo).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.to_string().contains("a FIFO"), "{e}");
    }
}
