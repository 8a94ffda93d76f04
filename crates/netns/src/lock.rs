//! The per-namespace lock: every call that reads or changes our rules in a network namespace
//! (detection, either backend's apply, the other backend's cleanup, check, DEL) holds it, so
//! concurrent CNI ADD/DEL/CHECK, the CLI and the repair controller on one pod run one after
//! the other and the namespace always ends up with one backend's complete rules.
//!
//! The lock is `flock(2)` on the namespace's own nsfs file, opened through
//! `/proc/thread-self/ns/net` by a thread inside the namespace:
//! - it is keyed by the nsfs inode, i.e. by the namespace ([`NsId`]): `/var/run/netns/pod`,
//!   a bind mount of it and `/proc/PID/ns/net` all name one lock, and two namespaces never
//!   share one;
//! - nothing is created on disk, so nothing is left behind, and no writable directory is
//!   needed;
//! - the kernel drops it when the last descriptor of the open file goes, so a SIGKILLed
//!   caller never leaves it held. Children that must finish before the next caller may
//!   start (an `iptables-restore` already fed its input) inherit it on purpose, see
//!   [`NsLock::keep_held_by`].
//!
//! It is the same file Istio's `istio-iptables` uses as its pod-scoped xtables lock
//! (`XTABLES_LOCKFILE=<netns path>`), so a stray upstream run on the same pod waits for us too.
//! The flip side: the iptables children we start while holding it must use another xtables
//! lock file, or they would wait 30 s on our own lock (the iptables-legacy backend does so).
//!
//! The wait is bounded by a deadline: polling `LOCK_NB` with a short backoff (a blocking
//! `flock` cannot be given a timeout without signals), failing with an error that names the
//! namespace and, when the kernel says so, the process holding it.

use crate::NsId;
use nix::fcntl::{Flock, FlockArg};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// The calling thread's namespace file.
const CURRENT: &str = "/proc/thread-self/ns/net";
/// Longest sleep between two attempts: short against a typical hold (a few ms for nft, tens
/// of ms for iptables-legacy), long enough not to burn a core while 50 callers queue.
const MAX_BACKOFF: Duration = Duration::from_millis(8);

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("network namespace {name}: opening it to take its lock: {source}")]
    Open { name: String, source: io::Error },
    #[error(
        "network namespace {name} ({id}): another call kept its lock for {waited:.1?}{}; gave up waiting",
        holder.map(|p| format!(" (held by pid {p})")).unwrap_or_default()
    )]
    Timeout {
        name: String,
        id: NsId,
        waited: Duration,
        holder: Option<u32>,
    },
    #[error("network namespace {name}: taking its lock: {source}")]
    Flock { name: String, source: nix::Error },
}

/// An exclusive hold on one network namespace; released on drop (or when the process dies).
pub struct NsLock {
    file: Flock<File>,
    id: NsId,
}

impl fmt::Debug for NsLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NsLock").field("id", &self.id).finish()
    }
}

impl NsLock {
    /// Locks the calling thread's network namespace (enter it first, e.g. in
    /// [`crate::run_in`]), waiting until `deadline` at most. `name` says which namespace
    /// this is in errors (the caller's path, or "the current namespace").
    pub fn current(name: &dyn fmt::Display, deadline: Instant) -> Result<NsLock, LockError> {
        Self::acquire(Path::new(CURRENT), name, deadline)
    }

    /// Locks the namespace `path` refers to (`/var/run/netns/x`, `/proc/PID/ns/net`).
    pub fn path(path: &Path, deadline: Instant) -> Result<NsLock, LockError> {
        Self::acquire(path, &path.display(), deadline)
    }

    fn acquire(
        path: &Path,
        name: &dyn fmt::Display,
        deadline: Instant,
    ) -> Result<NsLock, LockError> {
        let name = || name.to_string();
        let open_err = |source| LockError::Open {
            name: name(),
            source,
        };
        let mut file = File::open(path).map_err(open_err)?;
        let id = NsId::of_file(&file).map_err(open_err)?;
        let started = Instant::now();
        let mut backoff = Duration::from_micros(250);
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(file) => return Ok(NsLock { file, id }),
                Err((f, nix::Error::EWOULDBLOCK | nix::Error::EINTR)) => file = f,
                Err((_, source)) => {
                    return Err(LockError::Flock {
                        name: name(),
                        source,
                    });
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::Timeout {
                    name: name(),
                    id,
                    waited: now - started,
                    holder: holder_of(id),
                });
            }
            std::thread::sleep(backoff.min(deadline - now));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// The namespace this lock holds.
    pub fn id(&self) -> NsId {
        self.id
    }

    /// Makes `cmd`'s child inherit this hold: the lock then stays taken until both we and the
    /// child are gone. Used for children that change rules (`iptables-restore`): if we are
    /// SIGKILLed after feeding one its input, it still commits, and the next caller must not
    /// read the rules before it has.
    pub fn keep_held_by(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let fd = self.file.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and only calls fcntl(2),
        // which is async-signal-safe; `fd` stays open in the parent (we hold `self`), so the
        // child's copy is valid.
        unsafe {
            cmd.pre_exec(move || {
                let fd = BorrowedFd::borrow_raw(fd);
                nix::fcntl::fcntl(
                    fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )
                .map(drop)
                .map_err(io::Error::from)
            });
        }
    }
}

impl AsFd for NsLock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// The pid holding a flock on the namespace's inode, from /proc/locks (for the error message
/// only; `None` when it cannot be told). Lines read
/// `1: FLOCK  ADVISORY  WRITE 4242 00:04:4026532317 0 EOF`.
fn holder_of(id: NsId) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let inode = format!(":{}", id.ino);
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (kind, pid, file) = (f.get(1)?, f.get(4)?, f.get(5)?);
        (*kind == "FLOCK" && file.ends_with(&inode))
            .then(|| pid.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    /// Runs `f` on a thread inside a private namespace, passing a path to that namespace
    /// usable from other threads.
    fn in_private_namespace<T: Send>(f: impl FnOnce(&Path) -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare (root)");
                let path = format!("/proc/self/task/{}/ns/net", nix::unistd::gettid());
                f(Path::new(&path))
            })
            .join()
            .unwrap()
        })
    }

    #[test]
    fn a_second_hold_waits_then_fails_naming_the_namespace_and_holder() {
        in_private_namespace(|path| {
            let held = NsLock::current(&"the current namespace", soon(1000)).unwrap();
            assert_eq!(held.id(), NsId::of_path(path).unwrap());
            let t = Instant::now();
            let err = std::thread::scope(|s| s.spawn(|| NsLock::path(path, soon(50))).join())
                .unwrap()
                .unwrap_err();
            assert!(t.elapsed() >= Duration::from_millis(50));
            assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
            let msg = err.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(&held.id().ino.to_string()), "{msg}");
            assert!(
                msg.contains(&format!("pid {}", std::process::id())),
                "{msg}"
            );
            drop(held);
            NsLock::path(path, soon(1000)).expect("released on drop");
        });
    }

    #[test]
    fn missing_namespace_names_the_path() {
        let err = NsLock::path(Path::new("/nonexistent/netns"), soon(10)).unwrap_err();
        assert!(
            matches!(&err, LockError::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
        );
        assert!(err.to_string().contains("/nonexistent/netns"), "{err}");
    }
}
