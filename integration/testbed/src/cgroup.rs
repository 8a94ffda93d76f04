//! Real kubelet-style pod cgroups for tests that tell pods apart by their processes' cgroups
//! (`node_view::cgroup`): `kubepods/besteffort/pod<UID>/<container>` in the node's cgroup v2
//! hierarchy (the unified one of a hybrid layout) or, without one, in the v1 `pids`
//! hierarchy. Processes moved in show it in their real `/proc/PID/cgroup`.

use std::io;
use std::path::{Path, PathBuf};

/// Where cgroups can be made: the first hierarchy with a `cgroup.procs` at its root.
fn hierarchy() -> io::Result<PathBuf> {
    [
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/pids",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|h| h.join("cgroup.procs").exists())
    .ok_or_else(|| io::Error::other("no writable cgroup hierarchy under /sys/fs/cgroup"))
}

/// A pod's container cgroup; the processes moved in go back to the root cgroup on drop and the
/// cgroup and its pod directory are removed (the shared `kubepods/besteffort` stay, as on a
/// node: removing them could race another test creating a pod under them).
pub struct PodCgroup {
    root: PathBuf,
    dir: PathBuf,
}

impl PodCgroup {
    /// `kubepods/besteffort/pod<uid>/<container>` (cgroupfs driver's layout).
    pub fn new(uid: &str, container: &str) -> io::Result<PodCgroup> {
        let root = hierarchy()?;
        let dir = root
            .join("kubepods/besteffort")
            .join(format!("pod{uid}"))
            .join(container);
        std::fs::create_dir_all(&dir)?;
        Ok(PodCgroup { root, dir })
    }

    /// Moves process `pid` into the cgroup.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
        }
        if std::fs::remove_dir(&self.dir).is_ok()
            && let Some(pod) = self.dir.parent()
        {
            let _ = std::fs::remove_dir(pod);
        }
    }
}
