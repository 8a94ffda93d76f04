//! Kubernetes objects from the JSON an API answered with (the API server, or the node daemon's
//! cache): strictly one JSON value with no key twice in one object, decoded by serde with the
//! path of the field that did not decode in the error, so a bad object is reported, never
//! half-read.

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

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
    /// An object names a key twice (`at`: the object's path).
    #[error("the {kind} JSON {source}, in the object at {at}")]
    RepeatedKey {
        kind: String,
        at: String,
        source: serde_json::Error,
    },
}

/// `text` as a `kind` object (`"Pod"`, `"Namespace"`); anything after the value but white
/// space is an error (`{...}}}}` is not a Pod), and so is a key given twice in one object:
/// the generated decoders keep the last one silently, so `{"metadata":{…sidecar…},
/// "metadata":{}}` would read as a pod outside the mesh.
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
    refuse_duplicate_keys(text).map_err(|(at, source)| DecodeError::RepeatedKey {
        kind: kind.into(),
        at,
        source,
    })?;
    Ok(value)
}

/// Walks the (already valid) JSON once without building it, failing on the first object that
/// names a key twice: the object's path and the parser's error (naming the key).
fn refuse_duplicate_keys(text: &str) -> Result<(), (String, serde_json::Error)> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize::<_, UniqueKeys>(&mut de)
        .map(|_| ())
        .map_err(|e| {
            let path = e.path().to_string();
            let at = if path == "." {
                "the top level".into()
            } else {
                path
            };
            (at, e.into_inner())
        })
}

/// Any JSON value, checked for repeated keys in every object it contains.
struct UniqueKeys;

impl<'de> de::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

/// Objects up to this many keys are checked by a scan, larger ones through a set (a hostile
/// object with 100 000 keys costs no more than its parse).
const SCAN_LIMIT: usize = 16;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut seen: Vec<Cow<'de, str>> = Vec::new();
        let mut large: HashSet<Cow<'de, str>> = HashSet::new();
        while let Some(key) = map.next_key_seed(Key)? {
            let repeated = if large.is_empty() && seen.len() < SCAN_LIMIT {
                let r = seen.contains(&key);
                seen.push(key.clone());
                r
            } else {
                large.extend(seen.drain(..));
                !large.insert(key.clone())
            };
            if repeated {
                return Err(de::Error::custom(format_args!(
                    "names the key {key:?} twice in one object"
                )));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}

/// An object's key, borrowed from the text unless it had escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E>(self, s: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
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

    #[test]
    fn a_key_twice_in_one_object_is_refused_with_its_path() {
        let sidecar = r#"{"annotations":{"sidecar.istio.io/status":"{}"}}"#;
        for (bad, path) in [
            (
                format!(r#"{{"metadata":{sidecar},"metadata":{{}}}}"#),
                "the top level",
            ),
            (
                r#"{"metadata":{"annotations":{"a":"1","b":"2","a":"3"}}}"#.to_string(),
                "metadata.annotations",
            ),
            (
                r#"{"spec":{"containers":[{"name":"x"},{"name":"y","name":"z"}]}}"#.to_string(),
                "spec.containers[1]",
            ),
            // The same key spelled with an escape is the same key.
            (
                r#"{"metadata":{"name":"p","na\u006de":"q"}}"#.to_string(),
                "metadata",
            ),
        ] {
            let e = decode::<Pod>(&bad, "Pod").unwrap_err().to_string();
            assert!(e.contains("twice in one object"), "{bad}: {e}");
            assert!(
                e.ends_with(&format!("in the object at {path}")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn large_objects_are_checked_too() {
        let keys: Vec<String> = (0..100).map(|i| format!(r#""k{i}":"v""#)).collect();
        let ok = format!(r#"{{"metadata":{{"labels":{{{}}}}}}}"#, keys.join(","));
        assert!(decode::<Pod>(&ok, "Pod").is_ok());
        let bad = format!(
            r#"{{"metadata":{{"labels":{{{},"k7":"again"}}}}}}"#,
            keys.join(",")
        );
        let e = decode::<Pod>(&bad, "Pod").unwrap_err().to_string();
        assert!(e.contains(r#"the key "k7" twice"#), "{e}");
    }

    #[test]
    fn the_same_key_in_different_objects_is_fine() {
        let pod = r#"{"metadata":{"name":"p","labels":{"name":"x"}},"spec":{"containers":[{"name":"a"},{"name":"b"}]}}"#;
        assert!(decode::<Pod>(pod, "Pod").is_ok());
    }
}
