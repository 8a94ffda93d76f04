//! core/v1 Events on pods, as Istio's recorders write them: the repair controller's, the
//! reconciler's and the ambient agent's. One writer for every job of the daemon.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Api;
use kube::api::PostParams;

/// A core/v1 Event on the pod, reported by `component` on `node`.
pub fn event_from(
    component: &str,
    pod: &Pod,
    node: &str,
    warning: bool,
    reason: &str,
    message: &str,
) -> Event {
    let (ns, name) = ns_name(pod);
    let now = k8s_openapi::jiff::Timestamp::now();
    let nanos = now.as_nanosecond();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{nanos:x}")),
            namespace: Some(ns.to_string()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..Default::default()
        },
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        source: Some(EventSource {
            component: Some(component.into()),
            host: Some(node.to_string()),
        }),
        reporting_component: Some(component.into()),
        reporting_instance: Some(node.to_string()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..Default::default()
    }
}

/// Writes the event; a failure is logged (an Event is best effort, never a job's failure).
pub async fn post_event(client: &kube::Client, pod: &Pod, ev: &Event) {
    let (ns, name) = ns_name(pod);
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    if let Err(e) = api.create(&PostParams::default(), ev).await {
        tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "could not write the event");
    }
}

fn ns_name(pod: &Pod) -> (&str, &str) {
    (
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or(""),
    )
}
