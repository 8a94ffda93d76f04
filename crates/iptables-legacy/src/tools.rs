//! Finding and running the iptables-legacy binaries.

use crate::LegacyError;
use netns::NsLock;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Seconds iptables waits for the xtables lock (`-w`), Istio's value.
const LOCK_WAIT_SECS: &str = "30";

/// `XTABLES_LOCKFILE` for every iptables child: a file of the child's own (its procfs `stat`),
/// so its xtables lock is never contended.
///
/// Why not Istio's choice, the pod's namespace file: our callers hold the per-namespace lock
/// ([`netns::NsLock`]), which IS a flock on that very inode, so a child flocking it would wait
/// the full `-w 30` on its own parent and fail (measured: "Another app is currently holding the
/// xtables lock" after the wait). Nor the node-wide /run/xtables.lock, which kube-proxy holds
/// for seconds on large nodes (why Istio scoped it per pod). The xtables lock protects nothing
/// more here: every writer of ours to this namespace holds the per-namespace lock (and so does
/// an upstream istio-iptables run, whose lock is the same inode); programs inside the pod use
/// their own mount namespace's /run/xtables.lock, which never excluded us anyway. Cost:
/// none measurable (300 restores: 2.2–2.9 ms each with either file).
const UNCONTENDED_XTABLES_LOCK: &str = "/proc/self/stat";

/// The xtables lock of the node's own namespace, which kubelet and kube-proxy take (iptables'
/// default; `XTABLES_LOCKFILE` overrides it, for them and for us).
pub const NODE_XTABLES_LOCK: &str = "/run/xtables.lock";

/// The ipset binary (the host probe rule's sets, `ambient_host`).
pub(crate) const IPSET: &str = "ipset";

/// Where the backend looks for the iptables-legacy binaries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tools {
    /// Searched in order for each binary.
    pub search_dirs: Vec<PathBuf>,
    /// The xtables lock restores of the host probe rule take in the node's own namespace,
    /// shared with kubelet and kube-proxy: `XTABLES_LOCKFILE` when set, else
    /// [`NODE_XTABLES_LOCK`]. (Restores into pods take an uncontended one, see above.)
    pub node_xtables_lock: PathBuf,
}

fn node_xtables_lock() -> PathBuf {
    std::env::var_os("XTABLES_LOCKFILE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| NODE_XTABLES_LOCK.into())
}

impl Default for Tools {
    /// `$PATH`, then /usr/sbin and /sbin (CNI plugins often run with a minimal PATH that
    /// lacks the sbin directories).
    fn default() -> Self {
        let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        for d in ["/usr/sbin", "/sbin"] {
            if !dirs.iter().any(|x| x == Path::new(d)) {
                dirs.push(d.into());
            }
        }
        Tools {
            search_dirs: dirs,
            node_xtables_lock: node_xtables_lock(),
        }
    }
}

/// The two families' commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fam {
    V4,
    V6,
}

impl Fam {
    pub(crate) fn restore(self) -> &'static str {
        match self {
            Fam::V4 => "iptables-legacy-restore",
            Fam::V6 => "ip6tables-legacy-restore",
        }
    }
    pub(crate) fn save(self) -> &'static str {
        match self {
            Fam::V4 => "iptables-legacy-save",
            Fam::V6 => "ip6tables-legacy-save",
        }
    }
    /// The kernel's list of instantiated legacy tables, for the calling *thread's* namespace
    /// (/proc/self/net would show the namespace of the process's main thread).
    pub(crate) fn names_file(self) -> &'static str {
        match self {
            Fam::V4 => "/proc/thread-self/net/ip_tables_names",
            Fam::V6 => "/proc/thread-self/net/ip6_tables_names",
        }
    }
    pub(crate) fn label(self) -> &'static str {
        match self {
            Fam::V4 => "IPv4",
            Fam::V6 => "IPv6",
        }
    }
}

impl Tools {
    /// Looks only in `dirs` (tests use this to simulate missing binaries).
    pub fn in_dirs<I: IntoIterator<Item = P>, P: Into<PathBuf>>(dirs: I) -> Self {
        Tools {
            search_dirs: dirs.into_iter().map(Into::into).collect(),
            node_xtables_lock: node_xtables_lock(),
        }
    }

    /// The full path of `name`, or an error naming it and where we looked.
    pub fn find(&self, name: &str) -> Result<PathBuf, LegacyError> {
        self.search_dirs
            .iter()
            .map(|d| d.join(name))
            .find(|p| is_executable(p))
            .ok_or_else(|| LegacyError::BinaryNotFound {
                binary: name.to_string(),
                searched: self
                    .search_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":"),
            })
    }

    /// `X-save` output for the current namespace.
    pub(crate) fn save(&self, fam: Fam) -> Result<String, LegacyError> {
        self.save_with(fam, &[])
    }

    /// `X-save ARGS` output for the current namespace (e.g. `-c -t nat`).
    pub(crate) fn save_with(&self, fam: Fam, args: &[&str]) -> Result<String, LegacyError> {
        let bin = self.find(fam.save())?;
        run(&bin, args, None, None, None, None)
    }

    /// `X-restore --noflush -w 30 [--test]` with `input` on stdin. With `held`, the child
    /// inherits the namespace's lock (see [`NsLock::keep_held_by`]): once fed its input it
    /// commits even if we are killed, and nobody may read the rules before it has.
    pub(crate) fn restore(
        &self,
        fam: Fam,
        input: &str,
        held: Option<&NsLock>,
        test_only: bool,
    ) -> Result<(), LegacyError> {
        let bin = self.find(fam.restore())?;
        let mut args = vec!["--noflush", "-w", LOCK_WAIT_SECS];
        if test_only {
            args.push("--test");
        }
        let user_ns = pod_user_ns()?;
        run(&bin, &args, Some(input), held, None, user_ns.as_ref()).map(drop)
    }

    /// [`Tools::restore`] in the node's own namespace: the child also waits (up to `-w 30`)
    /// for the node-wide xtables lock ([`Tools::node_xtables_lock`]), so our commit never
    /// interleaves with kubelet's or kube-proxy's.
    pub(crate) fn restore_on_node(
        &self,
        fam: Fam,
        input: &str,
        held: &NsLock,
    ) -> Result<(), LegacyError> {
        let bin = self.find(fam.restore())?;
        let args = ["--noflush", "-w", LOCK_WAIT_SECS];
        run(
            &bin,
            &args,
            Some(input),
            Some(held),
            Some(&self.node_xtables_lock),
            None,
        )
        .map(drop)
    }

    /// `ipset ARGS` (with `input` on stdin), returning its stdout.
    pub(crate) fn ipset(&self, args: &[&str], input: Option<&str>) -> Result<String, LegacyError> {
        let bin = self.find(IPSET)?;
        run(&bin, args, input, None, None, None)
    }
}

/// The Debian package that ships `binary` (for the "not found" error).
pub(crate) fn package_of(binary: &str) -> &'static str {
    if binary == IPSET {
        "ipset"
    } else {
        "iptables (legacy)"
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A pod in a user namespace of its own (`hostUsers: false`): its restores run in it, or the
/// kernel refuses their `--uid-owner` rules (xt_owner wants the writer in the namespace's user
/// namespace). Reads stay outside (inside, the node's /proc/net files are not readable).
fn pod_user_ns() -> Result<Option<std::os::fd::OwnedFd>, LegacyError> {
    netns::foreign_user_ns().map_err(|source| LegacyError::Spawn {
        command: "reading the pod's user namespace".into(),
        source,
    })
}

fn run(
    bin: &Path,
    args: &[&str],
    stdin: Option<&str>,
    held: Option<&NsLock>,
    xtables_lock: Option<&Path>,
    user_ns: Option<&std::os::fd::OwnedFd>,
) -> Result<String, LegacyError> {
    let command = format!("{} {}", bin.display(), args.join(" "));
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.env(
        "XTABLES_LOCKFILE",
        xtables_lock.unwrap_or(Path::new(UNCONTENDED_XTABLES_LOCK)),
    );
    if let Some(lock) = held {
        lock.keep_held_by(&mut cmd);
    }
    let spawn = |source| LegacyError::Spawn {
        command: command.clone(),
        source,
    };
    if let Some(ns) = user_ns {
        netns::enter_user_ns_before_exec(&mut cmd, ns);
    }
    let mut child = cmd.spawn().map_err(spawn)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A write error (EPIPE) means the tool exited early; its stderr says why.
        let _ = pipe.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(LegacyError::Command {
            offending_line: stdin.and_then(|i| offending_line(&stderr, i)),
            command,
            status: out.status.to_string(),
            stderr,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// iptables-restore reports "Error occurred at line: N" (or "line N failed"), ipset
/// "Error in line N: ..."; quote that line.
fn offending_line(stderr: &str, input: &str) -> Option<String> {
    let n: usize = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("Error occurred at line: ")
                .or_else(|| l.split("line ").nth(1)?.strip_suffix(" failed"))
                .or_else(|| l.split("Error in line ").nth(1)?.split(':').next())
        })?
        .trim()
        .parse()
        .ok()?;
    input.lines().nth(n.checked_sub(1)?).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offending_line_is_quoted() {
        let input = "*nat\n-A OUTPUT -o bad -j RETURN\nCOMMIT\n";
        assert_eq!(
            offending_line("x\nError occurred at line: 2\nTry", input).as_deref(),
            Some("-A OUTPUT -o bad -j RETURN")
        );
        assert_eq!(
            offending_line("iptables-restore: line 3 failed", input).as_deref(),
            Some("COMMIT")
        );
        assert_eq!(offending_line("garbage", input), None);
        assert_eq!(offending_line("Error occurred at line: 0", input), None);
    }

    #[test]
    fn missing_binary_names_it_and_the_search_path() {
        let err = Tools::in_dirs(["/nonexistent"])
            .find("iptables-legacy-restore")
            .unwrap_err()
            .to_string();
        assert!(err.contains("iptables-legacy-restore"), "{err}");
        assert!(err.contains("/nonexistent"), "{err}");
    }

    #[test]
    fn default_search_falls_back_to_sbin() {
        let t = Tools::default();
        let n = t.search_dirs.len();
        assert!(n >= 2);
        assert!(t.search_dirs.contains(&PathBuf::from("/usr/sbin")));
        assert!(t.search_dirs.contains(&PathBuf::from("/sbin")));
    }
}
