use super::*;
use std::ffi::CStr;

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// 8-byte aligned, zero-initialised buffer.
struct Buf(Vec<u64>);

impl Buf {
    fn new(bytes: usize) -> Self {
        Buf(vec![0; bytes.div_ceil(8)])
    }
    fn nlh(&mut self) -> *mut NlMsgHdr {
        self.0.as_mut_ptr().cast()
    }
    fn at(&mut self, off: usize) -> *mut u8 {
        unsafe { self.0.as_mut_ptr().cast::<u8>().add(off) }
    }
    fn bytes(&self, len: usize) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), len) }
    }
}

unsafe extern "C" fn collect_attr(attr: *const NlAttr, data: *mut c_void) -> c_int {
    let out = unsafe { &mut *data.cast::<Vec<(u16, Vec<u8>)>>() };
    unsafe {
        let len = usize::from(mnl_attr_get_payload_len(attr));
        let payload = std::slice::from_raw_parts(mnl_attr_get_payload(attr).cast::<u8>(), len);
        out.push((mnl_attr_get_type(attr), payload.to_vec()));
    }
    MNL_CB_OK
}

unsafe extern "C" fn stop_at_second(_: *const NlAttr, data: *mut c_void) -> c_int {
    let n = unsafe { &mut *data.cast::<u32>() };
    *n += 1;
    if *n == 2 { MNL_CB_STOP } else { MNL_CB_OK }
}

#[test]
fn header_and_extra_header() {
    let mut b = Buf::new(64);
    unsafe {
        b.0.fill(u64::MAX);
        let nlh = mnl_nlmsg_put_header(b.nlh().cast());
        assert_eq!(MNL_NLMSG_HDRLEN, 16);
        assert_eq!(
            *nlh,
            NlMsgHdr {
                nlmsg_len: 16,
                ..Default::default()
            }
        );
        // 3 bytes are rounded up to 4, zeroed
        let extra = mnl_nlmsg_put_extra_header(nlh, 3);
        assert_eq!(extra.cast::<u8>(), b.at(16));
        assert_eq!((*nlh).nlmsg_len, 20);
        assert_eq!(b.bytes(20)[16..], [0, 0, 0, 0]);
        assert_eq!(mnl_nlmsg_get_payload(nlh).cast::<u8>(), b.at(16));
        assert_eq!(mnl_nlmsg_get_payload_len(nlh), 4);
        assert_eq!(mnl_nlmsg_get_payload_offset(nlh, 3).cast::<u8>(), b.at(20));
        assert_eq!(mnl_nlmsg_get_payload_tail(nlh).cast::<u8>(), b.at(20));
        assert_eq!(mnl_nlmsg_size(4), 20);
        assert!(mnl_nlmsg_ok(nlh, 20));
        assert!(!mnl_nlmsg_ok(nlh, 19));
        assert!(!mnl_nlmsg_ok(nlh, -1));
        let mut len = 64;
        assert_eq!(mnl_nlmsg_next(nlh, &mut len).cast::<u8>(), b.at(20));
        assert_eq!(len, 44);
    }
}

#[test]
fn attribute_put_parse_round_trip() {
    let mut b = Buf::new(512);
    b.0.fill(u64::MAX); // padding must be written as zeroes, not left over
    let s = c"abcde";
    unsafe {
        let nlh = mnl_nlmsg_put_header(b.nlh().cast());
        mnl_nlmsg_put_extra_header(nlh, 4);
        mnl_attr_put_u8(nlh, 1, 0xab);
        mnl_attr_put_u16(nlh, 2, 0xbeef);
        mnl_attr_put_u32(nlh, 3, 0xdead_beef);
        mnl_attr_put_u64(nlh, 4, 0x0102_0304_0506_0708);
        mnl_attr_put_str(nlh, 5, s.as_ptr());
        mnl_attr_put_strz(nlh, 6, s.as_ptr());
        mnl_attr_put(nlh, 7, 0, ptr::null());
        let nest = mnl_attr_nest_start(nlh, 8);
        mnl_attr_put_u32(nlh, 1, 7);
        mnl_attr_put_u8(nlh, 2, 9);
        mnl_attr_nest_end(nlh, nest);

        // u8 attribute: header (4) + 1 byte + 3 zero padding; nla_len says 5
        assert_eq!(b.bytes(28)[20..], [5, 0, 1, 0, 0xab, 0, 0, 0]);
        // 16 + 4 + 8 + 8 + 8 + 12 + 12 (str: 4+5 -> 12) + 12 (strz: 4+6 -> 12) + 4 + (4 + 8 + 8)
        assert_eq!((*nlh).nlmsg_len, 16 + 4 + 8 + 8 + 8 + 12 + 12 + 12 + 4 + 20);
        assert_eq!((*nest).nla_len, 20);
        assert_eq!((*nest).nla_type, 8 | NLA_F_NESTED);
        assert_eq!(mnl_attr_get_type(nest), 8);

        let mut got: Vec<(u16, Vec<u8>)> = Vec::new();
        let ret = mnl_attr_parse(nlh, 4, Some(collect_attr), ptr::addr_of_mut!(got).cast());
        assert_eq!(ret, MNL_CB_OK);
        let types: Vec<u16> = got.iter().map(|(t, _)| *t).collect();
        assert_eq!(types, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(got[0].1, [0xab]);
        assert_eq!(got[1].1, 0xbeef_u16.to_ne_bytes());
        assert_eq!(got[2].1, 0xdead_beef_u32.to_ne_bytes());
        assert_eq!(got[3].1, 0x0102_0304_0506_0708_u64.to_ne_bytes());
        assert_eq!(got[4].1, b"abcde");
        assert_eq!(got[5].1, b"abcde\0");
        assert!(got[6].1.is_empty());

        // typed getters, walking with ok/next
        let tail = mnl_nlmsg_get_payload_tail(nlh) as usize;
        let mut a = mnl_nlmsg_get_payload_offset(nlh, 4).cast::<NlAttr>();
        let mut seen = 0;
        while mnl_attr_ok(a, (tail - a as usize) as c_int) {
            match mnl_attr_get_type(a) {
                1 => assert_eq!(mnl_attr_get_u8(a), 0xab),
                2 => assert_eq!(mnl_attr_get_u16(a), 0xbeef),
                3 => assert_eq!(mnl_attr_get_u32(a), 0xdead_beef),
                4 => assert_eq!(mnl_attr_get_u64(a), 0x0102_0304_0506_0708),
                6 => assert_eq!(CStr::from_ptr(mnl_attr_get_str(a)), s),
                8 => {
                    let mut inner: Vec<(u16, Vec<u8>)> = Vec::new();
                    let ret = mnl_attr_parse_nested(
                        a,
                        Some(collect_attr),
                        ptr::addr_of_mut!(inner).cast(),
                    );
                    assert_eq!(ret, MNL_CB_OK);
                    assert_eq!(inner, [(1, 7u32.to_ne_bytes().to_vec()), (2, vec![9])]);
                    assert_eq!(mnl_attr_validate(a, MNL_TYPE_NESTED), 0);
                }
                _ => {}
            }
            seen += 1;
            a = mnl_attr_next(a);
        }
        assert_eq!(seen, 8);

        // a callback returning MNL_CB_STOP ends the walk with that value
        let mut n = 0u32;
        let ret = mnl_attr_parse(nlh, 4, Some(stop_at_second), ptr::addr_of_mut!(n).cast());
        assert_eq!((ret, n), (MNL_CB_STOP, 2));
        // parse_payload over the same bytes
        let mut got2: Vec<(u16, Vec<u8>)> = Vec::new();
        let start = mnl_nlmsg_get_payload_offset(nlh, 4);
        let plen = tail - start as usize;
        mnl_attr_parse_payload(
            start,
            plen,
            Some(collect_attr),
            ptr::addr_of_mut!(got2).cast(),
        );
        assert_eq!(got2, got);
    }
}

#[test]
fn attribute_check_putters_and_nest_cancel() {
    let mut b = Buf::new(64);
    unsafe {
        let nlh = mnl_nlmsg_put_header(b.nlh().cast());
        assert!(mnl_attr_put_u32_check(nlh, 24, 1, 5)); // 16 + 8 = 24
        assert!(!mnl_attr_put_u8_check(nlh, 24, 2, 5));
        assert!(!mnl_attr_put_strz_check(nlh, 31, 2, c"abc".as_ptr()));
        assert!(mnl_attr_put_strz_check(nlh, 32, 2, c"abc".as_ptr()));
        assert_eq!((*nlh).nlmsg_len, 32);
        assert!(mnl_attr_nest_start_check(nlh, 35, 3).is_null());
        let nest = mnl_attr_nest_start_check(nlh, 64, 3);
        assert!(!nest.is_null());
        mnl_attr_put_u64(nlh, 1, 1);
        assert_eq!((*nlh).nlmsg_len, 48);
        mnl_attr_nest_cancel(nlh, nest);
        assert_eq!((*nlh).nlmsg_len, 32);
    }
}

/// Builds one attribute with `payload` at the start of a fresh buffer.
fn attr_with(b: &mut Buf, payload: &[u8]) -> *const NlAttr {
    unsafe {
        let nlh = mnl_nlmsg_put_header(b.nlh().cast());
        mnl_attr_put(nlh, 1, payload.len(), payload.as_ptr().cast());
        mnl_nlmsg_get_payload(nlh).cast()
    }
}

#[test]
fn validate_length_rules() {
    let mut b = Buf::new(128);
    let cases: &[(c_int, &[u8], Result<(), c_int>)] = &[
        (MNL_TYPE_U8, &[1], Ok(())),
        (MNL_TYPE_U8, &[], Err(libc::ERANGE)),
        (MNL_TYPE_U8, &[1, 2], Err(libc::ERANGE)),
        (MNL_TYPE_U16, &[1, 2], Ok(())),
        (MNL_TYPE_U16, &[1], Err(libc::ERANGE)),
        (MNL_TYPE_U32, &[1, 2, 3, 4], Ok(())),
        (MNL_TYPE_U32, &[1, 2], Err(libc::ERANGE)),
        (MNL_TYPE_U32, &[0; 8], Err(libc::ERANGE)),
        (MNL_TYPE_U64, &[0; 8], Ok(())),
        (MNL_TYPE_U64, &[0; 4], Err(libc::ERANGE)),
        (MNL_TYPE_MSECS, &[0; 8], Ok(())),
        (MNL_TYPE_MSECS, &[0; 4], Err(libc::ERANGE)),
        (MNL_TYPE_FLAG, &[], Ok(())),
        (MNL_TYPE_FLAG, &[1], Err(libc::ERANGE)),
        (MNL_TYPE_STRING, b"ab", Ok(())),
        (MNL_TYPE_STRING, b"", Err(libc::ERANGE)),
        (MNL_TYPE_NUL_STRING, b"ab\0", Ok(())),
        (MNL_TYPE_NUL_STRING, b"ab", Err(libc::EINVAL)),
        (MNL_TYPE_NUL_STRING, b"", Err(libc::ERANGE)),
        (MNL_TYPE_NESTED, &[], Ok(())),
        (MNL_TYPE_NESTED, &[4, 0], Err(libc::ERANGE)),
        (MNL_TYPE_NESTED, &[4, 0, 1, 0], Ok(())),
        (MNL_TYPE_BINARY, &[1, 2, 3], Ok(())),
        (MNL_TYPE_UNSPEC, &[], Ok(())),
        (MNL_TYPE_NESTED_COMPAT, &[1], Ok(())),
        (MNL_TYPE_MAX, &[1], Err(libc::EINVAL)),
        (-1, &[1], Err(libc::EINVAL)),
    ];
    for (ty, payload, want) in cases {
        let a = attr_with(&mut b, payload);
        set_errno(0);
        let got = match unsafe { mnl_attr_validate(a, *ty) } {
            0 => Ok(()),
            -1 => Err(errno()),
            other => panic!("validate returned {other}"),
        };
        assert_eq!(got, *want, "type {ty} payload {payload:?}");
    }

    // validate2: an explicit size is a minimum and, for every type, a maximum
    let a = attr_with(&mut b, &[0; 6]);
    unsafe {
        assert_eq!(mnl_attr_validate2(a, MNL_TYPE_BINARY, 6), 0);
        assert_eq!(mnl_attr_validate2(a, MNL_TYPE_BINARY, 8), -1);
        assert_eq!(errno(), libc::ERANGE);
        assert_eq!(mnl_attr_validate2(a, MNL_TYPE_BINARY, 4), -1);
        assert_eq!(errno(), libc::ERANGE);
        assert_eq!(mnl_attr_validate2(a, MNL_TYPE_MAX, 6), -1);
        assert_eq!(errno(), libc::EINVAL);
    }
}

#[test]
fn type_valid_masks_flags() {
    let mut b = Buf::new(64);
    unsafe {
        let nlh = mnl_nlmsg_put_header(b.nlh().cast());
        let nest = mnl_attr_nest_start(nlh, 5); // type 5 | NLA_F_NESTED
        mnl_attr_nest_end(nlh, nest);
        assert_eq!(mnl_attr_type_valid(nest, 5), 1);
        set_errno(0);
        assert_eq!(mnl_attr_type_valid(nest, 4), -1);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(mnl_attr_get_len(nest), 4);
        assert_eq!(mnl_attr_get_payload_len(nest), 0);
    }
}

/// Puts a message of `len` bytes (header + zeroed payload) at the batch's current position.
unsafe fn put_msg(batch: *mut MnlNlmsgBatch, ty: u16, len: usize) {
    unsafe {
        let nlh = mnl_nlmsg_put_header(mnl_nlmsg_batch_current(batch));
        (*nlh).nlmsg_type = ty;
        mnl_nlmsg_put_extra_header(nlh, len - MNL_NLMSG_HDRLEN);
    }
}

#[test]
fn batch_overflow_carries_message_over() {
    let mut b = Buf::new(128);
    unsafe {
        let head = b.at(0);
        let batch = mnl_nlmsg_batch_start(head.cast(), 64);
        assert!(mnl_nlmsg_batch_is_empty(batch));
        assert_eq!(mnl_nlmsg_batch_head(batch).cast::<u8>(), head);
        assert_eq!(mnl_nlmsg_batch_current(batch).cast::<u8>(), head);

        put_msg(batch, 20, 24);
        assert!(mnl_nlmsg_batch_next(batch));
        put_msg(batch, 21, 24);
        assert!(mnl_nlmsg_batch_next(batch));
        assert_eq!(mnl_nlmsg_batch_size(batch), 48);
        assert_eq!(mnl_nlmsg_batch_current(batch).cast::<u8>(), b.at(48));
        assert!(!mnl_nlmsg_batch_is_empty(batch));

        // 48 + 24 > 64: refused, not counted, stays in place
        put_msg(batch, 22, 24);
        assert!(!mnl_nlmsg_batch_next(batch));
        assert_eq!(mnl_nlmsg_batch_size(batch), 48);
        assert_eq!(mnl_nlmsg_batch_current(batch).cast::<u8>(), b.at(48));

        // (the caller sends head[..48] here) -> the refused message opens the next batch
        mnl_nlmsg_batch_reset(batch);
        assert_eq!(mnl_nlmsg_batch_size(batch), 24);
        assert_eq!((*head.cast::<NlMsgHdr>()).nlmsg_type, 22);
        assert_eq!(mnl_nlmsg_batch_current(batch).cast::<u8>(), b.at(24));

        // exactly at the limit is fine
        put_msg(batch, 23, 40);
        assert!(mnl_nlmsg_batch_next(batch));
        assert_eq!(mnl_nlmsg_batch_size(batch), 64);

        // a reset without overflow empties the batch
        mnl_nlmsg_batch_reset(batch);
        assert!(mnl_nlmsg_batch_is_empty(batch));
        assert_eq!(mnl_nlmsg_batch_current(batch).cast::<u8>(), head);
        mnl_nlmsg_batch_stop(batch);
    }
}

/// Appends a message to `out` (4-byte aligned).
fn msg(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, pid: u32, payload: &[u8]) {
    let len = (16 + payload.len()) as u32;
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&pid.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// NLMSG_ERROR payload: error code + the echoed request header.
fn nlmsgerr(error: i32) -> Vec<u8> {
    let mut p = error.to_ne_bytes().to_vec();
    p.extend_from_slice(&[0; 16]);
    p
}

unsafe extern "C" fn count_data(nlh: *const NlMsgHdr, data: *mut c_void) -> c_int {
    let seen = unsafe { &mut *data.cast::<Vec<u16>>() };
    seen.push(unsafe { (*nlh).nlmsg_type });
    if unsafe { (*nlh).nlmsg_type } == 99 {
        MNL_CB_STOP
    } else {
        MNL_CB_OK
    }
}

fn run(buf: &[u8], seq: u32, portid: u32, seen: &mut Vec<u16>) -> (c_int, c_int) {
    set_errno(0);
    let ret = unsafe {
        mnl_cb_run(
            buf.as_ptr().cast(),
            buf.len(),
            seq,
            portid,
            Some(count_data),
            ptr::addr_of_mut!(*seen).cast(),
        )
    };
    (ret, errno())
}

#[test]
fn cb_run_control_messages() {
    let mut seen = Vec::new();
    // ACK (error 0) stops the run queue successfully
    let mut buf = Vec::new();
    msg(&mut buf, NLMSG_ERROR, 0, 7, 100, &nlmsgerr(0));
    assert_eq!(run(&buf, 7, 100, &mut seen), (MNL_CB_STOP, 0));

    // a negative error code becomes errno
    let mut buf = Vec::new();
    msg(&mut buf, NLMSG_ERROR, 0, 7, 100, &nlmsgerr(-libc::ENOENT));
    assert_eq!(run(&buf, 7, 100, &mut seen), (MNL_CB_ERROR, libc::ENOENT));
    // ... and so does a positive one
    let mut buf = Vec::new();
    msg(&mut buf, NLMSG_ERROR, 0, 7, 100, &nlmsgerr(libc::EEXIST));
    assert_eq!(run(&buf, 7, 100, &mut seen), (MNL_CB_ERROR, libc::EEXIST));
    // too short for struct nlmsgerr
    let mut buf = Vec::new();
    msg(&mut buf, NLMSG_ERROR, 0, 7, 100, &[0; 4]);
    assert_eq!(run(&buf, 7, 100, &mut seen), (MNL_CB_ERROR, libc::EBADMSG));

    // NOOP and OVERRUN are skipped, data goes to the callback, DONE stops
    let mut buf = Vec::new();
    msg(&mut buf, NLMSG_NOOP, 0, 7, 100, &[]);
    msg(&mut buf, 20, 0, 7, 100, &[1, 2, 3, 4]);
    msg(&mut buf, NLMSG_OVERRUN, 0, 7, 100, &[]);
    msg(&mut buf, 21, 0, 0, 0, &[]); // seq / portid 0 always match
    msg(&mut buf, NLMSG_DONE, 0, 7, 100, &[0; 4]);
    msg(&mut buf, 22, 0, 7, 100, &[]); // not reached
    assert_eq!(run(&buf, 7, 100, &mut seen), (MNL_CB_STOP, 0));
    assert_eq!(seen, [20, 21]);

    // data only: MNL_CB_OK (more to come); a callback's STOP ends early
    seen.clear();
    let mut buf = Vec::new();
    msg(&mut buf, 20, 0, 7, 100, &[]);
    msg(&mut buf, 99, 0, 7, 100, &[]);
    msg(&mut buf, 21, 0, 7, 100, &[]);
    assert_eq!(run(&buf[..16], 7, 100, &mut seen).0, MNL_CB_OK);
    assert_eq!(run(&buf, 7, 100, &mut seen).0, MNL_CB_STOP);
    assert_eq!(seen, [20, 20, 99]);

    // empty buffer / truncated message: nothing to do
    assert_eq!(run(&[], 7, 100, &mut seen).0, MNL_CB_OK);
    assert_eq!(run(&buf[..15], 7, 100, &mut seen).0, MNL_CB_OK);

    // caller expects seq 0 / portid 0: anything matches
    seen.clear();
    assert_eq!(run(&buf[..16], 0, 0, &mut seen).0, MNL_CB_OK);
    assert_eq!(seen, [20]);
}

#[test]
fn cb_run_rejections() {
    let mut seen = Vec::new();
    let mut buf = Vec::new();
    msg(&mut buf, NLMSG_ERROR, 0, 7, 100, &nlmsgerr(0));
    assert_eq!(run(&buf, 8, 100, &mut seen), (MNL_CB_ERROR, libc::EPROTO));
    assert_eq!(run(&buf, 7, 101, &mut seen), (MNL_CB_ERROR, libc::ESRCH));
    let mut buf = Vec::new();
    msg(&mut buf, 20, NLM_F_DUMP_INTR, 7, 100, &[]);
    assert_eq!(run(&buf, 7, 100, &mut seen), (MNL_CB_ERROR, libc::EINTR));
    assert!(seen.is_empty());
}

unsafe extern "C" fn ctl_stop(_: *const NlMsgHdr, data: *mut c_void) -> c_int {
    unsafe { (*data.cast::<Vec<u16>>()).push(0) };
    MNL_CB_STOP
}

#[test]
fn cb_run2_control_array_overrides_defaults() {
    let mut seen: Vec<u16> = Vec::new();
    let mut buf = Vec::new();
    msg(&mut buf, NLMSG_NOOP, 0, 0, 0, &[]);
    msg(&mut buf, NLMSG_ERROR, 0, 0, 0, &nlmsgerr(-libc::EPERM));
    let data = ptr::addr_of_mut!(seen).cast();
    // array covers NOOP (1) with our handler: it stops before the error
    let ctl: [MnlCb; 2] = [None, Some(ctl_stop)];
    let ret = unsafe {
        mnl_cb_run2(
            buf.as_ptr().cast(),
            buf.len(),
            0,
            0,
            None,
            data,
            ctl.as_ptr(),
            2,
        )
    };
    assert_eq!(ret, MNL_CB_STOP);
    assert_eq!(seen, [0]);
    // array covers types 0..3 with no handlers: NOOP and ERROR are ignored
    let ctl: [MnlCb; 3] = [None, None, None];
    let ret = unsafe {
        mnl_cb_run2(
            buf.as_ptr().cast(),
            buf.len(),
            0,
            0,
            None,
            data,
            ctl.as_ptr(),
            3,
        )
    };
    assert_eq!(ret, MNL_CB_OK);
}

#[test]
fn socket_ack_round_trip_and_truncation() {
    unsafe {
        let nl = mnl_socket_open(libc::NETLINK_ROUTE);
        assert!(!nl.is_null(), "socket: {}", std::io::Error::last_os_error());
        assert!(mnl_socket_get_fd(nl) >= 0);
        assert_eq!(mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID), 0);
        let portid = mnl_socket_get_portid(nl);
        assert_ne!(portid, 0);

        // the kernel ACKs a control message that asks for it
        let mut req = Buf::new(64);
        let send_noop = |req: &mut Buf, seq: u32| {
            let nlh = mnl_nlmsg_put_header(req.nlh().cast());
            (*nlh).nlmsg_type = NLMSG_NOOP;
            (*nlh).nlmsg_flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
            (*nlh).nlmsg_seq = seq;
            assert_eq!(mnl_socket_sendto(nl, nlh.cast(), 16), 16);
        };

        // too small a buffer: the datagram is truncated -> ENOSPC
        send_noop(&mut req, 1);
        let mut small = Buf::new(8);
        assert_eq!(mnl_socket_recvfrom(nl, small.nlh().cast(), 8), -1);
        assert_eq!(errno(), libc::ENOSPC);

        send_noop(&mut req, 2);
        let mut resp = Buf::new(8192);
        let n = mnl_socket_recvfrom(nl, resp.nlh().cast(), 8192);
        assert!(n >= 36, "recv: {n} {}", std::io::Error::last_os_error());
        let ret = mnl_cb_run(
            resp.nlh().cast(),
            n as usize,
            2,
            portid,
            None,
            ptr::null_mut(),
        );
        assert_eq!(ret, MNL_CB_STOP);
        // wrong sequence number expected
        let ret = mnl_cb_run(
            resp.nlh().cast(),
            n as usize,
            3,
            portid,
            None,
            ptr::null_mut(),
        );
        assert_eq!((ret, errno()), (MNL_CB_ERROR, libc::EPROTO));

        // setsockopt / getsockopt at SOL_NETLINK (NETLINK_EXT_ACK = 11)
        let mut one: c_int = 1;
        let len = size_of::<c_int>() as socklen_t;
        assert_eq!(
            mnl_socket_setsockopt(nl, 11, ptr::addr_of_mut!(one).cast(), len),
            0
        );
        let mut got: c_int = 0;
        let mut got_len = len;
        assert_eq!(
            mnl_socket_getsockopt(nl, 11, ptr::addr_of_mut!(got).cast(), &mut got_len),
            0
        );
        assert_eq!(got, 1);

        assert_eq!(mnl_socket_close(nl), 0);
    }
}

#[test]
fn socket_open_bad_bus_fails() {
    assert!(mnl_socket_open(1000).is_null());
    assert!(mnl_socket_fdopen(-1).is_null());
}
