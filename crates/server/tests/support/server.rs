//! The one server spawner: every protocol's test server is an [`App`]
//! started here, on a listener at 127.0.0.1:0, a [`ManualClock`] and a
//! SQLite store.

use hostwire::app::{App, AppConfig, Stores};
use hostwire::ggui::GguiConfig;
use hostwire::http::{AllowedOrigins, CredentialSettings};
use hostwire::playerthree::PlayerThreeConfig;
use hostwire::relay::{RelayConfig, OUTBOUND_QUEUE, SERVER_LIMITS};
use hostwire::sessions::play::PluginSdk;
use hostwire_core::ManualClock;
use hostwire_memizy::RELAY_LIMITS;
use hostwire_store::SqliteStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The operator credential every test server is started with.
pub const OPERATOR: &str = "test-operator-credential-0123456789";
/// The browser origin the servers that check origins allow.
pub const ORIGIN: &str = "https://play.example.org";
/// A guard against a hung test, not a wait for time to pass.
pub const GUARD: Duration = Duration::from_secs(10);
/// Where every test clock starts.
pub const T0: u64 = 1_800_000_000_000;

/// The relay's settings (which every protocol shares: origins,
/// credentials) with the operator credential and these origins.
pub fn relay_config(allowed_origins: AllowedOrigins) -> RelayConfig {
    RelayConfig {
        allowed_origins,
        trust_proxy: false,
        rooms_per_ip_per_hour: RELAY_LIMITS.rooms_per_ip_per_hour,
        limits: RELAY_LIMITS,
        server_limits: SERVER_LIMITS,
        outbound_queue: OUTBOUND_QUEUE,
        credentials: CredentialSettings {
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

/// What a server is started with. Only the relay's rooms are kept in the
/// store unless a field says otherwise: the others then live in memory, as
/// in a server started without their store.
pub struct Spawn {
    pub relay: RelayConfig,
    pub ggui: GguiConfig,
    /// ggui sessions kept in the store.
    pub ggui_durable: bool,
    /// PlayerThree's settings, its matches kept in the store; none: the
    /// defaults for the relay's origins, matches in memory.
    pub playerthree: Option<PlayerThreeConfig>,
    /// Hosted sessions kept in the store.
    pub sessions_durable: bool,
    /// The plugin SDK the device page serves (`--plugin-sdk`).
    pub plugin_sdk: Option<PluginSdk>,
}

impl Spawn {
    pub fn new(relay: RelayConfig) -> Spawn {
        Spawn {
            relay,
            ggui: GguiConfig::default(),
            ggui_durable: false,
            playerthree: None,
            sessions_durable: false,
            plugin_sdk: None,
        }
    }

    /// Starts the server on `store`.
    pub async fn start(self, store: Arc<SqliteStore>, clock: &ManualClock) -> App {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut stores = Stores::relay_only(Arc::clone(&store) as _).unwrap();
        if self.ggui_durable {
            stores.ggui = Some(Arc::clone(&store) as _);
        }
        if self.playerthree.is_some() {
            stores.playerthree = Arc::clone(&store) as _;
        }
        if self.sessions_durable {
            stores.sessions = Arc::clone(&store) as _;
        }
        let mut config = AppConfig::new(self.relay, Arc::new(clock.clone()), stores);
        config.ggui = self.ggui;
        if let Some(p3) = self.playerthree {
            config.playerthree = p3;
        }
        config.sessions.plugin_sdk = self.plugin_sdk;
        App::start(listener, config).unwrap()
    }

    /// Starts the server on the SQLite file `db` (restoring what it holds).
    pub async fn start_at(self, db: &Path, clock: &ManualClock) -> App {
        self.start(Arc::new(SqliteStore::open(db).unwrap()), clock)
            .await
    }
}

/// A database file in a directory of its own, removed when dropped unless
/// taken (to be kept across a restart).
pub struct Data {
    pub db: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl Data {
    pub fn new(name: &str) -> Data {
        let dir = temp_dir(name);
        Data {
            db: dir.path().join("hostwire.db"),
            dir: Some(dir),
        }
    }

    /// A file that someone else keeps.
    pub fn at(db: PathBuf) -> Data {
        Data { db, dir: None }
    }

    pub fn take_dir(&mut self) -> Option<tempfile::TempDir> {
        self.dir.take()
    }

    pub fn keep_dir(&mut self, dir: Option<tempfile::TempDir>) {
        self.dir = dir;
    }
}
