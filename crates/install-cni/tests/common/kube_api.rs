//! The fake Kubernetes API lives in the integration harness (one implementation, shared with
//! the node tests, where the plugin and the node agent use the same server).
#![allow(unused_imports)]

pub use integration::kube_api::*;
