//! The pause process ends on SIGTERM with status 0 (what the runtime's StopPodSandbox expects),
//! and `cargo test --workspace` builds the binary the container-runtime e2e packs
//! (`integration::cri::images::pause_binary`).

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn exits_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pause"))
        .spawn()
        .expect("starting pause");
    // Its signal mask is set first thing; give it a moment before signalling.
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for pause") {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "pause ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}
