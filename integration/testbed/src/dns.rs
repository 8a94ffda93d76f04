//! A minimal DNS client for the ambient tests: one A query over UDP from inside a namespace,
//! to see who answers (ztunnel's DNS proxy knows the mesh's service names; nothing else here
//! does). Hand-rolled: one question, A records only, no compression beyond answer names.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

/// What came back for a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsReply {
    /// Where the reply came from (after un-NAT: the address the query was sent to).
    pub from: SocketAddr,
    /// The response code (0 = NOERROR, 3 = NXDOMAIN, ...).
    pub rcode: u8,
    /// The A records of the answer section.
    pub addresses: Vec<Ipv4Addr>,
}

const QUERY_ID: u16 = 0x4a17;

/// Sends an A query for `name` to `server` from inside the namespace at `ns` (as root) and
/// waits up to `timeout` for the reply.
pub fn query_a(
    ns: &Path,
    server: SocketAddr,
    name: &str,
    timeout: Duration,
) -> io::Result<DnsReply> {
    let query = encode_query(name);
    crate::run_in(Some(ns), move || {
        let sock = UdpSocket::bind(if server.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        })?;
        sock.set_read_timeout(Some(timeout))?;
        sock.send_to(&query, server)?;
        let mut buf = [0u8; 1500];
        let (n, from) = sock.recv_from(&mut buf)?;
        let (rcode, addresses) = decode_reply(&buf[..n])?;
        Ok(DnsReply {
            from,
            rcode,
            addresses,
        })
    })?
}

fn encode_query(name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(32 + name.len());
    q.extend_from_slice(&QUERY_ID.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00]); // recursion desired
    q.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // one question
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&[0, 1, 0, 1]); // A, IN
    q
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("DNS reply: {what}"))
}

/// Skips a (possibly compressed) name starting at `at`; returns the offset after it.
fn skip_name(msg: &[u8], mut at: usize) -> io::Result<usize> {
    loop {
        let len = *msg.get(at).ok_or_else(|| bad("name runs past the end"))?;
        match len {
            0 => return Ok(at + 1),
            l if l & 0xc0 == 0xc0 => return Ok(at + 2),
            l => at += 1 + l as usize,
        }
    }
}

fn u16_at(msg: &[u8], at: usize) -> io::Result<u16> {
    msg.get(at..at + 2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]))
        .ok_or_else(|| bad("truncated"))
}

fn decode_reply(msg: &[u8]) -> io::Result<(u8, Vec<Ipv4Addr>)> {
    if u16_at(msg, 0)? != QUERY_ID {
        return Err(bad("wrong id"));
    }
    let rcode = (u16_at(msg, 2)? & 0x000f) as u8;
    let (questions, answers) = (u16_at(msg, 4)?, u16_at(msg, 6)?);
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(msg, at)? + 4;
    }
    let mut addresses = Vec::new();
    for _ in 0..answers {
        at = skip_name(msg, at)?;
        let (rtype, rdlen) = (u16_at(msg, at)?, u16_at(msg, at + 8)? as usize);
        let rdata = msg
            .get(at + 10..at + 10 + rdlen)
            .ok_or_else(|| bad("truncated record"))?;
        if rtype == 1 && rdlen == 4 {
            addresses.push(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]));
        }
        at += 10 + rdlen;
    }
    Ok((rcode, addresses))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_with_a_compressed_answer_is_decoded() {
        let mut reply = encode_query("b.default.svc.cluster.local");
        reply[2] = 0x81;
        reply[3] = 0x80; // response, no error
        reply[7] = 1; // one answer
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 96, 0, 20]);
        let (rcode, addrs) = decode_reply(&reply).unwrap();
        assert_eq!(rcode, 0);
        assert_eq!(addrs, [Ipv4Addr::new(10, 96, 0, 20)]);
    }

    #[test]
    fn a_truncated_reply_is_an_error_not_a_panic() {
        let reply = encode_query("x.y");
        let mut r = reply.clone();
        r[7] = 1;
        assert!(decode_reply(&r).is_err());
        assert!(decode_reply(&reply[..5]).is_err());
    }
}
