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
