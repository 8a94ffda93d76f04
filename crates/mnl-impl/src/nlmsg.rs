// ---------------------------------------------------------------------------------------------
// netlink messages

#[unsafe(no_mangle)]
pub extern "C" fn mnl_nlmsg_size(len: size_t) -> size_t {
    len.wrapping_add(MNL_NLMSG_HDRLEN)
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

/// Appends `MNL_ALIGN(size)` zeroed bytes (e.g. a `struct nfgenmsg`) and returns them. Like
/// libmnl, they start right at `nlmsg_len`, aligned or not.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_put_extra_header(
    nlh: *mut NlMsgHdr,
    size: size_t,
) -> *mut c_void {
    unsafe {
        let tail = nlh.cast::<u8>().wrapping_add(rd!(nlh, nlmsg_len) as usize);
        let len = mnl_align(size);
        wr!(nlh, nlmsg_len, rd!(nlh, nlmsg_len).wrapping_add(len as u32));
        ptr::write_bytes(tail, 0, len);
        tail.cast()
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
    nlh.cast::<u8>()
        .wrapping_add(MNL_NLMSG_HDRLEN.wrapping_add(mnl_align(offset))) as *mut c_void
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_nlmsg_get_payload_tail(nlh: *const NlMsgHdr) -> *mut c_void {
    unsafe {
        nlh.cast::<u8>()
            .wrapping_add(align_nlmsg_len(rd!(nlh, nlmsg_len))) as *mut c_void
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
        let step = align_nlmsg_len(rd!(nlh, nlmsg_len));
        // C's `int -= size_t`: wraps (a length near 2^31 must not abort a debug build)
        *len = (*len).wrapping_sub(step as c_int);
        nlh.cast::<u8>().wrapping_add(step) as *mut NlMsgHdr
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
