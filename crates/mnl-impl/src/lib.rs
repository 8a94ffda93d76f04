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
//! has `use mnl_impl as _;`. Keep every exported function in this file (the root module): rustc
//! then emits them all in ONE object, which GNU ld pulls in whole at the first `mnl_*` reference
//! (from nft-backend / the `mnl` crate), before it scans `libnftnl.a` (lld needs no such care).
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

/// `MNL_ALIGN(len)`
pub const fn mnl_align(len: usize) -> usize {
    (len + MNL_ALIGNTO - 1) & !(MNL_ALIGNTO - 1)
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

// ---------------------------------------------------------------------------------------------
// netlink messages

#[unsafe(no_mangle)]
pub extern "C" fn mnl_nlmsg_size(len: size_t) -> size_t {
    len + MNL_NLMSG_HDRLEN
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_get_payload_len(nlh: *const NlMsgHdr) -> size_t {
    unsafe { (rd!(nlh, nlmsg_len) as usize).wrapping_sub(MNL_NLMSG_HDRLEN) }
}

/// Zeroes a message header at the start of `buf` and sets its length to the header length.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_put_header(buf: *mut c_void) -> *mut NlMsgHdr {
    unsafe {
        ptr::write_bytes(buf.cast::<u8>(), 0, MNL_NLMSG_HDRLEN);
        let nlh = buf.cast::<NlMsgHdr>();
        wr!(nlh, nlmsg_len, MNL_NLMSG_HDRLEN as u32);
        nlh
    }
}

/// Appends `MNL_ALIGN(size)` zeroed bytes (e.g. a `struct nfgenmsg`) and returns them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_put_extra_header(
    nlh: *mut NlMsgHdr,
    size: size_t,
) -> *mut c_void {
    unsafe {
        let tail = mnl_nlmsg_get_payload_tail(nlh);
        let len = mnl_align(size);
        wr!(nlh, nlmsg_len, rd!(nlh, nlmsg_len) + len as u32);
        ptr::write_bytes(tail.cast::<u8>(), 0, len);
        tail
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_get_payload(nlh: *const NlMsgHdr) -> *mut c_void {
    unsafe { nlh.cast::<u8>().add(MNL_NLMSG_HDRLEN) as *mut c_void }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_get_payload_offset(
    nlh: *const NlMsgHdr,
    offset: size_t,
) -> *mut c_void {
    unsafe { nlh.cast::<u8>().add(MNL_NLMSG_HDRLEN + mnl_align(offset)) as *mut c_void }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_get_payload_tail(nlh: *const NlMsgHdr) -> *mut c_void {
    unsafe {
        nlh.cast::<u8>()
            .add(mnl_align(rd!(nlh, nlmsg_len) as usize)) as *mut c_void
    }
}

/// True if a whole message (header and the length it claims) fits in the `len` remaining bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_ok(nlh: *const NlMsgHdr, len: c_int) -> bool {
    let hdr = size_of::<NlMsgHdr>() as i64;
    let len = i64::from(len);
    if len < hdr {
        return false;
    }
    let msg_len = i64::from(unsafe { rd!(nlh, nlmsg_len) });
    msg_len >= hdr && msg_len <= len
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_next(nlh: *const NlMsgHdr, len: *mut c_int) -> *mut NlMsgHdr {
    unsafe {
        let step = mnl_align(rd!(nlh, nlmsg_len) as usize);
        *len -= step as c_int;
        nlh.cast::<u8>().add(step) as *mut NlMsgHdr
    }
}

/// A zero sequence number on either side (a kernel event, or a caller not tracking) matches.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_seq_ok(nlh: *const NlMsgHdr, seq: c_uint) -> bool {
    let got = unsafe { rd!(nlh, nlmsg_seq) };
    got == 0 || seq == 0 || got == seq
}

/// A zero port id on either side matches.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_portid_ok(nlh: *const NlMsgHdr, portid: c_uint) -> bool {
    let got = unsafe { rd!(nlh, nlmsg_pid) };
    got == 0 || portid == 0 || got == portid
}

// ---------------------------------------------------------------------------------------------
// message batches

/// `struct mnl_nlmsg_batch` (opaque to C).
pub struct MnlNlmsgBatch {
    /// start of the caller's buffer
    buf: *mut u8,
    /// the batch may not grow beyond this many bytes
    limit: usize,
    /// bytes of complete messages in the batch
    len: usize,
    /// where the message being built starts (`buf + len`)
    cur: *mut u8,
    /// the last `next()` found the current message would not fit
    overflow: bool,
}

/// Starts a batch in `buf`. `limit` is the batch size limit; the buffer itself must be larger
/// (libmnl documents twice the limit) so the message that overflows still fits behind it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_batch_start(
    buf: *mut c_void,
    limit: size_t,
) -> *mut MnlNlmsgBatch {
    Box::into_raw(Box::new(MnlNlmsgBatch {
        buf: buf.cast(),
        limit,
        len: 0,
        cur: buf.cast(),
        overflow: false,
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_batch_stop(b: *mut MnlNlmsgBatch) {
    if !b.is_null() {
        drop(unsafe { Box::from_raw(b) });
    }
}

/// Adds the message at `current()` to the batch. Returns false (and remembers the overflow) if
/// it would take the batch beyond its limit: the message then stays where it is and `reset()`
/// moves it to the front, as the first message of the next batch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_batch_next(b: *mut MnlNlmsgBatch) -> bool {
    unsafe {
        let b = &mut *b;
        let msg_len = rd!(b.cur.cast::<NlMsgHdr>(), nlmsg_len) as usize;
        if b.len + msg_len > b.limit {
            b.overflow = true;
            return false;
        }
        b.len += msg_len;
        b.cur = b.buf.add(b.len);
        true
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_batch_reset(b: *mut MnlNlmsgBatch) {
    unsafe {
        let b = &mut *b;
        if b.overflow {
            let msg_len = rd!(b.cur.cast::<NlMsgHdr>(), nlmsg_len) as usize;
            ptr::copy(b.cur, b.buf, msg_len);
            b.len = msg_len;
            b.overflow = false;
        } else {
            b.len = 0;
        }
        b.cur = b.buf.add(b.len);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_batch_size(b: *mut MnlNlmsgBatch) -> size_t {
    unsafe { (*b).len }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_batch_head(b: *mut MnlNlmsgBatch) -> *mut c_void {
    unsafe { (*b).buf.cast() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_batch_current(b: *mut MnlNlmsgBatch) -> *mut c_void {
    unsafe { (*b).cur.cast() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_batch_is_empty(b: *mut MnlNlmsgBatch) -> bool {
    unsafe { (*b).len == 0 }
}

// ---------------------------------------------------------------------------------------------
// attribute getters

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_type(attr: *const NlAttr) -> u16 {
    unsafe { rd!(attr, nla_type) & NLA_TYPE_MASK }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_len(attr: *const NlAttr) -> u16 {
    unsafe { rd!(attr, nla_len) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_payload_len(attr: *const NlAttr) -> u16 {
    unsafe { rd!(attr, nla_len).wrapping_sub(MNL_ATTR_HDRLEN as u16) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_payload(attr: *const NlAttr) -> *mut c_void {
    unsafe { attr.cast::<u8>().add(MNL_ATTR_HDRLEN) as *mut c_void }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_u8(attr: *const NlAttr) -> u8 {
    unsafe { mnl_attr_get_payload(attr).cast::<u8>().read() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_u16(attr: *const NlAttr) -> u16 {
    unsafe { mnl_attr_get_payload(attr).cast::<u16>().read_unaligned() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_u32(attr: *const NlAttr) -> u32 {
    unsafe { mnl_attr_get_payload(attr).cast::<u32>().read_unaligned() }
}

/// The payload is only 4-byte aligned: read unaligned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_u64(attr: *const NlAttr) -> u64 {
    unsafe { mnl_attr_get_payload(attr).cast::<u64>().read_unaligned() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_str(attr: *const NlAttr) -> *const c_char {
    unsafe { mnl_attr_get_payload(attr).cast::<c_char>() }
}

// ---------------------------------------------------------------------------------------------
// attribute iteration, validation, parsing

/// True if a whole attribute (header and the length it claims) fits in the `len` remaining bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_ok(attr: *const NlAttr, len: c_int) -> bool {
    let hdr = size_of::<NlAttr>() as c_int;
    if len < hdr {
        return false;
    }
    let attr_len = c_int::from(unsafe { rd!(attr, nla_len) });
    attr_len >= hdr && attr_len <= len
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_next(attr: *const NlAttr) -> *mut NlAttr {
    unsafe {
        attr.cast::<u8>()
            .add(mnl_align(usize::from(rd!(attr, nla_len)))) as *mut NlAttr
    }
}

/// 1 if the attribute type is at most `max`, else -1 with errno EOPNOTSUPP.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_type_valid(attr: *const NlAttr, max: u16) -> c_int {
    if unsafe { mnl_attr_get_type(attr) } > max {
        set_errno(libc::EOPNOTSUPP);
        return -1;
    }
    1
}

/// Minimum (and, when non-zero, exact) payload size per `enum mnl_attr_data_type`.
fn data_type_len(ty: c_int) -> usize {
    match ty {
        MNL_TYPE_U8 => 1,
        MNL_TYPE_U16 => 2,
        MNL_TYPE_U32 => 4,
        MNL_TYPE_U64 | MNL_TYPE_MSECS => 8,
        _ => 0,
    }
}

unsafe fn validate(attr: *const NlAttr, ty: c_int, exp_len: usize) -> c_int {
    let fail = |e| {
        set_errno(e);
        -1
    };
    let len = usize::from(unsafe { mnl_attr_get_payload_len(attr) });
    if len < exp_len {
        return fail(libc::ERANGE);
    }
    match ty {
        MNL_TYPE_FLAG if len > 0 => return fail(libc::ERANGE),
        MNL_TYPE_STRING if len == 0 => return fail(libc::ERANGE),
        MNL_TYPE_NUL_STRING => {
            if len == 0 {
                return fail(libc::ERANGE);
            }
            let last = unsafe { mnl_attr_get_payload(attr).cast::<u8>().add(len - 1).read() };
            if last != 0 {
                return fail(libc::EINVAL);
            }
        }
        // an empty nest is fine; a non-empty one holds at least one attribute header
        MNL_TYPE_NESTED if len != 0 && len < MNL_ATTR_HDRLEN => return fail(libc::ERANGE),
        _ => {}
    }
    if exp_len != 0 && len > exp_len {
        return fail(libc::ERANGE);
    }
    0
}

/// 0 if the payload fits `ty`, else -1 with errno EINVAL (unknown type, NUL string without its
/// NUL) or ERANGE (wrong size).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_validate(attr: *const NlAttr, ty: c_int) -> c_int {
    if !(0..MNL_TYPE_MAX).contains(&ty) {
        set_errno(libc::EINVAL);
        return -1;
    }
    unsafe { validate(attr, ty, data_type_len(ty)) }
}

/// Like `mnl_attr_validate` with an explicit expected payload size (for binary structs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_validate2(
    attr: *const NlAttr,
    ty: c_int,
    exp_len: size_t,
) -> c_int {
    if !(0..MNL_TYPE_MAX).contains(&ty) {
        set_errno(libc::EINVAL);
        return -1;
    }
    unsafe { validate(attr, ty, exp_len) }
}

/// Calls `cb` on each attribute of `[start, start+len)` until it returns MNL_CB_STOP or less.
unsafe fn parse_range(start: *const u8, len: usize, cb: MnlAttrCb, data: *mut c_void) -> c_int {
    let end = start.wrapping_add(len);
    let mut attr = start.cast::<NlAttr>();
    unsafe {
        while mnl_attr_ok(attr, (end as isize - attr as isize) as c_int) {
            if let Some(f) = cb {
                let ret = f(attr, data);
                if ret <= MNL_CB_STOP {
                    return ret;
                }
            }
            attr = mnl_attr_next(attr);
        }
    }
    MNL_CB_OK
}

/// Parses the attributes after `offset` bytes (the extra header) of the message payload.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_parse(
    nlh: *const NlMsgHdr,
    offset: c_uint,
    cb: MnlAttrCb,
    data: *mut c_void,
) -> c_int {
    unsafe {
        let start = mnl_nlmsg_get_payload_offset(nlh, offset as usize).cast::<u8>();
        let tail = mnl_nlmsg_get_payload_tail(nlh).cast::<u8>();
        let len = (tail as usize).saturating_sub(start as usize);
        parse_range(start, len, cb, data)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_parse_nested(
    attr: *const NlAttr,
    cb: MnlAttrCb,
    data: *mut c_void,
) -> c_int {
    unsafe {
        let len = usize::from(mnl_attr_get_payload_len(attr));
        parse_range(mnl_attr_get_payload(attr).cast(), len, cb, data)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_parse_payload(
    payload: *const c_void,
    payload_len: size_t,
    cb: MnlAttrCb,
    data: *mut c_void,
) -> c_int {
    unsafe { parse_range(payload.cast(), payload_len, cb, data) }
}

// ---------------------------------------------------------------------------------------------
// attribute putters

/// Appends an attribute at the message tail: header, `len` bytes of `data`, zeroed padding to
/// the 4-byte boundary; `nlmsg_len` grows by the aligned attribute size. No bounds check.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put(
    nlh: *mut NlMsgHdr,
    ty: u16,
    len: size_t,
    data: *const c_void,
) {
    unsafe {
        let attr = mnl_nlmsg_get_payload_tail(nlh).cast::<NlAttr>();
        let attr_len = MNL_ATTR_HDRLEN + len;
        wr!(attr, nla_type, ty);
        wr!(attr, nla_len, attr_len as u16);
        let payload = mnl_attr_get_payload(attr).cast::<u8>();
        if len > 0 {
            ptr::copy_nonoverlapping(data.cast::<u8>(), payload, len);
        }
        ptr::write_bytes(payload.add(len), 0, mnl_align(len) - len);
        wr!(
            nlh,
            nlmsg_len,
            rd!(nlh, nlmsg_len) + mnl_align(attr_len) as u32
        );
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_u8(nlh: *mut NlMsgHdr, ty: u16, data: u8) {
    unsafe { mnl_attr_put(nlh, ty, 1, ptr::addr_of!(data).cast()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_u16(nlh: *mut NlMsgHdr, ty: u16, data: u16) {
    unsafe { mnl_attr_put(nlh, ty, 2, ptr::addr_of!(data).cast()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_u32(nlh: *mut NlMsgHdr, ty: u16, data: u32) {
    unsafe { mnl_attr_put(nlh, ty, 4, ptr::addr_of!(data).cast()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_u64(nlh: *mut NlMsgHdr, ty: u16, data: u64) {
    unsafe { mnl_attr_put(nlh, ty, 8, ptr::addr_of!(data).cast()) }
}

/// The string without its terminating NUL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_str(nlh: *mut NlMsgHdr, ty: u16, data: *const c_char) {
    unsafe { mnl_attr_put(nlh, ty, libc::strlen(data), data.cast()) }
}

/// The string with its terminating NUL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_strz(nlh: *mut NlMsgHdr, ty: u16, data: *const c_char) {
    unsafe { mnl_attr_put(nlh, ty, libc::strlen(data) + 1, data.cast()) }
}

/// `mnl_attr_put` unless the message would grow beyond `buflen` (then false, nothing written).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_check(
    nlh: *mut NlMsgHdr,
    buflen: size_t,
    ty: u16,
    len: size_t,
    data: *const c_void,
) -> bool {
    unsafe {
        if rd!(nlh, nlmsg_len) as usize + MNL_ATTR_HDRLEN + mnl_align(len) > buflen {
            return false;
        }
        mnl_attr_put(nlh, ty, len, data);
    }
    true
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_u8_check(
    nlh: *mut NlMsgHdr,
    buflen: size_t,
    ty: u16,
    data: u8,
) -> bool {
    unsafe { mnl_attr_put_check(nlh, buflen, ty, 1, ptr::addr_of!(data).cast()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_u16_check(
    nlh: *mut NlMsgHdr,
    buflen: size_t,
    ty: u16,
    data: u16,
) -> bool {
    unsafe { mnl_attr_put_check(nlh, buflen, ty, 2, ptr::addr_of!(data).cast()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_u32_check(
    nlh: *mut NlMsgHdr,
    buflen: size_t,
    ty: u16,
    data: u32,
) -> bool {
    unsafe { mnl_attr_put_check(nlh, buflen, ty, 4, ptr::addr_of!(data).cast()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_u64_check(
    nlh: *mut NlMsgHdr,
    buflen: size_t,
    ty: u16,
    data: u64,
) -> bool {
    unsafe { mnl_attr_put_check(nlh, buflen, ty, 8, ptr::addr_of!(data).cast()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_str_check(
    nlh: *mut NlMsgHdr,
    buflen: size_t,
    ty: u16,
    data: *const c_char,
) -> bool {
    unsafe { mnl_attr_put_check(nlh, buflen, ty, libc::strlen(data), data.cast()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put_strz_check(
    nlh: *mut NlMsgHdr,
    buflen: size_t,
    ty: u16,
    data: *const c_char,
) -> bool {
    unsafe { mnl_attr_put_check(nlh, buflen, ty, libc::strlen(data) + 1, data.cast()) }
}

/// Opens a nest: an attribute header (type | NLA_F_NESTED) whose length `nest_end` fills in.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_nest_start(nlh: *mut NlMsgHdr, ty: u16) -> *mut NlAttr {
    unsafe {
        let start = mnl_nlmsg_get_payload_tail(nlh).cast::<NlAttr>();
        wr!(start, nla_type, NLA_F_NESTED | ty);
        wr!(start, nla_len, 0);
        wr!(nlh, nlmsg_len, rd!(nlh, nlmsg_len) + MNL_ATTR_HDRLEN as u32);
        start
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_nest_start_check(
    nlh: *mut NlMsgHdr,
    buflen: size_t,
    ty: u16,
) -> *mut NlAttr {
    unsafe {
        if rd!(nlh, nlmsg_len) as usize + MNL_ATTR_HDRLEN > buflen {
            return ptr::null_mut();
        }
        mnl_attr_nest_start(nlh, ty)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_nest_end(nlh: *mut NlMsgHdr, start: *mut NlAttr) {
    unsafe {
        let tail = mnl_nlmsg_get_payload_tail(nlh) as usize;
        wr!(start, nla_len, (tail - start as usize) as u16);
    }
}

/// Drops the nest and everything put into it since `nest_start`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_nest_cancel(nlh: *mut NlMsgHdr, start: *mut NlAttr) {
    unsafe {
        let tail = mnl_nlmsg_get_payload_tail(nlh) as usize;
        wr!(
            nlh,
            nlmsg_len,
            rd!(nlh, nlmsg_len) - (tail - start as usize) as u32
        );
    }
}

// ---------------------------------------------------------------------------------------------
// callback run queue

unsafe extern "C" fn cb_noop(_: *const NlMsgHdr, _: *mut c_void) -> c_int {
    MNL_CB_OK
}

/// NLMSG_ERROR: error 0 is an ACK (MNL_CB_STOP, errno 0); otherwise errno = |error| and
/// MNL_CB_ERROR; a message too short for `struct nlmsgerr` is EBADMSG.
unsafe extern "C" fn cb_error(nlh: *const NlMsgHdr, _: *mut c_void) -> c_int {
    // struct nlmsgerr { int error; struct nlmsghdr msg; }
    let need = mnl_nlmsg_size(size_of::<c_int>() + size_of::<NlMsgHdr>());
    unsafe {
        if (rd!(nlh, nlmsg_len) as usize) < need {
            set_errno(libc::EBADMSG);
            return MNL_CB_ERROR;
        }
        let error = mnl_nlmsg_get_payload(nlh).cast::<c_int>().read_unaligned();
        set_errno(error.wrapping_abs());
        if error == 0 {
            MNL_CB_STOP
        } else {
            MNL_CB_ERROR
        }
    }
}

unsafe extern "C" fn cb_stop(_: *const NlMsgHdr, _: *mut c_void) -> c_int {
    MNL_CB_STOP
}

fn default_ctl_cb(ty: u16) -> MnlCb {
    match ty {
        NLMSG_NOOP | NLMSG_OVERRUN => Some(cb_noop),
        NLMSG_ERROR => Some(cb_error),
        NLMSG_DONE => Some(cb_stop),
        _ => None,
    }
}

/// Walks the messages in `buf[..numbytes]`: port id / sequence mismatches fail with ESRCH /
/// EPROTO, an interrupted dump (NLM_F_DUMP_INTR) with EINTR. Data messages (type >= 16) go to
/// `cb_data`, control messages to `cb_ctl_array[type]` if the array covers the type, else to the
/// defaults (NOOP/OVERRUN: continue, ERROR: see `cb_error`, DONE: stop). Returns the first
/// callback result <= MNL_CB_STOP, else MNL_CB_OK.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mnl_cb_run2(
    buf: *const c_void,
    numbytes: size_t,
    seq: c_uint,
    portid: c_uint,
    cb_data: MnlCb,
    data: *mut c_void,
    cb_ctl_array: *const MnlCb,
    cb_ctl_array_len: c_uint,
) -> c_int {
    let mut len = numbytes.min(c_int::MAX as usize) as c_int;
    let mut nlh = buf.cast::<NlMsgHdr>();
    let mut ret = MNL_CB_OK;
    unsafe {
        while mnl_nlmsg_ok(nlh, len) {
            if !mnl_nlmsg_portid_ok(nlh, portid) {
                set_errno(libc::ESRCH);
                return -1;
            }
            if !mnl_nlmsg_seq_ok(nlh, seq) {
                set_errno(libc::EPROTO);
                return -1;
            }
            if rd!(nlh, nlmsg_flags) & NLM_F_DUMP_INTR != 0 {
                set_errno(libc::EINTR);
                return -1;
            }
            let ty = rd!(nlh, nlmsg_type);
            let cb = if ty >= NLMSG_MIN_TYPE {
                cb_data
            } else if u32::from(ty) < cb_ctl_array_len {
                if cb_ctl_array.is_null() {
                    None
                } else {
                    *cb_ctl_array.add(usize::from(ty))
                }
            } else {
                default_ctl_cb(ty)
            };
            if let Some(f) = cb {
                ret = f(nlh, data);
                if ret <= MNL_CB_STOP {
                    return ret;
                }
            }
            nlh = mnl_nlmsg_next(nlh, &mut len);
        }
    }
    ret
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_cb_run(
    buf: *const c_void,
    numbytes: size_t,
    seq: c_uint,
    portid: c_uint,
    cb_data: MnlCb,
    data: *mut c_void,
) -> c_int {
    unsafe { mnl_cb_run2(buf, numbytes, seq, portid, cb_data, data, ptr::null(), 0) }
}

// ---------------------------------------------------------------------------------------------
// sockets

/// `struct mnl_socket` (opaque to C): the fd and the address the kernel bound it to.
pub struct MnlSocket {
    fd: c_int,
    addr: libc::sockaddr_nl,
}

fn sockaddr_nl() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain old data; all-zero is valid.
    let mut a: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    a.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    a
}

/// A netlink socket of protocol `bus`; NULL (errno from socket(2)) on failure.
#[unsafe(no_mangle)]
pub extern "C" fn mnl_socket_open(bus: c_int) -> *mut MnlSocket {
    mnl_socket_open2(bus, 0)
}

/// `flags` are OR-ed into the socket type (SOCK_CLOEXEC, SOCK_NONBLOCK).
#[unsafe(no_mangle)]
pub extern "C" fn mnl_socket_open2(bus: c_int, flags: c_int) -> *mut MnlSocket {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | flags, bus) };
    if fd < 0 {
        return ptr::null_mut();
    }
    let mut addr = sockaddr_nl();
    addr.nl_family = 0; // not bound yet
    Box::into_raw(Box::new(MnlSocket { fd, addr }))
}

/// Wraps an existing netlink socket (takes ownership: `mnl_socket_close` closes it).
#[unsafe(no_mangle)]
pub extern "C" fn mnl_socket_fdopen(fd: c_int) -> *mut MnlSocket {
    let mut addr = sockaddr_nl();
    let mut addr_len = size_of::<libc::sockaddr_nl>() as socklen_t;
    // SAFETY: addr is a valid sockaddr_nl-sized out buffer.
    let ret = unsafe { libc::getsockname(fd, ptr::addr_of_mut!(addr).cast(), &mut addr_len) };
    if ret < 0 {
        return ptr::null_mut();
    }
    if i32::from(addr.nl_family) != libc::AF_NETLINK {
        addr = sockaddr_nl();
        addr.nl_family = 0;
    }
    Box::into_raw(Box::new(MnlSocket { fd, addr }))
}

/// Binds to `groups` / `pid` (MNL_SOCKET_AUTOPID: the kernel picks the port id), then records
/// the address the kernel assigned (see `mnl_socket_get_portid`). 0 or -1 with errno.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_bind(nl: *mut MnlSocket, groups: c_uint, pid: pid_t) -> c_int {
    unsafe {
        let nl = &mut *nl;
        let mut addr = sockaddr_nl();
        addr.nl_groups = groups;
        addr.nl_pid = pid as u32;
        let len = size_of::<libc::sockaddr_nl>() as socklen_t;
        let ret = libc::bind(nl.fd, ptr::addr_of!(addr).cast(), len);
        if ret < 0 {
            return ret;
        }
        let mut got_len = len;
        let ret = libc::getsockname(nl.fd, ptr::addr_of_mut!(addr).cast(), &mut got_len);
        if ret < 0 {
            return ret;
        }
        if got_len != len || i32::from(addr.nl_family) != libc::AF_NETLINK {
            set_errno(libc::EINVAL);
            return -1;
        }
        nl.addr = addr;
    }
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_get_fd(nl: *const MnlSocket) -> c_int {
    unsafe { (*nl).fd }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_get_portid(nl: *const MnlSocket) -> c_uint {
    unsafe { (*nl).addr.nl_pid }
}

/// Sends `len` bytes to the kernel (sockaddr_nl with pid 0, groups 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_sendto(
    nl: *const MnlSocket,
    buf: *const c_void,
    len: size_t,
) -> ssize_t {
    let kernel = sockaddr_nl();
    unsafe {
        libc::sendto(
            (*nl).fd,
            buf,
            len,
            0,
            ptr::addr_of!(kernel).cast(),
            size_of::<libc::sockaddr_nl>() as socklen_t,
        )
    }
}

/// Receives one datagram. A datagram larger than `bufsiz` is dropped by the kernel: -1 with
/// errno ENOSPC; a sender address that is not a sockaddr_nl: -1 with EINVAL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_recvfrom(
    nl: *const MnlSocket,
    buf: *mut c_void,
    bufsiz: size_t,
) -> ssize_t {
    let mut addr = sockaddr_nl();
    let mut iov = libc::iovec {
        iov_base: buf,
        iov_len: bufsiz,
    };
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = ptr::addr_of_mut!(addr).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_nl>() as socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let ret = unsafe { libc::recvmsg((*nl).fd, &mut msg, 0) };
    if ret < 0 {
        return ret;
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        set_errno(libc::ENOSPC);
        return -1;
    }
    if msg.msg_namelen as usize != size_of::<libc::sockaddr_nl>() {
        set_errno(libc::EINVAL);
        return -1;
    }
    ret
}

/// Closes the fd and frees the socket; returns close(2)'s result.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_close(nl: *mut MnlSocket) -> c_int {
    let nl = unsafe { Box::from_raw(nl) };
    unsafe { libc::close(nl.fd) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_setsockopt(
    nl: *const MnlSocket,
    ty: c_int,
    buf: *mut c_void,
    len: socklen_t,
) -> c_int {
    unsafe { libc::setsockopt((*nl).fd, SOL_NETLINK, ty, buf, len) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_socket_getsockopt(
    nl: *const MnlSocket,
    ty: c_int,
    buf: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    unsafe { libc::getsockopt((*nl).fd, SOL_NETLINK, ty, buf, len) }
}

#[cfg(test)]
mod tests;
