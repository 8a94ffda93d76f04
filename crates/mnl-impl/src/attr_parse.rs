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
            .wrapping_add(mnl_align(usize::from(rd!(attr, nla_len)))) as *mut NlAttr
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
/// Returns that value, else the last callback's value (libmnl passes e.g. a 2 through), else
/// MNL_CB_OK.
unsafe fn parse_range(start: *const u8, len: usize, cb: MnlAttrCb, data: *mut c_void) -> c_int {
    let end = start.wrapping_add(len);
    let mut attr = start.cast::<NlAttr>();
    let mut ret = MNL_CB_OK;
    unsafe {
        while mnl_attr_ok(attr, (end as isize).wrapping_sub(attr as isize) as c_int) {
            if let Some(f) = cb {
                ret = f(attr, data);
                if ret <= MNL_CB_STOP {
                    return ret;
                }
            }
            attr = mnl_attr_next(attr);
        }
    }
    ret
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
