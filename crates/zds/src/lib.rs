//! The node agent's side of ZDS, the protocol by which Istio's CNI node agent hands each ambient
//! pod's network namespace to the node's ztunnel (ztunnel's `proto/zds.proto`).
//!
//! ztunnel connects to the agent's SOCK_SEQPACKET unix socket and says hello; the agent sends
//! every pod it knows (`AddWorkload` with the pod's netns fd as SCM_RIGHTS, one Ack awaited
//! per message), then `SnapshotSent`, after which ztunnel drops the pods not named; from then on
//! `AddWorkload` / `DelWorkload` as pods come and go. One connection at a time: a new ztunnel
//! connection replaces the current one.
//!
//! Layers: [`proto`] (the messages), [`wire`] (pure encode/decode), [`socket`] (seqpacket + fd
//! passing), [`store`] (what a snapshot holds), [`server`] (the protocol on a live connection,
//! and [`ZdsServer`], the API of the node agent).

pub mod error;
pub mod proto;
pub mod server;
pub mod socket;
pub mod store;
pub mod wire;

pub use error::{LinkError, NetnsCheckError, ZdsError};
pub use server::{DelOutcome, MAX_PENDING_HELLOS, ZdsConfig, ZdsServer, ZdsServerBuilder};
pub use wire::{WireError, WorkloadInfo};
