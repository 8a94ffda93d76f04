//! The temporary chain: which table hosts it, its one rule, adding and removing it (each in
//! its own atomic batch), and removing chains left behind by killed runs.

use super::{
    Connection, Direction, Netns, Protocol, TRACE_CHAIN_PREFIX, TRACE_PRIORITY, TraceError, owner,
};
use capture::Table;
use nft_backend::expr::{self, Expr};
use nft_backend::netlink::{self, Socket};
use nftnl::nftnl_sys as sys;
use nftnl::{Batch, Chain, ChainType, Hook, MsgType, Policy, ProtoFamily, Rule};
use std::ffi::CString;
use std::io;
use std::net::IpAddr;

/// Our tables (`capture::Table`'s nft names), in the order we prefer to host the temporary
/// chain: the sidecar's, then ambient's, each in creation order (nat, mangle, raw).
pub fn our_tables() -> impl Iterator<Item = &'static str> {
    Table::ALL
        .into_iter()
        .chain(Table::AMBIENT)
        .map(Table::nft_name)
}

/// Whether `(family, table)` is one of ours (events elsewhere are not reported).
pub fn is_our_table(family: &str, table: &str) -> bool {
    family == "inet" && table.starts_with("istio-")
}

/// What the trace rule matches, beyond the connection itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extra {
    /// The source port of the socket we connect from (outbound only: nothing rewrites it
    /// before the output hook).
    pub sport: Option<u16>,
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("names have no NUL")
}

fn open() -> Result<Socket, TraceError> {
    Socket::open().map_err(|source| TraceError::Netlink {
        what: "opening a netfilter netlink socket".into(),
        source,
    })
}

/// The first of our tables that exists in the current namespace.
pub fn host_table(netns: &Netns) -> Result<&'static str, TraceError> {
    let sock = open()?;
    let all = nft_backend::live::tables(&sock).map_err(|e| TraceError::Netlink {
        what: "listing nftables tables".into(),
        source: match e {
            nft_backend::NftError::Io { source, .. }
            | nft_backend::NftError::Unsupported(source) => source,
            other => io::Error::other(other.to_string()),
        },
    })?;
    our_tables()
        .find(|t| all.iter().any(|(f, n)| f == "inet" && n == t))
        .ok_or_else(|| TraceError::NoIstioRules {
            netns: netns.path().map(Into::into),
        })
}

/// Which pass of the packet a trace rule marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Where the connection starts: `output` (outbound) or `prerouting` (inbound).
    First,
    /// An outbound packet to a local address coming back in over lo (`prerouting`, `iifname
    /// "lo"`): after a redirect its destination is the new one, so it is recognised by its
    /// source port when known, else by its connection's ORIGINAL destination (`ct original`:
    /// the packet still carries the conntrack entry its first pass made, also at a priority
    /// before conntrack's).
    LoopedBack,
}

/// The trace rule's expressions (for an `inet` table).
fn rule_exprs(conn: &Connection, extra: Extra, pass: Pass) -> Vec<Expr> {
    let v6 = conn.is_ipv6();
    let nfproto = if v6 {
        libc::NFPROTO_IPV6
    } else {
        libc::NFPROTO_IPV4
    } as u8;
    let l4 = match conn.protocol {
        Protocol::Tcp => libc::IPPROTO_TCP,
        Protocol::Udp => libc::IPPROTO_UDP,
    } as u8;
    let nh = libc::NFT_PAYLOAD_NETWORK_HEADER as u32;
    let th = libc::NFT_PAYLOAD_TRANSPORT_HEADER as u32;
    let eq = libc::NFT_CMP_EQ as u32;
    let (saddr_off, daddr_off) = if v6 { (8, 24) } else { (12, 16) };
    let mut e = vec![
        expr::meta_load(libc::NFT_META_NFPROTO as u32),
        expr::cmp(eq, &[nfproto]),
        expr::meta_load(libc::NFT_META_L4PROTO as u32),
        expr::cmp(eq, &[l4]),
    ];
    if pass == Pass::LoopedBack {
        e.push(expr::meta_load(libc::NFT_META_IIFNAME as u32));
        e.push(expr::cmp(eq, &expr::ifname_bytes("lo")));
    }
    // The destination, unless a looped-back packet is recognised by its source port or its
    // connection's original destination.
    let by_original = pass == Pass::LoopedBack && extra.sport.is_none();
    if by_original {
        e.extend(original_destination(conn));
    }
    let match_dst = pass == Pass::First;
    if match_dst {
        let addr = ip_bytes(conn.dst.ip());
        e.push(expr::payload(nh, daddr_off, addr.len() as u32));
        e.push(expr::cmp(eq, &addr));
    }
    if let Some(src) = conn.src {
        let a = ip_bytes(src);
        e.push(expr::payload(nh, saddr_off, a.len() as u32));
        e.push(expr::cmp(eq, &a));
    }
    if match_dst {
        e.push(expr::payload(th, 2, 2));
        e.push(expr::cmp(eq, &conn.dst.port().to_be_bytes()));
    }
    if let Some(p) = extra.sport {
        e.push(expr::payload(th, 0, 2));
        e.push(expr::cmp(eq, &p.to_be_bytes()));
    }
    if conn.protocol == Protocol::Tcp {
        // Only the connection's first packet: SYN without ACK (conntrack has not run yet at
        // this priority, so `ct state new` is not available).
        e.push(expr::payload(th, 13, 1));
        e.push(expr::bitwise_and(&[TCP_SYN | TCP_ACK]));
        e.push(expr::cmp(eq, &[TCP_SYN]));
    }
    if conn.direction == Direction::Outbound && pass == Pass::First {
        if let Some(uid) = conn.uid {
            e.push(expr::meta_load(libc::NFT_META_SKUID as u32));
            e.push(expr::cmp(eq, &uid.to_ne_bytes()));
        }
        if let Some(gid) = conn.gid {
            e.push(expr::meta_load(libc::NFT_META_SKGID as u32));
            e.push(expr::cmp(eq, &gid.to_ne_bytes()));
        }
    }
    e.push(expr::immediate(&[1]));
    e.push(expr::meta_set(libc::NFT_META_NFTRACE as u32));
    e
}

/// `ct original ip[6] daddr DST ct original proto-dst PORT`.
fn original_destination(conn: &Connection) -> [Expr; 4] {
    const ORIGINAL: u8 = 0; // IP_CT_DIR_ORIGINAL
    let eq = libc::NFT_CMP_EQ as u32;
    let key = match conn.dst.ip() {
        IpAddr::V4(_) => libc::NFT_CT_DST_IP,
        IpAddr::V6(_) => libc::NFT_CT_DST_IP6,
    } as u32;
    [
        expr::ct_load_dir(key, ORIGINAL),
        expr::cmp(eq, &ip_bytes(conn.dst.ip())),
        expr::ct_load_dir(libc::NFT_CT_PROTO_DST as u32, ORIGINAL),
        expr::cmp(eq, &conn.dst.port().to_be_bytes()),
    ]
}

const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The trace rule in nft syntax.
pub fn rule_text(conn: &Connection, extra: Extra) -> String {
    let (ipk, nfproto) = if conn.is_ipv6() {
        ("ip6", "ipv6")
    } else {
        ("ip", "ipv4")
    };
    let p = conn.protocol.name();
    let mut s = format!(
        "meta nfproto {nfproto} meta l4proto {p} {ipk} daddr {}",
        conn.dst.ip()
    );
    if let Some(src) = conn.src {
        s += &format!(" {ipk} saddr {src}");
    }
    s += &format!(" {p} dport {}", conn.dst.port());
    if let Some(sp) = extra.sport {
        s += &format!(" {p} sport {sp}");
    }
    if conn.protocol == Protocol::Tcp {
        s += " tcp flags & (syn | ack) == syn";
    }
    if conn.direction == Direction::Outbound {
        if let Some(u) = conn.uid {
            s += &format!(" meta skuid {u}");
        }
        if let Some(g) = conn.gid {
            s += &format!(" meta skgid {g}");
        }
    }
    s + " meta nftrace set 1"
}

fn send(sock: &Socket, batch: &nftnl::FinalizedBatch, what: String) -> Result<(), TraceError> {
    let nacks = sock
        .send_batch(batch, false)
        .map_err(|source| TraceError::Netlink {
            what: format!("sending the batch for {what}"),
            source,
        })?;
    match nacks.first() {
        None => Ok(()),
        Some(n) => Err(TraceError::Refused {
            what,
            source: io::Error::from_raw_os_error(n.errno),
        }),
    }
}

/// Adds the trace chains to `inet table` in one batch (current namespace): `name` at the
/// connection's first hook, and `looped` (outbound only) at prerouting for its second pass
/// over lo.
pub fn add(
    table: &str,
    name: &str,
    looped: Option<&str>,
    conn: &Connection,
    extra: Extra,
) -> Result<(), TraceError> {
    let sock = open()?;
    let t = nftnl::Table::new(cstr(table), ProtoFamily::Inet);
    let first = match conn.direction {
        Direction::Outbound => Hook::Out,
        Direction::Inbound => Hook::PreRouting,
    };
    let mut batch = Batch::new();
    let chains: Vec<(&str, Hook, Pass)> = std::iter::once((name, first, Pass::First))
        .chain(looped.map(|l| (l, Hook::PreRouting, Pass::LoopedBack)))
        .collect();
    for (chain_name, hook, pass) in chains {
        let mut chain = Chain::new(cstr(chain_name), &t);
        chain.set_hook(hook, TRACE_PRIORITY);
        chain.set_type(ChainType::Filter);
        chain.set_policy(Policy::Accept);
        let mut rule = Rule::new(&chain);
        for e in rule_exprs(conn, extra, pass) {
            rule.add_expr(&e);
        }
        batch.add(&chain, MsgType::Add);
        batch.add(&rule, MsgType::Add);
    }
    send(
        &sock,
        &batch.finalize(),
        format!("the trace chain {name} in table inet {table}"),
    )
}

/// Deletes chains `names` (and their rules) from `inet table` in one batch (current
/// namespace). Chains already gone (e.g. the table was replaced meanwhile) are not an error.
pub fn remove(table: &str, names: &[String]) -> Result<(), TraceError> {
    let sock = open()?;
    let t = nftnl::Table::new(cstr(table), ProtoFamily::Inet);
    let mut batch = Batch::new();
    for name in names {
        batch.add(&Chain::new(cstr(name), &t), MsgType::Del);
    }
    match send(
        &sock,
        &batch.finalize(),
        format!(
            "removing the trace chain(s) {} from table inet {table}",
            names.join(", ")
        ),
    ) {
        Err(TraceError::Refused { source, .. })
            if source.raw_os_error() == Some(libc::ENOENT) && names.len() > 1 =>
        {
            // One of them is gone: remove the others one by one.
            for n in names {
                remove(table, std::slice::from_ref(n))?;
            }
            Ok(())
        }
        Err(TraceError::Refused { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
            Ok(())
        }
        r => r,
    }
}

/// Every temporary chain in our tables, as `(table, chain)` (current namespace).
pub fn list() -> Result<Vec<(String, String)>, TraceError> {
    let sock = open()?;
    let req = netlink::dump_request(
        libc::NFT_MSG_GETCHAIN as u32,
        libc::NFPROTO_INET as u16,
        1,
        |_| {},
    );
    let mut out = Vec::new();
    sock.dump(&req, |_, hdr| {
        // SAFETY: `hdr` is a complete chain message from the kernel.
        unsafe {
            let c = sys::nftnl_chain_alloc();
            if sys::nftnl_chain_nlmsg_parse(hdr, c) >= 0 {
                let table = cstring(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_TABLE as u16));
                let name = cstring(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_NAME as u16));
                if is_our_table("inet", &table) && name.starts_with(TRACE_CHAIN_PREFIX) {
                    out.push((table, name));
                }
            }
            sys::nftnl_chain_free(c);
        }
    })
    .map_err(|source| TraceError::Netlink {
        what: "listing nftables chains".into(),
        source,
    })?;
    Ok(out)
}

fn cstring(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libnftnl returns NUL-terminated strings owned by the object.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// Removes temporary chains whose run is provably gone (current namespace; see `owner`).
pub fn remove_stale() -> Result<Vec<String>, TraceError> {
    let mut removed = Vec::new();
    for (table, chain) in list()? {
        if owner::is_dead(&chain) {
            remove(&table, std::slice::from_ref(&chain))?;
            tracing::info!(table, chain, "removed a trace chain left by a killed run");
            removed.push(chain);
        }
    }
    Ok(removed)
}

/// Removes the chains when dropped (error paths, panics); [`TempChain::remove`] reports
/// errors.
pub struct TempChain {
    netns: Netns,
    pub table: &'static str,
    /// The chain at the connection's first hook.
    pub name: String,
    /// Outbound: the chain at prerouting that marks the packet's second pass over lo.
    pub looped: Option<String>,
    removed: bool,
}

impl TempChain {
    /// Adds the chains in `netns`; the guard exists as soon as the batch was sent, so even an
    /// ambiguous failure is cleaned up.
    pub fn add(
        netns: &Netns,
        table: &'static str,
        conn: &Connection,
        extra: Extra,
    ) -> Result<TempChain, TraceError> {
        let mut guard = TempChain {
            netns: netns.clone(),
            table,
            name: owner::unique_name(),
            looped: (conn.direction == Direction::Outbound).then(owner::unique_name),
            removed: false,
        };
        let (t, n, l, c) = (
            table,
            guard.name.clone(),
            guard.looped.clone(),
            conn.clone(),
        );
        if let Err(e) = netns.run(move || add(t, &n, l.as_deref(), &c, extra)) {
            // A refused batch changed nothing; after any other failure the chains may exist,
            // and dropping the guard removes them.
            guard.removed = matches!(e, TraceError::Refused { .. });
            return Err(e);
        }
        Ok(guard)
    }

    fn names(&self) -> Vec<String> {
        std::iter::once(self.name.clone())
            .chain(self.looped.clone())
            .collect()
    }

    pub fn remove(mut self) -> Result<(), TraceError> {
        self.removed = true;
        let (t, n) = (self.table, self.names());
        self.netns.run(move || remove(t, &n))
    }
}

impl Drop for TempChain {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let (t, n) = (self.table, self.names());
        if let Err(e) = self.netns.run(move || remove(t, &n)) {
            tracing::error!(chain = %self.name, table = self.table, "could not remove the trace chain: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_text_names_every_match() {
        let c = Connection::new(
            Direction::Outbound,
            Protocol::Tcp,
            "10.0.0.1:80".parse().unwrap(),
        )
        .uid(1000)
        .gid(1001);
        assert_eq!(
            rule_text(&c, Extra { sport: Some(40000) }),
            "meta nfproto ipv4 meta l4proto tcp ip daddr 10.0.0.1 tcp dport 80 tcp sport 40000 \
             tcp flags & (syn | ack) == syn meta skuid 1000 meta skgid 1001 meta nftrace set 1"
        );
    }

    #[test]
    fn our_tables_are_captures_in_hosting_order() {
        assert_eq!(
            our_tables().collect::<Vec<_>>(),
            [
                "istio-proxy-nat",
                "istio-proxy-mangle",
                "istio-proxy-raw",
                "istio-ambient-nat",
                "istio-ambient-mangle",
                "istio-ambient-raw",
            ]
        );
    }
}
