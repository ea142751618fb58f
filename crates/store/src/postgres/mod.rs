//! The PostgreSQL store: every store trait on a database several nodes can
//! share, with the same rules as [`SqliteStore`](crate::SqliteStore):
//! each unit of [`UnitStore::apply_units`] all or nothing (the batch's one
//! transaction, tried again with a savepoint per unit when a unit fails),
//! a unit after a failed one with the same
//! key failed untried, `Ok` only once committed. Bundles and asset files
//! are `bytea`; every other value is the JSON text the server writes.
//!
//! # Schema versions
//!
//! [`MIGRATIONS`] are applied in order at [`PgStore::connect`], in one
//! transaction under an advisory lock ([`MIGRATION_LOCK`]), so that nodes
//! starting together migrate once; each applied version is a row of
//! `hostwire_schema`. A database whose newest version is past the ones
//! this hostwire knows is refused ([`StoreError::SchemaTooNew`]).
//!
//! # Owners
//!
//! Every row is keyed by its unit (a room's `pin`, a session's or match's
//! id). Schema 2 adds `unit_leases` (kind, key, owner node, generation,
//! expiry; [`crate::lease`]): a unit written with a fence first locks its
//! lease row (`FOR SHARE`) in the batch's transaction (or the unit's
//! savepoint, when the batch is run again) and is refused when the
//! generation moved on, so a node that lost a unit cannot write it. The
//! lock also orders a takeover after every write the old owner had in
//! flight: the new owner's acquire waits for that commit, and what it then
//! restores includes it.
//!
//! # Threads
//!
//! The client is the synchronous `postgres` crate, which runs a small
//! runtime of its own: it must never be driven (or dropped) on a thread
//! that runs the server's runtime. Every call goes through [`off_runtime`]:
//! on a thread outside any runtime, or in a
//! [`blocking_section`](crate::blocking_section) (the server's blocking
//! pool), it runs where it is called; elsewhere inside a runtime it hops to
//! a scoped thread, counted by [`thread_hops`].

mod ggui;
mod lease;
pub(crate) mod playerthree;
mod sessions;

use crate::lease::UnitKind;
use crate::{StoreError, StoredBundle, StoredRoom, Unit, UnitResults, UnitStore};
use ::postgres::types::ToSql;
use ::postgres::{Client, Config, NoTls, Statement, Transaction};
use hostwire_relay_records::{BundleMeta, PlayerRecord, RoomChange, RoomRecord};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// How long a connection attempt may take when the URL sets no
/// `connect_timeout`: an unreachable database stops the start-up in this
/// time, not in the operating system's minutes.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The advisory lock migrations run under ("hostwire" in ASCII).
pub const MIGRATION_LOCK: i64 = 0x686f_7374_7769_7265;

/// The schema, one entry per version (version N is `MIGRATIONS[N - 1]`).
/// Never edit an applied entry: add the next.
pub const MIGRATIONS: &[&str] = &[
    // 1: every protocol's tables, as SQLite's schema 1 holds them.
    "
CREATE TABLE relay_rooms (
    pin TEXT PRIMARY KEY,
    host_token TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    host_away_since_ms BIGINT,
    open BOOLEAN NOT NULL,
    bundle_version BIGINT,
    bundle_app_name TEXT,
    bundle_text BYTEA
);
CREATE TABLE relay_players (
    pin TEXT NOT NULL REFERENCES relay_rooms(pin) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    token TEXT NOT NULL,
    PRIMARY KEY (pin, id)
);
CREATE TABLE relay_kicked (
    pin TEXT NOT NULL REFERENCES relay_rooms(pin) ON DELETE CASCADE,
    token TEXT NOT NULL,
    PRIMARY KEY (pin, token)
);
CREATE TABLE memizy_sessions (
    id TEXT PRIMARY KEY,
    ord BIGINT GENERATED ALWAYS AS IDENTITY,
    host_token TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    spec TEXT NOT NULL
);
CREATE TABLE memizy_snapshots (
    session_id TEXT PRIMARY KEY,
    snapshot TEXT NOT NULL,
    game_time_ms BIGINT
);
CREATE TABLE memizy_plugin_data (
    user_id TEXT NOT NULL,
    plugin_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    set_id TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (user_id, plugin_id, scope, set_id)
);
CREATE TABLE memizy_progress (
    user_id TEXT NOT NULL,
    set_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (user_id, set_id, item_id)
);
CREATE TABLE memizy_answers (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX memizy_answers_by_session ON memizy_answers (session_id);
CREATE TABLE memizy_results (
    session_id TEXT PRIMARY KEY,
    result TEXT NOT NULL,
    at_ms BIGINT NOT NULL
);
CREATE TABLE memizy_recordings (
    session_id TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    at_ms BIGINT NOT NULL
);
CREATE TABLE memizy_saved_games (
    session_id TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE memizy_player_tokens (
    session_id TEXT NOT NULL,
    player_id TEXT NOT NULL,
    token TEXT NOT NULL,
    PRIMARY KEY (session_id, player_id)
);
CREATE TABLE memizy_assets (
    session_id TEXT NOT NULL,
    file TEXT NOT NULL,
    bytes BYTEA NOT NULL,
    PRIMARY KEY (session_id, file)
);
CREATE TABLE memizy_session_state (
    session_id TEXT PRIMARY KEY,
    state TEXT NOT NULL
);
CREATE TABLE ggui_sessions (
    session_id TEXT PRIMARY KEY,
    ord BIGINT GENERATED ALWAYS AS IDENTITY,
    record TEXT,
    host_context TEXT,
    ledger_last BIGINT NOT NULL DEFAULT 0,
    stream_seq BIGINT NOT NULL DEFAULT 0,
    drained_up_to BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE ggui_ledger (
    session_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE ggui_stream (
    session_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE playerthree_matches (
    id TEXT PRIMARY KEY,
    game TEXT NOT NULL,
    operator_token TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE TABLE playerthree_records (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    match_id TEXT NOT NULL REFERENCES playerthree_matches(id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    tick BIGINT,
    slot TEXT,
    body TEXT NOT NULL
);
CREATE INDEX playerthree_records_by_match ON playerthree_records (match_id, seq);
CREATE INDEX playerthree_records_by_slot ON playerthree_records (match_id, slot) WHERE slot IS NOT NULL;
",
    // 2: who owns each unit (crate::lease). A row is never deleted: its
    // generation must never start again at 1, or a stale writer's fence
    // would pass. `owner` is NULL once released.
    "
CREATE TABLE unit_leases (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    owner TEXT,
    generation BIGINT NOT NULL CHECK (generation > 0),
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE INDEX unit_leases_by_owner ON unit_leases (owner) WHERE owner IS NOT NULL;
CREATE INDEX unit_leases_by_expiry ON unit_leases (expires_at) WHERE owner IS NOT NULL;
",
    // 3: a PlayerThree token's match found by the token's hash in one
    // lookup (a node asked to join a token it does not know asks the
    // store), not a scan of every token record.
    "
CREATE INDEX playerthree_records_by_token ON playerthree_records ((body::jsonb ->> 'tokenHash'))
    WHERE kind = 'token';
",
    // 4: a hosted session's recording as batches of entries appended, not
    // one document rewritten as it grows.
    "
CREATE TABLE memizy_recording_batches (
    session_id TEXT NOT NULL,
    first_seq BIGINT NOT NULL,
    count BIGINT NOT NULL,
    entries TEXT NOT NULL,
    PRIMARY KEY (session_id, first_seq)
);
",
];

/// The newest schema version this hostwire knows.
pub const PG_SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Calls that hopped to a thread of their own (see [`off_runtime`]).
static THREAD_HOPS: AtomicU64 = AtomicU64::new(0);

/// How many calls of this process's PostgreSQL stores ran on a thread
/// started for them: made inside a runtime, outside a
/// [`blocking_section`](crate::blocking_section). Start-up's few; a server
/// whose blocking work is marked adds none while it serves.
pub fn thread_hops() -> u64 {
    THREAD_HOPS.load(Relaxed)
}

/// Runs `f` where the synchronous client may block: on this thread when it
/// is outside any tokio runtime or in a blocking section, else on a scoped
/// thread of its own (the runtime's handle is also on its blocking pool's
/// threads, where the client could run: only a section says which is
/// which).
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if crate::blocking::in_blocking_section() || tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    THREAD_HOPS.fetch_add(1, Relaxed);
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(t) => t,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// A connection and the statements prepared on it: the writes run the same
/// few statements over and over, and a prepared one is a round trip
/// instead of two.
struct Session {
    client: Client,
    statements: HashMap<&'static str, Statement>,
}

impl Session {
    /// `sql`, prepared once per connection.
    fn prepared(&mut self, sql: &'static str) -> Result<Statement, StoreError> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.statements.insert(sql, s.clone());
        Ok(s)
    }
}

/// One unit's fence check and writes, in `tx`. A fence `checked` earlier in
/// the batch is not checked again: its row stays locked until the commit
/// (a released savepoint keeps its locks, and a failed one stops its key's
/// later units), so the answer cannot change.
fn apply_unit<W>(
    tx: &mut Transaction<'_>,
    statements: &mut HashMap<&'static str, Statement>,
    (kind, checked): (UnitKind, &HashMap<&str, u64>),
    unit: &Unit<'_, W>,
    apply: &(impl Fn(&mut Tx<'_, '_>, &W) -> Result<(), StoreError> + Sync),
) -> Result<(), StoreError> {
    let mut tx = Tx { tx, statements };
    if let Some(fence) = unit.fence.filter(|f| checked.get(unit.key) != Some(f)) {
        lease::check_fence(&mut tx, kind, unit.key, fence)?;
    }
    for w in unit.writes {
        apply(&mut tx, w)?;
    }
    Ok(())
}

/// Whether `e` is the server ending the session (a restart, an operator's
/// `pg_terminate_backend`).
fn ends_session(e: &StoreError) -> bool {
    matches!(e, StoreError::Postgres(e) if e
        .as_db_error()
        .is_some_and(|db| matches!(db.severity(), "FATAL" | "PANIC")))
}

/// A transaction (or a unit's savepoint in it) and the session's prepared
/// statements: what each protocol's writes run on.
pub(crate) struct Tx<'a, 'b> {
    tx: &'a mut Transaction<'b>,
    statements: &'a mut HashMap<&'static str, Statement>,
}

impl Tx<'_, '_> {
    /// Runs `sql`, prepared once per connection.
    pub(crate) fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let statement = match self.statements.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = self.tx.prepare(sql)?;
                self.statements.insert(sql, s.clone());
                s
            }
        };
        Ok(self.tx.execute(&statement, params)?)
    }

    /// The row `sql` returns, if any, prepared once per connection.
    pub(crate) fn query_opt(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<::postgres::Row>, StoreError> {
        let statement = match self.statements.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = self.tx.prepare(sql)?;
                self.statements.insert(sql, s.clone());
                s
            }
        };
        Ok(self.tx.query_opt(&statement, params)?)
    }
}

/// One connection, reconnected on first use after it broke (a database
/// restart fails the calls in flight, not every later one). Behind a fair
/// lock for the reason [`SqliteStore`](crate::SqliteStore)'s is.
struct PgConn {
    config: Config,
    session: parking_lot::FairMutex<Option<Session>>,
}

impl PgConn {
    fn connect(config: &Config) -> Result<PgConn, StoreError> {
        let client = off_runtime(|| config.connect(NoTls))?;
        Ok(PgConn {
            config: config.clone(),
            session: parking_lot::FairMutex::new(Some(Session {
                client,
                statements: HashMap::new(),
            })),
        })
    }

    fn with<T: Send>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError> {
        self.run(|s| f(&mut s.client)).0
    }

    /// Runs `f` on the session, and says whether a failure was the server
    /// ending the session (a restart, an operator's
    /// `pg_terminate_backend`): the connection is then dropped, and made
    /// again by the next call.
    fn run<T: Send>(
        &self,
        f: impl FnOnce(&mut Session) -> Result<T, StoreError> + Send,
    ) -> (Result<T, StoreError>, bool) {
        off_runtime(|| {
            let mut session = self.session.lock();
            if session.as_ref().is_none_or(|s| s.client.is_closed()) {
                *session = None;
                match self.config.connect(NoTls) {
                    Ok(client) => {
                        *session = Some(Session {
                            client,
                            statements: HashMap::new(),
                        })
                    }
                    Err(e) => return (Err(e.into()), false),
                }
            }
            let r = f(session.as_mut().expect("connected above"));
            let mut ended = false;
            if let Err(e @ StoreError::Postgres(_)) = &r {
                ended = ends_session(e) || session.as_ref().is_some_and(|s| s.client.is_closed());
                if ended {
                    *session = None;
                }
            }
            (r, ended)
        })
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        // Closing runs the client's runtime: not on a runtime's thread.
        if let Some(session) = self.session.get_mut().take() {
            off_runtime(move || drop(session));
        }
    }
}

/// The PostgreSQL store: a connection for writes, one for reads (a
/// bundle served, a session restored), so that reads never queue behind a
/// batch of writes, and one for leases ([`crate::lease::LeaseStore`]), so
/// that a renewal never queues behind either.
pub struct PgStore {
    writer: PgConn,
    reader: PgConn,
    /// Lease calls: a renewal never waits behind a batch of writes.
    leases: PgConn,
}

/// Where a URL points, without its password: for messages and logs.
pub fn describe_url(url: &str) -> String {
    let Ok(config) = Config::from_str(url) else {
        return "(an unreadable URL)".to_owned();
    };
    let host = match config.get_hosts().first() {
        Some(::postgres::config::Host::Tcp(h)) => h.clone(),
        Some(::postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}@{host}:{port}/{}",
        config.get_user().unwrap_or("(default user)"),
        config.get_dbname().unwrap_or("(default database)")
    )
}

impl PgStore {
    /// Connects to `url` (`postgres://user:password@host:port/database`,
    /// or key=value pairs), then migrates the schema to this hostwire's
    /// version under [`MIGRATION_LOCK`], refusing a newer one.
    pub fn connect(url: &str) -> Result<PgStore, StoreError> {
        let mut config = Config::from_str(url)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("hostwire");
        let writer = PgConn::connect(&config)?;
        writer.with(migrate)?;
        let reader = PgConn::connect(&config)?;
        let leases = PgConn::connect(&config)?;
        Ok(PgStore {
            writer,
            reader,
            leases,
        })
    }

    /// The schema version the database is at.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        self.reader.with(|c| {
            Ok(c.query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM hostwire_schema",
                &[],
            )?
            .get(0))
        })
    }

    /// Applies writes in order in one transaction, all or nothing.
    pub(crate) fn apply_all<W: Sync>(
        &self,
        writes: &[W],
        apply: impl Fn(&mut Tx<'_, '_>, &W) -> Result<(), StoreError> + Sync,
    ) -> Result<(), StoreError> {
        self.writer
            .run(|s| {
                let mut tx = s.client.transaction()?;
                for w in writes {
                    apply(
                        &mut Tx {
                            tx: &mut tx,
                            statements: &mut s.statements,
                        },
                        w,
                    )?;
                }
                tx.commit()?;
                Ok(())
            })
            .0
    }

    /// One transaction (one commit for the batch): every unit without
    /// savepoints first; when one fails, the batch again with a savepoint
    /// per unit, so that a unit that fails is rolled back to its savepoint
    /// alone. The later units with its key are not tried, and nothing is
    /// `Ok` before the commit.
    ///
    /// A unit with a [`fence`](Unit::fence) first checks it against the
    /// lease of (`kind`, its key), in the transaction (in its savepoint on
    /// the second pass): a stale generation
    /// fails the unit alone with [`StoreError::Fenced`], untouched.
    pub(crate) fn apply_units_with<W: Sync>(
        &self,
        kind: UnitKind,
        units: &[Unit<'_, W>],
        apply: impl Fn(&mut Tx<'_, '_>, &W) -> Result<(), StoreError> + Sync,
    ) -> UnitResults {
        let (done, _) = self.writer.run(|s| {
            let Session { client, statements } = s;
            // Every unit in the one transaction, without savepoints (two
            // round trips fewer a unit), as nearly every batch commits;
            // a failure rolls it back as it is dropped.
            let mut tx = client.transaction()?;
            let mut checked: HashMap<&str, u64> = HashMap::new();
            let mut failure = None;
            for unit in units {
                if let Err(e) = apply_unit(&mut tx, statements, (kind, &checked), unit, &apply) {
                    failure = Some(e);
                    break;
                }
                if let Some(fence) = unit.fence {
                    checked.insert(unit.key, fence);
                }
            }
            let Some(e) = failure else {
                tx.commit()?;
                return Ok(units.iter().map(|_| Ok(())).collect());
            };
            drop(tx);
            // The session ended under it: `run` starts another.
            if ends_session(&e) || client.is_closed() {
                return Err(e);
            }
            if let [_] = units {
                return Ok(vec![Err(e)]);
            }
            // A unit failed: the batch again, a savepoint per unit, so that
            // it alone is rolled back.
            let mut tx = client.transaction()?;
            let mut failed = std::collections::HashSet::new();
            // Fences already checked in this batch (see `apply_unit`).
            let mut checked: HashMap<&str, u64> = HashMap::new();
            let mut results = Vec::with_capacity(units.len());
            for unit in units {
                if failed.contains(unit.key) {
                    results.push(Err(StoreError::EarlierFailed(unit.key.to_owned())));
                    continue;
                }
                let r = (|| -> Result<(), StoreError> {
                    // Dropped uncommitted, it rolls back to its savepoint.
                    let mut sp = tx.transaction()?;
                    apply_unit(&mut sp, statements, (kind, &checked), unit, &apply)?;
                    sp.commit()?;
                    Ok(())
                })();
                match (&r, unit.fence) {
                    (Err(_), _) => {
                        failed.insert(unit.key);
                    }
                    (Ok(()), Some(fence)) => {
                        checked.insert(unit.key, fence);
                    }
                    (Ok(()), None) => {}
                }
                results.push(r);
            }
            tx.commit()?;
            Ok(results)
        });
        match done {
            Ok(results) => results,
            // Not committed: no unit is durable (the error is not `Clone`).
            Err(e) => {
                let reason = e.reason();
                units
                    .iter()
                    .map(|_| Err(StoreError::Commit(reason.clone())))
                    .collect()
            }
        }
    }

    /// The rows of one statement on the read connection (one statement
    /// sees one snapshot: no transaction needed), tried again as
    /// [`PgStore::read`] is.
    pub(crate) fn query(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<::postgres::Row>, StoreError> {
        let attempt = || {
            self.reader.run(|s| {
                let statement = s.prepared(sql)?;
                Ok(s.client.query(&statement, params)?)
            })
        };
        match attempt() {
            (_, true) => attempt().0,
            (r, false) => r,
        }
    }

    /// A read in one read-only snapshot on the read connection; tried a
    /// second time, on a new connection, when the server had ended the
    /// session (a read changes nothing: trying it again is safe, where a
    /// write whose commit was cut off is answered as not stored).
    pub(crate) fn read<T: Send>(
        &self,
        f: impl Fn(&mut Transaction<'_>) -> Result<T, StoreError> + Sync,
    ) -> Result<T, StoreError> {
        let attempt = || {
            self.reader.run(|s| {
                let mut tx = s
                    .client
                    .build_transaction()
                    .isolation_level(::postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()?;
                let t = f(&mut tx)?;
                tx.commit()?;
                Ok(t)
            })
        };
        match attempt() {
            (_, true) => attempt().0,
            (r, false) => r,
        }
    }
}

/// Brings the schema to [`PG_SCHEMA_VERSION`] in one transaction under the
/// advisory lock (a second node starting waits, then finds it done).
fn migrate(c: &mut Client) -> Result<(), StoreError> {
    let mut tx = c.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS hostwire_schema (
             version BIGINT PRIMARY KEY,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )?;
    let found: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::BIGINT FROM hostwire_schema",
            &[],
        )?
        .get(0);
    if found > PG_SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            database: "PostgreSQL",
            found,
            known: PG_SCHEMA_VERSION,
        });
    }
    for version in found + 1..=PG_SCHEMA_VERSION {
        tx.batch_execute(MIGRATIONS[version as usize - 1])?;
        tx.execute(
            "INSERT INTO hostwire_schema (version) VALUES ($1)",
            &[&version],
        )?;
    }
    tx.commit()?;
    Ok(())
}

fn ms(t: u64) -> i64 {
    t as i64
}

impl PgStore {
    /// Every stored room, or the one of `pin`, with its players and kicked
    /// tokens.
    fn load_rooms_where(&self, pin: Option<&str>) -> Result<Vec<StoredRoom>, StoreError> {
        self.read(|tx| {
            let mut rooms = Vec::new();
            for r in tx.query(
                "SELECT pin, host_token, created_at_ms, host_away_since_ms, open, bundle_version, bundle_app_name
                 FROM relay_rooms WHERE $1::TEXT IS NULL OR pin = $1 ORDER BY created_at_ms, pin",
                &[&pin],
            )? {
                let version: Option<i64> = r.get(5);
                rooms.push(StoredRoom {
                    record: RoomRecord {
                        pin: r.get(0),
                        host_token: r.get(1),
                        created_at_ms: r.get::<_, i64>(2) as u64,
                        host_away_since_ms: r.get::<_, Option<i64>>(3).map(|t| t as u64),
                        open: r.get(4),
                        players: Vec::new(),
                        kicked_tokens: Vec::new(),
                        bundle: version.map(|v| BundleMeta {
                            version: v as u64,
                            app_name: r.get(6),
                        }),
                    },
                });
            }
            let players =
                tx.prepare("SELECT id, name, token FROM relay_players WHERE pin = $1 ORDER BY seq")?;
            let kicked = tx.prepare("SELECT token FROM relay_kicked WHERE pin = $1 ORDER BY token")?;
            for room in &mut rooms {
                let pin = &room.record.pin;
                room.record.players = tx
                    .query(&players, &[pin])?
                    .iter()
                    .map(|r| PlayerRecord {
                        id: r.get(0),
                        name: r.get(1),
                        token: r.get(2),
                    })
                    .collect();
                room.record.kicked_tokens =
                    tx.query(&kicked, &[pin])?.iter().map(|r| r.get(0)).collect();
            }
            Ok(rooms)
        })
    }
}

impl crate::RelayStore for PgStore {
    fn load_rooms(&self) -> Result<Vec<StoredRoom>, StoreError> {
        self.load_rooms_where(None)
    }

    fn load_room(&self, pin: &str) -> Result<Option<StoredRoom>, StoreError> {
        Ok(self.load_rooms_where(Some(pin))?.pop())
    }

    fn apply(&self, changes: &[RoomChange]) -> Result<(), StoreError> {
        self.apply_all(changes, apply_change)
    }

    fn load_bundle(&self, pin: &str) -> Result<Option<StoredBundle>, StoreError> {
        let rows = self.query(
            "SELECT bundle_version, bundle_text FROM relay_rooms WHERE pin = $1",
            &[&pin],
        )?;
        Ok(rows.into_iter().next().and_then(|r| {
            let version: Option<i64> = r.get(0);
            let text: Option<Vec<u8>> = r.get(1);
            Some(StoredBundle {
                version: version? as u64,
                text: text?,
            })
        }))
    }
}

impl UnitStore<RoomChange> for PgStore {
    fn apply_units(&self, units: &[Unit<'_, RoomChange>]) -> UnitResults {
        self.apply_units_with(UnitKind::RelayRoom, units, apply_change)
    }
}

fn apply_change(tx: &mut Tx<'_, '_>, change: &RoomChange) -> Result<(), StoreError> {
    match change {
        RoomChange::Created(r) => {
            // A new room replaces whatever had its PIN, players and all.
            tx.execute("DELETE FROM relay_rooms WHERE pin = $1", &[&r.pin])?;
            tx.execute(
                "INSERT INTO relay_rooms (pin, host_token, created_at_ms, host_away_since_ms, open)
                 VALUES ($1, $2, $3, $4, $5)",
                &[
                    &r.pin,
                    &r.host_token,
                    &ms(r.created_at_ms),
                    &r.host_away_since_ms.map(ms),
                    &r.open,
                ],
            )?;
        }
        RoomChange::HostAway { pin, since_ms } => {
            tx.execute(
                "UPDATE relay_rooms SET host_away_since_ms = $2 WHERE pin = $1",
                &[pin, &since_ms.map(ms)],
            )?;
        }
        RoomChange::Open { pin, open } => {
            tx.execute(
                "UPDATE relay_rooms SET open = $2 WHERE pin = $1",
                &[pin, open],
            )?;
        }
        RoomChange::Player { pin, player } => {
            tx.execute(
                "INSERT INTO relay_players (pin, seq, id, name, token)
                 VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM relay_players WHERE pin = $1), $2, $3, $4)
                 ON CONFLICT (pin, id) DO UPDATE SET name = EXCLUDED.name, token = EXCLUDED.token",
                &[pin, &player.id, &player.name, &player.token],
            )?;
        }
        RoomChange::Kicked {
            pin,
            player_id,
            token,
        } => {
            tx.execute(
                "DELETE FROM relay_players WHERE pin = $1 AND id = $2",
                &[pin, player_id],
            )?;
            tx.execute(
                "INSERT INTO relay_kicked (pin, token) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[pin, token],
            )?;
        }
        RoomChange::Bundle { pin, meta, text } => {
            tx.execute(
                "UPDATE relay_rooms SET bundle_version = $2, bundle_app_name = $3, bundle_text = $4
                 WHERE pin = $1",
                &[pin, &ms(meta.version), &meta.app_name, &text.as_ref()],
            )?;
        }
        RoomChange::Deleted { pin } => {
            tx.execute("DELETE FROM relay_rooms WHERE pin = $1", &[pin])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RelayStore;

    fn room(pin: &str) -> RoomChange {
        RoomChange::Created(RoomRecord {
            pin: pin.into(),
            host_token: "h".repeat(32),
            created_at_ms: 1_000,
            host_away_since_ms: None,
            open: true,
            players: vec![],
            kicked_tokens: vec![],
            bundle: None,
        })
    }

    fn admin(url: &str) -> Client {
        Client::connect(url, NoTls).unwrap()
    }

    #[test]
    fn nodes_starting_together_migrate_once() {
        let Some(url) = crate::testing::fresh_database("migrate_once") else {
            return;
        };
        let stores: Vec<Result<PgStore, StoreError>> = std::thread::scope(|s| {
            let started: Vec<_> = (0..4).map(|_| s.spawn(|| PgStore::connect(&url))).collect();
            started.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for s in &stores {
            assert_eq!(
                s.as_ref().unwrap().schema_version().unwrap(),
                PG_SCHEMA_VERSION
            );
        }
        let versions: Vec<i64> = admin(&url)
            .query("SELECT version FROM hostwire_schema ORDER BY version", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(versions, (1..=PG_SCHEMA_VERSION).collect::<Vec<_>>());
    }

    /// A database an older hostwire left at schema 1 gains the lease table
    /// and keeps its rows.
    #[test]
    fn a_schema_1_database_migrates_to_the_newest_keeping_its_rows() {
        let Some(url) = crate::testing::fresh_database("migrate_from_1") else {
            return;
        };
        let mut c = admin(&url);
        c.batch_execute(
            "CREATE TABLE hostwire_schema (
                 version BIGINT PRIMARY KEY,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
             )",
        )
        .unwrap();
        c.batch_execute(MIGRATIONS[0]).unwrap();
        c.batch_execute(
            "INSERT INTO hostwire_schema (version) VALUES (1);
             INSERT INTO relay_rooms (pin, host_token, created_at_ms, open)
             VALUES ('666666', 'h', 1, TRUE);
             INSERT INTO playerthree_matches (id, game, operator_token, created_at_ms)
             VALUES ('m1', 'g', 'o', 1);",
        )
        .unwrap();
        let hash = "e".repeat(64);
        c.execute(
            "INSERT INTO playerthree_records (match_id, kind, body) VALUES ('m1', 'token', $1)",
            &[&format!(
                "{{\"record\":\"token\",\"tokenHash\":\"{hash}\"}}"
            )],
        )
        .unwrap();
        let store = PgStore::connect(&url).unwrap();
        assert_eq!(store.schema_version().unwrap(), PG_SCHEMA_VERSION);
        assert_eq!(store.load_rooms().unwrap()[0].record.pin, "666666");
        // Version 3's index covers the tokens stored before it.
        let found = crate::playerthree::PlayerThreeStore::match_of_token(&store, &hash).unwrap();
        assert_eq!(found.as_deref(), Some("m1"));
        let leases: i64 = c
            .query_one("SELECT COUNT(*) FROM unit_leases", &[])
            .unwrap()
            .get(0);
        assert_eq!(leases, 0);
    }

    #[test]
    fn a_broken_connection_fails_the_write_in_flight_and_the_next_one_reconnects() {
        let Some(url) = crate::testing::fresh_database("reconnect") else {
            return;
        };
        let store = PgStore::connect(&url).unwrap();
        store.apply(&[room("111111")]).unwrap();
        // What a PostgreSQL restart does to every connection of the node.
        admin(&url)
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = 'hostwire' AND datname = current_database()",
                &[],
            )
            .unwrap();
        let first = store.apply(&[room("222222")]);
        let stored = match first {
            // The client had not yet seen its connection go: refused.
            Err(_) => {
                store.apply(&[room("333333")]).unwrap();
                vec!["111111", "333333"]
            }
            Ok(()) => vec!["111111", "222222"],
        };
        let pins: Vec<String> = store
            .load_rooms()
            .unwrap()
            .into_iter()
            .map(|r| r.record.pin)
            .collect();
        assert_eq!(pins, stored);
    }

    /// A call runs where it is made outside any runtime and in a blocking
    /// section of a runtime's blocking pool; anywhere else in a runtime (an
    /// async task, a blocking thread not in a section) on a thread of its
    /// own.
    #[test]
    fn a_call_hops_to_a_thread_of_its_own_only_where_it_must() {
        fn ran_here() -> bool {
            off_runtime(|| std::thread::current().id()) == std::thread::current().id()
        }
        assert!(ran_here(), "outside any runtime");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async move {
            assert!(!ran_here(), "on the runtime's own thread");
            let pool = tokio::task::spawn_blocking(move || {
                (ran_here(), crate::blocking_section(ran_here))
            });
            let (unmarked, marked) = pool.await.unwrap();
            assert!(!unmarked, "a blocking thread not in a section");
            assert!(marked, "a blocking thread in a section");
        });
    }

    /// The synchronous client never runs (or is dropped) on a runtime's
    /// thread: there it would panic.
    #[test]
    fn the_store_works_and_drops_inside_a_runtime() {
        let Some(url) = crate::testing::fresh_database("inside_a_runtime") else {
            return;
        };
        for rt in [
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap(),
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .build()
                .unwrap(),
        ] {
            let url = url.clone();
            rt.block_on(async move {
                let store = PgStore::connect(&url).unwrap();
                store.apply(&[room("444444")]).unwrap();
                assert!(store
                    .load_rooms()
                    .unwrap()
                    .iter()
                    .any(|r| r.record.pin == "444444"));
                // In a section of the blocking pool the client runs on
                // that thread, its own runtime inside the server's.
                let store = tokio::task::spawn_blocking(move || {
                    crate::blocking_section(|| {
                        store.apply(&[room("555555")]).unwrap();
                        assert!(store
                            .load_rooms()
                            .unwrap()
                            .iter()
                            .any(|r| r.record.pin == "555555"));
                        store
                    })
                })
                .await
                .unwrap();
                drop(store);
            });
        }
    }
}
