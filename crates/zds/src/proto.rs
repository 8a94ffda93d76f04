//! The ZDS messages, written by hand from ztunnel's `proto/zds.proto` (package
//! `istio.workload.zds`): field names, tags and oneof numbering are the proto's. Only `wire`
//! uses these types; everything else speaks the meaning types of `wire`.

/// `enum Version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Version {
    NotUsed = 0,
    V1 = 1,
}

/// `message ZdsHello`: ztunnel's first message on a new connection.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ZdsHello {
    #[prost(enumeration = "Version", tag = "1")]
    pub version: i32,
}

/// `message WorkloadInfo` (tag 4 and `trust_domain` are reserved: deprecated).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(string, tag = "3")]
    pub service_account: String,
}

/// `message AddWorkload`; travels with the pod's netns fd as SCM_RIGHTS.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
    #[prost(message, optional, tag = "2")]
    pub workload_info: Option<WorkloadInfo>,
}

/// `message KeepWorkload`: only before `SnapshotSent`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeepWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
}

/// `message DelWorkload` (its uid is tag 2 in the proto).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DelWorkload {
    #[prost(string, tag = "2")]
    pub uid: String,
}

/// `message SnapshotSent`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotSent {}

/// `message Ack`: an empty `error` is success.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    #[prost(string, tag = "1")]
    pub error: String,
}

/// `message WorkloadRequest`: agent -> ztunnel.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadRequest {
    #[prost(oneof = "workload_request::Payload", tags = "1, 5, 2, 3")]
    pub payload: Option<workload_request::Payload>,
}

pub mod workload_request {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        #[prost(message, tag = "1")]
        Add(super::AddWorkload),
        #[prost(message, tag = "5")]
        Keep(super::KeepWorkload),
        #[prost(message, tag = "2")]
        Del(super::DelWorkload),
        #[prost(message, tag = "3")]
        SnapshotSent(super::SnapshotSent),
    }
}

/// `message WorkloadResponse`: ztunnel -> agent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadResponse {
    #[prost(oneof = "workload_response::Payload", tags = "1")]
    pub payload: Option<workload_response::Payload>,
}

pub mod workload_response {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        #[prost(message, tag = "1")]
        Ack(super::Ack),
    }
}
