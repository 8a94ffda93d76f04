//! mnl_nlmsg_batch_*: start/next/current/size/is_empty/head/reset/stop with a buffer filling
//! up, the message that overflows carried over by reset, seeded random message sizes.

use super::*;

/// Fills a batch of `limit` (in a buffer of twice that, as libmnl documents) with messages of
/// the given sizes, logging every call; a full batch is "sent" (logged) and reset.
fn fill(what: &str, limit: usize, sizes: &[u32], resets: &[usize]) {
    let buf = vec![0x3cu8; 2 * limit + 64];
    same(what, &buf, |api, b| unsafe {
        let batch = (api.mnl_nlmsg_batch_start)(b.cast(), limit);
        let mut log = vec![format!(
            "head {:?}",
            off(b, (api.mnl_nlmsg_batch_head)(batch))
        )];
        for (i, &size) in sizes.iter().enumerate() {
            let cur = (api.mnl_nlmsg_batch_current)(batch);
            let nlh = (api.mnl_nlmsg_put_header)(cur);
            (*nlh).nlmsg_type = i as u16;
            (*nlh).nlmsg_seq = i as u32;
            if size > 16 {
                (api.mnl_nlmsg_put_extra_header)(nlh, size as usize - 16);
            }
            let fits = (api.mnl_nlmsg_batch_next)(batch);
            log.push(format!(
                "msg {i} at {:?} size {size}: next {fits} size {} empty {} current {:?}",
                off(b, cur),
                (api.mnl_nlmsg_batch_size)(batch),
                (api.mnl_nlmsg_batch_is_empty)(batch),
                off(b, (api.mnl_nlmsg_batch_current)(batch)),
            ));
            if !fits && size as usize > (api.mnl_nlmsg_batch_size)(batch) {
                // the carried-over message would overlap itself: libmnl 1.0.4 gets that wrong
                // (`reset_carrying_a_longer_message_is_a_divergence`)
                log.push("stop: carry-over would overlap".into());
                break;
            }
            if !fits || resets.contains(&i) {
                let sent = (api.mnl_nlmsg_batch_size)(batch);
                log.push(format!(
                    "send {sent} bytes {:02x?}",
                    std::slice::from_raw_parts(b, sent)
                ));
                (api.mnl_nlmsg_batch_reset)(batch);
                log.push(format!(
                    "reset: size {} empty {} current {:?}",
                    (api.mnl_nlmsg_batch_size)(batch),
                    (api.mnl_nlmsg_batch_is_empty)(batch),
                    off(b, (api.mnl_nlmsg_batch_current)(batch)),
                ));
            }
        }
        (api.mnl_nlmsg_batch_stop)(batch);
        log
    });
}

#[test]
fn batch_fills_up_and_carries_over() {
    fill("empty", 64, &[], &[]);
    fill("exactly full", 64, &[16, 16, 32], &[]);
    fill("one byte over", 64, &[16, 16, 36], &[]);
    fill("first message too big", 32, &[48, 16], &[]);
    fill("reset without overflow", 64, &[20, 20, 20], &[0, 1]);
    fill("reset twice", 64, &[40, 40, 40, 16], &[2]);
    fill("limit 0", 0, &[16, 16], &[]);
}

/// libmnl 1.0.4's reset copies the overflowing message to the front with `memcpy` and then reads
/// its length back from where it was, which the copy has already overwritten when the message
/// is longer than the batch it overflowed (here: the length becomes 0 and the message is lost).
/// mnl-impl reads the length first and moves with `memmove`. libnftnl never calls reset.
#[test]
fn reset_carrying_a_longer_message_is_a_divergence() {
    let buf = vec![0u8; 192];
    let carry = |api: &Api| {
        run_on(api, &buf, |api, b| unsafe {
            let batch = (api.mnl_nlmsg_batch_start)(b.cast(), 64);
            for size in [16usize, 16, 36] {
                let nlh = (api.mnl_nlmsg_put_header)((api.mnl_nlmsg_batch_current)(batch));
                (*nlh).nlmsg_seq = 7;
                (api.mnl_nlmsg_put_extra_header)(nlh, size - 16);
                (api.mnl_nlmsg_batch_next)(batch);
            }
            (api.mnl_nlmsg_batch_reset)(batch);
            let size = (api.mnl_nlmsg_batch_size)(batch);
            (api.mnl_nlmsg_batch_stop)(batch);
            size
        })
    };
    let (r, o) = (carry(real()), carry(ours()));
    assert_eq!(r.ret, 0, "libmnl 1.0.4 loses the carried-over message");
    assert_eq!(o.ret, 36, "mnl-impl carries it over");
    assert_eq!(
        o.bytes[..36],
        nlmsg(0, 0, 7, 0, &[0; 20]),
        "moved to the front"
    );
}

#[test]
fn batch_random_sizes() {
    let mut rng = Rng::new(0x6261_7463_6866_696c);
    for i in 0..200 {
        let limit = 16 * rng.below(32) as usize + 4 * rng.below(4) as usize;
        let sizes: Vec<u32> = (0..rng.below(40))
            .map(|_| 16 + 4 * rng.below(16) as u32)
            .collect();
        let resets: Vec<usize> = (0..rng.below(3)).map(|_| rng.below(40) as usize).collect();
        // a message bigger than the limit would overflow a 2*limit buffer in both libraries
        let sizes: Vec<u32> = sizes.into_iter().filter(|&s| s as usize <= limit).collect();
        fill(
            &format!("random batch {i} limit {limit} {sizes:?} {resets:?}"),
            limit,
            &sizes,
            &resets,
        );
    }
}
