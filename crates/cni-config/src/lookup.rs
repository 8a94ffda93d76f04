//! The pod lookup between plugin and node daemon (`<cni_agent_run_dir>/pods.sock`): the plugin
//! asks for the pod it is ADDing (and, for ambient detection, its namespace); the daemon answers
//! from the node's pod and namespace caches, which it keeps anyway. A pod start then costs the
//! API server nothing. `GET /pod?namespace=..&name=..[&uid=..][&with_namespace=true]&wait_ms=..`
//!
//! Answers: 200 with a [`PodAnswer`] (the objects as the API server serves them); 404 when the
//! caches do not hold the pod (or its namespace) within the wait; 400 for a bad query. The
//! plugin falls back to its own GET for anything but 200, so the daemon is an optimisation,
//! never a dependency.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Socket file name inside the run dir (root only, as the ambient event socket).
pub const POD_LOOKUP_SOCKET: &str = "pods.sock";
pub const POD_PATH: &str = "/pod";
/// The daemon waits at most this long for its watch to deliver a pod it has not seen yet,
/// whatever the plugin asks.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

/// Which pod; `uid` (CNI's `K8S_POD_UID`) tells an old pod of the same name from the new one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodQuery {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub with_namespace: bool,
    /// How long the daemon may wait for its caches to see the pod.
    pub wait: Duration,
}

impl PodQuery {
    /// The request's path and query string.
    pub fn to_path(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("namespace", &self.namespace)
            .append_pair("name", &self.name);
        if let Some(uid) = &self.uid {
            q.append_pair("uid", uid);
        }
        if self.with_namespace {
            q.append_pair("with_namespace", "true");
        }
        q.append_pair("wait_ms", &self.wait.as_millis().to_string());
        format!("{POD_PATH}?{}", q.finish())
    }

    /// Parses a query string; the error names the field and value. The wait is capped at
    /// [`MAX_WAIT`].
    pub fn from_query(query: &str) -> Result<PodQuery, QueryError> {
        let mut q = PodQuery {
            namespace: String::new(),
            name: String::new(),
            uid: None,
            with_namespace: false,
            wait: Duration::ZERO,
        };
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "namespace" => q.namespace = v.into_owned(),
                "name" => q.name = v.into_owned(),
                "uid" if !v.is_empty() => q.uid = Some(v.into_owned()),
                "uid" => {}
                "with_namespace" => {
                    q.with_namespace = v.parse().map_err(|source| QueryError::WithNamespace {
                        value: v.to_string(),
                        source,
                    })?
                }
                "wait_ms" => {
                    let ms: u64 = v.parse().map_err(|source| QueryError::WaitMs {
                        value: v.to_string(),
                        source,
                    })?;
                    q.wait = Duration::from_millis(ms).min(MAX_WAIT);
                }
                other => return Err(QueryError::UnknownField(other.into())),
            }
        }
        for (field, value) in [("namespace", &q.namespace), ("name", &q.name)] {
            if value.is_empty() {
                return Err(QueryError::Missing(field));
            }
        }
        Ok(q)
    }
}

/// A pod lookup query the daemon cannot read (answered 400); each names the field and value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("with_namespace {value:?}: not true or false")]
    WithNamespace {
        value: String,
        source: std::str::ParseBoolError,
    },
    #[error("wait_ms {value:?}: not a number of milliseconds")]
    WaitMs {
        value: String,
        source: std::num::ParseIntError,
    },
    #[error("unknown field {0:?}")]
    UnknownField(String),
    #[error("{0} is missing")]
    Missing(&'static str),
}

/// The daemon's answer: the objects exactly as its watches received them from the API server.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodAnswer<P, N> {
    pub pod: P,
    #[serde(default)]
    pub namespace: Option<N>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_survives_the_round_trip_with_hostile_characters() {
        let q = PodQuery {
            namespace: "ns&x=1".into(),
            name: "a b/%?".into(),
            uid: Some("u#1".into()),
            with_namespace: true,
            wait: Duration::from_millis(750),
        };
        let path = q.to_path();
        let query = path.strip_prefix("/pod?").unwrap();
        assert_eq!(PodQuery::from_query(query).unwrap(), q);
    }

    #[test]
    fn bad_queries_name_the_field() {
        for (query, want) in [
            ("name=a", "namespace is missing"),
            ("namespace=a", "name is missing"),
            ("namespace=a&name=b&wait_ms=soon", "wait_ms \"soon\""),
            (
                "namespace=a&name=b&with_namespace=yes",
                "with_namespace \"yes\"",
            ),
            ("namespace=a&name=b&color=red", "unknown field \"color\""),
        ] {
            let e = PodQuery::from_query(query).unwrap_err().to_string();
            assert!(e.contains(want), "{query}: {e}");
        }
    }

    #[test]
    fn the_wait_is_capped() {
        let q = PodQuery::from_query("namespace=a&name=b&wait_ms=999999999").unwrap();
        assert_eq!(q.wait, MAX_WAIT);
    }
}
