//! Images for the private containerd, made locally (no registry is reachable):
//! * the pause image: the static `pause` binary (the `pause` package, [`pause_binary`]) packed as
//!   a one-layer OCI image;
//! * the install-cni image: `deploy/scripts/build-image.sh`'s OCI archive (or `$ISTIO_CNI_IMAGE`).

use serde_json::json;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `pause` package's binary in the cargo profile directory of the running executable
/// (`target/<triple>/<profile>/pause`, also for test binaries in `deps/`): `cargo test
/// --workspace` builds it (its own test runs it), as do `cargo build --bins` and
/// `cargo build -p pause`. Panics naming the command when it is missing.
pub fn pause_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the running executable");
    let mut dir = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let pause = dir.join("pause");
    assert!(
        pause.is_file(),
        "{} missing: build it first (`cargo build -p pause`, or `cargo test --workspace`)",
        pause.display()
    );
    pause
}

/// Packs `pause_bin` as `/pause` into an OCI image archive named `name`, written to `out`.
pub fn pause_archive(pause_bin: &Path, name: &str, out: &Path) -> io::Result<()> {
    let work = out.with_extension("d");
    let layout = work.join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(work.join("rootfs"))?;
    fs::create_dir_all(&blobs)?;
    fs::copy(pause_bin, work.join("rootfs/pause"))?;
    let layer = work.join("layer.tar");
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(work.join("rootfs"))
        .arg("-cf")
        .arg(&layer)
        .arg("pause"))?;
    let layer_digest = put_blob(&blobs, &fs::read(&layer)?)?;
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest.0]},
    });
    let config = put_blob(&blobs, &serde_json::to_vec(&config)?)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config.0, "size": config.1},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest.0, "size": layer_digest.1}],
    });
    let manifest = put_blob(&blobs, &serde_json::to_vec(&manifest)?)?;
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest.0, "size": manifest.1,
                       "annotations": {"org.opencontainers.image.ref.name": name}}],
    });
    fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&layout)
        .arg("-cf")
        .arg(out)
        .args(["oci-layout", "index.json", "blobs"]))?;
    fs::remove_dir_all(&work)
}

/// Writes a content-addressed blob; returns (`sha256:<hex>`, size).
fn put_blob(dir: &Path, data: &[u8]) -> io::Result<(String, usize)> {
    let tmp = dir.join("incoming");
    fs::write(&tmp, data)?;
    let out = run(Command::new("sha256sum").arg(&tmp))?;
    let hex = out.split_whitespace().next().unwrap_or("").to_string();
    fs::rename(&tmp, dir.join(&hex))?;
    Ok((format!("sha256:{hex}"), data.len()))
}

fn run(cmd: &mut Command) -> io::Result<String> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The repository root (this crate lives in `<root>/integration`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration/ has a parent")
        .to_path_buf()
}

/// The install-cni OCI archive: `$ISTIO_CNI_IMAGE` when set (test.sh builds and checks it once),
/// else `deploy/scripts/build-image.sh --out <dir>/install-cni.oci.tar` (which builds the
/// release binaries first; a no-op when they are fresh).
pub fn install_cni_archive(dir: &Path) -> io::Result<PathBuf> {
    if let Some(p) = std::env::var_os("ISTIO_CNI_IMAGE") {
        return Ok(PathBuf::from(p));
    }
    let out = dir.join("install-cni.oci.tar");
    let script = repo_root().join("deploy/scripts/build-image.sh");
    // The environment of a plain shell: the variables `cargo test` sets for its test processes
    // would make the nested `cargo build --release` rebuild the binaries (and the next plain
    // build rebuild them again).
    let mut cmd = Command::new(&script);
    cmd.env_clear();
    for k in [
        "PATH",
        "HOME",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "CARGO_TARGET_DIR",
        "TMPDIR",
    ] {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    let o = cmd.arg("--out").arg(&out).output()?;
    if !o.status.success() {
        return Err(io::Error::other(format!(
            "{}: {}{}",
            script.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    Ok(out)
}
