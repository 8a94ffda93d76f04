//! Kubernetes objects from the JSON an API answered with (the API server, or the node daemon's
//! cache): strictly one JSON value, decoded by serde with the path of the field that did not
//! decode in the error, so a bad object is reported, never half-read.

use serde::de::DeserializeOwned;

/// Why an object did not decode; `kind` is what was decoded (`"Pod"`, `"Namespace"`).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A field did not decode: `at` is its JSON path, or "the top level".
    #[error("the {kind} JSON does not decode at {at}: {source}")]
    Field {
        kind: String,
        at: String,
        source: serde_json::Error,
    },
    /// Something other than white space follows the value.
    #[error("the {kind} JSON is not one JSON value: {source}")]
    Trailing {
        kind: String,
        source: serde_json::Error,
    },
}

/// `text` as a `kind` object (`"Pod"`, `"Namespace"`); anything after the value but white
/// space is an error (`{...}}}}` is not a Pod).
pub fn decode<T: DeserializeOwned>(text: &str, kind: &str) -> Result<T, DecodeError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        DecodeError::Field {
            kind: kind.into(),
            at: if path == "." {
                "the top level".into()
            } else {
                path
            },
            source: e.into_inner(),
        }
    })?;
    de.end().map_err(|source| DecodeError::Trailing {
        kind: kind.into(),
        source,
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn exactly_one_value() {
        let pod = r#"{"metadata":{"name":"p"}}"#;
        assert!(decode::<Pod>(pod, "Pod").is_ok());
        assert!(decode::<Pod>(&format!(" {pod}\n"), "Pod").is_ok());
        for bad in [
            format!("{pod}}}}}}}"),
            format!("{pod} x"),
            format!("{pod}{pod}"),
        ] {
            let e = decode::<Pod>(&bad, "Pod").unwrap_err().to_string();
            assert!(e.contains("trailing characters"), "{bad}: {e}");
        }
        let e = decode::<Pod>(r#"{"spec":{"containers":"x"}}"#, "Pod")
            .unwrap_err()
            .to_string();
        assert!(e.contains("spec.containers"), "{e}");
    }
}
