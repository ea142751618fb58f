//! Services over worker RPC (SPEC 5.3, 8.1) through the server: a
//! controller's plugin calls the built-in answer checker; a worker that
//! never answers fails its call at the deadline (on the manual clock)
//! while the session goes on, and is killed as hung; a worker that exits
//! fails its call and is started again, at most 5 times a minute.

use crate::support::session::*;
use hostwire_worker_rpc::frame::{Frame, PROTOCOL_VERSION};
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;

const TIMEOUT_MS: u64 = 2_000;

fn hello_line() -> String {
    Frame::Hello {
        v: PROTOCOL_VERSION.to_owned(),
        features: Vec::new(),
        agent: Some("test-worker".into()),
    }
    .to_text()
}

/// Says hello, then reads and never answers.
fn hanging() -> ServiceCommand {
    sh_service(
        "test.hang",
        &format!(
            "printf '%s\\n' '{}'; while read -r l; do :; done",
            hello_line()
        ),
    )
}

/// Says hello, reads the host's hello and one request, and exits.
fn exiting() -> ServiceCommand {
    sh_service(
        "test.exit",
        &format!("printf '%s\\n' '{}'; read a; read b; exit 3", hello_line()),
    )
}

/// Answers each request with a string of `payload.bytes` letters.
fn big() -> ServiceCommand {
    sh_service(
        "test.big",
        &format!(
            r#"printf '%s\n' '{}'; read a; while read -r req; do
  id=$(printf '%s' "$req" | sed 's/.*"id":\([0-9]*\).*/\1/')
  n=$(printf '%s' "$req" | sed 's/.*"bytes":\([0-9]*\).*/\1/')
  s=$(head -c "$n" /dev/zero | tr '\0' x)
  printf '{{"v":"1.0.0","kind":"response","id":%s,"ok":true,"result":"%s"}}\n' "$id" "$s"
done"#,
            hello_line()
        ),
    )
}

fn code(r: Result<Value, hostwire::sessions::device::RemoteError>) -> (String, String) {
    let e = r.expect_err("an error");
    (e.code, e.message)
}

/// Waits (without waiting for time) until `f` holds.
async fn eventually(f: impl Fn() -> bool) {
    tokio::time::timeout(GUARD, async {
        while !f() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the condition did not come true");
}

/// A running presenter game of two players with the services offered.
async fn game(h: &TestHost, api: &Api) -> (String, String, Device, Device, Device) {
    h.server.as_ref().unwrap().sessions.use_services(
        vec![answer_checker(), hanging(), exiting(), big()],
        TIMEOUT_MS,
    );
    let (sid, token) = api.create(&presenter_body(2)).await;
    api.op(&sid, &token, "start").await;
    let (board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let (p1, init) = api.device(&sid, "controller", "p1").await;
    // Declared (answers.check, test.*, ai.chat) and offered (not ai.chat).
    assert_eq!(
        init["services"],
        json!(["answers.check", "test.hang", "test.exit", "test.big"])
    );
    p1.call("ready", json!([])).await.unwrap();
    let (p2, _) = api.device(&sid, "controller", "p2").await;
    p2.call("ready", json!([])).await.unwrap();
    (sid, token, board, p1, p2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_calls_the_built_in_answer_checker_through_the_server() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (_sid, _token, mut board, p1, _p2) = game(&h, &api).await;
    board.wait_for("start", GUARD).await.expect("start");
    let r = p1
        .call(
            "service",
            json!(["answers.check", {"answer": "jupitr", "accepted": ["Mars", "Jupiter"]}]),
        )
        .await
        .unwrap();
    assert_eq!(
        r,
        json!({"correct": true, "matched": "Jupiter", "distance": 1, "normalized": "jupitr"})
    );
    // The worker names the field of a bad payload.
    let (c, m) = code(
        p1.call("service", json!(["answers.check", {"answer": 42}]))
            .await,
    );
    assert_eq!(c, "INVALID_ARGUMENT", "{m}");
    assert!(m.contains("payload.answer"), "{m}");
    // Declared but not offered; offered but not declared.
    let (c, m) = code(p1.call("service", json!(["ai.chat", {}])).await);
    assert_eq!(c, "SERVICE_UNAVAILABLE", "{m}");
    let (c, _) = code(p1.call("service", json!(["tts.speak", {}])).await);
    assert_eq!(c, "SERVICE_UNAVAILABLE");
    // Over 64 KB of request.
    let big = "x".repeat(65 * 1024);
    let (c, _) = code(
        p1.call("service", json!(["answers.check", {"answer": big}]))
            .await,
    );
    assert_eq!(c, "MESSAGE_TOO_LARGE");
    // 30 calls a minute per instance: 2 of its calls so far passed the
    // declaration and size checks; 28 more, then RATE_LIMITED.
    let payload = json!(["answers.check", {"answer": "a", "accepted": ["a"]}]);
    let mut limited = None;
    for i in 0..30 {
        match p1.call("service", payload.clone()).await {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.code, "RATE_LIMITED", "{e}");
                limited = Some(i);
                break;
            }
        }
    }
    assert_eq!(limited, Some(28));
    h.clock.advance_ms(2_000);
    p1.call("service", payload).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_answers_fails_the_call_at_its_deadline_while_the_game_goes_on() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (sid, token, mut board, p1, p2) = game(&h, &api).await;
    board.wait_for("start", GUARD).await.expect("start");
    let (_, hung) = p1.send_call("service", &json!(["test.hang", {"q": 1}]));
    // The session goes on while the call is out: messages are routed, and
    // another service answers, for the same instance and another.
    p1.call("send", send_args(json!("authority"), json!("still here")))
        .await
        .unwrap();
    loop {
        let d = board.wait_for("deliver", GUARD).await.expect("deliver");
        if d.args[0]["data"] == "still here" {
            break;
        }
    }
    let ok = json!(["answers.check", {"answer": "venus", "accepted": ["Venus"]}]);
    assert_eq!(
        p1.call("service", ok.clone()).await.unwrap()["correct"],
        true
    );
    assert_eq!(p2.call("service", ok).await.unwrap()["correct"], true);
    // At the deadline (the manual clock; any command wakes the session)
    // the call fails with INTERNAL_ERROR, never a hang.
    h.clock.advance_ms(TIMEOUT_MS - 1);
    api.status(&sid, &token).await;
    h.clock.advance_ms(1);
    api.status(&sid, &token).await;
    let (c, m) = code(Device::answer(hung).await);
    assert_eq!(c, "INTERNAL_ERROR", "{m}");
    assert!(m.contains("did not answer within 2000 ms"), "{m}");
    // It answered nothing since the call: killed as hung, started again
    // for the next call.
    let metrics = std::sync::Arc::clone(&h.server.as_ref().unwrap().sessions.metrics.services);
    eventually(|| metrics.workers_killed_hung.load(Relaxed) == 1).await;
    let starts = metrics.worker_starts.load(Relaxed);
    let (_, again) = p2.send_call("service", &json!(["test.hang", {}]));
    eventually(|| metrics.worker_starts.load(Relaxed) == starts + 1).await;
    h.clock.advance_ms(TIMEOUT_MS);
    api.status(&sid, &token).await;
    assert_eq!(code(Device::answer(again).await).0, "INTERNAL_ERROR");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_exits_fails_its_call_and_is_started_again_at_most_five_times_a_minute() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (_sid, _token, mut board, p1, _p2) = game(&h, &api).await;
    board.wait_for("start", GUARD).await.expect("start");
    let metrics = std::sync::Arc::clone(&h.server.as_ref().unwrap().sessions.metrics.services);
    for n in 1..=5 {
        let (c, m) = code(p1.call("service", json!(["test.exit", {}])).await);
        assert_eq!(c, "INTERNAL_ERROR", "{m}");
        assert!(m.contains("its worker exited"), "{m}");
        assert_eq!(metrics.worker_starts.load(Relaxed), n, "{n}");
    }
    // A sixth start within the minute is refused at once.
    let (c, m) = code(p1.call("service", json!(["test.exit", {}])).await);
    assert_eq!(c, "INTERNAL_ERROR");
    assert!(m.contains("started 5 times in the last minute"), "{m}");
    // The answer checker is another worker: unaffected.
    let ok = json!(["answers.check", {"answer": "mars", "accepted": ["Mars"]}]);
    assert_eq!(p1.call("service", ok).await.unwrap()["correct"], true);
    h.clock.advance_ms(60_000);
    let (_, m) = code(p1.call("service", json!(["test.exit", {}])).await);
    assert!(m.contains("its worker exited"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_over_256_kb_is_message_too_large_and_never_buffered_whole() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (_sid, _token, mut board, p1, _p2) = game(&h, &api).await;
    board.wait_for("start", GUARD).await.expect("start");
    let r = p1
        .call("service", json!(["test.big", {"bytes": 200_000}]))
        .await
        .unwrap();
    assert_eq!(r.as_str().map(str::len), Some(200_000));
    // Over the SPEC's 256 KB: refused by the engine.
    let (c, m) = code(
        p1.call("service", json!(["test.big", {"bytes": 270_000}]))
            .await,
    );
    assert_eq!(c, "MESSAGE_TOO_LARGE", "{m}");
    // Over the worker's line bound: not buffered, the call alone fails.
    let (c, m) = code(
        p1.call("service", json!(["test.big", {"bytes": 400_000}]))
            .await,
    );
    assert_eq!(c, "MESSAGE_TOO_LARGE", "{m}");
    assert!(m.contains("over 262144 bytes"), "{m}");
    // The same worker answers the next call.
    let r = p1
        .call("service", json!(["test.big", {"bytes": 10}]))
        .await
        .unwrap();
    assert_eq!(r, json!("xxxxxxxxxx"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_devices_cancel_stops_its_pending_service_call_at_once() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (_sid, _token, _board, p1, _p2) = game(&h, &api).await;
    let (id, hung) = p1.send_call("service", &json!(["test.hang", {"q": 1}]));
    p1.send_raw(format!(
        r#"{{"v":"1.0.0","kind":"cancel","id":{id},"reason":"the player left the screen"}}"#
    ));
    // Answered CANCELLED now, on a clock that never moved to the deadline.
    let r = tokio::time::timeout(GUARD, Device::answer(hung))
        .await
        .expect("the cancelled call was never answered");
    let (c, m) = code(r);
    assert_eq!(c, "CANCELLED", "{m}");
    // The instance goes on: another call answers.
    let ok = json!(["answers.check", {"answer": "venus", "accepted": ["Venus"]}]);
    assert_eq!(p1.call("service", ok).await.unwrap()["correct"], true);
}
