//! The fake Kubernetes API lives in the test rigs (`testbed`) (one implementation, shared with
//! the node tests, where the plugin and the node agent use the same server).
#![allow(unused_imports)]

pub use testbed::kube_api::*;
