//! Agents through MCP (`/playerthree/mcp`, streamable HTTP) with rmcp's own
//! client: a whole match of the example game played by two agents, the
//! team view as a subscribable resource, tells, the approval flow, and
//! commentary disclosed to observers.
#![allow(deprecated)] // resources/subscribe: the session-era API the server speaks.

use crate::support::playerthree::*;
use rmcp::model::{
    CallToolRequestParams, ClientInfo, LoggingMessageNotificationParam, ProtocolVersion,
    ReadResourceRequestParams, ResourceUpdatedNotificationParam, SubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

struct Agent {
    updates: mpsc::UnboundedSender<String>,
    /// Pushed tells (logging notifications of logger `playerthree/tell`).
    /// Test-only; bounded by the few tells each test sends.
    tells: mpsc::UnboundedSender<Value>,
    /// `notifications/tools/list_changed` (test-only, a few per test).
    tools_changed: mpsc::UnboundedSender<()>,
}

impl ClientHandler for Agent {
    fn get_info(&self) -> ClientInfo {
        // Sessions (and with them subscriptions) are of the handshake era.
        ClientInfo::default().with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.updates.send(params.uri);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.tools_changed.send(());
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if params.logger.as_deref() == Some("playerthree/tell") {
            let _ = self.tells.send(params.data);
        }
    }
}

type Session = RunningService<RoleClient, Agent>;

async fn connect(
    url: &str,
    token: &str,
) -> Result<(Session, mpsc::UnboundedReceiver<String>), String> {
    connect_with_tells(url, token).await.map(|(s, u, _)| (s, u))
}

type Tells = mpsc::UnboundedReceiver<Value>;

async fn connect_with_tells(
    url: &str,
    token: &str,
) -> Result<(Session, mpsc::UnboundedReceiver<String>, Tells), String> {
    connect_all(url, token).await.map(|(s, u, t, _)| (s, u, t))
}

type ToolsChanged = mpsc::UnboundedReceiver<()>;

async fn connect_all(
    url: &str,
    token: &str,
) -> Result<
    (
        Session,
        mpsc::UnboundedReceiver<String>,
        Tells,
        ToolsChanged,
    ),
    String,
> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (tells, tells_rx) = mpsc::unbounded_channel();
    let (tools_changed, tools_rx) = mpsc::unbounded_channel();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token.to_owned()),
    );
    let agent = Agent {
        updates: tx,
        tells,
        tools_changed,
    };
    let s = tokio::time::timeout(GUARD, agent.serve(transport))
        .await
        .map_err(|_| "initialize timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok((s, rx, tells_rx, tools_rx))
}

/// A tool call: (is_error, the JSON its text holds).
async fn tool(s: &Session, name: &str, args: Value) -> (bool, Value) {
    let mut p = CallToolRequestParams::new(name.to_owned());
    if let Value::Object(m) = args {
        p = p.with_arguments(m);
    }
    let r = tokio::time::timeout(GUARD, s.call_tool(p))
        .await
        .expect("tool call hung")
        .expect("tool call failed");
    let block = serde_json::to_value(&r.content[0]).unwrap();
    let text = block["text"].as_str().unwrap();
    (
        r.is_error == Some(true),
        serde_json::from_str(text).unwrap(),
    )
}

async fn read_view(s: &Session, uri: &str) -> Value {
    let r = s
        .read_resource(ReadResourceRequestParams::new(uri.to_owned()))
        .await
        .unwrap();
    let c = serde_json::to_value(&r.contents[0]).unwrap();
    serde_json::from_str(c["text"].as_str().unwrap()).unwrap()
}

fn unit<'a>(view: &'a Value, role: &str) -> &'a Value {
    view["units"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["role"] == role)
        .unwrap()
}

/// An owner hands a seat to an agent: controller, then a seat token.
async fn hand_to_agent(o: &mut Client, seq: u64, role: &str, supervised: bool) -> String {
    o.expect_ok(json!({"op": "controller", "seq": seq, "role": role, "controller": {"kind": "agent", "supervised": supervised}}))
        .await;
    let d = o
        .expect_ok(json!({"op": "mint", "seq": seq + 1, "role": role}))
        .await;
    d["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn two_agents_play_a_whole_match_over_mcp() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let blue = mint(&t.http, &id, &op, json!({"kind": "team", "team": "blue"})).await;
    let (mut red_owner, _) = t.join(&red).await;
    let (mut blue_owner, _) = t.join(&blue).await;
    let red_seat = hand_to_agent(&mut red_owner, 1, "red-scout", false).await;
    let blue_seat = hand_to_agent(&mut blue_owner, 1, "blue-scout", false).await;

    let (ra, mut red_updates) = connect(&t.mcp, &red_seat).await.unwrap();
    let (ba, _blue_updates) = connect(&t.mcp, &blue_seat).await.unwrap();

    // One tool per control method, with the game's input schema; an
    // agent-played seat also discloses.
    let tools = ra.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert_eq!(
        names,
        ["disclose", "hold", "inbox", "move", "proposal", "tell"]
    );
    let disclose = tools.iter().find(|t| t.name == "disclose").unwrap();
    assert_eq!(disclose.input_schema["additionalProperties"], false);
    assert_eq!(
        disclose.input_schema["properties"]["category"]["enum"],
        json!(["summary", "chat"])
    );
    let mv = tools.iter().find(|t| t.name == "move").unwrap();
    assert_eq!(
        mv.input_schema["properties"]["dir"]["enum"],
        json!(["n", "s", "e", "w"])
    );

    // The team view, read and subscribed.
    let resources = ra.list_all_resources().await.unwrap();
    assert_eq!(resources.len(), 2, "the view and the inbox");
    let uri = resources[0].uri.clone();
    assert_eq!(uri, format!("playerthree://{id}/view/red"));
    let view = read_view(&ra, &uri).await;
    assert_eq!(view["team"], "red");
    assert_eq!(view["enemies"], json!([]), "fogged: {view}");
    ra.subscribe(SubscribeRequestParams::new(uri.clone()))
        .await
        .unwrap();
    // Another team's view is not this seat's.
    assert!(ba
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await
        .is_err());

    // Blue holds; red walks its scout to the flag and holds it.
    let (err, d) = tool(&ba, "hold", json!({})).await;
    assert!(!err, "{d}");
    // An agent acts for its own seat only: the guard is human-played.
    let (err, d) = tool(&ra, "move", json!({"dir": "x"})).await;
    assert!(err, "bad args are refused: {d}");
    assert_eq!(d["code"], "invalid");

    let mut order = String::new();
    let mut view = view;
    let mut ticks = 0;
    while view["phase"] == "playing" {
        let scout = unit(&view, "red-scout");
        let (x, y) = (scout["x"].as_i64().unwrap(), scout["y"].as_i64().unwrap());
        let want = if y < 4 {
            "s"
        } else if x < 4 {
            "e"
        } else {
            "hold"
        };
        if want != order {
            let (err, d) = if want == "hold" {
                tool(&ra, "hold", json!({})).await
            } else {
                tool(&ra, "move", json!({"dir": want})).await
            };
            assert!(!err, "{d}");
            assert_eq!(d["order"], want);
            order = want.to_owned();
        }
        t.tick().await;
        ticks += 1;
        assert!(ticks <= 60, "the match never ended");
        let updated = tokio::time::timeout(GUARD, red_updates.recv())
            .await
            .expect("no resources/updated after a tick")
            .unwrap();
        assert_eq!(updated, uri);
        view = read_view(&ra, &uri).await;
    }
    assert_eq!(view["phase"], "over");
    assert_eq!(view["scores"]["red"], 5, "{view}");
    // Scout at the flag at tick 8, then 5 ticks alone on it.
    assert_eq!(view["tick"], 12, "{view}");
    let report = red_owner.recv_op("report").await;
    assert_eq!(report["team"], "red", "{report}");
    // A call after the end is refused by the host.
    let (err, d) = tool(&ra, "hold", json!({})).await;
    assert!(err, "{d}");
    assert_eq!(d["code"], "paused", "{d}");

    ra.cancel().await.unwrap();
    ba.cancel().await.unwrap();
}

#[tokio::test]
async fn tells_and_the_approval_flow_over_mcp() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, _) = t.join(&red).await;
    let seat = hand_to_agent(&mut o, 1, "red-guard", true).await;
    let (a, _) = connect(&t.mcp, &seat).await.unwrap();

    // Tells from the owner wait in the agent's inbox; its tell is `said`.
    o.expect_ok(json!({"op": "tell", "seq": 3, "roles": ["red-guard"], "text": "guard the flag"}))
        .await;
    let (err, inbox) = tool(&a, "inbox", json!({})).await;
    assert!(!err);
    assert_eq!(inbox[0]["text"], "guard the flag", "{inbox}");
    let (err, _) = tool(&a, "tell", json!({"text": "understood"})).await;
    assert!(!err);
    let said = o.recv_op("said").await;
    assert_eq!(
        (said["role"].as_str(), said["text"].as_str()),
        (Some("red-guard"), Some("understood"))
    );

    // Supervised: the call is a proposal; the owner approves it.
    let (err, p) = tool(&a, "move", json!({"dir": "s"})).await;
    assert!(!err, "{p}");
    assert_eq!(p["status"], "pending", "{p}");
    let pid = p["proposal"].as_str().unwrap().to_owned();
    let (err, d) = tool(&a, "hold", json!({})).await;
    assert!(err);
    assert_eq!(d["code"], "approval_pending");
    let (_, st) = tool(&a, "proposal", json!({"id": pid})).await;
    assert_eq!(st["status"], "pending");
    o.expect_ok(
        json!({"op": "resolveApproval", "seq": 4, "role": "red-guard", "id": pid, "approve": true}),
    )
    .await;
    let (_, st) = tool(&a, "proposal", json!({"id": pid})).await;
    assert_eq!(st["status"], "applied", "{st}");
    assert_eq!(st["result"]["order"], "s");
    a.cancel().await.unwrap();
}

#[tokio::test]
async fn mcp_refuses_requests_without_a_seat_token() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    // No token, a malformed one, an unknown one: 401 before MCP.
    for token in ["", "not a token", &"Q".repeat(32)] {
        let r = reqwest::Client::new()
            .post(&t.mcp)
            .header("Authorization", format!("Bearer {token}"))
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{token:?}");
        assert!(r.headers().contains_key("www-authenticate"));
    }
    // A team token is a token of the match, but not a seat: it cannot
    // open a session.
    assert!(connect(&t.mcp, &red).await.is_err());
    // A revoked seat token stops working.
    let (mut o, _) = t.join(&red).await;
    let seat = hand_to_agent(&mut o, 1, "red-scout", false).await;
    assert_eq!(revoke(&t.http, &id, &op, &seat).await, 200);
    assert!(connect(&t.mcp, &seat).await.is_err());
}

#[tokio::test]
async fn tells_are_pushed_to_an_agent_subscribed_to_its_inbox() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, _) = t.join(&red).await;
    let seat = hand_to_agent(&mut o, 1, "red-guard", false).await;
    let (a, _, mut tells) = connect_with_tells(&t.mcp, &seat).await.unwrap();
    let uri = format!("playerthree://{id}/inbox/red-guard");
    let listed = a.list_all_resources().await.unwrap();
    assert!(listed.iter().any(|r| r.uri == uri), "{listed:?}");

    // Before the subscription a tell waits; the resource shows it, untaken.
    o.expect_ok(json!({"op": "tell", "seq": 3, "roles": ["red-guard"], "text": "hold the ridge"}))
        .await;
    let waiting = read_view(&a, &uri).await;
    assert_eq!(waiting[0]["text"], "hold the ridge", "{waiting}");
    assert_eq!(read_view(&a, &uri).await, waiting);

    // Subscribed: what waited is pushed at once, later tells as they come.
    a.subscribe(SubscribeRequestParams::new(uri.clone()))
        .await
        .unwrap();
    let first = next_tell(&mut tells).await;
    assert_eq!(
        (first["role"].as_str(), first["text"].as_str()),
        (Some("red-guard"), Some("hold the ridge"))
    );
    o.expect_ok(
        json!({"op": "tell", "seq": 4, "roles": "all", "text": "now go north", "ping": {"x": 4}}),
    )
    .await;
    let second = next_tell(&mut tells).await;
    assert_eq!(second["text"], "now go north", "{second}");
    assert_eq!(second["ping"], json!({"x": 4}));
    // Pushed tells are delivered: the inbox is empty.
    let (_, inbox) = tool(&a, "inbox", json!({})).await;
    assert_eq!(inbox, json!([]));
    assert_eq!(read_view(&a, &uri).await, json!([]));
    a.cancel().await.unwrap();
}

async fn next_tell(tells: &mut Tells) -> Value {
    tokio::time::timeout(GUARD, tells.recv())
        .await
        .expect("no tell pushed")
        .unwrap()
}

/// An observer joined over the WebSocket, following `perspective`.
async fn observe(t: &TestServer, id: &str, op: &str, grant: Value, perspective: &str) -> Client {
    let token = mint(&t.http, id, op, json!({"kind": "observer", "grant": grant})).await;
    let (mut ob, v) = t.join(&token).await;
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(ob.recv().await["state"], "buffering");
    ob.send(json!({"op": "observer", "perspective": perspective}))
        .await;
    ob
}

/// The commentary in the frames an observer has received by now.
async fn commentary(ob: &mut Client) -> Vec<Value> {
    let frames = ob.drain().await;
    frames
        .iter()
        .filter_map(|f| f["frame"].get("commentary"))
        .flat_map(|c| c.as_array().unwrap().clone())
        .collect()
}

async fn tool_names(s: &Session) -> Vec<String> {
    let tools = tokio::time::timeout(GUARD, s.list_all_tools())
        .await
        .expect("tools/list hung")
        .unwrap();
    tools.iter().map(|t| t.name.to_string()).collect()
}

#[tokio::test]
async fn an_agent_discloses_commentary_that_observers_read_after_their_delay() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, _) = t.join(&red).await;
    let seat = hand_to_agent(&mut o, 1, "red-scout", false).await;
    let delay = 5000;
    let mut red_ob = observe(
        &t,
        &id,
        &op,
        json!({"kind": "team", "team": "red", "delayMs": delay}),
        "red",
    )
    .await;
    let mut blue_ob = observe(
        &t,
        &id,
        &op,
        json!({"kind": "team", "team": "blue", "delayMs": delay}),
        "blue",
    )
    .await;
    let mut all_ob = observe(
        &t,
        &id,
        &op,
        json!({"kind": "omniscient", "teams": ["red", "blue"], "delayMs": delay}),
        "omniscient",
    )
    .await;
    let (a, _, _, mut tools_changed) = connect_all(&t.mcp, &seat).await.unwrap();
    assert!(tool_names(&a).await.contains(&"disclose".to_owned()));

    // Strictly shaped: an unknown field or category is bad_message.
    let (err, d) = tool(
        &a,
        "disclose",
        json!({"category": "chat", "text": "x", "team": "blue"}),
    )
    .await;
    assert!(err);
    assert_eq!(
        (d["code"].as_str(), d["message"].as_str()),
        (Some("bad_message"), Some("team: unknown field of disclose"))
    );
    let (err, d) = tool(&a, "disclose", json!({"category": "log", "text": "x"})).await;
    assert!(err);
    assert_eq!(d["code"], "bad_message", "{d}");
    let (err, d) = tool(
        &a,
        "disclose",
        json!({"category": "chat", "text": "y".repeat(501)}),
    )
    .await;
    assert!(err);
    assert_eq!(d["code"], "bad_message", "{d}");

    // An owner's tell and the agent's reply stay private.
    o.expect_ok(json!({"op": "tell", "seq": 3, "roles": ["red-scout"], "text": "owner-secret"}))
        .await;
    let (err, _) = tool(&a, "tell", json!({"text": "agent-reply"})).await;
    assert!(!err);
    let (err, d) = tool(
        &a,
        "disclose",
        json!({"category": "chat", "text": "scouting east"}),
    )
    .await;
    assert!(!err, "{d}");
    assert_eq!(d, json!({"id": "c1", "tick": 0}));
    let (err, _) = tool(
        &a,
        "disclose",
        json!({"category": "summary", "text": "flag next"}),
    )
    .await;
    assert!(!err);
    let (err, d) = tool(
        &a,
        "disclose",
        json!({"category": "chat", "text": "a third"}),
    )
    .await;
    assert!(err);
    assert_eq!(d["code"], "rate_limited", "{d}");

    // Recorded with the tick at T0+1s: released at T0+6s, not before,
    // although the first frame (recorded at T0) goes at T0+5s.
    t.tick().await;
    t.advance(delay - 1000).await;
    for ob in [&mut red_ob, &mut blue_ob, &mut all_ob] {
        assert!(commentary(ob).await.is_empty());
    }
    t.advance(999).await;
    for ob in [&mut red_ob, &mut blue_ob, &mut all_ob] {
        assert!(commentary(ob).await.is_empty(), "released early");
    }
    t.advance(1).await;
    let red_seen = commentary(&mut red_ob).await;
    assert_eq!(red_seen.len(), 2, "{red_seen:?}");
    assert_eq!(
        red_seen[0],
        json!({"id": "c1", "team": "red", "role": "red-scout", "tick": 0, "category": "chat", "text": "scouting east"})
    );
    assert_eq!(red_seen[1]["category"], "summary");
    assert_eq!(commentary(&mut all_ob).await, red_seen);
    // A team grant never sees another team's commentary.
    assert!(commentary(&mut blue_ob).await.is_empty());

    // Handed back to a human: the session is told, disclose is gone and refused.
    o.expect_ok(
        json!({"op": "controller", "seq": 4, "role": "red-scout", "controller": {"kind": "human"}}),
    )
    .await;
    tokio::time::timeout(GUARD, tools_changed.recv())
        .await
        .expect("no tools/list_changed")
        .unwrap();
    assert!(!tool_names(&a).await.contains(&"disclose".to_owned()));
    let (err, d) = tool(
        &a,
        "disclose",
        json!({"category": "chat", "text": "still here?"}),
    )
    .await;
    assert!(err);
    assert_eq!(d["code"], "forbidden", "{d}");

    // Nothing private reached an observer, ever.
    t.advance(delay).await;
    for ob in [&mut red_ob, &mut blue_ob, &mut all_ob] {
        for f in ob.drain().await {
            let text = f.to_string();
            assert!(
                !text.contains("owner-secret") && !text.contains("agent-reply"),
                "{text}"
            );
        }
    }
    a.cancel().await.unwrap();
}

#[tokio::test]
async fn commentary_survives_a_restart_and_its_ids_never_repeat() {
    let mut t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let watcher = mint(
        &t.http,
        &id,
        &op,
        json!({"kind": "observer", "grant": {"kind": "omniscient", "teams": ["red", "blue"], "delayMs": 5000}}),
    )
    .await;
    let (mut o, _) = t.join(&red).await;
    let seat = hand_to_agent(&mut o, 1, "red-scout", false).await;
    let (a, _) = connect(&t.mcp, &seat).await.unwrap();
    let (err, d) = tool(
        &a,
        "disclose",
        json!({"category": "chat", "text": "in a frame"}),
    )
    .await;
    assert!(!err, "{d}");
    t.tick().await;
    // After the last recording: in no frame yet when the server stops.
    let (err, d) = tool(
        &a,
        "disclose",
        json!({"category": "summary", "text": "not yet"}),
    )
    .await;
    assert!(!err, "{d}");
    assert_eq!(d["id"], "c2");
    a.cancel().await.unwrap();
    drop(o);
    t.restart().await;

    // The first frame after the restart is a keyframe carrying both, at
    // its releaseAt and not before.
    let (mut ob, _) = t.join(&watcher).await;
    assert_eq!(ob.recv().await["state"], "buffering");
    ob.send(json!({"op": "observer", "perspective": "omniscient"}))
        .await;
    t.advance(4999).await;
    assert!(ob.drain().await.is_empty(), "released early");
    t.advance(1).await;
    let frames = ob.drain().await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    let f = &frames[0]["frame"];
    assert!(f.get("world").is_some(), "{f}");
    let texts: Vec<(&str, &str)> = f["commentary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap(), c["text"].as_str().unwrap()))
        .collect();
    assert_eq!(texts, [("c1", "in a frame"), ("c2", "not yet")]);

    // The seat token works again over MCP; a new id follows the stored ones.
    let (a, _) = connect(&t.mcp, &seat).await.unwrap();
    let (err, d) = tool(&a, "disclose", json!({"category": "chat", "text": "back"})).await;
    assert!(!err, "{d}");
    assert_eq!(d["id"], "c3");
    a.cancel().await.unwrap();
}

/// The `live` of `role` in a `seats` frame.
fn live_of(seats: &Value, role: &str) -> Option<bool> {
    seats["seats"]
        .as_array()?
        .iter()
        .find(|s| s["role"] == role)?["live"]
        .as_bool()
}

/// Counts the changes of `role`'s `live` in the `seats` frames waiting.
async fn live_changes(sp: &mut Client, role: &str, live: &mut bool) -> usize {
    let mut changes = 0;
    for v in sp.drain().await {
        if v["op"] != "seats" {
            continue;
        }
        if let Some(l) = live_of(&v, role) {
            if l != *live {
                changes += 1;
                *live = l;
            }
        }
    }
    changes
}

#[tokio::test]
async fn a_session_per_request_does_not_flip_the_seats_live() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, _) = t.join(&red).await;
    let seat = hand_to_agent(&mut o, 1, "red-guard", false).await;
    let spectator = mint(
        &t.http,
        &id,
        &op,
        json!({"kind": "spectator", "team": "red"}),
    )
    .await;
    let (mut sp, _) = t.join(&spectator).await;
    let mut live = false;
    live_changes(&mut sp, "red-guard", &mut live).await;

    // A client that opens a session for each request and ends it after.
    const REQUESTS: usize = 10;
    for _ in 0..REQUESTS {
        let (a, _) = connect(&t.mcp, &seat).await.unwrap();
        let (err, inbox) = tool(&a, "inbox", json!({})).await;
        assert!(!err, "{inbox}");
        a.cancel().await.unwrap();
    }
    let during = live_changes(&mut sp, "red-guard", &mut live).await;
    assert!(
        during <= 1 && live,
        "{during} live changes for {REQUESTS} sessions (live now {live})"
    );

    // Once the sessions are gone and the grace has passed, it is not live.
    let mut after = 0;
    for _ in 0..20 {
        t.advance(hostwire::playerthree::mcp::MCP_LIVE_GRACE_MS)
            .await;
        after += live_changes(&mut sp, "red-guard", &mut live).await;
        if !live {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!((after, live), (1, false));
}
