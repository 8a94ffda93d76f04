//! The plugin runs on nodes we know nothing about: fully static (no NEEDED entries, no
//! OpenSSL, no glibc of a given version) and small.

mod common;

use std::path::Path;
use std::process::Command;

const MAX_RELEASE_BYTES: u64 = 15 * 1024 * 1024;

fn needed_entries(bin: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(bin)
        .output()
        .expect("readelf (binutils) is needed");
    assert!(
        out.status.success(),
        "readelf -d {}: {out:?}",
        bin.display()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(str::to_string)
        .collect()
}

#[test]
fn test_binary_is_static() {
    let bin = Path::new(env!("CARGO_BIN_EXE_istio-cni"));
    assert_eq!(
        needed_entries(bin),
        Vec::<String>::new(),
        "{}",
        bin.display()
    );
}

/// Builds the release binary (takes a few minutes on a cold cache) and checks it.
#[test]
#[ignore = "builds the release profile; run with --ignored"]
fn release_binary_is_static_and_small() {
    let bin = common::build_release_plugin();
    assert!(bin.exists(), "{} not built", bin.display());
    assert_eq!(needed_entries(&bin), Vec::<String>::new());
    let size = std::fs::metadata(&bin).unwrap().len();
    println!("release istio-cni: {size} bytes");
    assert!(
        size <= MAX_RELEASE_BYTES,
        "{} is {size} bytes, over {MAX_RELEASE_BYTES}",
        bin.display()
    );
    let out = Command::new(&bin)
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("1.1.0"));
}
