//! A match survives a restart of the real server in the middle of play:
//! every token works again (revoked ones stay refused) and play resumes
//! from the last recorded tick.

use crate::support::playerthree::*;
use crate::support::process::Process;
use serde_json::{json, Value};

/// Milliseconds between ticks of the spawned server: short, so that a
/// few ticks pass while the test waits for their frames.
const SERVER_TICK_MS: &str = "400";

struct Server {
    process: Process,
    http: String,
    ws: String,
}

fn spawn_server(dir: &std::path::Path) -> Server {
    let process = Process::serve(
        dir,
        &[
            "--allowed-origins",
            ORIGIN,
            "--playerthree-tick-ms",
            SERVER_TICK_MS,
        ],
        &[("HOSTWIRE_OPERATOR_TOKEN", OPERATOR)],
    );
    Server {
        http: process.http(),
        ws: process.ws("/playerthree/ws"),
        process,
    }
}

/// The tick of the last game state the store holds for match `id`.
fn last_recorded_tick(db: &std::path::Path, id: &str) -> u64 {
    use hostwire_store::playerthree::PlayerThreeStore;
    let store = hostwire_store::SqliteStore::open(db).unwrap();
    let m = store
        .load_matches()
        .unwrap()
        .into_iter()
        .find(|m| m.id == id)
        .unwrap();
    m.records
        .iter()
        .map(|r| serde_json::from_str::<Value>(r).unwrap())
        .filter(|r| r["record"] == "state")
        .map(|r| r["tick"].as_u64().unwrap())
        .max()
        .unwrap()
}

async fn join(ws: &str, token: &str) -> (Client, Value) {
    let mut c = Client::connect(ws, Some(ORIGIN)).await.unwrap();
    c.send(json!({"op": "join", "token": token})).await;
    let v = c.recv().await;
    (c, v)
}

/// The tick of the newest view among the next frames, reading until one
/// at `at_least` arrives. Views are applied as the protocol says.
async fn view_tick_at_least(c: &mut Client, state: &mut Option<Value>, at_least: u64) -> u64 {
    loop {
        let v = c.recv_op("view").await;
        if let Some(full) = v.get("view") {
            *state = Some(full.clone());
        } else {
            let base = state.as_ref().expect("a delta without a keyframe");
            let mut next = base.clone();
            apply(&mut next, &v["delta"]);
            *state = Some(next);
        }
        let tick = state.as_ref().unwrap()["tick"].as_u64().unwrap();
        if tick >= at_least {
            return tick;
        }
    }
}

/// Applies a JSON delta (the protocol page's table) in place.
fn apply(v: &mut Value, d: &Value) {
    match d {
        Value::Array(a) if a.len() == 1 => *v = a[0].clone(),
        Value::Object(m) => match v {
            Value::Object(target) => {
                for (k, sub) in m {
                    if sub == &json!([]) {
                        target.remove(k);
                    } else if let Some(t) = target.get_mut(k) {
                        apply(t, sub);
                    } else if let Value::Array(a) = sub {
                        target.insert(k.clone(), a[0].clone());
                    }
                }
            }
            Value::Array(arr) => {
                for (k, sub) in m {
                    if let Ok(i) = k.parse::<usize>() {
                        apply(&mut arr[i], sub);
                    }
                }
                if let Some(n) = m.get("-").and_then(Value::as_u64) {
                    arr.truncate(n as usize);
                }
                if let Some(Value::Array(more)) = m.get("+") {
                    arr.extend(more.iter().cloned());
                }
            }
            _ => panic!("a patch on a scalar"),
        },
        other => panic!("not a delta: {other}"),
    }
}

#[tokio::test]
async fn a_restart_in_the_middle_of_a_match_keeps_tokens_and_resumes_from_the_last_tick() {
    let dir = tempfile::Builder::new()
        .prefix("hostwire-test-playerthree-restart-")
        .tempdir()
        .unwrap();
    let s = spawn_server(dir.path());
    let (id, op) = create_match(&s.http).await;
    let red = mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let seat = mint(
        &s.http,
        &id,
        &op,
        json!({"kind": "seat", "team": "red", "role": "red-scout"}),
    )
    .await;
    let gone = mint(&s.http, &id, &op, json!({"kind": "spectator"})).await;
    assert_eq!(revoke(&s.http, &id, &op, &gone).await, 200);

    let (mut o, v) = join(&s.ws, &red).await;
    assert_eq!(v["ok"], true, "{v}");
    o.expect_ok(
        json!({"op": "controller", "seq": 1, "role": "red-scout", "controller": {"kind": "agent"}}),
    )
    .await;
    o.expect_ok(json!({"op": "call", "seq": 2, "role": "red-scout", "method": "move", "args": {"dir": "s"}}))
        .await;
    // A second connection of the owner follows the views from a keyframe.
    let (mut o, _) = join(&s.ws, &red).await;
    let mut state = None;
    let before = view_tick_at_least(&mut o, &mut state, 3).await;
    let scout_y_before = state.as_ref().unwrap()["units"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["role"] == "red-scout")
        .unwrap()["y"]
        .as_u64()
        .unwrap();
    assert!(scout_y_before >= 2, "the scout walked south: {state:?}");

    // Killed in the middle of play: what was recorded is what survives.
    drop(s);
    let recorded = last_recorded_tick(&dir.path().join("hostwire.db"), &id);
    assert!(recorded + 1 >= before, "recorded {recorded}, seen {before}");
    let s = spawn_server(dir.path());
    let (mut o, v) = join(&s.ws, &red).await;
    assert_eq!(v["ok"], true, "the team token works again: {v}");
    let mut state = None;
    let after = view_tick_at_least(&mut o, &mut state, 0).await;
    assert_eq!(after, recorded, "play resumes from the last recorded tick");
    // Play goes on from there, with the controller and order it had.
    let later = view_tick_at_least(&mut o, &mut state, after + 2).await;
    assert!(later > after);
    let seats_ok = o
        .expect_ok(json!({"op": "scopes", "seq": 3, "role": "red-scout", "scopes": ["*"]}))
        .await;
    let _ = seats_ok;
    let (mut a, v) = join(&s.ws, &seat).await;
    assert_eq!(
        v["data"]["role"], "red-scout",
        "the seat token works again: {v}"
    );
    a.expect_ok(json!({"op": "call", "seq": 1, "role": "red-scout", "method": "hold"}))
        .await;
    let (_, v) = join(&s.ws, &gone).await;
    assert_eq!(v["code"], "bad_token", "a revoked token stays refused: {v}");
}

/// Stops the server as an operator does (SIGTERM): queued records are
/// flushed before it exits.
fn stop_gracefully(mut s: Server) {
    let status = s.process.sigterm();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn a_pending_proposal_survives_a_restart_and_its_owner_resolves_it_after() {
    let dir = tempfile::Builder::new()
        .prefix("hostwire-test-playerthree-proposal-")
        .tempdir()
        .unwrap();
    let s = spawn_server(dir.path());
    let (id, op) = create_match(&s.http).await;
    let red = mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let seat = mint(
        &s.http,
        &id,
        &op,
        json!({"kind": "seat", "team": "red", "role": "red-scout"}),
    )
    .await;
    let (mut o, _) = join(&s.ws, &red).await;
    o.expect_ok(json!({"op": "controller", "seq": 1, "role": "red-scout", "controller": {"kind": "agent", "supervised": true}}))
        .await;
    let (mut a, _) = join(&s.ws, &seat).await;
    let d = a
        .expect_ok(json!({"op": "call", "seq": 1, "role": "red-scout", "method": "move", "args": {"dir": "s"}}))
        .await;
    assert_eq!(d["status"], "pending", "{d}");
    let proposal = d["proposal"].as_str().unwrap().to_owned();
    drop((o, a));
    stop_gracefully(s);

    let s = spawn_server(dir.path());
    let (mut a, _) = join(&s.ws, &seat).await;
    // Still waiting for the owner: the seat may not propose again.
    a.expect_error(
        json!({"op": "call", "seq": 2, "role": "red-scout", "method": "hold"}),
        "approval_pending",
    )
    .await;
    let (mut o, _) = join(&s.ws, &red).await;
    let d = o
        .expect_ok(json!({"op": "resolveApproval", "seq": 2, "role": "red-scout", "id": proposal, "approve": true}))
        .await;
    assert_eq!(d["status"], "applied", "{d}");
    // Resolved, the seat proposes again, under an id never used before.
    let d = a
        .expect_ok(json!({"op": "call", "seq": 3, "role": "red-scout", "method": "hold"}))
        .await;
    assert_ne!(d["proposal"], proposal.as_str());
}
