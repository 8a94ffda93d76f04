//! Atomic file replacement: write a temp file next to the target, fsync, chmod, rename. Readers
//! (kubelet, the container runtime exec'ing the plugin) see the old file or the new one, never
//! a torn one, and a running plugin binary keeps its old inode.
//!
//! Links and modes: no write follows a symlink we did not create. Temp files get unpredictable
//! names (`<name>.tmp.<random>`, as Istio's) and are created with O_EXCL, so a file or link
//! planted at a temp name is never written through, and a collision is retried with a fresh
//! name instead of failing the write; a temp file is only ever removed by the write that made
//! it. A rename replaces a link at the destination instead of writing through it, and every
//! file and directory we create gets its mode set explicitly (fchmod after create), so the
//! umask neither widens nor narrows it.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Temp files are `<name>.tmp.<random>` (Istio's), so a crash leaves something recognisable
/// that the next pass deletes.
const TMP_MARK: &str = ".tmp.";

/// Mode of every directory the daemon creates (run dir, missing CNI dirs), whatever the umask.
pub const DIR_MODE: u32 = 0o755;

/// A new, empty temp file next to `target` (`mode`, owner-only until the caller widens it):
/// O_EXCL under a random name, a fresh name on every collision (tempfile's retries). Dropped
/// unpersisted, it removes itself, and nothing else.
fn temp_file(target: &Path, mode: u32) -> io::Result<tempfile::NamedTempFile> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    tempfile::Builder::new()
        .prefix(&format!("{name}{TMP_MARK}"))
        .rand_bytes(12)
        .permissions(fs::Permissions::from_mode(mode))
        .tempfile_in(dir)
}

/// Fsyncs and renames a finished temp file over `target`.
fn persist(mut f: tempfile::NamedTempFile, target: &Path, mode: u32) -> io::Result<()> {
    // chmod after create: the umask must not narrow the mode we were asked for.
    f.as_file_mut()
        .set_permissions(fs::Permissions::from_mode(mode))?;
    f.as_file().sync_all()?;
    f.persist(target).map(drop).map_err(|e| e.error)
}

/// Whether `file_name` is one of our temp files (for `name`, or any name if `None`).
pub fn is_temp_name(file_name: &str, name: Option<&str>) -> bool {
    match name {
        Some(n) => file_name
            .strip_prefix(n)
            .is_some_and(|rest| rest.starts_with(TMP_MARK)),
        None => file_name.contains(TMP_MARK),
    }
}

/// Deletes leftover temp files of `name` in `dir` (a crash between write and rename).
pub fn remove_stale_temps(dir: &Path, name: &str) -> io::Result<usize> {
    let mut removed = 0;
    for e in fs::read_dir(dir)? {
        let e = e?;
        if is_temp_name(&e.file_name().to_string_lossy(), Some(name)) {
            match fs::remove_file(e.path()) {
                Ok(()) => removed += 1,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(removed)
}

/// Mode of an existing file (permission bits), if it exists.
pub fn existing_mode(path: &Path) -> Option<u32> {
    fs::metadata(path).ok().map(|m| m.mode() & 0o7777)
}

/// Atomically replaces `path` with `bytes`. The mode is the existing file's if there is one
/// (so an operator's or the primary CNI's choice survives), else `new_mode`.
pub fn atomic_write(path: &Path, bytes: &[u8], new_mode: u32) -> io::Result<()> {
    let mode = existing_mode(path).unwrap_or(new_mode);
    atomic_write_mode(path, bytes, mode)
}

/// Atomically replaces `path` with `bytes`, mode `mode`.
pub fn atomic_write_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut f = temp_file(path, mode)?;
    f.write_all(bytes)?;
    persist(f, path, mode)
}

/// Atomically copies `src` to `dst` with mode `mode`.
pub fn atomic_copy(src: &Path, dst: &Path, mode: u32) -> io::Result<()> {
    let mut from = fs::File::open(src)?;
    // Owner-only until complete; the final mode is set before the rename.
    let mut f = temp_file(dst, 0o600)?;
    io::copy(&mut from, &mut f)?;
    persist(f, dst, mode)
}

/// Whether two files have identical contents (compared in chunks, without loading either).
pub fn same_contents(a: &Path, b: &Path) -> io::Result<bool> {
    use std::io::Read;
    let (ma, mb) = (fs::metadata(a)?, fs::metadata(b)?);
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let (mut fa, mut fb) = (fs::File::open(a)?, fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Mode of `path` if it is a regular file itself (not a symlink to one).
pub fn regular_mode(path: &Path) -> Option<u32> {
    fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_file())
        .map(|m| m.mode() & 0o7777)
}

/// Contents of `path` if it is a regular file itself (a planted link reads as absent).
pub fn read_regular(path: &Path) -> Option<Vec<u8>> {
    regular_mode(path)?;
    fs::read(path).ok()
}

/// The largest CNI config read (a bound, not a format limit: real ones are kilobytes).
pub const MAX_CONF_BYTES: u64 = 64 << 20;

/// Contents of the CNI config at `path`, following a link as the runtime does, if it is a
/// regular file of at most `max` bytes. Opened non-blocking and checked with `fstat`, so a FIFO
/// or a device planted among the configs is never waited on or read (an error naming why),
/// and a huge file is refused before it is read.
pub fn read_conf(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let too_big = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        )
    };
    if m.len() > max {
        return Err(too_big());
    }
    let mut buf = Vec::with_capacity(m.len() as usize);
    f.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(too_big());
    }
    Ok(buf)
}

pub fn is_symlink(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Ensures `dir` exists. Missing directories (and missing parents) are created with exactly
/// `mode`, whatever the umask; existing ones are left as they are. With `refuse_link`, `dir`
/// itself must not be a symlink: it is a directory we own, and a link planted there would send
/// every later write (and cleanup's removals) somewhere else.
pub fn ensure_dir(dir: &Path, mode: u32, refuse_link: bool) -> io::Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() && refuse_link => {
            let to = fs::read_link(dir).unwrap_or_default();
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is a symlink (to {}); refusing to write through a link we did not create (remove it)",
                    dir.display(),
                    to.display()
                ),
            ));
        }
        Ok(_) if dir.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a directory", dir.display()),
            ));
        }
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        ensure_dir(parent, mode, false)?;
    }
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        // Created concurrently: check what is there now.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return ensure_dir(dir, mode, refuse_link);
        }
        Err(e) => return Err(e),
    }
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)?;
    f.set_permissions(fs::Permissions::from_mode(mode))
}

/// The file to replace when writing the CNI config `path` (a file of `net_dir`): `path` itself
/// unless it is a symlink. A symlink whose target lies inside `net_dir` stays a link: its
/// target is written (atomically, in the target's directory). A link that leads outside the
/// CNI config dir is refused: writing there would modify a file nobody granted us, and
/// replacing the link would silently detach the primary CNI's file.
pub fn conf_write_target(net_dir: &Path, path: &Path) -> io::Result<PathBuf> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {}
        Ok(_) => return Ok(path.to_path_buf()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(path.to_path_buf()),
        Err(e) => return Err(e),
    }
    let link = fs::read_link(path).unwrap_or_default();
    let refuse = |why: &str| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is a symlink to {}: {why}; refusing to write through it (make it a regular file, or a link inside {})",
                path.display(),
                link.display(),
                net_dir.display()
            ),
        )
    };
    let target = fs::canonicalize(path).map_err(|_| refuse("its target does not exist"))?;
    let root = fs::canonicalize(net_dir)?;
    if !target.starts_with(&root) {
        return Err(refuse("the target is outside the CNI config dir"));
    }
    if !fs::metadata(&target).is_ok_and(|m| m.is_file()) {
        return Err(refuse("the target is not a regular file"));
    }
    Ok(target)
}

/// Identity of a file's current version: replaced or rewritten files get a different one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    ino: u64,
    dev: u64,
    len: u64,
    mtime_ns: i128,
    mode: u32,
}

pub fn stamp(path: &Path) -> io::Result<Stamp> {
    stamp_of(fs::metadata(path)?)
}

/// The stamp of `path` itself (a symlink's own, not its target's).
pub fn lstamp(path: &Path) -> io::Result<Stamp> {
    stamp_of(fs::symlink_metadata(path)?)
}

fn stamp_of(m: fs::Metadata) -> io::Result<Stamp> {
    Ok(Stamp {
        ino: m.ino(),
        dev: m.dev(),
        len: m.len(),
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        mode: m.mode(),
    })
}

/// Makes `path` ready for a socket to be bound there: its directory is ours (created
/// [`DIR_MODE`] whatever the umask; a symlink planted in its place is refused, never bound
/// through), and a stale socket left by an earlier run is removed; anything else at the name
/// (a file, a directory, a planted symlink) is refused and never followed.
pub fn prepare_socket(path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        ensure_dir(dir, DIR_MODE, true)?;
    }
    clear_stale_socket(path)
}

/// A stale socket at `path` removed; anything else there refused (see [`prepare_socket`]).
fn clear_stale_socket(path: &Path) -> io::Result<()> {
    if remove_socket(path)? {
        return Ok(());
    }
    match std::fs::symlink_metadata(path) {
        Ok(_) => Err(io::Error::other(
            "exists and is not a socket; refusing to replace it",
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes the socket at `path` (not a link to one). Whether one was there; anything else at
/// `path` is left alone.
pub fn remove_socket(path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map(|()| true),
        Ok(_) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 21 item 1: files and links planted at every name the old `<name>.tmp.<pid>.<n>`
    /// scheme would have used made every write fail (EEXIST, forever). Writes now pick
    /// unpredictable names, never write through a planted link and never remove what they
    /// did not create.
    #[test]
    fn planted_temp_names_neither_block_nor_redirect_writes() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        let targets = [d.path().join("kubeconfig"), d.path().join("istio-cni")];
        let mut planted = Vec::new();
        for t in &targets {
            let name = t.file_name().unwrap().to_str().unwrap();
            for n in 0..64 {
                let p = d
                    .path()
                    .join(format!("{name}.tmp.{}.{n}", std::process::id()));
                if n % 2 == 0 {
                    fs::write(&p, b"planted").unwrap();
                } else {
                    std::os::unix::fs::symlink(&victim, &p).unwrap();
                }
                planted.push(p);
            }
        }
        for round in 0..8 {
            atomic_write_mode(&targets[0], format!("v{round}").as_bytes(), 0o600).unwrap();
            atomic_copy(&victim, &targets[1], 0o755).unwrap();
        }
        assert_eq!(fs::read(&targets[0]).unwrap(), b"v7");
        assert_eq!(regular_mode(&targets[1]), Some(0o755));
        assert_eq!(
            fs::read(&victim).unwrap(),
            b"keep",
            "written through a link"
        );
        for p in &planted {
            assert!(fs::symlink_metadata(p).is_ok(), "{} removed", p.display());
        }
        // Only the targets, the victim and what was planted: no temp files left behind.
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 3 + planted.len());
    }

    #[test]
    fn write_preserves_mode_and_leaves_no_temps() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("10-x.conflist");
        atomic_write(&p, b"one", 0o600).unwrap();
        assert_eq!(existing_mode(&p), Some(0o600));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        atomic_write(&p, b"two", 0o600).unwrap();
        assert_eq!(existing_mode(&p), Some(0o644));
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn links_inside_are_followed_outside_refused() {
        let d = tempfile::tempdir().unwrap();
        let net = d.path().join("net.d");
        fs::create_dir_all(net.join("real")).unwrap();
        fs::write(net.join("real/a.conflist"), b"{}").unwrap();
        fs::write(d.path().join("outside.conflist"), b"{}").unwrap();
        std::os::unix::fs::symlink("real/a.conflist", net.join("10-a.conflist")).unwrap();
        std::os::unix::fs::symlink("../outside.conflist", net.join("20-b.conflist")).unwrap();
        std::os::unix::fs::symlink("missing", net.join("30-c.conflist")).unwrap();
        let t = conf_write_target(&net, &net.join("10-a.conflist")).unwrap();
        assert_eq!(t, fs::canonicalize(net.join("real/a.conflist")).unwrap());
        let e = conf_write_target(&net, &net.join("20-b.conflist")).unwrap_err();
        assert!(e.to_string().contains("outside the CNI config dir"), "{e}");
        assert!(conf_write_target(&net, &net.join("30-c.conflist")).is_err());
        let plain = net.join("40-d.conflist");
        assert_eq!(conf_write_target(&net, &plain).unwrap(), plain);
    }

    #[test]
    fn ensure_dir_sets_modes_and_refuses_a_planted_link() {
        let d = tempfile::tempdir().unwrap();
        let deep = d.path().join("a/b/c");
        ensure_dir(&deep, 0o755, true).unwrap();
        for p in ["a", "a/b", "a/b/c"] {
            assert_eq!(existing_mode(&d.path().join(p)), Some(0o755), "{p}");
        }
        std::os::unix::fs::symlink(d.path().join("a"), d.path().join("link")).unwrap();
        assert!(ensure_dir(&d.path().join("link"), 0o755, true).is_err());
        ensure_dir(&d.path().join("link"), 0o755, false).unwrap();
    }

    #[test]
    fn copy_is_executable_and_stale_temps_go() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        fs::write(&src, b"#!/bin/true\n").unwrap();
        let dst = d.path().join("istio-cni");
        fs::write(d.path().join("istio-cni.tmp.1.2"), b"junk").unwrap();
        fs::write(d.path().join("istio-cni-other.tmp.1"), b"not ours").unwrap();
        assert_eq!(remove_stale_temps(d.path(), "istio-cni").unwrap(), 1);
        atomic_copy(&src, &dst, 0o755).unwrap();
        assert_eq!(existing_mode(&dst), Some(0o755));
        assert!(same_contents(&src, &dst).unwrap());
        fs::write(&dst, b"#!/bin/false\n").unwrap();
        assert!(!same_contents(&src, &dst).unwrap());
        assert!(is_temp_name("10-x.conflist.tmp.5.1", None));
        assert!(!is_temp_name("10-x.conflist", None));
    }
}
