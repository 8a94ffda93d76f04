//! mnl_attr_put*: every putter, the _check variants at and around the buffer's end, nests
//! (start/_check, end, cancel, nested nests), on buffers full of junk, as seeded random
//! sequences; and attributes too long for `nla_len`.

use super::*;
use std::ffi::CString;

const BUF: usize = 512;

/// FNV-1a of the buffer: logged after every step so a difference that a later step overwrites
/// still shows, at the step that made it.
fn hash(b: *const u8, len: usize) -> u64 {
    let bytes = unsafe { std::slice::from_raw_parts(b, len) };
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One step of a putter sequence, decided by the seeded generator before either side runs.
#[derive(Debug, Clone)]
enum Op {
    Put(u16, Vec<u8>),
    U8(u16, u8),
    U16(u16, u16),
    U32(u16, u32),
    U64(u16, u64),
    Str(u16, CString),
    Strz(u16, CString),
    /// the _check variant of op `which` (0 put, 1..=4 u8..u64, 5 str, 6 strz), buflen = the
    /// length after the put + `slop` (negative: does not fit)
    Check(u8, u16, Vec<u8>, isize),
    NestStart(u16),
    NestStartCheck(u16, isize),
    NestEnd,
    NestCancel,
    /// a message length that is not a multiple of 4 (what a put after it does with it)
    OddLen(u32),
}

fn random_op(rng: &mut Rng) -> Op {
    let ty = match rng.below(3) {
        0 => rng.below(16) as u16,
        1 => rng.u64() as u16,
        _ => rng.below(16) as u16 | 0x8000,
    };
    let data = |rng: &mut Rng| {
        let n = [0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 31][rng.below(11) as usize];
        rng.bytes(n)
    };
    let cstr = |rng: &mut Rng| {
        let s: Vec<u8> = (0..rng.below(10))
            .map(|_| b'a' + rng.below(26) as u8)
            .collect();
        CString::new(s).unwrap()
    };
    let slop = |rng: &mut Rng| [-5, -4, -3, -2, -1, 0, 1, 2, 3, 4][rng.below(10) as usize];
    match rng.below(14) {
        0 => Op::Put(ty, data(rng)),
        1 => Op::U8(ty, rng.u64() as u8),
        2 => Op::U16(ty, rng.u64() as u16),
        3 => Op::U32(ty, rng.u64() as u32),
        4 => Op::U64(ty, rng.u64()),
        5 => Op::Str(ty, cstr(rng)),
        6 => Op::Strz(ty, cstr(rng)),
        7 | 8 => {
            let which = rng.below(7) as u8;
            let d = if which >= 5 {
                cstr(rng).into_bytes_with_nul()
            } else {
                data(rng)
            };
            Op::Check(which, ty, d, slop(rng))
        }
        9 | 10 => Op::NestStart(ty),
        11 => Op::NestStartCheck(ty, slop(rng)),
        12 => Op::NestEnd,
        _ if rng.chance(30) => Op::OddLen(16 + rng.below(40) as u32),
        _ => Op::NestCancel,
    }
}

/// Zeroes the padding after an attribute of `len` payload bytes put at `tail`: libmnl 1.0.4
/// leaves it as the buffer had it, mnl-impl zeroes it (`padding_is_zeroed_unlike_libmnl_1_0_4`);
/// everything else must be the same bytes.
unsafe fn zero_padding(tail: *mut u8, len: usize) {
    unsafe { std::ptr::write_bytes(tail.add(4 + len), 0, len.next_multiple_of(4) - len) };
}

/// Runs `op`; returns what it returned (bool or nest offset) for the log.
unsafe fn apply(api: &Api, b: *mut u8, nests: &mut Vec<*mut NlAttr>, op: &Op) -> String {
    let nlh = b.cast::<NlMsgHdr>();
    let len = unsafe { (*nlh).nlmsg_len } as isize;
    let tail = unsafe { b.add((len as usize).next_multiple_of(4)) };
    let buflen = |payload: usize, slop: isize| (len + 4 + payload as isize + slop).max(0) as usize;
    let put_len = match op {
        Op::Put(_, d) => d.len(),
        Op::U8(..) => 1,
        Op::U16(..) => 2,
        Op::U32(..) => 4,
        Op::U64(..) => 8,
        Op::Str(_, s) => s.as_bytes().len(),
        Op::Strz(_, s) => s.as_bytes_with_nul().len(),
        Op::Check(which, _, d, _) => {
            [d.len(), 1, 2, 4, 8, d.len().saturating_sub(1), d.len()][*which as usize]
        }
        _ => 0,
    };
    unsafe {
        match op {
            Op::Put(t, d) => (api.mnl_attr_put)(nlh, *t, d.len(), d.as_ptr().cast()),
            Op::U8(t, v) => (api.mnl_attr_put_u8)(nlh, *t, *v),
            Op::U16(t, v) => (api.mnl_attr_put_u16)(nlh, *t, *v),
            Op::U32(t, v) => (api.mnl_attr_put_u32)(nlh, *t, *v),
            Op::U64(t, v) => (api.mnl_attr_put_u64)(nlh, *t, *v),
            Op::Str(t, s) => (api.mnl_attr_put_str)(nlh, *t, s.as_ptr()),
            Op::Strz(t, s) => (api.mnl_attr_put_strz)(nlh, *t, s.as_ptr()),
            Op::Check(which, t, d, slop) => {
                let p = d.as_ptr();
                let r = match which {
                    0 => {
                        (api.mnl_attr_put_check)(nlh, buflen(d.len(), *slop), *t, d.len(), p.cast())
                    }
                    1 => (api.mnl_attr_put_u8_check)(nlh, buflen(1, *slop), *t, d.len() as u8),
                    2 => (api.mnl_attr_put_u16_check)(nlh, buflen(2, *slop), *t, 0x1234),
                    3 => (api.mnl_attr_put_u32_check)(nlh, buflen(4, *slop), *t, 0xdead_beef),
                    4 => (api.mnl_attr_put_u64_check)(nlh, buflen(8, *slop), *t, u64::MAX - 1),
                    5 => {
                        (api.mnl_attr_put_str_check)(nlh, buflen(d.len() - 1, *slop), *t, p.cast())
                    }
                    _ => (api.mnl_attr_put_strz_check)(nlh, buflen(d.len(), *slop), *t, p.cast()),
                };
                if r {
                    zero_padding(tail, put_len);
                }
                return format!("check {r}");
            }
            Op::NestStart(t) => {
                let n = (api.mnl_attr_nest_start)(nlh, *t);
                nests.push(n);
                return format!("nest {:?}", off(b, n));
            }
            Op::NestStartCheck(t, slop) => {
                let n = (api.mnl_attr_nest_start_check)(nlh, buflen(0, *slop), *t);
                if !n.is_null() {
                    nests.push(n);
                }
                return format!("nest_check {:?}", off(b, n));
            }
            Op::NestEnd => {
                if let Some(n) = nests.pop() {
                    (api.mnl_attr_nest_end)(nlh, n);
                }
            }
            Op::NestCancel => {
                if let Some(n) = nests.pop() {
                    (api.mnl_attr_nest_cancel)(nlh, n);
                }
            }
            Op::OddLen(l) => (*nlh).nlmsg_len = (*l).max(len as u32),
        }
        if matches!(
            op,
            Op::Put(..) | Op::U8(..) | Op::U16(..) | Op::U32(..) | Op::U64(..)
        ) || matches!(op, Op::Str(..) | Op::Strz(..))
        {
            zero_padding(tail, put_len);
        }
    }
    String::new()
}

/// Runs a whole sequence from a junk-filled buffer: header, extra header, then `ops` while they
/// fit (the unchecked putters write wherever the message ends, as in libmnl).
fn run_ops(what: &str, junk: &[u8], extra: usize, ops: &[Op]) {
    same(what, junk, |api, b| unsafe {
        let nlh = (api.mnl_nlmsg_put_header)(b.cast());
        (api.mnl_nlmsg_put_extra_header)(nlh, extra);
        let mut nests = Vec::new();
        let mut log = Vec::new();
        for op in ops {
            if (*nlh).nlmsg_len as usize + 64 > BUF {
                break;
            }
            let r = apply(api, b, &mut nests, op);
            log.push(format!(
                "{r} len {} hash {:x}",
                (*nlh).nlmsg_len,
                hash(b, BUF + SLACK)
            ));
        }
        while let Some(n) = nests.pop() {
            (api.mnl_attr_nest_end)(nlh, n);
        }
        log
    });
}

#[test]
fn each_putter_on_junk() {
    let junk = vec![0xeeu8; BUF];
    let s = CString::new("abcde").unwrap();
    let e = CString::new("").unwrap();
    let ops = [
        Op::Put(1, vec![]),
        Op::Put(2, vec![1, 2, 3]),
        Op::U8(3, 0xab),
        Op::U16(4, 0xbeef),
        Op::U32(5, 0xdead_beef),
        Op::U64(6, 0x0102_0304_0506_0708),
        Op::Str(7, s.clone()),
        Op::Strz(8, s.clone()),
        Op::Str(9, e.clone()),
        Op::Strz(10, e.clone()),
        Op::NestStart(11),
        Op::U32(1, 7),
        Op::NestStart(2),
        Op::NestEnd,
        Op::NestEnd,
        Op::NestStart(12),
        Op::U8(1, 1),
        Op::NestCancel,
    ];
    for extra in [0, 1, 4, 5] {
        for n in 1..=ops.len() {
            run_ops(
                &format!("extra {extra}, first {n} puts"),
                &junk,
                extra,
                &ops[..n],
            );
        }
    }
}

#[test]
fn check_putters_at_the_edge() {
    let junk = vec![0x5au8; BUF];
    for which in 0..7u8 {
        for len in [0usize, 1, 2, 3, 4, 5, 8] {
            for slop in -5..=4 {
                let mut d = vec![b'x'; len];
                if which >= 5 {
                    d.push(0);
                }
                let ops = [Op::Check(which, 3, d, slop), Op::NestStartCheck(4, slop)];
                run_ops(
                    &format!("check {which} len {len} slop {slop}"),
                    &junk,
                    1,
                    &ops,
                );
            }
        }
    }
    // buflen 0 and SIZE_MAX
    same("check buflen extremes", &junk, |api, b| unsafe {
        let nlh = (api.mnl_nlmsg_put_header)(b.cast());
        let d = [1u8; 4];
        let r = [
            (api.mnl_attr_put_check)(nlh, 0, 1, 4, d.as_ptr().cast()),
            (api.mnl_attr_put_check)(nlh, usize::MAX, 1, 4, d.as_ptr().cast()),
        ];
        (r, off(b, (api.mnl_attr_nest_start_check)(nlh, 0, 1)))
    });
}

#[test]
fn random_putter_sequences() {
    let mut rng = Rng::new(0x7075_745f_7365_7173);
    for i in 0..300 {
        let junk = rng.bytes(BUF);
        let extra = rng.below(9) as usize;
        let ops: Vec<Op> = (0..rng.below(40)).map(|_| random_op(&mut rng)).collect();
        run_ops(&format!("random sequence {i}: {ops:?}"), &junk, extra, &ops);
    }
}

/// `nla_len` is 16 bits: libmnl truncates the length of a longer attribute (and grows the
/// message by the truncated, aligned length) while still copying all of the payload.
#[test]
fn attribute_longer_than_nla_len() {
    const BIG: usize = 70_000;
    let data = vec![0x77u8; BIG];
    let junk = vec![0x11u8; 2 * BIG + 64]; // room for two whole copies either way
    for len in [
        65_526usize,
        65_527,
        65_530,
        65_531,
        65_532,
        65_533,
        65_535,
        65_536,
        65_540,
    ] {
        same(format!("put of {len} bytes"), &junk, |api, b| unsafe {
            let nlh = (api.mnl_nlmsg_put_header)(b.cast());
            (api.mnl_attr_put)(nlh, 1, len, data.as_ptr().cast());
            zero_padding(b.add(16), len);
            let tail = (api.mnl_nlmsg_get_payload_tail)(nlh).cast::<u8>();
            (api.mnl_attr_put_u8)(nlh, 2, 9);
            zero_padding(tail, 1);
            let nest = (api.mnl_attr_nest_start)(nlh, 3);
            let tail = (api.mnl_nlmsg_get_payload_tail)(nlh).cast::<u8>();
            (api.mnl_attr_put)(nlh, 1, len, data.as_ptr().cast());
            zero_padding(tail, len);
            (api.mnl_attr_nest_end)(nlh, nest);
            (*nlh).nlmsg_len
        });
    }
}
/// The one byte-level difference of the putters (see `mnl_attr_put` in mnl-impl).
#[test]
fn padding_is_zeroed_unlike_libmnl_1_0_4() {
    let junk = vec![0xeeu8; 48];
    let put = |api: &Api| {
        run_on(api, &junk, |api, b| unsafe {
            let nlh = (api.mnl_nlmsg_put_header)(b.cast());
            (api.mnl_attr_put)(nlh, 2, 3, [1u8, 2, 3].as_ptr().cast());
            (api.mnl_attr_put_strz)(nlh, 3, c"ab".as_ptr());
        })
        .bytes[16..32]
            .to_vec()
    };
    let attrs = |pad: u8| [7, 0, 2, 0, 1, 2, 3, pad, 7, 0, 3, 0, b'a', b'b', 0, pad];
    assert_eq!(put(real()), attrs(0xee), "libmnl 1.0.4 leaves the padding");
    assert_eq!(put(ours()), attrs(0), "mnl-impl zeroes the padding");
}
