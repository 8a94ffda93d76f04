//! ADD, DEL, CHECK, STATUS, GC: the I/O around the pure decisions in `pod` and `settings`.

use crate::cni::{self, CniEnv, CniError, ErrorCode};
use crate::figures::{self, failed};
use crate::k8s::{self, LookupError};
use crate::node_cache;
use crate::settings::{K8sArgs, LookupSettings, NetConf, parse_cni_args};
use capture::{Facts, Plan};
use cni_config::ambient::{AddPodRequest, DelPodRequest, NetnsId};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use pod_policy::{Decision, PodConfig};
use redirect::RedirectError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// What ADD does before touching the API server (pure; §4.3 steps 3 and 5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    PassThrough(String),
    Lookup,
}

pub fn route(conf: &NetConf, args: &K8sArgs) -> Route {
    // The self-bypass comes first: istio-cni's own pods must start without any lookup.
    if let Some(why) = conf
        .settings
        .policy()
        .scope
        .by_name(&args.pod_name, &args.pod_namespace)
    {
        return Route::PassThrough(why);
    }
    if !args.is_pod() {
        return Route::PassThrough("not a Kubernetes pod (no K8S_POD_NAME/NAMESPACE)".into());
    }
    Route::Lookup
}

fn pod_ref(args: &K8sArgs) -> String {
    format!("{}/{}", args.pod_namespace, args.pod_name)
}

/// What ADD does with a pod.
enum PodAction {
    PassThrough,
    /// A sidecar pod: program these rules.
    Sidecar(Plan),
    /// An ambient pod: hand it to the node agent.
    Ambient(Box<Pod>),
}

/// Looks the pod up (with its namespace in ambient mode) and decides (`pod_policy`).
fn pod_action(conf: &NetConf, netns: &Path, args: &K8sArgs) -> Result<PodAction, CniError> {
    if let Route::PassThrough(reason) = route(conf, args) {
        tracing::info!(%reason, "passing through, no rules");
        figures::mode("none");
        return Ok(PodAction::PassThrough);
    }
    // Where every mesh pod is a sidecar pod (no ambient on this node), the pod's addresses
    // are read while the pod is looked up: the read is a few hundred µs of netlink in the
    // pod's namespace that would otherwise only start once the answer is in. A pod that turns
    // out not to be in the mesh has had its addresses read for nothing (read-only).
    let (looked_up, early_facts) = if conf.settings.ambient_enabled {
        (lookup(conf, args), None)
    } else {
        std::thread::scope(|s| {
            let facts = s.spawn(|| read_pod_facts(netns));
            let looked_up = lookup(conf, args);
            (looked_up, facts.join().ok())
        })
    };
    let (pod, namespace_labels) = looked_up.map_err(failed("lookup_failed"))?;
    let decision = pod_policy::decide(&pod, &namespace_labels, &conf.settings.policy())
        .map_err(|e| {
            CniError::new(
                ErrorCode::InvalidPodSpec,
                format!("pod {}: {e}; no rules were programmed", pod_ref(args)),
            )
        })
        .map_err(failed("decide_failed"))?;
    match decision {
        Decision::Skip(reason) => {
            tracing::info!(%reason, "not in the mesh, no rules");
            figures::mode("none");
            Ok(PodAction::PassThrough)
        }
        Decision::Ambient(_) => {
            // Istio ignores a non-boolean ambient annotation with a warning: so do we.
            for w in pod_policy::ambient::ignored_annotations(&pod) {
                tracing::warn!(warning = %w, "pod configuration");
            }
            Ok(PodAction::Ambient(Box::new(pod)))
        }
        Decision::Sidecar(pc) => {
            figures::mode("sidecar");
            let facts = early_facts
                .unwrap_or_else(|| read_pod_facts(netns))
                .map_err(failed("rules_failed"))?;
            tracing::debug!(addresses = ?facts.local_addrs, "pod namespace read");
            sidecar_plan(&pc, &facts, args)
                .map(PodAction::Sidecar)
                .map_err(failed("rules_failed"))
        }
    }
}

/// The pod's own addresses: IPv6 detection looks at them, as istio-iptables does inside the
/// netns. No resolv.conf: the CNI path captures all DNS, so nameservers are not needed.
fn read_pod_facts(netns: &Path) -> Result<Facts, CniError> {
    redirect::read_facts(Some(netns), None)
        .map_err(|e| redirect_error(e, "reading the pod's addresses"))
}

/// A sidecar pod's rules in its namespace.
fn sidecar_plan(pc: &PodConfig, facts: &Facts, args: &K8sArgs) -> Result<Plan, CniError> {
    for w in &pc.warnings {
        tracing::warn!(warning = %w, "pod configuration");
    }
    // The annotations were valid; what fails here comes from the namespace (e.g. no address
    // yet to tell IPv4 from IPv6), as in istio-iptables.
    let plan = Plan::build(&pc.config, facts).map_err(|e| {
        CniError::new(
            ErrorCode::Redirect,
            format!(
                "pod {}: cannot build the redirect rules for its namespace: {e}; no rules were programmed",
                pod_ref(args)
            ),
        )
    })?;
    tracing::debug!(config = ?pc.config, "redirect config");
    Ok(plan)
}

/// The pod (and in ambient mode its namespace's labels): from the node daemon's caches, else
/// from the API server within what is left of the deadline. Both give the API server's JSON,
/// so the decision cannot depend on the path.
fn lookup(conf: &NetConf, args: &K8sArgs) -> Result<(Pod, BTreeMap<String, String>), CniError> {
    let started = Instant::now();
    let ambient = conf.settings.ambient_enabled;
    let socket = conf.settings.pod_lookup_socket();
    let (pod, namespace) = match node_cache::ask(&socket, args, ambient, conf.lookup.deadline) {
        Ok(found) => {
            tracing::debug!(elapsed = ?started.elapsed(), "pod from the node daemon's cache");
            figures::lookup("cache", started.elapsed());
            found
        }
        Err(miss) => {
            tracing::info!(%miss, "pod not from the node daemon; asking the API server");
            let mut lookup = conf.lookup;
            lookup.deadline = lookup.deadline.saturating_sub(started.elapsed());
            let found = api_lookup(conf, args, lookup)?;
            figures::lookup("api", started.elapsed());
            found
        }
    };
    same_pod(&pod, args)?;
    same_namespace(namespace.as_ref(), args)?;
    // Fail closed: a namespace we cannot read may be the one that enrolls the pod.
    let labels = namespace
        .and_then(|n| n.metadata.labels)
        .unwrap_or_default();
    Ok((pod, labels))
}

/// The answer is the pod this sandbox is for: the name and namespace asked for and, when the
/// runtime says which pod (K8S_POD_UID), that pod, not one re-created under its name since.
fn same_pod(pod: &Pod, args: &K8sArgs) -> Result<(), CniError> {
    let m = &pod.metadata;
    let got = format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or("")
    );
    if got != pod_ref(args) {
        return Err(CniError::new(
            ErrorCode::Decode,
            format!(
                "pod {}: the answer is pod {got:?}; refusing to program the pod from another pod's spec",
                pod_ref(args)
            ),
        ));
    }
    let uid = m.uid.as_deref().unwrap_or("");
    if !pod_policy::is_sandboxs_pod(pod, &args.pod_uid) {
        return Err(CniError::new(
            ErrorCode::TryAgainLater,
            format!(
                "pod {}: the API server's pod has uid {uid:?}, this sandbox is for K8S_POD_UID {:?} (deleted and re-created under the same name); refusing to program it from the new pod's spec",
                pod_ref(args),
                args.pod_uid
            ),
        ));
    }
    Ok(())
}

/// The namespace answered (ambient mode) is the pod's: its labels decide whether the pod is
/// enrolled, so another namespace's would let an ambient pod pass through without rules.
/// Checked here once for both sources, the node daemon's cache and the API server.
fn same_namespace(namespace: Option<&Namespace>, args: &K8sArgs) -> Result<(), CniError> {
    let Some(ns) = namespace else { return Ok(()) };
    let got = ns.metadata.name.as_deref().unwrap_or("");
    if got == args.pod_namespace {
        return Ok(());
    }
    Err(CniError::new(
        ErrorCode::Decode,
        format!(
            "pod {}: the answer's namespace is {got:?}; refusing to decide the pod by another namespace's labels",
            pod_ref(args)
        ),
    ))
}

fn api_lookup(
    conf: &NetConf,
    args: &K8sArgs,
    lookup: LookupSettings,
) -> Result<(Pod, Option<Namespace>), CniError> {
    let kubeconfig = conf.settings.kubeconfig_path();
    let (ns, name) = (&args.pod_namespace, &args.pod_name);
    if conf.settings.ambient_enabled {
        k8s::get_pod_and_namespace(&kubeconfig, ns, name, lookup)
            .map(|(p, n)| (p, Some(n)))
            .map_err(|e| lookup_error(e, args))
    } else {
        k8s::get_pod(&kubeconfig, ns, name, lookup)
            .map(|p| (p, None))
            .map_err(|e| lookup_error(e, args))
    }
}

fn lookup_error(e: LookupError, args: &K8sArgs) -> CniError {
    let code = match e {
        // The installer has not written it yet: the runtime retries the sandbox.
        LookupError::Kubeconfig { .. } | LookupError::Client { .. } => ErrorCode::Kubeconfig,
        LookupError::Exhausted { .. } => ErrorCode::TryAgainLater,
        // Our credentials were rejected: the kubeconfig is stale or lacks the RBAC.
        LookupError::Permanent {
            status: Some(401 | 403),
            ..
        } => ErrorCode::Kubeconfig,
        LookupError::Permanent { status: None, .. } => ErrorCode::Decode,
        LookupError::Permanent { .. } => ErrorCode::Io,
        LookupError::Runtime(_) => ErrorCode::Io,
    };
    CniError::new(
        code,
        format!(
            "pod {}: {e}; refusing to start the pod without its redirect rules",
            pod_ref(args)
        ),
    )
}

/// Names CNI_NETNS beside the descriptor path the namespace is reached through (which is what
/// the errors of the steps after the check name).
fn held_as(env: &CniEnv, held: &netns::ForeignNetns) -> String {
    format!(
        " (CNI_NETNS {:?}, held as {})",
        env.netns.as_deref().unwrap_or(Path::new("")),
        held.path().display()
    )
}

fn redirect_error(e: RedirectError, what: &str) -> CniError {
    let code = match &e {
        RedirectError::Netns(n) if n.is_missing() => ErrorCode::ContainerUnknown,
        // Another call on the same namespace held it past the lock wait: the runtime retries.
        RedirectError::Lock(_) => ErrorCode::TryAgainLater,
        _ => ErrorCode::Redirect,
    };
    CniError::new(code, format!("{what}: {e}"))
}

/// CNI_NETNS must name a network namespace other than the plugin's own and the host's:
/// programming either would redirect the node's traffic (issue 11, item 1). It is opened once
/// here; everything after reaches it through [`netns::ForeignNetns::path`], so a path re-pointed
/// while the pod is looked up cannot move the rules.
fn pod_netns(env: &CniEnv) -> Result<netns::ForeignNetns, CniError> {
    let path = env
        .netns
        .as_deref()
        .ok_or_else(|| CniError::new(ErrorCode::InvalidEnv, "CNI_NETNS is required"))?;
    netns::ForeignNetns::open(path).map_err(|e| netns_error(&e, path))
}

fn netns_error(e: &netns::ForeignError, path: &Path) -> CniError {
    let code = if e.is_missing() {
        ErrorCode::ContainerUnknown
    } else {
        ErrorCode::InvalidEnv
    };
    let consequence = match e {
        netns::ForeignError::Host { .. } | netns::ForeignError::Own { .. } => {
            "; refusing to program the node's own network namespace"
        }
        _ => "",
    };
    CniError::new(code, format!("CNI_NETNS {path:?}: {e}{consequence}"))
}

pub fn add(conf: &NetConf, env: &CniEnv) -> Result<Value, CniError> {
    // Convert first: an unusable prevResult fails before any rule is programmed.
    // Each step notes itself as the reason should it fail (`figures`, for the daemon).
    let result = cni::convert_result(conf.prev_result.as_ref(), &conf.cni_version)
        .map_err(failed("config_failed"))?;
    let netns = pod_netns(env).map_err(failed("netns_failed"))?;
    let args = parse_cni_args(&env.args).map_err(failed("config_failed"))?;
    match pod_action(conf, netns.path(), &args)? {
        PodAction::PassThrough => {}
        PodAction::Sidecar(plan) => {
            let detection = redirect::apply(&plan, Some(netns.path()), conf.backend)
                .map_err(|e| {
                    redirect_error(
                        e,
                        &format!("programming pod {}{}", pod_ref(&args), held_as(env, &netns)),
                    )
                })
                .map_err(failed("rules_failed"))?;
            tracing::info!(backend = %detection.backend, reason = %detection.reason, "redirect rules programmed");
        }
        PodAction::Ambient(pod) => {
            figures::mode("ambient");
            hand_off(conf, env, &args, &pod, &result, netns.id())
                .map_err(failed("handoff_failed"))?
        }
    }
    Ok(result)
}

/// Gives an ambient pod to the node agent and waits until its rules are in and ztunnel has
/// acknowledged it. Fails closed: no agent, no ztunnel, no pod (the runtime retries the
/// sandbox; the agent has rolled back whatever it had started).
fn hand_off(
    conf: &NetConf,
    env: &CniEnv,
    args: &K8sArgs,
    pod: &Pod,
    result: &Value,
    checked: netns::NsId,
) -> Result<(), CniError> {
    let req = AddPodRequest {
        netns: netns_text(env),
        pod_name: args.pod_name.clone(),
        pod_namespace: args.pod_namespace.clone(),
        pod_uid: if args.pod_uid.is_empty() {
            pod.metadata.uid.clone().unwrap_or_default()
        } else {
            args.pod_uid.clone()
        },
        ips: result_ips(result),
        netns_id: Some(NetnsId {
            dev: checked.dev,
            ino: checked.ino,
        }),
    };
    let socket = conf.settings.plugin_event_socket();
    let timeout = Duration::from_millis(conf.settings.ambient_handoff_timeout_ms);
    crate::agent::add(&socket, &req, timeout).map_err(|e| {
        let code = if e.is_unavailable() {
            ErrorCode::TryAgainLater
        } else {
            ErrorCode::Redirect
        };
        CniError::new(
            code,
            format!(
                "ambient pod {}: {e}; refusing to start the pod without ztunnel",
                pod_ref(args)
            ),
        )
    })?;
    tracing::info!(ips = ?req.ips, "ambient pod handed to the node agent; ztunnel serves it");
    Ok(())
}

/// `CNI_NETNS` as the agent receives it (empty when absent).
fn netns_text(env: &CniEnv) -> String {
    env.netns
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// The pod's addresses from the (converted) result, of any version (0.2.0's `ip4`/`ip6` too).
fn result_ips(result: &Value) -> Vec<IpAddr> {
    cni::result_ips(result)
}

/// Ambient mode: tell the agent the pod is going (best effort: DEL must not wedge a teardown;
/// an agent that misses it learns from its pod watch).
fn tell_agent_del(conf: &NetConf, env: &CniEnv, args: &K8sArgs) {
    if !conf.settings.ambient_enabled || route(conf, args) != Route::Lookup {
        return;
    }
    let req = DelPodRequest {
        netns: netns_text(env),
        pod_name: args.pod_name.clone(),
        pod_namespace: args.pod_namespace.clone(),
        pod_uid: args.pod_uid.clone(),
    };
    let socket = conf.settings.plugin_event_socket();
    match crate::agent::del(&socket, &req, Duration::from_secs(5)) {
        Ok(()) => tracing::info!("node agent told the pod is gone"),
        Err(e) => tracing::warn!(error = %e, "could not tell the node agent; its pod watch will"),
    }
}

pub fn check(conf: &NetConf, env: &CniEnv) -> Result<(), CniError> {
    let netns = pod_netns(env)?;
    let args = parse_cni_args(&env.args)?;
    let plan = match pod_action(conf, netns.path(), &args)? {
        PodAction::Sidecar(plan) => plan,
        // The agent keeps ambient pods' rules true (its reconcile); nothing to compare here.
        PodAction::PassThrough | PodAction::Ambient(_) => return Ok(()),
    };
    let diff = redirect::check(&plan, Some(netns.path()), conf.backend).map_err(|e| {
        redirect_error(
            e,
            &format!("checking pod {}{}", pod_ref(&args), held_as(env, &netns)),
        )
    })?;
    if diff.is_empty() {
        tracing::info!("redirect rules match the plan");
        return Ok(());
    }
    Err(CniError::new(
        ErrorCode::RulesDrift,
        format!(
            "pod {}: the redirect rules differ from the plan ({} difference(s)); to see where a \
             connection goes now and why: istio-nftables explain --network-namespace {} \
             --dst ADDR:PORT [--direction inbound] [--uid UID --gid GID] [--trace]",
            pod_ref(&args),
            diff.len(),
            env.netns
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "<netns>".into())
        ),
    )
    .with_details(diff.join("\n")))
}

pub fn del(conf: &NetConf, env: &CniEnv) -> Result<(), CniError> {
    // DEL must succeed as far as possible: a bad CNI_ARGS only costs us the log fields.
    match parse_cni_args(&env.args) {
        Ok(args) => tell_agent_del(conf, env, &args),
        Err(e) => tracing::warn!(error = %e, "ignoring CNI_ARGS on DEL"),
    }
    let Some(netns) = env.netns.as_deref() else {
        tracing::info!("no network namespace, nothing to remove");
        return Ok(());
    };
    // The host's or our own namespace, or no namespace at all: ADD never programmed it, so
    // there is nothing of ours to remove; an error would only wedge the pod's teardown.
    let held = match netns::ForeignNetns::open(netns) {
        Err(e) if e.is_missing() => {
            tracing::info!("network namespace already gone");
            return Ok(());
        }
        Err(e @ netns::ForeignError::Io { .. }) => return Err(netns_error(&e, netns)),
        Err(e) => {
            tracing::warn!(error = %netns_error(&e, netns), "DEL removes nothing there");
            return Ok(());
        }
        Ok(held) => held,
    };
    // Ambient mode: an ADD whose agent died mid-way may have left the pod's ambient rules
    // without ztunnel; the runtime's DEL after that failed ADD removes them.
    let scope = if conf.settings.ambient_enabled {
        redirect::Scope::ALL
    } else {
        redirect::Scope::SIDECAR
    };
    let deadline = std::time::Instant::now() + redirect::DEFAULT_LOCK_WAIT;
    match redirect::cleanup_scope_until(Some(held.path()), scope, deadline) {
        Ok(()) => {
            tracing::info!("redirect rules removed");
            Ok(())
        }
        Err(RedirectError::Netns(e)) if e.is_missing() => {
            tracing::info!("network namespace already gone");
            Ok(())
        }
        Err(e) => Err(redirect_error(e, "removing the redirect rules")),
    }
}

/// Ready when the kubeconfig the installer writes parses AND install-cni says the node is ready
/// (its marker in the run dir, its liveness lock held: see `cni_config::ready`). A daemon that
/// was SIGKILLed drops its lock with its life, so its leftover marker is not trusted.
pub fn status(conf: &NetConf) -> Result<(), CniError> {
    let not_ready = |e: String| {
        CniError::new(
            ErrorCode::NotAvailable,
            format!("istio-cni is not ready: {e}"),
        )
    };
    let path = conf.settings.kubeconfig_path();
    kubeconfig_ready(&path).map_err(|e| not_ready(e.to_string()))?;
    let marker =
        cni_config::ready::check(conf.settings.run_dir()).map_err(|e| not_ready(e.to_string()))?;
    tracing::debug!(ready = ?marker.ready, pid = marker.pid, "install-cni reports ready");
    Ok(())
}

fn kubeconfig_ready(path: &Path) -> Result<(), LookupError> {
    k8s::load_kubeconfig(path).map(|_| ())
}

/// Nothing lives outside pod namespaces, so there is nothing to collect.
pub fn gc(_conf: &NetConf) -> Result<(), CniError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::parse_netconf;

    fn conf() -> NetConf {
        parse_netconf(
            br#"{"cniVersion":"1.0.0","name":"n","pod_namespace":"istio-system","exclude_namespaces":["kube-system"]}"#,
        )
        .unwrap()
    }

    fn args(ns: &str, name: &str) -> K8sArgs {
        K8sArgs {
            pod_namespace: ns.into(),
            pod_name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn routes_before_any_lookup() {
        let c = conf();
        assert!(matches!(
            route(&c, &args("istio-system", "istio-cni-node-x7k2p")),
            Route::PassThrough(r) if r.contains("self")
        ));
        assert!(matches!(route(&c, &args("", "")), Route::PassThrough(_)));
        assert!(matches!(
            route(&c, &args("kube-system", "coredns")),
            Route::PassThrough(r) if r.contains("excluded")
        ));
        assert_eq!(route(&c, &args("default", "web")), Route::Lookup);
    }

    #[test]
    fn status_is_50_without_kubeconfig_and_gc_succeeds() {
        let mut c = conf();
        c.settings.cni_agent_run_dir = "/nonexistent/istio-cni".into();
        assert_eq!(status(&c).unwrap_err().code, ErrorCode::NotAvailable);
        assert!(gc(&c).is_ok());
    }
}
