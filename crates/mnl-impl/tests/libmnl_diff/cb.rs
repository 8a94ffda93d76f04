//! mnl_cb_run / mnl_cb_run2: crafted multi-part messages (NLMSG_DONE, NLMSG_ERROR with and
//! without an ack, truncated errors, NOOP/OVERRUN, interrupted dumps, wrong sequence number or
//! port id), callbacks stopping or failing, control arrays, every truncation of the stream, and
//! seeded random streams; the data callback parses each message's attributes as libnftnl does.

use super::attr::{AttrLog, log_attr, random_attrs};
use super::*;

const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const NLM_F_MULTI: u16 = 2;
const NLM_F_DUMP_INTR: u16 = 0x10;

/// `data` of `log_msg`.
struct MsgLog<'a> {
    api: &'a Api,
    base: *const u8,
    limit: usize,
    /// return values for successive callbacks, cycled (empty: MNL_CB_OK)
    rets: Vec<c_int>,
    calls: usize,
    log: Vec<String>,
}

unsafe extern "C" fn log_msg(nlh: *const NlMsgHdr, data: *mut c_void) -> c_int {
    let l = unsafe { &mut *data.cast::<MsgLog>() };
    let api = l.api;
    let h = unsafe { *nlh };
    l.log.push(format!("msg at {:?}: {h:?}", off(l.base, nlh)));
    if h.nlmsg_type >= 0x10 {
        // the attributes after a 4-byte nfgenmsg, as libnftnl's parsers read them
        let mut a = AttrLog::new(api, l.base, l.limit - SLACK, vec![]);
        let r = unsafe { (api.mnl_attr_parse)(nlh, 4, Some(log_attr), a.data()) };
        l.log.extend(a.log);
        l.log.push(format!("parse -> {r}"));
    }
    let ret = if l.rets.is_empty() {
        1
    } else {
        l.rets[l.calls % l.rets.len()]
    };
    l.calls += 1;
    ret
}

/// A control-callback array of `n` entries: `log_msg` where `mask` has the type's bit, else NULL.
fn ctl_array(n: usize, mask: u32) -> Vec<MnlCb> {
    (0..n)
        .map(|t| (mask & (1 << t) != 0).then_some(log_msg as unsafe extern "C" fn(_, _) -> _))
        .collect()
}

/// One run over `stream[..numbytes]` on both sides: `None` ctl = `mnl_cb_run`.
#[allow(clippy::too_many_arguments)]
fn run(
    what: &str,
    stream: &[u8],
    numbytes: usize,
    seq: u32,
    portid: u32,
    rets: &[c_int],
    ctl: Option<&[MnlCb]>,
    data_cb: bool,
) {
    same(what, stream, |api, b| unsafe {
        let mut l = MsgLog {
            api,
            base: b,
            limit: stream.len() + SLACK,
            rets: rets.to_vec(),
            calls: 0,
            log: vec![],
        };
        let cb: MnlCb = if data_cb { Some(log_msg) } else { None };
        let data = (&mut l as *mut MsgLog).cast();
        let r = match ctl {
            None => (api.mnl_cb_run)(b.cast(), numbytes, seq, portid, cb, data),
            Some(a) => (api.mnl_cb_run2)(
                b.cast(),
                numbytes,
                seq,
                portid,
                cb,
                data,
                a.as_ptr(),
                a.len() as c_uint,
            ),
        };
        (r, l.log)
    });
}

fn error_msg(error: i32, seq: u32, pid: u32, tail: usize) -> Vec<u8> {
    let mut p = error.to_ne_bytes().to_vec();
    p.extend(nlmsg(0x0a00, 5, seq, pid, &[]));
    p.truncate(4 + tail);
    nlmsg(NLMSG_ERROR, 0, seq, pid, &p)
}

fn data_msg(ty: u16, flags: u16, seq: u32, pid: u32) -> Vec<u8> {
    let attrs = [
        nlattr(1, b"filter\0"),
        nlattr(2, &7u32.to_be_bytes()),
        nlattr(0x8003, &nlattr(1, &[1, 2])),
    ]
    .concat();
    nlmsg(ty, flags, seq, pid, &[&[2u8, 0, 0, 0][..], &attrs].concat())
}

#[test]
fn crafted_multipart_streams() {
    let d = |seq, pid| data_msg(0x0a00, NLM_F_MULTI, seq, pid);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "dump then DONE",
            [
                d(5, 9),
                d(5, 9),
                nlmsg(NLMSG_DONE, NLM_F_MULTI, 5, 9, &[0; 4]),
            ]
            .concat(),
        ),
        ("ack", error_msg(0, 5, 9, 16)),
        ("ack without the echoed header", error_msg(0, 5, 9, 0)),
        (
            "error ENOENT",
            [d(5, 9), error_msg(-libc::ENOENT, 5, 9, 16)].concat(),
        ),
        ("error positive EACCES", error_msg(libc::EACCES, 5, 9, 16)),
        ("error INT_MIN", error_msg(i32::MIN, 5, 9, 16)),
        (
            "error truncated",
            [d(5, 9), error_msg(-1, 5, 9, 15)].concat(),
        ),
        ("error no payload", nlmsg(NLMSG_ERROR, 0, 5, 9, &[])),
        (
            "noop overrun then data",
            [
                nlmsg(NLMSG_NOOP, 0, 5, 9, &[]),
                nlmsg(NLMSG_OVERRUN, 0, 5, 9, &[]),
                d(5, 9),
            ]
            .concat(),
        ),
        (
            "types 0 and 5..15",
            (0..16)
                .filter(|t| ![2, 3].contains(t))
                .flat_map(|t| nlmsg(t, 0, 5, 9, &[1, 2]))
                .collect(),
        ),
        ("bad seq", [d(5, 9), d(6, 9)].concat()),
        ("bad portid", [d(5, 9), d(5, 10)].concat()),
        (
            "seq and portid 0 match anything",
            [d(0, 0), d(0, 9), d(5, 0)].concat(),
        ),
        (
            "interrupted dump",
            [
                d(5, 9),
                data_msg(0x0a00, NLM_F_MULTI | NLM_F_DUMP_INTR, 5, 9),
            ]
            .concat(),
        ),
        (
            "DONE first",
            [nlmsg(NLMSG_DONE, 0, 5, 9, &[]), d(5, 9)].concat(),
        ),
    ];
    for (name, stream) in &cases {
        for (seq, portid) in [(5, 9), (0, 0), (6, 9), (5, 10)] {
            for rets in [vec![], vec![1, 0], vec![-1], vec![2], vec![1, 1, 1, -5]] {
                let what = format!("{name} seq {seq} portid {portid} rets {rets:?}");
                run(&what, stream, stream.len(), seq, portid, &rets, None, true);
                run(
                    &format!("{what}, no data cb"),
                    stream,
                    stream.len(),
                    seq,
                    portid,
                    &rets,
                    None,
                    false,
                );
                for (n, mask) in [
                    (0, 0),
                    (2, 0b11),
                    (4, 0b1100),
                    (16, 0xffff),
                    (20, 0b1010),
                    (16, 0),
                ] {
                    let ctl = ctl_array(n, mask);
                    run(
                        &format!("{what}, ctl {n} {mask:#x}"),
                        stream,
                        stream.len(),
                        seq,
                        portid,
                        &rets,
                        Some(&ctl),
                        true,
                    );
                }
            }
        }
        // every truncation of the stream
        for numbytes in 0..=stream.len() {
            run(
                &format!("{name} first {numbytes} bytes"),
                stream,
                numbytes,
                5,
                9,
                &[],
                None,
                true,
            );
        }
    }
}

/// A random message: any type (data, control, unknown), random flags, seq/portid from a small
/// set, a random attribute payload or error, and sometimes a lying `nlmsg_len` (< 2^31).
fn random_msg(rng: &mut Rng) -> Vec<u8> {
    let ty = match rng.below(6) {
        0 => rng.below(0x20) as u16,
        1 => NLMSG_ERROR,
        2 => NLMSG_DONE,
        _ => 0x0a00 | rng.below(0x10) as u16,
    };
    let flags = if rng.chance(8) {
        NLM_F_DUMP_INTR
    } else {
        rng.u64() as u16 & !NLM_F_DUMP_INTR
    };
    let (seq, pid) = (rng.below(3) as u32, rng.below(3) as u32);
    let mut m = if ty == NLMSG_ERROR {
        let e = [0, -1, -2, -22, 13, i32::MIN][rng.below(6) as usize];
        error_msg(e, seq, pid, rng.below(17) as usize)
    } else {
        nlmsg(
            ty,
            flags,
            seq,
            pid,
            &[&rng.bytes(4)[..], &random_attrs(rng, 2)].concat(),
        )
    };
    if rng.chance(10) {
        let len = [0u32, 1, 15, 16, 17, 19, 0x7fff_ffff, m.len() as u32 + 4][rng.below(8) as usize];
        m[..4].copy_from_slice(&len.to_ne_bytes());
    }
    m
}

/// `numbytes`, cut before the first message (as libmnl walks the stream) whose `nlmsg_len` is
/// 2^31 or more: libmnl 1.0.4 would take it as fitting and read out of bounds (main.rs docs).
fn before_huge(stream: &[u8], numbytes: usize) -> usize {
    let mut at = 0usize;
    while numbytes - at >= 16 {
        let len = u32::from_ne_bytes(stream[at..at + 4].try_into().unwrap());
        if len >= 0x8000_0000 {
            return at;
        }
        if len < 16 || len as usize > numbytes - at {
            break;
        }
        at += (len as usize).next_multiple_of(4).min(numbytes - at);
    }
    numbytes
}

#[test]
fn random_streams() {
    let mut rng = Rng::new(0x6362_5f72_756e_3031);
    for i in 0..600 {
        let stream: Vec<u8> = (0..1 + rng.below(5))
            .flat_map(|_| random_msg(&mut rng))
            .collect();
        let numbytes = if rng.chance(30) {
            rng.below(stream.len() as u64 + 1) as usize
        } else {
            stream.len()
        };
        let numbytes = before_huge(&stream, numbytes);
        let (seq, portid) = (rng.below(3) as u32, rng.below(3) as u32);
        let rets = [vec![], vec![1, 2], vec![1, 1, 0], vec![1, -1]][rng.below(4) as usize].clone();
        let what = format!(
            "random stream {i} ({numbytes} of {stream:02x?}) seq {seq} portid {portid} rets {rets:?}"
        );
        run(&what, &stream, numbytes, seq, portid, &rets, None, true);
        let ctl = ctl_array(rng.below(20) as usize, rng.u64() as u32);
        run(
            &format!("{what}, ctl {}", ctl.len()),
            &stream,
            numbytes,
            seq,
            portid,
            &rets,
            Some(&ctl),
            rng.chance(80),
        );
    }
}
