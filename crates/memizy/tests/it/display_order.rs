//! Display order against the reference algorithm's outputs, and the
//! invariants of SPEC 4.4 as properties.

use hostwire_memizy::items::{display_item, public_item, SeededRandom};
use hostwire_memizy::{prepare_display_set, DisplaySet};
use proptest::prelude::*;
use serde_json::{json, Value};

fn golden() -> Value {
    serde_json::from_str(include_str!("../golden/display-order.json")).unwrap()
}

fn example_set() -> Value {
    serde_json::from_str(include_str!("../../../../examples/every-type.oqse.json")).unwrap()
}

fn display_set(v: &Value) -> DisplaySet {
    DisplaySet {
        meta: v["meta"].clone(),
        items: v["items"].as_array().unwrap().clone(),
    }
}

#[test]
fn random_numbers_equal_the_reference() {
    for (seed, values) in golden()["randoms"].as_object().unwrap() {
        let mut r = SeededRandom::new(seed);
        for v in values.as_array().unwrap() {
            assert_eq!(r.next_f64(), v.as_f64().unwrap(), "seed {seed:?}");
        }
    }
}

#[test]
fn display_order_equals_the_reference_for_every_item_type() {
    let set = display_set(&example_set());
    let cases = golden()["cases"].as_array().unwrap().clone();
    assert!(cases.len() >= 5);
    for case in cases {
        let seed = case["seed"].as_str().unwrap();
        let prepared = prepare_display_set(&set, Some(seed));
        let expected = case["items"].as_array().unwrap();
        assert_eq!(prepared.set.items.len(), expected.len());
        for (ours, theirs) in prepared.set.items.iter().zip(expected) {
            assert_eq!(ours, theirs, "seed {seed:?}, item {}", theirs["id"]);
        }
    }
}

#[test]
fn retry_and_fallback_paths_equal_the_reference() {
    let small = json!({"id": "s", "type": "sort-items", "items": [{"id":"a"},{"id":"b"},{"id":"c"}], "correctOrder": ["a","b","c"]});
    let two = json!({"id": "t", "type": "sort-items", "items": [{"id":"a"},{"id":"b"}], "correctOrder": ["a","b"]});
    let ids = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_owned())
            .collect()
    };
    for case in golden()["small"].as_array().unwrap() {
        let mut r = SeededRandom::new(case["seed"].as_str().unwrap());
        let three: Vec<String> = serde_json::from_value(case["three"].clone()).unwrap();
        let pair: Vec<String> = serde_json::from_value(case["two"].clone()).unwrap();
        assert_eq!(ids(&display_item(&small, &mut r)), three);
        assert_eq!(ids(&display_item(&two, &mut r)), pair);
    }
}

#[test]
fn without_a_seed_nothing_moves() {
    let set = display_set(&example_set());
    let prepared = prepare_display_set(&set, None);
    assert_eq!(prepared.set.items, set.items);
}

#[test]
fn shuffle_false_and_require_typing_keep_their_order() {
    let set = display_set(&example_set());
    for seed in ["a", "b", "c", "d"] {
        let p = prepare_display_set(&set, Some(seed));
        let by_id = |id: &str| p.set.items.iter().find(|i| i["id"] == id).unwrap().clone();
        let orig = |id: &str| set.items.iter().find(|i| i["id"] == id).unwrap().clone();
        assert_eq!(by_id("mcq-3"), orig("mcq-3"));
        assert_eq!(by_id("time-2"), orig("time-2"));
        assert_eq!(by_id("diagram-2")["labels"], orig("diagram-2")["labels"]);
    }
}

fn choice_list(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"id": format!("c{i}"), "text": format!("{i}")}))
        .collect()
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect()
}

proptest! {
    #[test]
    fn a_shuffle_is_a_permutation(n in 0usize..30, seed in ".{0,12}") {
        let item = json!({"id": "m", "type": "mcq-single", "options": choice_list(n), "correctId": "c0"});
        let mut r = SeededRandom::new(&seed);
        let out = display_item(&item, &mut r);
        let mut before = ids(&item["options"]);
        let mut after = ids(&out["options"]);
        before.sort();
        after.sort();
        prop_assert_eq!(before, after);
        prop_assert_eq!(&out["correctId"], &item["correctId"]);
    }

    #[test]
    fn the_same_seed_gives_the_same_order(seed in ".{0,12}") {
        let set = display_set(&example_set());
        let a = prepare_display_set(&set, Some(&seed));
        let b = prepare_display_set(&set, Some(&seed));
        prop_assert_eq!(a, b);
    }

    #[test]
    fn sort_items_never_come_out_correct(n in 2usize..8, seed in ".{0,12}", rot in 0usize..8) {
        // Any starting order, including one whose rotation is the correct order.
        let mut items = choice_list(n);
        items.rotate_left(rot % n);
        let correct: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
        let item = json!({"id": "s", "type": "sort-items", "items": items, "correctOrder": correct});
        let mut r = SeededRandom::new(&seed);
        let out = display_item(&item, &mut r);
        prop_assert_ne!(ids(&out["items"]), correct);
    }

    #[test]
    fn timelines_never_come_out_chronological(n in 2usize..8, seed in ".{0,12}", rot in 0usize..8) {
        let mut events: Vec<Value> = (0..n).map(|i| json!({"id": format!("e{i}"), "date": format!("{}", 1900 + i)})).collect();
        events.rotate_left(rot % n);
        let item = json!({"id": "t", "type": "timeline", "events": events});
        let mut r = SeededRandom::new(&seed);
        let out = display_item(&item, &mut r);
        let chronological: Vec<String> = (0..n).map(|i| format!("e{i}")).collect();
        prop_assert_ne!(ids(&out["events"]), chronological);
    }

    #[test]
    fn no_public_item_keeps_an_answer_field(seed in ".{0,8}") {
        let set = display_set(&example_set());
        let p = prepare_display_set(&set, Some(&seed));
        for item in &p.public_set.items {
            assert_public(item);
        }
    }
}

/// Every answer field of SPEC 4.4, checked on one public item.
fn assert_public(item: &Value) {
    let t = item["type"].as_str().unwrap();
    let o = item.as_object().unwrap();
    assert_eq!(o.get("answerHidden"), Some(&Value::Bool(true)), "{t}");
    for k in ["explanation", "incorrectFeedback"] {
        assert!(!o.contains_key(k), "{t} keeps {k}");
    }
    let hidden: &[&str] = match t {
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
        x if x.starts_with("x-") => &["solution"],
        _ => &[],
    };
    for k in hidden {
        assert!(!o.contains_key(*k), "{t} keeps {k}");
    }
    for list in [
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
        "sources",
    ] {
        if let Some(Value::Array(a)) = o.get(list) {
            for c in a {
                assert!(c.get("explanation").is_none(), "{t}.{list}[].explanation");
                assert!(c.get("quote").is_none(), "{t}.{list}[].quote");
                assert!(
                    c.get("correctCategoryId").is_none(),
                    "{t}.{list}[].correctCategoryId"
                );
            }
        }
    }
    match t {
        "fill-in-blanks" => {
            for v in o["blanks"].as_object().unwrap().values() {
                assert_eq!(v, &json!([]), "fill-in-blanks keeps accepted texts");
            }
        }
        "fill-in-select" => {
            for b in o["blanks"].as_object().unwrap().values() {
                assert!(b.get("correctId").is_none());
                assert!(
                    !b["options"].as_array().unwrap().is_empty(),
                    "select options stay"
                );
            }
        }
        "timeline" => {
            for e in o["events"].as_array().unwrap() {
                assert!(e.get("date").is_none() && e.get("precision").is_none());
            }
        }
        "diagram-label" => {
            for z in o["zones"].as_array().unwrap() {
                assert!(z.get("correctLabelId").is_none());
            }
            if o.get("requireTyping") == Some(&Value::Bool(true)) {
                assert_eq!(o["labels"], json!([]));
            }
        }
        "pin-on-image" | "pin-on-model" => assert_eq!(o["hotspots"], json!([])),
        _ => {}
    }
}

#[test]
fn hints_stay_public_and_every_official_type_is_covered() {
    let set = display_set(&example_set());
    let types: std::collections::BTreeSet<&str> = set
        .items
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    for t in [
        "note",
        "flashcard",
        "true-false",
        "mcq-single",
        "mcq-multi",
        "short-answer",
        "fill-in-blanks",
        "fill-in-select",
        "match-pairs",
        "match-complex",
        "sort-items",
        "slider",
        "pin-on-image",
        "categorize",
        "timeline",
        "matrix",
        "math-input",
        "diagram-label",
        "open-ended",
        "numeric-input",
        "pin-on-model",
        "chess-puzzle",
    ] {
        assert!(types.contains(t), "the example set lacks {t}");
    }
    let card = set.items.iter().find(|i| i["id"] == "card-1").unwrap();
    assert_eq!(public_item(card)["hints"], card["hints"]);
    let custom = set.items.iter().find(|i| i["id"] == "custom-1").unwrap();
    let p = public_item(custom);
    assert_eq!(p["hints"], custom["hints"]);
    assert_eq!(p["grid"], custom["grid"]);
}

#[test]
fn public_items_are_built_from_the_display_order() {
    let set = display_set(&example_set());
    let p = prepare_display_set(&set, Some("order"));
    for (full, public) in p.set.items.iter().zip(&p.public_set.items) {
        if let Some(Value::Array(opts)) = full.get("options") {
            assert_eq!(ids(&Value::Array(opts.clone())), ids(&public["options"]));
        }
    }
}
