//! Istio's enablement selectors: which pods ztunnel serves (Kubernetes `LabelSelector`s on the
//! pod and on its namespace). install-cni writes them into the plugin's entry and evaluates them
//! itself; the plugin evaluates them on ADD: one type and one matcher, so the two can never
//! disagree on which pod is ambient. Pure.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The label that enrolls pods and namespaces (`istio.io/dataplane-mode`).
pub const DATAPLANE_MODE_LABEL: &str = "istio.io/dataplane-mode";
/// Its value that enrolls.
pub const DATAPLANE_MODE_AMBIENT: &str = "ambient";
/// Its value that opts a pod out, whatever its namespace says.
pub const DATAPLANE_MODE_NONE: &str = "none";

/// A Kubernetes `LabelSelector` (`matchLabels` AND every `matchExpressions` entry).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One of Istio's `enablement_selectors`: a pod is ambient when its labels match
/// `podSelector` and its namespace's labels match `namespaceSelector` (an absent selector
/// matches everything, as in Istio).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnablementSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error("matchExpressions key {key:?}: operator {operator:?} needs at least one value")]
    MissingValues {
        key: String,
        operator: SelectorOperator,
    },
    #[error("matchExpressions key {key:?}: operator {operator:?} takes no values (got {values:?})")]
    UnexpectedValues {
        key: String,
        operator: SelectorOperator,
        values: Vec<String>,
    },
    #[error("a label key must not be empty")]
    EmptyKey,
}

type Labels = BTreeMap<String, String>;

impl LabelSelector {
    /// Rejects what the API server rejects (`metav1.LabelSelectorAsSelector`).
    pub fn validate(&self) -> Result<(), SelectorError> {
        if self.match_labels.keys().any(|k| k.is_empty()) {
            return Err(SelectorError::EmptyKey);
        }
        for r in &self.match_expressions {
            if r.key.is_empty() {
                return Err(SelectorError::EmptyKey);
            }
            let takes_values = matches!(r.operator, SelectorOperator::In | SelectorOperator::NotIn);
            if takes_values && r.values.is_empty() {
                return Err(SelectorError::MissingValues {
                    key: r.key.clone(),
                    operator: r.operator,
                });
            }
            if !takes_values && !r.values.is_empty() {
                return Err(SelectorError::UnexpectedValues {
                    key: r.key.clone(),
                    operator: r.operator,
                    values: r.values.clone(),
                });
            }
        }
        Ok(())
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }
}

impl LabelSelectorRequirement {
    fn matches(&self, labels: &Labels) -> bool {
        self.holds_for(labels.get(&self.key).map(String::as_str))
    }

    /// Whether the requirement holds for its key's value (`None`: the key is absent). Shared
    /// by label selectors and the API server's text grammar (`selector_text`), labels and fields.
    pub fn holds_for(&self, value: Option<&str>) -> bool {
        let listed = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator {
            SelectorOperator::In => value.is_some_and(listed),
            // As in Kubernetes: an absent label is "not in" any set.
            SelectorOperator::NotIn => value.is_none_or(|v| !listed(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
    }
}

impl EnablementSelector {
    pub fn validate(&self) -> Result<(), SelectorError> {
        for s in [&self.pod_selector, &self.namespace_selector]
            .into_iter()
            .flatten()
        {
            s.validate()?;
        }
        Ok(())
    }

    pub fn matches(&self, pod_labels: &Labels, namespace_labels: &Labels) -> bool {
        self.pod_selector
            .as_ref()
            .is_none_or(|s| s.matches(pod_labels))
            && self
                .namespace_selector
                .as_ref()
                .is_none_or(|s| s.matches(namespace_labels))
    }
}

/// Whether any selector enrolls the pod (selectors only; the other exclusions — sidecar pods,
/// host network, excluded namespaces — are the caller's).
pub fn selected(selectors: &[EnablementSelector], pod_labels: &Labels, ns_labels: &Labels) -> bool {
    selectors.iter().any(|s| s.matches(pod_labels, ns_labels))
}

/// Istio's chart default (`ambient.enablementSelectors`): the pod labelled
/// `istio.io/dataplane-mode=ambient`, or its namespace labelled so and the pod not `none`.
pub fn default_selectors() -> Vec<EnablementSelector> {
    let mode = |v: &str| BTreeMap::from([(DATAPLANE_MODE_LABEL.to_string(), v.to_string())]);
    vec![
        EnablementSelector {
            pod_selector: Some(LabelSelector {
                match_labels: mode(DATAPLANE_MODE_AMBIENT),
                ..LabelSelector::default()
            }),
            namespace_selector: None,
        },
        EnablementSelector {
            pod_selector: Some(LabelSelector {
                match_labels: BTreeMap::new(),
                match_expressions: vec![LabelSelectorRequirement {
                    key: DATAPLANE_MODE_LABEL.into(),
                    operator: SelectorOperator::NotIn,
                    values: vec![DATAPLANE_MODE_NONE.into()],
                }],
            }),
            namespace_selector: Some(LabelSelector {
                match_labels: mode(DATAPLANE_MODE_AMBIENT),
                ..LabelSelector::default()
            }),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn istio_defaults_enroll_by_pod_or_namespace_label_and_none_opts_out() {
        let sel = default_selectors();
        let ambient = labels(&[(DATAPLANE_MODE_LABEL, "ambient")]);
        let none = labels(&[(DATAPLANE_MODE_LABEL, "none")]);
        let plain = labels(&[("app", "x")]);
        assert!(selected(&sel, &ambient, &plain));
        assert!(selected(&sel, &plain, &ambient));
        assert!(!selected(&sel, &none, &ambient));
        assert!(!selected(&sel, &plain, &plain));
        // A pod label "none" with the pod selector's own "ambient" cannot both hold.
        assert!(!selected(&sel, &none, &plain));
    }

    #[test]
    fn istio_chart_yaml_parses_to_the_defaults() {
        let json = r#"[{"podSelector":{"matchLabels":{"istio.io/dataplane-mode":"ambient"}}},
            {"podSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]},
             "namespaceSelector":{"matchLabels":{"istio.io/dataplane-mode":"ambient"}}}]"#;
        let parsed: Vec<EnablementSelector> = serde_json::from_str(json).unwrap();
        assert_eq!(parsed, default_selectors());
        let round: Vec<EnablementSelector> =
            serde_json::from_value(serde_json::to_value(&parsed).unwrap()).unwrap();
        assert_eq!(round, parsed);
    }

    #[test]
    fn invalid_selectors_are_named() {
        let bad = LabelSelector {
            match_expressions: vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: SelectorOperator::In,
                values: vec![],
            }],
            ..LabelSelector::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("\"k\""));
        let typo = serde_json::from_str::<EnablementSelector>(r#"{"podSelectr":{}}"#);
        assert!(typo.unwrap_err().to_string().contains("podSelectr"));
        let op =
            serde_json::from_str::<LabelSelectorRequirement>(r#"{"key":"k","operator":"Maybe"}"#);
        assert!(op.unwrap_err().to_string().contains("Maybe"));
    }

    #[test]
    fn expressions_follow_kubernetes_semantics() {
        let req = |operator, values: &[&str]| LabelSelector {
            match_expressions: vec![LabelSelectorRequirement {
                key: "k".into(),
                operator,
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
            ..LabelSelector::default()
        };
        let with = labels(&[("k", "a")]);
        let without = labels(&[]);
        assert!(req(SelectorOperator::In, &["a", "b"]).matches(&with));
        assert!(!req(SelectorOperator::In, &["a"]).matches(&without));
        assert!(req(SelectorOperator::NotIn, &["b"]).matches(&with));
        assert!(req(SelectorOperator::NotIn, &["a"]).matches(&without));
        assert!(req(SelectorOperator::Exists, &[]).matches(&with));
        assert!(req(SelectorOperator::DoesNotExist, &[]).matches(&without));
        assert!(LabelSelector::default().matches(&without));
    }
}
