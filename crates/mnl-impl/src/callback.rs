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
