//! Read-back: what is in the kernel, compared with what the plan would create.
//!
//! Both sides go through the same path: netlink messages parsed by libnftnl and printed in its
//! debug format (`[ meta load l4proto => reg 1 ] [ cmp eq reg 1 0x00000006 ] ...`), the same
//! text `nft --debug=netlink` shows. Expected messages come from building the batch for the
//! plan (never sent); actual ones from a dump. Handles, counters and kernel-chosen set names
//! are normalised away.

use crate::NftError;
use crate::batch;
use crate::model;
use crate::netlink::{self, Socket};
use capture::{Plan, Table};
use nftnl::nftnl_sys as sys;
use std::collections::BTreeMap;

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

/// One chain as printed: its header line and its rules.
#[derive(Default, Debug, PartialEq, Eq)]
struct Listed {
    header: String,
    rules: Vec<String>,
}

type Listing = BTreeMap<(String, String), Listed>;

/// Normalises libnftnl's text for comparison.
fn normalise(text: &str) -> String {
    let mut lines = text.lines();
    let head: Vec<&str> = lines
        .next()
        .unwrap_or("")
        .split_whitespace()
        .take(3)
        .collect();
    let mut out = head.join(" ");
    for l in lines {
        let l = l.trim();
        if l.is_empty() || l.starts_with("userdata") {
            continue;
        }
        let l = if l.starts_with("[ counter") {
            "[ counter ]".to_string()
        } else {
            l.to_string()
        };
        let mut l = nat_defaults(&strip_set_suffix(&l));
        // The kernel reports a lookup's flags even when zero; libnftnl omits them when unset.
        if l.starts_with("[ lookup") && l.ends_with(" 0x0 ]") {
            l = format!("{} ]", &l[..l.len() - 6]);
        }
        out.push('\n');
        out.push_str(&l);
    }
    out
}

/// A nat expression as the kernel reports what it filled in itself: `addr_max` defaults to
/// `addr_min`'s register and `flags` gains `NF_NAT_RANGE_MAP_IPS` (0x1) when an address is
/// given. Both dropped, so a rule written with `addr_min` only compares equal.
fn nat_defaults(l: &str) -> String {
    if !l.starts_with("[ nat ") {
        return l.to_string();
    }
    let words: Vec<&str> = l.split(' ').collect();
    let reg_after = |key: &str| {
        let i = words.iter().position(|w| *w == key)?;
        Some(words.get(i + 2)?.to_string())
    };
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        if w == "addr_max" && reg_after("addr_max") == reg_after("addr_min") {
            i += 3;
            continue;
        }
        if w == "flags"
            && let Some(v) = words.get(i + 1).and_then(|v| v.strip_prefix("0x"))
            && let Ok(flags) = u32::from_str_radix(v, 16)
        {
            if flags & !1 != 0 {
                out.push(format!("flags 0x{:x}", flags & !1));
            }
            i += 2;
            continue;
        }
        out.push(w.to_string());
        i += 1;
    }
    out.join(" ")
}

/// `__set0`, `__set12`, `__set%d` → `__set`: anonymous set names are chosen by the kernel.
fn strip_set_suffix(l: &str) -> String {
    let mut s = String::with_capacity(l.len());
    let mut rest = l;
    while let Some(i) = rest.find("__set") {
        s.push_str(&rest[..i + 5]);
        rest =
            rest[i + 5..].trim_start_matches(|c: char| c.is_ascii_digit() || c == '%' || c == 'd');
    }
    s.push_str(rest);
    s
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

fn chain_header(c: *const sys::nftnl_chain) -> (String, String, String) {
    // SAFETY: `c` is a parsed chain.
    unsafe {
        let table = cstr_to_string(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_TABLE as u16));
        let name = cstr_to_string(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_NAME as u16));
        let header = if sys::nftnl_chain_is_set(c, sys::NFTNL_CHAIN_HOOKNUM as u16) {
            format!(
                "type {} hook {} priority {}",
                cstr_to_string(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_TYPE as u16)),
                match sys::nftnl_chain_get_u32(c, sys::NFTNL_CHAIN_HOOKNUM as u16) as i32 {
                    libc::NF_INET_PRE_ROUTING => "prerouting",
                    libc::NF_INET_LOCAL_OUT => "output",
                    _ => "other",
                },
                sys::nftnl_chain_get_s32(c, sys::NFTNL_CHAIN_PRIO as u16)
            )
        } else {
            "regular".into()
        };
        (table, name, header)
    }
}

/// Adds a chain or rule message to the listing.
fn collect(listing: &mut Listing, hdr: &libc::nlmsghdr, raw: *const libc::nlmsghdr, only: &[&str]) {
    // SAFETY: `raw` points to a complete message of the given type.
    unsafe {
        if hdr.nlmsg_type == msg_type(libc::NFT_MSG_NEWCHAIN as u32) {
            let c = sys::nftnl_chain_alloc();
            if sys::nftnl_chain_nlmsg_parse(raw, c) >= 0 {
                let (table, name, header) = chain_header(c);
                if only.contains(&table.as_str()) {
                    listing.entry((table, name)).or_default().header = header;
                }
            }
            sys::nftnl_chain_free(c);
        } else if hdr.nlmsg_type == msg_type(libc::NFT_MSG_NEWRULE as u32) {
            let r = sys::nftnl_rule_alloc();
            if sys::nftnl_rule_nlmsg_parse(raw, r) >= 0 {
                let table =
                    cstr_to_string(sys::nftnl_rule_get_str(r, sys::NFTNL_RULE_TABLE as u16));
                let chain =
                    cstr_to_string(sys::nftnl_rule_get_str(r, sys::NFTNL_RULE_CHAIN as u16));
                if only.contains(&table.as_str()) {
                    listing
                        .entry((table, chain))
                        .or_default()
                        .rules
                        .push(normalise(&rule_text(r)));
                }
            }
            sys::nftnl_rule_free(r);
        }
    }
}

fn live(sock: &Socket, tables: &[Table]) -> Result<Listing, NftError> {
    let ours: Vec<&str> = tables.iter().map(|t| t.nft_name()).collect();
    let mut listing = Listing::new();
    for t in [libc::NFT_MSG_GETCHAIN, libc::NFT_MSG_GETRULE] {
        let req = netlink::dump_request(t as u32, libc::NFPROTO_INET as u16, 2, |_| {});
        sock.dump(&req, |hdr, raw| collect(&mut listing, hdr, raw, &ours))
            .map_err(|source| NftError::Io {
                context: "dumping our nftables chains and rules",
                source,
            })?;
    }
    Ok(listing)
}

fn expected(plan: &Plan) -> (Listing, BTreeMap<String, String>) {
    let ours: Vec<&str> = plan.owned_tables().iter().map(|t| t.nft_name()).collect();
    let built = batch::build(plan, &[]);
    let mut listing = Listing::new();
    for page in built.batch.iter() {
        for_each_message(page, |hdr, raw| collect(&mut listing, hdr, raw, &ours));
    }
    // Map each expected rule's normalised form to its nft text for readable reports.
    let mut names = BTreeMap::new();
    let specs = model::tables(plan);
    for t in &specs {
        for c in &t.chains {
            let key = (
                t.table.nft_name().to_string(),
                c.chain.nft_name().to_string(),
            );
            if let Some(l) = listing.get(&key) {
                for (norm, spec) in l.rules.iter().zip(&c.rules) {
                    names.insert(norm.clone(), spec.text(t.table.nft_name()));
                }
            }
        }
    }
    (listing, names)
}

fn for_each_message(page: &[u8], mut f: impl FnMut(&libc::nlmsghdr, *const libc::nlmsghdr)) {
    let hl = std::mem::size_of::<libc::nlmsghdr>();
    let mut off = 0;
    while off + hl <= page.len() {
        // SAFETY: batch pages hold consecutive, aligned netlink messages.
        let hdr = unsafe { &*(page.as_ptr().add(off).cast::<libc::nlmsghdr>()) };
        let len = hdr.nlmsg_len as usize;
        if len < hl || off + len > page.len() {
            break;
        }
        f(hdr, hdr as *const _);
        off += (len + 3) & !3;
    }
}

/// Readable differences between the plan and the live tables.
pub fn diff(sock: &Socket, plan: &Plan) -> Result<Vec<String>, NftError> {
    let (want, names) = expected(plan);
    let have = live(sock, plan.owned_tables())?;
    let mut out = Vec::new();
    let show = |norm: &str| {
        names
            .get(norm)
            .cloned()
            .unwrap_or_else(|| norm.replace('\n', " "))
    };
    for (key, w) in &want {
        let (table, chain) = key;
        let Some(h) = have.get(key) else {
            out.push(format!("missing chain {chain} in table inet {table}"));
            continue;
        };
        if h.header != w.header {
            out.push(format!(
                "chain {chain} in table inet {table}: expected {}, found {}",
                w.header, h.header
            ));
        }
        if h.rules != w.rules {
            let missing: Vec<&String> = w.rules.iter().filter(|r| !h.rules.contains(r)).collect();
            let unexpected: Vec<&String> =
                h.rules.iter().filter(|r| !w.rules.contains(r)).collect();
            for r in &missing {
                out.push(format!(
                    "chain {chain} in table inet {table}: missing rule: {}",
                    show(r)
                ));
            }
            for r in &unexpected {
                out.push(format!(
                    "chain {chain} in table inet {table}: unexpected rule: {}",
                    show(r)
                ));
            }
            if missing.is_empty() && unexpected.is_empty() {
                out.push(format!("chain {chain} in table inet {table}: rules are duplicated or in a different order"));
            }
        }
    }
    for (table, chain) in have.keys().filter(|k| !want.contains_key(*k)) {
        out.push(format!("unexpected chain {chain} in table inet {table}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_defaults_the_kernel_fills_in_compare_equal() {
        let kernel = "[ nat snat ip addr_min reg 1 addr_max reg 1 flags 0x1 ]";
        let written = "[ nat snat ip addr_min reg 1 ]";
        assert_eq!(nat_defaults(kernel), nat_defaults(written));
        assert_eq!(nat_defaults(written), written);
        // A real range and other flags stay.
        let range = "[ nat snat ip addr_min reg 1 addr_max reg 2 flags 0x5 ]";
        assert_eq!(
            nat_defaults(range),
            "[ nat snat ip addr_min reg 1 addr_max reg 2 flags 0x4 ]"
        );
    }
}
