//! A relay on the one test server (origins limited to [`ORIGIN`]) and the
//! frames of relay protocol 1.

use super::server::{relay_config, Data, Spawn};
pub use super::server::{temp_dir, GUARD, OPERATOR, ORIGIN, T0};
pub use super::ws::{advance_seconds, Client, Ended};
use hostwire::app::App;
use hostwire::http::AllowedOrigins;
use hostwire::relay::RelayConfig;
use hostwire_core::ManualClock;
use serde_json::{json, Value};
use std::path::PathBuf;

/// The relay's settings the tests start from: the operator credential,
/// browsers from [`ORIGIN`] only.
pub fn config() -> RelayConfig {
    relay_config(AllowedOrigins::List(vec![ORIGIN.to_owned()]))
}

pub struct TestRelay {
    pub server: Option<App>,
    pub clock: ManualClock,
    pub http: String,
    pub ws: String,
    pub db: PathBuf,
    /// The data directory this relay made for itself (none when it was
    /// given a database, as on a restart).
    data: Data,
}

impl TestRelay {
    pub async fn start(config: RelayConfig) -> TestRelay {
        let data = Data::new("relay");
        let mut t = Self::start_at(config, data.db.clone(), ManualClock::new(T0)).await;
        t.data = data;
        t
    }

    pub async fn start_at(config: RelayConfig, db: PathBuf, clock: ManualClock) -> TestRelay {
        let server = Spawn::new(config).start_at(&db, &clock).await;
        let addr = server.addr;
        TestRelay {
            server: Some(server),
            clock,
            http: format!("http://{addr}"),
            ws: format!("ws://{addr}/ws"),
            db: db.clone(),
            data: Data::at(db),
        }
    }

    pub fn relay(&self) -> &hostwire::relay::Relay {
        &self.server.as_ref().unwrap().relay
    }

    pub async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }

    pub async fn create_room(&self) -> (String, String) {
        let (status, v) =
            super::http::call("POST", &format!("{}/api/rooms", self.http), None, None).await;
        assert_eq!(status, 201, "{v}");
        (
            v["pin"].as_str().unwrap().to_owned(),
            v["hostToken"].as_str().unwrap().to_owned(),
        )
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.ws, Some(ORIGIN)).await.unwrap()
    }

    /// A host attached to a new room.
    pub async fn host(&self) -> (Client, String, String) {
        let (pin, token) = self.create_room().await;
        let mut h = self.client().await;
        h.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token}))
            .await;
        let v = h.recv().await;
        assert_eq!(v["t"], "hosting", "{v}");
        (h, pin, token)
    }

    /// A player joined to `pin`; returns (client, playerId, token).
    pub async fn player(&self, pin: &str, name: &str) -> (Client, String, String) {
        let mut p = self.client().await;
        p.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": name}))
            .await;
        let v = p.recv().await;
        assert_eq!(v["t"], "joined", "{v}");
        (
            p,
            v["playerId"].as_str().unwrap().to_owned(),
            v["token"].as_str().unwrap().to_owned(),
        )
    }

    /// A hosted room with `n` players (`p0`, `p1`, …), each join seen by
    /// the host; returns the host and each player with its id.
    pub async fn room_of(&self, n: usize) -> (Client, Vec<(Client, String)>) {
        let (mut host, pin, _) = self.host().await;
        let mut players = Vec::new();
        for i in 0..n {
            let (p, id, _) = self.player(&pin, &format!("p{i}")).await;
            assert_eq!(host.recv().await["event"], "join");
            players.push((p, id));
        }
        (host, players)
    }
}

/// Relay protocol 1's frames on the one client.
#[allow(async_fn_in_trait)]
pub trait RelayFrames {
    /// Frames until the next pong: proves what arrived before it (and that
    /// nothing else did).
    async fn until_pong(&mut self) -> Vec<Value>;
    async fn expect_error(&mut self, code: &str, fatal: bool) -> Value;
}

impl RelayFrames for Client {
    async fn until_pong(&mut self) -> Vec<Value> {
        self.send(json!({"t": "ping"})).await;
        let mut seen = Vec::new();
        loop {
            let v = self.recv().await;
            if v["t"] == "pong" {
                return seen;
            }
            seen.push(v);
        }
    }

    async fn expect_error(&mut self, code: &str, fatal: bool) -> Value {
        let v = self.recv().await;
        assert_eq!(
            (v["t"].as_str(), v["code"].as_str(), v["fatal"].as_bool()),
            (Some("error"), Some(code), Some(fatal)),
            "{v}"
        );
        v
    }
}
