//! inotify watches (through `notify`) on the bin dirs, the CNI config dir and the
//! service-account dir. Directories are watched, not files: an atomic rename replaces a file's
//! inode (a file watch would silently die), but it is an event in the directory. The watches
//! are re-armed before every pass, which also picks up a directory that was deleted and
//! recreated (a new inode). The CNI config dir is watched recursively: a symlinked config
//! whose target lives in a subdirectory of it (which we keep a link, see
//! `node_fs::conf_write_target`) is rewritten there.

use crate::discovery;
use crate::settings::Settings;
use notify::event::EventKind;
use notify::{RecursiveMode, Watcher as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use tokio::sync::Notify;

pub const BINS: u8 = 1;
pub const CONF: u8 = 2;
pub const SA: u8 = 4;

/// Which paths matter (runs on notify's thread for every event).
#[derive(Clone, Debug)]
pub struct Filter {
    bin_dirs: Vec<PathBuf>,
    binaries: Vec<String>,
    net_dir: PathBuf,
    sa_dir: PathBuf,
}

impl Filter {
    pub fn new(cfg: &Settings) -> Filter {
        Filter {
            bin_dirs: cfg.bin_target_dirs.clone(),
            binaries: cfg.binaries.clone(),
            net_dir: cfg.net_dir.clone(),
            sa_dir: cfg.api.service_account_dir.clone(),
        }
    }

    pub fn dirs(&self) -> Vec<(PathBuf, u8)> {
        let mut v: Vec<(PathBuf, u8)> = self.bin_dirs.iter().map(|d| (d.clone(), BINS)).collect();
        v.push((self.net_dir.clone(), CONF));
        v.push((self.sa_dir.clone(), SA));
        v
    }

    /// Category of a changed path, or 0 if it cannot affect the install.
    pub fn classify(&self, path: &Path) -> u8 {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if node_fs::is_temp_name(&name, None) {
            return 0; // our own (or another atomic writer's) scratch file; the rename follows
        }
        let mut cat = 0;
        for (dir, c) in self.dirs() {
            if path == dir {
                cat |= c; // the directory itself went away or was replaced
            } else if c == CONF && path.starts_with(&dir) && path.parent() != Some(dir.as_path()) {
                cat |= CONF; // inside a subdirectory: possibly a symlinked config's target
            } else if path.parent() == Some(dir.as_path()) {
                cat |= match c {
                    BINS if self.binaries.contains(&name) => BINS,
                    CONF if discovery::format_of(&name).is_some()
                        || name.ends_with(".cilium_bak") =>
                    {
                        CONF
                    }
                    // kubelet's projected volume swaps `..data`; any entry can matter.
                    SA => SA,
                    _ => 0,
                };
            }
        }
        cat
    }
}

pub fn describe(cats: u8) -> Vec<&'static str> {
    let mut v = Vec::new();
    if cats & CONF != 0 {
        v.push("the CNI config");
    }
    if cats & BINS != 0 {
        v.push("the plugin binaries");
    }
    if cats & SA != 0 {
        v.push("the service-account token");
    }
    v
}

/// Wakes the install loop on relevant changes; remembers which categories changed.
pub struct Watch {
    watcher: notify::RecommendedWatcher,
    filter: Filter,
    pub wake: Arc<Notify>,
    dirty: Arc<AtomicU8>,
    /// Dirs whose watch failed last time (logged once until they recover).
    failing: Vec<PathBuf>,
}

impl Watch {
    pub fn new(filter: Filter) -> notify::Result<Watch> {
        let wake = Arc::new(Notify::new());
        let dirty = Arc::new(AtomicU8::new(0));
        let (w2, d2, f2) = (wake.clone(), dirty.clone(), filter.clone());
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let ev = match res {
                Ok(ev) => ev,
                Err(e) => {
                    // Queue overflow and the like: we may have missed something, so re-check all.
                    tracing::warn!(error = %e, "inotify error; re-checking the install");
                    d2.fetch_or(BINS | CONF | SA, Ordering::SeqCst);
                    w2.notify_one();
                    return;
                }
            };
            // Reads change nothing. A chmod does: a plugin binary without its exec bit fails
            // every ADD (inotify reports it as IN_ATTRIB, like a touch; a pass is cheap).
            if matches!(ev.kind, EventKind::Access(_)) {
                return;
            }
            let cats = ev.paths.iter().fold(0, |acc, p| acc | f2.classify(p));
            if cats != 0 {
                d2.fetch_or(cats, Ordering::SeqCst);
                w2.notify_one();
            }
        })?;
        Ok(Watch {
            watcher,
            filter,
            wake,
            dirty,
            failing: Vec::new(),
        })
    }

    /// (Re)arms every watch. Missing dirs are logged once and retried at the next pass.
    pub fn arm(&mut self) {
        for (dir, _) in self.filter.dirs() {
            let mode = if dir == self.filter.net_dir {
                RecursiveMode::Recursive
            } else {
                RecursiveMode::NonRecursive
            };
            match self.watcher.watch(&dir, mode) {
                Ok(()) => self.failing.retain(|d| *d != dir),
                Err(e) => {
                    if !self.failing.contains(&dir) {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot watch directory; changes there are only seen at the next pass");
                        self.failing.push(dir);
                    }
                }
            }
        }
    }

    /// Categories changed since the last call.
    pub fn take_dirty(&self) -> u8 {
        self.dirty.swap(0, Ordering::SeqCst)
    }

    /// Whether some watch is not armed (then the loop also polls).
    pub fn degraded(&self) -> bool {
        !self.failing.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_paths() {
        let cfg = Settings::for_dirs(
            "/n".into(),
            "/r".into(),
            "/src".into(),
            "/b".into(),
            "/sa".into(),
        );
        let f = Filter::new(&cfg);
        assert_eq!(f.classify(Path::new("/n/10-calico.conflist")), CONF);
        assert_eq!(f.classify(Path::new("/n/10-calico.conflist.tmp.1.2")), 0);
        assert_eq!(f.classify(Path::new("/n/calico-kubeconfig")), 0);
        assert_eq!(
            f.classify(Path::new("/n/10-calico.conflist.cilium_bak")),
            CONF
        );
        assert_eq!(f.classify(Path::new("/n")), CONF);
        assert_eq!(f.classify(Path::new("/b/istio-cni")), BINS);
        assert_eq!(f.classify(Path::new("/b/bridge")), 0);
        assert_eq!(f.classify(Path::new("/sa/..data")), SA);
        assert_eq!(f.classify(Path::new("/elsewhere/x.conf")), 0);
        assert_eq!(
            f.classify(Path::new("/n/calico-real/calico.conflist")),
            CONF
        );
    }
}
