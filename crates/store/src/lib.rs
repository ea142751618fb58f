//! hostwire-store: what must survive a restart.
//!
//! [`RelayStore`] is the small interface the relay needs (and
//! [`SessionStore`](sessions::SessionStore), [`GguiStore`](ggui::GguiStore),
//! [`PlayerThreeStore`](playerthree::PlayerThreeStore) the other
//! protocols'); [`SqliteStore`] is the embedded default (one file, WAL),
//! [`PgStore`](postgres::PgStore) the PostgreSQL database several nodes
//! can share. Both keep a schema version and refuse a database whose
//! schema is newer than they know.

// No unsafe code here: what needs it lives in hostwire-core, where Miri
// checks it.
#![forbid(unsafe_code)]

mod backup;
mod blocking;
pub mod ggui;
pub mod lease;
pub mod playerthree;
pub mod postgres;
mod restore;
pub mod sessions;
#[cfg(test)]
mod suite;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use blocking::blocking_section;
pub use restore::{remove_restore_leftovers, restore_into, RestoreError, Restored};

/// The lock file a server holds in its data directory while it runs.
pub const LOCK_FILE: &str = "hostwire.lock";

/// Why a data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    #[error("another hostwire server is using the data directory {0} (it holds {0}/{LOCK_FILE}); stop it, or give this one another --data-dir / HOSTWIRE_DATA_DIR")]
    InUse(String),
    #[error("cannot create the lock file {0}/{LOCK_FILE}: {1}")]
    Io(String, std::io::Error),
}

/// Takes the data directory's exclusive lock: two servers on one
/// directory would load the same rooms and overwrite each other's
/// changes. Held until the returned file is dropped (or the process ends,
/// `kill -9` included: the operating system releases it).
pub fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File, DirLockError> {
    let shown = dir.display().to_string();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK_FILE))
        .map_err(|e| DirLockError::Io(shown.clone(), e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(DirLockError::InUse(shown)),
        Err(std::fs::TryLockError::Error(e)) => Err(DirLockError::Io(shown, e)),
    }
}
use hostwire_relay_records::{BundleMeta, PlayerRecord, RoomChange, RoomRecord};
use rusqlite::{params, Connection, DatabaseName, OptionalExtension};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the store's lock was poisoned by a panic")]
    Poisoned,
    #[error("an earlier change of room {0} in the same batch failed")]
    EarlierFailed(String),
    #[error("the batch was not committed: {0}")]
    Commit(String),
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] ::postgres::Error),
    /// A copy of the database could not be made (see [`SqliteStore::backup_to`]).
    #[error("backup: {0}")]
    Backup(String),
    /// A database migrated by a newer hostwire: this one could misread
    /// what it does not know, so it refuses to start on it.
    #[error("the {database} database's schema is version {found}, newer than this hostwire knows (version {known}): a newer hostwire migrated it. Run that hostwire (or a newer one) on it, or give this one another database")]
    SchemaTooNew {
        database: &'static str,
        found: i64,
        known: i64,
    },
    /// A unit written with a lease generation that is no longer the
    /// unit's: another node took it over (or it was released), and this
    /// writer must drop the unit. Nothing of the unit was written.
    #[error("unit {key} is fenced: this writer holds generation {held} of its lease, but {}", match current {
        Some(c) => format!("the lease is now at generation {c} (another node took the unit over)"),
        None => "nobody holds its lease now (never taken, or released)".to_owned(),
    })]
    Fenced {
        key: String,
        held: u64,
        current: Option<u64>,
    },
}

impl StoreError {
    /// What went wrong, without the database's path: SQLite's own messages
    /// repeat it, and the caller names the file once.
    pub fn reason(&self) -> String {
        match self {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => f.to_string(),
            // The server's own message ("relation … does not exist") is the
            // useful part; the client's wrapper ("db error") is not.
            StoreError::Postgres(e) => match e.as_db_error() {
                Some(db) => format!("{}: {}", db.severity(), db.message()),
                None => with_causes(e),
            },
            other => other.to_string(),
        }
    }
}

/// An error and its causes in one line ("error connecting to server:
/// Connection refused"): the client's own message leaves the cause out.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
}

/// A room as loaded at start-up: its record, without its bundle's bytes
/// (those are read when a client asks for them, [`RelayStore::load_bundle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRoom {
    pub record: RoomRecord,
}

/// A room's stored bundle: its version and text, read together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBundle {
    pub version: u64,
    pub text: Vec<u8>,
}

/// What became of each unit given to [`UnitStore::apply_units`], in order.
pub type UnitResults = Vec<Result<(), StoreError>>;

/// One unit of durable writes: the records of one command of one relay
/// room, ggui session, PlayerThree match or hosted session (`key` names
/// it), stored all or nothing.
#[derive(Debug, Clone, Copy)]
pub struct Unit<'a, W> {
    pub key: &'a str,
    pub writes: &'a [W],
    /// The lease generation the writer holds ([`lease`]): PostgreSQL
    /// refuses the unit ([`StoreError::Fenced`]) unless it is the unit's
    /// current one. `None`: no check (one node, or no lease taken); SQLite
    /// always ignores it.
    pub fence: Option<u64>,
}

impl<'a, W> Unit<'a, W> {
    /// A unit without a fence: the single-node case.
    pub fn new(key: &'a str, writes: &'a [W]) -> Unit<'a, W> {
        Unit {
            key,
            writes,
            fence: None,
        }
    }

    /// The same unit, checked against lease generation `generation`.
    pub fn fenced(self, generation: u64) -> Unit<'a, W> {
        Unit {
            fence: Some(generation),
            ..self
        }
    }
}

/// A store write's size, for byte bounds on what waits to be written.
pub trait StoreWrite: Send + 'static {
    /// About how many bytes the write holds (its text and blobs).
    fn bytes(&self) -> usize;
}

/// The one shape every protocol's store has for the store writer: units
/// applied in order, each all or nothing on its own (one unit's failure
/// does not undo another's). A unit after a failed one with the same key
/// fails too, untried, so that a unit's writes are never durable out of
/// order. `Ok` means durable.
pub trait UnitStore<W>: Send + Sync + 'static {
    fn apply_units(&self, units: &[Unit<'_, W>]) -> UnitResults;

    /// [`apply_units`](Self::apply_units) at once if the store can start
    /// without waiting (its connection free); `None` if it would wait, or
    /// cannot tell. The writer calls this on its own task for a small
    /// batch: a commit without a thread hop there and back, where the hop
    /// costs more than the commit.
    fn try_apply_units_now(&self, _units: &[Unit<'_, W>]) -> Option<UnitResults> {
        None
    }
}

/// [`UnitStore::apply_units`] for a store that can only apply one batch
/// at a time (`apply`, all or nothing): each unit on its own.
pub fn apply_each<W>(
    units: &[Unit<'_, W>],
    mut apply: impl FnMut(&[W]) -> Result<(), StoreError>,
) -> UnitResults {
    let mut failed = std::collections::HashSet::new();
    units
        .iter()
        .map(|u| {
            if failed.contains(u.key) {
                return Err(StoreError::EarlierFailed(u.key.to_owned()));
            }
            let r = apply(u.writes);
            if r.is_err() {
                failed.insert(u.key);
            }
            r
        })
        .collect()
}

/// The relay's durable state.
pub trait RelayStore: UnitStore<RoomChange> {
    /// Every room that was live when the server stopped.
    fn load_rooms(&self) -> Result<Vec<StoredRoom>, StoreError>;
    /// One room as [`load_rooms`](Self::load_rooms) has it, or `None`: what
    /// a node taking a room over from another restores.
    fn load_room(&self, pin: &str) -> Result<Option<StoredRoom>, StoreError> {
        Ok(self.load_rooms()?.into_iter().find(|r| r.record.pin == pin))
    }
    /// Applies changes in order, all or nothing.
    fn apply(&self, changes: &[RoomChange]) -> Result<(), StoreError>;
    /// A room's bundle as stored (`None` before an upload or for an
    /// unknown room).
    fn load_bundle(&self, pin: &str) -> Result<Option<StoredBundle>, StoreError>;
}

impl StoreWrite for RoomChange {
    fn bytes(&self) -> usize {
        match self {
            RoomChange::Bundle { text, .. } => 128 + text.len(),
            _ => 256,
        }
    }
}

/// A connection behind a fair lock (the write connection's matters): every protocol has its own
/// store writer but they share this one connection, and a lock that lets
/// the writer that just finished a batch take it again at once would let
/// one protocol's flood hold another's writes back batch after batch. A
/// fair lock hands it to the writer that waited longest, so another
/// protocol waits at most for the batch being written.
struct FairConn(parking_lot::FairMutex<Connection>);

impl FairConn {
    fn new(conn: Connection) -> Self {
        Self(parking_lot::FairMutex::new(conn))
    }

    /// The connection, once every writer that waited before has had it (a
    /// fair lock is never poisoned).
    fn lock(
        &self,
    ) -> Result<parking_lot::FairMutexGuard<'_, Connection>, std::convert::Infallible> {
        Ok(self.0.lock())
    }
}

pub struct SqliteStore {
    conn: FairConn,
    /// When a commit is on disk: under [`SqliteSync::Full`] a commit
    /// waits for an fsync, so none is made on an async task
    /// ([`UnitStore::try_apply_units_now`] declines).
    sync: SqliteSync,
    /// The database file; `None` in memory.
    path: Option<std::path::PathBuf>,
    /// A second connection for bundle reads (WAL lets it read beside the
    /// writer), so that serving 8 MiB does not hold up writes. `None` for
    /// an in-memory database, which one connection alone can see.
    reader: Option<FairConn>,
    checkpoints: Checkpoints,
}

/// When a SQLite commit is on disk, SQLite's `synchronous` in WAL mode.
/// Either way the file stays consistent; what differs is what a crash of
/// the machine, not of the process, may take back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SqliteSync {
    /// `NORMAL`: a commit is in the WAL file (the operating system's
    /// cache) when it returns, with no fsync. A killed process loses
    /// nothing committed; a power cut or a kernel crash may take back the
    /// commits since the last checkpoint's fsync.
    #[default]
    Normal,
    /// `FULL`: the WAL is fsynced before a commit returns, so a power cut
    /// loses nothing committed. One fsync per commit (a batch of units is
    /// one commit); such commits are only made on blocking threads.
    Full,
}

impl SqliteSync {
    /// The value of SQLite's `synchronous` pragma.
    pub fn pragma(self) -> &'static str {
        match self {
            SqliteSync::Normal => "NORMAL",
            SqliteSync::Full => "FULL",
        }
    }
}

/// How long a blocking write waits for another process's lock on the
/// database file before it fails.
pub(crate) const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// About how many bytes of WAL make a checkpoint due: SQLite's own
/// automatic checkpoint comes at 1,000 pages (4 MiB).
pub const CHECKPOINT_AFTER_BYTES: usize = 4 * 1024 * 1024;
/// What one unit adds to the WAL besides its records' bytes: the pages a
/// commit rewrites (a table's and an index's leaf, at least).
const WAL_BYTES_PER_UNIT: usize = 8 * 1024;

/// WAL checkpoints only where blocking is expected. SQLite's automatic
/// checkpoint (writes back to the database file, two fsyncs) runs inside
/// whichever commit crosses its threshold; a commit made on an async task
/// ([`UnitStore::try_apply_units_now`]) must not be that one. So the
/// automatic checkpoint is off, the WAL's growth is counted here, and once
/// a checkpoint is due the next write goes the blocking way and runs it
/// after its commit. The WAL stays bounded: every write path counts.
struct Checkpoints {
    /// Estimated WAL bytes since the last checkpoint.
    pending: std::sync::atomic::AtomicUsize,
    /// `false` for an in-memory database (no WAL).
    wal: bool,
}

impl Checkpoints {
    fn new(wal: bool) -> Self {
        Self {
            pending: std::sync::atomic::AtomicUsize::new(0),
            wal,
        }
    }

    fn due(&self) -> bool {
        self.wal
            && self.pending.load(std::sync::atomic::Ordering::Relaxed) >= CHECKPOINT_AFTER_BYTES
    }

    fn count<W: StoreWrite>(&self, units: &[Unit<'_, W>]) {
        let bytes: usize = units
            .iter()
            .map(|u| WAL_BYTES_PER_UNIT + u.writes.iter().map(StoreWrite::bytes).sum::<usize>())
            .sum();
        self.pending
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts a commit and, on a blocking path with the write connection
    /// held, checkpoints if one is due. PASSIVE: it never waits for a
    /// reader; what it cannot copy yet, the next one does.
    fn after_commit<W: StoreWrite>(&self, conn: &Connection, units: &[Unit<'_, W>]) {
        self.count(units);
        if self.due() {
            match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                Ok(()) => self.pending.store(0, std::sync::atomic::Ordering::Relaxed),
                // Nothing is lost (the WAL holds every commit); the next
                // write tries again.
                Err(e) => tracing::warn!(error = %e, "WAL checkpoint failed"),
            }
        }
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS relay_rooms (
    pin TEXT PRIMARY KEY,
    host_token TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    host_away_since_ms INTEGER,
    open INTEGER NOT NULL,
    bundle_version INTEGER,
    bundle_app_name TEXT,
    bundle_text BLOB
);
CREATE TABLE IF NOT EXISTS relay_players (
    pin TEXT NOT NULL REFERENCES relay_rooms(pin) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    token TEXT NOT NULL,
    PRIMARY KEY (pin, id)
);
CREATE TABLE IF NOT EXISTS relay_kicked (
    pin TEXT NOT NULL REFERENCES relay_rooms(pin) ON DELETE CASCADE,
    token TEXT NOT NULL,
    PRIMARY KEY (pin, token)
);
";

/// The SQLite schema this hostwire writes, kept in the file's
/// `user_version` (0: a file from before versions were kept, whose tables
/// `open` brings up to date as it always did). Raise it with every change
/// of the tables; a hostwire that finds a higher one refuses the file.
pub const SQLITE_SCHEMA_VERSION: i64 = 3;

/// Creates or brings up to date every table, in one transaction that
/// holds the file's write lock (a second process opening the file waits),
/// after refusing a file whose schema is newer than this hostwire's.
fn migrate_sqlite(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > SQLITE_SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            database: "SQLite",
            found,
            known: SQLITE_SCHEMA_VERSION,
        });
    }
    tx.execute_batch(SCHEMA)?;
    playerthree::create_tables(&tx)?;
    ggui::create_tables(&tx)?;
    sessions::create_tables(&tx)?;
    tx.pragma_update(None, "user_version", SQLITE_SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

/// Each connection's page cache, as SQLite's `cache_size` (negative: in
/// KiB): 512 KiB each, where SQLite's default is 2 MiB. The writer's cache
/// fills with every page it writes (a relay player's row is about 100
/// bytes with its index entry), so at its default a server with 10,000
/// players held about 1.2 MB of them; the pages a write touches (a table's
/// last leaves, the indexes' inner pages) fit in far less, and a page
/// read again comes from the operating system's cache, not the disk.
const SQLITE_CACHE_SIZE: i64 = -512;

/// SQLite's `unix-excl` file system layer: this process holds the
/// database file's lock for as long as a connection is open, and the WAL
/// index lives in the process's memory instead of a `-shm` file. The data
/// directory's lock file already gives one server the file; what this
/// saves is the six `fcntl` calls each commit made on the `-shm` file's
/// locks (measured: 30-34 µs of system time per lone commit became 22).
/// Connections in this process share the index; another process opening
/// the file while the server runs gets "database is locked".
#[cfg(unix)]
const SQLITE_VFS: Option<&str> = Some("unix-excl");
#[cfg(not(unix))]
const SQLITE_VFS: Option<&str> = None;

fn open_file(path: &Path, flags: rusqlite::OpenFlags) -> rusqlite::Result<Connection> {
    match SQLITE_VFS {
        Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs),
        None => Connection::open_with_flags(path, flags),
    }
}

impl SqliteStore {
    /// Opens (or creates) the database file, its commits
    /// [`SqliteSync::Normal`].
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteSync::default())
    }

    /// Opens (or creates) the database file, its commits on disk as
    /// `sync` says.
    pub fn open_with(path: &Path, sync: SqliteSync) -> Result<Self, StoreError> {
        let conn = open_file(path, rusqlite::OpenFlags::default())?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", sync.pragma())?;
        // Checkpoints are run by [`Checkpoints`], never inside a commit.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.pragma_update(None, "cache_size", SQLITE_CACHE_SIZE)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mut conn = conn;
        migrate_sqlite(&mut conn)?;
        let reader = open_file(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        reader.pragma_update(None, "cache_size", SQLITE_CACHE_SIZE)?;
        reader.busy_timeout(BUSY_TIMEOUT)?;
        Ok(Self {
            conn: FairConn::new(conn),
            sync,
            path: Some(path.to_owned()),
            reader: Some(FairConn::new(reader)),
            checkpoints: Checkpoints::new(true),
        })
    }

    /// The database file; `None` in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// When this store's commits are on disk.
    pub fn sync(&self) -> SqliteSync {
        self.sync
    }

    /// An in-memory database, for tests of code that needs a store.
    pub fn in_memory() -> Result<Self, StoreError> {
        let mut conn = Connection::open_in_memory()?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrate_sqlite(&mut conn)?;
        Ok(Self {
            conn: FairConn::new(conn),
            sync: SqliteSync::default(),
            path: None,
            reader: None,
            checkpoints: Checkpoints::new(false),
        })
    }
}

impl RelayStore for SqliteStore {
    fn load_rooms(&self) -> Result<Vec<StoredRoom>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let mut rooms = Vec::new();
        let mut stmt = conn.prepare(
            "SELECT pin, host_token, created_at_ms, host_away_since_ms, open, bundle_version, bundle_app_name
             FROM relay_rooms ORDER BY created_at_ms",
        )?;
        let rows = stmt.query_map([], |r| {
            let version: Option<i64> = r.get(5)?;
            Ok(StoredRoom {
                record: RoomRecord {
                    pin: r.get(0)?,
                    host_token: r.get(1)?,
                    created_at_ms: r.get::<_, i64>(2)? as u64,
                    host_away_since_ms: r.get::<_, Option<i64>>(3)?.map(|t| t as u64),
                    open: r.get(4)?,
                    players: Vec::new(),
                    kicked_tokens: Vec::new(),
                    bundle: version.map(|v| BundleMeta {
                        version: v as u64,
                        app_name: r.get(6).ok().flatten(),
                    }),
                },
            })
        })?;
        for room in rows {
            rooms.push(room?);
        }
        let mut players =
            conn.prepare("SELECT id, name, token FROM relay_players WHERE pin = ?1 ORDER BY seq")?;
        let mut kicked = conn.prepare("SELECT token FROM relay_kicked WHERE pin = ?1")?;
        for room in &mut rooms {
            let pin = room.record.pin.clone();
            room.record.players = players
                .query_map([&pin], |r| {
                    Ok(PlayerRecord {
                        id: r.get(0)?,
                        name: r.get(1)?,
                        token: r.get(2)?,
                    })
                })?
                .collect::<Result<_, _>>()?;
            room.record.kicked_tokens = kicked
                .query_map([&pin], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
        }
        Ok(rooms)
    }

    fn apply(&self, changes: &[RoomChange]) -> Result<(), StoreError> {
        self.apply_all(changes, |tx, c| Ok(apply_change(tx, c)?))
    }

    fn load_bundle(&self, pin: &str) -> Result<Option<StoredBundle>, StoreError> {
        let conn = self
            .reader
            .as_ref()
            .unwrap_or(&self.conn)
            .lock()
            .map_err(|_| StoreError::Poisoned)?;
        // Read in place into a buffer of its size (reading it as a value
        // would hold it twice); the version and the bytes from one snapshot.
        let mut conn = conn;
        let tx = conn.transaction()?;
        let row: Option<(i64, Option<i64>, Option<i64>)> = tx
            .query_row(
                "SELECT rowid, bundle_version, length(bundle_text) FROM relay_rooms WHERE pin = ?1",
                [pin],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((rowid, Some(version), Some(len))) = row else {
            return Ok(None);
        };
        let blob = tx.blob_open(
            DatabaseName::Main,
            "relay_rooms",
            "bundle_text",
            rowid,
            true,
        )?;
        let mut text = vec![0; len.max(0) as usize];
        blob.read_at_exact(&mut text, 0)?;
        drop(blob);
        tx.commit()?;
        Ok(Some(StoredBundle {
            version: version as u64,
            text,
        }))
    }
}

impl UnitStore<RoomChange> for SqliteStore {
    fn apply_units(&self, units: &[Unit<'_, RoomChange>]) -> UnitResults {
        self.apply_units_with(units, |tx, c| Ok(apply_change(tx, c)?))
    }

    fn try_apply_units_now(&self, units: &[Unit<'_, RoomChange>]) -> Option<UnitResults> {
        self.try_apply_units_with(units, |tx, c| Ok(apply_change(tx, c)?))
    }
}

impl SqliteStore {
    /// Applies writes in order in one transaction, all or nothing.
    pub(crate) fn apply_all<W: StoreWrite>(
        &self,
        writes: &[W],
        apply: impl Fn(&Connection, &W) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let tx = conn.transaction()?;
        for w in writes {
            apply(&tx, w)?;
        }
        tx.commit()?;
        self.checkpoints
            .after_commit(&conn, &[Unit::new("", writes)]);
        Ok(())
    }

    /// One transaction (one commit for the whole batch), a savepoint per
    /// unit: a unit that fails is rolled back to its savepoint alone, and
    /// the later units with its key are not tried.
    pub(crate) fn apply_units_with<W: StoreWrite>(
        &self,
        units: &[Unit<'_, W>],
        apply: impl Fn(&Connection, &W) -> Result<(), StoreError>,
    ) -> UnitResults {
        let mut conn = match self.conn.lock() {
            Ok(c) => c,
            Err(_) => return units.iter().map(|_| Err(StoreError::Poisoned)).collect(),
        };
        let results = apply_units_on(&mut conn, units, apply);
        self.checkpoints.after_commit(&conn, units);
        results
    }

    /// [`apply_units_with`](Self::apply_units_with) if the write connection
    /// is free now; `None` if another writer holds it.
    pub(crate) fn try_apply_units_with<W: StoreWrite>(
        &self,
        units: &[Unit<'_, W>],
        apply: impl Fn(&Connection, &W) -> Result<(), StoreError>,
    ) -> Option<UnitResults> {
        if self.checkpoints.due() || self.sync == SqliteSync::Full {
            // A checkpoint's writes and fsyncs, and a commit's fsync,
            // belong on a blocking thread: let the caller take that path.
            return None;
        }
        let mut conn = self.conn.0.try_lock()?;
        // Never wait here: another process holding the database's write
        // lock sends the batch the blocking way, where waiting is fine.
        conn.busy_timeout(std::time::Duration::ZERO).ok()?;
        if let Ok(tx) = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
            // The write lock is held from here: no later statement waits.
            let _ = tx.busy_timeout(BUSY_TIMEOUT);
            let results = apply_units_in(tx, units, apply);
            self.checkpoints.count(units);
            return Some(results);
        }
        let _ = conn.busy_timeout(BUSY_TIMEOUT);
        None
    }
}

/// One transaction (one commit for the whole batch), a savepoint per unit.
fn apply_units_on<W>(
    conn: &mut Connection,
    units: &[Unit<'_, W>],
    apply: impl Fn(&Connection, &W) -> Result<(), StoreError>,
) -> UnitResults {
    let all_failed = |e: &rusqlite::Error, n: usize| -> UnitResults {
        (0..n).map(|_| Err(clone_error(e))).collect()
    };
    let tx = match conn.transaction() {
        Ok(t) => t,
        Err(e) => return all_failed(&e, units.len()),
    };
    apply_units_in(tx, units, apply)
}

/// The units in `tx`, a savepoint each, then the commit.
fn apply_units_in<W>(
    mut tx: rusqlite::Transaction<'_>,
    units: &[Unit<'_, W>],
    apply: impl Fn(&Connection, &W) -> Result<(), StoreError>,
) -> UnitResults {
    let all_failed = |e: &rusqlite::Error, n: usize| -> UnitResults {
        (0..n).map(|_| Err(clone_error(e))).collect()
    };
    if let [unit] = units {
        // One unit is the whole transaction: no savepoint to set and
        // release (a lone write's commit is most of its cost). A failed
        // write rolls the transaction back as it is dropped.
        let r = unit.writes.iter().try_for_each(|w| apply(&tx, w));
        if r.is_ok() {
            if let Err(e) = tx.commit() {
                return all_failed(&e, 1);
            }
        }
        return vec![r];
    }
    let mut failed = std::collections::HashSet::new();
    let mut results = Vec::with_capacity(units.len());
    for unit in units {
        if failed.contains(unit.key) {
            results.push(Err(StoreError::EarlierFailed(unit.key.to_owned())));
            continue;
        }
        let r = (|| -> Result<(), StoreError> {
            let sp = tx.savepoint()?;
            for w in unit.writes {
                apply(&sp, w)?;
            }
            sp.commit()?;
            Ok(())
        })();
        if r.is_err() {
            // The savepoint rolled back on drop; later units with the
            // same key must not land without this one.
            failed.insert(unit.key);
        }
        results.push(r);
    }
    if let Err(e) = tx.commit() {
        return all_failed(&e, units.len());
    }
    results
}

/// SQLite's error for each unit of a batch whose commit failed (the error
/// type is not `Clone`).
fn clone_error(e: &rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, m) => {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(*f, m.clone()))
        }
        other => StoreError::Commit(other.to_string()),
    }
}

fn apply_change(tx: &Connection, change: &RoomChange) -> Result<(), rusqlite::Error> {
    match change {
        RoomChange::Created(r) => {
            tx.execute(
                    "INSERT OR REPLACE INTO relay_rooms (pin, host_token, created_at_ms, host_away_since_ms, open)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![r.pin, r.host_token, r.created_at_ms as i64, r.host_away_since_ms.map(|t| t as i64), r.open],
                )?;
        }
        RoomChange::HostAway { pin, since_ms } => {
            tx.execute(
                "UPDATE relay_rooms SET host_away_since_ms = ?2 WHERE pin = ?1",
                params![pin, since_ms.map(|t| t as i64)],
            )?;
        }
        RoomChange::Open { pin, open } => {
            tx.execute(
                "UPDATE relay_rooms SET open = ?2 WHERE pin = ?1",
                params![pin, open],
            )?;
        }
        RoomChange::Player { pin, player } => {
            tx.execute(
                    "INSERT INTO relay_players (pin, seq, id, name, token)
                     VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM relay_players WHERE pin = ?1), ?2, ?3, ?4)
                     ON CONFLICT (pin, id) DO UPDATE SET name = excluded.name, token = excluded.token",
                    params![pin, player.id, player.name, player.token],
                )?;
        }
        RoomChange::Kicked {
            pin,
            player_id,
            token,
        } => {
            tx.execute(
                "DELETE FROM relay_players WHERE pin = ?1 AND id = ?2",
                params![pin, player_id],
            )?;
            tx.execute(
                "INSERT OR IGNORE INTO relay_kicked (pin, token) VALUES (?1, ?2)",
                params![pin, token],
            )?;
        }
        RoomChange::Bundle { pin, meta, text } => {
            // Written into a zero blob of its size, through SQLite's blob
            // I/O: binding it whole would have SQLite copy it twice (the
            // bound value, then the record), three bundles in memory.
            let rowid: Option<i64> = tx
                .query_row(
                    "UPDATE relay_rooms SET bundle_version = ?2, bundle_app_name = ?3, bundle_text = zeroblob(?4)
                     WHERE pin = ?1 RETURNING rowid",
                    params![pin, meta.version as i64, meta.app_name, text.len() as i64],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(rowid) = rowid {
                let mut blob = tx.blob_open(
                    DatabaseName::Main,
                    "relay_rooms",
                    "bundle_text",
                    rowid,
                    false,
                )?;
                blob.write_at(text, 0)?;
            }
        }
        RoomChange::Deleted { pin } => {
            tx.execute("DELETE FROM relay_rooms WHERE pin = ?1", params![pin])?;
        }
    }
    Ok(())
}

impl SqliteStore {
    /// The number of stored rooms (for tests and health checks).
    pub fn room_count(&self) -> Result<usize, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let n: Option<i64> = conn
            .query_row("SELECT COUNT(*) FROM relay_rooms", [], |r| r.get(0))
            .optional()?;
        Ok(n.unwrap_or(0) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    pub(crate) fn room(pin: &str) -> RoomRecord {
        RoomRecord {
            pin: pin.into(),
            host_token: "h".repeat(32),
            created_at_ms: 1_000,
            host_away_since_ms: Some(1_000),
            open: true,
            players: vec![],
            kicked_tokens: vec![],
            bundle: None,
        }
    }

    #[test]
    fn commits_on_the_async_path_leave_checkpoints_to_the_blocking_one_and_the_wal_stays_bounded() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-store-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("wal.db");
        let s = SqliteStore::open(&path).unwrap();
        s.apply(&[RoomChange::Created(room("111111"))]).unwrap();
        let (mut inline, mut blocking) = (0, 0);
        // 40 MiB of bundles, ten times the checkpoint threshold.
        for i in 0..400u64 {
            let change = [RoomChange::Bundle {
                pin: "111111".into(),
                meta: BundleMeta {
                    version: i + 1,
                    app_name: None,
                },
                text: Bytes::from(vec![b'x'; 100 * 1024]),
            }];
            let unit = [Unit {
                key: "111111",
                writes: &change,
                fence: None,
            }];
            let results = match s.try_apply_units_now(&unit) {
                Some(r) => {
                    inline += 1;
                    r
                }
                None => {
                    blocking += 1;
                    s.apply_units(&unit)
                }
            };
            assert!(results.iter().all(Result::is_ok));
        }
        // A due checkpoint sends about one write in 40 the blocking way.
        assert!(
            inline > 300 && blocking >= 9,
            "{inline} inline, {blocking} blocking"
        );
        let wal = std::fs::metadata(dir.path().join("wal.db-wal"))
            .unwrap()
            .len();
        assert!(
            wal < 3 * CHECKPOINT_AFTER_BYTES as u64,
            "the WAL grew to {wal} bytes"
        );
        assert_eq!(s.load_bundle("111111").unwrap().unwrap().version, 400);
    }

    #[test]
    fn the_async_path_never_waits_for_the_write_connection() {
        let s = SqliteStore::in_memory().unwrap();
        let change = [RoomChange::Created(room("111111"))];
        let unit = [Unit {
            key: "111111",
            writes: &change,
            fence: None,
        }];
        let held = s.conn.lock().unwrap();
        assert!(
            s.try_apply_units_now(&unit).is_none(),
            "waited or wrote under another writer's lock"
        );
        drop(held);
        assert!(s.try_apply_units_now(&unit).unwrap()[0].is_ok());
        assert_eq!(s.load_rooms().unwrap().len(), 1);
    }

    /// The WAL index lives in this process's memory (no `-shm` file, so no
    /// file locks on it per commit), and this process's connections share
    /// it: a second one sees what the store wrote.
    #[test]
    fn the_wal_index_is_the_processs_own_and_shared_by_its_connections() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-store-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("excl.db");
        let s = SqliteStore::open(&path).unwrap();
        s.apply(&[RoomChange::Created(room("111111"))]).unwrap();
        assert!(dir.path().join("excl.db-wal").exists());
        assert!(!dir.path().join("excl.db-shm").exists());
        let other = Connection::open(&path).unwrap();
        let rooms: i64 = other
            .query_row("SELECT COUNT(*) FROM relay_rooms", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rooms, 1);
        other
            .execute("UPDATE relay_rooms SET open = 0", [])
            .unwrap();
        assert!(!s.load_rooms().unwrap()[0].record.open);
    }

    #[test]
    fn the_async_path_never_waits_for_another_connections_lock_on_the_file() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-store-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("locked.db");
        let s = SqliteStore::open(&path).unwrap();
        let change = [RoomChange::Created(room("111111"))];
        let unit = [Unit {
            key: "111111",
            writes: &change,
            fence: None,
        }];
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE;").unwrap();
        // Without a zero busy timeout this waits 5 s and answers an error.
        assert!(s.try_apply_units_now(&unit).is_none());
        other.execute_batch("ROLLBACK;").unwrap();
        assert!(s.try_apply_units_now(&unit).unwrap()[0].is_ok());
        assert_eq!(s.load_rooms().unwrap().len(), 1);
    }

    #[test]
    fn full_sync_commits_are_fsynced_and_never_made_on_an_async_task() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-store-")
            .tempdir()
            .unwrap();
        let synchronous = |s: &SqliteStore| -> i64 {
            s.conn
                .lock()
                .unwrap()
                .query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap()
        };
        let change = [RoomChange::Created(room("222222"))];
        let unit = [Unit {
            key: "222222",
            writes: &change,
            fence: None,
        }];
        // NORMAL (1), the default: a lone unit is committed where it is asked.
        let normal = SqliteStore::open(&dir.path().join("normal.db")).unwrap();
        assert_eq!(
            (normal.sync(), synchronous(&normal)),
            (SqliteSync::Normal, 1)
        );
        assert!(normal.try_apply_units_now(&unit).unwrap()[0].is_ok());
        // FULL (2): the commit waits for an fsync, so only the blocking way.
        let path = dir.path().join("full.db");
        let full = SqliteStore::open_with(&path, SqliteSync::Full).unwrap();
        assert_eq!((full.sync(), synchronous(&full)), (SqliteSync::Full, 2));
        assert!(full.try_apply_units_now(&unit).is_none());
        assert!(full.apply_units(&unit)[0].is_ok());
        drop(full);
        let again = SqliteStore::open_with(&path, SqliteSync::Full).unwrap();
        assert_eq!(again.load_rooms().unwrap().len(), 1);
    }

    #[test]
    fn a_file_stores_page_caches_are_bounded() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-store-")
            .tempdir()
            .unwrap();
        let s = SqliteStore::open(&dir.path().join("cache.db")).unwrap();
        let size =
            |c: &Connection| -> i64 { c.query_row("PRAGMA cache_size", [], |r| r.get(0)).unwrap() };
        assert_eq!(size(&s.conn.lock().unwrap()), SQLITE_CACHE_SIZE);
        let reader = s.reader.as_ref().unwrap();
        assert_eq!(size(&reader.lock().unwrap()), SQLITE_CACHE_SIZE);
    }
}
