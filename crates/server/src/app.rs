//! The server as a whole: the router built from the protocol modules, the
//! shared infrastructure they use, the runtime and shutdown.
//!
//! # How a protocol mounts
//!
//! A protocol lives in its own module (`relay/`, `sessions/`, `ggui/`,
//! `playerthree/`) and exposes one function that returns its axum
//! [`Router`], with its state already applied:
//!
//! ```ignore
//! pub fn router(state: Arc<MyProtocol>) -> Router { … }
//! ```
//!
//! [`router`] merges them, and `/metrics` renders each protocol's counters
//! (its own type implementing [`Render`]). Paths are the protocol's own (`/api/…` and `/ws`
//! for the Memizy relay); a module nests its HTTP API, adds its CORS and
//! origin rules from [`crate::http`], and answers 404 and 405 under its
//! prefix itself. Its state is built in [`App::start`] from the shared
//! [`StoreWriter`] and clock, with counters of its own, and whatever it must do at
//! shutdown (close sockets, flush) is awaited in [`App::shutdown`] before
//! the store is flushed.

use crate::cluster::leases::Leases;
use crate::cluster::Cluster;
use crate::ggui::{self, Ggui, GguiConfig};
use crate::metrics::{Render, StoreMetrics, StoreProtocol};
use crate::playerthree::{self, PlayerThree, PlayerThreeConfig};
use crate::relay::{self, Relay, RelayConfig, RelayMetrics};
use crate::sessions;
use crate::store_writer::StoreWriter;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hostwire_core::Clock;
use hostwire_store::ggui::GguiStore;
use hostwire_store::lease::{LeaseStore, UnitKind};
use hostwire_store::playerthree::PlayerThreeStore;
use hostwire_store::postgres::PgStore;
use hostwire_store::sessions::SessionStore;
use hostwire_store::{RelayStore, SqliteStore};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Every part of `/metrics`: each protocol's counters and the store's.
type Exposition = Arc<[Arc<dyn Render>]>;

/// Every protocol's routes, `/metrics`, and the front door `/`.
pub fn router(relay: Arc<Relay>, metrics: Exposition) -> Router {
    Router::new()
        .route("/", get(front_door).with_state(Arc::clone(&relay)))
        .merge(relay::router(relay))
        .merge(crate::docs::router())
        .route("/metrics", get(metrics_handler).with_state(metrics))
        .fallback(|| async { (StatusCode::NOT_FOUND, "hostwire") })
}

/// The front door's page (`crates/server/play/front.html`).
pub const FRONT_HTML: &str = include_str!("../play/front.html");

/// `GET /`: what this server is, the protocols it serves and where, its
/// health, and the way to the device page.
async fn front_door(State(relay): State<Arc<Relay>>) -> Response {
    let health = serde_json::to_string_pretty(&relay.health()).unwrap_or_default();
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let html = FRONT_HTML
        .replace("{{version}}", env!("CARGO_PKG_VERSION"))
        .replace("{{health}}", &escape(&health));
    crate::http::html_response(
        html,
        "default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'none'",
    )
}

async fn metrics_handler(State(parts): State<Exposition>) -> Response {
    let mut text = String::new();
    for p in parts.iter() {
        p.render(&mut text);
    }
    let mut r = text.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// A running server.
pub struct App {
    pub addr: SocketAddr,
    pub relay: Arc<Relay>,
    pub ggui: Arc<Ggui>,
    pub playerthree: Arc<PlayerThree>,
    pub sessions: Arc<sessions::Sessions>,
    /// The credential layer (the operator credential in force).
    pub gate: Arc<crate::http::Gate>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Where each protocol keeps what must survive a restart.
#[derive(Clone)]
pub struct Stores {
    pub relay: Arc<dyn RelayStore>,
    /// None: ggui sessions live in memory only.
    pub ggui: Option<Arc<dyn GguiStore>>,
    pub playerthree: Arc<dyn PlayerThreeStore>,
    pub sessions: Arc<dyn SessionStore>,
    /// Who owns each unit, on a database several nodes share (PostgreSQL);
    /// `None`: one node (SQLite), no leases.
    pub leases: Option<Arc<dyn LeaseStore>>,
    /// The SQLite file `GET /admin/backup` copies; `None` elsewhere.
    pub file: Option<Arc<SqliteStore>>,
}

impl Stores {
    /// Every protocol in the one SQLite store (what `serve` runs on by
    /// default).
    pub fn sqlite(store: &Arc<SqliteStore>) -> Stores {
        Stores {
            file: Some(Arc::clone(store)),
            ..Stores::all_in(store)
        }
    }

    /// Every protocol in the one PostgreSQL store (`serve --postgres-url`),
    /// its units leased.
    pub fn postgres(store: &Arc<PgStore>) -> Stores {
        Stores {
            leases: Some(Arc::clone(store) as _),
            ..Stores::all_in(store)
        }
    }

    fn all_in<S>(store: &Arc<S>) -> Stores
    where
        S: RelayStore + GguiStore + PlayerThreeStore + SessionStore,
    {
        Stores {
            relay: Arc::clone(store) as _,
            ggui: Some(Arc::clone(store) as _),
            playerthree: Arc::clone(store) as _,
            sessions: Arc::clone(store) as _,
            leases: None,
            file: None,
        }
    }

    /// Every protocol in the PostgreSQL database at `url`, its schema
    /// migrated; with where it is (never its password) for the logs. A
    /// URL that cannot be read, a database that cannot be reached or that a
    /// newer hostwire migrated stops the start-up with one line naming the
    /// option.
    pub fn connect_postgres(url: &str) -> anyhow::Result<(Stores, String)> {
        let shown = hostwire_store::postgres::describe_url(url);
        let store = PgStore::connect(url).map_err(|e| {
            let reason = e.reason();
            let hint = match e {
                hostwire_store::StoreError::SchemaTooNew { .. } => {
                    format!("point {POSTGRES_URL_OPTION} at another database, or run a newer hostwire")
                }
                _ => format!("check {POSTGRES_URL_OPTION} (postgres://USER:PASSWORD@HOST:PORT/DATABASE) and that PostgreSQL accepts this node"),
            };
            anyhow::anyhow!("cannot use the PostgreSQL database {shown}: {reason}. Hint: {hint}")
        })?;
        Ok((Stores::postgres(&Arc::new(store)), shown))
    }

    /// The relay's rooms in `relay`, every other protocol in memory.
    pub fn relay_only(relay: Arc<dyn RelayStore>) -> anyhow::Result<Stores> {
        let memory = Arc::new(SqliteStore::in_memory()?);
        Ok(Stores {
            relay,
            ggui: None,
            playerthree: Arc::clone(&memory) as _,
            sessions: memory as _,
            leases: None,
            file: None,
        })
    }
}

/// The option (and its environment variable) that puts every store in
/// PostgreSQL.
pub const POSTGRES_URL_OPTION: &str = "--postgres-url / HOSTWIRE_POSTGRES_URL";

/// Everything the server runs with, given before its first connection is
/// accepted: no request can reach a store or a setting that is swapped in
/// later.
pub struct AppConfig {
    pub relay: RelayConfig,
    pub ggui: GguiConfig,
    pub playerthree: PlayerThreeConfig,
    pub sessions: sessions::SessionsConfig,
    pub clock: Arc<dyn Clock>,
    pub stores: Stores,
    /// This node and its peers (`--nats-url`, `--node-id`).
    pub cluster: Arc<Cluster>,
    /// How long a unit's lease lasts unless renewed (`--lease-ttl`; only
    /// with leases, on PostgreSQL).
    pub lease_ttl: std::time::Duration,
}

impl AppConfig {
    /// The relay's settings, and every other protocol's defaults with the
    /// relay's origins, proxies and creation rate.
    pub fn new(relay: RelayConfig, clock: Arc<dyn Clock>, stores: Stores) -> AppConfig {
        let sessions = sessions::SessionsConfig {
            allowed_origins: relay.allowed_origins.clone(),
            sessions_per_ip_per_hour: relay.rooms_per_ip_per_hour,
            trust_proxy: relay.trust_proxy,
            trusted_proxy_hops: relay.server_limits.trusted_proxy_hops,
            ..Default::default()
        };
        AppConfig {
            ggui: GguiConfig::default(),
            playerthree: PlayerThreeConfig::new(relay.allowed_origins.clone()),
            sessions,
            relay,
            cluster: Cluster::single(crate::cluster::random_node_id(), Arc::clone(&clock)),
            lease_ttl: crate::cluster::leases::DEFAULT_LEASE_TTL,
            clock,
            stores,
        }
    }
}

impl App {
    /// Starts every protocol with `config`, restoring what its stores
    /// hold, then serves on `listener`.
    pub fn start(listener: TcpListener, config: AppConfig) -> anyhow::Result<App> {
        let AppConfig {
            relay: config,
            ggui: ggui_config,
            playerthree: p3_config,
            sessions: sessions_config,
            clock,
            stores,
            cluster,
            lease_ttl,
        } = config;
        let leases = node_leases(&stores, &cluster, lease_ttl);
        let backup = crate::backup::Backup::new(stores.file.clone());
        let store = stores.relay;
        let gate = Arc::new(crate::http::Gate::new(
            &config.credentials,
            Arc::clone(&clock),
            config.trust_proxy,
            config.server_limits.trusted_proxy_hops,
        ));
        let store_metrics = Arc::new(StoreMetrics::default());
        let started = Started {
            clock: &clock,
            store_metrics: &store_metrics,
            leases: &leases,
        };
        let playerthree = started.playerthree(p3_config, stores.playerthree)?;
        let ggui = started.ggui(ggui_config, stores.ggui)?;
        let sessions = started.sessions(sessions_config, stores.sessions);
        let relay_metrics = Arc::new(RelayMetrics::default());
        let serve_limits = config.server_limits.serve();
        let (relay, loaded) = start_relay(
            config,
            clock,
            store,
            (&store_metrics, &relay_metrics),
            leases.clone(),
        )?;
        let metrics: Exposition = [
            relay_metrics as Arc<dyn Render>,
            Arc::clone(&ggui.metrics) as Arc<dyn Render>,
            Arc::clone(&playerthree.metrics) as Arc<dyn Render>,
            Arc::clone(&sessions.metrics) as Arc<dyn Render>,
            store_metrics,
            Arc::clone(&cluster) as Arc<dyn Render>,
        ]
        .into_iter()
        .chain(leases.clone().map(|l| l as Arc<dyn Render>))
        .collect();
        let addr = listener.local_addr()?;
        let (stop, mut stopped) = watch::channel(false);
        let app = router(Arc::clone(&relay), metrics)
            .merge(ggui::router(Arc::clone(&ggui)))
            .merge(playerthree::router(Arc::clone(&playerthree)))
            .merge(sessions::router(Arc::clone(&sessions)))
            .merge(crate::backup::router(backup));
        // Inside the body budget: what it reads to carry is counted.
        let app = carry_requests(app, &cluster)
            // One budget of request-body bytes over every protocol's API.
            .layer(axum::middleware::from_fn(crate::http::body_budget))
            // Every protocol's handlers check credentials through it.
            .layer(axum::Extension(Arc::clone(&gate)))
            // `/api/health` shows this node and its peers.
            .layer(axum::Extension(Arc::clone(&cluster)));
        let sockets = crate::ws::Sockets::default();
        carry_clients(
            &cluster,
            &sockets,
            &relay,
            &playerthree,
            &sessions,
            &ggui,
            &app,
        );
        cluster.start(addr, stop.subscribe());
        tokio::spawn(Arc::clone(&relay).sweep_timer(stop.subscribe()));
        if let Some(l) = &leases {
            tokio::spawn(Arc::clone(l).run(stop.subscribe()));
        }
        let shutdown_leases = leases.clone();
        tokio::spawn(sweep_gate(Arc::clone(&gate), stop.subscribe()));
        let shutdown_relay = Arc::clone(&relay);
        let shutdown_ggui = Arc::clone(&ggui);
        let shutdown_p3 = Arc::clone(&playerthree);
        let shutdown_sessions = Arc::clone(&sessions);
        let task = tokio::spawn(async move {
            let graceful = async move {
                let _ = stopped.wait_for(|s| *s).await;
                // Each protocol says goodbye its own way (1001 and what
                // goes before it), then the store is flushed; `serve` then
                // closes every socket left (1001) and waits for them.
                shutdown_relay.shutdown().await;
                shutdown_ggui.shutdown().await;
                shutdown_p3.shutdown().await;
                shutdown_sessions.shutdown().await;
                // Written and flushed: the units go to other nodes at once.
                if let Some(l) = &shutdown_leases {
                    l.release_all().await;
                }
            };
            crate::http::serve::serve(listener, app, serve_limits, sockets, graceful).await;
        });
        tracing::info!(%addr, rooms = loaded, node = %cluster.node(), "hostwire listening");
        Ok(App {
            addr,
            relay,
            ggui,
            playerthree,
            sessions,
            gate,
            stop,
            task,
        })
    }

    /// Stops accepting, closes every socket with 1001, flushes the store.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.relay.shutdown().await;
        self.ggui.shutdown().await;
        self.playerthree.shutdown().await;
        self.sessions.shutdown().await;
    }
}

/// The relay with the rooms its store holds (on PostgreSQL, those whose
/// lease is free), its writes fenced by `leases`; with how many were
/// stored.
fn start_relay(
    config: RelayConfig,
    clock: Arc<dyn Clock>,
    store: Arc<dyn RelayStore>,
    (store_metrics, relay_metrics): (&Arc<StoreMetrics>, &Arc<RelayMetrics>),
    leases: Option<Arc<Leases>>,
) -> anyhow::Result<(Arc<Relay>, usize)> {
    let stored = store.load_rooms()?;
    let loaded = stored.len();
    let writer = StoreWriter::start_fenced(
        Arc::clone(&store) as Arc<dyn hostwire_store::UnitStore<_>>,
        StoreProtocol::Relay,
        Arc::clone(store_metrics),
        leases.as_ref().map(|l| l.fence(UnitKind::RelayRoom)),
    );
    let relay = Relay::start(
        config,
        clock,
        Arc::clone(relay_metrics),
        writer,
        store,
        stored,
        leases,
    );
    Ok((relay, loaded))
}

/// What every protocol is started with.
struct Started<'a> {
    clock: &'a Arc<dyn Clock>,
    store_metrics: &'a Arc<StoreMetrics>,
    leases: &'a Option<Arc<Leases>>,
}

impl Started<'_> {
    fn playerthree(
        &self,
        config: PlayerThreeConfig,
        store: Arc<dyn hostwire_store::playerthree::PlayerThreeStore>,
    ) -> anyhow::Result<Arc<PlayerThree>> {
        PlayerThree::start_leased(
            config,
            Arc::clone(self.clock),
            store,
            Arc::clone(self.store_metrics),
            self.leases.clone(),
        )
    }

    fn ggui(
        &self,
        config: GguiConfig,
        store: Option<Arc<dyn hostwire_store::ggui::GguiStore>>,
    ) -> anyhow::Result<Arc<Ggui>> {
        Ggui::start_leased(
            config,
            Arc::clone(self.clock),
            store,
            Arc::clone(self.store_metrics),
            self.leases.clone(),
        )
    }

    fn sessions(
        &self,
        config: sessions::SessionsConfig,
        store: Arc<dyn hostwire_store::sessions::SessionStore>,
    ) -> Arc<sessions::Sessions> {
        let sessions = sessions::Sessions::new(
            config,
            Arc::clone(self.clock),
            store,
            Arc::clone(self.store_metrics),
        );
        if let Some(l) = self.leases {
            sessions.use_leases(Arc::clone(l));
        }
        sessions.start_expiry_sweep();
        sessions
    }
}

/// With NATS: clients of units owned elsewhere are carried to their
/// owners, and other nodes' clients are served here, in `sockets`.
fn carry_clients(
    cluster: &Cluster,
    sockets: &crate::ws::Sockets,
    relay: &Arc<Relay>,
    playerthree: &Arc<PlayerThree>,
    sessions: &Arc<sessions::Sessions>,
    ggui: &Arc<Ggui>,
    app: &axum::Router,
) {
    if let Some(t) = cluster.tunnels() {
        t.set_sockets(sockets.clone());
        t.set_router(app.clone());
        relay.use_tunnels(Arc::clone(t));
        playerthree.use_tunnels(Arc::clone(t));
        sessions.use_tunnels(Arc::clone(t));
        ggui.use_tunnels(Arc::clone(t));
    }
}

/// With NATS: an API request for a unit another node owns is carried
/// there (see `cluster::tunnel::http`).
fn carry_requests(app: axum::Router, cluster: &Cluster) -> axum::Router {
    match cluster.tunnels() {
        Some(t) => app.layer(axum::middleware::from_fn_with_state(
            Arc::clone(t),
            crate::cluster::tunnel::http::carry_http,
        )),
        None => app,
    }
}

/// The node's leases when its store has them (PostgreSQL), shown by its
/// cluster part.
fn node_leases(
    stores: &Stores,
    cluster: &Cluster,
    ttl: std::time::Duration,
) -> Option<Arc<Leases>> {
    let leases = Leases::new(stores.leases.clone()?, cluster.node().to_owned(), ttl);
    cluster.set_leases(Arc::clone(&leases));
    Some(leases)
}

/// Forgets refilled wrong-credential buckets and aged creations, every
/// [`GATE_SWEEP_INTERVAL`], until `stop` turns true.
async fn sweep_gate(gate: Arc<crate::http::Gate>, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(GATE_SWEEP_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => gate.sweep(),
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// How often the credential layer's tables are swept.
pub const GATE_SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// The runtime `serve` runs on. On one core the work-stealing scheduler
/// only adds cross-thread bookkeeping: the single-threaded one runs the
/// same tasks.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    }
}

/// Resolves on Ctrl-C or SIGTERM. The handlers are in place when this
/// returns (before the future is polled): a signal sent once the server has
/// said where it listens stops it cleanly.
pub fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let handlers = signal(SignalKind::terminate())
            .and_then(|term| signal(SignalKind::interrupt()).map(|int| (term, int)));
        async move {
            match handlers {
                Ok((mut term, mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {},
                        _ = int.recv() => {},
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no SIGTERM handler: only Ctrl-C stops the server");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Raises the open-file soft limit to the hard limit: every connection is a
/// file, and a common default of 1,024 would cap a server at about 1,000
/// players. Returns the limit in force (0 if it cannot be read).
#[cfg(unix)]
pub fn raise_open_file_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0)
}

#[cfg(not(unix))]
pub fn raise_open_file_limit() -> u64 {
    0
}
