//! A server with the ggui live channel (its sessions kept in the store),
//! the agent API over HTTP and the live channel's frames.

use super::server::{relay_config, Data, Spawn};
pub use super::server::{GUARD, OPERATOR, T0};
pub use super::ws::{advance_seconds, Client, Ended};
use hostwire::app::App;
use hostwire::ggui::{GguiApp, GguiConfig};
use hostwire::http::AllowedOrigins;
use hostwire_core::ManualClock;
use serde_json::{json, Value};
use std::path::PathBuf;

pub const VERSION: &str = "draft-2026-08-19";

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
    data: Data,
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
        let mut data = Data::new("ggui");
        let mut s = Self::start_at(config, data.db.clone(), ManualClock::new(T0)).await;
        s.keep_dir(data.take_dir());
        s
    }

    pub async fn start_at(mut config: GguiConfig, db: PathBuf, clock: ManualClock) -> Server {
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
        let app = Spawn {
            ggui: config,
            ggui_durable: true,
            // Every origin allowed: the live channel's clients here send none.
            ..Spawn::new(relay_config(AllowedOrigins::Any))
        }
        .start_at(&db, &clock)
        .await;
        let addr = app.addr;
        Server {
            app: Some(app),
            clock,
            http: format!("http://{addr}"),
            ws: format!("ws://{addr}/ggui/ws"),
            db: db.clone(),
            apps,
            owners: Default::default(),
            default_app,
            data: Data::at(db),
        }
    }

    /// The data directory, to keep across a restart on the same file.
    pub fn take_dir(&mut self) -> Option<tempfile::TempDir> {
        self.data.take_dir()
    }

    pub fn keep_dir(&mut self, dir: Option<tempfile::TempDir>) {
        self.data.keep_dir(dir);
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
        super::http::call(method, &url, credential, body.as_ref()).await
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
        super::http::metric(&self.http, name).await
    }
}

/// The live channel's frames on the one client.
#[allow(async_fn_in_trait)]
pub trait GguiFrames {
    /// Frames until the next pong: what arrived before it, and proof that
    /// nothing else did.
    async fn until_pong(&mut self) -> Vec<Value>;
    async fn expect_error(&mut self, code: &str) -> Value;
}

impl GguiFrames for Client {
    async fn until_pong(&mut self) -> Vec<Value> {
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

    async fn expect_error(&mut self, code: &str) -> Value {
        let v = self.recv().await;
        assert_eq!(
            (v["type"].as_str(), v["payload"]["code"].as_str()),
            (Some("error"), Some(code)),
            "{v}"
        );
        v
    }
}

/// `{type:'action'}` submitting `action` with `data` on `session`.
pub fn action(session: &str, name: &str, data: Value, request_id: &str) -> Value {
    json!({"type": "action", "requestId": request_id, "payload": {
        "sessionId": session, "type": "data:submit", "payload": {"action": name, "data": data}}})
}
