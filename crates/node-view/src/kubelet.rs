//! The kubelet's uid, found through the host's /proc as Istio's node agent does
//! (`kubeletuid_linux.go`): ambient's host probe rule on nft nodes matches the probes of
//! kubelet's sockets by this uid.

use std::io;
use std::path::Path;

/// Why the kubelet's uid could not be found.
#[derive(Debug, thiserror::Error)]
pub enum KubeletUidError {
    #[error("reading {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        source: io::Error,
    },
    #[error("no kubelet process (kubelet, kubelite or k3s) found in {0}")]
    NotFound(std::path::PathBuf),
}

/// Processes that host the kubelet, in Istio's order (`kubeletuid_linux.go`): the name in
/// `/proc/<pid>/comm`, and whether an argument must contain "kubelet" (k3s embeds it).
const KUBELET_PROCESSES: [(&str, bool); 3] =
    [("kubelet", true), ("kubelite", true), ("k3s", false)];

/// The uid of the kubelet process, found through `proc_root` (the host's /proc; in the
/// agent's container usually `/host/proc`) as Istio does: the first process whose `comm` is
/// `kubelet` or `kubelite` with "kubelet" in an argument, or `k3s`; its real uid.
pub fn kubelet_uid(proc_root: &Path) -> Result<u32, KubeletUidError> {
    let entries = std::fs::read_dir(proc_root).map_err(|source| KubeletUidError::Read {
        path: proc_root.to_path_buf(),
        source,
    })?;
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let dir = proc_root.join(pid.to_string());
        // Processes may exit while we look: unreadable ones are skipped, as in Istio.
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let read_cmdline = || std::fs::read(dir.join("cmdline")).ok();
        if !is_kubelet(comm.trim_end_matches('\n'), read_cmdline) {
            continue;
        }
        if let Some(uid) = std::fs::read_to_string(dir.join("status"))
            .ok()
            .and_then(|s| real_uid(&s))
        {
            return Ok(uid);
        }
    }
    Err(KubeletUidError::NotFound(proc_root.to_path_buf()))
}

fn is_kubelet(comm: &str, cmdline: impl FnOnce() -> Option<Vec<u8>>) -> bool {
    let Some(&(_, need_arg)) = KUBELET_PROCESSES.iter().find(|(name, _)| *name == comm) else {
        return false;
    };
    !need_arg
        || cmdline().is_some_and(|c| {
            c.split(|b| *b == 0).any(|arg| {
                String::from_utf8_lossy(arg)
                    .to_lowercase()
                    .contains("kubelet")
            })
        })
}

/// The real uid from `/proc/<pid>/status` (`Uid:\treal\teffective\tsaved\tfs`).
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(procs: &[(u32, &str, &str, u32)]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kubelet-uid-{}-{}",
            std::process::id(),
            procs.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for (pid, comm, cmdline, uid) in procs {
            let p = dir.join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(p.join("cmdline"), cmdline.replace(' ', "\0")).unwrap();
            std::fs::write(
                p.join("status"),
                format!("Name:\t{comm}\nUid:\t{uid}\t0\t0\t0\nGid:\t0\t0\t0\t0\n"),
            )
            .unwrap();
        }
        std::fs::write(dir.join("uptime"), "1 1").unwrap();
        dir
    }

    #[test]
    fn finds_kubelet_like_istio() {
        let proc = fake_proc(&[
            (1, "systemd", "/sbin/init", 0),
            // A process named kubelet without "kubelet" in its arguments is not it.
            (7, "kubelet", "/opt/x --flag", 5),
            (
                42,
                "kubelet",
                "/usr/bin/kubelet --config=/var/lib/kubelet/config.yaml",
                1234,
            ),
        ]);
        assert_eq!(kubelet_uid(&proc).unwrap(), 1234);
        let k3s = fake_proc(&[(9, "bash", "bash", 0), (10, "k3s", "k3s agent", 77)]);
        assert_eq!(kubelet_uid(&k3s).unwrap(), 77);
        let none = fake_proc(&[
            (3, "containerd", "containerd", 0),
            (4, "sshd", "sshd", 0),
            (5, "x", "x", 0),
            (6, "y", "y", 0),
        ]);
        assert!(matches!(
            kubelet_uid(&none),
            Err(KubeletUidError::NotFound(_))
        ));
        for d in [proc, k3s, none] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    #[test]
    fn real_uid_is_the_first_field() {
        assert_eq!(
            real_uid("Name:\tx\nUid:\t1000\t1001\t1002\t1003\n"),
            Some(1000)
        );
        assert_eq!(real_uid("Name:\tx\n"), None);
    }

    /// A process named `kubelet` (a copy of sleep) running as a test uid is found in the
    /// real /proc. Needs root (to run it as another uid).
    #[test]
    fn kubelet_uid_is_found_through_proc() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (a process run as another uid); run it as root"
        );
        let dir = std::env::temp_dir().join(format!("amb-kubelet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("kubelet");
        std::fs::copy("/bin/sleep", &bin).unwrap();
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new(&bin)
            .arg("30")
            .uid(54321)
            .spawn()
            .unwrap();
        // Wait until the exec is visible in /proc.
        let comm = format!("/proc/{}/comm", child.id());
        for _ in 0..200 {
            if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "kubelet") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let found = kubelet_uid(Path::new("/proc"));
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found.unwrap(), 54321);
    }
}
