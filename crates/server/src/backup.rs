//! `GET /admin/backup`: a consistent copy of the server's SQLite database,
//! made while it runs, for the operator.
//!
//! The file is locked to the server's process (`unix-excl`), so no other
//! process can copy it safely while it runs; this endpoint makes the copy
//! in the process (`SqliteStore::backup_to`: one read transaction, writes
//! go on beside it) and sends it as the answer's body. The copy is made
//! beside the database ([`BACKUP_FILE`]), opened, and removed from the
//! directory at once: its disk space is freed when the answer ends, and
//! nothing of it stays behind.

use crate::http::{json_response, Presented};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::{Bytes, BytesMut};
use hostwire_store::SqliteStore;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Bytes of the copy read and handed to the client at a time.
pub const BACKUP_CHUNK_BYTES: usize = 64 * 1024;
/// Chunks read ahead of the client, at most: a download holds at most
/// 2 × 64 KiB of memory, however large the database.
const CHUNKS_AHEAD: usize = 2;
/// How long a client may take to accept the next chunk; then the download
/// is cut off (the answer ends short of its `Content-Length`), its copy's
/// space is freed and the next backup may begin.
pub const BACKUP_SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// The copy's name beside the database while it is made (a leftover of a
/// server killed meanwhile is removed at the next start or backup).
pub const BACKUP_FILE: &str = "hostwire.db.backup";

/// The endpoint's state.
pub struct Backup {
    /// `None`: the database is not a SQLite file (PostgreSQL).
    store: Option<Arc<SqliteStore>>,
    /// One backup at a time, from the copy's start to its last byte sent:
    /// each holds a whole copy on disk.
    one: Arc<Semaphore>,
}

impl Backup {
    /// The endpoint for `store`'s file; a copy left beside it by a server
    /// killed mid-backup, or by a `hostwire restore` cut off, is removed
    /// now (this process holds the data directory, so neither is under
    /// way).
    pub fn new(store: Option<Arc<SqliteStore>>) -> Arc<Backup> {
        if let Some(db) = store.as_ref().and_then(|s| s.path()) {
            let _ = std::fs::remove_file(db.with_file_name(BACKUP_FILE));
            // And the copy of a `hostwire restore` cut off.
            let _ = hostwire_store::remove_restore_leftovers(db);
        }
        Arc::new(Backup {
            store,
            one: Arc::new(Semaphore::new(1)),
        })
    }
}

pub fn router(b: Arc<Backup>) -> Router {
    Router::new()
        .route("/admin/backup", get(backup))
        .with_state(b)
}

fn refusal(status: StatusCode, error: String) -> Response {
    json_response(status, &json!({ "error": error }))
}

async fn backup(State(b): State<Arc<Backup>>, who: Presented) -> Response {
    if let Err(r) = who.operator() {
        return r.response("the operator credential (HOSTWIRE_OPERATOR_TOKEN)");
    }
    let Some(store) = b.store.clone() else {
        return refusal(
            StatusCode::CONFLICT,
            "this server's database is not its SQLite file (it runs on PostgreSQL, HOSTWIRE_POSTGRES_URL): back that up with PostgreSQL's own tools (pg_dump, a base backup)".into(),
        );
    };
    let Ok(permit) = Arc::clone(&b.one).try_acquire_owned() else {
        let mut r = refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "a backup is already being made or sent; one runs at a time".into(),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return r;
    };
    let Some(copy) = store.path().map(|p| p.with_file_name(BACKUP_FILE)) else {
        return refusal(
            StatusCode::CONFLICT,
            "this server's database is in memory: there is no file to copy".into(),
        );
    };
    let made = crate::blocking::spawn({
        let copy = copy.clone();
        move || {
            // Left by a server killed during a backup: replaced.
            let _ = std::fs::remove_file(&copy);
            store.backup_to(&copy)
        }
    })
    .await;
    let bytes = match made {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            return refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the copy could not be made: {}", e.reason()),
            )
        }
        Err(_) => {
            return refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the copy's task failed".into(),
            )
        }
    };
    let file = tokio::fs::File::open(&copy).await;
    // Open or not, the copy leaves the directory now.
    let _ = tokio::fs::remove_file(&copy).await;
    let file = match file {
        Ok(f) => f,
        Err(e) => {
            return refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the copy could not be read: {e}"),
            )
        }
    };
    let (tx, rx) = mpsc::channel(CHUNKS_AHEAD);
    tokio::spawn(send_copy(file, tx, permit));
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.sqlite3"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes));
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"hostwire.db\""),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Hands the copy to the answer a chunk at a time, and ends (freeing the
/// copy and `_one`) when it is sent, when the client is gone, or when it
/// took more than [`BACKUP_SEND_TIMEOUT`] to accept a chunk.
async fn send_copy(
    mut file: tokio::fs::File,
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    _one: OwnedSemaphorePermit,
) {
    loop {
        let mut buf = BytesMut::zeroed(BACKUP_CHUNK_BYTES);
        let chunk = match file.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => {
                buf.truncate(n);
                Ok(buf.freeze())
            }
            Err(e) => Err(e),
        };
        let last = chunk.is_err();
        match tokio::time::timeout(BACKUP_SEND_TIMEOUT, tx.send(chunk)).await {
            Ok(Ok(())) if !last => {}
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_cut_off_and_frees_the_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("copy");
        std::fs::write(&path, vec![7u8; BACKUP_CHUNK_BYTES * 8]).unwrap();
        let file = tokio::fs::File::open(&path).await.unwrap();
        let one = Arc::new(Semaphore::new(1));
        let permit = Arc::clone(&one).try_acquire_owned().unwrap();
        let (tx, mut rx) = mpsc::channel(CHUNKS_AHEAD);
        let task = tokio::spawn(send_copy(file, tx, permit));
        // The client takes one chunk, then stops reading.
        let first = rx.recv().await.unwrap().unwrap();
        assert_eq!(first.len(), BACKUP_CHUNK_BYTES);
        assert_eq!(one.available_permits(), 0, "the download holds the slot");
        // The paused clock runs to the sender's deadline: it gives up.
        tokio::time::timeout(BACKUP_SEND_TIMEOUT * 2, task)
            .await
            .expect("the sender gave up at its deadline")
            .unwrap();
        assert_eq!(one.available_permits(), 1, "the slot is free again");
        // What was read ahead is all the client gets: the answer ends short.
        let mut chunks = 1;
        while let Some(c) = rx.recv().await {
            c.unwrap();
            chunks += 1;
        }
        assert_eq!(chunks, 1 + CHUNKS_AHEAD);
    }
}
