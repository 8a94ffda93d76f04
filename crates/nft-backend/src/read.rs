//! Reading our tables back from the kernel into `nft_ir` values: chains with hook and
//! priority, rules with handle, comment (from userdata) and expressions, and the sets with
//! their elements. One reader, for the read-back check and for explain.

use crate::NftError;
use crate::netlink::{self, Socket};
use nft_ir::{
    BaseHook, Chain, ChainType, Expr, Hook, Rule, Ruleset, Set, SetKey, TableFamily, Verdict,
};
use nftnl::nftnl_sys as sys;

const NFNL_SUBSYS_NFTABLES: u16 = 10;

pub fn msg_type(t: u32) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | t as u16
}

/// nft's name of a netfilter family (`NFPROTO_*`), as `nft list` prints it.
pub fn family_name(f: u32) -> &'static str {
    match f as i32 {
        libc::NFPROTO_INET => "inet",
        libc::NFPROTO_IPV4 => "ip",
        libc::NFPROTO_IPV6 => "ip6",
        libc::NFPROTO_ARP => "arp",
        libc::NFPROTO_BRIDGE => "bridge",
        libc::NFPROTO_NETDEV => "netdev",
        _ => "unknown",
    }
}

/// A string attribute libnftnl returned (empty when absent).
///
/// # Safety
/// `p` is null or a NUL-terminated string that stays valid for the call (libnftnl's getters
/// return strings owned by the object).
pub unsafe fn cstr_to_string(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: per the contract above.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// All tables in the namespace, `(family, name)`.
pub fn tables(sock: &Socket) -> Result<Vec<(String, String)>, NftError> {
    let mut out = Vec::new();
    let req = netlink::dump_request(
        libc::NFT_MSG_GETTABLE as u32,
        libc::NFPROTO_UNSPEC as u16,
        1,
        |_| {},
    );
    sock.dump(&req, |_, hdr| {
        // SAFETY: `hdr` is a complete table message from the kernel.
        unsafe {
            let t = sys::nftnl_table_alloc();
            if sys::nftnl_table_nlmsg_parse(hdr, t) >= 0 {
                let family =
                    family_name(sys::nftnl_table_get_u32(t, sys::NFTNL_TABLE_FAMILY as u16));
                let name =
                    cstr_to_string(sys::nftnl_table_get_str(t, sys::NFTNL_TABLE_NAME as u16));
                out.push((family.to_string(), name));
            }
            sys::nftnl_table_free(t);
        }
    })
    .map_err(|e| {
        if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) {
            NftError::Unsupported(e)
        } else {
            NftError::Io {
                context: "listing nftables tables",
                source: e,
            }
        }
    })?;
    Ok(out)
}

/// The elements of the named set `table`/`name` (family inet): each key's bytes and whether
/// it ends an interval, sorted. A missing set is an error (ENOENT).
pub fn set_elements(
    sock: &Socket,
    table: &str,
    name: &str,
) -> Result<Vec<(Vec<u8>, bool)>, NftError> {
    let t = std::ffi::CString::new(table).expect("no NUL");
    let n = std::ffi::CString::new(name).expect("no NUL");
    // SAFETY: the set object only names the table and set for the request; freed below.
    let req = unsafe {
        let s = sys::nftnl_set_alloc();
        sys::nftnl_set_set_str(s, sys::NFTNL_SET_TABLE as u16, t.as_ptr());
        sys::nftnl_set_set_str(s, sys::NFTNL_SET_NAME as u16, n.as_ptr());
        let req = netlink::dump_request(
            libc::NFT_MSG_GETSETELEM as u32,
            libc::NFPROTO_INET as u16,
            4,
            |hdr| sys::nftnl_set_elems_nlmsg_build_payload(hdr, s),
        );
        sys::nftnl_set_free(s);
        req
    };
    let mut out = Vec::new();
    sock.dump(&req, |_, raw| {
        // SAFETY: `raw` is a complete set-element message; objects freed below.
        unsafe {
            let s = sys::nftnl_set_alloc();
            if sys::nftnl_set_elems_nlmsg_parse(raw, s) >= 0 {
                let it = sys::nftnl_set_elems_iter_create(s);
                loop {
                    let e = sys::nftnl_set_elems_iter_next(it);
                    if e.is_null() {
                        break;
                    }
                    let mut len = 0u32;
                    let p = sys::nftnl_set_elem_get(e, sys::NFTNL_SET_ELEM_KEY as u16, &mut len);
                    let key = if p.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(p.cast::<u8>(), len as usize).to_vec()
                    };
                    // Unset flags read as NULL (get_u32 would dereference it).
                    let mut flen = 0u32;
                    let fp =
                        sys::nftnl_set_elem_get(e, sys::NFTNL_SET_ELEM_FLAGS as u16, &mut flen);
                    let flags = if fp.is_null() || flen < 4 {
                        0
                    } else {
                        fp.cast::<u32>().read_unaligned()
                    };
                    out.push((key, flags & libc::NFT_SET_ELEM_INTERVAL_END as u32 != 0));
                }
                sys::nftnl_set_elems_iter_destroy(it);
            }
            sys::nftnl_set_free(s);
        }
    })
    .map_err(|source| NftError::Io {
        context: "dumping our nftables set elements",
        source,
    })?;
    out.sort();
    Ok(out)
}

/// libnftnl's text of a rule (its expressions as `nft --debug` prints them).
///
/// # Safety
/// `r` is a valid rule object for the call.
pub unsafe fn rule_text(r: *const sys::nftnl_rule) -> String {
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: buffer and rule are valid; snprintf NUL-terminates within `len`.
    let n = unsafe {
        sys::nftnl_rule_snprintf(
            buf.as_mut_ptr().cast(),
            buf.len(),
            r,
            sys::NFTNL_OUTPUT_DEFAULT,
            0,
        )
    };
    buf.truncate(n.max(0) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> NftError {
    move |source| NftError::Io { context, source }
}

/// The chains, rules and sets of the `inet` tables `keep_table` names, the chains `keep_chain`
/// keeps, with each rule's nft text (libnftnl's debug text when the renderer does not know it).
pub fn ruleset(
    sock: &Socket,
    keep_table: impl Fn(&str) -> bool,
    keep_chain: impl Fn(&Chain) -> bool,
) -> Result<Ruleset, NftError> {
    let mut chains = chains(sock, libc::NFPROTO_INET as u16)?;
    chains.retain(|c| keep_table(&c.table) && keep_chain(c));

    let mut rules: Vec<(String, String, Rule)> = Vec::new();
    let req = netlink::dump_request(
        libc::NFT_MSG_GETRULE as u32,
        libc::NFPROTO_INET as u16,
        2,
        |_| {},
    );
    sock.dump(&req, |hdr, raw| {
        if hdr.nlmsg_type == msg_type(libc::NFT_MSG_NEWRULE as u32)
            && let Some(r) = parse_rule(raw)
            && keep_table(&r.0)
        {
            rules.push(r);
        }
    })
    .map_err(io("dumping our nftables rules"))?;

    let sets = sets(sock, &keep_table)?;
    for (table, chain, mut rule) in rules {
        if let Some(c) = chains
            .iter_mut()
            .find(|c| c.table == table && c.name == chain)
        {
            rule.position = c.rules.len() + 1;
            if let Some(t) = nft_ir::render::rule_text(&rule, &sets, &table) {
                rule.text = t;
            }
            c.rules.push(rule);
        }
    }
    Ok(Ruleset {
        backend: nft_ir::Backend::Nft,
        chains,
        sets,
    })
}

/// Every chain of `family` (an `NFPROTO_*`; `NFPROTO_UNSPEC` for all), without its rules.
/// Chains of the families no rule of ours lives in (arp, bridge, netdev) are left out.
pub fn chains(sock: &Socket, family: u16) -> Result<Vec<Chain>, NftError> {
    let mut chains = Vec::new();
    let req = netlink::dump_request(libc::NFT_MSG_GETCHAIN as u32, family, 1, |_| {});
    sock.dump(&req, |hdr, raw| {
        if hdr.nlmsg_type == msg_type(libc::NFT_MSG_NEWCHAIN as u32)
            && let Some(c) = parse_chain(raw)
        {
            chains.push(c);
        }
    })
    .map_err(io("dumping the nftables chains"))?;
    Ok(chains)
}

fn parse_chain(raw: *const libc::nlmsghdr) -> Option<Chain> {
    // SAFETY: `raw` is a complete chain message; the chain object is freed below.
    unsafe {
        let c = sys::nftnl_chain_alloc();
        let parsed = sys::nftnl_chain_nlmsg_parse(raw, c) >= 0;
        let family = match sys::nftnl_chain_get_u32(c, sys::NFTNL_CHAIN_FAMILY as u16) as i32 {
            _ if !parsed => None,
            libc::NFPROTO_INET => Some(TableFamily::Inet),
            libc::NFPROTO_IPV4 => Some(TableFamily::Ip),
            libc::NFPROTO_IPV6 => Some(TableFamily::Ip6),
            _ => None,
        };
        let out = family.map(|family| {
            let table = cstr_to_string(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_TABLE as u16));
            let name = cstr_to_string(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_NAME as u16));
            let base =
                sys::nftnl_chain_is_set(c, sys::NFTNL_CHAIN_HOOKNUM as u16).then(|| BaseHook {
                    // The kernel has no chain types besides these three.
                    kind: ChainType::from_name(&cstr_to_string(sys::nftnl_chain_get_str(
                        c,
                        sys::NFTNL_CHAIN_TYPE as u16,
                    )))
                    .unwrap_or(ChainType::Filter),
                    hook: match sys::nftnl_chain_get_u32(c, sys::NFTNL_CHAIN_HOOKNUM as u16) as i32
                    {
                        libc::NF_INET_PRE_ROUTING => Hook::Prerouting,
                        libc::NF_INET_LOCAL_OUT => Hook::Output,
                        libc::NF_INET_POST_ROUTING => Hook::Postrouting,
                        _ => Hook::Other,
                    },
                    priority: sys::nftnl_chain_get_s32(c, sys::NFTNL_CHAIN_PRIO as u16),
                });
            Chain {
                family,
                table,
                name,
                base,
                rules: Vec::new(),
            }
        });
        sys::nftnl_chain_free(c);
        out
    }
}

fn parse_rule(raw: *const libc::nlmsghdr) -> Option<(String, String, Rule)> {
    // SAFETY: `raw` is a complete rule message; the rule and iterator are freed below.
    unsafe {
        let r = sys::nftnl_rule_alloc();
        if sys::nftnl_rule_nlmsg_parse(raw, r) < 0 {
            sys::nftnl_rule_free(r);
            return None;
        }
        let table = cstr_to_string(sys::nftnl_rule_get_str(r, sys::NFTNL_RULE_TABLE as u16));
        let chain = cstr_to_string(sys::nftnl_rule_get_str(r, sys::NFTNL_RULE_CHAIN as u16));
        let handle = sys::nftnl_rule_get_u64(r, sys::NFTNL_RULE_HANDLE as u16);
        let comment = if sys::nftnl_rule_is_set(r, sys::NFTNL_RULE_USERDATA as u16) {
            let mut len = 0u32;
            let p = sys::nftnl_rule_get_data(r, sys::NFTNL_RULE_USERDATA as u16, &mut len);
            comment_of(std::slice::from_raw_parts(p.cast::<u8>(), len as usize), 0)
        } else {
            None
        };
        let mut exprs = Vec::new();
        let it = sys::nftnl_expr_iter_create(r);
        loop {
            let e = sys::nftnl_expr_iter_next(it);
            if e.is_null() {
                break;
            }
            exprs.push(parse_expr(e));
        }
        sys::nftnl_expr_iter_destroy(it);
        let debug = rule_text(r)
            .lines()
            .skip(1)
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("userdata"))
            .collect::<Vec<_>>()
            .join(" ");
        sys::nftnl_rule_free(r);
        Some((
            table,
            chain,
            Rule {
                handle: Some(handle),
                position: 0,
                comment,
                text: debug,
                exprs,
            },
        ))
    }
}

/// The comment TLV of an object's userdata: type `kind` (`NFTNL_UDATA_RULE_COMMENT` = 0 for a
/// rule, `NFTNL_UDATA_SET_COMMENT` for a set).
fn comment_of(mut ud: &[u8], kind: u8) -> Option<String> {
    while ud.len() >= 2 {
        let (ty, len) = (ud[0], ud[1] as usize);
        let v = ud.get(2..2 + len)?;
        if ty == kind {
            let v = v.split(|b| *b == 0).next().unwrap_or(v);
            return Some(String::from_utf8_lossy(v).into_owned());
        }
        ud = &ud[2 + len..];
    }
    None
}

unsafe fn data(e: *mut sys::nftnl_expr, attr: u32) -> Vec<u8> {
    let mut len = 0u32;
    // SAFETY: (caller) `e` is a parsed expression; the returned pointer is valid for `len`.
    unsafe {
        let p = sys::nftnl_expr_get(e, attr as u16, &mut len);
        if p.is_null() {
            return Vec::new();
        }
        std::slice::from_raw_parts(p.cast::<u8>(), len as usize).to_vec()
    }
}

unsafe fn parse_expr(e: *mut sys::nftnl_expr) -> Expr {
    // SAFETY: `e` is a parsed expression owned by its rule.
    unsafe {
        let is = |a: u32| sys::nftnl_expr_is_set(e, a as u16);
        let u = |a: u32| sys::nftnl_expr_get_u32(e, a as u16);
        let name = cstr_to_string(sys::nftnl_expr_get_str(e, sys::NFTNL_EXPR_NAME as u16));
        match name.as_str() {
            "meta" if is(sys::NFTNL_EXPR_META_DREG) => Expr::Meta {
                key: u(sys::NFTNL_EXPR_META_KEY),
                dreg: u(sys::NFTNL_EXPR_META_DREG),
            },
            "meta" => Expr::MetaSet {
                key: u(sys::NFTNL_EXPR_META_KEY),
                sreg: u(sys::NFTNL_EXPR_META_SREG),
            },
            "ct" if is(sys::NFTNL_EXPR_CT_DREG) => Expr::Ct {
                key: u(sys::NFTNL_EXPR_CT_KEY),
                dreg: u(sys::NFTNL_EXPR_CT_DREG),
            },
            "ct" => Expr::CtSet {
                key: u(sys::NFTNL_EXPR_CT_KEY),
                sreg: u(sys::NFTNL_EXPR_CT_SREG),
            },
            "payload" if is(sys::NFTNL_EXPR_PAYLOAD_DREG) => Expr::Payload {
                base: u(sys::NFTNL_EXPR_PAYLOAD_BASE),
                offset: u(sys::NFTNL_EXPR_PAYLOAD_OFFSET),
                len: u(sys::NFTNL_EXPR_PAYLOAD_LEN),
                dreg: u(sys::NFTNL_EXPR_PAYLOAD_DREG),
            },
            "cmp" => Expr::Cmp {
                sreg: u(sys::NFTNL_EXPR_CMP_SREG),
                op: u(sys::NFTNL_EXPR_CMP_OP),
                data: data(e, sys::NFTNL_EXPR_CMP_DATA),
            },
            "bitwise" if !is(sys::NFTNL_EXPR_BITWISE_OP) || u(sys::NFTNL_EXPR_BITWISE_OP) == 0 => {
                Expr::Bitwise {
                    sreg: u(sys::NFTNL_EXPR_BITWISE_SREG),
                    dreg: u(sys::NFTNL_EXPR_BITWISE_DREG),
                    mask: data(e, sys::NFTNL_EXPR_BITWISE_MASK),
                    xor: data(e, sys::NFTNL_EXPR_BITWISE_XOR),
                }
            }
            "lookup" if !is(sys::NFTNL_EXPR_LOOKUP_DREG) => Expr::Lookup {
                sreg: u(sys::NFTNL_EXPR_LOOKUP_SREG),
                set: cstr_to_string(sys::nftnl_expr_get_str(
                    e,
                    sys::NFTNL_EXPR_LOOKUP_SET as u16,
                )),
                invert: is(sys::NFTNL_EXPR_LOOKUP_FLAGS)
                    && u(sys::NFTNL_EXPR_LOOKUP_FLAGS) & crate::expr::NFT_LOOKUP_F_INV != 0,
            },
            "immediate" if u(sys::NFTNL_EXPR_IMM_DREG) == crate::expr::REG_VERDICT => {
                let chain =
                    || cstr_to_string(sys::nftnl_expr_get_str(e, sys::NFTNL_EXPR_IMM_CHAIN as u16));
                match u(sys::NFTNL_EXPR_IMM_VERDICT) as i32 {
                    libc::NF_ACCEPT => Expr::Verdict(Verdict::Accept),
                    libc::NF_DROP => Expr::Verdict(Verdict::Drop),
                    libc::NFT_RETURN => Expr::Verdict(Verdict::Return),
                    libc::NFT_CONTINUE => Expr::Verdict(Verdict::Continue),
                    libc::NFT_JUMP => Expr::Verdict(Verdict::Jump(chain())),
                    libc::NFT_GOTO => Expr::Verdict(Verdict::Goto(chain())),
                    v => Expr::Unknown(format!("immediate verdict {v}")),
                }
            }
            "immediate" => Expr::Immediate {
                dreg: u(sys::NFTNL_EXPR_IMM_DREG),
                data: data(e, sys::NFTNL_EXPR_IMM_DATA),
            },
            "counter" => Expr::Counter,
            "redir" => Expr::Redir {
                port_reg: is(sys::NFTNL_EXPR_REDIR_REG_PROTO_MIN)
                    .then(|| u(sys::NFTNL_EXPR_REDIR_REG_PROTO_MIN)),
            },
            "tproxy" if !is(sys::NFTNL_EXPR_TPROXY_REG_ADDR) => Expr::Tproxy {
                family: if is(sys::NFTNL_EXPR_TPROXY_FAMILY) {
                    u(sys::NFTNL_EXPR_TPROXY_FAMILY)
                } else {
                    0
                },
                port_reg: is(sys::NFTNL_EXPR_TPROXY_REG_PORT)
                    .then(|| u(sys::NFTNL_EXPR_TPROXY_REG_PORT)),
                miss_drops: false,
            },
            "nat" => {
                let reg = |a: u32| is(a).then(|| u(a));
                Expr::Nat {
                    snat: u(sys::NFTNL_EXPR_NAT_TYPE) == libc::NFT_NAT_SNAT as u32,
                    family: u(sys::NFTNL_EXPR_NAT_FAMILY),
                    addr_reg: reg(sys::NFTNL_EXPR_NAT_REG_ADDR_MIN),
                    port_reg: reg(sys::NFTNL_EXPR_NAT_REG_PROTO_MIN),
                }
            }
            other => Expr::Unknown(other.to_string()),
        }
    }
}

/// Every set of our tables with its elements.
fn sets(sock: &Socket, ours: &impl Fn(&str) -> bool) -> Result<Vec<Set>, NftError> {
    let mut found: Vec<Set> = Vec::new();
    let req = netlink::dump_request(
        libc::NFT_MSG_GETSET as u32,
        libc::NFPROTO_INET as u16,
        3,
        |_| {},
    );
    sock.dump(&req, |hdr, raw| {
        if hdr.nlmsg_type != msg_type(libc::NFT_MSG_NEWSET as u32) {
            return;
        }
        // SAFETY: `raw` is a complete set message; freed below.
        unsafe {
            let s = sys::nftnl_set_alloc();
            if sys::nftnl_set_nlmsg_parse(raw, s) >= 0 {
                let table = cstr_to_string(sys::nftnl_set_get_str(s, sys::NFTNL_SET_TABLE as u16));
                let name = cstr_to_string(sys::nftnl_set_get_str(s, sys::NFTNL_SET_NAME as u16));
                if ours(&table) {
                    found.push(set_declaration(s, table, name));
                }
            }
            sys::nftnl_set_free(s);
        }
    })
    .map_err(io("dumping our nftables sets"))?;
    found
        .into_iter()
        .map(|s| {
            let elements = set_elements(sock, &s.table, &s.name)?;
            Ok(Set { elements, ..s })
        })
        .collect()
}

/// A parsed set's declaration (key type, interval flag, comment), without its elements.
///
/// # Safety
/// `s` is a parsed set.
unsafe fn set_declaration(s: *mut sys::nftnl_set, table: String, name: String) -> Set {
    // SAFETY: (caller) `s` is parsed; the userdata pointer is valid for `len`.
    unsafe {
        let u32_of = |attr: u32| {
            sys::nftnl_set_is_set(s, attr as u16).then(|| sys::nftnl_set_get_u32(s, attr as u16))
        };
        let flags = u32_of(sys::NFTNL_SET_FLAGS).unwrap_or(0);
        let comment = if sys::nftnl_set_is_set(s, sys::NFTNL_SET_USERDATA as u16) {
            let mut len = 0u32;
            let p = sys::nftnl_set_get_data(s, sys::NFTNL_SET_USERDATA as u16, &mut len);
            let ud = std::slice::from_raw_parts(p.cast::<u8>(), len as usize);
            comment_of(ud, sys::NFTNL_UDATA_SET_COMMENT as u8)
        } else {
            None
        };
        Set {
            table,
            name,
            key: SetKey::from_id(u32_of(sys::NFTNL_SET_KEY_TYPE).unwrap_or(0)),
            interval: flags & libc::NFT_SET_INTERVAL as u32 != 0,
            comment,
            elements: Vec::new(),
        }
    }
}
