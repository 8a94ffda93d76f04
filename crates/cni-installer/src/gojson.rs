//! CNI config JSON read the way the runtime reads it. libcni (Go's `encoding/json`) accepts
//! text that serde_json refuses: invalid UTF-8 inside strings and lone UTF-16 surrogate
//! escapes (`"\ud800"`) both become U+FFFD. A file the runtime loads must never be skipped by
//! us (we would chain into a later file the runtime does not use), so both are replaced the
//! same way before parsing. Re-serialised, such a file carries U+FFFD, as Go's would.

use serde_json::Value;
use std::borrow::Cow;

/// `bytes` parsed as JSON with Go's leniency (module doc).
pub fn parse(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let text = String::from_utf8_lossy(bytes);
    serde_json::from_str(&replace_lone_surrogates(&text))
}

/// `text` with every `\uXXXX` escape of a surrogate that is not part of a high + low pair
/// replaced by `\ufffd`. Only escapes inside strings are looked at.
fn replace_lone_surrogates(text: &str) -> Cow<'_, str> {
    let b = text.as_bytes();
    let mut out: Option<String> = None;
    let (mut i, mut copied, mut in_string) = (0, 0, false);
    while i < b.len() {
        match b[i] {
            b'"' => in_string = !in_string,
            b'\\' if in_string => {
                let Some(unit) = escape_unit(b, i) else {
                    i += 2; // any other escape: skip the escaped byte
                    continue;
                };
                let paired = (0xD800..0xDC00).contains(&unit)
                    && escape_unit(b, i + 6).is_some_and(|lo| (0xDC00..0xE000).contains(&lo));
                if paired {
                    i += 12;
                    continue;
                }
                if (0xD800..0xE000).contains(&unit) {
                    let o = out.get_or_insert_with(String::new);
                    o.push_str(&text[copied..i]);
                    o.push_str("\\ufffd");
                    copied = i + 6;
                }
                i += 6;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut o) => {
            o.push_str(&text[copied..]);
            Cow::Owned(o)
        }
    }
}

/// The code unit of a `\uXXXX` escape starting at `b[i]`, if there is one.
fn escape_unit(b: &[u8], i: usize) -> Option<u32> {
    let esc = b.get(i..i + 6)?;
    if esc[0] != b'\\' || esc[1] != b'u' {
        return None;
    }
    u32::from_str_radix(std::str::from_utf8(&esc[2..]).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(bytes: &[u8]) -> String {
        parse(bytes).unwrap()["name"].as_str().unwrap().to_string()
    }

    #[test]
    fn invalid_utf8_and_lone_surrogates_become_replacement_characters_as_in_go() {
        assert_eq!(name(b"{\"name\":\"caf\xe9\"}"), "caf\u{fffd}");
        assert_eq!(name(br#"{"name":"x\ud800"}"#), "x\u{fffd}");
        assert_eq!(name(br#"{"name":"\udc00y"}"#), "\u{fffd}y");
        assert_eq!(name(br#"{"name":"\ud800\ud800"}"#), "\u{fffd}\u{fffd}");
    }

    #[test]
    fn pairs_other_escapes_and_text_outside_strings_are_kept() {
        assert_eq!(name(br#"{"name":"\ud83d\ude00"}"#), "\u{1f600}");
        assert_eq!(name(br#"{"name":"\\ud800"}"#), "\\ud800");
        assert_eq!(name(br#"{"name":"a\"\ud800"}"#), "a\"\u{fffd}");
        assert_eq!(name(br#"{"name":"\u00e9"}"#), "\u{e9}");
        // Outside strings an invalid byte stays a syntax error, as in Go.
        assert!(parse(b"{\"name\":\"x\"}\xff").is_err());
        assert!(parse(br#"{"name": \ud800}"#).is_err());
    }
}
