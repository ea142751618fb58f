//! The built-in example service of hosted Memizy sessions: `answers.check`,
//! a tolerant checker of typed answers for learning games. A worker: it
//! speaks worker RPC 1.0.0 as NDJSON on stdin / stdout until the host says
//! goodbye or the connection ends.
//!
//! Request (the plugin's payload): `{"answer": "Jupitr", "accepted":
//! ["Jupiter"], "tolerance"?: 0..=3, "numericTolerance"?: number}`.
//! Result: `{"correct": true, "matched": "Jupiter", "distance": 1,
//! "normalized": "jupitr"}`.
//!
//! Both sides are normalized (trimmed, inner whitespace collapsed, lower
//! case, Latin diacritics folded: "Čeština" = "cestina", end punctuation
//! dropped); a typed answer matches an accepted one within `tolerance`
//! edits (insert, delete, replace, swap two neighbours), by default 0 up to
//! 3 letters, 1 up to 7, 2 beyond. Two numbers (a decimal comma works)
//! match within `numericTolerance`. Deterministic: the same request always
//! gets the same result.
//!
//! `--as NAME` serves the method under another service name.

use hostwire_worker_rpc::transport::stdio;
use hostwire_worker_rpc::{Payload, Peer, PeerConfig, RpcError, Side};
use serde_json::{json, Value};

/// The longest answer or accepted text compared, in characters.
const MAX_TEXT_CHARS: usize = 500;
/// The most accepted answers of one request.
const MAX_ACCEPTED: usize = 100;

fn invalid(field: &str, why: &str) -> RpcError {
    RpcError::new("INVALID_PARAMS", format!("payload.{field}: {why}"))
}

fn fold(c: char) -> char {
    match c {
        'á' | 'à' | 'â' | 'ä' | 'ã' | 'å' | 'ā' | 'ą' => 'a',
        'č' | 'ç' | 'ć' => 'c',
        'ď' => 'd',
        'é' | 'è' | 'ê' | 'ë' | 'ě' | 'ē' | 'ę' => 'e',
        'í' | 'ì' | 'î' | 'ï' | 'ī' => 'i',
        'ľ' | 'ĺ' | 'ł' => 'l',
        'ň' | 'ñ' | 'ń' => 'n',
        'ó' | 'ò' | 'ô' | 'ö' | 'õ' | 'ő' | 'ø' => 'o',
        'ř' | 'ŕ' => 'r',
        'š' | 'ś' => 's',
        'ť' => 't',
        'ú' | 'ù' | 'û' | 'ü' | 'ů' | 'ű' | 'ū' => 'u',
        'ý' | 'ÿ' => 'y',
        'ž' | 'ź' | 'ż' => 'z',
        c => c,
    }
}

/// Trimmed, inner whitespace collapsed, lower case, diacritics folded, end
/// punctuation dropped.
fn normalize(s: &str) -> String {
    let lower: String = s.to_lowercase().chars().map(fold).collect();
    let words: Vec<&str> = lower.split_whitespace().collect();
    words
        .join(" ")
        .trim_end_matches(['.', ',', '!', '?', ';', ':'])
        .trim_end()
        .to_owned()
}

/// Edits between `a` and `b` (optimal string alignment), or `None` when
/// more than `max`.
fn distance(a: &[char], b: &[char], max: usize) -> Option<usize> {
    if a.len().abs_diff(b.len()) > max {
        return None;
    }
    let w = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * w];
    for (j, cell) in d.iter_mut().enumerate().take(w) {
        *cell = j;
    }
    for i in 1..=a.len() {
        d[i * w] = i;
        let mut row_min = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[(i - 1) * w + j] + 1)
                .min(d[i * w + j - 1] + 1)
                .min(d[(i - 1) * w + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[(i - 2) * w + j - 2] + 1);
            }
            d[i * w + j] = v;
            row_min = row_min.min(v);
        }
        if row_min > max {
            return None;
        }
    }
    let v = d[a.len() * w + b.len()];
    (v <= max).then_some(v)
}

fn default_tolerance(accepted_chars: usize) -> usize {
    match accepted_chars {
        0..=3 => 0,
        4..=7 => 1,
        _ => 2,
    }
}

fn number(s: &str) -> Option<f64> {
    let t = s.trim().replace(',', ".");
    t.parse::<f64>().ok().filter(|n| n.is_finite())
}

/// The check itself: the payload in, the result out.
fn check(payload: &Value) -> Result<Value, RpcError> {
    let answer = payload
        .get("answer")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("answer", "a string is required"))?;
    if answer.chars().count() > MAX_TEXT_CHARS {
        return Err(invalid(
            "answer",
            &format!("at most {MAX_TEXT_CHARS} characters"),
        ));
    }
    let accepted = payload
        .get("accepted")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("accepted", "an array of strings is required"))?;
    if accepted.len() > MAX_ACCEPTED {
        return Err(invalid(
            "accepted",
            &format!("at most {MAX_ACCEPTED} answers"),
        ));
    }
    let tolerance = match payload.get("tolerance") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|t| *t <= 3)
                .ok_or_else(|| invalid("tolerance", "an integer from 0 to 3"))?
                as usize,
        ),
    };
    let numeric_tolerance = match payload.get("numericTolerance") {
        None | Some(Value::Null) => 0.0,
        Some(v) => v
            .as_f64()
            .filter(|t| *t >= 0.0)
            .ok_or_else(|| invalid("numericTolerance", "a number of at least 0"))?,
    };
    let normalized = normalize(answer);
    let typed: Vec<char> = normalized.chars().collect();
    let mut best: Option<(usize, &str)> = None;
    for (i, a) in accepted.iter().enumerate() {
        let text = a
            .as_str()
            .ok_or_else(|| invalid(&format!("accepted[{i}]"), "a string is required"))?;
        if text.chars().count() > MAX_TEXT_CHARS {
            return Err(invalid(
                &format!("accepted[{i}]"),
                &format!("at most {MAX_TEXT_CHARS} characters"),
            ));
        }
        if let (Some(x), Some(y)) = (number(answer), number(text)) {
            if (x - y).abs() <= numeric_tolerance + f64::EPSILON * y.abs().max(1.0) {
                best = Some((0, text));
                break;
            }
            continue;
        }
        let want: Vec<char> = normalize(text).chars().collect();
        let max = tolerance.unwrap_or_else(|| default_tolerance(want.len()));
        if let Some(d) = distance(&typed, &want, max) {
            // The closest match wins; the first of equals.
            if best.is_none_or(|(bd, _)| d < bd) {
                best = Some((d, text));
            }
            if d == 0 {
                break;
            }
        }
    }
    Ok(json!({
        "correct": best.is_some(),
        "matched": best.map(|(_, t)| t),
        "distance": best.map(|(d, _)| d),
        "normalized": normalized,
    }))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut name = "answers.check".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--as" {
            if let Some(n) = args.next() {
                name = n;
            }
        }
    }
    let peer = Peer::new(Side::Worker, stdio(), PeerConfig::default());
    peer.register(&name, |params: Payload, _ctx| async move {
        let p = params
            .to_value()
            .map_err(|e| RpcError::new("INVALID_PARAMS", format!("params: {e}")))?;
        check(p.get("payload").unwrap_or(&Value::Null))
    });
    let why = peer.wait_closed().await;
    eprintln!("answer checker: closed: {why}");
    // tokio's stdin and stdout block in threads of their own; exit now
    // rather than wait for them (see `transport::stdio`).
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: Value) -> Value {
        check(&p).unwrap()
    }

    #[test]
    fn typos_case_diacritics_and_punctuation_are_tolerated() {
        let r = run(json!({"answer": "  jupitr. ", "accepted": ["Mars", "Jupiter"]}));
        assert_eq!(
            r,
            json!({"correct": true, "matched": "Jupiter", "distance": 1, "normalized": "jupitr"})
        );
        let r = run(json!({"answer": "cestina", "accepted": ["Čeština"]}));
        assert_eq!(
            (r["correct"].clone(), r["distance"].clone()),
            (json!(true), json!(0))
        );
        // A swap of neighbours is one edit.
        assert_eq!(
            run(json!({"answer": "Jupietr", "accepted": ["Jupiter"]}))["distance"],
            1
        );
        // Short words must be exact by default.
        assert_eq!(
            run(json!({"answer": "cat", "accepted": ["car"]}))["correct"],
            false
        );
        assert_eq!(
            run(json!({"answer": "cat", "accepted": ["car"], "tolerance": 1}))["correct"],
            true
        );
        assert_eq!(
            run(json!({"answer": "Saturn", "accepted": ["Jupiter"]}))["matched"],
            Value::Null
        );
    }

    #[test]
    fn numbers_compare_as_numbers() {
        assert_eq!(
            run(json!({"answer": "3,14", "accepted": ["3.14"]}))["correct"],
            true
        );
        assert_eq!(
            run(json!({"answer": "3.2", "accepted": ["3.14"]}))["correct"],
            false
        );
        assert_eq!(
            run(json!({"answer": "3.2", "accepted": ["3.14"], "numericTolerance": 0.1}))["correct"],
            true
        );
    }

    #[test]
    fn bad_payloads_name_the_field() {
        let e = check(&json!({"accepted": []})).unwrap_err();
        assert!(e.message.contains("payload.answer"), "{}", e.message);
        let e = check(&json!({"answer": "x", "accepted": ["a", 3]})).unwrap_err();
        assert!(e.message.contains("payload.accepted[1]"), "{}", e.message);
        let e = check(&json!({"answer": "x", "accepted": [], "tolerance": 9})).unwrap_err();
        assert!(e.message.contains("payload.tolerance"), "{}", e.message);
        let long = "x".repeat(MAX_TEXT_CHARS + 1);
        assert!(check(&json!({"answer": long, "accepted": []})).is_err());
    }
}
