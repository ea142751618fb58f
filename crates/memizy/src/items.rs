//! Display order and public items (SPEC 4.4).
//!
//! The order is the reference's (`prepareDisplaySet` in `@memizy/protocol`):
//! a mulberry32 generator seeded with the FNV-1a hash of the seed's UTF-16
//! code units, Fisher–Yates from the end, and for `sort-items` and
//! `timeline` up to six tries to avoid the correct order before falling
//! back to a rotation. A Rust host and a TypeScript host therefore show the
//! same order for the same session id.

use serde_json::{Map, Value};

/// The reference's seeded generator, yielding numbers in `[0, 1)`.
#[derive(Debug, Clone)]
pub struct SeededRandom {
    state: u32,
}

impl SeededRandom {
    pub fn new(seed: &str) -> Self {
        let mut h: u32 = 2_166_136_261;
        for unit in seed.encode_utf16() {
            h = (h ^ u32::from(unit)).wrapping_mul(16_777_619);
        }
        Self { state: h }
    }

    pub fn next_f64(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x6d2b_79f5);
        let mut t = self.state;
        t = (t ^ (t >> 15)).wrapping_mul(t | 1);
        t ^= t.wrapping_add((t ^ (t >> 7)).wrapping_mul(t | 61));
        f64::from(t ^ (t >> 14)) / 4_294_967_296.0
    }
}

/// Attempts to avoid a forbidden order before the rotation fallback.
const SHUFFLE_ATTEMPTS: usize = 6;

/// An order that must not be shown (the correct one).
type Forbidden<'f> = Option<&'f dyn Fn(&[Value]) -> bool>;

fn shuffled(list: &[Value], random: &mut SeededRandom, avoid: Forbidden<'_>) -> Vec<Value> {
    for _ in 0..SHUFFLE_ATTEMPTS {
        let mut copy = list.to_vec();
        for i in (1..copy.len()).rev() {
            let j = (random.next_f64() * (i as f64 + 1.0)).floor() as usize;
            copy.swap(i, j);
        }
        match avoid {
            Some(bad) if copy.len() >= 2 && bad(&copy) => continue,
            _ => return copy,
        }
    }
    // The reference's fallback is the list rotated by one. Where that rotation
    // is itself the forbidden order, later rotations keep the rule: with
    // distinct ids at most one rotation can match.
    let n = list.len();
    for k in 1..n.max(2) {
        let rotated: Vec<Value> = list[k % n..]
            .iter()
            .chain(&list[..k % n])
            .cloned()
            .collect();
        if avoid.is_none_or(|bad| !bad(&rotated)) {
            return rotated;
        }
    }
    list.to_vec()
}

/// True when `order` lists exactly the ids of `ids`, position by position.
fn same_ids(order: &[Value], ids: &[Option<String>]) -> bool {
    order
        .iter()
        .enumerate()
        .all(|(i, c)| matches!((c.get("id").and_then(Value::as_str), ids.get(i)), (Some(a), Some(Some(b))) if a == b))
}

fn shuffle_field(item: &mut Map<String, Value>, key: &str, random: &mut SeededRandom) {
    if let Some(Value::Array(list)) = item.get(key) {
        let s = shuffled(list, random, None);
        item.insert(key.to_owned(), Value::Array(s));
    }
}

fn shuffle_allowed(v: Option<&Value>) -> bool {
    v != Some(&Value::Bool(false))
}

fn js_truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0 && !f.is_nan()),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

/// Keys in JavaScript's property order: array-index keys ascending, then the
/// rest in insertion order (what `Object.values` walks).
fn js_key_order(map: &Map<String, Value>) -> Vec<String> {
    let is_index = |k: &str| {
        !k.is_empty()
            && k.bytes().all(|b| b.is_ascii_digit())
            && (k == "0" || !k.starts_with('0'))
            && k.parse::<u64>().is_ok_and(|n| n < u64::from(u32::MAX))
    };
    let mut idx: Vec<&String> = map.keys().filter(|k| is_index(k)).collect();
    idx.sort_by_key(|k| k.parse::<u64>().unwrap_or(0));
    idx.into_iter()
        .chain(map.keys().filter(|k| !is_index(k)))
        .cloned()
        .collect()
}

/// An item's `type` ("" when it has none).
fn item_type(obj: &Map<String, Value>) -> String {
    obj.get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// The item in display order: only lists move, answers refer to ids.
pub fn display_item(item: &Value, random: &mut SeededRandom) -> Value {
    let mut it = item.clone();
    let Some(obj) = it.as_object_mut() else {
        return it;
    };
    let kind = item_type(obj);
    match kind.as_str() {
        "mcq-single" | "mcq-multi" if shuffle_allowed(obj.get("shuffle")) => {
            shuffle_field(obj, "options", random);
        }
        "fill-in-select" => {
            if let Some(Value::Object(blanks)) = obj.get_mut("blanks") {
                for key in js_key_order(blanks) {
                    if let Some(Value::Object(blank)) = blanks.get_mut(&key) {
                        if shuffle_allowed(blank.get("shuffle")) {
                            shuffle_field(blank, "options", random);
                        }
                    }
                }
            }
        }
        "sort-items" => {
            let correct: Vec<Option<String>> = match obj.get("correctOrder") {
                Some(Value::Array(ids)) => {
                    ids.iter().map(|v| v.as_str().map(str::to_owned)).collect()
                }
                _ => Vec::new(),
            };
            if let Some(Value::Array(list)) = obj.get("items") {
                let avoid = |order: &[Value]| same_ids(order, &correct);
                let s = shuffled(list, random, Some(&avoid));
                obj.insert("items".into(), Value::Array(s));
            }
        }
        "match-pairs" => {
            shuffle_field(obj, "prompts", random);
            shuffle_field(obj, "matches", random);
        }
        "match-complex" => {
            shuffle_field(obj, "leftItems", random);
            shuffle_field(obj, "rightItems", random);
        }
        "timeline" if shuffle_allowed(obj.get("shuffle")) => {
            if let Some(Value::Array(events)) = obj.get("events") {
                let date = |e: &Value| {
                    e.get("date")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                let mut chronological: Vec<&Value> = events.iter().collect();
                // Stable, as JavaScript's sort; ISO dates order as text.
                chronological.sort_by_key(|e| date(e));
                let correct: Vec<Option<String>> = chronological
                    .iter()
                    .map(|e| e.get("id").and_then(Value::as_str).map(str::to_owned))
                    .collect();
                let avoid = |order: &[Value]| same_ids(order, &correct);
                let s = shuffled(events, random, Some(&avoid));
                obj.insert("events".into(), Value::Array(s));
            }
        }
        "categorize" => shuffle_field(obj, "items", random),
        "diagram-label" if !js_truthy(obj.get("requireTyping")) => {
            shuffle_field(obj, "labels", random);
        }
        _ => {}
    }
    it
}

/// Fields that give the answer away on any item.
const COMMON_HIDDEN: &[&str] = &["explanation", "incorrectFeedback"];

/// Fields that are the answer, per item type.
fn hidden_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "note" => &["hiddenContent"],
        "flashcard" => &["back"],
        "true-false" | "slider" => &["correctAnswer"],
        "mcq-single" => &["correctId"],
        "mcq-multi" => &["correctIds"],
        "short-answer" | "chess-puzzle" => &["correctAnswers"],
        "sort-items" => &["correctOrder"],
        "match-pairs" => &["pairs"],
        "match-complex" => &["connections"],
        "numeric-input" => &["correctAnswer", "range"],
        "math-input" => &["correctAnswer", "alternativeAnswers"],
        "matrix" => &["correctCells"],
        "open-ended" => &["sampleAnswer", "rubric"],
        _ => &[],
    }
}

/// Lists of choices, whose `explanation` tells the answer.
const CHOICE_LISTS: &[&str] = &[
    "options",
    "items",
    "prompts",
    "matches",
    "leftItems",
    "rightItems",
    "categories",
    "rows",
    "columns",
    "labels",
];

/// What custom `x-` types lose: OQSE puts their answer in `solution`.
const CUSTOM_HIDDEN: &[&str] = &["solution", "explanation", "incorrectFeedback"];

/// The item without anything that gives its answer away, marked
/// `answerHidden: true`. `hints` stay.
pub fn public_item(item: &Value) -> Value {
    let mut it = item.clone();
    let Some(obj) = it.as_object_mut() else {
        return it;
    };
    let kind = item_type(obj);
    if kind.starts_with("x-") {
        for k in CUSTOM_HIDDEN {
            obj.remove(*k);
        }
    } else {
        for k in COMMON_HIDDEN.iter().chain(hidden_fields(&kind)) {
            obj.remove(*k);
        }
        for list in CHOICE_LISTS {
            if let Some(Value::Array(choices)) = obj.get_mut(*list) {
                for c in choices {
                    if let Some(c) = c.as_object_mut() {
                        c.remove("explanation");
                    }
                }
            }
        }
        match kind.as_str() {
            "fill-in-blanks" => {
                if let Some(Value::Object(blanks)) = obj.get_mut("blanks") {
                    for v in blanks.values_mut() {
                        *v = Value::Array(Vec::new());
                    }
                }
            }
            "fill-in-select" => {
                if let Some(Value::Object(blanks)) = obj.get_mut("blanks") {
                    for blank in blanks.values_mut().filter_map(Value::as_object_mut) {
                        blank.remove("correctId");
                        if let Some(Value::Array(opts)) = blank.get_mut("options") {
                            for o in opts.iter_mut().filter_map(Value::as_object_mut) {
                                o.remove("explanation");
                            }
                        }
                    }
                }
            }
            "categorize" => strip_each(obj, "items", &["correctCategoryId"]),
            "timeline" => strip_each(obj, "events", &["date", "precision"]),
            "diagram-label" => {
                strip_each(obj, "zones", &["correctLabelId"]);
                if js_truthy(obj.get("requireTyping")) {
                    // Typed answers: the labels are the answers.
                    obj.insert("labels".into(), Value::Array(Vec::new()));
                }
            }
            "pin-on-image" | "pin-on-model" => {
                obj.insert("hotspots".into(), Value::Array(Vec::new()));
            }
            _ => {}
        }
    }
    // A source's quote often states the answer.
    strip_each(obj, "sources", &["quote"]);
    obj.insert("answerHidden".into(), Value::Bool(true));
    it
}

fn strip_each(obj: &mut Map<String, Value>, list: &str, keys: &[&str]) {
    if let Some(Value::Array(entries)) = obj.get_mut(list) {
        for e in entries.iter_mut().filter_map(Value::as_object_mut) {
            for k in keys {
                e.remove(*k);
            }
        }
    }
}

/// The set of a session: `set` in display order with answers (the
/// authority, solo), `public_set` without them (every other instance in
/// multiplayer). Without a seed nothing is shuffled.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedSet {
    pub set: crate::types::DisplaySet,
    pub public_set: crate::types::DisplaySet,
}

pub fn prepare_display_set(set: &crate::types::DisplaySet, seed: Option<&str>) -> PreparedSet {
    let mut random = seed.map(SeededRandom::new);
    let items: Vec<Value> = set
        .items
        .iter()
        .map(|item| match random.as_mut() {
            Some(r) => display_item(item, r),
            None => item.clone(),
        })
        .collect();
    let public_items = items.iter().map(public_item).collect();
    PreparedSet {
        set: crate::types::DisplaySet {
            meta: set.meta.clone(),
            items,
        },
        public_set: crate::types::DisplaySet {
            meta: set.meta.clone(),
            items: public_items,
        },
    }
}

/// A session's set prepared as text: `full` in display order with answers
/// (the authority, solo), `public` without them, and where each item is in
/// `full`'s text. It holds about twice the set's text, never a tree: an item
/// is parsed while it is prepared, and again when an answer needs it.
#[derive(Debug, Clone)]
pub struct PreparedText {
    pub full: crate::types::SetJson,
    pub public: crate::types::SetJson,
    /// Item id → byte range of the item in `full`'s text.
    index: std::collections::HashMap<String, std::ops::Range<usize>>,
}

impl PreparedText {
    /// The item with this id, parsed from `full`.
    pub fn item(&self, id: &str) -> Option<Value> {
        let r = self.index.get(id)?;
        serde_json::from_str(&self.full.text()[r.clone()]).ok()
    }

    pub fn contains(&self, id: &str) -> bool {
        self.index.contains_key(id)
    }
}

/// [`prepare_display_set`] of a set kept as text, one item at a time, and
/// only the items `keep` accepts. The result is the same sets, as text.
pub fn prepare_set_text(
    set: &crate::types::SetText,
    seed: Option<&str>,
    keep: impl Fn(&Value) -> bool,
) -> Result<PreparedText, serde_json::Error> {
    let mut random = seed.map(SeededRandom::new);
    let head = format!("{{\"meta\":{},\"items\":[", set.meta.get());
    let (mut full, mut public) = (head.clone(), head);
    let mut index = std::collections::HashMap::new();
    let mut first = true;
    for raw in &set.items {
        let item: Value = serde_json::from_str(raw.get())?;
        if !keep(&item) {
            continue;
        }
        let shown = match random.as_mut() {
            Some(r) => display_item(&item, r),
            None => item,
        };
        if !first {
            full.push(',');
            public.push(',');
        }
        first = false;
        let start = full.len();
        full.push_str(&serde_json::to_string(&shown)?);
        if let Some(id) = shown.get("id").and_then(Value::as_str) {
            index.insert(id.to_owned(), start..full.len());
        }
        public.push_str(&serde_json::to_string(&public_item(&shown))?);
    }
    full.push_str("]}");
    public.push_str("]}");
    let text =
        |t: String| serde_json::value::RawValue::from_string(t).map(crate::types::SetJson::new);
    Ok(PreparedText {
        full: text(full)?,
        public: text(public)?,
        index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_prepares_the_same_sets() {
        let set = crate::types::DisplaySet {
            meta: serde_json::json!({"id": "s", "title": "T"}),
            items: vec![
                serde_json::json!({"id": "q1", "type": "mcq-single", "question": "?",
                    "options": [{"id": "a", "text": "A"}, {"id": "b", "text": "B"}, {"id": "c", "text": "C"}],
                    "correctId": "b"}),
                serde_json::json!({"id": "q2", "type": "true-false", "question": "?", "correctAnswer": true}),
                serde_json::json!({"id": "q3", "type": "note", "text": "skip me"}),
            ],
        };
        for seed in [None, Some("seed-1"), Some("another")] {
            let tree = prepare_display_set(&set, seed);
            let text = crate::types::SetText::from_display(&set);
            let t = prepare_set_text(&text, seed, |_| true).unwrap();
            assert_eq!(t.full.parse().unwrap(), tree.set);
            assert_eq!(t.public.parse().unwrap(), tree.public_set);
            assert_eq!(
                t.item("q1").as_ref(),
                tree.set.items.iter().find(|i| i["id"] == "q1")
            );
            assert_eq!(t.item("q9"), None);
            let kept = prepare_set_text(&text, seed, |i| i["type"] != "note").unwrap();
            assert_eq!(kept.full.parse().unwrap().items.len(), 2);
            assert!(!kept.contains("q3"));
        }
    }

    #[test]
    fn js_key_order_puts_indices_first() {
        let m: Map<String, Value> =
            serde_json::from_str(r#"{"b":1,"2":1,"a":1,"10":1,"01":1}"#).unwrap();
        assert_eq!(js_key_order(&m), vec!["2", "10", "b", "a", "01"]);
    }
}
