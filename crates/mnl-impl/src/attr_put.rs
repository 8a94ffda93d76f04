// ---------------------------------------------------------------------------------------------
// attribute putters

/// Appends an attribute at the message tail: header, `len` bytes of `data`, zeroed padding to
/// the 4-byte boundary; `nlmsg_len` grows by the aligned attribute size. No bounds check.
///
/// As libmnl does, the attribute size is truncated to `nla_len`'s 16 bits, for `nla_len` and for
/// what `nlmsg_len` grows by, while all `len` bytes are copied. Unlike libmnl 1.0.4 (Debian 12),
/// the padding is zeroed rather than left as the buffer had it (no stale bytes to the kernel):
/// the one byte-level difference `tests/libmnl_diff` allows, and pins.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_put(
    nlh: *mut NlMsgHdr,
    ty: u16,
    len: size_t,
    data: *const c_void,
) {
    unsafe {
        let attr = mnl_nlmsg_get_payload_tail(nlh).cast::<NlAttr>();
        let attr_len = MNL_ATTR_HDRLEN.wrapping_add(len) as u16;
        wr!(attr, nla_type, ty);
        wr!(attr, nla_len, attr_len);
        let payload = mnl_attr_get_payload(attr).cast::<u8>();
        if len > 0 {
            ptr::copy_nonoverlapping(data.cast::<u8>(), payload, len);
        }
        ptr::write_bytes(payload.add(len), 0, mnl_align(len).wrapping_sub(len));
        wr!(
            nlh,
            nlmsg_len,
            rd!(nlh, nlmsg_len).wrapping_add(mnl_align(usize::from(attr_len)) as u32)
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
        let need = (rd!(nlh, nlmsg_len) as usize).wrapping_add(MNL_ATTR_HDRLEN);
        if need.wrapping_add(mnl_align(len)) > buflen {
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

/// Opens a nest: an attribute header (type | NLA_F_NESTED) whose length `nest_end` fills in
/// (until then `nla_len` keeps whatever the buffer held, as in libmnl).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_nest_start(nlh: *mut NlMsgHdr, ty: u16) -> *mut NlAttr {
    unsafe {
        let start = mnl_nlmsg_get_payload_tail(nlh).cast::<NlAttr>();
        wr!(start, nla_type, NLA_F_NESTED | ty);
        wr!(
            nlh,
            nlmsg_len,
            rd!(nlh, nlmsg_len).wrapping_add(MNL_ATTR_HDRLEN as u32)
        );
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
        if (rd!(nlh, nlmsg_len) as usize).wrapping_add(MNL_ATTR_HDRLEN) > buflen {
            return ptr::null_mut();
        }
        mnl_attr_nest_start(nlh, ty)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_nest_end(nlh: *mut NlMsgHdr, start: *mut NlAttr) {
    unsafe {
        let tail = mnl_nlmsg_get_payload_tail(nlh) as usize;
        wr!(start, nla_len, tail.wrapping_sub(start as usize) as u16);
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
            rd!(nlh, nlmsg_len).wrapping_sub(tail.wrapping_sub(start as usize) as u32)
        );
    }
}
