//! The watch-and-repair loop (Istio's `Run`): one install pass, then wait for a change in a
//! watched directory (or the periodic resync), repair, and so on until shutdown. Pass errors are
//! retried with backoff, never fatal; a storm of outside rewrites is throttled.

use crate::install::{Installer, Outcome};
use crate::throttle::{Throttle, culprit_hint};
use crate::watch::{self, Watch};
use node_status::State;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Safety net for changes inotify cannot see (e.g. a remount); a no-op pass costs microseconds.
const RESYNC: Duration = Duration::from_secs(60);
/// Poll interval while some directory cannot be watched.
const DEGRADED_POLL: Duration = Duration::from_secs(5);

/// Resolves with the name of the signal that asks the daemon to stop.
pub type StopSignal = Pin<Box<dyn Future<Output = &'static str>>>;

/// The watch-and-repair loop (Istio's `Run`). Returns on shutdown only: pass errors are
/// retried with backoff, never fatal, so a transient error cannot crash-loop the pod.
pub async fn run(
    mut installer: Installer,
    state: Arc<State>,
    mut watch: Watch,
    mut shutdown: StopSignal,
) -> (Installer, &'static str) {
    let mut throttle = Throttle::default();
    let mut backoff = BACKOFF_MIN;
    let mut last_note: Option<String> = None;
    let mut first = true;
    loop {
        let delay = throttle.delay(Instant::now());
        if !delay.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                s = &mut shutdown => return (installer, s),
            }
        }
        // Arm before the pass: a change made while we work wakes the next iteration.
        watch.arm();
        let dirty = watch.take_dirty();
        let started = Instant::now();
        throttle.record_pass(started);
        match installer.pass() {
            Ok(Outcome::Installed { changes, warning }) => {
                backoff = BACKOFF_MIN;
                if let Some(w) = warning {
                    if last_note.as_deref() != Some(w.as_str()) {
                        tracing::warn!("{w}");
                        last_note = Some(w);
                    }
                } else {
                    last_note = None;
                }
                if !changes.is_empty() || first {
                    installer.metrics.inc(&["SUCCESS"]);
                }
                if !changes.is_empty() {
                    let took = started.elapsed();
                    tracing::info!(
                        changes = ?changes,
                        took_us = took.as_micros() as u64,
                        trigger = ?watch::describe(dirty),
                        "{}",
                        if first { "installed" } else { "repaired" }
                    );
                    let storm = if first {
                        None
                    } else {
                        throttle.record_repair(Instant::now())
                    };
                    if let Some(n) = storm {
                        tracing::warn!(
                            repairs = n,
                            window_s = throttle.window.as_secs(),
                            "{}; slowing down to one pass every {} s",
                            culprit_hint(
                                &installer.conf_dir_names,
                                &installer.primary_types,
                                &watch::describe(dirty)
                            ),
                            throttle.interval.as_secs()
                        );
                    }
                } else if first {
                    tracing::info!("already installed; nothing to change");
                }
                state.set_ready();
            }
            Ok(Outcome::Waiting { reason }) => {
                state.set_not_ready(&reason);
                if last_note.as_deref() != Some(reason.as_str()) {
                    tracing::warn!(reason = %reason, "not ready: waiting for the primary CNI config");
                    last_note = Some(reason);
                }
            }
            Err(e) => {
                installer.metrics.inc(&[e.result_label()]);
                state.set_not_ready(&e.to_string());
                tracing::error!(error = %e, result = e.result_label(), retry_in_s = backoff.as_secs(), "install pass failed");
                last_note = None;
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    s = &mut shutdown => return (installer, s),
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        }
        first = false;
        let wait = if watch.degraded() {
            DEGRADED_POLL
        } else {
            RESYNC
        };
        tokio::select! {
            _ = watch.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            s = &mut shutdown => return (installer, s),
        }
    }
}
