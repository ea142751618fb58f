//! A backup put back as a data directory's database, with the server
//! stopped (`hostwire restore`).
//!
//! Copying the file by hand has two traps: a `-wal` (or `-journal`) left
//! beside the database belongs to the file it was written for, and SQLite
//! would apply it to the copy put in its place; and the database replaced
//! is gone, with whatever it held that the copy does not. Here the copy is
//! checked before anything is touched, the file it replaces is kept whole
//! under a new name (with its WAL beside it), and the copy takes the
//! database's name in one rename: a restore cut off at any point leaves
//! the old database or the new one under the name, never neither, and
//! never the copy with the old file's WAL.

use crate::{lock_data_dir, DirLockError, SQLITE_SCHEMA_VERSION};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};

/// What a restore did.
#[derive(Debug)]
pub struct Restored {
    /// The copy's size in bytes, as it now lies under the database's name.
    pub bytes: u64,
    /// The copy's schema version (`user_version`).
    pub schema_version: i64,
    /// Where the database it replaced is kept (`None`: there was none).
    pub replaced: Option<PathBuf>,
}

/// Why a restore was refused; nothing in the data directory was changed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Lock(#[from] DirLockError),
    #[error("{path} cannot be restored: {reason}")]
    Unusable { path: String, reason: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> RestoreError {
    move |source| RestoreError::Io { what, source }
}

/// `path` with `suffix` appended to its file name (`hostwire.db` →
/// `hostwire.db-wal`), as SQLite names a database's companions.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// SQLite's companion files of a database.
const COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// What a restore's copy is called beside the database while it is
/// checked (`hostwire.db.restore`).
const STAGED: &str = ".restore";

/// The restore's copy beside the database `live`, and its companions.
fn staged_names(live: &Path) -> [PathBuf; 4] {
    let staged = beside(live, STAGED);
    let [wal, shm, journal] = COMPANIONS.map(|c| beside(&staged, c));
    [staged, wal, shm, journal]
}

/// Removes the copy (and its companions) that a restore cut off (`kill
/// -9`, the machine stopped) left beside the database `live`. Only for a
/// holder of the data directory's lock: a server at its start.
pub fn remove_restore_leftovers(live: &Path) -> std::io::Result<()> {
    staged_names(live)
        .iter()
        .try_for_each(|p| remove_file_if_there(p))
}

fn remove_file_if_there(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn remove_if_there(path: &Path) -> Result<(), RestoreError> {
    remove_file_if_there(path).map_err(io(format!("removing {}", path.display())))
}

/// Puts `backup` (a copy made by `GET /admin/backup`, or a database file
/// with its `-wal` beside it, as a stopped server left them) in place as
/// `dir/file`, holding the data directory's lock throughout: refused while
/// a server uses the directory. The directory is made if missing.
pub fn restore_into(dir: &Path, file: &str, backup: &Path) -> Result<Restored, RestoreError> {
    let shown = backup.display().to_string();
    let unusable = |reason: String| RestoreError::Unusable {
        path: shown.clone(),
        reason,
    };
    let meta = std::fs::metadata(backup).map_err(|e| unusable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unusable("not a file".into()));
    }
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let _lock = lock_data_dir(dir)?;
    let live = dir.join(file);
    let staged = beside(&live, STAGED);
    // The names a restore clears are never the backup's own.
    let backup_at = std::fs::canonicalize(backup).map_err(|e| unusable(e.to_string()))?;
    for name in staged_names(&live) {
        if std::fs::canonicalize(&name).is_ok_and(|p| p == backup_at) {
            return Err(unusable(format!(
                "{} is where a restore puts its copy while checking it: move the backup elsewhere first",
                name.display()
            )));
        }
    }
    // A restore cut off earlier may have left its copy.
    remove_restore_leftovers(&live).map_err(io(format!("removing {}", staged.display())))?;
    let result = (|| {
        copy_synced(backup, &staged)?;
        let wal = beside(backup, "-wal");
        if wal.exists() {
            copy_synced(&wal, &beside(&staged, "-wal"))?;
        }
        let schema_version = check_and_fold(&staged).map_err(unusable)?;
        if beside(&staged, "-wal").exists() {
            return Err(unusable("its WAL could not be folded into it".into()));
        }
        sync_file(&staged)?;
        Ok(schema_version)
    })();
    let schema_version = match result {
        Ok(v) => v,
        Err(e) => {
            let _ = remove_restore_leftovers(&live);
            return Err(e);
        }
    };
    let replaced = if live.exists() {
        Some(keep_replaced(&live)?)
    } else {
        None
    };
    // Companions of the replaced file must not meet the copy.
    for c in COMPANIONS {
        remove_if_there(&beside(&live, c))?;
    }
    std::fs::rename(&staged, &live).map_err(io(format!(
        "renaming {} to {}",
        staged.display(),
        live.display()
    )))?;
    sync_dir(dir)?;
    let bytes = std::fs::metadata(&live)
        .map_err(io(format!("reading {}", live.display())))?
        .len();
    Ok(Restored {
        bytes,
        schema_version,
        replaced,
    })
}

fn copy_synced(from: &Path, to: &Path) -> Result<(), RestoreError> {
    let what = || format!("copying {} to {}", from.display(), to.display());
    let mut src = std::fs::File::open(from).map_err(io(what()))?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(io(what()))?;
    std::io::copy(&mut src, &mut dst).map_err(io(what()))?;
    dst.sync_all().map_err(io(what()))
}

fn sync_file(path: &Path) -> Result<(), RestoreError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("syncing {}", path.display())))
}

/// The directory's entries (the renames) on disk.
fn sync_dir(dir: &Path) -> Result<(), RestoreError> {
    #[cfg(unix)]
    {
        sync_file(dir)
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Checks that the staged copy is a whole hostwire database this hostwire
/// can run on, and folds its WAL (if it came with one) into the file.
/// Returns its schema version.
fn check_and_fold(path: &Path) -> Result<i64, String> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| e.to_string())?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if version > SQLITE_SCHEMA_VERSION {
        return Err(format!(
            "its schema is version {version}, newer than this hostwire knows (version {SQLITE_SCHEMA_VERSION}): restore it with the hostwire that made it"
        ));
    }
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'relay_rooms'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    if tables == 0 {
        return Err("it is an SQLite file without hostwire's tables".into());
    }
    let check: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if check != "ok" {
        return Err(format!("SQLite's check of it failed: {check}"));
    }
    fold_wal(&conn)?;
    conn.close().map_err(|(_, e)| e.to_string())?;
    Ok(version)
}

/// Copies every committed page of a WAL-mode file's `-wal` into the file
/// and empties the WAL (closing the connection then removes it).
fn fold_wal(conn: &Connection) -> Result<(), String> {
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Ok(());
    }
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if busy != 0 {
        return Err("its WAL could not be checkpointed (busy)".into());
    }
    Ok(())
}

/// Keeps the database about to be replaced as
/// `FILE.replaced-YYYYMMDDTHHMMSSZ`, with its `-wal` beside it as
/// `…-wal` (hard links: the live names keep both until the copy takes the
/// name). The pair opens as the database did, with every commit in it.
/// Linked before the file is opened: SQLite, opening a damaged database,
/// removes the WAL beside it on close. Returns the new name.
fn keep_replaced(live: &Path) -> Result<PathBuf, RestoreError> {
    let stamp = utc_stamp();
    let mut kept = beside(live, &format!(".replaced-{stamp}"));
    let mut n = 1;
    while kept.exists() || beside(&kept, "-wal").exists() {
        n += 1;
        kept = beside(live, &format!(".replaced-{stamp}-{n}"));
    }
    let link = |from: &Path, to: &Path| {
        std::fs::hard_link(from, to).map_err(io(format!(
            "keeping {} as {}",
            from.display(),
            to.display()
        )))
    };
    let wal = beside(live, "-wal");
    let kept_wal = beside(&kept, "-wal");
    if wal.exists() {
        link(&wal, &kept_wal)?;
    }
    link(live, &kept)?;
    // A healthy file gets its WAL folded in (the same files under both
    // names), so that nothing is lost if the restore stops between
    // removing the live WAL and the rename. A damaged one is left as it
    // is: its WAL stays under the kept name whatever SQLite does to the
    // live one.
    let folded = Connection::open_with_flags(
        live,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| e.to_string())
    .and_then(|c| {
        fold_wal(&c)?;
        c.close().map_err(|(_, e)| e.to_string())
    })
    .is_ok();
    if folded && std::fs::metadata(&kept_wal).is_ok_and(|m| m.len() == 0) {
        remove_if_there(&kept_wal)?;
    }
    Ok(kept)
}

/// Now in UTC as `20261205T031500Z`, by SQLite's own clock functions.
fn utc_stamp() -> String {
    Connection::open_in_memory()
        .and_then(|c| c.query_row("SELECT strftime('%Y%m%dT%H%M%SZ', 'now')", [], |r| r.get(0)))
        .unwrap_or_else(|_| "unknown-time".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RelayStore, RoomChange, SqliteStore, Unit, UnitStore};

    fn pins(path: &Path) -> Vec<String> {
        SqliteStore::open(path)
            .unwrap()
            .load_rooms()
            .unwrap()
            .into_iter()
            .map(|r| r.record.pin)
            .collect()
    }

    fn with_room(path: &Path, pin: &str) -> SqliteStore {
        let s = SqliteStore::open(path).unwrap();
        let change = [RoomChange::Created(crate::tests::room(pin))];
        assert!(s.apply_units(&[Unit::new(pin, &change[..])])[0].is_ok());
        s
    }

    #[test]
    fn a_copy_replaces_the_database_which_is_kept_with_its_wal() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-restore-")
            .tempdir()
            .unwrap();
        let running = dir.path().join("running");
        std::fs::create_dir_all(&running).unwrap();
        let db = running.join("hostwire.db");
        let backup = dir.path().join("copy.db");
        let s = with_room(&db, "111111");
        s.backup_to(&backup).unwrap();
        // The database goes on after the copy. What a server killed now
        // leaves: the later room in the WAL only, beside the file.
        let change = [RoomChange::Created(crate::tests::room("222222"))];
        assert!(s.apply_units(&[Unit::new("222222", &change[..])])[0].is_ok());
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let live = data.join("hostwire.db");
        for name in ["hostwire.db", "hostwire.db-wal"] {
            std::fs::copy(running.join(name), data.join(name)).unwrap();
        }
        drop(s);
        assert!(std::fs::metadata(beside(&live, "-wal")).unwrap().len() > 0);
        // Refused while the directory is a server's.
        let held = lock_data_dir(&data).unwrap();
        assert!(matches!(
            restore_into(&data, "hostwire.db", &backup),
            Err(RestoreError::Lock(DirLockError::InUse(_)))
        ));
        drop(held);

        let done = restore_into(&data, "hostwire.db", &backup).unwrap();
        assert_eq!(done.schema_version, SQLITE_SCHEMA_VERSION);
        assert_eq!(done.bytes, std::fs::metadata(&live).unwrap().len());
        // No stale WAL beside the copy; the copy's rooms are the live ones.
        assert!(!beside(&live, "-wal").exists());
        assert_eq!(pins(&live), ["111111"]);
        // The database it replaced holds both rooms, the later one from
        // its WAL.
        let kept = done.replaced.unwrap();
        let mut old = pins(&kept);
        old.sort();
        assert_eq!(old, ["111111", "222222"]);
        assert!(!data.join("hostwire.db.restore").exists());
    }

    #[test]
    fn what_is_not_a_whole_hostwire_database_is_refused_and_nothing_changes() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-restore-")
            .tempdir()
            .unwrap();
        let data = dir.path().join("data");
        let live = data.join("hostwire.db");
        std::fs::create_dir_all(&data).unwrap();
        drop(with_room(&live, "333333"));
        let whole = dir.path().join("whole.db");
        SqliteStore::open(&live).unwrap().backup_to(&whole).unwrap();
        let files = || {
            let mut all: Vec<(String, Vec<u8>)> = std::fs::read_dir(&data)
                .unwrap()
                .map(|e| e.unwrap())
                .map(|e| {
                    (
                        e.file_name().into_string().unwrap(),
                        std::fs::read(e.path()).unwrap(),
                    )
                })
                .collect();
            all.sort();
            all
        };
        let before = files();
        let reason = |backup: &Path| match restore_into(&data, "hostwire.db", backup) {
            Err(RestoreError::Unusable { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a database at all, just some text").unwrap();
        assert!(
            reason(&text).contains("not a database"),
            "{}",
            reason(&text)
        );
        let other = dir.path().join("other.db");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        assert!(reason(&other).contains("without hostwire's tables"));
        let newer = dir.path().join("newer.db");
        drop(with_room(&newer, "444444"));
        Connection::open(&newer)
            .unwrap()
            .pragma_update(None, "user_version", SQLITE_SCHEMA_VERSION + 1)
            .unwrap();
        assert!(reason(&newer).contains("newer than this hostwire"));
        // A file cut short (a download that stopped halfway).
        let bytes = std::fs::read(&whole).unwrap();
        let cut = dir.path().join("cut.db");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        assert!(!reason(&cut).is_empty());
        assert!(reason(&dir.path().join("missing.db")).contains("No such file"));
        // A backup under the name a restore stages its copy under is not
        // removed as a leftover.
        let staged = data.join("hostwire.db.restore");
        std::fs::copy(&whole, &staged).unwrap();
        assert!(reason(&staged).contains("move the backup elsewhere"));
        assert_eq!(std::fs::read(&staged).unwrap(), bytes);
        std::fs::remove_file(&staged).unwrap();
        // The directory is as it was (the lock file aside, made by the
        // first attempt): no copy left, the database and its WAL as they
        // were.
        let after: Vec<_> = files()
            .into_iter()
            .filter(|(n, _)| n != "hostwire.lock")
            .collect();
        assert!(before.iter().any(|(n, _)| n == "hostwire.db"));
        assert_eq!(after, before);
    }

    #[test]
    fn a_damaged_database_is_kept_with_its_wal_beside_it() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-restore-")
            .tempdir()
            .unwrap();
        let backup = dir.path().join("copy.db");
        drop(with_room(&dir.path().join("src.db"), "555555"));
        SqliteStore::open(&dir.path().join("src.db"))
            .unwrap()
            .backup_to(&backup)
            .unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let live = data.join("hostwire.db");
        std::fs::write(&live, b"a damaged database ".repeat(300)).unwrap();
        std::fs::write(beside(&live, "-wal"), b"its WAL").unwrap();
        let done = restore_into(&data, "hostwire.db", &backup).unwrap();
        assert_eq!(pins(&live), ["555555"]);
        let kept = done.replaced.unwrap();
        assert_eq!(
            std::fs::read(&kept).unwrap(),
            b"a damaged database ".repeat(300)
        );
        assert_eq!(std::fs::read(beside(&kept, "-wal")).unwrap(), b"its WAL");
    }
}
