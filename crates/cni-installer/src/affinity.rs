//! Whether the DaemonSet still schedules a pod onto this node (Istio release note 58768): its
//! pod template's required node affinity, as Istio's `ShouldStopCleanup` checks it
//! (`nodeaffinity.NewNodeSelector(...).Match(node)`), and its `nodeSelector`, which Istio does
//! not check but the DaemonSet controller applies the same way: a node that matches neither no
//! longer gets a daemon, so a plugin kept "for the next daemon" would stay there for good.
//!
//! The rules are Kubernetes' (`k8s.io/component-helpers/scheduling/corev1/nodeaffinity`):
//! terms are ORed, a term's expressions and fields ANDed, an empty term matches nothing;
//! `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt` on labels; `metadata.name` with `In` or
//! `NotIn` as the only field. A rule Kubernetes would refuse to parse is an error here too.
//! Pure.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement};
use std::collections::BTreeMap;

/// The scheduling rules of the DaemonSet's pods that depend on the node.
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    pub node_selector: BTreeMap<String, String>,
    pub required: Option<NodeSelector>,
}

impl Rules {
    /// `None`: the pods go to every node (nothing to check, no node to read).
    pub fn of(ds: &DaemonSet) -> Option<Rules> {
        let pod = ds.spec.as_ref()?.template.spec.as_ref()?;
        let node_selector = pod.node_selector.clone().unwrap_or_default();
        let required = pod
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .clone()
            });
        (!node_selector.is_empty() || required.is_some()).then_some(Rules {
            node_selector,
            required,
        })
    }

    /// Whether `node` satisfies both; `Err` names a rule Kubernetes would not accept.
    pub fn matches(&self, node: &Node) -> Result<bool, RuleError> {
        let empty = BTreeMap::new();
        let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
        let name = node.metadata.name.as_deref().unwrap_or("");
        let by_selector = self
            .node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        let by_affinity = match &self.required {
            None => true,
            Some(sel) => selector_matches(sel, labels, name)?,
        };
        Ok(by_selector && by_affinity)
    }

    /// For logs: `nodeSelector {..}` and/or the required affinity, short.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.node_selector.is_empty() {
            parts.push(format!("nodeSelector {:?}", self.node_selector));
        }
        if let Some(r) = &self.required {
            parts.push(format!(
                "required node affinity ({} term(s))",
                r.node_selector_terms.len()
            ));
        }
        parts.join(" and ")
    }
}

/// A node selector requirement Kubernetes would refuse: which list it is in, its key and
/// operator, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{list} {key} {operator}: {problem}")]
pub struct RuleError {
    /// `matchExpressions` or `matchFields`.
    pub list: &'static str,
    pub key: String,
    pub operator: String,
    pub problem: RuleProblem,
}

/// What is wrong with a requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleProblem {
    #[error("needs values")]
    NeedsValues,
    #[error("takes no values")]
    TakesNoValues,
    #[error("needs exactly one value")]
    NeedsOneValue,
    #[error("its value is not an integer")]
    NotAnInteger,
    #[error("unknown operator")]
    UnknownOperator,
    #[error("only metadata.name is supported")]
    UnsupportedField,
    #[error("only In and NotIn are supported")]
    UnsupportedFieldOperator,
}

impl RuleError {
    fn new(list: &'static str, r: &NodeSelectorRequirement, problem: RuleProblem) -> RuleError {
        RuleError {
            list,
            key: r.key.clone(),
            operator: r.operator.clone(),
            problem,
        }
    }
}

fn selector_matches(
    sel: &NodeSelector,
    labels: &BTreeMap<String, String>,
    name: &str,
) -> Result<bool, RuleError> {
    let mut any = false;
    // Every term is parsed (an invalid one is an error even after a match, as in Kubernetes).
    for term in &sel.node_selector_terms {
        let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
        let fields = term.match_fields.as_deref().unwrap_or(&[]);
        let mut ok = !(exprs.is_empty() && fields.is_empty());
        for r in exprs {
            ok &= label_matches(r, labels)?;
        }
        for r in fields {
            ok &= field_matches(r, name)?;
        }
        any |= ok;
    }
    Ok(any)
}

fn label_matches(
    r: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Result<bool, RuleError> {
    use RuleProblem::*;
    let values = r.values.as_deref().unwrap_or(&[]);
    let got = labels.get(&r.key);
    let bad = |problem| Err(RuleError::new("matchExpressions", r, problem));
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => bad(NeedsValues),
        "In" => Ok(got.is_some_and(|v| values.contains(v))),
        "NotIn" => Ok(!got.is_some_and(|v| values.contains(v))),
        "Exists" | "DoesNotExist" if !values.is_empty() => bad(TakesNoValues),
        "Exists" => Ok(got.is_some()),
        "DoesNotExist" => Ok(got.is_none()),
        "Gt" | "Lt" => {
            let [want] = values else {
                return bad(NeedsOneValue);
            };
            let Ok(want) = want.parse::<i64>() else {
                return bad(NotAnInteger);
            };
            // A label that is absent or not an integer does not match.
            Ok(match got.and_then(|v| v.parse::<i64>().ok()) {
                Some(v) if r.operator == "Gt" => v > want,
                Some(v) => v < want,
                None => false,
            })
        }
        _ => bad(UnknownOperator),
    }
}

fn field_matches(r: &NodeSelectorRequirement, name: &str) -> Result<bool, RuleError> {
    use RuleProblem::*;
    let values = r.values.as_deref().unwrap_or(&[]);
    let bad = |problem| Err(RuleError::new("matchFields", r, problem));
    if r.key != "metadata.name" {
        return bad(UnsupportedField);
    }
    let [want] = values else {
        return bad(NeedsOneValue);
    };
    match r.operator.as_str() {
        "In" => Ok(name == want),
        "NotIn" => Ok(name != want),
        _ => bad(UnsupportedFieldOperator),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(pod_spec: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "istio-cni-node"},
            "spec": {"selector": {}, "template": {"spec": pod_spec}}
        }))
        .unwrap()
    }

    fn node(name: &str, labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn required(terms: serde_json::Value) -> DaemonSet {
        ds(json!({"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}))
    }

    #[test]
    fn no_rules_no_check() {
        assert_eq!(Rules::of(&ds(json!({"containers": []}))), None);
        assert_eq!(Rules::of(&DaemonSet::default()), None);
        // Preferred affinity does not decide where the DaemonSet runs.
        let preferred = ds(json!({"containers": [], "affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]}}}));
        assert_eq!(Rules::of(&preferred), None);
    }

    #[test]
    fn node_selector_needs_every_label() {
        let r = Rules::of(&ds(json!({"containers": [],
            "nodeSelector": {"kubernetes.io/os": "linux", "mesh": "on"}})))
        .unwrap();
        let n = |labels| node("worker-1", labels);
        assert!(
            r.matches(&n(
                json!({"kubernetes.io/os": "linux", "mesh": "on", "x": "y"})
            ))
            .unwrap()
        );
        assert!(!r.matches(&n(json!({"kubernetes.io/os": "linux"}))).unwrap());
        assert!(
            !r.matches(&n(json!({"kubernetes.io/os": "linux", "mesh": "off"})))
                .unwrap()
        );
    }

    #[test]
    fn required_affinity_terms_are_ored_and_requirements_anded() {
        let r = Rules::of(&required(json!([
            {"matchExpressions": [
                {"key": "mesh", "operator": "In", "values": ["on", "yes"]},
                {"key": "retired", "operator": "DoesNotExist"}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}
        ])))
        .unwrap();
        assert!(r.matches(&node("a", json!({"mesh": "yes"}))).unwrap());
        assert!(
            !r.matches(&node("a", json!({"mesh": "yes", "retired": ""})))
                .unwrap()
        );
        assert!(!r.matches(&node("a", json!({"mesh": "no"}))).unwrap());
        assert!(r.matches(&node("special", json!({}))).unwrap());
        // No terms, or only empty ones: no node matches.
        for terms in [json!([]), json!([{}]), json!([{"matchExpressions": []}])] {
            let r = Rules::of(&required(terms.clone())).unwrap();
            assert!(
                !r.matches(&node("a", json!({"mesh": "on"}))).unwrap(),
                "{terms}"
            );
        }
    }

    #[test]
    fn operators_as_kubernetes_reads_them() {
        let one = |op: &str, values: serde_json::Value| {
            Rules::of(&required(
                json!([{"matchExpressions": [{"key": "gen", "operator": op, "values": values}]}]),
            ))
            .unwrap()
        };
        let n = |v: Option<&str>| match v {
            Some(v) => node("a", json!({ "gen": v })),
            None => node("a", json!({})),
        };
        assert!(one("NotIn", json!(["1"])).matches(&n(None)).unwrap());
        assert!(!one("NotIn", json!(["1"])).matches(&n(Some("1"))).unwrap());
        assert!(one("Exists", json!([])).matches(&n(Some(""))).unwrap());
        assert!(one("Gt", json!(["3"])).matches(&n(Some("4"))).unwrap());
        assert!(!one("Gt", json!(["3"])).matches(&n(Some("3"))).unwrap());
        assert!(!one("Gt", json!(["3"])).matches(&n(Some("four"))).unwrap());
        assert!(one("Lt", json!(["3"])).matches(&n(Some("-1"))).unwrap());
        for (op, values, problem) in [
            ("In", json!([]), RuleProblem::NeedsValues),
            ("Exists", json!(["x"]), RuleProblem::TakesNoValues),
            ("Gt", json!(["1", "2"]), RuleProblem::NeedsOneValue),
            ("Lt", json!(["x"]), RuleProblem::NotAnInteger),
            ("Near", json!(["1"]), RuleProblem::UnknownOperator),
        ] {
            let e = one(op, values.clone()).matches(&n(Some("1"))).unwrap_err();
            assert_eq!(
                (e.key.as_str(), e.problem),
                ("gen", problem),
                "{op} {values}"
            );
        }
        let field = |key: &str, op: &str| {
            Rules::of(&required(
                json!([{"matchFields": [{"key": key, "operator": op, "values": ["a"]}]}]),
            ))
            .unwrap()
        };
        assert!(!field("metadata.name", "NotIn").matches(&n(None)).unwrap());
        let e = field("metadata.uid", "In").matches(&n(None)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matchFields metadata.uid In: only metadata.name is supported"
        );
        let e = field("metadata.name", "Exists")
            .matches(&n(None))
            .unwrap_err();
        assert_eq!(e.problem, RuleProblem::UnsupportedFieldOperator);
    }

    /// Both rules apply (the DaemonSet controller checks both).
    #[test]
    fn selector_and_affinity_together() {
        let r = Rules::of(&ds(json!({"containers": [],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions":
                    [{"key": "mesh", "operator": "In", "values": ["on"]}]}]}}}})))
        .unwrap();
        assert!(
            r.matches(&node(
                "a",
                json!({"kubernetes.io/os": "linux", "mesh": "on"})
            ))
            .unwrap()
        );
        assert!(!r.matches(&node("a", json!({"mesh": "on"}))).unwrap());
        assert!(
            !r.matches(&node("a", json!({"kubernetes.io/os": "linux"})))
                .unwrap()
        );
        assert!(r.describe().contains("nodeSelector") && r.describe().contains("affinity"));
    }
}
