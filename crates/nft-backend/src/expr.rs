//! nftables expressions built directly on libnftnl.
//!
//! nftnl-rs covers only part of what the plan needs (no `redir`, `tproxy`, `ct zone set`,
//! inverted lookups). Rather than mixing its typed wrappers with hand-made ones, every
//! expression here is an `Expr`: an expression name plus its attributes, which is exactly what
//! libnftnl and the kernel see. The bytecode mirrors what `nft` emits for the same rule
//! (checked against `nft --debug=netlink` output in ../shared/golden/nftables/netlink-bytecode).

use nftnl::Rule;
use nftnl::expr::Expression;
use nftnl::nftnl_sys as sys;
use std::ffi::CString;
use std::ptr::NonNull;

/// Register 1 (data) and the verdict register, as nft uses them.
pub const REG1: u32 = libc::NFT_REG_1 as u32;
pub const REG_VERDICT: u32 = libc::NFT_REG_VERDICT as u32;

/// `NF_NAT_RANGE_PROTO_SPECIFIED`: the redirect carries a port (not in the libc crate).
pub const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;
/// `NFT_LOOKUP_F_INV`: the lookup matches when the key is NOT in the set.
pub const NFT_LOOKUP_F_INV: u32 = 0x1;

enum Attr {
    U32(u16, u32),
    Data(u16, Vec<u8>),
    Str(u16, CString),
}

/// One expression: `name` (e.g. "meta", "cmp", "redir") and its attributes.
pub struct Expr {
    name: &'static std::ffi::CStr,
    attrs: Vec<Attr>,
}

impl Expr {
    fn new(name: &'static std::ffi::CStr) -> Self {
        Self {
            name,
            attrs: Vec::new(),
        }
    }
    fn u32(mut self, attr: u32, v: u32) -> Self {
        self.attrs.push(Attr::U32(attr as u16, v));
        self
    }
    fn data(mut self, attr: u32, v: &[u8]) -> Self {
        self.attrs.push(Attr::Data(attr as u16, v.to_vec()));
        self
    }
    fn str(mut self, attr: u32, v: &str) -> Self {
        self.attrs.push(Attr::Str(
            attr as u16,
            CString::new(v).expect("names have no NUL"),
        ));
        self
    }
}

impl Expression for Expr {
    fn to_expr(&self, _rule: &Rule) -> NonNull<sys::nftnl_expr> {
        // SAFETY: libnftnl copies every attribute value; the expression is owned by the rule
        // it is added to (Rule::add_expr), which frees it.
        unsafe {
            let e = NonNull::new(sys::nftnl_expr_alloc(self.name.as_ptr()))
                .unwrap_or_else(|| std::process::abort());
            for a in &self.attrs {
                match a {
                    Attr::U32(k, v) => sys::nftnl_expr_set_u32(e.as_ptr(), *k, *v),
                    Attr::Data(k, v) => {
                        sys::nftnl_expr_set(e.as_ptr(), *k, v.as_ptr().cast(), v.len() as u32);
                    }
                    Attr::Str(k, v) => {
                        sys::nftnl_expr_set_str(e.as_ptr(), *k, v.as_ptr());
                    }
                }
            }
            e
        }
    }
}

/// `meta load KEY => reg 1`.
pub fn meta_load(key: u32) -> Expr {
    Expr::new(c"meta")
        .u32(sys::NFTNL_EXPR_META_KEY, key)
        .u32(sys::NFTNL_EXPR_META_DREG, REG1)
}

/// `meta set KEY with reg 1`.
pub fn meta_set(key: u32) -> Expr {
    Expr::new(c"meta")
        .u32(sys::NFTNL_EXPR_META_KEY, key)
        .u32(sys::NFTNL_EXPR_META_SREG, REG1)
}

/// `ct load KEY => reg 1`.
pub fn ct_load(key: u32) -> Expr {
    Expr::new(c"ct")
        .u32(sys::NFTNL_EXPR_CT_KEY, key)
        .u32(sys::NFTNL_EXPR_CT_DREG, REG1)
}

/// `ct load KEY => reg 1` of the `original` (`dir` 0) or `reply` (1) direction's tuple, for
/// the keys that need one (addresses, ports).
pub fn ct_load_dir(key: u32, dir: u8) -> Expr {
    Expr::new(c"ct")
        .u32(sys::NFTNL_EXPR_CT_KEY, key)
        .data(sys::NFTNL_EXPR_CT_DIR, &[dir])
        .u32(sys::NFTNL_EXPR_CT_DREG, REG1)
}

/// `ct set KEY with reg 1`.
pub fn ct_set(key: u32) -> Expr {
    Expr::new(c"ct")
        .u32(sys::NFTNL_EXPR_CT_KEY, key)
        .u32(sys::NFTNL_EXPR_CT_SREG, REG1)
}

/// `cmp OP reg 1 DATA` (`op` is `NFT_CMP_EQ`/`NFT_CMP_NEQ`).
pub fn cmp(op: u32, data: &[u8]) -> Expr {
    Expr::new(c"cmp")
        .u32(sys::NFTNL_EXPR_CMP_SREG, REG1)
        .u32(sys::NFTNL_EXPR_CMP_OP, op)
        .data(sys::NFTNL_EXPR_CMP_DATA, data)
}

/// `payload load LEN @ BASE + OFFSET => reg 1`.
pub fn payload(base: u32, offset: u32, len: u32) -> Expr {
    Expr::new(c"payload")
        .u32(sys::NFTNL_EXPR_PAYLOAD_DREG, REG1)
        .u32(sys::NFTNL_EXPR_PAYLOAD_BASE, base)
        .u32(sys::NFTNL_EXPR_PAYLOAD_OFFSET, offset)
        .u32(sys::NFTNL_EXPR_PAYLOAD_LEN, len)
}

/// `bitwise reg 1 = (reg 1 & MASK) ^ 0`.
pub fn bitwise_and(mask: &[u8]) -> Expr {
    Expr::new(c"bitwise")
        .u32(sys::NFTNL_EXPR_BITWISE_SREG, REG1)
        .u32(sys::NFTNL_EXPR_BITWISE_DREG, REG1)
        .u32(sys::NFTNL_EXPR_BITWISE_LEN, mask.len() as u32)
        .data(sys::NFTNL_EXPR_BITWISE_MASK, mask)
        .data(sys::NFTNL_EXPR_BITWISE_XOR, &vec![0u8; mask.len()])
}

/// `bitwise reg 1 = (reg 1 & MASK) ^ XOR` (`ct mark & M | V` when V lies outside M).
pub fn bitwise_and_xor(mask: &[u8], xor: &[u8]) -> Expr {
    Expr::new(c"bitwise")
        .u32(sys::NFTNL_EXPR_BITWISE_SREG, REG1)
        .u32(sys::NFTNL_EXPR_BITWISE_DREG, REG1)
        .u32(sys::NFTNL_EXPR_BITWISE_LEN, mask.len() as u32)
        .data(sys::NFTNL_EXPR_BITWISE_MASK, mask)
        .data(sys::NFTNL_EXPR_BITWISE_XOR, xor)
}

/// `lookup reg 1 set NAME`: membership in a named set of the table (existing, or created
/// earlier in the same batch; the kernel finds it by name either way).
pub fn lookup_named(set_name: &str) -> Expr {
    Expr::new(c"lookup")
        .u32(sys::NFTNL_EXPR_LOOKUP_SREG, REG1)
        .str(sys::NFTNL_EXPR_LOOKUP_SET, set_name)
}

/// `nat snat ip|ip6 addr_min reg 1` (`snat to ADDR` after an immediate).
pub fn snat(nfproto: u32) -> Expr {
    Expr::new(c"nat")
        .u32(sys::NFTNL_EXPR_NAT_TYPE, libc::NFT_NAT_SNAT as u32)
        .u32(sys::NFTNL_EXPR_NAT_FAMILY, nfproto)
        .u32(sys::NFTNL_EXPR_NAT_REG_ADDR_MIN, REG1)
}

/// `lookup reg 1 set NAME [0x1]`: membership (or, inverted, non-membership) in an anonymous set
/// created earlier in the same batch with `set_id`.
pub fn lookup(set_name: &str, set_id: u32, invert: bool) -> Expr {
    let e = Expr::new(c"lookup")
        .u32(sys::NFTNL_EXPR_LOOKUP_SREG, REG1)
        .str(sys::NFTNL_EXPR_LOOKUP_SET, set_name)
        .u32(sys::NFTNL_EXPR_LOOKUP_SET_ID, set_id);
    if invert {
        e.u32(sys::NFTNL_EXPR_LOOKUP_FLAGS, NFT_LOOKUP_F_INV)
    } else {
        e
    }
}

/// `immediate reg 1 DATA`.
pub fn immediate(data: &[u8]) -> Expr {
    Expr::new(c"immediate")
        .u32(sys::NFTNL_EXPR_IMM_DREG, REG1)
        .data(sys::NFTNL_EXPR_IMM_DATA, data)
}

/// `immediate reg 0 VERDICT` for accept/drop/return.
pub fn verdict(code: i32) -> Expr {
    Expr::new(c"immediate")
        .u32(sys::NFTNL_EXPR_IMM_DREG, REG_VERDICT)
        .u32(sys::NFTNL_EXPR_IMM_VERDICT, code as u32)
}

/// `immediate reg 0 jump -> CHAIN`.
pub fn jump(chain: &str) -> Expr {
    Expr::new(c"immediate")
        .u32(sys::NFTNL_EXPR_IMM_DREG, REG_VERDICT)
        .u32(sys::NFTNL_EXPR_IMM_VERDICT, libc::NFT_JUMP as u32)
        .str(sys::NFTNL_EXPR_IMM_CHAIN, chain)
}

/// `counter`.
pub fn counter() -> Expr {
    Expr::new(c"counter")
}

/// `redir proto_min reg 1 proto_max reg 1 flags 0x2` (`redirect to :PORT` after an immediate).
pub fn redir() -> Expr {
    Expr::new(c"redir")
        .u32(sys::NFTNL_EXPR_REDIR_REG_PROTO_MIN, REG1)
        .u32(sys::NFTNL_EXPR_REDIR_REG_PROTO_MAX, REG1)
        .u32(sys::NFTNL_EXPR_REDIR_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED)
}

/// `tproxy ip|ip6 port reg 1`.
pub fn tproxy(nfproto: u32) -> Expr {
    Expr::new(c"tproxy")
        .u32(sys::NFTNL_EXPR_TPROXY_FAMILY, nfproto)
        .u32(sys::NFTNL_EXPR_TPROXY_REG_PORT, REG1)
}

/// An `nft_ir` expression as libnftnl's: the one serialisation of the IR into a batch. Every
/// variant is named; the two the kernel has no expression for are never in a plan's lowering
/// (`Unknown` is what a reader could not read; a tproxy that drops on a miss is iptables').
pub fn of_ir(e: &nft_ir::Expr) -> Expr {
    use nft_ir::{Expr as I, Verdict};
    match e {
        I::Meta { key, dreg } => Expr::new(c"meta")
            .u32(sys::NFTNL_EXPR_META_KEY, *key)
            .u32(sys::NFTNL_EXPR_META_DREG, *dreg),
        I::MetaSet { key, sreg } => Expr::new(c"meta")
            .u32(sys::NFTNL_EXPR_META_KEY, *key)
            .u32(sys::NFTNL_EXPR_META_SREG, *sreg),
        I::Ct { key, dreg } => Expr::new(c"ct")
            .u32(sys::NFTNL_EXPR_CT_KEY, *key)
            .u32(sys::NFTNL_EXPR_CT_DREG, *dreg),
        I::CtSet { key, sreg } => Expr::new(c"ct")
            .u32(sys::NFTNL_EXPR_CT_KEY, *key)
            .u32(sys::NFTNL_EXPR_CT_SREG, *sreg),
        I::Payload {
            base,
            offset,
            len,
            dreg,
        } => Expr::new(c"payload")
            .u32(sys::NFTNL_EXPR_PAYLOAD_DREG, *dreg)
            .u32(sys::NFTNL_EXPR_PAYLOAD_BASE, *base)
            .u32(sys::NFTNL_EXPR_PAYLOAD_OFFSET, *offset)
            .u32(sys::NFTNL_EXPR_PAYLOAD_LEN, *len),
        I::Cmp { sreg, op, data } => Expr::new(c"cmp")
            .u32(sys::NFTNL_EXPR_CMP_SREG, *sreg)
            .u32(sys::NFTNL_EXPR_CMP_OP, *op)
            .data(sys::NFTNL_EXPR_CMP_DATA, data),
        I::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
        } => Expr::new(c"bitwise")
            .u32(sys::NFTNL_EXPR_BITWISE_SREG, *sreg)
            .u32(sys::NFTNL_EXPR_BITWISE_DREG, *dreg)
            .u32(sys::NFTNL_EXPR_BITWISE_LEN, mask.len() as u32)
            .data(sys::NFTNL_EXPR_BITWISE_MASK, mask)
            .data(sys::NFTNL_EXPR_BITWISE_XOR, xor),
        I::Lookup { sreg, set, invert } => lookup_of_ir(*sreg, set, *invert),
        I::Immediate { dreg, data } => Expr::new(c"immediate")
            .u32(sys::NFTNL_EXPR_IMM_DREG, *dreg)
            .data(sys::NFTNL_EXPR_IMM_DATA, data),
        I::Verdict(Verdict::Accept) => verdict(libc::NF_ACCEPT),
        I::Verdict(Verdict::Drop) => verdict(libc::NF_DROP),
        I::Verdict(Verdict::Return) => verdict(libc::NFT_RETURN),
        I::Verdict(Verdict::Continue) => verdict(libc::NFT_CONTINUE),
        I::Verdict(Verdict::Jump(chain)) => jump(chain),
        I::Verdict(Verdict::Goto(chain)) => Expr::new(c"immediate")
            .u32(sys::NFTNL_EXPR_IMM_DREG, REG_VERDICT)
            .u32(sys::NFTNL_EXPR_IMM_VERDICT, libc::NFT_GOTO as u32)
            .str(sys::NFTNL_EXPR_IMM_CHAIN, chain),
        I::Counter => counter(),
        I::Redir { port_reg: None } => Expr::new(c"redir"),
        I::Redir {
            port_reg: Some(reg),
        } => Expr::new(c"redir")
            .u32(sys::NFTNL_EXPR_REDIR_REG_PROTO_MIN, *reg)
            .u32(sys::NFTNL_EXPR_REDIR_REG_PROTO_MAX, *reg)
            .u32(sys::NFTNL_EXPR_REDIR_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED),
        I::Tproxy {
            family,
            port_reg,
            miss_drops: false,
        } => {
            let mut e = Expr::new(c"tproxy");
            if *family != 0 {
                e = e.u32(sys::NFTNL_EXPR_TPROXY_FAMILY, *family);
            }
            match port_reg {
                Some(reg) => e.u32(sys::NFTNL_EXPR_TPROXY_REG_PORT, *reg),
                None => e,
            }
        }
        I::Nat {
            snat,
            family,
            addr_reg,
            port_reg,
        } => nat_of_ir(*snat, *family, *addr_reg, *port_reg),
        I::Tproxy {
            miss_drops: true, ..
        }
        | I::Unknown(_) => unreachable!("not an nftables expression: {e:?}"),
    }
}

/// `lookup reg SREG set NAME [0x1]`: an anonymous set is created in the same batch as
/// `__set%d` with its number as id; a named set is found by its name.
fn lookup_of_ir(sreg: u32, set: &str, invert: bool) -> Expr {
    let e = match nft_ir::anonymous_id(set) {
        Some(id) => Expr::new(c"lookup")
            .u32(sys::NFTNL_EXPR_LOOKUP_SREG, sreg)
            .str(sys::NFTNL_EXPR_LOOKUP_SET, "__set%d")
            .u32(sys::NFTNL_EXPR_LOOKUP_SET_ID, id),
        None => Expr::new(c"lookup")
            .u32(sys::NFTNL_EXPR_LOOKUP_SREG, sreg)
            .str(sys::NFTNL_EXPR_LOOKUP_SET, set),
    };
    if invert {
        e.u32(sys::NFTNL_EXPR_LOOKUP_FLAGS, NFT_LOOKUP_F_INV)
    } else {
        e
    }
}

/// `nat snat|dnat ip|ip6 addr_min reg A proto_min reg P`.
fn nat_of_ir(snat: bool, family: u32, addr_reg: Option<u32>, port_reg: Option<u32>) -> Expr {
    let kind = if snat {
        libc::NFT_NAT_SNAT
    } else {
        libc::NFT_NAT_DNAT
    };
    let mut e = Expr::new(c"nat")
        .u32(sys::NFTNL_EXPR_NAT_TYPE, kind as u32)
        .u32(sys::NFTNL_EXPR_NAT_FAMILY, family);
    if let Some(reg) = addr_reg {
        e = e.u32(sys::NFTNL_EXPR_NAT_REG_ADDR_MIN, reg);
    }
    if let Some(reg) = port_reg {
        e = e.u32(sys::NFTNL_EXPR_NAT_REG_PROTO_MIN, reg);
    }
    e
}

/// Interface names are compared as nft does: the full 16-byte, zero-padded IFNAMSIZ buffer.
pub fn ifname_bytes(name: &str) -> [u8; libc::IFNAMSIZ] {
    let mut b = [0u8; libc::IFNAMSIZ];
    b[..name.len()].copy_from_slice(name.as_bytes());
    b
}
