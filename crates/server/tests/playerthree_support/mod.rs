//! A server on 127.0.0.1:0 with a manual clock and a real SQLite file, the
//! operator's HTTP API, and a WebSocket client that speaks PlayerThree.
#![allow(dead_code)]

use futures_util::{SinkExt, StreamExt};
use hostwire::app::App;
use hostwire::ggui::GguiConfig;
use hostwire::http::AllowedOrigins;
use hostwire::memizy::{RelayConfig, OUTBOUND_QUEUE};
use hostwire::playerthree::{PlayerThree, PlayerThreeConfig};
use hostwire_core::ManualClock;
use hostwire_memizy::RELAY_LIMITS;
use hostwire_store::SqliteStore;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The operator credential every test server is started with.
pub const OPERATOR: &str = "test-operator-credential-0123456789";
pub const ORIGIN: &str = "https://play.example.org";
/// A guard against a hung test, not a wait for time to pass.
pub const GUARD: Duration = Duration::from_secs(10);
pub const T0: u64 = 1_800_000_000_000;
pub const TICK_MS: u64 = 1000;

pub fn relay_config() -> RelayConfig {
    RelayConfig {
        allowed_origins: AllowedOrigins::List(vec![ORIGIN.to_owned()]),
        trust_proxy: false,
        rooms_per_ip_per_hour: RELAY_LIMITS.rooms_per_ip_per_hour,
        limits: RELAY_LIMITS,
        outbound_queue: OUTBOUND_QUEUE,
        credentials: hostwire::http::CredentialSettings {
            operator_token: Some(OPERATOR.to_owned()),
            ..Default::default()
        },
    }
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
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(p3_config()).await
    }

    pub async fn start_with(config: PlayerThreeConfig) -> TestServer {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-test-playerthree-")
            .tempdir()
            .unwrap();
        let db = dir.path().join("hostwire.db");
        let clock = ManualClock::new(T0);
        let mut t = TestServer {
            server: None,
            clock,
            http: String::new(),
            ws: String::new(),
            mcp: String::new(),
            db,
            config,
            _dir: dir,
        };
        t.open().await;
        t
    }

    /// Starts a server on the database file (restoring what it holds).
    async fn open(&mut self) {
        let store = Arc::new(SqliteStore::open(&self.db).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = App::start_all(
            listener,
            relay_config(),
            Arc::new(self.clock.clone()),
            Arc::clone(&store) as _,
            GguiConfig::default(),
            None,
            self.config.clone(),
            store,
        )
        .unwrap();
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
        Client::connect(&self.ws).await
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
    let r = reqwest::Client::new()
        .post(format!("{http}/playerthree/matches"))
        .header("Authorization", format!("Bearer {OPERATOR}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
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
    let r = reqwest::Client::new()
        .post(format!("{http}/playerthree/matches/{id}/tokens"))
        .header("Authorization", format!("Bearer {operator}"))
        .body(principal.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

pub async fn revoke(http: &str, id: &str, operator: &str, token: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{http}/playerthree/matches/{id}/revoke"))
        .header("Authorization", format!("Bearer {operator}"))
        .body(json!({ "token": token }).to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

/// How a connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    Closed(u16),
    Dropped,
}

impl Client {
    pub async fn connect(url: &str) -> Client {
        let mut req = url.into_client_request().unwrap();
        req.headers_mut().insert("Origin", ORIGIN.parse().unwrap());
        let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        Client { ws }
    }

    /// A client whose socket receives into at most `bytes` of kernel buffer.
    pub async fn connect_with_receive_buffer(url: &str, bytes: u32) -> Client {
        let addr: std::net::SocketAddr = url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        let tcp = socket.connect(addr).await.unwrap();
        let mut req = url.into_client_request().unwrap();
        req.headers_mut().insert("Origin", ORIGIN.parse().unwrap());
        let (ws, _) = tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(tcp))
            .await
            .unwrap();
        Client { ws }
    }

    pub async fn send(&mut self, v: Value) {
        self.send_text(&v.to_string()).await;
    }

    pub async fn send_text(&mut self, t: &str) {
        self.ws
            .send(Message::Text(t.to_owned().into()))
            .await
            .unwrap();
    }

    /// The next JSON frame (pings and pongs skipped).
    pub async fn recv(&mut self) -> Value {
        loop {
            let m = tokio::time::timeout(GUARD, self.ws.next())
                .await
                .expect("no frame arrived")
                .expect("stream ended")
                .unwrap();
            match m {
                Message::Text(t) => return serde_json::from_str(&t).unwrap(),
                Message::Close(c) => panic!("closed: {c:?}"),
                _ => continue,
            }
        }
    }

    /// The next frame with this `op` (others skipped).
    pub async fn recv_op(&mut self, op: &str) -> Value {
        loop {
            let v = self.recv().await;
            if v["op"] == op {
                return v;
            }
        }
    }

    /// The `result` of `seq` (other frames skipped).
    pub async fn result(&mut self, seq: u64) -> Value {
        loop {
            let v = self.recv().await;
            if v["op"] == "result" && v["seq"] == seq {
                return v;
            }
        }
    }

    /// Sends a client op and returns its result.
    pub async fn call(&mut self, msg: Value) -> Value {
        let seq = msg["seq"].as_u64().unwrap();
        self.send(msg).await;
        self.result(seq).await
    }

    /// Sends and expects an error result with `code`.
    pub async fn expect_error(&mut self, msg: Value, code: &str) -> Value {
        let r = self.call(msg).await;
        assert_eq!(
            (r["ok"].as_bool(), r["code"].as_str()),
            (Some(false), Some(code)),
            "{r}"
        );
        r
    }

    /// Sends and expects an ok result; returns its data.
    pub async fn expect_ok(&mut self, msg: Value) -> Value {
        let r = self.call(msg).await;
        assert_eq!(r["ok"], true, "{r}");
        r["data"].clone()
    }

    /// Reads until the connection ends; returns the close code.
    pub async fn ended(&mut self) -> Ended {
        loop {
            match tokio::time::timeout(GUARD, self.ws.next())
                .await
                .expect("connection did not end")
            {
                None | Some(Err(_)) => return Ended::Dropped,
                Some(Ok(Message::Close(Some(f)))) => return Ended::Closed(u16::from(f.code)),
                Some(Ok(Message::Close(None))) => {
                    return Ended::Closed(u16::from(CloseCode::Status))
                }
                Some(Ok(_)) => continue,
            }
        }
    }

    /// Frames that arrive before the next answer to a probe: a malformed
    /// message answered `bad_message` with seq 0 proves what came before
    /// it, and that nothing else did.
    pub async fn drain(&mut self) -> Vec<Value> {
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
