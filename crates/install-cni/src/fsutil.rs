//! Atomic file replacement: write a temp file next to the target, fsync, chmod, rename. Readers
//! (kubelet, the container runtime exec'ing the plugin) see the old file or the new one, never
//! a torn one, and a running plugin binary keeps its old inode.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Temp files are `<name>.tmp.<pid>.<n>` (Istio: `<name>.tmp.<rand>`), so a crash leaves
/// something recognisable that the next pass deletes.
const TMP_MARK: &str = ".tmp.";

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    target.with_file_name(format!("{name}{TMP_MARK}{}.{n}", std::process::id()))
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
    let tmp = temp_path(path);
    let res = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        // chmod after create: the umask must not narrow the mode we were asked for.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// Atomically copies `src` to `dst` with mode `mode`.
pub fn atomic_copy(src: &Path, dst: &Path, mode: u32) -> io::Result<()> {
    let tmp = temp_path(dst);
    let res = (|| {
        fs::copy(src, &tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))?;
        fs::File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, dst)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
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
    let m = fs::metadata(path)?;
    Ok(Stamp {
        ino: m.ino(),
        dev: m.dev(),
        len: m.len(),
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        mode: m.mode(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
