//! A server with hosted sessions (kept in its SQLite store) and a quiz
//! plugin's bundle, the session API over HTTP, and devices.

use super::server::{Data, Spawn};
pub use super::server::{GUARD, OPERATOR, T0};
use hostwire::app::App;
use hostwire::http::AllowedOrigins;
use hostwire::relay::RelayConfig;
use hostwire::sessions::play::PluginSdk;
use hostwire_core::ManualClock;
use hostwire_store::SqliteStore;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The agent credential of the ggui app `conformance` on a test server.
pub const GGUI_AGENT: &str = "conformance-agent-credential-0123456789";
pub use hostwire::sessions::device::Device;
pub use hostwire::sessions::services::ServiceCommand;

pub const PLUGIN_ID: &str = "https://example.com/plugins/quiz-race";

pub fn manifest() -> Value {
    json!({
        "version": "1.0",
        "id": PLUGIN_ID,
        "appName": "Quiz Race",
        "pluginVersion": "1.0.0",
        "capabilities": {"actions": ["render"], "types": ["mcq-single", "true-false"]},
        "appSpecific": {"memizy": {
            "protocol": "1.0",
            "modes": {
                "solo": {},
                "multiplayer": {"players": {"min": 1, "max": 40}, "hostAs": ["presenter", "player"], "lateJoin": true}
            },
            "settings": [
                {"id": "questionTime", "type": "number", "label": "Time", "default": 20, "min": 5, "max": 120}
            ],
            "services": ["answers.check", "test.hang", "test.exit", "test.big", "ai.chat"]
        }}
    })
}

pub fn plugin_html() -> String {
    format!(
        "<!doctype html><html><head><script type=\"application/oqse-manifest+json\">{}</script></head><body></body></html>",
        manifest()
    )
}

pub fn quiz_set() -> Value {
    json!({
        "meta": {"id": "set-1", "title": "Planets"},
        "items": [
            {"id": "q1", "type": "mcq-single", "question": "Largest planet?",
             "options": [{"id": "j", "text": "Jupiter"}, {"id": "m", "text": "Mars"}],
             "correctId": "j"},
            {"id": "q2", "type": "true-false", "question": "Sound is faster than light.", "correctAnswer": false}
        ]
    })
}

pub fn player_ids(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("p{i}")).collect()
}

/// A presenter session of `n` players, created and not started.
pub fn presenter_body(n: usize) -> Value {
    let players: Vec<Value> = player_ids(n)
        .iter()
        .map(|id| json!({"id": id, "name": format!("Player {id}")}))
        .collect();
    json!({
        "pluginHtml": plugin_html(),
        "set": quiz_set(),
        "mode": "multiplayer",
        "hostAs": "presenter",
        "players": players,
        "timing": {"countdownMs": 0, "finishedCloseMs": 1000}
    })
}

pub struct TestHost {
    pub server: Option<App>,
    pub clock: ManualClock,
    pub http: String,
    pub ws: String,
    pub db: PathBuf,
    pub store: Arc<SqliteStore>,
    _dir: Option<tempfile::TempDir>,
}

/// Every origin allowed: devices here send none.
pub fn relay_config() -> RelayConfig {
    super::server::relay_config(AllowedOrigins::Any)
}

/// The built-in answer checker, as this build has it.
pub fn answer_checker() -> ServiceCommand {
    ServiceCommand::parse(&format!(
        "answers.check={}",
        env!("CARGO_BIN_EXE_hostwire-answer-checker")
    ))
    .unwrap()
}

/// A service whose worker runs `script` with `sh -c`.
pub fn sh_service(name: &str, script: &str) -> ServiceCommand {
    ServiceCommand {
        name: name.to_owned(),
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
    }
}

/// ggui with one app, `conformance`, with a known agent credential.
pub fn ggui_config() -> hostwire::ggui::GguiConfig {
    hostwire::ggui::GguiConfig {
        apps: vec![hostwire::ggui::GguiApp {
            id: "conformance".into(),
            credential: GGUI_AGENT.into(),
        }],
        ..Default::default()
    }
}

impl TestHost {
    pub async fn start() -> TestHost {
        Self::start_with_sdk(None).await
    }

    /// [`TestHost::start`] serving this plugin SDK (`--plugin-sdk`).
    pub async fn start_with_sdk(plugin_sdk: Option<PluginSdk>) -> TestHost {
        let mut data = Data::new("session");
        let db = data.db.clone();
        let store = Arc::new(SqliteStore::open(&db).unwrap());
        let clock = ManualClock::new(T0);
        let server = Spawn {
            ggui: ggui_config(),
            sessions_durable: true,
            plugin_sdk,
            ..Spawn::new(relay_config())
        }
        .start(Arc::clone(&store), &clock)
        .await;
        let addr = server.addr;
        TestHost {
            server: Some(server),
            clock,
            http: format!("http://{addr}"),
            ws: format!("ws://{addr}"),
            db,
            store,
            _dir: data.take_dir(),
        }
    }
}

/// The tokens of one session the API answered.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    pub host: String,
    pub players: HashMap<String, String>,
}

/// A server's address and the session API over HTTP; it keeps the tokens
/// the API answers, and devices attach with them.
pub struct Api {
    pub http: String,
    pub ws: String,
    pub tokens: Mutex<HashMap<String, Tokens>>,
}

impl Api {
    pub fn of(h: &TestHost) -> Api {
        Api {
            http: h.http.clone(),
            ws: h.ws.clone(),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// Creates a session: (session id, host token).
    pub async fn create(&self, body: &Value) -> (String, String) {
        let (status, v) = self
            .request("POST", "/memizy/sessions", None, Some(body))
            .await;
        assert_eq!(status, 201, "{v}");
        let sid = v["sessionId"].as_str().unwrap().to_owned();
        let host = v["hostToken"].as_str().unwrap().to_owned();
        self.remember(&sid, Some(&host), &v);
        (sid, host)
    }

    fn remember(&self, sid: &str, host: Option<&str>, v: &Value) {
        let mut all = self.tokens.lock().unwrap();
        let t = all.entry(sid.to_owned()).or_default();
        if let Some(h) = host {
            t.host = h.to_owned();
        }
        if let Some(m) = v["playerTokens"].as_object() {
            for (p, tok) in m {
                t.players
                    .insert(p.clone(), tok.as_str().unwrap_or_default().to_owned());
            }
        }
        if let (Some(p), Some(tok)) = (v["playerId"].as_str(), v["playerToken"].as_str()) {
            t.players.insert(p.to_owned(), tok.to_owned());
        }
    }

    /// The token a device presents for `view` at `address`.
    pub fn token_for(&self, sid: &str, view: &str, address: &str) -> String {
        let all = self.tokens.lock().unwrap();
        let t = all.get(sid).cloned().unwrap_or_default();
        match view {
            "board" | "settings" => t.host,
            _ => t.players.get(address).cloned().unwrap_or_default(),
        }
    }

    pub async fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        // Creating a session needs the operator credential.
        let token = token.or((method == "POST" && path == "/memizy/sessions").then_some(OPERATOR));
        let (status, v) =
            super::http::call(method, &format!("{}{path}", self.http), token, body).await;
        // The host token of a session and the tokens its answers carry.
        if let Some(sid) = path
            .strip_prefix("/memizy/sessions/")
            .and_then(|p| p.split('/').next())
        {
            if status == 200 {
                self.remember(sid, token, &v);
            }
        }
        (status, v)
    }

    pub async fn op(&self, sid: &str, token: &str, op: &str) -> (u16, Value) {
        self.request(
            "POST",
            &format!("/memizy/sessions/{sid}/{op}"),
            Some(token),
            None,
        )
        .await
    }

    pub async fn status(&self, sid: &str, token: &str) -> Value {
        let (s, v) = self
            .request("GET", &format!("/memizy/sessions/{sid}"), Some(token), None)
            .await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// A device attached with its token, before `hello`.
    pub async fn connect(&self, sid: &str, view: &str, address: &str) -> Device {
        let token = self.token_for(sid, view, address);
        Device::connect(&self.ws, sid, view, address, &token)
            .await
            .unwrap()
    }

    /// A device attached, `hello` said: (device, InitPayload).
    pub async fn device(&self, sid: &str, view: &str, address: &str) -> (Device, Value) {
        let d = self.connect(sid, view, address).await;
        let init = d.hello(PLUGIN_ID).await.unwrap();
        (d, init)
    }
}

pub fn send_args(to: Value, data: Value) -> Value {
    json!([{"to": to, "data": data}])
}
