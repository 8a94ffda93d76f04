//! The guardian: keeps every sidecar pod's redirect rules true after the plugin programmed
//! them, and repairs what the plugin never saw.
//!
//! - [`repair`]: Istio's repair controller: pods that started before the plugin was installed
//!   (their `istio-validation` init container fails) are repaired in place, deleted or labelled;
//! - [`reconcile`]: continuous reconcile: each mesh pod's live rules checked against its plan on
//!   its events and once per interval; a drift re-applied atomically, rules on the other backend
//!   migrated (`redirect::migrate`); in [`reconcile::controller`] mode, opted-in pods programmed
//!   without the CNI chain;
//! - [`taint`]: the node taint removed once the node is ready;
//! - [`podplan`]: a running pod's rules as the plugin would program them (`pod_policy`'s
//!   decision, its namespace through `node_view::running`, the plan from its addresses).
//!
//! Every job reads the node through `node_view` (one pod watch, one /proc discovery) and reports
//! into `node_status` ([`metrics`]).

pub mod metrics;
pub mod podplan;
pub mod reconcile;
pub mod repair;
pub mod settings;
pub mod taint;

pub use settings::{Node, ReconcileSettings, RepairAction, RepairSettings};
