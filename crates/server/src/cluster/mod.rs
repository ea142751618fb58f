//! Nodes that know each other: with `--nats-url`, each node publishes a
//! [`Heartbeat`] on [`HEARTBEAT_SUBJECT`] every [`HEARTBEAT_INTERVAL`] and
//! keeps the [`Peers`] it heard from within [`PEER_EXPIRY_HEARTBEATS`]
//! intervals. Without it the node is alone: it still has an id (shown in
//! `/api/health`), and no peers.
//!
//! NATS is reached through `async-nats`: the first connection is bounded
//! by [`CONNECT_TIMEOUT`] and a failure stops the start-up; a NATS that goes
//! away later is reconnected to (at most [`MAX_RECONNECT_DELAY`] between
//! attempts), logged and counted, and the node goes on serving its own
//! clients meanwhile. Peer times come from the server's [`Clock`].

pub mod leases;
pub mod peers;
pub mod tunnel;

pub use peers::{Heartbeat, Observed, Peer, Peers, Rejection, MAX_HEARTBEAT_BYTES, MAX_PEERS};

use crate::metrics::{write_counter, write_gauge, Counters, Render};
use futures_util::StreamExt;
use hostwire_core::Clock;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The option (and its environment variable) naming the NATS server.
pub const NATS_URL_OPTION: &str = "--nats-url / HOSTWIRE_NATS_URL";

/// The option (and its environment variable) naming this node.
pub const NODE_ID_OPTION: &str = "--node-id / HOSTWIRE_NODE_ID";

/// The subject every node's heartbeat is published on.
pub const HEARTBEAT_SUBJECT: &str = "hostwire.nodes.heartbeat";

/// How often a node publishes its heartbeat.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// A peer unheard for this many heartbeat intervals is dropped.
pub const PEER_EXPIRY_HEARTBEATS: u32 = 3;

/// A peer with open tunnels unheard for this long is asked whether it is
/// still there (a NATS request on its opening subject): NATS answers at
/// once "no responders" for a node whose connection is gone, and the peer
/// is dropped then, its tunnels' clients told to reconnect, well before
/// the expiry.
pub const PROBE_LATE_AFTER: Duration = Duration::from_millis(1_500);

/// How long a probe of a late peer waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest the first connection to NATS (TCP, handshake) may take
/// before the start-up stops.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest wait between two attempts to reach a NATS that went away.
pub const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// Heartbeats received but not yet read, at most (the NATS client's
/// subscription buffer; past it NATS reports a slow consumer).
pub const SUBSCRIPTION_CAPACITY: usize = 1_024;

/// Bytes of the random part of a node id made at start-up.
const NODE_ID_RANDOM_BYTES: usize = 9;

/// A node id made at start-up, when `--node-id` is not given.
pub fn random_node_id() -> String {
    hostwire_core::token::random_base64url(NODE_ID_RANDOM_BYTES)
}

/// `url` without its password, for the logs and messages.
pub fn describe_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "(an unreadable URL)".to_owned(),
    }
}

/// The cluster's counters (shared with the NATS client's event callback).
#[derive(Default)]
pub struct ClusterMetrics {
    pub heartbeats_sent: AtomicU64,
    pub heartbeats_received: AtomicU64,
    pub heartbeats_rejected: Counters<Rejection>,
    pub peers_dropped: AtomicU64,
    pub nats_disconnects: AtomicU64,
    pub nats_reconnects: AtomicU64,
    nats_connected: AtomicBool,
    /// Lost since the last `Connected`: the next one is a reconnection.
    nats_lost: AtomicBool,
}

/// This node, its peers, and its NATS connection when it has one.
pub struct Cluster {
    node: String,
    started_ms: u64,
    clock: Arc<dyn Clock>,
    peers: Mutex<Peers>,
    pub metrics: Arc<ClusterMetrics>,
    nats: Option<async_nats::Client>,
    /// Clients carried to and from the owners of their units (with NATS).
    tunnels: Option<Arc<tunnel::Tunnels>>,
    /// The units this node owns (on PostgreSQL).
    leases: std::sync::OnceLock<Arc<leases::Leases>>,
}

fn expiry_ms() -> u64 {
    HEARTBEAT_INTERVAL.as_millis() as u64 * u64::from(PEER_EXPIRY_HEARTBEATS)
}

impl Cluster {
    /// A node without NATS: today's single node, with an id.
    pub fn single(node: String, clock: Arc<dyn Clock>) -> Arc<Cluster> {
        Arc::new(Cluster::new(node, clock, Arc::default(), None))
    }

    fn new(
        node: String,
        clock: Arc<dyn Clock>,
        metrics: Arc<ClusterMetrics>,
        nats: Option<async_nats::Client>,
    ) -> Cluster {
        let tunnels = nats
            .clone()
            .map(|client| tunnel::Tunnels::new(node.clone(), client));
        Cluster {
            peers: Mutex::new(Peers::new(&node, expiry_ms())),
            started_ms: clock.now_ms(),
            node,
            tunnels,
            clock,
            metrics,
            nats,
            leases: std::sync::OnceLock::new(),
        }
    }

    /// The node's leases (set once, at start-up, on PostgreSQL).
    pub fn set_leases(&self, leases: Arc<leases::Leases>) {
        let _ = self.leases.set(leases);
    }

    pub fn leases(&self) -> Option<&Arc<leases::Leases>> {
        self.leases.get()
    }

    /// The node's tunnels (with NATS): how a client of a unit owned
    /// elsewhere reaches it.
    pub fn tunnels(&self) -> Option<&Arc<tunnel::Tunnels>> {
        self.tunnels.as_ref()
    }

    /// A node connected to the NATS server at `url`. A NATS that cannot be
    /// reached within [`CONNECT_TIMEOUT`] is an error naming the option.
    pub async fn connect(
        url: &str,
        node: String,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<Cluster>> {
        let shown = describe_url(url);
        let metrics = Arc::new(ClusterMetrics::default());
        let events = Arc::clone(&metrics);
        let options = async_nats::ConnectOptions::new()
            .name(format!("hostwire {node}"))
            .no_echo()
            .connection_timeout(CONNECT_TIMEOUT)
            .subscription_capacity(SUBSCRIPTION_CAPACITY)
            // Never give up on a NATS that went away: the node serves its
            // own clients meanwhile.
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| {
                (Duration::from_millis(100) * attempts as u32).min(MAX_RECONNECT_DELAY)
            })
            .event_callback(move |event| {
                let m = Arc::clone(&events);
                async move { m.nats_event(event) }
            });
        let fail = |reason: String| {
            anyhow::anyhow!(
                "cannot reach the NATS server {shown}: {reason}. Hint: check {NATS_URL_OPTION} (nats://HOST:PORT) and that NATS accepts this node"
            )
        };
        // The client's own timeout covers one attempt; this covers name
        // resolution and everything else.
        let client = tokio::time::timeout(CONNECT_TIMEOUT * 2, options.connect(url))
            .await
            .map_err(|_| fail(format!("no answer within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| fail(e.to_string()))?;
        metrics.nats_connected.store(true, Relaxed);
        tracing::info!(nats = %shown, node = %node, "connected to NATS");
        Ok(Arc::new(Cluster::new(node, clock, metrics, Some(client))))
    }

    /// What `serve` runs with: `nats_url` (empty is none) and `node_id`
    /// (none: a random one), each checked, the error naming its option.
    pub async fn configure(
        nats_url: Option<&str>,
        node_id: Option<String>,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<Cluster>> {
        let node = match node_id.filter(|n| !n.is_empty()) {
            Some(n) if peers::is_node_id(&n) => n,
            Some(_) => anyhow::bail!(
                "{NODE_ID_OPTION}: 1 to {} ASCII letters, digits, '-', '_' or '.'",
                peers::MAX_NODE_ID_LEN
            ),
            None => random_node_id(),
        };
        match nats_url.filter(|u| !u.is_empty()) {
            Some(url) => Cluster::connect(url, node, clock).await,
            None => Ok(Cluster::single(node, clock)),
        }
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Publishes this node's heartbeats (it serves on `addr`) and reads its
    /// peers', until `stop` turns true. Nothing without NATS.
    pub fn start(self: &Arc<Self>, addr: SocketAddr, stop: watch::Receiver<bool>) {
        let Some(client) = self.nats.clone() else {
            return;
        };
        let heartbeat = Heartbeat {
            node: self.node.clone(),
            addr: addr.to_string(),
            started_ms: self.started_ms,
            units: Vec::new(),
        };
        if let Some(t) = &self.tunnels {
            t.start(stop.clone());
        }
        tokio::spawn(Arc::clone(self).publish(client.clone(), heartbeat, stop.clone()));
        tokio::spawn(Arc::clone(self).listen(client, stop));
    }

    async fn publish(
        self: Arc<Self>,
        client: async_nats::Client,
        heartbeat: Heartbeat,
        mut stop: watch::Receiver<bool>,
    ) {
        let payload = bytes::Bytes::from(heartbeat.encode());
        let mut every = tokio::time::interval(HEARTBEAT_INTERVAL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {},
                _ = stop.wait_for(|s| *s) => return,
            }
            self.sweep();
            self.probe_late(&client);
            // While NATS is away a heartbeat would only wait in the
            // client's buffer and arrive stale.
            if client.connection_state() != async_nats::connection::State::Connected {
                continue;
            }
            let sent = tokio::time::timeout(
                HEARTBEAT_INTERVAL,
                client.publish(HEARTBEAT_SUBJECT, payload.clone()),
            )
            .await;
            if matches!(sent, Ok(Ok(()))) {
                self.metrics.heartbeats_sent.fetch_add(1, Relaxed);
            }
        }
    }

    async fn listen(self: Arc<Self>, client: async_nats::Client, mut stop: watch::Receiver<bool>) {
        // The client subscribes again by itself after a reconnect.
        let mut sub = match client.subscribe(HEARTBEAT_SUBJECT).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot subscribe to the nodes' heartbeats: no peers will be seen");
                return;
            }
        };
        loop {
            tokio::select! {
                m = sub.next() => match m {
                    Some(m) => { let _ = self.receive(&m.payload); }
                    None => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// A heartbeat's bytes, as they arrived from NATS.
    pub fn receive(&self, payload: &[u8]) -> Result<Observed, Rejection> {
        let now = self.clock.now_ms();
        let observed = Heartbeat::decode(payload).and_then(|hb| {
            let addr = hb.addr.clone();
            let node = hb.node.clone();
            let o = self.peers.lock().expect("peers").observe(hb, now);
            if o == Ok(Observed::New) {
                tracing::info!(peer = %node, addr = %addr, "peer seen");
            }
            o
        });
        match observed {
            Ok(Observed::Own) => {}
            Ok(_) => {
                self.metrics.heartbeats_received.fetch_add(1, Relaxed);
            }
            Err(r) => {
                self.metrics.heartbeats_rejected.add(r, 1);
                tracing::debug!(reason = crate::metrics::Label::name(r), "heartbeat ignored");
            }
        }
        observed
    }

    /// Asks each peer with open tunnels unheard for [`PROBE_LATE_AFTER`]
    /// whether it is there; one NATS finds gone is dropped at once.
    fn probe_late(self: &Arc<Self>, client: &async_nats::Client) {
        let Some(tunnels) = &self.tunnels else {
            return;
        };
        let now = self.clock.now_ms();
        let late = self
            .peers
            .lock()
            .expect("peers")
            .late(now, PROBE_LATE_AFTER.as_millis() as u64);
        for peer in late.into_iter().filter(|p| tunnels.has_peer(p)) {
            let (cluster, client) = (Arc::clone(self), client.clone());
            tokio::spawn(async move {
                let asked = client.request(
                    tunnel::open_subject(&peer),
                    bytes::Bytes::from_static(b"probe"),
                );
                if let Ok(Err(e)) = tokio::time::timeout(PROBE_TIMEOUT, asked).await {
                    if e.kind() == async_nats::client::RequestErrorKind::NoResponders {
                        cluster.gone(&peer);
                    }
                }
            });
        }
    }

    /// Peer `id` was found gone: dropped now, its tunnels ended.
    fn gone(&self, id: &str) {
        if self.peers.lock().expect("peers").forget(id) {
            tracing::info!(peer = %id, "peer dropped: NATS has no responder for it");
            self.metrics.peers_dropped.fetch_add(1, Relaxed);
            if let Some(t) = &self.tunnels {
                t.peer_gone(id);
            }
        }
    }

    /// Drops the peers unheard for longer than [`PEER_EXPIRY_HEARTBEATS`]
    /// intervals.
    pub fn sweep(&self) {
        let mut peers = self.peers.lock().expect("peers");
        self.expire(&mut peers);
    }

    fn expire(&self, peers: &mut Peers) {
        let gone = peers.expire(self.clock.now_ms());
        for id in &gone {
            tracing::info!(peer = %id, "peer dropped: no heartbeat");
            // Its tunnels' clients reconnect, and find their units again.
            if let Some(t) = &self.tunnels {
                t.peer_gone(id);
            }
        }
        self.metrics
            .peers_dropped
            .fetch_add(gone.len() as u64, Relaxed);
    }

    /// The peers heard from within the expiry, by id (the others dropped
    /// first, so that the count of drops agrees with what is shown).
    pub fn peers(&self) -> Vec<Peer> {
        let mut peers = self.peers.lock().expect("peers");
        self.expire(&mut peers);
        peers.list(self.clock.now_ms())
    }

    fn nats_state(&self) -> &'static str {
        match &self.nats {
            None => "off",
            Some(_) if self.metrics.nats_connected.load(Relaxed) => "connected",
            Some(_) => "disconnected",
        }
    }

    /// Whether the node is one of a cluster (it has a NATS link, or owns
    /// its units through leases on PostgreSQL).
    pub fn is_clustered(&self) -> bool {
        self.nats.is_some() || self.leases.get().is_some()
    }

    /// `/api/health`'s part: `{"node":…,"nats":…,"peers":[…]}`.
    pub fn health(&self) -> Value {
        let peers: Vec<Value> = self
            .peers()
            .into_iter()
            .map(|p| {
                json!({
                    "id": p.heartbeat.node,
                    "addr": p.heartbeat.addr,
                    "startedMs": p.heartbeat.started_ms,
                    "lastSeenMs": p.last_seen_ms,
                    "units": p.heartbeat.units.len(),
                })
            })
            .collect();
        let mut h = json!({
            "node": self.node,
            "startedMs": self.started_ms,
            "nats": self.nats_state(),
            "peers": peers,
        });
        if let Some(l) = self.leases.get() {
            h["units"] = l.health();
        }
        if let Some(t) = &self.tunnels {
            let m = &t.metrics;
            h["tunnels"] = json!({
                "open": t.len(),
                "framesSent": m.frames_out.load(Relaxed),
                "framesReceived": m.frames_in.load(Relaxed),
                "batchesSent": m.batches_out.load(Relaxed),
                "batchesReceived": m.batches_in.load(Relaxed),
            });
        }
        h
    }
}

impl ClusterMetrics {
    fn nats_event(&self, event: async_nats::Event) {
        match event {
            async_nats::Event::Disconnected => {
                self.nats_connected.store(false, Relaxed);
                self.nats_lost.store(true, Relaxed);
                self.nats_disconnects.fetch_add(1, Relaxed);
                tracing::warn!(
                    "NATS connection lost: reconnecting (peers are not heard meanwhile)"
                );
            }
            async_nats::Event::Connected => {
                // The first connection is reported too: only one after a
                // loss is counted.
                self.nats_connected.store(true, Relaxed);
                if self.nats_lost.swap(false, Relaxed) {
                    self.nats_reconnects.fetch_add(1, Relaxed);
                    tracing::info!("NATS connection back");
                }
            }
            other => tracing::warn!(event = %other, "NATS"),
        }
    }
}

impl Render for Cluster {
    fn render(&self, out: &mut String) {
        let m = &self.metrics;
        write_gauge(
            out,
            "hostwire_cluster_peers",
            "Other nodes heard from within the peer expiry.",
            self.peers().len() as i64,
        );
        write_gauge(
            out,
            "hostwire_cluster_nats_connected",
            "1 while the node is connected to NATS (0 without NATS or while it is away).",
            i64::from(self.nats_state() == "connected"),
        );
        write_counter(
            out,
            "hostwire_cluster_heartbeats_sent_total",
            "Heartbeats this node published.",
            m.heartbeats_sent.load(Relaxed),
        );
        write_counter(
            out,
            "hostwire_cluster_heartbeats_received_total",
            "Peers' heartbeats taken.",
            m.heartbeats_received.load(Relaxed),
        );
        m.heartbeats_rejected.render(
            out,
            "hostwire_cluster_heartbeats_rejected_total",
            "Heartbeats ignored, by reason (too_large, malformed, full: past the peer cap).",
            "reason",
        );
        write_counter(
            out,
            "hostwire_cluster_peers_dropped_total",
            "Peers dropped after missing their heartbeats.",
            m.peers_dropped.load(Relaxed),
        );
        write_counter(
            out,
            "hostwire_cluster_nats_disconnects_total",
            "Times the NATS connection was lost.",
            m.nats_disconnects.load(Relaxed),
        );
        write_counter(
            out,
            "hostwire_cluster_nats_reconnects_total",
            "Times the NATS connection came back.",
            m.nats_reconnects.load(Relaxed),
        );
        if let Some(t) = &self.tunnels {
            t.render(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostwire_core::ManualClock;

    fn beat(node: &str) -> Vec<u8> {
        Heartbeat {
            node: node.to_owned(),
            addr: "127.0.0.1:9".to_owned(),
            started_ms: 1,
            units: vec![],
        }
        .encode()
    }

    #[test]
    fn peers_follow_the_server_clock_and_show_in_health_and_metrics() {
        let clock = ManualClock::new(10_000);
        let c = Cluster::single("me".to_owned(), Arc::new(clock.clone()));
        assert_eq!(c.receive(&beat("b")), Ok(Observed::New));
        assert_eq!(c.receive(&beat("me")), Ok(Observed::Own));
        assert_eq!(c.receive(b"{"), Err(Rejection::Malformed));
        let h = c.health();
        assert_eq!(h["node"], "me");
        assert_eq!(h["nats"], "off");
        assert_eq!(h["peers"][0]["id"], "b");
        assert_eq!(h["peers"][0]["lastSeenMs"], 10_000);
        let mut s = String::new();
        c.render(&mut s);
        assert!(s.contains("hostwire_cluster_peers 1\n"), "{s}");
        assert!(
            s.contains("hostwire_cluster_heartbeats_received_total 1\n"),
            "{s}"
        );
        assert!(
            s.contains("hostwire_cluster_heartbeats_rejected_total{reason=\"malformed\"} 1\n"),
            "{s}"
        );
        clock.advance_ms(expiry_ms() + 1);
        assert!(c.peers().is_empty());
        c.sweep();
        assert_eq!(c.metrics.peers_dropped.load(Relaxed), 1);
        let mut s = String::new();
        c.render(&mut s);
        assert!(s.contains("hostwire_cluster_peers 0\n"), "{s}");
    }

    #[test]
    fn a_url_is_shown_without_its_password() {
        let shown = describe_url("nats://node:s3cret@10.0.0.1:4222");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("10.0.0.1:4222"), "{shown}");
    }
}
