//! `--trace --wait` of an app's real connection to a link-local address that the rules redirect
//! to `[::1]:15001`: the kernel drops it after our rules (the zone binds the socket to eth0, and
//! there is no route to ::1 through it), which no trace event reports and, the connection being
//! someone else's, no attempt times out. The kernel's path must still agree with the static
//! one, with both backends.

mod common;

use capture::{Config, Facts, Ipv6Mode, Plan};
use common::{apply_legacy, wait_for_trace_rules};
use explain::trace::{self, TraceHow};
use explain::{self as ex, Connection, Direction, Landing, Protocol, Zone};
use std::net::SocketAddr;
use std::time::Duration;
use testbed::*;

fn pod(legacy: bool) -> PodWorld {
    let w = PodWorld::new().unwrap();
    w.add_link_local().unwrap();
    let cfg = Config {
        ipv6: Ipv6Mode::On,
        ..Config::cni_default()
    };
    let plan = Plan::build(&cfg, &Facts::default()).unwrap();
    if legacy {
        apply_legacy(w.pod.path(), &plan);
    } else {
        netns::run_in(Some(w.pod.path()), || nft_backend::apply(&plan))
            .unwrap()
            .unwrap();
    }
    w
}

/// The pod's live rules, read as `explain` reads them for its backend.
fn live_rules(w: &PodWorld, legacy: bool) -> ex::ir::Ruleset {
    if legacy {
        ex::live_legacy_ruleset(Some(w.pod.path())).unwrap()
    } else {
        ex::live_ruleset(Some(w.pod.path())).unwrap()
    }
}

#[test]
fn a_waited_for_link_local_connection_dropped_after_the_redirect_agrees() {
    require_root();
    for legacy in [false, true] {
        let backend = if legacy { "iptables-legacy" } else { "nft" };
        let w = pod(legacy);
        let _p = Probe::world(w.world.path()).unwrap();
        let conn = Connection::new(
            Direction::Outbound,
            Protocol::Tcp,
            SocketAddr::new(WORLD_LINK_LOCAL.into(), 80),
        )
        .uid(1000)
        .gid(1000)
        .zone(Zone::Name("eth0".into()));
        let rs = live_rules(&w, legacy);
        let facts = ex::namespace_facts(Some(w.pod.path()), &conn).unwrap();
        let e = ex::explain_with(&rs, &conn, &facts).unwrap();
        assert_eq!(e.outcome.landing(), Landing::Dropped, "{backend}");

        let path = w.pod.path().to_path_buf();
        let c = conn.clone();
        let tracer = std::thread::spawn(move || {
            trace::trace(Some(&path), &c, TraceHow::Wait(Duration::from_secs(8)))
        });
        assert!(wait_for_trace_rules(w.pod.path(), None), "{backend}");
        // The app's connection: redirected, then dropped (it times out).
        let app = ConnectSpec::new(WORLD_LINK_LOCAL.into(), 80)
            .zone("eth0")
            .uid(1000)
            .gid(1000);
        assert_eq!(connect(w.pod.path(), &app), Outcome::Timeout, "{backend}");
        let kp = tracer.join().unwrap().unwrap();
        assert_eq!(kp.attempt, trace::Attempt::Observed, "{backend}");
        let ag = ex::compare::compare(&rs, &e, &kp);
        assert!(
            ag.agree,
            "{backend}: {:?}\n{}",
            ag.differences,
            ex::render_text(&e)
        );
        assert_eq!(ag.kernel_outcome, "redirected to port 15001", "{backend}");
    }
}

/// An inbound connection to the pod's link-local address, redirected (REDIRECT mode) to
/// 15006: the kernel (nf_nat_redirect_ipv6) redirects it to an address of eth0 whose scope
/// the destination's has, fe80::2, not the pod's first address (its global one). The
/// explanation must name the address the real connection reached, with both backends.
#[test]
fn an_inbound_link_local_redirect_goes_to_a_link_local_address() {
    require_root();
    for legacy in [false, true] {
        let backend = if legacy { "iptables-legacy" } else { "nft" };
        let w = pod(legacy);
        let sidecar = Probe::sidecar(w.pod.path()).unwrap();
        let conn = Connection::new(
            Direction::Inbound,
            Protocol::Tcp,
            SocketAddr::new(POD_LINK_LOCAL.into(), 8080),
        )
        .src(WORLD_LINK_LOCAL.into());
        let rs = live_rules(&w, legacy);
        let facts = ex::namespace_facts(Some(w.pod.path()), &conn).unwrap();
        let e = ex::explain_with(&rs, &conn, &facts).unwrap();
        let world = ConnectSpec::new(POD_LINK_LOCAL.into(), 8080)
            .zone("eth0")
            .src(WORLD_LINK_LOCAL.into());
        let landed = connect(w.world.path(), &world);
        // The socket's local address, without its scope id.
        let got = sidecar
            .accepted()
            .last()
            .map(|a| (a.local.ip(), a.local.port()));
        assert_eq!(
            got,
            Some((POD_LINK_LOCAL.into(), 15006)),
            "{backend}: {landed}"
        );
        match &e.outcome {
            ex::Outcome::Redirected { to, .. } => {
                assert_eq!(Some((to.ip(), to.port())), got, "{backend}")
            }
            o => panic!("{backend}: {o:?}\n{}", ex::render_text(&e)),
        }
    }
}
