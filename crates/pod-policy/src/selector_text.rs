//! Label and field selectors in the API server's text grammar, evaluated on the client side. The
//! node's pod cache watches every pod of the node (`spec.nodeName=<node>` only), so a consumer
//! with narrower selectors (the repair controller's `REPAIR_LABEL_SELECTORS` /
//! `REPAIR_FIELD_SELECTORS`) filters here instead of opening a second watch. The text parses into
//! the same requirements as a structured [`LabelSelector`](crate::selector::LabelSelector), and
//! is matched by the same code. Pure.

use crate::selector::{LabelSelectorRequirement as Req, SelectorOperator as Op};
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

fn req(key: &str, operator: Op, values: Vec<String>) -> Req {
    Req {
        key: key.trim().to_string(),
        operator,
        values,
    }
}

/// A parsed selector: every requirement must hold (the API server's AND).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(Vec<Req>);

/// A selector's text that does not parse: the whole `text`, and the requirement that failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid selector {text:?}: {why}")]
pub struct SelectorError {
    pub text: String,
    #[source]
    pub why: RequirementError,
}

/// One comma-separated requirement (`part`, trimmed) that is not in the grammar.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequirementError {
    /// Field selectors take only equality.
    #[error("{part:?} is not key=value or key!=value")]
    NotEquality { part: String },
    #[error("{part:?}: expected 'in (...)' or 'notin (...)'")]
    NotASet { part: String },
    #[error("{part:?} is empty")]
    Empty { part: String },
}

/// Splits on commas outside parentheses (`a in (x,y),b=c`).
fn split_top(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn set_values(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).collect())
}

fn parse_req(part: &str, set_based: bool) -> Result<Req, RequirementError> {
    let p = part.trim();
    let part = || p.to_string();
    if let Some((k, v)) = p.split_once("!=") {
        return Ok(req(k, Op::NotIn, vec![v.trim().into()]));
    }
    if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
        return Ok(req(k, Op::In, vec![v.trim().into()]));
    }
    if !set_based {
        return Err(RequirementError::NotEquality { part: part() });
    }
    let words: Vec<&str> = p.splitn(2, char::is_whitespace).collect();
    if let [k, rest] = words[..] {
        let rest = rest.trim_start();
        if let Some(vals) = rest.strip_prefix("notin").and_then(set_values) {
            return Ok(req(k, Op::NotIn, vals));
        }
        if let Some(vals) = rest.strip_prefix("in").and_then(set_values) {
            return Ok(req(k, Op::In, vals));
        }
        return Err(RequirementError::NotASet { part: part() });
    }
    match p.strip_prefix('!') {
        Some(k) if !k.trim().is_empty() => Ok(req(k, Op::DoesNotExist, Vec::new())),
        None if !p.is_empty() => Ok(req(p, Op::Exists, Vec::new())),
        _ => Err(RequirementError::Empty { part: part() }),
    }
}

fn parse(text: &str, set_based: bool) -> Result<Selector, SelectorError> {
    if text.trim().is_empty() {
        return Ok(Selector::default());
    }
    split_top(text)
        .into_iter()
        .map(|p| parse_req(p, set_based))
        .collect::<Result<Vec<_>, _>>()
        .map(Selector)
        .map_err(|why| SelectorError {
            text: text.into(),
            why,
        })
}

impl Selector {
    /// Selects no object at all.
    pub fn nothing() -> Selector {
        Selector(vec![req("", Op::In, Vec::new())])
    }

    /// A label selector (`a=b,c!=d,e in (x,y),f notin (z),g,!h`).
    pub fn labels(text: &str) -> Result<Selector, SelectorError> {
        parse(text, true)
    }

    /// A field selector (`a=b`, `a==b`, `a!=b`).
    pub fn fields(text: &str) -> Result<Selector, SelectorError> {
        parse(text, false)
    }

    fn holds(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|r| r.holds_for(get(&r.key).as_deref()))
    }

    pub fn matches_labels(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.holds(|k| labels.and_then(|l| l.get(k)).cloned())
    }

    /// The pod fields the API server supports in field selectors; an unknown field never
    /// matches (the API server would have refused the selector).
    pub fn matches_pod_fields(&self, pod: &Pod) -> bool {
        self.holds(|k| pod_field(pod, k))
    }
}

fn pod_field(pod: &Pod, field: &str) -> Option<String> {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let s = |o: Option<&String>| Some(o.cloned().unwrap_or_default());
    match field {
        "metadata.name" => s(pod.metadata.name.as_ref()),
        "metadata.namespace" => s(pod.metadata.namespace.as_ref()),
        "spec.nodeName" => s(spec.and_then(|x| x.node_name.as_ref())),
        "spec.restartPolicy" => s(spec.and_then(|x| x.restart_policy.as_ref())),
        "spec.schedulerName" => s(spec.and_then(|x| x.scheduler_name.as_ref())),
        "spec.serviceAccountName" => s(spec.and_then(|x| x.service_account_name.as_ref())),
        "spec.hostNetwork" => Some(
            spec.and_then(|x| x.host_network)
                .unwrap_or(false)
                .to_string(),
        ),
        "status.phase" => s(status.and_then(|x| x.phase.as_ref())),
        "status.podIP" => s(status.and_then(|x| x.pod_ip.as_ref())),
        "status.nominatedNodeName" => s(status.and_then(|x| x.nominated_node_name.as_ref())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_grammar() {
        let s = Selector::labels("app=web, tier!=db,env in (a, b),zone notin (x),team,!legacy")
            .unwrap();
        let ok = labels(&[("app", "web"), ("env", "b"), ("team", "t")]);
        assert!(s.matches_labels(Some(&ok)));
        for bad in [
            labels(&[("app", "api"), ("env", "b"), ("team", "t")]),
            labels(&[("app", "web"), ("env", "c"), ("team", "t")]),
            labels(&[("app", "web"), ("env", "b")]),
            labels(&[("app", "web"), ("env", "b"), ("team", "t"), ("legacy", "")]),
            labels(&[("app", "web"), ("env", "b"), ("team", "t"), ("zone", "x")]),
            labels(&[("app", "web"), ("env", "b"), ("team", "t"), ("tier", "db")]),
        ] {
            assert!(!s.matches_labels(Some(&bad)), "{bad:?}");
        }
        assert!(Selector::labels("").unwrap().matches_labels(None));
        assert!(!Selector::nothing().matches_labels(Some(&ok)));
        let part = |p: &str| p.to_string();
        for (parsed, why) in [
            (
                Selector::labels("a=b, a in x"),
                RequirementError::NotASet {
                    part: part("a in x"),
                },
            ),
            (
                Selector::fields("a in (x)"),
                RequirementError::NotEquality {
                    part: part("a in (x)"),
                },
            ),
            (
                Selector::labels("a,!"),
                RequirementError::Empty { part: part("!") },
            ),
        ] {
            assert_eq!(parsed.unwrap_err().why, why);
        }
        assert_eq!(
            Selector::labels("a in x").unwrap_err().to_string(),
            "invalid selector \"a in x\": \"a in x\": expected 'in (...)' or 'notin (...)'"
        );
    }

    #[test]
    fn pod_fields() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w", "namespace": "shop"},
            "spec": {"containers": [], "nodeName": "n1"},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        assert!(
            Selector::fields("metadata.namespace!=kube-system,status.phase=Running")
                .unwrap()
                .matches_pod_fields(&pod)
        );
        assert!(
            !Selector::fields("spec.nodeName=n2")
                .unwrap()
                .matches_pod_fields(&pod)
        );
        assert!(
            Selector::fields("spec.hostNetwork=false")
                .unwrap()
                .matches_pod_fields(&pod)
        );
    }
}
