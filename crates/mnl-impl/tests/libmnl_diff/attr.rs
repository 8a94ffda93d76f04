//! mnl_attr_* readers: getters, ok/next, type_valid, validate/validate2 with every type, and
//! parse/parse_nested/parse_payload over well-formed, malformed and random attribute streams.

use super::*;

/// What the attribute callback sees and does; `data` of `log_attr`.
pub struct AttrLog<'a> {
    pub api: &'a Api,
    pub base: *const u8,
    /// bytes readable from `base` (input + slack): libmnl reads a whole attribute only when
    /// validating a NUL string or parsing a nest, which must not leave the buffer
    pub limit: usize,
    /// return values for successive callbacks, cycled (empty: always MNL_CB_OK)
    pub rets: Vec<c_int>,
    pub calls: usize,
    pub depth: usize,
    pub log: Vec<String>,
}

impl<'a> AttrLog<'a> {
    pub fn new(api: &'a Api, base: *const u8, input_len: usize, rets: Vec<c_int>) -> Self {
        AttrLog {
            api,
            base,
            limit: input_len + SLACK,
            rets,
            calls: 0,
            depth: 0,
            log: Vec::new(),
        }
    }
    pub fn data(&mut self) -> *mut c_void {
        (self as *mut Self).cast()
    }
}

/// Everything libnftnl does with an attribute, logged: getters, type_valid, validate with every
/// type (and out-of-range ones), validate2, and a nested parse where validate says NESTED.
pub unsafe extern "C" fn log_attr(attr: *const NlAttr, data: *mut c_void) -> c_int {
    let l = unsafe { &mut *data.cast::<AttrLog>() };
    let api = l.api;
    let mut e = Vec::new();
    let at = off(l.base, attr).unwrap() as usize;
    // (the extent libmnl assumes: header + payload length, which wraps for nla_len < 4)
    let in_bounds =
        unsafe { at + 4 + usize::from((api.mnl_attr_get_payload_len)(attr)) <= l.limit };
    unsafe {
        e.push(format!("at {:?}", off(l.base, attr)));
        e.push(format!(
            "type {} len {} payload_len {} payload {:?}",
            (api.mnl_attr_get_type)(attr),
            (api.mnl_attr_get_len)(attr),
            (api.mnl_attr_get_payload_len)(attr),
            off(l.base, (api.mnl_attr_get_payload)(attr)),
        ));
        e.push(format!(
            "u8 {} u16 {} u32 {} u64 {} str {:?} next {:?}",
            (api.mnl_attr_get_u8)(attr),
            (api.mnl_attr_get_u16)(attr),
            (api.mnl_attr_get_u32)(attr),
            (api.mnl_attr_get_u64)(attr),
            off(l.base, (api.mnl_attr_get_str)(attr)),
            off(l.base, (api.mnl_attr_next)(attr)),
        ));
        for max in [0u16, 1, 3, 16, 0x3fff, u16::MAX] {
            set_errno(api, ERRNO_BEFORE);
            let r = (api.mnl_attr_type_valid)(attr, max);
            e.push(format!("type_valid({max}) {r} errno {}", get_errno(api)));
        }
        for ty in [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 1000] {
            if ty == 10 && !in_bounds {
                continue; // MNL_TYPE_NUL_STRING reads the payload's last byte
            }
            set_errno(api, ERRNO_BEFORE);
            let r = (api.mnl_attr_validate)(attr, ty);
            let mut line = format!("validate({ty}) {r} errno {}", get_errno(api));
            for exp in [0usize, 1, 2, 4, 8, 16, 65535, usize::MAX] {
                set_errno(api, ERRNO_BEFORE);
                let r = (api.mnl_attr_validate2)(attr, ty, exp);
                line += &format!(" v2({exp}) {r}/{}", get_errno(api));
            }
            e.push(line);
        }
        let nested = (api.mnl_attr_validate)(attr, 8) == 0;
        l.log.extend(e);
        if nested && in_bounds && l.depth < 3 {
            l.depth += 1;
            set_errno(api, ERRNO_BEFORE);
            let r = (api.mnl_attr_parse_nested)(attr, Some(log_attr), data);
            l.depth -= 1;
            l.log
                .push(format!("nested -> {r} errno {}", get_errno(api)));
        }
    }
    let ret = if l.rets.is_empty() {
        1
    } else {
        l.rets[l.calls % l.rets.len()]
    };
    l.calls += 1;
    ret
}

/// A random attribute stream: mostly sane attributes (some nested), some with lying lengths.
pub fn random_attrs(rng: &mut Rng, depth: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.below(6) {
        let ty = match rng.below(4) {
            0 => rng.below(8) as u16,
            1 => rng.below(8) as u16 | 0x8000,
            2 => rng.below(8) as u16 | 0x4000,
            _ => rng.u64() as u16,
        };
        let mut a = if depth > 0 && rng.chance(25) {
            let inner = random_attrs(rng, depth - 1);
            nlattr(ty | 0x8000, &inner)
        } else {
            let n = [0, 1, 2, 3, 4, 5, 8, 9, 16][rng.below(9) as usize];
            let mut p = rng.bytes(n);
            if n > 0 && rng.chance(40) {
                p[n - 1] = 0; // a NUL-terminated string
            }
            nlattr(ty, &p)
        };
        if rng.chance(15) {
            // lie about the length
            let bad = [0u16, 1, 3, 4, 5, 7, 0xfff, 0xffff][rng.below(8) as usize];
            a[..2].copy_from_slice(&bad.to_ne_bytes());
        }
        out.extend(a);
    }
    if rng.chance(20) {
        out.truncate(rng.below(out.len() as u64 + 1) as usize);
    }
    out
}

/// The three parse entry points over one attribute stream, with callback return values `rets`.
fn parse_all(what: &str, stream: &[u8], rets: &[c_int]) {
    // as a message: header, 4-byte extra header, the stream
    let mut msg = nlmsg(0x10, 0, 0, 0, &[&[9u8, 0, 0, 0][..], stream].concat());
    msg[..4].copy_from_slice(&(20 + stream.len() as u32).to_ne_bytes());
    for offset in [0u32, 1, 4, 5, 8] {
        same(
            format!("{what}: parse offset {offset}"),
            &msg,
            |api, b| unsafe {
                let mut l = AttrLog::new(api, b, msg.len(), rets.to_vec());
                let r = (api.mnl_attr_parse)(b.cast(), offset, Some(log_attr), l.data());
                (r, l.log)
            },
        );
    }
    for len in [0, 1, 3, 4, stream.len().saturating_sub(1), stream.len()] {
        same(
            format!("{what}: parse_payload {len}"),
            stream,
            |api, b| unsafe {
                let mut l = AttrLog::new(api, b, stream.len(), rets.to_vec());
                let r = (api.mnl_attr_parse_payload)(b.cast(), len, Some(log_attr), l.data());
                (r, l.log)
            },
        );
    }
    let nest = nlattr(0x8001, stream);
    same(format!("{what}: parse_nested"), &nest, |api, b| unsafe {
        let mut l = AttrLog::new(api, b, nest.len(), rets.to_vec());
        let r = (api.mnl_attr_parse_nested)(b.cast(), Some(log_attr), l.data());
        (r, l.log)
    });
}

#[test]
fn single_attributes_every_length() {
    // every nla_len (lying or not) and payload content of interest, alone in its buffer
    for nla_len in (0u16..=24).chain([255, 256, 0x7fff, 0xfffc, 0xffff]) {
        for fill in [0u8, b'a', 0xff] {
            let mut input = vec![fill; 24];
            input[..2].copy_from_slice(&nla_len.to_ne_bytes());
            input[2..4].copy_from_slice(&0xc003u16.to_ne_bytes());
            if fill == b'a' {
                input[nla_len.clamp(4, 23) as usize] = 0;
            }
            same(
                format!("attr nla_len {nla_len} fill {fill}"),
                &input,
                |api, b| unsafe {
                    let mut l = AttrLog::new(api, b, input.len(), vec![]);
                    log_attr(b.cast(), l.data());
                    let oks: Vec<bool> = [-1, 0, 3, 4, 5, 8, 24, 65535]
                        .iter()
                        .map(|&len| (api.mnl_attr_ok)(b.cast(), len))
                        .collect();
                    (l.log, oks)
                },
            );
        }
    }
}

#[test]
fn parse_well_formed_and_stopping() {
    let stream = [
        nlattr(1, &[0xab]),
        nlattr(2, &0xbeefu16.to_ne_bytes()),
        nlattr(3, &0xdead_beefu32.to_ne_bytes()),
        nlattr(4, &0x0102_0304_0506_0708u64.to_ne_bytes()),
        nlattr(5, b"abcde"),
        nlattr(6, b"abcde\0"),
        nlattr(7, &[]),
        nlattr(
            0x8008,
            &[nlattr(1, &7u32.to_ne_bytes()), nlattr(2, &[9])].concat(),
        ),
        nlattr(9, &[0; 12]),
    ]
    .concat();
    // callbacks returning OK, STOP, ERROR, and values above OK (returned as they are)
    for rets in [
        vec![],
        vec![1, 1, 0],
        vec![1, -1],
        vec![2],
        vec![1, 7, 3],
        vec![-5],
    ] {
        parse_all(&format!("well formed, rets {rets:?}"), &stream, &rets);
    }
}

#[test]
fn parse_random_streams() {
    let mut rng = Rng::new(0x6d6e_6c5f_6174_7472);
    for i in 0..400 {
        let stream = random_attrs(&mut rng, 2);
        let rets = match rng.below(5) {
            0 => vec![1, 1, 0],
            1 => vec![2, 1],
            _ => vec![],
        };
        parse_all(&format!("random stream {i} {stream:02x?}"), &stream, &rets);
    }
}
