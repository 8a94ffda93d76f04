//! mnl_nlmsg_*: header, extra header, payload pointers, ok/next, seq/portid checks.

use super::*;

/// A message header with the given fields, then `extra` bytes.
fn header(len: u32, seq: u32, pid: u32, extra: usize) -> Vec<u8> {
    let mut m = nlmsg(0x10, 0, seq, pid, &vec![0x11; extra]);
    m[..4].copy_from_slice(&len.to_ne_bytes());
    m
}

const ODD_LENS: &[u32] = &[
    0,
    1,
    3,
    4,
    15,
    16,
    17,
    19,
    20,
    21,
    64,
    255,
    4096,
    65535,
    65536,
    0x7fff_fffc,
    0x7fff_ffff,
];

#[test]
fn put_header_and_extra_header() {
    // buffer full of junk: the header and the extra header must be zeroed, nothing else touched
    let junk = vec![0xffu8; 64];
    for size in [0usize, 1, 2, 3, 4, 5, 7, 8, 12, 20] {
        same(
            format!("put_header + extra {size}"),
            &junk,
            |api, b| unsafe {
                let nlh = (api.mnl_nlmsg_put_header)(b.cast());
                let extra = (api.mnl_nlmsg_put_extra_header)(nlh, size);
                let extra2 = (api.mnl_nlmsg_put_extra_header)(nlh, size + 1);
                (off(b, nlh), off(b, extra), off(b, extra2))
            },
        );
    }
    // an extra header behind a message whose length is not a multiple of 4
    for len in [16u32, 17, 18, 19, 21, 22, 23] {
        same(
            format!("extra header at length {len}"),
            &junk,
            |api, b| unsafe {
                let nlh = (api.mnl_nlmsg_put_header)(b.cast());
                (*nlh).nlmsg_len = len;
                let extra = (api.mnl_nlmsg_put_extra_header)(nlh, 5);
                off(b, extra)
            },
        );
    }
}

#[test]
fn size_and_payload_pointers() {
    for n in [0usize, 1, 3, 4, 100, usize::MAX - 16, usize::MAX] {
        same(format!("nlmsg_size({n})"), &[], |api, _| unsafe {
            (api.mnl_nlmsg_size)(n)
        });
    }
    for &len in ODD_LENS.iter().chain(&[0x8000_0000, 0xffff_ffff]) {
        let input = header(len, 0, 0, 16);
        same(
            format!("payload of nlmsg_len {len}"),
            &input,
            |api, b| unsafe {
                let nlh = b.cast::<NlMsgHdr>();
                let mut offsets = Vec::new();
                for o in [0usize, 1, 3, 4, 5, 8, 17] {
                    offsets.push(off(b, (api.mnl_nlmsg_get_payload_offset)(nlh, o)));
                }
                (
                    (api.mnl_nlmsg_get_payload_len)(nlh),
                    off(b, (api.mnl_nlmsg_get_payload)(nlh)),
                    off(b, (api.mnl_nlmsg_get_payload_tail)(nlh)),
                    offsets,
                )
            },
        );
    }
}

#[test]
fn ok_and_next_at_buffer_ends() {
    let lens = [
        -100,
        -1,
        0,
        1,
        15,
        16,
        17,
        19,
        20,
        21,
        24,
        64,
        4096,
        c_int::MAX,
    ];
    for &nlmsg_len in ODD_LENS {
        let input = header(nlmsg_len, 0, 0, 8);
        for len in lens {
            same(
                format!("ok/next nlmsg_len {nlmsg_len} len {len}"),
                &input,
                |api, b| unsafe {
                    let nlh = b.cast::<NlMsgHdr>();
                    let ok = (api.mnl_nlmsg_ok)(nlh, len);
                    let mut left = len;
                    let next = (api.mnl_nlmsg_next)(nlh, &mut left);
                    (ok, off(b, next), left)
                },
            );
        }
    }
}

/// The one deliberate divergence (see the module docs of main.rs).
#[test]
fn nlmsg_ok_huge_length_is_the_one_divergence() {
    for nlmsg_len in [0x8000_0000u32, 0x8000_0010, 0xffff_fff0, 0xffff_ffff] {
        let input = header(nlmsg_len, 0, 0, 8);
        let ok = |api: &Api| {
            run_on(api, &input, |api, b| unsafe {
                (api.mnl_nlmsg_ok)(b.cast(), 24)
            })
        };
        assert!(
            ok(real()).ret,
            "libmnl 1.0.4 accepts nlmsg_len {nlmsg_len:#x} (RUSTSEC-2025-0142)"
        );
        assert!(!ok(ours()).ret, "mnl-impl rejects nlmsg_len {nlmsg_len:#x}");
    }
}

#[test]
fn seq_and_portid_checks() {
    let values = [0u32, 1, 2, 0x7fff_ffff, 0x8000_0000, u32::MAX];
    for got in values {
        for want in values {
            let input = header(16, got, got, 0);
            same(
                format!("seq/portid {got} vs {want}"),
                &input,
                |api, b| unsafe {
                    let nlh = b.cast::<NlMsgHdr>();
                    (
                        (api.mnl_nlmsg_seq_ok)(nlh, want),
                        (api.mnl_nlmsg_portid_ok)(nlh, want),
                    )
                },
            );
        }
    }
}
