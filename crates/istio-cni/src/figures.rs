//! The figures of one ADD for the node daemon's histograms ([`cni_config::log::AddFigures`]):
//! what the pod turned out to be, who answered its lookup and how long that took, the step a
//! failure came from. The commands note them as they go; [`send`] hands them to the daemon in
//! one non-blocking datagram on the log relay's socket (dropped when the daemon is away or its
//! queue is full: an ADD never waits for its figures).

use crate::cni::CniError;
use cni_config::log::{AddFigures, FiguresDatagram};
use std::sync::Mutex;
use std::time::Duration;

/// One invocation per process: the figures are the process'.
static NOTED: Mutex<Noted> = Mutex::new(Noted {
    mode: None,
    reason: None,
    lookup: None,
});

struct Noted {
    mode: Option<&'static str>,
    reason: Option<&'static str>,
    lookup: Option<(&'static str, Duration)>,
}

fn noted() -> std::sync::MutexGuard<'static, Noted> {
    NOTED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pod's mode (one of [`cni_config::log::MODES`]).
pub fn mode(mode: &'static str) {
    noted().mode = Some(mode);
}

/// Who answered the lookup (one of [`cni_config::log::LOOKUP_SOURCES`]) after how long.
pub fn lookup(source: &'static str, took: Duration) {
    noted().lookup = Some((source, took));
}

/// Notes the step an error comes from (one of [`cni_config::log::PLUGIN_FAILURE_REASONS`]) and
/// passes the error on; the first step noted is the one that failed.
pub fn failed(reason: &'static str) -> impl FnOnce(CniError) -> CniError {
    move |e| {
        noted().reason.get_or_insert(reason);
        e
    }
}

/// The ADD's figures as its outcome and elapsed time leave them.
pub fn for_add(ok: bool, elapsed: Duration) -> AddFigures {
    let n = noted();
    let (lookup_source, lookup_us) = n.lookup.map_or(("", 0), |(s, d)| (s, d.as_micros() as u64));
    AddFigures {
        mode: n.mode.unwrap_or("unknown").into(),
        result: if ok { "success" } else { "failure" }.into(),
        // Failed before any step was noted: the configuration, CNI environment or version.
        reason: if ok {
            String::new()
        } else {
            n.reason.unwrap_or("config_failed").into()
        },
        elapsed_us: elapsed.as_micros() as u64,
        lookup_source: lookup_source.into(),
        lookup_us,
    }
}

/// One datagram to the daemon (nothing when its socket was not there at start).
pub fn send(figures: AddFigures) {
    let d = FiguresDatagram { figures };
    if let Ok(bytes) = serde_json::to_vec(&d) {
        crate::logging::send_figures(&bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::ErrorCode;

    #[test]
    fn the_first_failed_step_is_the_reason_and_defaults_say_what_is_unknown() {
        let f = for_add(false, Duration::from_micros(10));
        assert_eq!(
            (f.mode.as_str(), f.reason.as_str()),
            ("unknown", "config_failed")
        );
        mode("sidecar");
        lookup("cache", Duration::from_micros(250));
        let e = failed("rules_failed")(CniError::new(ErrorCode::Redirect, "x"));
        let _ = failed("lookup_failed")(e);
        let f = for_add(false, Duration::from_micros(1400));
        assert_eq!(f.mode, "sidecar");
        assert_eq!(f.reason, "rules_failed");
        assert_eq!((f.lookup_source.as_str(), f.lookup_us), ("cache", 250));
        assert_eq!(f.elapsed_us, 1400);
        let ok = for_add(true, Duration::ZERO);
        assert_eq!((ok.result.as_str(), ok.reason.as_str()), ("success", ""));
        let json = serde_json::to_string(&FiguresDatagram { figures: ok }).unwrap();
        assert!(json.starts_with("{\"figures\""), "{json}");
    }
}
