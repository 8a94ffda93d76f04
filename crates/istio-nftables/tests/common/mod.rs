//! What the CLI's tests share: the binary under test and its output as a failure shows it.
#![allow(dead_code)]

use std::process::Output;
use std::sync::LazyLock;

/// The CLI under test: the shipped build when `ISTIO_CNI_BIN_DIR` is set, else this crate's.
pub static CLI: LazyLock<String> = LazyLock::new(|| {
    testbed::node::product_binary("istio-nftables", env!("CARGO_BIN_EXE_istio-nftables"))
        .display()
        .to_string()
});

/// Exit status, stdout and stderr, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
