//! The target namespace, held open for the whole trace: the chain's removal runs in the same
//! namespace even if its path is unmounted meanwhile.

use super::TraceError;
use nix::sched::{CloneFlags, setns};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone)]
pub struct Netns {
    path: Option<PathBuf>,
    file: Option<Arc<File>>,
}

impl Netns {
    /// `None` is the caller's namespace (work then runs on the caller's thread).
    pub fn open(path: Option<&Path>) -> Result<Self, TraceError> {
        let file = match path {
            None => None,
            Some(p) => Some(Arc::new(File::open(p).map_err(|source| {
                TraceError::Namespace {
                    path: p.to_path_buf(),
                    source,
                }
            })?)),
        };
        Ok(Self {
            path: path.map(Path::to_path_buf),
            file,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether the calling thread is already in this namespace.
    pub fn is_callers(&self) -> Result<bool, TraceError> {
        use std::os::unix::fs::MetadataExt;
        let Some(f) = &self.file else { return Ok(true) };
        let own = std::fs::metadata("/proc/thread-self/ns/net").map_err(|e| self.err(e))?;
        let target = f.metadata().map_err(|e| self.err(e))?;
        Ok((own.dev(), own.ino()) == (target.dev(), target.ino()))
    }

    /// Enters the namespace on the calling thread (only on threads we own and end).
    pub fn enter_this_thread(&self) -> Result<(), TraceError> {
        if let Some(f) = &self.file {
            setns(f.as_ref(), CloneFlags::CLONE_NEWNET).map_err(|e| self.err(e.into()))?;
        }
        Ok(())
    }

    /// Runs `f` in the namespace on a fresh thread (or in place for the caller's namespace).
    pub fn run<T: Send>(
        &self,
        f: impl FnOnce() -> Result<T, TraceError> + Send,
    ) -> Result<T, TraceError> {
        if self.file.is_none() {
            return f();
        }
        std::thread::scope(|s| {
            let h = std::thread::Builder::new()
                .name("trace-netns".into())
                .spawn_scoped(s, || {
                    self.enter_this_thread()?;
                    f()
                })
                .map_err(|e| self.err(e))?;
            h.join()
                .map_err(|_| self.err(std::io::Error::other("worker thread panicked")))?
        })
    }

    fn err(&self, source: std::io::Error) -> TraceError {
        TraceError::Namespace {
            path: self.path.clone().unwrap_or_default(),
            source,
        }
    }
}
