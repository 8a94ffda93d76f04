//! libmnl equivalence: every function of crates/mnl-impl against the real libmnl (Debian's
//! `libmnl0`, `libmnl.so.0`, libmnl 1.0.4), called with the same inputs (well-formed, malformed,
//! truncated, overflowing, at buffer ends, plus seeded random ones); return values, errno and the
//! bytes of every buffer involved must be identical.
//!
//! # How the real libmnl gets into a static test binary
//!
//! This workspace links every binary, test binaries included, as static-pie (`+crt-static` in
//! .cargo/config.toml). glibc still supports `dlopen` from a static executable provided the
//! glibc at run time is the one it was linked with, which always holds for a test built and run
//! on the same host. Consequences, both handled here:
//! - `libmnl.so.0` gets its own copy of `libc.so.6`, so its `errno` is not ours: each side
//!   reads (and presets) errno through its own `__errno_location`; libmnl's comes from `dlsym`
//!   on libmnl's handle (resolved in the libc it loaded).
//! - No symbol interposition: a static executable has no dynamic symbol table, so libmnl's
//!   internal calls through its PLT (`mnl_attr_put_u32` -> `mnl_attr_put`, `mnl_cb_run` ->
//!   `mnl_nlmsg_ok`, ...) bind to libmnl's own definitions, never to mnl-impl's namesakes
//!   (`loads_the_real_library` checks the two sets of addresses differ).
//!
//! The alternative, a dynamically linked helper binary, would need a second cargo build with
//! other RUSTFLAGS (its own target dir) from inside the test: more moving parts for no gain.
//! A missing `libmnl.so.0` fails the test (never skips): `apt-get install libmnl0`.
//!
//! # Deliberate divergences (each pinned by its own test; everything else is identical)
//!
//! - libmnl 1.0.4's `mnl_nlmsg_ok` compares `(int)nlh->nlmsg_len <= len`, so a header claiming
//!   2 GiB or more passes as "fits" (RUSTSEC-2025-0142); mnl-impl says it does not
//!   (`nlmsg::nlmsg_ok_huge_length_is_the_one_divergence`). The random message streams are cut
//!   before such a header (with libmnl it makes `mnl_cb_run` read out of bounds).
//! - `mnl_attr_put` leaves the padding after a payload as the buffer had it in libmnl 1.0.4;
//!   mnl-impl zeroes it (`put::padding_is_zeroed_unlike_libmnl_1_0_4`). The putter comparisons
//!   zero those padding bytes on both sides after each put and compare everything else.
//! - `mnl_nlmsg_batch_reset` after an overflow: libmnl 1.0.4 memcpy's the overflowing message to
//!   the front and reads its length back after the copy overwrote it when the message is longer
//!   than the batch sent before it (the message is lost); mnl-impl keeps it
//!   (`batch::reset_carrying_a_longer_message_is_a_divergence`). libnftnl never calls reset.
//!
//! Set `MNL_DIFF_VERBOSE=1` to print both sides in full when a comparison fails.

mod attr;
mod batch;
mod cb;
mod nlmsg;
mod put;
mod socket;

use libc::{c_char, c_int, c_uint, c_void, pid_t, socklen_t};
use mnl_impl::{MnlAttrCb, MnlCb, MnlNlmsgBatch, MnlSocket, NlAttr, NlMsgHdr};
use std::fmt::Debug;
use std::sync::OnceLock;

/// `nm -u /usr/lib/x86_64-linux-gnu/libnftnl.a | grep mnl_ | sort -u` (libnftnl 1.2.4):
/// `libnftnl_symbols_are_all_covered` fails if a new libnftnl needs one more (or one less).
const LIBNFTNL_USES: &[&str] = &[
    "mnl_attr_get_payload",
    "mnl_attr_get_payload_len",
    "mnl_attr_get_str",
    "mnl_attr_get_type",
    "mnl_attr_get_u16",
    "mnl_attr_get_u32",
    "mnl_attr_get_u64",
    "mnl_attr_get_u8",
    "mnl_attr_nest_end",
    "mnl_attr_nest_start",
    "mnl_attr_next",
    "mnl_attr_ok",
    "mnl_attr_parse",
    "mnl_attr_parse_nested",
    "mnl_attr_put",
    "mnl_attr_put_str",
    "mnl_attr_put_strz",
    "mnl_attr_put_u16",
    "mnl_attr_put_u32",
    "mnl_attr_put_u64",
    "mnl_attr_put_u8",
    "mnl_attr_type_valid",
    "mnl_attr_validate",
    "mnl_cb_run",
    "mnl_nlmsg_batch_current",
    "mnl_nlmsg_batch_head",
    "mnl_nlmsg_batch_is_empty",
    "mnl_nlmsg_batch_next",
    "mnl_nlmsg_batch_size",
    "mnl_nlmsg_batch_start",
    "mnl_nlmsg_batch_stop",
    "mnl_nlmsg_get_payload",
    "mnl_nlmsg_put_extra_header",
    "mnl_nlmsg_put_header",
    "mnl_socket_bind",
    "mnl_socket_close",
    "mnl_socket_get_portid",
    "mnl_socket_open",
    "mnl_socket_recvfrom",
    "mnl_socket_sendto",
];

/// One implementation of the libmnl ABI: a function pointer per exported function, and the
/// `errno` it sets. `Api::ours()` is mnl-impl, `Api::real(handle)` libmnl.so.0.
macro_rules! api {
    ($($name:ident: fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        pub struct Api {
            pub name: &'static str,
            pub errno: unsafe extern "C" fn() -> *mut c_int,
            $(pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        impl Api {
            /// Every function both sides provide: libmnl's header minus `mnl_nlmsg_fprintf`.
            pub const NAMES: &[&str] = &[$(stringify!($name)),*];

            fn ours() -> Api {
                Api {
                    name: "mnl-impl",
                    errno: libc::__errno_location,
                    $($name: mnl_impl::$name,)*
                }
            }

            /// # Safety
            /// `h` is a live `dlopen` handle of libmnl.so.0.
            unsafe fn real(h: *mut c_void) -> Api {
                unsafe {
                    Api {
                        name: "libmnl.so.0",
                        errno: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> *mut c_int>(
                            sym(h, "__errno_location"),
                        ),
                        $($name: std::mem::transmute::<
                            *mut c_void,
                            unsafe extern "C" fn($($arg),*) $(-> $ret)?,
                        >(sym(h, stringify!($name))),)*
                    }
                }
            }

            /// The addresses of all functions (to check the two sides are different code).
            fn addresses(&self) -> Vec<usize> {
                vec![$(self.$name as usize),*]
            }
        }
    };
}

api! {
    mnl_nlmsg_size: fn(usize) -> usize;
    mnl_nlmsg_get_payload_len: fn(*const NlMsgHdr) -> usize;
    mnl_nlmsg_put_header: fn(*mut c_void) -> *mut NlMsgHdr;
    mnl_nlmsg_put_extra_header: fn(*mut NlMsgHdr, usize) -> *mut c_void;
    mnl_nlmsg_get_payload: fn(*const NlMsgHdr) -> *mut c_void;
    mnl_nlmsg_get_payload_offset: fn(*const NlMsgHdr, usize) -> *mut c_void;
    mnl_nlmsg_get_payload_tail: fn(*const NlMsgHdr) -> *mut c_void;
    mnl_nlmsg_ok: fn(*const NlMsgHdr, c_int) -> bool;
    mnl_nlmsg_next: fn(*const NlMsgHdr, *mut c_int) -> *mut NlMsgHdr;
    mnl_nlmsg_seq_ok: fn(*const NlMsgHdr, c_uint) -> bool;
    mnl_nlmsg_portid_ok: fn(*const NlMsgHdr, c_uint) -> bool;
    mnl_nlmsg_batch_start: fn(*mut c_void, usize) -> *mut MnlNlmsgBatch;
    mnl_nlmsg_batch_stop: fn(*mut MnlNlmsgBatch);
    mnl_nlmsg_batch_next: fn(*mut MnlNlmsgBatch) -> bool;
    mnl_nlmsg_batch_reset: fn(*mut MnlNlmsgBatch);
    mnl_nlmsg_batch_size: fn(*mut MnlNlmsgBatch) -> usize;
    mnl_nlmsg_batch_head: fn(*mut MnlNlmsgBatch) -> *mut c_void;
    mnl_nlmsg_batch_current: fn(*mut MnlNlmsgBatch) -> *mut c_void;
    mnl_nlmsg_batch_is_empty: fn(*mut MnlNlmsgBatch) -> bool;
    mnl_attr_get_type: fn(*const NlAttr) -> u16;
    mnl_attr_get_len: fn(*const NlAttr) -> u16;
    mnl_attr_get_payload_len: fn(*const NlAttr) -> u16;
    mnl_attr_get_payload: fn(*const NlAttr) -> *mut c_void;
    mnl_attr_get_u8: fn(*const NlAttr) -> u8;
    mnl_attr_get_u16: fn(*const NlAttr) -> u16;
    mnl_attr_get_u32: fn(*const NlAttr) -> u32;
    mnl_attr_get_u64: fn(*const NlAttr) -> u64;
    mnl_attr_get_str: fn(*const NlAttr) -> *const c_char;
    mnl_attr_ok: fn(*const NlAttr, c_int) -> bool;
    mnl_attr_next: fn(*const NlAttr) -> *mut NlAttr;
    mnl_attr_type_valid: fn(*const NlAttr, u16) -> c_int;
    mnl_attr_validate: fn(*const NlAttr, c_int) -> c_int;
    mnl_attr_validate2: fn(*const NlAttr, c_int, usize) -> c_int;
    mnl_attr_parse: fn(*const NlMsgHdr, c_uint, MnlAttrCb, *mut c_void) -> c_int;
    mnl_attr_parse_nested: fn(*const NlAttr, MnlAttrCb, *mut c_void) -> c_int;
    mnl_attr_parse_payload: fn(*const c_void, usize, MnlAttrCb, *mut c_void) -> c_int;
    mnl_attr_put: fn(*mut NlMsgHdr, u16, usize, *const c_void);
    mnl_attr_put_u8: fn(*mut NlMsgHdr, u16, u8);
    mnl_attr_put_u16: fn(*mut NlMsgHdr, u16, u16);
    mnl_attr_put_u32: fn(*mut NlMsgHdr, u16, u32);
    mnl_attr_put_u64: fn(*mut NlMsgHdr, u16, u64);
    mnl_attr_put_str: fn(*mut NlMsgHdr, u16, *const c_char);
    mnl_attr_put_strz: fn(*mut NlMsgHdr, u16, *const c_char);
    mnl_attr_put_check: fn(*mut NlMsgHdr, usize, u16, usize, *const c_void) -> bool;
    mnl_attr_put_u8_check: fn(*mut NlMsgHdr, usize, u16, u8) -> bool;
    mnl_attr_put_u16_check: fn(*mut NlMsgHdr, usize, u16, u16) -> bool;
    mnl_attr_put_u32_check: fn(*mut NlMsgHdr, usize, u16, u32) -> bool;
    mnl_attr_put_u64_check: fn(*mut NlMsgHdr, usize, u16, u64) -> bool;
    mnl_attr_put_str_check: fn(*mut NlMsgHdr, usize, u16, *const c_char) -> bool;
    mnl_attr_put_strz_check: fn(*mut NlMsgHdr, usize, u16, *const c_char) -> bool;
    mnl_attr_nest_start: fn(*mut NlMsgHdr, u16) -> *mut NlAttr;
    mnl_attr_nest_start_check: fn(*mut NlMsgHdr, usize, u16) -> *mut NlAttr;
    mnl_attr_nest_end: fn(*mut NlMsgHdr, *mut NlAttr);
    mnl_attr_nest_cancel: fn(*mut NlMsgHdr, *mut NlAttr);
    mnl_cb_run: fn(*const c_void, usize, c_uint, c_uint, MnlCb, *mut c_void) -> c_int;
    mnl_cb_run2: fn(*const c_void, usize, c_uint, c_uint, MnlCb, *mut c_void, *const MnlCb, c_uint) -> c_int;
    mnl_socket_open: fn(c_int) -> *mut MnlSocket;
    mnl_socket_open2: fn(c_int, c_int) -> *mut MnlSocket;
    mnl_socket_fdopen: fn(c_int) -> *mut MnlSocket;
    mnl_socket_bind: fn(*mut MnlSocket, c_uint, pid_t) -> c_int;
    mnl_socket_get_fd: fn(*const MnlSocket) -> c_int;
    mnl_socket_get_portid: fn(*const MnlSocket) -> c_uint;
    mnl_socket_sendto: fn(*const MnlSocket, *const c_void, usize) -> isize;
    mnl_socket_recvfrom: fn(*const MnlSocket, *mut c_void, usize) -> isize;
    mnl_socket_close: fn(*mut MnlSocket) -> c_int;
    mnl_socket_setsockopt: fn(*const MnlSocket, c_int, *mut c_void, socklen_t) -> c_int;
    mnl_socket_getsockopt: fn(*const MnlSocket, c_int, *mut c_void, *mut socklen_t) -> c_int;
}

const LIBMNL: &str = "libmnl.so.0";

unsafe fn sym(h: *mut c_void, name: &str) -> *mut c_void {
    let c = std::ffi::CString::new(name).unwrap();
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "{LIBMNL} has no symbol {name}");
    p
}

/// libmnl.so.0, loaded once (see the module docs).
pub fn real() -> &'static Api {
    static REAL: OnceLock<Api> = OnceLock::new();
    REAL.get_or_init(|| {
        let c = std::ffi::CString::new(LIBMNL).unwrap();
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            let why = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
            panic!("dlopen {LIBMNL}: {why:?} (install Debian's libmnl0: apt-get install libmnl0)");
        }
        unsafe { Api::real(h) }
    })
}

pub fn ours() -> &'static Api {
    static OURS: OnceLock<Api> = OnceLock::new();
    OURS.get_or_init(Api::ours)
}

/// Both sides, libmnl first.
pub fn sides() -> [&'static Api; 2] {
    [real(), ours()]
}

// ---------------------------------------------------------------------------------------------
// running one call on both sides

/// Bytes after every input buffer, preset to this pattern: writes past the end show up.
pub const SLACK: usize = 64;
const SLACK_BYTE: u8 = 0xa5;
/// errno before every call: "left alone" and "set" are told apart.
pub const ERRNO_BEFORE: c_int = 0x5a5a;

/// An 8-byte aligned copy of an input, followed by `SLACK` pattern bytes.
pub struct Buf {
    words: Vec<u64>,
    len: usize,
}

impl Buf {
    pub fn new(input: &[u8]) -> Buf {
        let mut words = vec![0u64; (input.len() + SLACK).div_ceil(8)];
        let mut b = Buf {
            len: words.len() * 8,
            words: std::mem::take(&mut words),
        };
        b.bytes_mut().fill(SLACK_BYTE);
        b.bytes_mut()[..input.len()].copy_from_slice(input);
        b
    }
    pub fn ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast()
    }
    pub fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
}

/// What one side did: the call's result, errno afterwards, the buffer afterwards.
#[derive(Debug, PartialEq)]
pub struct Seen<T> {
    pub ret: T,
    pub errno: c_int,
    pub bytes: Vec<u8>,
}

pub fn set_errno(api: &Api, e: c_int) {
    unsafe { *(api.errno)() = e };
}

pub fn get_errno(api: &Api) -> c_int {
    unsafe { *(api.errno)() }
}

/// Runs `f` with one side on a fresh copy of `input` (errno preset to `ERRNO_BEFORE`).
pub fn run_on<T>(api: &Api, input: &[u8], f: impl FnOnce(&Api, *mut u8) -> T) -> Seen<T> {
    let mut buf = Buf::new(input);
    set_errno(api, ERRNO_BEFORE);
    let ret = f(api, buf.ptr());
    let errno = get_errno(api);
    Seen {
        ret,
        errno,
        bytes: buf.bytes().to_vec(),
    }
}

/// Runs `f` on both sides with the same input; result, errno and buffer bytes must match.
/// Returns libmnl's result.
#[track_caller]
pub fn same<T: Debug + PartialEq>(
    what: impl std::fmt::Display,
    input: &[u8],
    f: impl Fn(&Api, *mut u8) -> T,
) -> T {
    let real = run_on(real(), input, &f);
    let ours = run_on(ours(), input, &f);
    if real != ours {
        if std::env::var_os("MNL_DIFF_VERBOSE").is_some() {
            eprintln!("libmnl.so.0: {real:#?}\nmnl-impl: {ours:#?}");
        }
        panic!("{what}: {}", first_difference(&real, &ours));
    }
    real.ret
}

/// The first differing line of the two pretty-printed observations, with some context.
pub fn first_difference(real: &impl Debug, ours: &impl Debug) -> String {
    let (r, o) = (format!("{real:#?}"), format!("{ours:#?}"));
    let (r, o): (Vec<_>, Vec<_>) = (r.lines().collect(), o.lines().collect());
    let i = r.iter().zip(&o).take_while(|(a, b)| a == b).count();
    let from = i.saturating_sub(6);
    format!(
        "libmnl.so.0 and mnl-impl differ at line {i}\n  context: {}\n  libmnl.so.0: {}\n  mnl-impl:    {}",
        r[from..i].join("\n           "),
        r.get(i).unwrap_or(&"<end>"),
        o.get(i).unwrap_or(&"<end>"),
    )
}

/// A pointer as an offset from `base` (None for NULL), comparable across the two sides.
pub fn off<T>(base: *const u8, p: *const T) -> Option<isize> {
    (!p.is_null()).then(|| (p as isize).wrapping_sub(base as isize))
}

// ---------------------------------------------------------------------------------------------
// deterministic random inputs

/// splitmix64: small, seeded, the same sequence on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// 0..n
    pub fn below(&mut self, n: u64) -> u64 {
        self.u64() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u64() as u8).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// netlink message building for inputs (plain bytes, no libmnl involved)

pub fn nlmsg(ty: u16, flags: u16, seq: u32, pid: u32, payload: &[u8]) -> Vec<u8> {
    let len = 16 + payload.len();
    let mut m = Vec::with_capacity(len.next_multiple_of(4));
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&pid.to_ne_bytes());
    m.extend_from_slice(payload);
    m.resize(len.next_multiple_of(4), 0);
    m
}

/// An attribute: header with `nla_len` = 4 + payload, payload, zero padding.
pub fn nlattr(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    a.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    a.extend_from_slice(&ty.to_ne_bytes());
    a.extend_from_slice(payload);
    a.resize(a.len().next_multiple_of(4), 0);
    a
}

// ---------------------------------------------------------------------------------------------
// the harness itself

#[test]
fn loads_the_real_library() {
    let (r, o) = (real().addresses(), ours().addresses());
    assert_eq!(r.len(), Api::NAMES.len());
    for (i, name) in Api::NAMES.iter().enumerate() {
        assert_ne!(r[i], o[i], "{name}: both sides are the same code");
    }
    // errno really is two different variables (libmnl's own libc.so.6)
    set_errno(real(), 1);
    set_errno(ours(), 2);
    assert_eq!((get_errno(real()), get_errno(ours())), (1, 2));
}

#[test]
fn libnftnl_symbols_are_all_covered() {
    let lib = "/usr/lib/x86_64-linux-gnu/libnftnl.a";
    let out = std::process::Command::new("nm")
        .args(["-u", lib])
        .output()
        .unwrap_or_else(|e| panic!("nm (binutils): {e}"));
    assert!(out.status.success(), "nm -u {lib}: {out:?}");
    let mut used: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .filter(|w| w.starts_with("mnl_"))
        .map(str::to_owned)
        .collect();
    used.sort();
    used.dedup();
    assert_eq!(used, LIBNFTNL_USES, "libnftnl.a's mnl_* imports changed");
    for name in LIBNFTNL_USES {
        assert!(Api::NAMES.contains(name), "{name} is not compared");
    }
}

/// Every function of both sides is called by some comparison (`(api.NAME)(`).
#[test]
fn every_function_is_compared() {
    let sources = [
        include_str!("attr.rs"),
        include_str!("batch.rs"),
        include_str!("cb.rs"),
        include_str!("nlmsg.rs"),
        include_str!("put.rs"),
        include_str!("socket.rs"),
    ]
    .concat();
    let missing: Vec<_> = Api::NAMES
        .iter()
        .filter(|n| !sources.contains(&format!("(api.{n})(")))
        .collect();
    assert!(missing.is_empty(), "never compared: {missing:?}");
    assert_eq!(Api::NAMES.len(), 67);
}
