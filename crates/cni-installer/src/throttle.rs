//! Storm throttle. Isolated repairs happen immediately (that is the point of the daemon), but
//! when something keeps reverting our work (Cilium with cni.exclusive, a config-management
//! agent, a second installer) fighting back at full speed only burns CPU and churns the file
//! kubelet reads. Like Istio we then fall back to about one pass every 5 s, and say who the
//! likely culprit is.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Throttle {
    /// Repairs within `window` that make a storm.
    pub storm_repairs: usize,
    pub window: Duration,
    /// Minimum spacing of passes during a storm.
    pub interval: Duration,
    /// Minimum spacing of storm warnings.
    pub warn_every: Duration,
    repairs: VecDeque<Instant>,
    last_pass: Option<Instant>,
    last_warn: Option<Instant>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle {
            storm_repairs: 10,
            window: Duration::from_secs(10),
            interval: Duration::from_secs(5),
            warn_every: Duration::from_secs(60),
            repairs: VecDeque::new(),
            last_pass: None,
            last_warn: None,
        }
    }
}

impl Throttle {
    fn prune(&mut self, now: Instant) {
        while self
            .repairs
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            self.repairs.pop_front();
        }
    }

    pub fn in_storm(&mut self, now: Instant) -> bool {
        self.prune(now);
        self.repairs.len() >= self.storm_repairs
    }

    /// How long to hold off before the next pass.
    pub fn delay(&mut self, now: Instant) -> Duration {
        let storm = self.in_storm(now);
        match self.last_pass {
            Some(last) if storm => (last + self.interval).saturating_duration_since(now),
            _ => Duration::ZERO,
        }
    }

    pub fn record_pass(&mut self, now: Instant) {
        self.last_pass = Some(now);
    }

    /// Records a pass that had to repair something. Returns the number of repairs in the
    /// window when a warning is due.
    pub fn record_repair(&mut self, now: Instant) -> Option<usize> {
        self.repairs.push_back(now);
        if !self.in_storm(now) {
            return None;
        }
        if self
            .last_warn
            .is_some_and(|w| now.duration_since(w) < self.warn_every)
        {
            return None;
        }
        self.last_warn = Some(now);
        Some(self.repairs.len())
    }
}

/// Best guess at who keeps undoing the install, from the CNI config dir and what changed.
pub fn culprit_hint(
    conf_dir_names: &[String],
    primary_types: &[String],
    changed: &[&str],
) -> String {
    let has_type = |t: &str| primary_types.iter().any(|p| p.contains(t));
    let what = if changed.is_empty() {
        "the install".to_string()
    } else {
        changed.join(", ")
    };
    if conf_dir_names.iter().any(|n| n.ends_with(".cilium_bak")) || has_type("cilium") {
        return format!(
            "{what} keeps being reverted; likely culprit: Cilium owning the CNI config dir \
             (set cni.exclusive=false in Cilium's Helm values, --cni-exclusive=false on the agent)"
        );
    }
    if has_type("calico") {
        return format!(
            "{what} keeps being reverted; likely culprit: Calico's install-cni rewriting its \
             conflist (check CNI_CONF_NAME / the calico-node restarts)"
        );
    }
    if has_type("multus") {
        return format!(
            "{what} keeps being reverted; likely culprit: Multus regenerating its config (00-multus.conf)"
        );
    }
    let primary = if primary_types.is_empty() {
        "unknown".to_string()
    } else {
        primary_types.join(",")
    };
    format!(
        "{what} keeps being reverted; another component is fighting istio-cni (primary CNI plugins: \
         {primary}; look for a second installer or a config-management agent)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storm_slows_to_interval_and_warns_once() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        for i in 0..9 {
            let now = t0 + Duration::from_millis(i * 10);
            assert_eq!(t.delay(now), Duration::ZERO);
            t.record_pass(now);
            assert_eq!(t.record_repair(now), None);
        }
        let now = t0 + Duration::from_millis(100);
        t.record_pass(now);
        assert_eq!(t.record_repair(now), Some(10));
        assert!(t.delay(now) > Duration::from_secs(4));
        assert_eq!(t.record_repair(now), None, "warned already");
        // After the window the storm is over.
        assert_eq!(t.delay(now + Duration::from_secs(11)), Duration::ZERO);
    }

    #[test]
    fn spaced_repairs_are_never_throttled() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        for i in 0..100 {
            let now = t0 + Duration::from_millis(i * 1200);
            assert_eq!(t.delay(now), Duration::ZERO, "repair {i}");
            t.record_pass(now);
            t.record_repair(now);
        }
    }

    #[test]
    fn hints_name_the_culprit() {
        let names = vec![
            "05-cilium.conflist".to_string(),
            "10-calico.conflist.cilium_bak".to_string(),
        ];
        assert!(culprit_hint(&names, &[], &["CNI config"]).contains("cni.exclusive=false"));
        assert!(culprit_hint(&[], &["cilium-cni".into()], &[]).contains("Cilium"));
        assert!(culprit_hint(&[], &["calico".into(), "portmap".into()], &[]).contains("Calico"));
        assert!(culprit_hint(&[], &["bridge".into()], &[]).contains("bridge"));
    }
}
