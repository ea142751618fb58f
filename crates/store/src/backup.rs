//! A consistent copy of a running server's SQLite file.
//!
//! While the server runs its file is locked to its process (`unix-excl`),
//! so no other process (the `sqlite3` shell, a backup tool) can read it.
//! The copy is made in the process, on a connection of its own: SQLite's
//! `VACUUM INTO` reads the whole database in one read transaction (a
//! snapshot: writes go on beside it and are not in the copy) and writes a
//! compact file, in rollback-journal mode, that opens on its own.

use crate::{open_file, SqliteStore, StoreError, BUSY_TIMEOUT};
use std::path::Path;

impl SqliteStore {
    /// Writes a consistent copy of the database to `dest`, a file this
    /// makes (it must not exist yet); returns its size in bytes. Blocking: as
    /// long as reading the database and writing the copy take. Nothing of
    /// a copy that failed is left at `dest`.
    pub fn backup_to(&self, dest: &Path) -> Result<u64, StoreError> {
        let Some(path) = &self.path else {
            return Err(StoreError::Backup(
                "an in-memory database has no file to copy".into(),
            ));
        };
        let Some(to) = dest.to_str() else {
            return Err(StoreError::Backup(format!(
                "{} is not a UTF-8 path",
                dest.display()
            )));
        };
        // Made here, empty, so that an existing file is never written
        // over and a failed copy removes only what it made.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dest)
            .map_err(|e| StoreError::Backup(format!("{}: {e}", dest.display())))?;
        let made = (|| {
            let conn = open_file(
                path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            conn.busy_timeout(BUSY_TIMEOUT)?;
            conn.execute("VACUUM INTO ?1", [to])?;
            Ok::<_, rusqlite::Error>(())
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_file(dest);
            return Err(e.into());
        }
        std::fs::metadata(dest)
            .map(|m| m.len())
            .map_err(|e| StoreError::Backup(format!("{}: {e}", dest.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RelayStore, RoomChange, Unit, UnitStore};

    #[test]
    fn a_copy_holds_what_was_committed_and_opens_on_its_own() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-backup-")
            .tempdir()
            .unwrap();
        let s = SqliteStore::open(&dir.path().join("live.db")).unwrap();
        let change = [RoomChange::Created(crate::tests::room("333333"))];
        assert!(s.apply_units(&[Unit::new("333333", &change[..])])[0].is_ok());
        let copy = dir.path().join("copy.db");
        let bytes = s.backup_to(&copy).unwrap();
        assert_eq!(bytes, std::fs::metadata(&copy).unwrap().len());
        // A write after the copy is not in it; the copy is a file of its
        // own, readable while the live store stays open.
        let later = [RoomChange::Created(crate::tests::room("444444"))];
        assert!(s.apply_units(&[Unit::new("444444", &later[..])])[0].is_ok());
        let restored = SqliteStore::open(&copy).unwrap();
        let pins: Vec<String> = restored
            .load_rooms()
            .unwrap()
            .into_iter()
            .map(|r| r.record.pin)
            .collect();
        assert_eq!(pins, ["333333"]);
        // An existing file is never overwritten, and a failed copy leaves
        // nothing behind.
        assert!(matches!(s.backup_to(&copy), Err(StoreError::Backup(_))));
        assert!(copy.exists(), "the earlier copy was kept");
        let nowhere = dir.path().join("missing-dir/copy.db");
        assert!(s.backup_to(&nowhere).is_err());
        assert!(!nowhere.exists());
        assert!(matches!(
            SqliteStore::in_memory()
                .unwrap()
                .backup_to(&dir.path().join("m.db")),
            Err(StoreError::Backup(_))
        ));
    }
}
