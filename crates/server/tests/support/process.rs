//! The real binary: `hostwire serve` spawned on 127.0.0.1 port 0 with its
//! data in a directory, for the tests of what survives a restart of the
//! process (`kill -9` or SIGTERM).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};

/// A spawned server, killed when dropped.
pub struct Process {
    pub child: Child,
    /// `127.0.0.1:port`, as its first line says.
    pub addr: String,
}

/// Runs a `hostwire serve` on a fresh data directory that must fail to
/// start (exit status 1) within two [`GUARD`](super::server::GUARD)s; its
/// standard error.
pub async fn serve_failing(args: &[&str], envs: &[(&str, &str)]) -> String {
    let dir = super::server::temp_dir("serve-fail");
    let out = tokio::time::timeout(
        super::server::GUARD * 2,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire"))
            .args(["serve", "--port", "0", "--data-dir"])
            .arg(dir.path())
            .args(args)
            .envs(envs.iter().copied())
            .env_remove("RUST_LOG")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("serve did not stop")
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

impl Process {
    /// `hostwire serve` with `args` after the address and data directory,
    /// and `envs`.
    pub fn serve(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Process {
        Self::serve_with(
            Command::new(env!("CARGO_BIN_EXE_hostwire")),
            dir,
            args,
            envs,
        )
    }

    /// [`Process::serve`] with a command made by the caller (a CPU set,
    /// say).
    pub fn serve_with(
        mut command: Command,
        dir: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Process {
        let mut child = command
            .args(["serve", "--port", "0", "--host", "127.0.0.1"])
            .args(args)
            .arg("--data-dir")
            .arg(dir)
            .env("RUST_LOG", "warn")
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line.trim().rsplit("http://").next().unwrap().to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "{line}");
        Process { child, addr }
    }

    pub fn http(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The WebSocket URL of `path`.
    pub fn ws(&self, path: &str) -> String {
        format!("ws://{}{path}", self.addr)
    }

    /// SIGKILL, and the process reaped.
    pub fn kill_9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, and how the process exited.
    pub fn sigterm(&mut self) -> ExitStatus {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
