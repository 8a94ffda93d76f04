//! `istio_cni_pods{mode,state}`: the node's pods by what they should get and whether they have
//! it, the enrollment report's summary as a gauge (an alert fires on
//! `istio_cni_pods{state="not_captured"} > 0`). Every series is exported from the start.

use cni_config::status::{Mode, State, Summary};
use node_status::metrics::{Metrics, header};
use std::sync::Mutex;

pub const NAME: &str = "istio_cni_pods";

/// The series exported: the states each mode can take.
pub const SERIES: [(Mode, State); 10] = [
    (Mode::Sidecar, State::Captured),
    (Mode::Sidecar, State::NotCaptured),
    (Mode::Sidecar, State::Pending),
    (Mode::Sidecar, State::Unknown),
    (Mode::Ambient, State::Captured),
    (Mode::Ambient, State::NotCaptured),
    (Mode::Ambient, State::Pending),
    (Mode::Ambient, State::Unknown),
    (Mode::None, State::Skipped),
    (Mode::None, State::Leftover),
];

#[derive(Debug, Default)]
pub struct PodsGauge {
    last: Mutex<Option<Summary>>,
}

impl PodsGauge {
    pub fn set(&self, s: Summary) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }
}

impl Metrics for PodsGauge {
    fn render(&self, out: &mut String) {
        header(
            out,
            NAME,
            "Pods of this node by what they should get (mode) and whether they have it (state), as of the last status pass",
            "gauge",
        );
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        for (mode, state) in SERIES {
            let v = last.as_ref().map_or(0, |s| s.count(mode, state));
            out.push_str(&format!(
                "{NAME}{{mode=\"{}\",state=\"{}\"}} {v}\n",
                mode.as_str(),
                state.as_str()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_config::status::Count;

    #[test]
    fn every_series_is_exported() {
        let g = PodsGauge::default();
        let mut s = String::new();
        g.render(&mut s);
        assert_eq!(s.lines().count(), 2 + SERIES.len());
        assert!(s.contains("istio_cni_pods{mode=\"sidecar\",state=\"not_captured\"} 0\n"));
        g.set(Summary {
            counts: vec![Count {
                mode: Mode::Sidecar,
                state: State::NotCaptured,
                pods: 2,
            }],
            ..Summary::default()
        });
        let mut s = String::new();
        g.render(&mut s);
        assert!(s.contains("istio_cni_pods{mode=\"sidecar\",state=\"not_captured\"} 2\n"));
    }
}
