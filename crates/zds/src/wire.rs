//! The wire: ZDS messages as bytes, without sockets or state. Pure, so every rule of the
//! protocol that concerns one message (size, required fields, version) is unit-tested here.
//! Both directions are here: the agent's (encode requests, decode hello and acks) and the
//! ztunnel's (the reverse), the latter for fake peers in tests.

use prost::Message;

use crate::proto::{self, workload_request::Payload as ReqPayload, workload_response};

/// ztunnel reads each message into a 1024-byte buffer (`src/inpod/protocol.rs`,
/// `read_message`) and rejects a truncated one by dropping the connection, so a longer message
/// is refused here, before it is sent.
pub const MAX_MESSAGE_LEN: usize = 1024;

/// The pod's identity as ztunnel needs it to pick the workload's certificate and policies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadInfo {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

/// A message from the agent to ztunnel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Start proxying the pod; sent together with its netns fd.
    Add { uid: String, info: WorkloadInfo },
    /// Before `SnapshotSent` only: keep the pod although its netns is not sent.
    Keep { uid: String },
    /// Stop proxying the pod.
    Del { uid: String },
    /// The snapshot is complete: ztunnel drops every pod not named since the connection began.
    SnapshotSent,
}

impl Request {
    /// Whether the message travels with a netns fd (only `Add` does; ztunnel refuses an fd on
    /// any other message and an `Add` without one).
    pub fn carries_netns(&self) -> bool {
        matches!(self, Request::Add { .. })
    }

    /// The pod the message is about, if any.
    pub fn uid(&self) -> Option<&str> {
        match self {
            Request::Add { uid, .. } | Request::Keep { uid } | Request::Del { uid } => Some(uid),
            Request::SnapshotSent => None,
        }
    }
}

/// ztunnel's answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Ack,
    /// An `Ack` whose `error` is set: ztunnel's message.
    Nack(String),
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("field uid is empty")]
    EmptyUid,
    #[error("message is {len} bytes, more than ztunnel's {max}-byte receive buffer")]
    TooLong { len: usize, max: usize },
    #[error("cannot decode {what}: {source}")]
    Decode {
        what: &'static str,
        source: prost::DecodeError,
    },
    #[error("{what} has no payload")]
    NoPayload { what: &'static str },
    #[error("hello announces protocol version {0}; only V1 (1) is spoken")]
    UnsupportedVersion(i32),
}

/// Encodes an agent request; refuses an empty uid and a message ztunnel could not read whole.
pub fn encode_request(req: &Request) -> Result<Vec<u8>, WireError> {
    if req.uid().is_some_and(str::is_empty) {
        return Err(WireError::EmptyUid);
    }
    let payload = match req.clone() {
        Request::Add { uid, info } => ReqPayload::Add(proto::AddWorkload {
            uid,
            workload_info: Some(proto::WorkloadInfo {
                name: info.name,
                namespace: info.namespace,
                service_account: info.service_account,
            }),
        }),
        Request::Keep { uid } => ReqPayload::Keep(proto::KeepWorkload { uid }),
        Request::Del { uid } => ReqPayload::Del(proto::DelWorkload { uid }),
        Request::SnapshotSent => ReqPayload::SnapshotSent(proto::SnapshotSent {}),
    };
    let bytes = proto::WorkloadRequest {
        payload: Some(payload),
    }
    .encode_to_vec();
    if bytes.len() > MAX_MESSAGE_LEN {
        return Err(WireError::TooLong {
            len: bytes.len(),
            max: MAX_MESSAGE_LEN,
        });
    }
    Ok(bytes)
}

/// Decodes an agent request (ztunnel's side; for fake peers).
pub fn decode_request(bytes: &[u8]) -> Result<Request, WireError> {
    let msg = proto::WorkloadRequest::decode(bytes).map_err(|source| WireError::Decode {
        what: "WorkloadRequest",
        source,
    })?;
    let payload = msg.payload.ok_or(WireError::NoPayload {
        what: "WorkloadRequest",
    })?;
    Ok(match payload {
        ReqPayload::Add(a) => {
            let info = a.workload_info.unwrap_or_default();
            Request::Add {
                uid: a.uid,
                info: WorkloadInfo {
                    name: info.name,
                    namespace: info.namespace,
                    service_account: info.service_account,
                },
            }
        }
        ReqPayload::Keep(k) => Request::Keep { uid: k.uid },
        ReqPayload::Del(d) => Request::Del { uid: d.uid },
        ReqPayload::SnapshotSent(_) => Request::SnapshotSent,
    })
}

/// ztunnel's hello (its side; for fake peers).
pub fn encode_hello() -> Vec<u8> {
    proto::ZdsHello {
        version: proto::Version::V1 as i32,
    }
    .encode_to_vec()
}

/// Checks ztunnel's hello: it must announce V1, the only version there is.
pub fn decode_hello(bytes: &[u8]) -> Result<(), WireError> {
    let hello = proto::ZdsHello::decode(bytes).map_err(|source| WireError::Decode {
        what: "ZdsHello",
        source,
    })?;
    match proto::Version::try_from(hello.version) {
        Ok(proto::Version::V1) => Ok(()),
        _ => Err(WireError::UnsupportedVersion(hello.version)),
    }
}

/// ztunnel's answer (its side; for fake peers).
pub fn encode_response(resp: &Response) -> Vec<u8> {
    let error = match resp {
        Response::Ack => String::new(),
        Response::Nack(e) => e.clone(),
    };
    proto::WorkloadResponse {
        payload: Some(workload_response::Payload::Ack(proto::Ack { error })),
    }
    .encode_to_vec()
}

/// Decodes ztunnel's answer to a request.
pub fn decode_response(bytes: &[u8]) -> Result<Response, WireError> {
    let msg = proto::WorkloadResponse::decode(bytes).map_err(|source| WireError::Decode {
        what: "WorkloadResponse",
        source,
    })?;
    match msg.payload {
        Some(workload_response::Payload::Ack(ack)) if ack.error.is_empty() => Ok(Response::Ack),
        Some(workload_response::Payload::Ack(ack)) => Ok(Response::Nack(ack.error)),
        None => Err(WireError::NoPayload {
            what: "WorkloadResponse",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> WorkloadInfo {
        WorkloadInfo {
            name: "app-1".into(),
            namespace: "default".into(),
            service_account: "app".into(),
        }
    }

    #[test]
    fn requests_round_trip() {
        for req in [
            Request::Add {
                uid: "uid-1".into(),
                info: info(),
            },
            Request::Keep {
                uid: "uid-2".into(),
            },
            Request::Del {
                uid: "uid-3".into(),
            },
            Request::SnapshotSent,
        ] {
            let bytes = encode_request(&req).unwrap();
            assert_eq!(decode_request(&bytes).unwrap(), req);
        }
    }

    /// The exact bytes protoc's encoding gives (checked by hand against zds.proto's tags):
    /// oneof tags 1 (add), 5 (keep), 2 (del), 3 (snapshot_sent); DelWorkload.uid is tag 2.
    #[test]
    fn requests_use_the_proto_tags() {
        let add = encode_request(&Request::Add {
            uid: "u".into(),
            info: WorkloadInfo {
                name: "n".into(),
                namespace: "s".into(),
                service_account: "a".into(),
            },
        })
        .unwrap();
        // WorkloadRequest.add(1){ uid(1)="u", workload_info(2){ name(1)="n", namespace(2)="s",
        // service_account(3)="a" } }
        assert_eq!(
            add,
            [
                0x0a, 14, 0x0a, 1, b'u', 0x12, 9, 0x0a, 1, b'n', 0x12, 1, b's', 0x1a, 1, b'a'
            ]
        );
        let keep = encode_request(&Request::Keep { uid: "u".into() }).unwrap();
        assert_eq!(keep, [0x2a, 3, 0x0a, 1, b'u']);
        let del = encode_request(&Request::Del { uid: "u".into() }).unwrap();
        assert_eq!(del, [0x12, 3, 0x12, 1, b'u']);
        assert_eq!(encode_request(&Request::SnapshotSent).unwrap(), [0x1a, 0]);
    }

    #[test]
    fn only_add_carries_the_netns() {
        assert!(
            Request::Add {
                uid: "u".into(),
                info: info()
            }
            .carries_netns()
        );
        assert!(!Request::Del { uid: "u".into() }.carries_netns());
        assert!(!Request::Keep { uid: "u".into() }.carries_netns());
        assert!(!Request::SnapshotSent.carries_netns());
    }

    #[test]
    fn empty_uid_is_refused() {
        for req in [
            Request::Add {
                uid: String::new(),
                info: info(),
            },
            Request::Del { uid: String::new() },
            Request::Keep { uid: String::new() },
        ] {
            assert!(matches!(encode_request(&req), Err(WireError::EmptyUid)));
        }
    }

    #[test]
    fn message_longer_than_ztunnels_buffer_is_refused() {
        let fits = |name_len: usize| {
            encode_request(&Request::Add {
                uid: "uid".into(),
                info: WorkloadInfo {
                    name: "x".repeat(name_len),
                    ..info()
                },
            })
        };
        // Find the largest name that fits: the boundary is exactly MAX_MESSAGE_LEN bytes.
        let largest = (0..2000).rev().find(|&n| fits(n).is_ok()).unwrap();
        assert_eq!(fits(largest).unwrap().len(), MAX_MESSAGE_LEN);
        let err = fits(largest + 1).unwrap_err();
        assert!(
            matches!(err, WireError::TooLong { len, max: 1024 } if len > 1024),
            "{err}"
        );
        assert!(err.to_string().contains("1024-byte"), "{err}");
    }

    #[test]
    fn hello_v1_is_accepted() {
        decode_hello(&encode_hello()).unwrap();
        // What ztunnel sends: field 1 varint 1.
        assert_eq!(encode_hello(), [0x08, 0x01]);
    }

    #[test]
    fn hello_with_another_version_is_refused() {
        // proto3 omits the default: an empty hello is version NOT_USED (0).
        assert!(matches!(
            decode_hello(&[]),
            Err(WireError::UnsupportedVersion(0))
        ));
        assert!(matches!(
            decode_hello(&[0x08, 0x02]),
            Err(WireError::UnsupportedVersion(2))
        ));
        assert!(matches!(
            decode_hello(&[0xff]),
            Err(WireError::Decode {
                what: "ZdsHello",
                ..
            })
        ));
    }

    #[test]
    fn acks_and_nacks_round_trip() {
        assert_eq!(
            decode_response(&encode_response(&Response::Ack)).unwrap(),
            Response::Ack
        );
        let nack = Response::Nack("failure to start proxy".into());
        assert_eq!(decode_response(&encode_response(&nack)).unwrap(), nack);
    }

    #[test]
    fn response_without_payload_or_garbage_is_an_error() {
        assert!(matches!(
            decode_response(&[]),
            Err(WireError::NoPayload {
                what: "WorkloadResponse"
            })
        ));
        // A hello where an ack is expected: field 1 with the wrong wire type.
        assert!(matches!(
            decode_response(&encode_hello()),
            Err(WireError::Decode { .. })
        ));
    }

    #[test]
    fn request_without_payload_is_an_error() {
        assert!(matches!(
            decode_request(&[]),
            Err(WireError::NoPayload { .. })
        ));
    }
}
