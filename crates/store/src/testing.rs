//! A real PostgreSQL for tests: no mock stands in for the database.
//!
//! [`fresh_database`] gives each test a new, empty database and returns its
//! URL. The server is `HOSTWIRE_TEST_POSTGRES_URL` when set (a URL to a
//! database whose user may `CREATE DATABASE`); otherwise the first call in a
//! test binary starts a private cluster from the PostgreSQL server binaries
//! on this machine (Debian's `postgresql` package: `/usr/lib/postgresql/N/bin`,
//! or `initdb` on `PATH`), as the `postgres` user when the tests run as root
//! (PostgreSQL refuses root), in a temporary directory, on a free loopback
//! port. The cluster lives as long as the test binary: a shell beside it
//! reads the binary's end of a pipe, and when the binary ends (however it
//! ends) stops PostgreSQL and removes the directory.
//!
//! Where no PostgreSQL can be had, [`fresh_database`] says so on standard
//! error (past the test harness's capture) and returns `None`, and the
//! test returns; under `CI=true` it panics instead: CI never passes a
//! PostgreSQL test it did not run.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable naming an existing server for the tests.
pub const TEST_URL_VAR: &str = "HOSTWIRE_TEST_POSTGRES_URL";

/// The line PostgreSQL logs once it accepts connections.
const READY: &str = "database system is ready to accept connections";

/// Attempts at a free port (another process may take the one picked
/// between its pick and PostgreSQL's bind).
const PORT_ATTEMPTS: usize = 3;

/// The cluster's shell: creates the cluster, starts PostgreSQL, waits for
/// its standard input to close (the test binary ended), then stops it and
/// removes everything. `$1` the binaries' directory, `$2` the port.
const CLUSTER_SCRIPT: &str = r#"
set -e
dir=$(mktemp -d "${TMPDIR:-/tmp}/hostwire-test-pg.XXXXXX" 2>/dev/null \
  || mktemp -d /tmp/hostwire-test-pg.XXXXXX)
trap 'rm -rf "$dir"' EXIT
if ! "$1/initdb" -D "$dir/data" -A trust -U hostwire -E UTF8 --no-sync >"$dir/initdb.log" 2>&1; then
  cat "$dir/initdb.log" >&2
  exit 1
fi
"$1/postgres" -D "$dir/data" -k "$dir" -h 127.0.0.1 -p "$2" \
  -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
  -c max_connections=200 </dev/null &
pid=$!
cat >/dev/null || true
kill -INT "$pid" 2>/dev/null || true
wait "$pid" || true
"#;

/// What the tests run against: a server URL (its `postgres` database), or
/// why there is none.
fn server() -> &'static Result<String, String> {
    static SERVER: OnceLock<Result<String, String>> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var(TEST_URL_VAR) {
        Ok(url) if !url.is_empty() => Ok(url),
        _ => start_cluster(),
    })
}

/// The directory of `initdb` and `postgres`: Debian's newest, else `PATH`.
fn server_binaries() -> Option<String> {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let major: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .max_by_key(|(major, _)| *major);
    if let Some((_, bin)) = newest {
        return Some(bin.display().to_string());
    }
    let out = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
        .ok()?;
    let path = String::from_utf8(out.stdout).ok()?;
    let dir = std::path::Path::new(path.trim()).parent()?;
    out.status.success().then(|| dir.display().to_string())
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn start_cluster() -> Result<String, String> {
    let bin = binaries()?;
    let mut last = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port()?;
        match run_script(CLUSTER_SCRIPT, &[&bin, &port.to_string()]) {
            Ok((child, stdin)) => {
                // Held until the binary ends: its closing stops the cluster.
                static KEEP: OnceLock<std::process::ChildStdin> = OnceLock::new();
                let _ = KEEP.set(stdin);
                drop(child);
                return Ok(format!("postgresql://hostwire@127.0.0.1:{port}/postgres"));
            }
            Err(log) => last = log,
        }
    }
    Err(format!("PostgreSQL from {bin} did not start: {last}"))
}

fn binaries() -> Result<String, String> {
    server_binaries().ok_or_else(|| {
        format!("no PostgreSQL server binaries (install Debian's postgresql package, or set {TEST_URL_VAR})")
    })
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Runs a server script (as the `postgres` user when root) until
/// PostgreSQL is ready: the script and the pipe whose closing stops it;
/// else PostgreSQL's log.
fn run_script(script: &str, args: &[&str]) -> Result<(Child, ChildStdin), String> {
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "sh"]);
        c
    } else {
        Command::new("sh")
    };
    cmd.args(["-c", script, "hostwire-test-pg"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start PostgreSQL: {e}"))?;
    let stdin = child.stdin.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    // Read the log until PostgreSQL is ready (or gone); then keep draining
    // it so that PostgreSQL never blocks on a full pipe. Carries one
    // message: the sender is dropped once it is used.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut log = Vec::new();
        let mut ready = Some(ready_tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(tx) = &ready {
                if line.contains(READY) {
                    let _ = tx.send(Ok(()));
                    ready = None;
                } else {
                    log.push(line);
                }
            }
        }
        if let Some(tx) = ready {
            let _ = tx.send(Err(log.join("\n")));
        }
    });
    let outcome = match ready_rx.recv() {
        Ok(Ok(())) => return Ok((child, stdin)),
        Ok(Err(log)) => log,
        Err(_) => "the log reader stopped".to_owned(),
    };
    drop(stdin);
    let _ = child.wait();
    Err(outcome)
}

/// The script of a server of one test's own: creates the cluster in `$3`
/// unless it is there, starts PostgreSQL on port `$2` and stops it when
/// standard input closes, keeping the data for the next start.
const OWN_SCRIPT: &str = r#"
dir="$3"
if [ ! -f "$dir/data/PG_VERSION" ]; then
  mkdir -p "$dir" || exit 1
  if ! "$1/initdb" -D "$dir/data" -A trust -U hostwire -E UTF8 --no-sync >"$dir/initdb.log" 2>&1; then
    cat "$dir/initdb.log" >&2
    exit 1
  fi
fi
"$1/postgres" -D "$dir/data" -k "$dir" -h 127.0.0.1 -p "$2" \
  -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
  -c max_connections=100 </dev/null &
pid=$!
cat >/dev/null || true
kill -INT "$pid" 2>/dev/null || true
wait "$pid" || true
"#;

/// A PostgreSQL server of one test's own, which the test stops and starts
/// again on the same port and data: a database restart as the nodes see
/// it. Stopped, and its data removed, when dropped.
pub struct OwnServer {
    bin: String,
    dir: std::path::PathBuf,
    port: u16,
    run: Option<(Child, ChildStdin)>,
}

impl OwnServer {
    /// A new server (its own cluster, on a free loopback port); `None`,
    /// said loudly (a failure under CI), where none can be had.
    pub fn start(test: &str) -> Option<OwnServer> {
        let made = binaries().and_then(|bin| {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "hostwire-test-pg-own-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let mut s = OwnServer {
                bin,
                dir,
                port: free_port()?,
                run: None,
            };
            s.restart()?;
            Ok(s)
        });
        match made {
            Ok(s) => Some(s),
            Err(why) => {
                unavailable(test, &why);
                None
            }
        }
    }

    /// Its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgresql://hostwire@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops PostgreSQL (a fast shutdown) and waits for it to be gone.
    pub fn stop(&mut self) {
        if let Some((mut child, stdin)) = self.run.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }

    /// Starts it (again) on its port and data; waits until it is ready.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        let dir = self.dir.display().to_string();
        let run = run_script(OWN_SCRIPT, &[&self.bin, &self.port.to_string(), &dir])?;
        self.run = Some(run);
        Ok(())
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Says loudly that a PostgreSQL test did not run (past the harness's
/// capture), or fails it under CI.
fn unavailable(test: &str, why: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let line = format!(
        "\n*** PostgreSQL test {test} NOT RUN: {why}. Set {TEST_URL_VAR} or install PostgreSQL. ***\n"
    );
    if ci {
        panic!("{line} (CI=true: a test that could not run is a failure)");
    }
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// A new, empty database for one test, its URL; `None` (said loudly, a
/// failure under CI) where no PostgreSQL can be had. Callable from inside
/// a tokio runtime.
pub fn fresh_database(test: &str) -> Option<String> {
    let base = match server() {
        Ok(url) => url.clone(),
        Err(why) => {
            unavailable(test, why);
            return None;
        }
    };
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "hostwire_test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    // The synchronous client on a thread of its own: the caller may be on
    // a runtime's thread.
    let created = std::thread::scope(|s| {
        s.spawn(|| -> Result<String, String> {
            let mut config: postgres::Config = base.parse().map_err(|e| format!("{e}"))?;
            let mut admin = config
                .connect(postgres::NoTls)
                .map_err(|e| crate::with_causes(&e))?;
            admin
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .map_err(|e| crate::with_causes(&e))?;
            config.dbname(&name);
            Ok(url_of(&config))
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    });
    match created {
        Ok(url) => Some(url),
        Err(why) => {
            unavailable(test, &format!("cannot create a database: {why}"));
            None
        }
    }
}

/// `config` as a key=value connection string.
fn url_of(config: &postgres::Config) -> String {
    let mut parts = Vec::new();
    if let Some(postgres::config::Host::Tcp(h)) = config.get_hosts().first() {
        parts.push(format!("host={h}"));
    }
    if let Some(p) = config.get_ports().first() {
        parts.push(format!("port={p}"));
    }
    if let Some(u) = config.get_user() {
        parts.push(format!("user={u}"));
    }
    if let Some(pw) = config.get_password() {
        parts.push(format!(
            "password='{}'",
            String::from_utf8_lossy(pw).replace('\'', "\\'")
        ));
    }
    if let Some(d) = config.get_dbname() {
        parts.push(format!("dbname={d}"));
    }
    parts.join(" ")
}
