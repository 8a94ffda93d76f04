//! Netlink's wire format in safe Rust, for the messages the project builds and reads by hand
//! (rtnetlink policy routes in `pod-routes`, nfnetlink_log in `explain`'s legacy tracer,
//! ctnetlink in its record of the legacy host probe rule): a
//! request's header, and attributes (type-length-value, each padded to 4 bytes). The nftables
//! batches are built by libnftnl instead. And, in [`socket`], the one netlink socket layer
//! every reader and writer uses (so this crate is not pure: `socket` makes syscalls).

pub mod socket;

/// The size of an attribute's header (`struct nlattr`: length, type).
pub const NLA_HDR: usize = 4;
/// The size of a message's header (`struct nlmsghdr`).
pub const NLMSG_HDR: usize = std::mem::size_of::<libc::nlmsghdr>();

/// `NLA_F_NESTED | NLA_F_NET_BYTEORDER`: flags, not part of an attribute's type.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// Appends the attribute `kind` with `data`, padded to 4 bytes.
pub fn put_attr(buf: &mut Vec<u8>, kind: u16, data: &[u8]) {
    let len = (NLA_HDR + data.len()) as u16;
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(data);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// The attributes in `b` as `(type without flags, value)`, up to the first one that does not
/// fit (a truncated stream yields what is whole before it).
pub fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < NLA_HDR {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDR || len > b.len() {
            return None;
        }
        let value = &b[NLA_HDR..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((kind, value))
    })
}

/// A request: the header (`NLM_F_REQUEST` added to `flags`, port id 0) and `body`.
pub fn message(msg_type: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(NLMSG_HDR + body.len());
    msg.extend_from_slice(&((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&msg_type.to_ne_bytes());
    msg.extend_from_slice(&(flags | libc::NLM_F_REQUEST as u16).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(body);
    msg
}

/// The errno an `NLMSG_ERROR` message's `payload` carries (`struct nlmsgerr`'s `error`,
/// negated): 0 for an acknowledgement; `EIO` when the payload is too short to hold one.
pub fn error_code(payload: &[u8]) -> i32 {
    payload
        .get(..4)
        .map(|b| -i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_padded_and_stop_at_a_truncated_one() {
        let mut b = Vec::new();
        put_attr(&mut b, 1, b"abc");
        put_attr(&mut b, 2 | 0x8000, &7u32.to_ne_bytes());
        assert_eq!(b.len(), 8 + 8);
        assert_eq!(&b[..8], &[7, 0, 1, 0, b'a', b'b', b'c', 0]);
        let mut whole = b.clone();
        put_attr(&mut whole, 3, &[0; 8]);
        whole.truncate(whole.len() - 2);
        let got: Vec<_> = attrs(&whole).collect();
        assert_eq!(got, vec![(1, &b"abc"[..]), (2, &7u32.to_ne_bytes()[..])]);
        assert_eq!(attrs(&[4, 0]).count(), 0);
        assert_eq!(attrs(&[2, 0, 1, 0]).count(), 0, "a length below the header");
    }

    #[test]
    fn a_request_header_says_its_length_type_flags_and_sequence() {
        let m = message(0x0a, libc::NLM_F_ACK as u16, 9, &[1, 2, 3, 4]);
        assert_eq!(m.len(), 20);
        assert_eq!(u32::from_ne_bytes(m[..4].try_into().unwrap()), 20);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x0a);
        assert_eq!(
            u16::from_ne_bytes([m[6], m[7]]),
            (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16
        );
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 9);
        assert_eq!(&m[16..], &[1, 2, 3, 4]);
    }

    #[test]
    fn an_error_message_carries_its_errno_negated_and_an_ack_zero() {
        assert_eq!(error_code(&(-libc::ENOENT).to_ne_bytes()), libc::ENOENT);
        assert_eq!(error_code(&[0; 20]), 0);
        assert_eq!(error_code(&[1, 2]), libc::EIO, "too short");
    }
}
