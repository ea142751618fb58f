//! A relay on 127.0.0.1:0 with a manual clock and a real SQLite file, and
//! a WebSocket client that speaks relay protocol 1.
#![allow(dead_code)]

use futures_util::{SinkExt, StreamExt};
use hostwire::app::App;
use hostwire::http::AllowedOrigins;
use hostwire::memizy::{RelayConfig, OUTBOUND_QUEUE};
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

pub fn config() -> RelayConfig {
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

/// A fresh directory for one test's data, removed when dropped.
pub fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("hostwire-test-{name}-"))
        .tempdir()
        .unwrap()
}

pub struct TestRelay {
    pub server: Option<App>,
    pub clock: ManualClock,
    pub http: String,
    pub ws: String,
    pub db: PathBuf,
    /// The data directory this relay made for itself (none when it was
    /// given a database, as on a restart).
    dir: Option<tempfile::TempDir>,
}

impl TestRelay {
    pub async fn start(config: RelayConfig) -> TestRelay {
        let dir = temp_dir("relay");
        let mut t =
            Self::start_at(config, dir.path().join("hostwire.db"), ManualClock::new(T0)).await;
        t.dir = Some(dir);
        t
    }

    pub async fn start_at(config: RelayConfig, db: PathBuf, clock: ManualClock) -> TestRelay {
        let store = Arc::new(SqliteStore::open(&db).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = App::start(listener, config, Arc::new(clock.clone()), store).unwrap();
        let addr = server.addr;
        TestRelay {
            server: Some(server),
            clock,
            http: format!("http://{addr}"),
            ws: format!("ws://{addr}/ws"),
            db,
            dir: None,
        }
    }

    pub fn relay(&self) -> &hostwire::memizy::Relay {
        &self.server.as_ref().unwrap().relay
    }

    pub async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }

    pub async fn create_room(&self) -> (String, String) {
        let r = reqwest::Client::new()
            .post(format!("{}/api/rooms", self.http))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let v: Value = r.json().await.unwrap();
        (
            v["pin"].as_str().unwrap().to_owned(),
            v["hostToken"].as_str().unwrap().to_owned(),
        )
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.ws, Some(ORIGIN)).await.unwrap()
    }

    /// A host attached to a new room.
    pub async fn host(&self) -> (Client, String, String) {
        let (pin, token) = self.create_room().await;
        let mut h = self.client().await;
        h.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token}))
            .await;
        let v = h.recv().await;
        assert_eq!(v["t"], "hosting", "{v}");
        (h, pin, token)
    }

    /// A player joined to `pin`; returns (client, playerId, token).
    pub async fn player(&self, pin: &str, name: &str) -> (Client, String, String) {
        let mut p = self.client().await;
        p.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": name}))
            .await;
        let v = p.recv().await;
        assert_eq!(v["t"], "joined", "{v}");
        (
            p,
            v["playerId"].as_str().unwrap().to_owned(),
            v["token"].as_str().unwrap().to_owned(),
        )
    }
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
    pub async fn connect(
        url: &str,
        origin: Option<&str>,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        let mut req = url.into_client_request().unwrap();
        if let Some(o) = origin {
            req.headers_mut().insert("Origin", o.parse().unwrap());
        }
        let (ws, _) = tokio_tungstenite::connect_async(req).await?;
        Ok(Client { ws })
    }

    /// A client whose socket receives into at most `bytes` of kernel
    /// buffer, so that a big frame cannot be written to it in one go.
    pub async fn connect_with_receive_buffer(url: &str, origin: &str, bytes: u32) -> Client {
        let addr: std::net::SocketAddr = url
            .trim_start_matches("ws://")
            .trim_end_matches("/ws")
            .parse()
            .unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        let tcp = socket.connect(addr).await.unwrap();
        let mut req = url.into_client_request().unwrap();
        req.headers_mut().insert("Origin", origin.parse().unwrap());
        let (ws, _) = tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(tcp))
            .await
            .unwrap();
        Client { ws }
    }

    pub async fn send(&mut self, v: Value) {
        self.ws
            .send(Message::Text(v.to_string().into()))
            .await
            .unwrap();
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

    /// Frames until the next pong: proves what arrived before it (and that
    /// nothing else did).
    pub async fn until_pong(&mut self) -> Vec<Value> {
        self.send(json!({"t": "ping"})).await;
        let mut seen = Vec::new();
        loop {
            let v = self.recv().await;
            if v["t"] == "pong" {
                return seen;
            }
            seen.push(v);
        }
    }

    pub async fn expect_error(&mut self, code: &str, fatal: bool) -> Value {
        let v = self.recv().await;
        assert_eq!(
            (v["t"].as_str(), v["code"].as_str(), v["fatal"].as_bool()),
            (Some("error"), Some(code), Some(fatal)),
            "{v}"
        );
        v
    }
}
