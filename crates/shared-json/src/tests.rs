//! Small and deterministic, so that Miri (in `.ci/run`) runs every one in
//! seconds: each drives one of the hand-counted copies and drops what it
//! made in more than one order. Miri also fails on anything leaked. The
//! tests of the refusals (a panic before any copy) run without Miri only.

use super::*;
use std::sync::Arc;

/// Just too long to be held inline: a heap string, with a reference count.
const LONG: &str = "a heap string, not inline";

fn heap(tag: usize) -> Json {
    Json::string(&format!("{LONG} {tag}"))
}

/// An element that shares one thing, by turns: a heap string, an object,
/// an array.
fn item(tag: usize) -> Json {
    match tag % 3 {
        0 => heap(tag),
        1 => Json::object([("s", heap(tag))].into_iter().collect()),
        _ => Json::array(vec![heap(tag), Json::Number(tag.into())]),
    }
}

/// The tag `item` was made with, read back through what it shares.
fn tag_of(v: &Json) -> usize {
    let s = match v {
        Json::Object(m) => m.get("s"),
        Json::Array(a) => a.first(),
        v => Some(v),
    };
    let s = s.and_then(Json::as_str).expect("an item");
    s[LONG.len() + 1..].parse().expect("a tag")
}

fn tags(a: &[Json]) -> Vec<usize> {
    a.iter().map(tag_of).collect()
}

fn strong_count(v: &Json) -> usize {
    match v {
        Json::Array(a) => Arc::strong_count(a),
        Json::Object(m) => Arc::strong_count(m),
        _ => panic!("not a container: {v}"),
    }
}

/// More members than the index threshold, with heap names and values.
fn wide_map() -> JsonMap {
    (0..JSON_MAP_INDEX_FROM + 1)
        .map(|i| (format!("{LONG} {i}"), item(i)))
        .collect()
}

/// A few members, for the checks that refuse before copying.
fn small_map() -> JsonMap {
    (0..3).map(|i| (format!("{LONG} {i}"), item(i))).collect()
}

#[test]
fn a_cloned_map_shares_its_members_and_outlives_the_original() {
    let m = wide_map();
    let copy = m.clone();
    for ((ka, va), (kb, vb)) in m.iter().zip(copy.iter()) {
        assert!(std::ptr::eq(ka.as_str(), kb.as_str()));
        assert!(va.ptr_eq(vb));
    }
    assert_eq!(strong_count(copy.get_index(1).unwrap().1), 2);
    drop(m);
    let values: Vec<Json> = copy.values().cloned().collect();
    assert_eq!(tags(&values), (0..=JSON_MAP_INDEX_FROM).collect::<Vec<_>>());
    assert_eq!(copy.get(&format!("{LONG} 3")).map(tag_of), Some(3));
}

#[test]
fn a_patched_map_has_its_new_values_and_shares_the_rest() {
    let m = wide_map();
    let last = JSON_MAP_INDEX_FROM;
    let patched: Patched = [(1, item(100)), (last, item(200))].into_iter().collect();
    let mut out = m.patched(patched, 1);
    out.insert(format!("{LONG} added").into(), item(300));
    for (i, ((_, va), (_, vb))) in m.iter().zip(out.iter()).enumerate() {
        assert_eq!(va.ptr_eq(vb), i != 1 && i != last, "{i}");
    }
    // Either may go first.
    let again = m.patched(Patched::new(), 0);
    drop(m);
    let values: Vec<Json> = out.values().cloned().collect();
    let mut want: Vec<usize> = (0..=last).collect();
    (want[1], want[last]) = (100, 200);
    want.push(300);
    assert_eq!(tags(&values), want);
    assert_eq!(out.get(&format!("{LONG} added")).map(tag_of), Some(300));
    drop((out, values));
    assert_eq!(again.get_index(1).map(|(_, v)| tag_of(v)), Some(1));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "a refused copy touches no memory; a panic costs seconds under Miri"
)]
#[should_panic(expected = "increasing")]
fn a_map_patched_out_of_order_is_refused_before_any_copy() {
    let patched: Patched = [(2, heap(1)), (1, heap(2))].into_iter().collect();
    let _ = small_map().patched(patched, 0);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "a refused copy touches no memory; a panic costs seconds under Miri"
)]
#[should_panic(expected = "increasing")]
fn a_map_patched_past_its_end_is_refused_before_any_copy() {
    let patched: Patched = [(3, heap(1))].into_iter().collect();
    let _ = small_map().patched(patched, 0);
}

#[test]
fn a_short_array_copy_owns_every_element() {
    let a = Arc::new(JsonArray::from_vec((0..4).map(item).collect()));
    let patched: Patched = [(0, item(10)), (2, item(12))].into_iter().collect();
    let extra = [item(20)];
    let out = JsonArray::patched(&a, 3, patched, extra.iter());
    assert!(!out.is_chained());
    assert_eq!(out.generation(), 0);
    assert!(out[1].ptr_eq(&a[1]));
    assert!(out[3].ptr_eq(&extra[0]));
    drop(a);
    drop(extra);
    assert_eq!(tags(&out), [10, 1, 12, 20]);
}

fn short_array() -> Arc<JsonArray> {
    Arc::new(JsonArray::from_vec((0..3).map(heap).collect()))
}

#[test]
#[cfg_attr(
    miri,
    ignore = "a refused copy touches no memory; a panic costs seconds under Miri"
)]
#[should_panic(expected = "past the array's end")]
fn an_array_truncated_past_its_end_is_refused() {
    let _ = JsonArray::patched(&short_array(), 4, Patched::new(), [].iter());
}

#[test]
#[cfg_attr(
    miri,
    ignore = "a refused copy touches no memory; a panic costs seconds under Miri"
)]
#[should_panic(expected = "increasing")]
fn an_array_patched_twice_at_one_position_is_refused() {
    let patched: Patched = [(1, heap(1)), (1, heap(2))].into_iter().collect();
    let _ = JsonArray::patched(&short_array(), 3, patched, [].iter());
}

/// Long arrays copied with changes, each sharing its unchanged elements
/// with the one before, past the chain's bound; then the versions dropped
/// out of order, every remaining one still whole.
#[test]
fn a_chain_past_its_bound_drops_soundly_in_any_order() {
    let len = CHAIN_FROM + 1;
    let mut model: Vec<usize> = (0..len).collect();
    let first = Arc::new(JsonArray::from_vec((0..len).map(item).collect()));
    let mut versions: Vec<(Arc<JsonArray>, Vec<usize>)> = vec![(first, model.clone())];
    let mut generations = Vec::new();
    for step in 0..usize::from(MAX_ARRAY_CHAIN) + 2 {
        let tag = 100 + step;
        // Every third copy also drops the last element, every fourth
        // appends one.
        let mut truncate = model.len();
        if step % 3 == 2 {
            truncate -= 1;
            model.pop();
        }
        let at = (step * 5) % truncate;
        model[at] = tag;
        let mut append = Vec::new();
        if step % 4 == 3 {
            model.push(tag + 50);
            append.push(item(tag + 50));
        }
        let patched: Patched = [(at, item(tag))].into_iter().collect();
        let prev = &versions.last().unwrap().0;
        let out = JsonArray::patched(prev, truncate, patched, append.iter());
        generations.push(out.generation());
        assert_eq!(out.is_chained(), out.generation() > 0);
        versions.push((out, model.clone()));
    }
    // Chained up to the bound, then owned again.
    assert!(generations.contains(&MAX_ARRAY_CHAIN), "{generations:?}");
    assert!(
        generations.windows(2).any(|w| w[1] < w[0]),
        "{generations:?}"
    );
    for ix in [5usize, 0, 7, 2, 2, 0, 3, 1] {
        if ix < versions.len() {
            versions.remove(ix);
        }
    }
    for (a, m) in &versions {
        assert_eq!(&tags(a), m);
    }
}

#[test]
fn shared_copies_are_clones() {
    let (s, a) = (heap(1), item(2));
    let key = smol_str::SmolStr::new(format!("{LONG} key"));
    let (s2, a2, key2) = (shared(&s), shared(&a), shared_key(&key));
    assert!(s2.ptr_eq(&s) && a2.ptr_eq(&a));
    assert_eq!(strong_count(&a), 2);
    drop((s, a, key));
    assert_eq!(strong_count(&a2), 1);
    assert_eq!((tag_of(&s2), tag_of(&a2)), (1, 2));
    assert_eq!(key2, format!("{LONG} key"));
    // Inline strings and scalars own nothing: copies of them neither.
    assert_eq!(shared(&Json::string("short")), Json::string("short"));
    assert_eq!(shared(&Json::Number(7.into())), Json::Number(7.into()));
}

#[test]
fn push_with_appends_through_every_growth() {
    let mut out: Vec<Json> = Vec::new();
    for i in 0..5 {
        push_with(&mut out, || heap(i));
    }
    assert_eq!(tags(&out), [0, 1, 2, 3, 4]);
}

#[test]
fn decoded_text_round_trips() {
    let text = format!(r#"{{"a":[1,2.5,null,true,"{LONG}"],"{LONG}":{{"x":{{}}}}}}"#);
    let v: Json = serde_json::from_str(&text).unwrap();
    assert_eq!(v.to_json_string(), text);
    assert_eq!(v.json_len(), text.len());
}
