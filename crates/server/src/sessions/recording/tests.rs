use super::*;

/// What the store holds after `batches` were written in order.
fn store_of(batches: &[&Handed]) -> StoredRecording {
    let mut kept = StoredRecording::default();
    for b in batches {
        if let Some(h) = &b.head {
            kept.head = Some(h.clone());
        }
        if b.entries.is_empty() {
            continue;
        }
        kept.batches.retain(|k| k.first_seq != b.first_seq);
        kept.batches.push(StoredBatch {
            first_seq: b.first_seq,
            count: b.entries.len() as u64,
            entries: b.entries.join(","),
        });
        kept.batches.sort_by_key(|k| k.first_seq);
    }
    kept
}

fn parsed(stored: &StoredRecording) -> Value {
    serde_json::from_str(&document("s", stored).unwrap().text).unwrap()
}

#[test]
fn accepted_sends_of_others_are_actions_and_the_record_is_bounded() {
    let mut r = Recorder::default();
    r.attached(1, "board");
    r.attached(2, "p1");
    r.init(&json!({"set": {"items": []}}), "seed-1");
    r.event("start", (10.0, 0.0), None);
    // The authority's own message is not an action.
    r.send_called(1, 1, r#"[{"to":"all","data":{"s":1}}]"#, Some("board"));
    r.answered(1, 1, true, (11.0, 1.0));
    // A refused send is not recorded; an accepted one is.
    r.send_called(2, 1, r#"[{"to":"authority","data":"x"}]"#, Some("board"));
    r.answered(2, 1, false, (12.0, 2.0));
    r.send_called(
        2,
        2,
        r#"[{"to":"authority","data":{"a":"j"}}]"#,
        Some("board"),
    );
    r.answered(2, 2, true, (13.0, 3.0));
    // Whitespace around the one argument, as a JSON encoder may write it.
    r.send_called(
        2,
        4,
        "\n [ {\"to\":\"authority\",\"data\":[2]}\t]\r\n",
        Some("board"),
    );
    r.answered(2, 4, true, (14.0, 4.0));
    let first = r.take_batch().unwrap();
    let doc = parsed(&store_of(&[&first]));
    assert_eq!(doc["displaySeed"], "seed-1");
    assert_eq!(doc["init"]["set"]["items"], json!([]));
    let entries = doc["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3, "{doc}");
    assert_eq!(entries[1]["from"], "p1");
    assert_eq!(entries[1]["message"]["data"]["a"], "j");
    assert_eq!(entries[1]["gameTimeMs"], 3.0);
    assert_eq!(
        entries[2]["message"],
        json!({"to": "authority", "data": [2]})
    );
    // Past the bound: truncated, nothing more kept.
    for i in 0..MAX_RECORDING_ENTRIES {
        r.event("pause", (i as f64, 0.0), None);
    }
    assert_eq!(r.count() as usize, MAX_RECORDING_ENTRIES);
    let rest = r.take_batch().unwrap();
    assert!(rest.head.is_some(), "the head says it was truncated");
    let doc = parsed(&store_of(&[&first, &rest]));
    assert_eq!(doc["truncated"], true);
    assert_eq!(
        doc["entries"].as_array().unwrap().len(),
        MAX_RECORDING_ENTRIES
    );
    r.send_called(2, 3, r#"[{"to":"authority","data":1}]"#, Some("board"));
    assert!(r.sends.is_empty());
}

#[test]
fn a_restored_record_goes_on_from_what_was_kept() {
    let mut r = Recorder::default();
    r.init(&json!({"set": {"items": [1]}}), "seed-1");
    r.event("start", (1.0, 0.0), None);
    r.event("pause", (2.0, 1.0), None);
    let kept = r.take_batch().unwrap();
    let mut back = Recorder::restored(&store_of(&[&kept])).unwrap();
    assert!(back.take_batch().is_none(), "nothing new to write yet");
    // The continued authority's InitPayload does not replace the first.
    back.init(&json!({"set": {"items": [2]}}), "seed-2");
    back.event("resume", (3.0, 1.0), None);
    let next = back.take_batch().unwrap();
    assert!(next.head.is_none(), "the head is unchanged");
    assert_eq!(next.first_seq, 2, "appended after what was kept");
    let doc = parsed(&store_of(&[&kept, &next]));
    assert_eq!(doc["init"]["set"]["items"], json!([1]));
    assert_eq!(doc["displaySeed"], "seed-1");
    let kinds: Vec<&str> = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["start", "pause", "resume"]);
    assert_eq!(back.bytes, r.bytes + doc["entries"][2].to_string().len());
    let unreadable = StoredRecording {
        head: Some("not json".into()),
        batches: vec![],
    };
    assert!(Recorder::restored(&unreadable).is_none());
}

#[test]
fn a_head_holding_its_entries_is_written_again_as_entries() {
    // As a file kept before the entries were kept apart has it.
    let old = StoredRecording {
        head: Some(
            r#"{"format":"hostwire-memizy-recording","version":1,"sessionId":"s","displaySeed":"d","truncated":false,"init":{"x":1},"entries":[{"type":"start"},{"type":"pause"}]}"#.into(),
        ),
        batches: vec![],
    };
    assert_eq!(document("s", &old).unwrap().entries, 2);
    let mut r = Recorder::restored(&old).unwrap();
    r.event("resume", (0.0, 0.0), None);
    let b = r.take_batch().unwrap();
    assert_eq!(b.first_seq, 0);
    assert_eq!(b.entries.len(), 3);
    let head: Value = serde_json::from_str(b.head.as_deref().unwrap()).unwrap();
    assert_eq!(head["init"], json!({"x": 1}));
    assert!(head.get("entries").is_none(), "{head}");
    let doc = parsed(&store_of(&[&b]));
    assert_eq!(doc["entries"][2]["type"], "resume");
    assert_eq!(doc["displaySeed"], "d");
}

#[test]
fn batches_go_by_count_bytes_or_age_and_acknowledged_entries_leave_memory() {
    let mut r = Recorder::default();
    let mut now = 0;
    let mut id = 0;
    for i in 0..10_000 {
        r.event("pause", (i as f64, 0.0), None);
        if r.due(now) {
            let b = r.take_batch().unwrap();
            let batch = Batch {
                first_seq: b.first_seq,
                end_seq: b.first_seq + b.entries.len() as u64,
                head: b.head.is_some(),
            };
            r.in_flight(id, batch);
            r.acked(id, true, now);
            id += 1;
        }
        assert!(r.held() <= WRITE_AFTER_ENTRIES as usize, "{}", r.held());
    }
    assert_eq!(id, 10_000 / WRITE_AFTER_ENTRIES);
    // A lone entry waits for its batch at most WRITE_AFTER_MS.
    let mut r = Recorder::default();
    r.event("start", (0.0, 0.0), None);
    assert!(!r.due(now));
    assert_eq!(r.deadline(), Some(now + WRITE_AFTER_MS));
    now += WRITE_AFTER_MS - 1;
    assert!(!r.due(now));
    now += 1;
    assert!(r.due(now));
    // Large entries go by their bytes.
    let mut r = Recorder::default();
    let big = "x".repeat(WRITE_AFTER_BYTES / 4);
    for _ in 0..3 {
        r.event("pause", (0.0, 0.0), Some(json!(big)));
        assert!(!r.due(0));
    }
    r.event("pause", (0.0, 0.0), Some(json!(big)));
    assert!(r.due(0));
}

#[test]
fn a_refused_batch_is_handed_out_again_and_a_later_one_waits_for_it() {
    let mut r = Recorder::default();
    let batch = |b: &Handed| Batch {
        first_seq: b.first_seq,
        end_seq: b.first_seq + b.entries.len() as u64,
        head: b.head.is_some(),
    };
    r.init(&json!({}), "d");
    r.event("start", (0.0, 0.0), None);
    let a = r.take_batch().unwrap();
    r.in_flight(1, batch(&a));
    r.event("pause", (0.0, 0.0), None);
    let b = r.take_batch().unwrap();
    assert_eq!((b.first_seq, b.head.is_none()), (1, true));
    r.in_flight(2, batch(&b));
    r.acked(1, false, 100);
    // The later batch was written, over a gap: nothing leaves memory.
    r.acked(2, true, 100);
    assert_eq!(r.held(), 2);
    // Due again a second after the refusal, even with nothing new.
    assert_eq!(r.deadline(), Some(100 + RETRY_AFTER_MS));
    r.event("resume", (0.0, 0.0), None);
    assert!(
        !r.due(100 + RETRY_AFTER_MS - 1),
        "not at once after a refusal"
    );
    assert!(r.due(100 + RETRY_AFTER_MS));
    let again = r.take_batch().unwrap();
    assert_eq!(again.first_seq, 0);
    assert_eq!(again.entries.len(), 3);
    assert!(again.head.is_some(), "the refused head goes again");
    r.in_flight(3, batch(&again));
    r.acked(3, true, 2_000);
    assert_eq!(r.held(), 0);
    assert!(r.take_unsaved().is_none(), "everything is durable");
    let doc = parsed(&store_of(&[&a, &b, &again]));
    assert_eq!(doc["entries"].as_array().unwrap().len(), 3);
}

#[test]
fn the_last_write_holds_everything_not_acknowledged() {
    let mut r = Recorder::default();
    r.init(&json!({}), "d");
    r.event("start", (0.0, 0.0), None);
    let a = r.take_batch().unwrap();
    r.in_flight(
        1,
        Batch {
            first_seq: 0,
            end_seq: 1,
            head: true,
        },
    );
    r.event("end", (0.0, 0.0), None);
    let last = r.take_unsaved().unwrap();
    assert_eq!(last.first_seq, 0, "the batch in flight too");
    assert_eq!(last.entries.len(), 2);
    assert!(last.head.is_some());
    assert_eq!(parsed(&store_of(&[&last]))["entries"][1]["type"], "end");
    drop(a);
}

#[test]
fn the_record_is_the_chain_of_batches_from_the_first_entry() {
    let batch = |first_seq, entries: &[&str]| StoredBatch {
        first_seq,
        count: entries.len() as u64,
        entries: entries.join(","),
    };
    let stored = StoredRecording {
        head: Some(r#"{"displaySeed":"d","truncated":false,"init":null}"#.into()),
        batches: vec![
            batch(0, &["0", "1", "2"]),
            // Left over: written before a refused batch was written again
            // from entry 0's batch on.
            batch(2, &["9"]),
            batch(3, &["3"]),
            // After a gap (a batch that never became durable).
            batch(6, &["6"]),
        ],
    };
    let doc = document("s", &stored).unwrap();
    assert_eq!(doc.entries, 4);
    let v: Value = serde_json::from_str(&doc.text).unwrap();
    assert_eq!(v["entries"], json!([0, 1, 2, 3]));
    let mut r = Recorder::restored(&stored).unwrap();
    assert_eq!((r.count(), r.bytes), (4, 4));
    r.event("start", (0.0, 0.0), None);
    assert_eq!(
        r.take_batch().unwrap().first_seq,
        4,
        "appended after the chain"
    );
}
