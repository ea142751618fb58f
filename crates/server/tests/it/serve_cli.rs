//! `hostwire serve` as a new user meets it: start-up errors in one line that
//! names the address or path, with a hint; nothing written before the port
//! is ours; logs without colours off a terminal, with the data directory as
//! an absolute path; every option's environment variable in `--help`.

use crate::support::relay::{temp_dir, GUARD};
use std::process::{Output, Stdio};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

fn hostwire() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hostwire"));
    c.kill_on_drop(true).env_remove("RUST_LOG");
    c
}

/// Runs a `serve` that must fail, and returns its output.
async fn failing(args: &[&str], dir: &std::path::Path) -> Output {
    let out = tokio::time::timeout(
        GUARD,
        hostwire().arg("serve").args(args).current_dir(dir).output(),
    )
    .await
    .expect("serve did not stop")
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    out
}

/// The one `error:` line.
fn error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0].to_owned()
}

#[tokio::test]
async fn a_port_in_use_is_named_and_nothing_is_written() {
    let dir = temp_dir("cli-port");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = failing(&["--port", &port, "--data-dir", "data"], dir.path()).await;
    let line = error_line(&out);
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(line.contains("Address already in use"), "{line}");
    assert!(line.contains("Hint:") && line.contains("--port"), "{line}");
    assert!(
        !dir.path().join("data").exists(),
        "the data directory is made only once the port is ours"
    );
}

#[tokio::test]
async fn an_unusable_data_directory_is_named_once() {
    let dir = temp_dir("cli-data");
    let root = std::fs::canonicalize(dir.path()).unwrap();
    // A file where a directory should be: refused even to root.
    std::fs::write(root.join("a-file"), b"").unwrap();
    let out = failing(&["--port", "0", "--data-dir", "a-file/data"], &root).await;
    let line = error_line(&out);
    let path = root.join("a-file/data").display().to_string();
    assert_eq!(line.matches(&path).count(), 1, "{line}");
    assert!(
        line.contains("Hint:") && line.contains("--data-dir"),
        "{line}"
    );

    // A database SQLite cannot open: a directory in its place.
    std::fs::create_dir_all(root.join("d/hostwire.db")).unwrap();
    let out = failing(&["--port", "0", "--data-dir", "d"], &root).await;
    let line = error_line(&out);
    let db = root.join("d/hostwire.db").display().to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches(&db).count(), 1, "{stderr}");
    assert!(line.contains("cannot open the database"), "{line}");
}

#[tokio::test]
async fn a_missing_plugin_sdk_file_stops_the_start_with_its_name() {
    let dir = temp_dir("cli-sdk");
    let out = failing(
        &[
            "--port",
            "0",
            "--data-dir",
            "data",
            "--plugin-sdk",
            "no-sdk.mjs",
        ],
        dir.path(),
    )
    .await;
    let line = error_line(&out);
    assert!(
        line.contains("--plugin-sdk") && line.contains("no-sdk.mjs"),
        "{line}"
    );
}

#[tokio::test]
async fn logs_off_a_terminal_have_no_colours_and_an_absolute_data_directory() {
    let dir = temp_dir("cli-logs");
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let mut child = hostwire()
        .args(["serve", "--port", "0", "--data-dir", "relative"])
        .args(["--sqlite-synchronous", "full"])
        .env("RUST_LOG", "info")
        .current_dir(&root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(GUARD, stdout.read_line(&mut line))
        .await
        .expect("no address line")
        .unwrap();
    assert!(
        line.starts_with("hostwire listening on http://127.0.0.1:"),
        "{line}"
    );
    // SIGTERM: it stops and its log ends.
    let pid = child.id().unwrap() as i32;
    // SAFETY: a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let mut stderr = String::new();
    tokio::time::timeout(
        GUARD,
        child.stderr.take().unwrap().read_to_string(&mut stderr),
    )
    .await
    .expect("the log did not end")
    .unwrap();
    assert!(child.wait().await.unwrap().success());
    assert!(!stderr.contains('\u{1b}'), "colour codes in:\n{stderr}");
    let db = root.join("relative/hostwire.db").display().to_string();
    assert!(stderr.contains(&format!("db={db}")), "{stderr}");
    assert!(stderr.contains("synchronous=\"FULL\""), "{stderr}");
}

#[tokio::test]
async fn an_unknown_sqlite_synchronous_is_refused_with_the_values() {
    let dir = temp_dir("cli-sync");
    let out = tokio::time::timeout(
        GUARD,
        hostwire()
            .args(["serve", "--port", "0", "--data-dir", "data"])
            .env("HOSTWIRE_SQLITE_SYNCHRONOUS", "off")
            .current_dir(dir.path())
            .output(),
    )
    .await
    .expect("serve did not stop")
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--sqlite-synchronous") && stderr.contains("normal, full"),
        "{stderr}"
    );
    assert!(!dir.path().join("data").exists());
}

#[tokio::test]
async fn serve_help_lists_every_environment_variable() {
    let out = hostwire().args(["serve", "--help"]).output().await.unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for var in [
        "PORT",
        "HOST",
        "ALLOWED_ORIGINS",
        "TRUST_PROXY",
        "HOSTWIRE_DATA_DIR",
        "HOSTWIRE_SQLITE_SYNCHRONOUS",
        "ROOMS_PER_IP_PER_HOUR",
        "HOSTWIRE_LOG_FORMAT",
        "RUST_LOG",
        "HOSTWIRE_PLUGIN_SDK",
    ] {
        assert!(help.contains(&format!("[env: {var}")), "{var} in:\n{help}");
    }
}
