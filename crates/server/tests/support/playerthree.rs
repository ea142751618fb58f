//! A PlayerThree server (its matches kept in the store, a tick of
//! [`TICK_MS`]), the operator's HTTP API and PlayerThree's frames.

use super::server::{Data, Spawn};
pub use super::server::{GUARD, OPERATOR, ORIGIN, T0};
pub use super::ws::{Client, Ended};
use hostwire::app::App;
use hostwire::http::AllowedOrigins;
use hostwire::playerthree::{PlayerThree, PlayerThreeConfig};
use hostwire::relay::RelayConfig;
use hostwire_core::ManualClock;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;

pub const TICK_MS: u64 = 1000;

/// Browsers from [`ORIGIN`] only.
pub fn relay_config() -> RelayConfig {
    super::server::relay_config(AllowedOrigins::List(vec![ORIGIN.to_owned()]))
}

pub fn p3_config() -> PlayerThreeConfig {
    let mut c = PlayerThreeConfig::new(AllowedOrigins::List(vec![ORIGIN.to_owned()]));
    c.tick_ms = TICK_MS;
    c
}

pub struct TestServer {
    pub server: Option<App>,
    pub clock: ManualClock,
    pub http: String,
    pub ws: String,
    pub mcp: String,
    pub db: PathBuf,
    config: PlayerThreeConfig,
    _data: Data,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(p3_config()).await
    }

    pub async fn start_with(config: PlayerThreeConfig) -> TestServer {
        let data = Data::new("playerthree");
        let mut t = TestServer {
            server: None,
            clock: ManualClock::new(T0),
            http: String::new(),
            ws: String::new(),
            mcp: String::new(),
            db: data.db.clone(),
            config,
            _data: data,
        };
        t.open().await;
        t
    }

    /// Starts a server on the database file (restoring what it holds).
    async fn open(&mut self) {
        let server = Spawn {
            playerthree: Some(self.config.clone()),
            ..Spawn::new(relay_config())
        }
        .start_at(&self.db, &self.clock)
        .await;
        let addr = server.addr;
        self.http = format!("http://{addr}");
        self.ws = format!("ws://{addr}/playerthree/ws");
        self.mcp = format!("http://{addr}/playerthree/mcp");
        self.server = Some(server);
    }

    /// Stops the server gracefully (its records flushed) and starts
    /// another on the same file and clock, at a new address.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.open().await;
    }

    pub fn p3(&self) -> &Arc<PlayerThree> {
        &self.server.as_ref().unwrap().playerthree
    }

    /// Moves the clock and lets every match do what is due.
    pub async fn advance(&self, ms: u64) {
        self.clock.advance_ms(ms);
        self.p3().wake().await;
    }

    /// One tick of every match.
    pub async fn tick(&self) {
        self.advance(TICK_MS).await;
    }

    pub async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.ws, Some(ORIGIN)).await.unwrap()
    }

    /// A client joined with `token`, after its join answer.
    pub async fn join(&self, token: &str) -> (Client, Value) {
        let mut c = self.client().await;
        c.send(json!({"op": "join", "token": token})).await;
        let v = c.recv().await;
        (c, v)
    }
}

/// A match created over HTTP: (match id, operator token).
pub async fn create_match(http: &str) -> (String, String) {
    let url = format!("{http}/playerthree/matches");
    let (status, v) = super::http::call("POST", &url, Some(OPERATOR), None).await;
    assert_eq!(status, 201, "{v}");
    (
        v["match"].as_str().unwrap().to_owned(),
        v["operatorToken"].as_str().unwrap().to_owned(),
    )
}

/// Mints a token for `principal` (without its match) over HTTP.
pub async fn mint(http: &str, id: &str, operator: &str, principal: Value) -> String {
    let (status, v) = mint_raw(http, id, operator, principal).await;
    assert_eq!(status, 201, "{v}");
    v["token"].as_str().unwrap().to_owned()
}

pub async fn mint_raw(http: &str, id: &str, operator: &str, principal: Value) -> (u16, Value) {
    let url = format!("{http}/playerthree/matches/{id}/tokens");
    super::http::call("POST", &url, Some(operator), Some(&principal)).await
}

pub async fn revoke(http: &str, id: &str, operator: &str, token: &str) -> u16 {
    let url = format!("{http}/playerthree/matches/{id}/revoke");
    let body = json!({ "token": token });
    super::http::call("POST", &url, Some(operator), Some(&body))
        .await
        .0
}

/// PlayerThree's frames on the one client.
#[allow(async_fn_in_trait)]
pub trait PlayerThreeFrames {
    /// The next frame with this `op` (others skipped).
    async fn recv_op(&mut self, op: &str) -> Value;
    /// The `result` of `seq` (other frames skipped).
    async fn result(&mut self, seq: u64) -> Value;
    /// Sends a client op and returns its result.
    async fn call(&mut self, msg: Value) -> Value;
    /// Sends and expects an error result with `code`.
    async fn expect_error(&mut self, msg: Value, code: &str) -> Value;
    /// Sends and expects an ok result; returns its data.
    async fn expect_ok(&mut self, msg: Value) -> Value;
    /// Frames that arrive before the next answer to a probe: a malformed
    /// message answered `bad_message` with seq 0 proves what came before
    /// it, and that nothing else did.
    async fn drain(&mut self) -> Vec<Value>;
}

impl PlayerThreeFrames for Client {
    async fn recv_op(&mut self, op: &str) -> Value {
        loop {
            let v = self.recv().await;
            if v["op"] == op {
                return v;
            }
        }
    }

    async fn result(&mut self, seq: u64) -> Value {
        loop {
            let v = self.recv().await;
            if v["op"] == "result" && v["seq"] == seq {
                return v;
            }
        }
    }

    async fn call(&mut self, msg: Value) -> Value {
        let seq = msg["seq"].as_u64().unwrap();
        self.send(msg).await;
        self.result(seq).await
    }

    async fn expect_error(&mut self, msg: Value, code: &str) -> Value {
        let r = self.call(msg).await;
        assert_eq!(
            (r["ok"].as_bool(), r["code"].as_str()),
            (Some(false), Some(code)),
            "{r}"
        );
        r
    }

    async fn expect_ok(&mut self, msg: Value) -> Value {
        let r = self.call(msg).await;
        assert_eq!(r["ok"], true, "{r}");
        r["data"].clone()
    }

    async fn drain(&mut self) -> Vec<Value> {
        self.send_text("{}").await;
        let mut seen = Vec::new();
        loop {
            let v = self.recv().await;
            if v["op"] == "result" && v["code"] == "bad_message" && v["message"] == "op: missing" {
                return seen;
            }
            seen.push(v);
        }
    }
}
