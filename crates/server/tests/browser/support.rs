//! A server on 127.0.0.1 port 0 with its SQLite store in a temporary
//! directory, the session API over HTTP, and Chromium driven over
//! WebDriver (Debian's `chromium` and `chromium-driver`): one browser per
//! device, so no device is a throttled background tab of another.
#![allow(dead_code)]

use base64::Engine;
use fantoccini::{Client, ClientBuilder, Locator};
use hostwire::app::{App, AppConfig, Stores};
use hostwire::http::AllowedOrigins;
use hostwire::relay::{RelayConfig, OUTBOUND_QUEUE, SERVER_LIMITS};
use hostwire_core::{Clock, SystemClock};
use hostwire_memizy::RELAY_LIMITS;
use hostwire_store::SqliteStore;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// The operator credential the test server is started with.
pub const OPERATOR: &str = "browser-test-operator-credential-0123";
/// A guard against a hung browser or page, not a wait for time to pass:
/// every wait ends as soon as its condition holds.
pub const GUARD: Duration = Duration::from_secs(40);
/// The test plugins (our own, SPEC 1.0, Penpal 7.0.6).
pub const QUIZ_HTML: &str = include_str!("quiz.html");
pub const HOSTILE_HTML: &str = include_str!("hostile.html");
/// A stand-in for the plugin SDK (ours), served with `--plugin-sdk`.
pub const TEST_SDK_MJS: &str = include_str!("sdk.mjs");
/// Where published plugins import the SDK from.
pub const SDK_CDN_IMPORT: &str = "https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@1/+esm";

/// The quiz plugin importing Penpal through "the SDK" from its CDN address,
/// as a published plugin imports the SDK.
pub fn quiz_through_the_sdk() -> String {
    let penpal = "import { connect, WindowMessenger } from '/memizy/play/vendor/penpal-7.0.6.mjs';";
    assert!(QUIZ_HTML.contains(penpal));
    QUIZ_HTML.replace(
        penpal,
        &format!("import {{ connect, WindowMessenger }} from '{SDK_CDN_IMPORT}';"),
    )
}

pub struct Server {
    pub app: Option<App>,
    pub http: String,
    pub store: Arc<SqliteStore>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// A server whose `ALLOWED_ORIGINS` is the default list (not this
    /// server): the device page works because it is the server's own.
    pub async fn start() -> Server {
        Self::start_with_sdk(None).await
    }

    /// [`Server::start`] serving this plugin SDK (`--plugin-sdk`).
    pub async fn start_with_sdk(sdk: Option<&str>) -> Server {
        Self::start_with(sdk, Arc::new(SystemClock)).await
    }

    /// [`Server::start`] with this plugin SDK and clock.
    pub async fn start_with(sdk: Option<&str>, clock: Arc<dyn Clock>) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-browser-")
            .tempdir()
            .unwrap();
        let store = Arc::new(SqliteStore::open(&dir.path().join("hostwire.db")).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = RelayConfig {
            allowed_origins: AllowedOrigins::parse(hostwire::cli::DEFAULT_ALLOWED_ORIGINS),
            trust_proxy: false,
            rooms_per_ip_per_hour: RELAY_LIMITS.rooms_per_ip_per_hour,
            limits: RELAY_LIMITS,
            server_limits: SERVER_LIMITS,
            outbound_queue: OUTBOUND_QUEUE,
            credentials: hostwire::http::CredentialSettings {
                operator_token: Some(OPERATOR.to_owned()),
                ..Default::default()
            },
        };
        let mut stores = Stores::relay_only(Arc::clone(&store) as _).unwrap();
        stores.sessions = Arc::clone(&store) as _;
        let mut config = AppConfig::new(config, clock, stores);
        config.sessions.plugin_sdk =
            sdk.map(|s| hostwire::sessions::play::PluginSdk::from_bytes(s.to_owned()));
        let app = App::start(listener, config).unwrap();
        let http = format!("http://{}", app.addr);
        Server {
            app: Some(app),
            http,
            store,
            _dir: dir,
        }
    }

    pub async fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let c = reqwest::Client::new();
        let url = format!("{}{path}", self.http);
        let mut r = match method {
            "POST" => c.post(url),
            "DELETE" => c.delete(url),
            _ => c.get(url),
        };
        if let Some(t) = token {
            r = r.header("authorization", format!("Bearer {t}"));
        }
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = tokio::time::timeout(GUARD, r.send())
            .await
            .unwrap()
            .unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        (status, v)
    }

    /// A presenter session of `plugin` with these players, in its lobby.
    pub async fn create(&self, plugin: &str, players: &[(&str, &str)]) -> Session {
        let players: Vec<Value> = players
            .iter()
            .map(|(id, name)| json!({"id": id, "name": name}))
            .collect();
        self.create_with(
            plugin,
            json!({"mode": "multiplayer", "hostAs": "presenter", "players": players}),
        )
        .await
    }

    /// A session of `plugin` whose mode, hostAs and players `how` gives
    /// (the set, its file and the timing are the tests' own).
    pub async fn create_with(&self, plugin: &str, how: Value) -> Session {
        let mut body = json!({
            "pluginHtml": plugin,
            "set": quiz_set(),
            "timing": {"countdownMs": 0, "finishedCloseMs": 600000},
            "assets": {"assets/cover.png": base64::engine::general_purpose::STANDARD.encode(cover())}
        });
        for (k, v) in how.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (s, v) = self
            .request("POST", "/memizy/sessions", Some(OPERATOR), Some(&body))
            .await;
        assert_eq!(s, 201, "{v}");
        Session {
            id: v["sessionId"].as_str().unwrap().to_owned(),
            host: v["hostToken"].as_str().unwrap().to_owned(),
            players: v["playerTokens"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, t)| (k.clone(), t.as_str().unwrap().to_owned()))
                .collect(),
        }
    }

    /// The device page's link for a token.
    pub fn link(&self, s: &Session, token: &str) -> String {
        format!("{}/memizy/play#session={}&token={token}", self.http, s.id)
    }

    /// `GET /memizy/sessions/{id}` with the host token (answered 200).
    pub async fn status(&self, s: &Session) -> Value {
        self.host_get(s, "").await
    }

    /// `GET /memizy/sessions/{id}/recording` with the host token.
    pub async fn recording(&self, s: &Session) -> Value {
        self.host_get(s, "/recording").await
    }

    async fn host_get(&self, s: &Session, tail: &str) -> Value {
        let path = format!("/memizy/sessions/{}{tail}", s.id);
        let (st, v) = self.request("GET", &path, Some(&s.host), None).await;
        assert_eq!(st, 200, "{path}: {v}");
        v
    }
}

/// One browser test at a time: each runs several Chromiums.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What every browser test stands on: its turn, a server and chromedriver.
pub struct Rig {
    pub server: Server,
    pub driver: Driver,
    _one: tokio::sync::MutexGuard<'static, ()>,
}

impl Rig {
    pub async fn start() -> Rig {
        Self::start_with_sdk(None).await
    }

    /// With the plugin SDK `sdk` served (`--plugin-sdk`).
    pub async fn start_with_sdk(sdk: Option<&str>) -> Rig {
        Self::start_with(sdk, Arc::new(SystemClock)).await
    }

    /// With this plugin SDK and the server on this clock.
    pub async fn start_with(sdk: Option<&str>, clock: Arc<dyn Clock>) -> Rig {
        let one = ONE_AT_A_TIME.lock().await;
        Rig {
            server: Server::start_with(sdk, clock).await,
            driver: driver(),
            _one: one,
        }
    }

    /// A new browser on `link`, once the page says `ready` (a JavaScript
    /// condition; `what` names it if it never holds).
    pub async fn open(&self, link: &str, ready: &str, what: &str) -> Client {
        let c = browser(&self.driver).await;
        c.goto(link).await.unwrap();
        until(&c, ready, what).await;
        c
    }

    /// The device page of `token` in a new browser, in the lobby.
    pub async fn in_lobby(&self, s: &Session, token: &str) -> Client {
        self.open(
            &self.server.link(s, token),
            "document.body.dataset.phase === 'lobby'",
            "the page in the lobby",
        )
        .await
    }

    /// A game of `plugin` with these players, started from the board once
    /// every controller was in the lobby, each controller's plugin ready:
    /// (session, board, controllers in the players' order).
    pub async fn started(
        &self,
        plugin: &str,
        players: &[(&str, &str)],
    ) -> (Session, Client, Vec<Client>) {
        let s = self.server.create(plugin, players).await;
        let board = self.in_lobby(&s, &s.host).await;
        let mut controllers = Vec::new();
        for (p, _) in players {
            controllers.push(self.in_lobby(&s, &s.players[*p]).await);
        }
        click(&board, "#btn-start").await;
        for c in &controllers {
            in_plugin(
                c,
                "document.body.dataset.ready === 'true'",
                "a ready controller",
            )
            .await;
        }
        (s, board, controllers)
    }
}

/// The system clock `ahead_ms` ahead: a server whose clock differs from
/// the devices' (the browsers run on this machine's clock).
pub struct AheadClock(pub u64);

impl Clock for AheadClock {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms() + self.0
    }
}

/// The three players most tests play with.
pub const THREE: &[(&str, &str)] = &[("p1", "Ada"), ("p2", "Bo"), ("p3", "Cy")];

/// The host adds a player named `name` on the board's page: the link the
/// page shows for it.
pub async fn add_player(board: &Client, name: &str) -> String {
    let before = eval(board, "document.querySelectorAll('a[data-invite]').length").await;
    board
        .find(Locator::Css("#add-player input[name=name]"))
        .await
        .unwrap()
        .send_keys(name)
        .await
        .unwrap();
    click(board, "#add-player button").await;
    let link = until(
        board,
        &format!("document.querySelectorAll('a[data-invite]').length > {before} && Array.from(document.querySelectorAll('a[data-invite]')).pop().href"),
        "the new player's link",
    )
    .await;
    link.as_str().unwrap().to_owned()
}

/// Waits in the page's plugin until `expr` holds, and returns its value
/// (back in the page).
pub async fn in_plugin(c: &Client, expr: &str, what: &str) -> Value {
    into_plugin(c).await;
    let v = until(c, expr, what).await;
    to_page(c).await;
    v
}

/// Clicks the choice `choice` of question `q` in a controller's plugin.
pub async fn answer(c: &Client, q: usize, choice: &str) {
    into_plugin(c).await;
    until(
        c,
        &format!("document.body.dataset.q === '{q}' && document.querySelector('button.choice:not([disabled])')"),
        &format!("question {q} on a controller"),
    )
    .await;
    click(c, &format!("button.choice[data-choice='{choice}']")).await;
    to_page(c).await;
}

/// `{player: score}` once the page shows the results.
pub async fn results_shown(page: &Client) -> std::collections::BTreeMap<String, i64> {
    until(
        page,
        "document.body.dataset.results === 'shown'",
        "the results on the page",
    )
    .await;
    board_results(page).await
}

/// `{player: score}` as the board's results list shows it.
pub async fn board_results(board: &Client) -> std::collections::BTreeMap<String, i64> {
    let v = eval(
        board,
        "Array.from(document.querySelectorAll('#scores li')).map(li => [li.dataset.player, Number(li.dataset.score)])",
    )
    .await;
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_owned(), p[1].as_i64().unwrap()))
        .collect()
}

/// The set's one file: 300 bytes counting up from 0.
pub fn cover() -> Vec<u8> {
    (0..=255u8).cycle().take(300).collect()
}

pub fn quiz_set() -> Value {
    json!({
        "meta": {"id": "set-planets", "title": "Planets", "assets": {
            "cover": {"type": "image", "value": "assets/cover.png", "mimeType": "image/png"}
        }},
        "items": [
            {"id": "q1", "type": "mcq-single", "question": "Largest planet?",
             "options": [{"id": "j", "text": "Jupiter"}, {"id": "m", "text": "Mars"}, {"id": "v", "text": "Venus"}],
             "correctId": "j"},
            {"id": "q2", "type": "true-false", "question": "Sound is faster than light.", "correctAnswer": false}
        ]
    })
}

pub struct Session {
    pub id: String,
    pub host: String,
    pub players: std::collections::HashMap<String, String>,
}

/// chromedriver on a free port of 127.0.0.1, killed when dropped.
pub struct Driver {
    child: Child,
    pub url: String,
    /// chromedriver's and its browsers' `TMPDIR`: each browser's profile
    /// (`org.chromium.Chromium.scoped_dir.*`) and shared-memory files,
    /// which a killed browser never removes, go here and go with it.
    tmp: tempfile::TempDir,
}

impl Drop for Driver {
    /// Ends chromedriver and every browser it started (they are in its
    /// process group): a test that fails leaves no Chromium behind.
    fn drop(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) with a negative pid signals that process group only.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.child.wait();
        // `tmp` is removed as the field drops, after the processes are gone.
    }
}

impl Driver {
    /// The directory the browsers write their temporary files in.
    pub fn tmp_dir(&self) -> &std::path::Path {
        self.tmp.path()
    }
}

/// The system's chromium and chromedriver (CHROMIUM_BINARY and
/// CHROMEDRIVER override them). A machine without them fails here with
/// what to install: `.ci/run` installs them.
pub fn driver() -> Driver {
    let exe = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
    let tmp = tempfile::Builder::new()
        .prefix("hostwire-chromium-")
        .tempdir()
        .expect("a temporary directory for the browsers");
    let mut child = Command::new(&exe)
        .arg("--port=0")
        .env("TMPDIR", tmp.path())
        // A process group of its own, which its browsers join.
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{exe}: {e}; install Debian's chromium and chromium-driver (.ci/run does)")
        });
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("chromedriver said nothing")
            .expect("chromedriver's output");
        // "ChromeDriver was started successfully on port 41823."
        if let Some(rest) = line.split("started successfully on port ").nth(1) {
            break rest.trim_end_matches('.').trim().to_owned();
        }
    };
    // Keep reading its output so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
        tmp,
    }
}

/// A browser (its own Chromium) for one device.
pub async fn browser(d: &Driver) -> Client {
    let binary = std::env::var("CHROMIUM_BINARY").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": binary,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1000,720", "--no-first-run", "--disable-extensions",
                     "--disable-background-timer-throttling", "--disable-renderer-backgrounding"]
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let c = tokio::time::timeout(
        GUARD,
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&d.url),
    )
    .await
    .expect("chromium started in time")
    .expect("a WebDriver session");
    c.update_timeouts(fantoccini::wd::TimeoutConfiguration::new(
        Some(GUARD),
        Some(GUARD),
        Some(Duration::from_secs(0)),
    ))
    .await
    .unwrap();
    c
}

/// Waits until the JavaScript expression `expr` is truthy in the current
/// frame (checked in the page at each animation frame, no fixed delay) and
/// returns its value; fails after [`GUARD`] naming what it waited for.
pub async fn until(c: &Client, expr: &str, what: &str) -> Value {
    let script = format!(
        "const done = arguments[arguments.length - 1];
         const f = () => {{ try {{ return ({expr}); }} catch (e) {{ return null; }} }};
         const t = () => {{ const v = f(); if (v) done(v); else requestAnimationFrame(t); }};
         t();"
    );
    match c.execute_async(&script, vec![]).await {
        Ok(v) => v,
        Err(e) => panic!("waiting for {what} ({expr}): {e}"),
    }
}

/// Runs `expr` in the current frame and returns its value.
pub async fn eval(c: &Client, expr: &str) -> Value {
    c.execute(&format!("return ({expr});"), vec![])
        .await
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
}

/// Enters the plugin's iframe (the page has one).
pub async fn into_plugin(c: &Client) {
    until(
        c,
        "document.querySelector('#stage iframe')",
        "the plugin iframe",
    )
    .await;
    c.enter_frame(0).await.unwrap();
}

pub async fn to_page(c: &Client) {
    c.enter_parent_frame().await.unwrap();
}

/// Clicks the element `css` of the current frame once it is there and enabled.
pub async fn click(c: &Client, css: &str) {
    let sel = serde_json::to_string(css).unwrap();
    until(
        c,
        &format!(
            "(() => {{ const e = document.querySelector({sel}); return e && !e.disabled; }})()"
        ),
        css,
    )
    .await;
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Where the screenshots go: a folder of the test target directory.
pub fn screenshot_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("browser-screenshots");
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub async fn screenshot(c: &Client, name: &str) -> PathBuf {
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let p = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&p, png).unwrap();
    eprintln!("screenshot: {}", p.display());
    p
}
