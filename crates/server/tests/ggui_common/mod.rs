//! A server with the ggui live channel on 127.0.0.1:0 (manual clock, real
//! SQLite file), an HTTP client for the agent API and a WebSocket client
//! that speaks the live channel.
#![allow(dead_code)]

use futures_util::{SinkExt, StreamExt};
use hostwire::app::App;
use hostwire::ggui::{GguiApp, GguiConfig};
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
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// A guard against a hung test, not a wait for time to pass.
/// The operator credential every test server is started with.
pub const OPERATOR: &str = "test-operator-credential-0123456789";
pub const GUARD: Duration = Duration::from_secs(10);
pub const T0: u64 = 1_800_000_000_000;
pub const VERSION: &str = "draft-2026-08-19";

pub fn relay_config() -> RelayConfig {
    RelayConfig {
        allowed_origins: AllowedOrigins::Any,
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

pub struct Server {
    pub app: Option<App>,
    pub clock: ManualClock,
    pub http: String,
    pub ws: String,
    pub db: PathBuf,
    /// The apps and their agent credentials the server was started with.
    pub apps: Vec<GguiApp>,
    /// The app each session was created for through [`Server::api`].
    pub owners: std::sync::Mutex<std::collections::HashMap<String, String>>,
    default_app: String,
    _dir: Option<tempfile::TempDir>,
}

/// The apps the tests use, each with its agent credential.
pub const TEST_APPS: [&str; 4] = ["conformance", "notes", "my-default", "other"];

/// The agent credential of a test app.
pub fn app_credential(app: &str) -> String {
    format!("{app}-agent-credential-0123456789")
}

impl Server {
    pub async fn start() -> Server {
        Self::with(GguiConfig::default()).await
    }

    pub async fn with(config: GguiConfig) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-test-ggui-")
            .tempdir()
            .unwrap();
        let mut s =
            Self::start_at(config, dir.path().join("hostwire.db"), ManualClock::new(T0)).await;
        s._dir = Some(dir);
        s
    }

    pub async fn start_at(mut config: GguiConfig, db: PathBuf, clock: ManualClock) -> Server {
        let store = Arc::new(SqliteStore::open(&db).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        if config.apps.is_empty() {
            config.apps = TEST_APPS
                .iter()
                .map(|a| GguiApp {
                    id: (*a).to_owned(),
                    credential: app_credential(a),
                })
                .collect();
        }
        let apps = config.apps.clone();
        let default_app = config.channel.default_app_id.clone();
        let app = App::start_with_ggui(
            listener,
            relay_config(),
            Arc::new(clock.clone()),
            Arc::clone(&store) as _,
            config,
            Some(store as _),
        )
        .unwrap();
        let addr = app.addr;
        Server {
            app: Some(app),
            clock,
            http: format!("http://{addr}"),
            ws: format!("ws://{addr}/ggui/ws"),
            db,
            apps,
            owners: Default::default(),
            default_app,
            _dir: None,
        }
    }

    /// The data directory, to keep across a restart on the same file.
    pub fn take_dir(&mut self) -> Option<tempfile::TempDir> {
        self._dir.take()
    }

    pub fn keep_dir(&mut self, dir: Option<tempfile::TempDir>) {
        self._dir = dir;
    }

    pub async fn stop(&mut self) {
        if let Some(a) = self.app.take() {
            a.shutdown().await;
        }
    }

    /// The live channel's URL with a UI token of `session` (created
    /// through the agent API first when it does not exist).
    pub async fn ui_url(&self, session: &str) -> String {
        let (status, v) = self.api("PUT", session, None).await;
        assert!(status == 200 || status == 201, "{status} {v}");
        let (status, v) = self
            .api("POST", &format!("{session}/ui-tokens"), None)
            .await;
        assert_eq!(status, 201, "{v}");
        format!("{}?token={}", self.ws, v["token"].as_str().unwrap())
    }

    /// A socket admitted with a UI token of `session`.
    pub async fn client_for(&self, session: &str) -> Client {
        Client::connect(&self.ui_url(session).await, None)
            .await
            .unwrap()
    }

    /// A client subscribed to `session` (app `conformance`); returns the ack.
    pub async fn subscribed(&self, session: &str) -> (Client, Value) {
        let mut c = self.client_for(session).await;
        c.send(json!({"type": "subscribe", "payload": {"sessionId": session}, "requestId": "sub"}))
            .await;
        let ack = c.recv().await;
        assert_eq!(ack["type"], "ack", "{ack}");
        (c, ack)
    }

    /// An agent API call as the app that owns the session of `path` (the
    /// app named by the body's `appId` when it creates one, else the
    /// default app).
    pub async fn api(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let session = path.split('/').next().unwrap_or_default().to_owned();
        let named = body
            .as_ref()
            .and_then(|b| b.get("appId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let app = {
            let mut owners = self.owners.lock().unwrap();
            match named {
                Some(a) => {
                    owners.entry(session).or_insert_with(|| a.clone());
                    a
                }
                None => owners
                    .get(&session)
                    .cloned()
                    .unwrap_or_else(|| self.default_app.clone()),
            }
        };
        let credential = self
            .apps
            .iter()
            .find(|a| a.id == app)
            .map(|a| a.credential.clone());
        self.api_as(credential.as_deref(), method, path, body).await
    }

    /// An agent API call with `credential` (none: anonymous).
    pub async fn api_as(
        &self,
        credential: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}/ggui/sessions/{path}", self.http);
        let c = reqwest::Client::new();
        let mut r = match method {
            "GET" => c.get(url),
            "PUT" => c.put(url),
            "POST" => c.post(url),
            "DELETE" => c.delete(url),
            _ => unreachable!(),
        };
        if let Some(t) = credential {
            r = r.header("Authorization", format!("Bearer {t}"));
        }
        if let Some(b) = body {
            r = r
                .header("Content-Type", "application/json")
                .body(b.to_string());
        }
        let r = tokio::time::timeout(Duration::from_secs(30), r.send())
            .await
            .expect("API call hung")
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn create(&self, id: &str, body: Value) -> Value {
        let (status, v) = self.api("PUT", id, Some(body)).await;
        assert!(status == 201 || status == 200, "{status} {v}");
        v
    }

    pub async fn emit(&self, id: &str, channel: &str, payload: Value) -> Value {
        let (status, v) = self
            .api(
                "POST",
                &format!("{id}/emit"),
                Some(json!({"channel": channel, "payload": payload})),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        v
    }

    pub async fn metric(&self, name: &str) -> u64 {
        let text = reqwest::get(format!("{}/metrics", self.http))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no metric {name}"))
            .trim()
            .parse()
            .unwrap()
    }
}

pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    Closed(u16),
    Dropped,
}

impl Client {
    pub async fn connect(
        url: &str,
        bearer: Option<&str>,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        let mut req = url.into_client_request().unwrap();
        if let Some(t) = bearer {
            req.headers_mut()
                .insert("Authorization", format!("Bearer {t}").parse().unwrap());
        }
        // Nagle off, as the server has it: on tokio's paused clock a small
        // frame held for an ACK would look like one that never came.
        let (ws, _) = tokio_tungstenite::connect_async_with_config(req, None, true).await?;
        Ok(Client { ws })
    }

    /// An upgrade that carries `Origin: origin`, as a browser's does.
    pub async fn connect_from(
        url: &str,
        origin: &str,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        let mut req = url.into_client_request().unwrap();
        req.headers_mut().insert("Origin", origin.parse().unwrap());
        // Nagle off, as the server has it: on tokio's paused clock a small
        // frame held for an ACK would look like one that never came.
        let (ws, _) = tokio_tungstenite::connect_async_with_config(req, None, true).await?;
        Ok(Client { ws })
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
        tcp.set_nodelay(true).unwrap();
        let req = url.into_client_request().unwrap();
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

    /// The next text frame, as sent.
    pub async fn recv_text(&mut self) -> String {
        loop {
            let m = tokio::time::timeout(GUARD, self.ws.next())
                .await
                .expect("no frame arrived")
                .expect("stream ended")
                .unwrap();
            match m {
                Message::Text(t) => return t.to_string(),
                Message::Close(c) => panic!("closed: {c:?}"),
                _ => continue,
            }
        }
    }

    pub async fn recv(&mut self) -> Value {
        serde_json::from_str(&self.recv_text().await).unwrap()
    }

    /// Frames until the next pong: what arrived before it, and proof that
    /// nothing else did.
    pub async fn until_pong(&mut self) -> Vec<Value> {
        self.send(json!({"type": "ping"})).await;
        let mut seen = Vec::new();
        loop {
            let v = self.recv().await;
            if v["type"] == "pong" {
                return seen;
            }
            seen.push(v);
        }
    }

    pub async fn expect_error(&mut self, code: &str) -> Value {
        let v = self.recv().await;
        assert_eq!(
            (v["type"].as_str(), v["payload"]["code"].as_str()),
            (Some("error"), Some(code)),
            "{v}"
        );
        v
    }

    pub async fn ended(&mut self) -> Ended {
        loop {
            match tokio::time::timeout(GUARD, self.ws.next())
                .await
                .expect("connection did not end")
            {
                None | Some(Err(_)) => return Ended::Dropped,
                Some(Ok(Message::Close(Some(f)))) => return Ended::Closed(u16::from(f.code)),
                Some(Ok(Message::Close(None))) => return Ended::Closed(1005),
                Some(Ok(_)) => continue,
            }
        }
    }
}

/// `{type:'action'}` submitting `action` with `data` on `session`.
pub fn action(session: &str, name: &str, data: Value, request_id: &str) -> Value {
    json!({"type": "action", "requestId": request_id, "payload": {
        "sessionId": session, "type": "data:submit", "payload": {"action": name, "data": data}}})
}
