//! `GET /admin/backup` as an operator meets it: the real binary on its
//! SQLite file, a copy of what was acknowledged taken while it serves,
//! refused without the operator credential, nothing left in the data
//! directory; refused with a reason where there is no file to copy; and
//! `hostwire restore` putting a copy back with the server stopped.

use crate::support::http::call;
use crate::support::process::Process;
use crate::support::relay::{temp_dir, TestRelay};
use crate::support::server::{relay_config, OPERATOR};
use hostwire::http::AllowedOrigins;
use hostwire_store::{RelayStore, SqliteStore};

async fn backup(http: &str, token: Option<&str>) -> reqwest::Response {
    let mut r = reqwest::Client::new().get(format!("{http}/admin/backup"));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    r.send().await.unwrap()
}

/// The rooms of a database file, by PIN in order.
fn pins(path: &std::path::Path) -> Vec<String> {
    let mut pins: Vec<String> = SqliteStore::open(path)
        .unwrap()
        .load_rooms()
        .unwrap()
        .into_iter()
        .map(|r| r.record.pin)
        .collect();
    pins.sort();
    pins
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_servers_database_is_copied_for_the_operator_and_nothing_stays_behind() {
    let dir = temp_dir("backup");
    let data = dir.path().join("data");
    // A copy a server killed mid-backup left: removed at the start.
    std::fs::create_dir_all(&data).unwrap();
    let leftover = data.join(hostwire::backup::BACKUP_FILE);
    std::fs::write(&leftover, b"half a copy").unwrap();
    let server = Process::serve(&data, &[], &[("HOSTWIRE_OPERATOR_TOKEN", OPERATOR)]);
    assert!(
        !leftover.exists(),
        "the leftover copy is removed at the start"
    );
    let http = server.http();
    let (status, room) = call("POST", &format!("{http}/api/rooms"), None, None).await;
    assert_eq!(status, 201, "{room}");
    let pin = room["pin"].as_str().unwrap().to_owned();

    // Without the operator credential, or with another: 401, no copy.
    assert_eq!(backup(&http, None).await.status(), 401);
    assert_eq!(
        backup(&http, Some("not-the-operator-credential"))
            .await
            .status(),
        401
    );
    // One left while it runs (it cannot be: the process holds the
    // directory) is replaced, not in the way.
    std::fs::write(&leftover, b"half a copy").unwrap();

    let r = backup(&http, Some(OPERATOR)).await;
    assert_eq!(r.status(), 200);
    let header = |n: &str| r.headers()[n].to_str().unwrap().to_owned();
    assert_eq!(header("content-type"), "application/vnd.sqlite3");
    assert_eq!(header("cache-control"), "no-store");
    assert!(header("content-disposition").starts_with("attachment;"));
    let length: usize = header("content-length").parse().unwrap();
    let body = r.bytes().await.unwrap();
    assert_eq!(body.len(), length);
    assert!(body.starts_with(b"SQLite format 3\0"));

    // The copy opens on its own and holds the room that was acknowledged.
    let copy = dir.path().join("copy.db");
    std::fs::write(&copy, &body).unwrap();
    assert_eq!(pins(&copy), std::slice::from_ref(&pin));
    // Nothing of the copy is left beside the database, and the server
    // goes on serving the room.
    assert!(!leftover.exists());
    let found = reqwest::get(format!("{http}/api/rooms/{pin}"))
        .await
        .unwrap();
    assert_eq!(found.status(), 200);
    // A second backup after the first: the one-at-a-time slot was freed.
    assert_eq!(backup(&http, Some(OPERATOR)).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_its_own_file_says_so() {
    // The test server keeps only the relay's rooms in its file, with the
    // other protocols in memory: no single file holds its state.
    let relay = TestRelay::start(relay_config(AllowedOrigins::Any)).await;
    let r = backup(&relay.http, Some(OPERATOR)).await;
    assert_eq!(r.status(), 409);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("pg_dump"),
        "{body}"
    );
}

/// `hostwire restore` on `data` from `backup`: its exit code and output.
async fn restore(data: &std::path::Path, backup: &std::path::Path) -> (Option<i32>, String) {
    let out = tokio::time::timeout(
        crate::support::server::GUARD,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire"))
            .arg("restore")
            .arg(backup)
            .arg("--data-dir")
            .arg(data)
            .env_remove("HOSTWIRE_POSTGRES_URL")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("restore did not end")
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_is_restored_with_the_server_stopped_and_the_replaced_database_kept() {
    let dir = temp_dir("restore");
    let data = dir.path().join("data");
    let mut server = Process::serve(&data, &[], &[("HOSTWIRE_OPERATOR_TOKEN", OPERATOR)]);
    let http = server.http();
    let room = |http: String| async move {
        let (status, room) = call("POST", &format!("{http}/api/rooms"), None, None).await;
        assert_eq!(status, 201, "{room}");
        room["pin"].as_str().unwrap().to_owned()
    };
    let before = room(http.clone()).await;
    let copy = dir.path().join("copy.db");
    let r = backup(&http, Some(OPERATOR)).await;
    assert_eq!(r.status(), 200);
    std::fs::write(&copy, r.bytes().await.unwrap()).unwrap();
    let after = room(http.clone()).await;

    // Refused while the server runs, naming why; nothing changed.
    let (code, text) = restore(&data, &copy).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("another hostwire server is using"), "{text}");
    assert!(text.contains("nothing was changed"), "{text}");
    // A file that is not a backup is refused too.
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, "<html>not found</html>".repeat(100)).unwrap();
    server.kill_9();
    let (code, text) = restore(&data, &junk).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("not a database"), "{text}");

    // A server on PostgreSQL would not read the file: refused.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hostwire"))
        .arg("restore")
        .arg(&copy)
        .arg("--data-dir")
        .arg(&data)
        .env(
            "HOSTWIRE_POSTGRES_URL",
            "postgres://hostwire@127.0.0.1/hostwire",
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("pg_restore"));

    // Stopped hard (its last room in the WAL only), then restored.
    let (code, text) = restore(&data, &copy).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("restored"), "{text}");
    let kept = text
        .lines()
        .find_map(|l| l.strip_prefix("the database it replaced is kept as "))
        .unwrap_or_else(|| panic!("{text}"))
        .to_owned();

    // The server starts on the copy: the room from before the backup is
    // there, the later one is not. The copy of a restore cut off is
    // removed as it starts.
    let cut_off = data.join("hostwire.db.restore");
    std::fs::write(&cut_off, b"half a restore").unwrap();
    let server = Process::serve(&data, &[], &[("HOSTWIRE_OPERATOR_TOKEN", OPERATOR)]);
    let status = |pin: String| {
        let http = server.http();
        async move {
            reqwest::get(format!("{http}/api/rooms/{pin}"))
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(status(before.clone()).await, 200);
    assert_eq!(status(after.clone()).await, 404);
    assert!(!cut_off.exists());
    drop(server);
    // The database it replaced holds both.
    let mut both = vec![before, after];
    both.sort();
    assert_eq!(pins(std::path::Path::new(&kept)), both);
}
