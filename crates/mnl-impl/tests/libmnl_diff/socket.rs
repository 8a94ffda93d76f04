//! mnl_socket_*: compared by behaviour on real NETLINK_NETFILTER sockets, in a private network
//! namespace (root): open/open2/fdopen (good and bad), bind (and a port id already taken),
//! get_fd/get_portid against getsockname, set/getsockopt, sendto, recvfrom (and a buffer too
//! small: ENOSPC), close; both sides dump the same ruleset (a table and a base chain made
//! through libmnl) and must receive the same bytes (port ids aside), and the same errors.

use super::*;

const NETLINK_NETFILTER: c_int = 12;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NFT: u16 = 10 << 8; // NFNL_SUBSYS_NFTABLES
const NFPROTO_INET: u8 = 1;

fn nfgen(family: u8, res_id: u16) -> Vec<u8> {
    [&[family, 0][..], &res_id.to_be_bytes()].concat()
}

/// BEGIN, a table `mnl_diff` and a base chain `out` (hook nest) in it, END: ACK on each.
fn ruleset_batch(seq: u32) -> Vec<u8> {
    let table = [nfgen(NFPROTO_INET, 0), nlattr(1, b"mnl_diff\0")].concat();
    let hook = [
        nlattr(1, &3u32.to_be_bytes()),
        nlattr(2, &(-5i32).to_be_bytes()),
    ]
    .concat();
    let chain = [
        nfgen(NFPROTO_INET, 0),
        nlattr(1, b"mnl_diff\0"),
        nlattr(3, b"out\0"),
        nlattr(0x8004, &hook),
        nlattr(5, &1u32.to_be_bytes()),
        nlattr(7, b"filter\0"),
    ]
    .concat();
    let create = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK;
    [
        nlmsg(0x10, NLM_F_REQUEST, seq, 0, &nfgen(0, 10)),
        nlmsg(NFT, create, seq + 1, 0, &table),
        nlmsg(NFT | 3, create, seq + 2, 0, &chain),
        nlmsg(0x11, NLM_F_REQUEST, seq + 3, 0, &nfgen(0, 10)),
    ]
    .concat()
}

/// `data` of `keep`: the messages received, their port id zeroed (each socket has its own).
unsafe extern "C" fn keep(nlh: *const NlMsgHdr, data: *mut c_void) -> c_int {
    let out = unsafe { &mut *data.cast::<Vec<Vec<u8>>>() };
    let len = unsafe { (*nlh).nlmsg_len } as usize;
    let mut m = unsafe { std::slice::from_raw_parts(nlh.cast::<u8>(), len) }.to_vec();
    m[12..16].fill(0);
    out.push(m);
    1
}

/// Sends `req` and runs every reply through `mnl_cb_run` until it stops or fails; logs the
/// results and errno, and the messages received.
unsafe fn talk(api: &Api, nl: *mut MnlSocket, req: &[u8], seq: u32, log: &mut Vec<String>) {
    let mut buf = vec![0u64; 8192 / 8];
    let mut got: Vec<Vec<u8>> = Vec::new();
    unsafe {
        let portid = (api.mnl_socket_get_portid)(nl);
        let sent = (api.mnl_socket_sendto)(nl, req.as_ptr().cast(), req.len());
        log.push(format!("sendto {} of {}", sent, req.len()));
        loop {
            set_errno(api, ERRNO_BEFORE);
            let n = (api.mnl_socket_recvfrom)(nl, buf.as_mut_ptr().cast(), 8192);
            if n < 0 {
                log.push(format!("recvfrom {n} errno {}", get_errno(api)));
                break;
            }
            set_errno(api, ERRNO_BEFORE);
            let data = (&mut got as *mut Vec<Vec<u8>>).cast();
            let r = (api.mnl_cb_run)(
                buf.as_ptr().cast(),
                n as usize,
                seq,
                portid,
                Some(keep),
                data,
            );
            log.push(format!("recvfrom {n}: cb_run {r} errno {}", get_errno(api)));
            if r <= 0 {
                break;
            }
        }
    }
    log.extend(got.iter().map(|m| format!("{m:02x?}")));
}

/// Everything one side does; the two logs must be equal.
unsafe fn scenario(api: &Api) -> Vec<String> {
    let mut log = Vec::new();
    unsafe {
        set_errno(api, ERRNO_BEFORE);
        let bad = (api.mnl_socket_open)(4242);
        log.push(format!(
            "open(4242) null {} errno {}",
            bad.is_null(),
            get_errno(api)
        ));
        set_errno(api, ERRNO_BEFORE);
        let bad = (api.mnl_socket_open2)(NETLINK_NETFILTER, 0x4000_0000);
        log.push(format!(
            "open2(bad flags) null {} errno {}",
            bad.is_null(),
            get_errno(api)
        ));

        let nl = (api.mnl_socket_open2)(NETLINK_NETFILTER, libc::SOCK_CLOEXEC);
        assert!(!nl.is_null());
        let fd = (api.mnl_socket_get_fd)(nl);
        log.push(format!(
            "portid before bind {}",
            (api.mnl_socket_get_portid)(nl)
        ));
        log.push(format!("bind {}", (api.mnl_socket_bind)(nl, 0, 0)));
        let portid = (api.mnl_socket_get_portid)(nl);
        log.push(format!(
            "portid is getsockname's {}",
            portid == bound_portid(fd) && portid != 0
        ));

        // a second socket asking for the same port id
        let other = (api.mnl_socket_open)(NETLINK_NETFILTER);
        set_errno(api, ERRNO_BEFORE);
        let r = (api.mnl_socket_bind)(other, 0, portid as pid_t);
        let after = (api.mnl_socket_get_portid)(other);
        log.push(format!(
            "bind taken {r} errno {} portid after is it {}",
            get_errno(api),
            after == portid
        ));
        log.push(format!("close {}", (api.mnl_socket_close)(other)));

        // fdopen: a bound socket, an unbound one, not a socket
        let raw = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, NETLINK_NETFILTER);
        let w = (api.mnl_socket_fdopen)(raw);
        log.push(format!(
            "fdopen unbound: fd same {} portid {}",
            (api.mnl_socket_get_fd)(w) == raw,
            (api.mnl_socket_get_portid)(w)
        ));
        log.push(format!(
            "bind {} portid set {}",
            (api.mnl_socket_bind)(w, 0, 0),
            (api.mnl_socket_get_portid)(w) != 0
        ));
        let w2 = (api.mnl_socket_fdopen)(libc::dup((api.mnl_socket_get_fd)(w)));
        log.push(format!(
            "fdopen bound: portid same {}",
            (api.mnl_socket_get_portid)(w2) == (api.mnl_socket_get_portid)(w)
        ));
        log.push(format!(
            "close {} {}",
            (api.mnl_socket_close)(w2),
            (api.mnl_socket_close)(w)
        ));
        let devnull = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        set_errno(api, ERRNO_BEFORE);
        let w = (api.mnl_socket_fdopen)(devnull);
        log.push(format!(
            "fdopen /dev/null null {} errno {}",
            w.is_null(),
            get_errno(api)
        ));
        libc::close(devnull);

        // socket options (SOL_NETLINK): NETLINK_EXT_ACK on and read back, an unknown one
        let mut on: c_int = 1;
        let r = (api.mnl_socket_setsockopt)(nl, 11, (&mut on as *mut c_int).cast(), 4);
        let (mut v, mut vlen): (c_int, socklen_t) = (0, 4);
        let g = (api.mnl_socket_getsockopt)(nl, 11, (&mut v as *mut c_int).cast(), &mut vlen);
        log.push(format!(
            "setsockopt {r} getsockopt {g} value {v} len {vlen}"
        ));
        set_errno(api, ERRNO_BEFORE);
        let r = (api.mnl_socket_setsockopt)(nl, 9999, (&mut on as *mut c_int).cast(), 4);
        log.push(format!("setsockopt unknown {r} errno {}", get_errno(api)));

        // the ruleset, read back: tables, chains
        let get = |ty: u16, seq| {
            nlmsg(
                NFT | ty,
                NLM_F_REQUEST | NLM_F_DUMP,
                seq,
                0,
                &nfgen(NFPROTO_INET, 0),
            )
        };
        talk(api, nl, &get(1, 100), 100, &mut log);
        talk(api, nl, &get(4, 200), 200, &mut log);
        // an error: a table that does not exist (not a dump)
        let missing = [nfgen(NFPROTO_INET, 0), nlattr(1, b"no_such_table\0")].concat();
        talk(
            api,
            nl,
            &nlmsg(NFT | 1, NLM_F_REQUEST | NLM_F_ACK, 300, 0, &missing),
            300,
            &mut log,
        );
        // replies larger than the buffer: ENOSPC
        (api.mnl_socket_sendto)(nl, get(4, 400).as_ptr().cast(), 20);
        let mut small = [0u64; 4];
        set_errno(api, ERRNO_BEFORE);
        let n = (api.mnl_socket_recvfrom)(nl, small.as_mut_ptr().cast(), 32);
        log.push(format!(
            "recvfrom into 32 bytes {n} errno {}",
            get_errno(api)
        ));
        log.push(format!("close {}", (api.mnl_socket_close)(nl)));
    }
    log
}

fn bound_portid(fd: c_int) -> u32 {
    let mut a: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_nl>() as socklen_t;
    assert_eq!(
        unsafe { libc::getsockname(fd, (&mut a as *mut libc::sockaddr_nl).cast(), &mut len) },
        0
    );
    a.nl_pid
}

#[test]
fn sockets_behave_the_same() {
    // a thread of its own in a new network namespace: the ruleset is ours alone
    std::thread::spawn(|| unsafe {
        assert_eq!(
            libc::unshare(libc::CLONE_NEWNET),
            0,
            "unshare(CLONE_NEWNET) needs root: {}",
            std::io::Error::last_os_error()
        );
        // the ruleset, made through libmnl; every message acked
        let api = real();
        let nl = (api.mnl_socket_open)(NETLINK_NETFILTER);
        assert_eq!((api.mnl_socket_bind)(nl, 0, 0), 0);
        let mut log = Vec::new();
        talk(api, nl, &ruleset_batch(10), 0, &mut log);
        (api.mnl_socket_close)(nl);
        assert!(
            log.iter()
                .filter(|l| l.contains("cb_run 0 errno 0"))
                .count()
                >= 1,
            "{log:#?}"
        );

        let (r, o) = (scenario(real()), scenario(ours()));
        if std::env::var_os("MNL_DIFF_VERBOSE").is_some() {
            eprintln!("{r:#?}");
        }
        assert!(
            r.iter()
                .any(|l| l.contains("6d, 6e, 6c, 5f, 64, 69, 66, 66")),
            "no table in {r:#?}"
        );
        assert!(r == o, "{}", first_difference(&r, &o));
    })
    .join()
    .unwrap();
}
