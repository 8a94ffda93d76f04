//! `integration/scripts/check-bins.sh`, the check that the image, the tests and the deploy
//! checks ran the bytes `build-bins.sh` built: identical copies pass, a copy that differs by
//! one byte (as a per-package build with other features does) fails naming it, and so does a
//! build directory changed after its SHA256SUMS was written.

use std::path::Path;
use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check-bins.sh");

fn check(dir: &Path, extra: &[&Path]) -> (bool, String) {
    let out = Command::new(SCRIPT).arg(dir).args(extra).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn copies_must_be_byte_identical_to_the_recorded_build() {
    let build = tempfile::tempdir().unwrap();
    for (name, bytes) in [
        ("istio-cni", "a"),
        ("install-cni", "b"),
        ("istio-nftables", "c"),
    ] {
        std::fs::write(build.path().join(name), bytes).unwrap();
    }
    let sums = Command::new("sha256sum")
        .args(["istio-cni", "install-cni", "istio-nftables"])
        .current_dir(build.path())
        .output()
        .unwrap();
    std::fs::write(build.path().join("SHA256SUMS"), sums.stdout).unwrap();

    let copies = tempfile::tempdir().unwrap();
    let same = copies.path().join("install-cni");
    std::fs::write(&same, "b").unwrap();
    let (ok, text) = check(build.path(), &[&same]);
    assert!(ok, "{text}");

    let other = tempfile::tempdir().unwrap();
    let differs = other.path().join("install-cni");
    std::fs::write(&differs, "B").unwrap();
    let (ok, text) = check(build.path(), &[&same, &differs]);
    assert!(
        !ok && text.contains(&differs.display().to_string()),
        "{text}"
    );

    let stranger = copies.path().join("kubelet");
    std::fs::write(&stranger, "x").unwrap();
    let (ok, text) = check(build.path(), &[&stranger]);
    assert!(!ok && text.contains("not a product binary"), "{text}");

    std::fs::write(build.path().join("istio-cni"), "rebuilt").unwrap();
    let (ok, text) = check(build.path(), &[]);
    assert!(
        !ok && text.contains("changed since build-bins.sh"),
        "{text}"
    );
}
