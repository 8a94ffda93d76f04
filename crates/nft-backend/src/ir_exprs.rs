//! The expressions the plan's lowering writes, as `nft_ir` values: what `nft` emits for each
//! statement (checked against `nft --debug=netlink` in ../shared/golden/nftables/
//! netlink-bytecode). Data is in register 1, as nft uses it.

use nft_ir::{Expr, REG1, Verdict};

/// `meta load KEY => reg 1`.
pub fn meta_load(key: u32) -> Expr {
    Expr::Meta { key, dreg: REG1 }
}

/// `meta set KEY with reg 1`.
pub fn meta_set(key: u32) -> Expr {
    Expr::MetaSet { key, sreg: REG1 }
}

/// `ct load KEY => reg 1`.
pub fn ct_load(key: u32) -> Expr {
    Expr::Ct { key, dreg: REG1 }
}

/// `ct set KEY with reg 1`.
pub fn ct_set(key: u32) -> Expr {
    Expr::CtSet { key, sreg: REG1 }
}

/// `cmp OP reg 1 DATA`.
pub fn cmp(op: u32, data: &[u8]) -> Expr {
    Expr::Cmp {
        sreg: REG1,
        op,
        data: data.to_vec(),
    }
}

/// `payload load LEN @ BASE + OFFSET => reg 1`.
pub fn payload(base: u32, offset: u32, len: u32) -> Expr {
    Expr::Payload {
        base,
        offset,
        len,
        dreg: REG1,
    }
}

/// `bitwise reg 1 = (reg 1 & MASK) ^ 0`.
pub fn bitwise_and(mask: &[u8]) -> Expr {
    bitwise_and_xor(mask, &vec![0u8; mask.len()])
}

/// `bitwise reg 1 = (reg 1 & MASK) ^ XOR`.
pub fn bitwise_and_xor(mask: &[u8], xor: &[u8]) -> Expr {
    Expr::Bitwise {
        sreg: REG1,
        dreg: REG1,
        mask: mask.to_vec(),
        xor: xor.to_vec(),
    }
}

/// `lookup reg 1 set NAME [0x1]` (an anonymous set of the rule, or a named set of the table).
pub fn lookup(set: &str, invert: bool) -> Expr {
    Expr::Lookup {
        sreg: REG1,
        set: set.to_string(),
        invert,
    }
}

/// `immediate reg 1 DATA`.
pub fn immediate(data: &[u8]) -> Expr {
    Expr::Immediate {
        dreg: REG1,
        data: data.to_vec(),
    }
}

/// `accept`, `drop`, `return`, `jump CHAIN`.
pub fn verdict(v: Verdict) -> Expr {
    Expr::Verdict(v)
}

/// `counter`.
pub fn counter() -> Expr {
    Expr::Counter
}

/// `redir proto_min reg 1 proto_max reg 1` (`redirect to :PORT` after an immediate).
pub fn redir() -> Expr {
    Expr::Redir {
        port_reg: Some(REG1),
    }
}

/// `tproxy ip|ip6 port reg 1` (a miss does not match; the lowering adds the drop).
pub fn tproxy(nfproto: u32) -> Expr {
    Expr::Tproxy {
        family: nfproto,
        port_reg: Some(REG1),
        miss_drops: false,
    }
}

/// `nat snat ip|ip6 addr_min reg 1` (`snat to ADDR` after an immediate).
pub fn snat(nfproto: u32) -> Expr {
    Expr::Nat {
        snat: true,
        family: nfproto,
        addr_reg: Some(REG1),
        port_reg: None,
    }
}
