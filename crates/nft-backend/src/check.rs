//! Read-back: what is in the kernel, compared with what the plan would create, as `nft_ir`
//! values. The plan's side is its lowering (`model`, what the batch serialises); the kernel's
//! is a dump read into the same IR (`read`). Chains compare by their base (type, hook,
//! priority), rules by their expressions and comment, an anonymous set by its elements (the
//! kernel picks its name); handles, positions and counters' values are not compared. Reports
//! show each rule in nft syntax (`nft_ir::render`).

use crate::NftError;
use crate::model;
use crate::netlink::{self, Socket};
use capture::Plan;
use nft_ir::{Expr, Rule, Set, TableFamily};
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

/// A rule as compared: its comment and expressions, each lookup in an anonymous set by the
/// set's elements.
#[derive(Debug, PartialEq, Eq)]
struct Value {
    comment: Option<String>,
    exprs: Vec<Expr>,
}

fn value(rule: &Rule, sets: &[Set], table: &str) -> Value {
    let exprs = rule
        .exprs
        .iter()
        .map(|e| match e {
            Expr::Lookup { sreg, set, invert } if nft_ir::anonymous_id(set).is_some() => {
                let found = sets.iter().find(|s| s.table == table && &s.name == set);
                Expr::Lookup {
                    sreg: *sreg,
                    set: found.map_or_else(|| format!("{set} (missing)"), contents),
                    invert: *invert,
                }
            }
            other => other.clone(),
        })
        .collect();
    Value {
        comment: rule.comment.clone(),
        exprs,
    }
}

/// An anonymous set's elements, in order: an interval set as its ranges `[start, next)`.
fn contents(s: &Set) -> String {
    let mut els = s.elements.clone();
    els.sort();
    let hex = |k: &[u8]| k.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let items: Vec<String> = els
        .iter()
        .enumerate()
        .filter(|(_, (_, end))| !(s.interval && *end))
        .map(|(i, (k, _))| match els.get(i + 1) {
            Some((next, _)) if s.interval => format!("{}-{}", hex(k), hex(next)),
            _ => hex(k),
        })
        .collect();
    format!("{{{}}}", items.join(","))
}

fn header(base: Option<(&str, &str, i32)>) -> String {
    match base {
        Some((kind, hook, priority)) => format!("type {kind} hook {hook} priority {priority}"),
        None => "regular".into(),
    }
}

/// Readable differences between the plan and the live tables.
pub fn diff(sock: &Socket, plan: &Plan) -> Result<Vec<String>, NftError> {
    let ours: Vec<&str> = plan.owned_tables().iter().map(|t| t.nft_name()).collect();
    let (have, types) = crate::read::read(sock, |t| ours.contains(&t), |_| true)?;
    let mut out = Vec::new();
    let mut wanted = Vec::new();
    for t in model::tables(plan) {
        let table = t.table.nft_name();
        for c in &t.chains {
            let chain = c.chain.nft_name();
            wanted.push((table, chain));
            let Some(h) = have.chain(TableFamily::Inet, table, chain) else {
                out.push(format!("missing chain {chain} in table inet {table}"));
                continue;
            };
            let want_header = header(c.base.map(|b| (b.kind, b.hook, b.priority)));
            let kind = types.get(&(table.to_string(), chain.to_string()));
            let have_header = header(
                h.base
                    .zip(kind)
                    .map(|(b, k)| (k.as_str(), b.hook.name(), b.priority)),
            );
            if have_header != want_header {
                out.push(format!(
                    "chain {chain} in table inet {table}: expected {want_header}, found {have_header}"
                ));
            }
            let w: Vec<(Value, String)> = c
                .rules
                .iter()
                .map(|r| (value(&r.rule, &r.sets, table), r.text(table)))
                .collect();
            let h: Vec<(Value, String)> = h
                .rules
                .iter()
                .map(|r| (value(r, &have.sets, table), r.text.clone()))
                .collect();
            out.extend(rule_differences(
                &w,
                &h,
                &format!("chain {chain} in table inet {table}"),
            ));
        }
    }
    for c in &have.chains {
        if !wanted.contains(&(c.table.as_str(), c.name.as_str())) {
            out.push(format!(
                "unexpected chain {} in table inet {}",
                c.name, c.table
            ));
        }
    }
    Ok(out)
}

/// Missing and unexpected rules of one chain (each with its nft text), or that the same rules
/// are in another order.
fn rule_differences(want: &[(Value, String)], have: &[(Value, String)], at: &str) -> Vec<String> {
    let same = want.len() == have.len() && want.iter().zip(have).all(|(w, h)| w.0 == h.0);
    if same {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (v, text) in want {
        if !have.iter().any(|(h, _)| h == v) {
            out.push(format!("{at}: missing rule: {text}"));
        }
    }
    for (v, text) in have {
        if !want.iter().any(|(w, _)| w == v) {
            out.push(format!("{at}: unexpected rule: {text}"));
        }
    }
    if out.is_empty() {
        out.push(format!(
            "{at}: rules are duplicated or in a different order"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(set: &str) -> Rule {
        Rule {
            handle: None,
            position: 1,
            comment: Some("c".into()),
            text: String::new(),
            exprs: vec![Expr::Lookup {
                sreg: 1,
                set: set.into(),
                invert: true,
            }],
        }
    }

    fn set(name: &str, elements: Vec<(Vec<u8>, bool)>) -> Set {
        Set {
            table: "t".into(),
            name: name.into(),
            interval: true,
            elements,
        }
    }

    /// The kernel names anonymous sets itself and lists elements in its own order: a lookup
    /// compares by the set's elements.
    #[test]
    fn anonymous_sets_compare_by_their_elements() {
        let range = vec![
            (vec![0, 0, 0, 0], true),
            (vec![10, 0, 0, 0], false),
            (vec![11, 0, 0, 0], true),
        ];
        let mut reversed = range.clone();
        reversed.reverse();
        let ours = [set("__set7", range)];
        let kernels = [set("__set0", reversed)];
        assert_eq!(
            value(&rule("__set7"), &ours, "t"),
            value(&rule("__set0"), &kernels, "t")
        );
        let other = [set(
            "__set0",
            vec![(vec![10, 0, 0, 0], false), (vec![12, 0, 0, 0], true)],
        )];
        assert_ne!(
            value(&rule("__set7"), &ours, "t"),
            value(&rule("__set0"), &other, "t")
        );
        // A named set compares by its name.
        assert_ne!(value(&rule("a"), &[], "t"), value(&rule("b"), &[], "t"));
    }
}
