//! Our own implementation of the libmnl C ABI (libmnl 1.0.4 API, `<libmnl/libmnl.h>`), in Rust.
//!
//! Debian ships no `libmnl.a`, so a fully static binary cannot link the C library. This crate
//! exports (`#[unsafe(no_mangle)] extern "C"`) every `mnl_*` function of that header except
//! `mnl_nlmsg_fprintf` (a debugging printer nothing of ours calls): the 40 that Debian's
//! `libnftnl.a` needs, the ones the `mnl` crate calls through `mnl-sys`
//! (`mnl_socket_get_fd`, `mnl_cb_run`, ...), and the few remaining trivial ones.
//!
//! Written from the documented API (man pages / header), not from libmnl's sources. The opaque
//! structs `mnl_socket` and `mnl_nlmsg_batch` are our own layout: C callers only ever hold
//! pointers to them.
//!
//! To get the symbols into a binary, some crate in its graph must link this one: `nft-backend`
//! has `use mnl_impl as _;`. Keep every exported function in the root module: rustc then emits
//! them all in ONE object, which GNU ld pulls in whole at the first `mnl_*` reference (from
//! nft-backend / the `mnl` crate), before it scans `libnftnl.a` (lld needs no such care). The
//! sources are split by libmnl's sections (messages, batches, attributes, callbacks, sockets)
//! and `include!`d here, so they stay one module.
//!
//! Lengths are computed as libmnl's C computes them: unsigned arithmetic wraps (never a Rust
//! overflow panic, which would abort inside an `extern "C"` function in a debug build), and
//! values are truncated where C stores them in narrower fields (`nla_len`, `nlmsg_len`).
//! `tests/libmnl_diff` compares every function with Debian's libmnl.so.0, byte for byte.
//!
//! # Safety
//! Every exported function has the contract of its libmnl namesake: pointers must be valid for
//! the netlink message / attribute / buffer they designate (a message buffer must be large
//! enough for what is put into it; libmnl's unchecked putters do not check bounds either).
#![allow(clippy::missing_safety_doc)]

use libc::{c_char, c_int, c_uint, c_void, pid_t, size_t, socklen_t, ssize_t};
use std::mem::size_of;
use std::ptr;

// ---------------------------------------------------------------------------------------------
// wire-format structs and constants (<linux/netlink.h>)

/// `struct nlmsghdr`
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NlMsgHdr {
    pub nlmsg_len: u32,
    pub nlmsg_type: u16,
    pub nlmsg_flags: u16,
    pub nlmsg_seq: u32,
    pub nlmsg_pid: u32,
}

/// `struct nlattr`
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NlAttr {
    pub nla_len: u16,
    pub nla_type: u16,
}

pub const MNL_ALIGNTO: usize = 4;
pub const MNL_NLMSG_HDRLEN: usize = mnl_align(size_of::<NlMsgHdr>());
pub const MNL_ATTR_HDRLEN: usize = mnl_align(size_of::<NlAttr>());
pub const MNL_SOCKET_AUTOPID: pid_t = 0;

pub const MNL_CB_ERROR: c_int = -1;
pub const MNL_CB_STOP: c_int = 0;
pub const MNL_CB_OK: c_int = 1;

const NLA_F_NESTED: u16 = 1 << 15;
const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const NLMSG_MIN_TYPE: u16 = 0x10;
const NLM_F_DUMP_INTR: u16 = 0x10;
const SOL_NETLINK: c_int = 270;

/// `enum mnl_attr_data_type`
pub const MNL_TYPE_UNSPEC: c_int = 0;
pub const MNL_TYPE_U8: c_int = 1;
pub const MNL_TYPE_U16: c_int = 2;
pub const MNL_TYPE_U32: c_int = 3;
pub const MNL_TYPE_U64: c_int = 4;
pub const MNL_TYPE_STRING: c_int = 5;
pub const MNL_TYPE_FLAG: c_int = 6;
pub const MNL_TYPE_MSECS: c_int = 7;
pub const MNL_TYPE_NESTED: c_int = 8;
pub const MNL_TYPE_NESTED_COMPAT: c_int = 9;
pub const MNL_TYPE_NUL_STRING: c_int = 10;
pub const MNL_TYPE_BINARY: c_int = 11;
pub const MNL_TYPE_MAX: c_int = 12;

/// `MNL_ALIGN(len)` (wraps as C's size_t arithmetic does)
pub const fn mnl_align(len: usize) -> usize {
    len.wrapping_add(MNL_ALIGNTO - 1) & !(MNL_ALIGNTO - 1)
}

/// `MNL_ALIGN(nlh->nlmsg_len)`: C aligns a `uint32_t` in 32 bits, so 0xfffffffd.. wrap to 0.
const fn align_nlmsg_len(len: u32) -> usize {
    (len.wrapping_add(MNL_ALIGNTO as u32 - 1) & !(MNL_ALIGNTO as u32 - 1)) as usize
}

/// `mnl_cb_t`
pub type MnlCb = Option<unsafe extern "C" fn(nlh: *const NlMsgHdr, data: *mut c_void) -> c_int>;
/// `mnl_attr_cb_t`
pub type MnlAttrCb = Option<unsafe extern "C" fn(attr: *const NlAttr, data: *mut c_void) -> c_int>;

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

// Header fields are read/written unaligned: buffers from Rust callers (Vec<u8>) carry no
// alignment guarantee, and a misaligned plain deref would be UB (and a debug-build abort).
macro_rules! rd {
    ($p:expr, $f:ident) => {
        ptr::addr_of!((*$p).$f).read_unaligned()
    };
}
macro_rules! wr {
    ($p:expr, $f:ident, $v:expr) => {
        ptr::addr_of_mut!((*$p).$f).write_unaligned($v)
    };
}

include!("nlmsg.rs");
include!("batch.rs");
include!("attr_get.rs");
include!("attr_parse.rs");
include!("attr_put.rs");
include!("callback.rs");
include!("socket.rs");

#[cfg(test)]
mod tests;
