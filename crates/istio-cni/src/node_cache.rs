//! The pod (and its namespace) from the node daemon's caches over `<run_dir>/pods.sock`
//! ([`cni_config::lookup`]): no API request per pod start. Bounded by a small share of the
//! lookup's deadline; any miss (no daemon, a hung one, a pod its watch has not delivered) is
//! reported and the caller asks the API server with the time that is left.

use crate::settings::K8sArgs;
use cni_config::lookup::{PodAnswer, PodQuery};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use std::path::Path;
use std::time::Duration;
use uds_http::Method;

/// The daemon may wait this long for its watch to deliver a pod it has not seen yet (the
/// scheduler's binding reaches the watch before kubelet starts the sandbox, so this is rare).
const MAX_WAIT: Duration = Duration::from_secs(1);
/// On top of the wait: the daemon's own answer time.
const ANSWER_SLACK: Duration = Duration::from_millis(500);

/// The pod and, when asked, its namespace; `Err` says why the caller must ask the API server.
pub fn ask(
    socket: &Path,
    args: &K8sArgs,
    with_namespace: bool,
    deadline: Duration,
) -> Result<(Pod, Option<Namespace>), String> {
    let query = PodQuery {
        namespace: args.pod_namespace.clone(),
        name: args.pod_name.clone(),
        uid: (!args.pod_uid.is_empty()).then(|| args.pod_uid.clone()),
        with_namespace,
        wait: MAX_WAIT.min(deadline / 4),
    };
    let timeout = query.wait + ANSWER_SLACK;
    let answer = uds_http::client::request(socket, Method::GET, &query.to_path(), vec![], timeout)
        .map_err(|e| e.to_string())?;
    if answer.status != 200 {
        return Err(format!(
            "the node daemon answered {}: {}",
            answer.status,
            answer.text()
        ));
    }
    let text =
        std::str::from_utf8(&answer.body).map_err(|e| format!("the node daemon's answer: {e}"))?;
    let found: PodAnswer<Pod, Namespace> =
        pod_policy::json::decode(text, "node daemon's pod").map_err(|e| e.to_string())?;
    if with_namespace && found.namespace.is_none() {
        return Err("the node daemon's answer has no namespace".into());
    }
    Ok((found.pod, found.namespace))
}
