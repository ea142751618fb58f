//! Bounded JSON decoding of untrusted input.
//!
//! Order of checks, cheapest first: byte size before anything is parsed, then
//! nesting depth (a linear scan, no allocation), then the parse itself.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::io;

/// Caps applied to one piece of untrusted JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonLimits {
    pub max_bytes: usize,
    pub max_depth: usize,
}

impl JsonLimits {
    pub const fn new(max_bytes: usize, max_depth: usize) -> Self {
        Self {
            max_bytes,
            max_depth,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("input is {size} bytes; the limit is {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("input is nested deeper than {limit} levels")]
    TooDeep { limit: usize },
    #[error("input is not valid JSON: {message}")]
    Invalid { message: String },
}

/// What one quick pass over JSON text found, before any parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Structure {
    /// The deepest nesting of arrays and objects (stops counting early).
    pub max_depth: usize,
    /// A number with an exponent or of 300+ digits: one that could be out
    /// of the range of a double, so values must be checked number by number.
    pub big_numbers: bool,
}

// SIMD intrinsics (checked CPU features, loads within a block): the only
// unsafe code this crate keeps.
#[allow(unsafe_code)]
mod scan;
pub use scan::{scan_structure, scan_structure_bytewise};

/// The maximum nesting depth of JSON text (arrays and objects), scanning
/// past strings. Stops early once `stop_above` is exceeded.
pub fn nesting_depth(text: &[u8], stop_above: usize) -> usize {
    scan_structure(text, stop_above).max_depth
}

/// Whether JSON text nests arrays and objects deeper than `limit`.
///
/// Every level opens with a `[` or `{` byte, so their count bounds the
/// depth from above (brackets inside strings only raise it): text with at
/// most `limit` of them, as nearly every frame has, needs no structural
/// scan. They are counted a block at a time (a loop the compiler turns
/// into vector compares, with no branch per bracket: in text dense with
/// them, such as many small objects, a search that stops at each one
/// cost more than the scan), and counting stops once the count passes
/// `limit`.
pub fn deeper_than(text: &[u8], limit: usize) -> bool {
    let mut opens = 0usize;
    // 255 bytes a block, so that a block's count fits the u8 lanes.
    for block in text.chunks(255) {
        opens += usize::from(count_opens(block));
        if opens > limit {
            return nesting_depth(text, limit) > limit;
        }
    }
    false
}

/// The `[` and `{` bytes of a block of at most 255 bytes. They are the
/// only bytes that equal `{` with bit 0x20 set (`[` is 0x5B, `{` 0x7B).
fn count_opens(block: &[u8]) -> u8 {
    block
        .iter()
        .fold(0u8, |n, &b| n + u8::from(b | 0x20 == b'{'))
}

/// The size and depth checks alone, for callers that parse themselves.
pub fn check_bounds(text: &[u8], limits: JsonLimits) -> Result<Structure, JsonError> {
    precheck(text, limits)
}

fn precheck(text: &[u8], limits: JsonLimits) -> Result<Structure, JsonError> {
    if text.len() > limits.max_bytes {
        return Err(JsonError::TooLarge {
            size: text.len(),
            limit: limits.max_bytes,
        });
    }
    let structure = scan_structure(text, limits.max_depth);
    if structure.max_depth > limits.max_depth {
        return Err(JsonError::TooDeep {
            limit: limits.max_depth,
        });
    }
    Ok(structure)
}

/// Parses `text` into `T` (which may borrow from `text`, e.g. `&RawValue`)
/// after the size and depth checks.
pub fn from_str_bounded<'a, T: Deserialize<'a>>(
    text: &'a str,
    limits: JsonLimits,
) -> Result<T, JsonError> {
    from_str_bounded_scanned(text, limits).map(|(v, _)| v)
}

/// Like [`from_str_bounded`], also returning what the pre-scan found.
pub fn from_str_bounded_scanned<'a, T: Deserialize<'a>>(
    text: &'a str,
    limits: JsonLimits,
) -> Result<(T, Structure), JsonError> {
    let structure = precheck(text.as_bytes(), limits)?;
    let mut de = serde_json::Deserializer::from_str(text);
    // serde_json's own recursion limit (128) stays on as a second guard.
    let value = T::deserialize(&mut de).map_err(|e| invalid_at::<T>(text, e))?;
    de.end().map_err(invalid)?;
    Ok((value, structure))
}

/// The refusal of text that failed to parse as `T`, naming the field where
/// it failed (`payload.n: number out of range at line 1 column 52`). The
/// path is found by parsing again with the path tracked: only refused
/// input pays for it, and it already passed the size and depth checks.
fn invalid_at<'a, T: Deserialize<'a>>(text: &'a str, e: serde_json::Error) -> JsonError {
    let mut de = serde_json::Deserializer::from_str(text);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Err(tracked) if tracked.path().iter().next().is_some() => JsonError::Invalid {
            message: format!("{}: {e}", tracked.path()),
        },
        _ => invalid(e),
    }
}

/// Like [`from_str_bounded`] for bytes that may not be UTF-8.
pub fn from_slice_bounded<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
    limits: JsonLimits,
) -> Result<T, JsonError> {
    precheck(bytes, limits)?;
    let text = std::str::from_utf8(bytes).map_err(|e| JsonError::Invalid {
        message: format!("not UTF-8 at byte {}", e.valid_up_to()),
    })?;
    from_str_bounded(text, limits)
}

fn invalid(e: serde_json::Error) -> JsonError {
    JsonError::Invalid {
        message: e.to_string(),
    }
}

struct CountingWriter(usize);

impl io::Write for CountingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The UTF-8 byte size of the compact serialization of `value`, counted
/// without building the string.
pub fn json_size(value: &Value) -> usize {
    let mut w = CountingWriter(0);
    // Writing a Value into a counter cannot fail.
    let _ = serde_json::to_writer(&mut w, value);
    w.0
}

/// The byte size of raw JSON text without the whitespace between tokens:
/// the compact size of a value as received, measured without re-serializing.
pub fn compact_len(raw: &RawValue) -> usize {
    let mut n = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in raw.get().as_bytes() {
        if in_string {
            n += 1;
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            n += 1;
            if b == b'"' {
                in_string = true;
            }
        }
    }
    n
}

/// "Is this value JSON, and is it within `max_bytes`?" for a raw value:
/// raw values from a successful parse are JSON by construction, so only the
/// size is left to check. Returns an upper bound of the compact size when it
/// is within, or the exact compact size that was too large.
pub fn raw_within(raw: &RawValue, max_bytes: usize) -> Result<usize, usize> {
    // Fast path: the text as received is an upper bound of its compact
    // size, so within it nothing more is measured.
    let upper = raw.get().len();
    if upper <= max_bytes {
        return Ok(upper);
    }
    let size = compact_len(raw);
    if size > max_bytes {
        Err(size)
    } else {
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const L: JsonLimits = JsonLimits::new(1024, 8);

    #[test]
    fn rejects_oversized_input_before_parsing() {
        let text = format!("\"{}\"", "a".repeat(2000));
        assert_eq!(
            from_str_bounded::<Value>(&text, L),
            Err(JsonError::TooLarge {
                size: 2002,
                limit: 1024
            })
        );
        // Even invalid JSON is reported as too large first.
        assert!(matches!(
            from_str_bounded::<Value>(&"{".repeat(2000), L),
            Err(JsonError::TooLarge { .. })
        ));
    }

    #[test]
    fn bounds_depth_and_ignores_brackets_in_strings() {
        let deep = format!("{}{}", "[".repeat(9), "]".repeat(9));
        assert_eq!(
            from_str_bounded::<Value>(&deep, L),
            Err(JsonError::TooDeep { limit: 8 })
        );
        let ok = format!("{}{}", "[".repeat(8), "]".repeat(8));
        assert!(from_str_bounded::<Value>(&ok, L).is_ok());
        let in_string = r#"["[[[[[[[[[[[[[[[[\"[[[["]"#;
        assert_eq!(nesting_depth(in_string.as_bytes(), 100), 1);
        assert!(from_str_bounded::<Value>(in_string, L).is_ok());
    }

    /// The bracket count only lets shallow text skip the scan: text with
    /// many brackets (in strings or side by side) is scanned, and its
    /// depth decides.
    #[test]
    fn deeper_than_agrees_with_the_scan() {
        let cases = [
            ("[]", 0),
            ("[]", 1),
            ("[[[]]]", 2),
            ("[[[]]]", 3),
            ("{\"a\":[{\"b\":[]}]}", 3),
            ("{\"a\":[{\"b\":[]}]}", 4),
            ("[\"[[[[[[[[\"]", 1),
            ("[[],[],[],[],[],[]]", 2),
            ("[[],[],[],[],[],[]]", 1),
            ("\"{{{{\"", 0),
        ];
        for (text, limit) in cases {
            assert_eq!(
                deeper_than(text.as_bytes(), limit),
                nesting_depth(text.as_bytes(), limit) > limit,
                "{text} against {limit}"
            );
        }
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        assert!(deeper_than(deep.as_bytes(), 128));
        assert!(!deeper_than(deep.as_bytes(), 129));
        // Brackets in several blocks, and a block full of them.
        let wide = format!("[{}1]", "{},".repeat(400));
        assert!(!deeper_than(wide.as_bytes(), 2));
        assert!(deeper_than(wide.as_bytes(), 1));
        let spread = format!("{}{}", "[ ".repeat(200), " ]".repeat(200));
        assert!(deeper_than(spread.as_bytes(), 199));
        assert!(!deeper_than(spread.as_bytes(), 200));
        let full = "[".repeat(255);
        assert!(deeper_than(full.as_bytes(), 254));
    }

    #[test]
    fn scan_flags_numbers_that_may_not_fit_a_double() {
        let scan = |t: &str| scan_structure(t.as_bytes(), 100);
        assert!(!scan(r#"{"a":[1,2.5,-3,true,false,null],"e":"1e999 in a string"}"#).big_numbers);
        assert!(scan("[1e5]").big_numbers);
        assert!(scan("[1.E5]").big_numbers);
        assert!(scan("[2.5e-3]").big_numbers);
        assert!(scan(&format!("[{}]", "9".repeat(300))).big_numbers);
        assert!(!scan(&format!("[{}]", "9".repeat(299))).big_numbers);
        assert_eq!(scan(r#"["\"]]]",{"k":"\\"}]"#).max_depth, 2);
        assert_eq!(scan(r#"["unterminated"#).max_depth, 1);
    }

    #[test]
    fn deep_input_under_a_high_bound_does_not_overflow_the_stack() {
        let n = 5_000;
        let deep = format!("{}{}", "[".repeat(n), "]".repeat(n));
        let limits = JsonLimits::new(1 << 20, 64);
        assert_eq!(
            from_str_bounded::<Value>(&deep, limits),
            Err(JsonError::TooDeep { limit: 64 })
        );
    }

    #[test]
    fn invalid_json_and_trailing_data_are_errors() {
        for bad in ["", "{", "[1,]", "NaN", "1 2", "{\"a\":1}x", "'a'"] {
            assert!(
                matches!(
                    from_str_bounded::<Value>(bad, L),
                    Err(JsonError::Invalid { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            from_slice_bounded::<Value>(b"\"\xff\"", L),
            Err(JsonError::Invalid { .. })
        ));
    }

    #[test]
    fn a_refusal_names_the_field_where_the_text_went_wrong() {
        let Err(JsonError::Invalid { message }) =
            from_str_bounded::<Value>(r#"{"payload":{"list":[0,{"n":1e400}]}}"#, L)
        else {
            panic!("1e400 is out of a double's range");
        };
        assert!(
            message.starts_with("payload.list[1].n: number out of range"),
            "{message}"
        );
        // A failure before any field has no path to name.
        let Err(JsonError::Invalid { message }) = from_str_bounded::<Value>("1e400", L) else {
            panic!("out of range");
        };
        assert!(message.starts_with("number out of range"), "{message}");
    }

    #[test]
    fn sizes_match_compact_serialization() {
        let v: Value = serde_json::from_str(r#"{ "a" : [1, 2, "x y"], "b": null }"#).unwrap();
        assert_eq!(json_size(&v), serde_json::to_string(&v).unwrap().len());
        let raw: Box<RawValue> =
            serde_json::from_str(r#"{ "a" : [1, 2, "x y"], "b": null }"#).unwrap();
        assert_eq!(compact_len(&raw), r#"{"a":[1,2,"x y"],"b":null}"#.len());
        assert_eq!(raw_within(&raw, 26), Ok(26));
        assert_eq!(raw_within(&raw, 25), Err(26));
    }

    fn value_depth(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(value_depth).max().unwrap_or(0),
            Value::Object(o) => 1 + o.values().map(value_depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    proptest! {
        #[test]
        fn the_scan_finds_the_depth_of_any_value(v in arb_json(), pretty in any::<bool>()) {
            let text = if pretty { serde_json::to_string_pretty(&v).unwrap() } else { v.to_string() };
            let scan = scan_structure(text.as_bytes(), 1000);
            prop_assert_eq!(scan.max_depth, value_depth(&v));
            prop_assert!(!scan.big_numbers, "no exponents in {}", text);
        }

        /// The bracket count's shortcut never changes the answer, at any
        /// limit, with brackets in strings and text over several blocks.
        #[test]
        fn deeper_than_agrees_with_the_depth_of_any_value(
            v in arb_json(),
            pretty in any::<bool>(),
            copies in 1usize..12,
        ) {
            let one = if pretty { serde_json::to_string_pretty(&v).unwrap() } else { v.to_string() };
            let text = format!("[{}]", vec![one; copies].join(","));
            let depth = 1 + value_depth(&v);
            for limit in 0..=depth + 1 {
                prop_assert_eq!(deeper_than(text.as_bytes(), limit), depth > limit, "limit {}", limit);
            }
        }

        #[test]
        fn compact_len_equals_serde_size_for_any_value(v in arb_json()) {
            let pretty = serde_json::to_string_pretty(&v).unwrap();
            let raw: Box<RawValue> = serde_json::from_str(&pretty).unwrap();
            prop_assert_eq!(compact_len(&raw), json_size(&v));
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(Value::from),
            ".{0,8}".prop_map(Value::String),
            // Strings long enough for the memchr path, with quotes and escapes.
            "[a-z\\\\\"\\[\\]{}e ]{30,80}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
